#include "cluster/peer_router.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "cluster/etcd_membership.h"
#include "cluster/membership.h"
#include "cluster/rendezvous.h"
#include "env/descriptor_budget.h"
#include "env/gpu_staging.h"
#include "transport/server.h"
#include "transport/ucx.h"
#include "transport/wire.h"
#include "util/buffers.h"
#include "util/hash.h"
#include "util/input_check.h"
#include "util/logging.h"
#include "util/mutex.h"

namespace kvengine {

namespace {

// Runs fn(j) for every j in [0, n), in parallel threads when n > 1.
void ForEachParallel(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t j = 0; j < n; j++) threads.emplace_back([&fn, j] { fn(j); });
  for (auto& t : threads) t.join();
}

// Members remembered after they leave, for their delete hints (the oldest forgotten).
constexpr size_t kMaxDeparted = 64;
// Keys per BatchDelete when a hint is replayed.
constexpr size_t kReplayChunk = 1024;

}  // namespace

bool OnDevice(std::span<const MutableSlice> dest) {
  for (const MutableSlice& buffer : dest) {
    PointerInfo info;
    if (!ClassifyPointer(buffer.data(), &info).ok() || info.kind == MemoryKind::kDevice)
      return true;
  }
  return false;
}

// The local DB as the peer server sees it; "kvengine.peers" is the router's own.
class PeerRouter::Service final : public PeerService {
 public:
  Service(const PeerRouter* router, DB* db, PinFn pin, ServedFn served, const char* arena)
      : router_(router), db_(db), pin_(std::move(pin)), served_(std::move(served)), arena_(arena) {}
  bool Pin(const Slice& key, PinnedValue* out) override { return pin_ && pin_(key, true, out); }
  bool TryPin(const Slice& key, PinnedValue* out) override { return pin_ && pin_(key, false, out); }
  void ServedFromMemory(uint64_t values, uint64_t bytes) override {
    if (served_) served_(values, bytes);
  }
  const char* ArenaBase() const override { return arena_; }
  Status GetValueSize(const Slice& key, uint64_t* size) override {
    return db_->GetValueSize(key, size);
  }
  Status BatchGetInto(std::span<const Slice> keys, std::span<const Destination> dests,
                      std::vector<int64_t>* results) override {
    return db_->BatchGetInto(ReadOptions(), keys, dests, results);
  }
  Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                  std::vector<int64_t>* results) override {
    return db_->BatchPut(WriteOptions(), keys, values, results);
  }
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return db_->BatchExists(keys, results);
  }
  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return db_->BatchDelete(WriteOptions(), keys, results);
  }
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override {
    return db_->DeleteByRegex(pattern, deleted);
  }
  Status DeleteAll(uint64_t* deleted) override { return db_->DeleteAll(deleted); }
  Status SyncNamespaces(const Tenant* tenant, std::string_view request,
                        std::string* answer) override {
    return router_->AnswerNamespaceSync(tenant, request, answer);
  }
  bool GetProperty(const std::string& name, std::string* value) override {
    if (name == "kvengine.metrics" && value != nullptr) {
      // As ClusterDB answers it: the router's families too.
      if (!db_->GetProperty(name, value)) return false;
      router_->AppendPrometheus(value);
      return true;
    }
    if (name != "kvengine.peers" || value == nullptr) return db_->GetProperty(name, value);
    *value = router_->StatsText();
    return true;
  }

 private:
  const PeerRouter* const router_;
  DB* const db_;
  const PinFn pin_;
  const ServedFn served_;
  const char* const arena_;
};

// Registers with the client transport, the UCX server (when any), then `next`.
class PeerRouter::Chain final : public MemoryRegistrar {
 public:
  Chain(std::vector<std::shared_ptr<MemoryRegistrar>> all) : all_(std::move(all)) {}
  Status Register(void* addr, size_t length, const char* what) override {
    for (size_t i = 0; i < all_.size(); i++) {
      Status s = all_[i]->Register(addr, length, what);
      if (!s.ok()) {
        for (size_t j = 0; j < i; j++) all_[j]->Unregister(addr, length);
        return s;
      }
    }
    return Status::OK();
  }
  void Unregister(void* addr, size_t length) override {
    for (auto& r : all_) r->Unregister(addr, length);
  }

 private:
  std::vector<std::shared_ptr<MemoryRegistrar>> all_;
};

PeerRouter::PeerRouter(const Options& options, Logger* logger)
    : options_(options), logger_(logger) {}

PeerRouter::~PeerRouter() { Close(); }

void PeerRouter::Log(LogLevel level, const std::string& line) const {
  if (logger_ != nullptr) logger_->Write(level, line);
}

Status PeerRouter::Open(const Options& options, Logger* logger,
                        std::unique_ptr<PeerRouter>* result) {
  result->reset();
  if (options.peers.empty() && options.listen.empty() && options.cluster.empty()) {
    return Status::OK();
  }
  std::unique_ptr<PeerRouter> env(new PeerRouter(options, logger));
  Status s;
  if (options.cluster.empty()) {
    s = NewStaticMembership(options.peers, &env->membership_);
  } else if (!options.peers.empty()) {
    s = Status::InvalidArgument("options peers and cluster", "name one membership, not both");
  } else {
    s = NewEtcdMembership(
        options.cluster, options.cluster_lease_ttl_ms,
        [logger](LogLevel level, const std::string& line) {
          if (logger != nullptr) logger->Write(level, line);
        },
        &env->membership_);
  }
  if (!s.ok()) return s;
  if (!options.listen.empty()) {
    s = Endpoint::Parse(options.listen, &env->listen_);
    if (!s.ok()) return Status::InvalidArgument("option listen", s.message());
  }
  if (!options.peer_auth_token_file.empty()) {
    // This host presents the file's first tenant (or its one token) when it calls peers,
    // and requires one of its tenants' tokens of its own clients.
    s = ReadTenantTokens(options.peer_auth_token_file, &env->tenants_);
    if (!s.ok()) return s;
    env->token_ = env->tenants_[0].token;
  }
  if (!options.listen.empty() && !env->listen_.IsLoopback() && env->token_.empty()) {
    return Status::InvalidArgument("listening on " + env->listen_.ToString() +
                                   " (not loopback) requires peer_auth_token_file");
  }
  TransportOptions t;
  t.auth_token = env->token_;
  if (!env->tenants_.empty()) t.auth_tenant = env->tenants_[0].name;
  t.timeout_ms = std::max<uint64_t>(1, options.peer_timeout_ms);
  t.hash_loopback_bodies = options.peer_hash_loopback_bodies;
  t.log = [logger](LogLevel level, const std::string& line) {
    if (logger != nullptr) logger->Write(level, line);
  };
  const char* kinds[] = {"auto", "tcp", "rdma", "ucx"};
  const std::string kind = kinds[static_cast<int>(options.peer_transport)];
  s = Transport::Create(kind, t, &env->transport_);
  // The namespace registry's calls have a transport of their own: a pull from a member
  // not up yet must not put the data path's connection to it into its reconnect backoff.
  if (s.ok()) s = Transport::Create("tcp", t, &env->registry_transport_);
  if (!s.ok()) return s;
  if (!options.listen.empty() && std::string(env->transport_->Name()) == "ucx") {
    s = UcxServer::Create(t.log, &env->ucx_server_);
    if (!s.ok()) return s;
  }
  env->self_ = options.listen.empty() ? "" : env->listen_.ToString();
  *result = std::move(env);
  return Status::OK();
}

std::shared_ptr<MemoryRegistrar> PeerRouter::Registrar(std::shared_ptr<MemoryRegistrar> next) {
  std::vector<std::shared_ptr<MemoryRegistrar>> all{transport_->registrar()};
  if (ucx_server_ != nullptr) all.push_back(ucx_server_->registrar());
  if (next != nullptr) all.push_back(std::move(next));
  return std::make_shared<Chain>(std::move(all));
}

void PeerRouter::ServeOneSidedPuts(SharedArena* local_arena) {
  if (ucx_server_ != nullptr) ucx_server_->ServePuts(local_arena);
}

Status PeerRouter::StartServing(DB* db, PinFn pin, ServedFn served, const char* arena_base) {
  if (!self_.empty()) {
    Status s = ServePeers(db, std::move(pin), std::move(served), arena_base);
    if (!s.ok()) return s;
  }
  if (Routing() && options_.cluster_delete_hints > 0) {
    replayer_ = std::thread([this] { ReplayLoop(); });
  }
  // Members are known from here on: a source that registers this host does so once it
  // serves, under the port actually bound.
  return membership_->Start(
      self_, [this](std::vector<Endpoint> members) { SetMembers(std::move(members)); });
}

uint64_t PeerRouter::ServingConnectionCap() {
  const DescriptorBudget budget = DescriptorBudget::Plan(
      options_.env != nullptr ? options_.env : Env::Default(), options_.max_open_files);
  bool clamped = false;
  const uint64_t cap = budget.ConnectionCap(options_.peer_max_connections, 1,
                                            !options_.local_listen.empty(), &clamped);
  if (clamped) {
    Log(LogLevel::kWarn, "peer_max_connections " + std::to_string(options_.peer_max_connections) +
                             " clamped to " + std::to_string(cap) +
                             ": the descriptor budget (RLIMIT_NOFILE " +
                             std::to_string(budget.limit) + ", " + std::to_string(budget.in_use) +
                             " in use) holds no more");
  }
  return cap;
}

Status PeerRouter::ServePeers(DB* db, PinFn pin, ServedFn served, const char* arena_base) {
  service_ = std::make_unique<Service>(this, db, std::move(pin), std::move(served), arena_base);
  ServerOptions so;
  so.tenants = tenants_;
  so.handshake_timeout_ms = std::max<uint64_t>(1, options_.peer_handshake_timeout_ms);
  so.io_timeout_ms = std::max<uint64_t>(1, options_.peer_frame_timeout_ms);
  so.max_connections_per_address = std::max<uint64_t>(1, options_.peer_max_connections_per_address);
  so.max_queued_bytes = options_.peer_max_queued_bytes;
  so.max_connections = ServingConnectionCap();
  so.hash_loopback_bodies = options_.peer_hash_loopback_bodies;
  so.log = [this](LogLevel level, const std::string& line) { Log(level, line); };
  if (ucx_server_ != nullptr) {
    UcxServer* us = ucx_server_.get();
    so.ucx_connect = [us](std::string_view request, std::string* answer,
                          std::shared_ptr<void>* client, ServerOptions::LeaseOpFn serve,
                          uint64_t lease_ttl_ms) {
      return us->Connect(request, answer, client, std::move(serve), lease_ttl_ms);
    };
  }
  Status s = TransportServer::Start(listen_, so, service_.get(), &server_);
  if (!s.ok()) return s;
  if (listen_.port == 0) {
    // Name ourselves by the port actually bound.
    listen_.port = server_->port();
    self_ = listen_.ToString();
  }
  Log(LogLevel::kInfo, "serving peers on " + self_ + " over " + transport_->Name());
  return Status::OK();
}

void PeerRouter::Close() {
  // Leave first, so that the others stop routing here while requests drain.
  // (No source when Open failed before making one.)
  if (membership_ != nullptr) membership_->Stop();
  closed_.store(true);
  {
    MutexLock lock(&hints_mu_);
    replay_wake_ = true;
  }
  replay_cv_.NotifyAll();
  if (replayer_.joinable()) replayer_.join();
  if (server_ != nullptr) server_->Stop();
}

std::vector<Endpoint> PeerRouter::Members() const {
  MutexLock lock(&members_mu_);
  return *peers_;
}

std::vector<std::string> PeerRouter::MemberNames() const {
  std::vector<std::string> names;
  for (const Endpoint& e : Members()) names.push_back(e.ToString());
  return names;
}

void PeerRouter::ServeNamespaceSync(NamespaceSyncFn fn) {
  WriterLock lock(&sync_mu_);
  sync_fn_ = std::move(fn);
}

Status PeerRouter::AnswerNamespaceSync(const Tenant* tenant, std::string_view request,
                                       std::string* answer) const {
  ReaderLock lock(&sync_mu_);
  if (!sync_fn_) return Status::Aborted("this member's namespace registry is not open");
  const bool every = tenant == nullptr || tenant->unrestricted();
  return sync_fn_(
      every, [&](uint64_t id) { return every || tenant->AllowsNamespace(id); }, request, answer);
}

Status PeerRouter::SyncNamespaces(const std::string& member, const std::string& request,
                                  std::string* answer) {
  if (closed()) return Status::Aborted("DB is closed");
  Endpoint peer;
  Status s = Endpoint::Parse(member, &peer);
  return s.ok() ? registry_transport_->SyncNamespaces(peer, request, answer) : s;
}

void PeerRouter::SetMembers(std::vector<Endpoint> peers) {
  // Drop this host (a shared list, or the cluster's registry, names every member).
  peers.erase(std::remove_if(peers.begin(), peers.end(),
                             [&](const Endpoint& e) { return e.ToString() == self_; }),
              peers.end());
  {
    // Forget the health of members that left.
    MutexLock lock(&health_mu_);
    std::erase_if(failing_, [&](const auto& f) {
      return std::none_of(peers.begin(), peers.end(),
                          [&](const Endpoint& e) { return e.ToString() == f.first; });
    });
  }
  std::vector<std::string> names;
  for (const Endpoint& e : peers) names.push_back(e.ToString());
  auto snapshot = std::make_shared<const std::vector<Endpoint>>(std::move(peers));
  const auto now = std::chrono::steady_clock::now();
  const auto grace = std::chrono::milliseconds(options_.cluster_join_grace_ms);
  {
    MutexLock lock(&members_mu_);
    std::vector<std::string> before;
    for (const Endpoint& e : *peers_) before.push_back(e.ToString());
    auto in = [](const std::vector<std::string>& v, const std::string& n) {
      return std::find(v.begin(), v.end(), n) != v.end();
    };
    if (!had_members_) {
      // A member of a cluster joins the members it finds: their keys are its now.
      if (!options_.cluster.empty() && !self_.empty() && !names.empty()) joined_[self_] = now;
    } else {
      for (const std::string& n : names) {
        if (!in(before, n)) {
          joined_[n] = now;
          departed_.erase(n);
        }
      }
    }
    for (const std::string& b : before) {
      if (!in(names, b)) {
        departed_[b] = now;
        joined_.erase(b);
      }
    }
    had_members_ = true;
    std::erase_if(joined_, [&](const auto& j) { return now - j.second >= grace; });
    while (departed_.size() > kMaxDeparted) {
      departed_.erase(
          std::min_element(departed_.begin(), departed_.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; }));
    }
    peers_ = std::move(snapshot);
  }
  // A member may have come back: its missed deletes first.
  MutexLock lock(&hints_mu_);
  replay_wake_ = true;
  replay_cv_.NotifyAll();
}

std::vector<std::string> PeerRouter::Departed() const {
  MutexLock lock(&members_mu_);
  std::vector<std::string> out;
  for (const auto& d : departed_) out.push_back(d.first);
  return out;
}

bool PeerRouter::Routing() const { return options_.peer_mode == PeerMode::kSharded; }

bool PeerRouter::ReadThrough() const {
  if (options_.peer_mode != PeerMode::kReadThrough || closed()) return false;
  MutexLock lock(&members_mu_);
  return !peers_->empty();
}

std::string PeerRouter::OwnerOf(const Slice& key) const {
  std::shared_ptr<const std::vector<Endpoint>> peers;
  {
    MutexLock lock(&members_mu_);
    peers = peers_;
  }
  std::string best = self_;
  uint64_t best_score = self_.empty() ? 0 : RendezvousScore(key, self_);
  bool have = !self_.empty();
  for (const Endpoint& e : *peers) {
    const std::string name = e.ToString();
    const uint64_t score = RendezvousScore(key, name);
    if (!have || score > best_score || (score == best_score && name > best)) {
      best = name;
      best_score = score;
      have = true;
    }
  }
  return best;
}

bool PeerRouter::RemoteOwner(const Slice& key, Endpoint* owner) const {
  if (!Routing()) return false;
  const std::string o = OwnerOf(key);
  if (o.empty() || o == self_) return false;
  return Endpoint::Parse(o, owner).ok();
}

void PeerRouter::Partition(std::span<const Slice> keys, std::vector<Endpoint>* members,
                           std::vector<std::vector<size_t>>* groups,
                           std::vector<size_t>* local_idx) const {
  *members = Members();
  groups->assign(members->size(), {});
  std::vector<std::string> names;
  for (const Endpoint& e : *members) names.push_back(e.ToString());
  for (size_t i = 0; i < keys.size(); i++) {
    const std::string o = OwnerOf(keys[i]);
    const auto it = std::find(names.begin(), names.end(), o);
    if (o.empty() || o == self_ || it == names.end()) {
      local_idx->push_back(i);
    } else {
      (*groups)[it - names.begin()].push_back(i);
    }
  }
}

void PeerRouter::NoteCall(const std::string& member, const Status& s) {
  const bool failed = !s.ok() && !s.IsNotFound();
  MutexLock lock(&health_mu_);
  if (failed) {
    failing_[member] = s.ToString();
  } else if (!failing_.empty()) {
    failing_.erase(member);
  }
}

bool PeerRouter::Replicated() const {
  return Routing() && (!options_.cluster.empty() || options_.cluster_replicas > 1);
}

std::vector<std::vector<std::string>> PeerRouter::OwnersOfAll(std::span<const Slice> keys) const {
  std::vector<std::string> names;
  for (const Endpoint& e : Members()) names.push_back(e.ToString());
  if (!self_.empty()) names.push_back(self_);
  std::vector<std::vector<std::string>> owners(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    owners[i] = TopOwners(keys[i], names, options_.cluster_replicas);
    // No member at all (a client whose cluster is empty): keys stay in this DB.
    if (owners[i].empty()) owners[i].push_back(self_);
  }
  return owners;
}

std::vector<std::string> PeerRouter::OwnersOf(const Slice& key) const {
  return std::move(OwnersOfAll(std::span<const Slice>(&key, 1))[0]);
}

void PeerRouter::RunGroups(std::vector<OwnerGroup>* groups, const LocalGroupFn& local,
                           const RemoteGroupFn& remote, bool local_last) {
  auto run = [&](OwnerGroup& group) {
    Status s;
    if (IsSelf(group.owner)) {
      s = local(group.idx, &group.r);
    } else {
      Endpoint peer;
      s = Endpoint::Parse(group.owner, &peer);
      if (s.ok()) s = ReplayFirst(peer);
      if (s.ok()) s = remote(peer, group.idx, &group.r);
      NoteCall(group.owner, s);
      if (!s.ok()) {
        remote_errors_.fetch_add(1);
        Log(LogLevel::kInfo, "cluster: " + s.ToString());
      }
    }
    if (group.r.size() != group.idx.size() || !s.ok()) {
      const int64_t code = s.ok() ? Status::IOError("").ErrorCode() : s.ErrorCode();
      group.r.resize(group.idx.size(), code);
      if (!s.ok()) std::fill(group.r.begin(), group.r.end(), code);
    }
    group.status = std::move(s);
  };
  if (!local_last) {
    ForEachParallel(groups->size(), [&](size_t g) { run((*groups)[g]); });
    return;
  }
  std::vector<OwnerGroup*> remotes, locals;
  for (OwnerGroup& g : *groups) (IsSelf(g.owner) ? locals : remotes).push_back(&g);
  ForEachParallel(remotes.size(), [&](size_t g) { run(*remotes[g]); });
  for (OwnerGroup* g : locals) run(*g);
}

namespace {

// Groups (key index, owner) pairs by owner, in first-seen order.
template <typename Group>
Group* GroupFor(std::vector<Group>* groups, const std::string& owner) {
  for (Group& g : *groups) {
    if (g.owner == owner) return &g;
  }
  groups->push_back(Group{owner, {}, {}, Status::OK()});
  return &groups->back();
}

}  // namespace

std::vector<std::vector<std::string>> PeerRouter::PreviousOwnersOfAll(
    std::span<const Slice> keys, const std::vector<std::vector<std::string>>& owners) const {
  std::vector<std::vector<std::string>> previous(keys.size());
  if (options_.cluster_join_grace_ms == 0) return previous;
  std::vector<std::string> joiners;
  {
    const auto now = std::chrono::steady_clock::now();
    const auto grace = std::chrono::milliseconds(options_.cluster_join_grace_ms);
    MutexLock lock(&members_mu_);
    for (const auto& [name, when] : joined_) {
      if (now - when < grace) joiners.push_back(name);
    }
  }
  if (joiners.empty()) return previous;
  // The set before the joins: the members now, less the members that joined.
  std::vector<std::string> names;
  for (const Endpoint& e : Members()) names.push_back(e.ToString());
  if (!self_.empty()) names.push_back(self_);
  std::erase_if(names, [&](const std::string& n) {
    return std::find(joiners.begin(), joiners.end(), n) != joiners.end();
  });
  if (names.empty()) return previous;
  for (size_t i = 0; i < keys.size(); i++) {
    for (std::string& o : TopOwners(keys[i], names, options_.cluster_replicas)) {
      if (std::find(owners[i].begin(), owners[i].end(), o) == owners[i].end()) {
        previous[i].push_back(std::move(o));
      }
    }
  }
  return previous;
}

void PeerRouter::AskInOrder(std::span<const Slice> keys, std::vector<int64_t>* results,
                            const std::function<bool(int64_t)>& done, const LocalGroupFn& local,
                            const RemoteGroupFn& remote, std::vector<std::string>* from,
                            std::span<const std::string> asked) {
  const int64_t kNotFound = Status::NotFound("").ErrorCode();
  const auto less_asked = [&](std::vector<std::vector<std::string>>* lists) {
    for (size_t i = 0; i < asked.size() && i < lists->size(); i++) {
      if (!asked[i].empty()) std::erase((*lists)[i], asked[i]);
    }
  };
  std::vector<std::vector<std::string>> owners = OwnersOfAll(keys);
  less_asked(&owners);
  results->assign(keys.size(), kNotFound);
  if (from != nullptr) from->assign(keys.size(), "");
  std::vector<bool> settled(keys.size(), false);
  // Asks every unsettled key its candidate of `rank` in `order`; false when none has one.
  auto ask_rank = [&](const std::vector<std::vector<std::string>>& order, size_t rank,
                      bool previous) {
    std::vector<OwnerGroup> groups;
    for (size_t i = 0; i < keys.size(); i++) {
      if (!settled[i] && rank < order[i].size()) {
        GroupFor(&groups, order[i][rank])->idx.push_back(i);
      }
    }
    if (groups.empty()) return false;
    RunGroups(&groups, local, remote);
    for (const OwnerGroup& g : groups) {
      for (size_t j = 0; j < g.idx.size(); j++) {
        if (!done(g.r[j])) continue;
        (*results)[g.idx[j]] = g.r[j];
        settled[g.idx[j]] = true;
        if (!previous) continue;
        grace_hits_.fetch_add(1, std::memory_order_relaxed);
        if (from != nullptr) (*from)[g.idx[j]] = g.owner;
      }
    }
    return true;
  };
  for (size_t rank = 0; rank < options_.cluster_replicas && ask_rank(owners, rank, false); rank++) {
  }
  if (std::all_of(settled.begin(), settled.end(), [](bool b) { return b; })) return;
  // Within a join's grace: the owners the keys had before it, in their order (an asked
  // owner that was one of them is taken out there too).
  std::vector<std::vector<std::string>> previous = PreviousOwnersOfAll(keys, owners);
  less_asked(&previous);
  for (size_t rank = 0; ask_rank(previous, rank, true); rank++) {
  }
}

void PeerRouter::SendToAll(std::span<const Slice> keys, std::vector<int64_t>* results,
                           const LocalGroupFn& local, const RemoteGroupFn& remote,
                           bool local_last) {
  const std::vector<std::vector<std::string>> owners = OwnersOfAll(keys);
  std::vector<OwnerGroup> groups;
  for (size_t i = 0; i < keys.size(); i++) {
    for (const std::string& o : owners[i]) GroupFor(&groups, o)->idx.push_back(i);
  }
  RunGroups(&groups, local, remote, local_last);
  CollapseAnswers(owners, groups, results);
}

void PeerRouter::CollapseAnswers(const std::vector<std::vector<std::string>>& owners,
                                 const std::vector<OwnerGroup>& groups,
                                 std::vector<int64_t>* results) {
  const int64_t kNotFound = Status::NotFound("").ErrorCode();
  // Each key's answers in its owners' order.
  std::vector<std::vector<int64_t>> answers(owners.size());
  for (size_t i = 0; i < owners.size(); i++) answers[i].resize(owners[i].size(), kNotFound);
  for (const OwnerGroup& g : groups) {
    for (size_t j = 0; j < g.idx.size(); j++) {
      const size_t i = g.idx[j];
      const size_t rank =
          std::find(owners[i].begin(), owners[i].end(), g.owner) - owners[i].begin();
      if (rank < answers[i].size()) answers[i][rank] = g.r[j];  // else a previous owner
    }
  }
  results->assign(owners.size(), 0);
  for (size_t i = 0; i < owners.size(); i++) {
    const auto& a = answers[i];
    auto it = std::find_if(a.begin(), a.end(), [](int64_t r) { return r >= 0; });
    if (it == a.end()) it = std::find(a.begin(), a.end(), kNotFound);
    (*results)[i] = it != a.end() ? *it : a.front();
  }
}

namespace {

Status OneResult(const Status& s, const std::vector<int64_t>& r) {
  if (!s.ok()) return s;
  if (r.size() != 1) return Status::Corruption("no result for the key");
  if (r[0] >= 0) return Status::OK();
  return Status::FromErrorCode(static_cast<int>(r[0]), "on every replica");
}

}  // namespace

Status PeerRouter::PutReplicated(DB* local, const Slice& key, const Slice& value) {
  std::vector<int64_t> r;
  const ValueParts parts{value};
  Status s = BatchPut(local, WriteOptions(), std::span<const Slice>(&key, 1),
                      std::span<const ValueParts>(&parts, 1), &r);
  return OneResult(s, r);
}

Status PeerRouter::GetIntoReplicated(DB* local, const Slice& key, MutableSlice buffer,
                                     size_t* size) {
  std::vector<int64_t> r;
  const Destination dest{buffer};
  Status s = BatchGetInto(local, ReadOptions(), std::span<const Slice>(&key, 1),
                          std::span<const Destination>(&dest, 1), &r);
  s = OneResult(s, r);
  if (size != nullptr) *size = s.ok() ? static_cast<size_t>(r[0]) : 0;
  return s;
}

Status PeerRouter::DeleteReplicated(DB* local, const Slice& key) {
  std::vector<int64_t> r;
  Status s = BatchDelete(local, WriteOptions(), std::span<const Slice>(&key, 1), &r);
  return OneResult(s, r);
}

Status PeerRouter::FromFirstOwner(const Slice& key, const std::function<Status()>& local,
                                  const std::function<Status(const Endpoint&)>& remote,
                                  std::string* from) {
  if (closed()) return Status::Aborted("DB is closed");
  if (from != nullptr) from->clear();
  auto ask = [&](const std::string& owner) {
    Status s;
    if (IsSelf(owner)) {
      s = local();
    } else {
      Endpoint peer;
      s = Endpoint::Parse(owner, &peer);
      if (s.ok()) s = remote(peer);  // Get, GetValueSize: they replay first
      NoteCall(owner, s);
      if (!s.ok() && !s.IsNotFound()) remote_errors_.fetch_add(1);
    }
    return s;
  };
  const std::vector<std::vector<std::string>> owners = OwnersOfAll(std::span<const Slice>(&key, 1));
  for (const std::string& owner : owners[0]) {
    if (ask(owner).ok()) return Status::OK();
  }
  // Within a join's grace: the owners the key had before it.
  const std::vector<std::vector<std::string>> previous =
      PreviousOwnersOfAll(std::span<const Slice>(&key, 1), owners);
  for (const std::string& owner : previous[0]) {
    if (ask(owner).ok()) {
      grace_hits_.fetch_add(1, std::memory_order_relaxed);
      if (from != nullptr) *from = owner;
      return Status::OK();
    }
  }
  return Status::NotFound("key not found on its replicas");
}

Status PeerRouter::GetReplicated(DB* local, const Slice& key, std::string* value) {
  std::string from;
  Status s = FromFirstOwner(
      key, [&] { return local->Get(ReadOptions(), key, value); },
      [&](const Endpoint& peer) { return Get(peer, key, value); }, &from);
  if (s.ok() && !from.empty()) {
    const ValueParts parts{Slice(*value)};
    MoveToOwners(local, std::span<const Slice>(&key, 1), std::span<const ValueParts>(&parts, 1),
                 {from});
  }
  return s;
}

Status PeerRouter::GetValueSizeReplicated(DB* local, const Slice& key, uint64_t* size) {
  return FromFirstOwner(
      key, [&] { return local->GetValueSize(key, size); },
      [&](const Endpoint& peer) { return GetValueSize(peer, key, size); });
}

namespace {

template <typename T>
std::vector<T> Pick(std::span<const T> all, const std::vector<size_t>& idx) {
  std::vector<T> out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(all[i]);
  return out;
}

}  // namespace

void PeerRouter::MoveToOwners(DB* local, std::span<const Slice> keys,
                              std::span<const ValueParts> values,
                              const std::vector<std::string>& from) {
  std::vector<size_t> which;
  for (size_t i = 0; i < keys.size(); i++) {
    if (!from[i].empty()) which.push_back(i);
  }
  if (which.empty()) return;
  const std::vector<Slice> k = Pick(keys, which);
  const std::vector<ValueParts> v = Pick(values, which);
  std::vector<int64_t> put;
  SendToAll(
      k, &put,
      [&](const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return local->BatchPut(WriteOptions(), Pick<Slice>(k, idx), Pick<ValueParts>(v, idx), r);
      },
      [&](const Endpoint& peer, const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return RemotePut(peer, Pick<Slice>(k, idx), Pick<ValueParts>(v, idx), r);
      });
  // Then gone from where it was found: one copy, on its owners.
  std::vector<OwnerGroup> groups;
  for (size_t j = 0; j < which.size(); j++) {
    if (put[j] >= 0) GroupFor(&groups, from[which[j]])->idx.push_back(j);
  }
  if (groups.empty()) return;
  RunGroups(
      &groups,
      [&](const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return local->BatchDelete(WriteOptions(), Pick<Slice>(k, idx), r);
      },
      [&](const Endpoint& peer, const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return transport_->BatchDelete(peer, Pick<Slice>(k, idx), r);
      });
  for (const OwnerGroup& g : groups) moved_.fetch_add(g.idx.size(), std::memory_order_relaxed);
}

void PeerRouter::DeleteOnOwners(DB* local, const WriteOptions& options, std::span<const Slice> keys,
                                std::vector<int64_t>* results) {
  const std::vector<std::vector<std::string>> owners = OwnersOfAll(keys);
  const std::vector<std::vector<std::string>> previous = PreviousOwnersOfAll(keys, owners);
  std::vector<OwnerGroup> groups;
  for (size_t i = 0; i < keys.size(); i++) {
    for (const std::string& o : owners[i]) GroupFor(&groups, o)->idx.push_back(i);
    for (const std::string& o : previous[i]) GroupFor(&groups, o)->idx.push_back(i);
  }
  RunGroups(
      &groups,
      [&](const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return local->BatchDelete(options, Pick(keys, idx), r);
      },
      [&](const Endpoint& peer, const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return transport_->BatchDelete(peer, Pick(keys, idx), r);
      });
  // An owner that was not reached applies the delete when it is (record and replay).
  for (const OwnerGroup& g : groups) {
    if (IsSelf(g.owner) || g.status.ok()) continue;
    Hint missed;
    for (size_t i : g.idx) missed.keys.insert(keys[i].ToString());
    RecordHint(g.owner, missed);
  }
  // So does a member that has left the set and would own the key again on its return:
  // it may come back holding the value.
  const std::vector<std::string> departed = Departed();
  if (!departed.empty()) {
    std::vector<std::string> names = departed;
    for (const Endpoint& e : Members()) names.push_back(e.ToString());
    if (!self_.empty()) names.push_back(self_);
    std::map<std::string, Hint> missed;
    for (size_t i = 0; i < keys.size(); i++) {
      for (const std::string& o : TopOwners(keys[i], names, options_.cluster_replicas)) {
        if (std::find(departed.begin(), departed.end(), o) != departed.end()) {
          missed[o].keys.insert(keys[i].ToString());
        }
      }
    }
    for (const auto& [member, hint] : missed) RecordHint(member, hint);
  }
  CollapseAnswers(owners, groups, results);
  // A key its owners lacked but a previous owner held was deleted, not absent.
  const int64_t kNotFound = Status::NotFound("").ErrorCode();
  for (const OwnerGroup& g : groups) {
    for (size_t j = 0; j < g.idx.size(); j++) {
      const size_t i = g.idx[j];
      if ((*results)[i] == kNotFound && g.r[j] >= 0 &&
          std::find(previous[i].begin(), previous[i].end(), g.owner) != previous[i].end()) {
        (*results)[i] = g.r[j];
      }
    }
  }
}

// The shape every sharded batch call shares: local keys through `local_call`, each
// remote group through `remote_call`, merged into *results.
#define KV_SHARDED_BATCH(LOCAL_CALL, REMOTE_CALL)                                             \
  do {                                                                                        \
    if (closed()) return Status::Aborted("DB is closed");                                     \
    std::vector<Endpoint> members;                                                            \
    std::vector<std::vector<size_t>> groups;                                                  \
    std::vector<size_t> local_idx;                                                            \
    Partition(keys, &members, &groups, &local_idx);                                           \
    results->assign(keys.size(), 0);                                                          \
    Status local_status;                                                                      \
    if (!local_idx.empty()) {                                                                 \
      const std::vector<size_t>& idx = local_idx;                                             \
      std::vector<int64_t> r;                                                                 \
      local_status = (LOCAL_CALL);                                                            \
      if (local_status.ok()) {                                                                \
        for (size_t j = 0; j < idx.size(); j++) (*results)[idx[j]] = r[j];                    \
      }                                                                                       \
    }                                                                                         \
    if (!local_status.ok()) {                                                                 \
      results->clear();                                                                       \
      return local_status;                                                                    \
    }                                                                                         \
    std::vector<size_t> busy;                                                                 \
    for (size_t g = 0; g < groups.size(); g++) {                                              \
      if (!groups[g].empty()) busy.push_back(g);                                              \
    }                                                                                         \
    if (busy.empty()) return Status::OK();                                                    \
    ForEachParallel(busy.size(), [&](size_t b) {                                              \
      const Endpoint& peer = members[busy[b]];                                                \
      const std::vector<size_t>& idx = groups[busy[b]];                                       \
      std::vector<int64_t> r;                                                                 \
      Status s = ReplayFirst(peer);                                                           \
      if (s.ok()) s = (REMOTE_CALL);                                                          \
      NoteCall(peer.ToString(), s);                                                           \
      if (!s.ok()) {                                                                          \
        remote_errors_.fetch_add(1);                                                          \
        Log(LogLevel::kWarn, s.ToString());                                                   \
      }                                                                                       \
      for (size_t j = 0; j < idx.size(); j++) {                                               \
        (*results)[idx[j]] =                                                                  \
            j < r.size() ? r[j] : (s.ok() ? Status::IOError("").ErrorCode() : s.ErrorCode()); \
      }                                                                                       \
    });                                                                                       \
    return Status::OK();                                                                      \
  } while (0)

Status PeerRouter::BatchPut(DB* local, const WriteOptions& options, std::span<const Slice> keys,
                            std::span<const ValueParts> values, std::vector<int64_t>* results) {
  // The owners check the rest (sizes, the batch limit) of their own share.
  Status s = input::CheckBatch("BatchPut", results, keys.size(), values.size(), "values", 0);
  if (s.ok()) s = input::CheckUniqueKeys(keys);
  if (!s.ok()) return s;
  remote_puts_.fetch_add(keys.size(), std::memory_order_relaxed);
  if (Replicated()) {
    if (closed()) return Status::Aborted("DB is closed");
    SendToAll(
        keys, results,
        [&](const std::vector<size_t>& idx, std::vector<int64_t>* r) {
          return local->BatchPut(options, Pick(keys, idx), Pick(values, idx), r);
        },
        [&](const Endpoint& peer, const std::vector<size_t>& idx, std::vector<int64_t>* r) {
          return RemotePut(peer, Pick(keys, idx), Pick(values, idx), r);
        });
    return Status::OK();
  }
  KV_SHARDED_BATCH(local->BatchPut(options, Pick(keys, idx), Pick(values, idx), &r),
                   RemotePut(peer, Pick(keys, idx), Pick(values, idx), &r));
}

Status PeerRouter::BatchPutLocalLast(std::span<const Slice> keys,
                                     std::span<const ValueParts> values,
                                     const LocalGroupFn& local_put, std::vector<int64_t>* results) {
  if (closed()) return Status::Aborted("DB is closed");
  remote_puts_.fetch_add(keys.size(), std::memory_order_relaxed);
  // One owner per key (R = 1) or R: the same walk, this host's share last.
  SendToAll(
      keys, results, local_put,
      [&](const Endpoint& peer, const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return RemotePut(peer, Pick(keys, idx), Pick(values, idx), r);
      },
      /*local_last=*/true);
  return Status::OK();
}

Status PeerRouter::BatchGetInto(DB* local, const ReadOptions& options, std::span<const Slice> keys,
                                std::span<const Destination> dests, std::vector<int64_t>* results) {
  Status s =
      input::CheckBatch("BatchGetInto", results, keys.size(), dests.size(), "destinations", 0);
  if (!s.ok()) return s;
  remote_gets_.fetch_add(keys.size(), std::memory_order_relaxed);
  if (Replicated()) {
    if (closed()) return Status::Aborted("DB is closed");
    GetFromOwners(local, options, keys, dests, results);
    return Status::OK();
  }
  KV_SHARDED_BATCH(local->BatchGetInto(options, Pick(keys, idx), Pick(dests, idx), &r),
                   RemoteGet(peer, Pick(keys, idx), Pick(dests, idx), &r));
}

namespace {

// A hit, or a buffer too small for the value, settles a key: its other owners are not
// asked.
bool SettlesGet(int64_t r) { return r >= 0 || r == Status::BufferTooSmall("").ErrorCode(); }

}  // namespace

void PeerRouter::GetFromOwners(DB* local, const ReadOptions& options, std::span<const Slice> keys,
                               std::span<const Destination> dests, std::vector<int64_t>* results,
                               std::span<const std::string> asked) {
  std::vector<std::string> from;
  AskInOrder(
      keys, results, SettlesGet,
      [&](const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return local->BatchGetInto(options, Pick(keys, idx), Pick(dests, idx), r);
      },
      [&](const Endpoint& peer, const std::vector<size_t>& idx, std::vector<int64_t>* r) {
        return RemoteGet(peer, Pick(keys, idx), Pick(dests, idx), r);
      },
      &from, asked);
  // Keys found on an owner they had before a join move to their owners now, from the
  // caller's buffers (host memory only: the transports do not read GPU memory).
  std::vector<ValueParts> values(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    if (from[i].empty()) continue;
    if ((*results)[i] < 0 || OnDevice(dests[i])) {
      from[i].clear();
      continue;
    }
    values[i] = FilledParts(dests[i], static_cast<uint64_t>((*results)[i]));
  }
  MoveToOwners(local, keys, values, from);
}

// The bytes a layer-wise load keeps in flight (BatchGetIntoGroups): enough to cover a
// network's round trip at its bandwidth many times over (100 us at 100 Gb/s is 1.25 MB),
// while a load of large values does not stream all of its bytes through the sockets'
// buffers at once: on a 2-core VM a 32 MiB load with every 1 MiB layer in flight took
// 2.5x as long as one layer at a time (docs/benchmarks.md).
constexpr uint64_t kLoadWindowBytes = 4 << 20;

// One group's keys of one first owner, and its read in flight.
struct PeerRouter::GroupCall {
  std::string owner;
  std::vector<size_t> idx;  // the keys', indexes into the load
  std::vector<Slice> keys;
  std::vector<Destination> dests;
  std::vector<int64_t> r;
  Status reached;  // why the owner could not be asked (Parse, ReplayFirst); else OK
  std::unique_ptr<PendingGet> pending;
};

Status PeerRouter::BatchGetIntoGroups(DB* local, const ReadOptions& options,
                                      std::span<const Slice> keys,
                                      std::span<const Destination> dests,
                                      std::span<const size_t> group_ends,
                                      const DB::GroupReadyFn& on_ready,
                                      std::vector<int64_t>* results) {
  Status s = input::CheckGroupedBatch(results, keys.size(), dests.size(), group_ends);
  if (!s.ok()) return s;
  if (closed()) return Status::Aborted("DB is closed");
  remote_gets_.fetch_add(keys.size(), std::memory_order_relaxed);
  results->assign(keys.size(), 0);
  // One member snapshot for the whole load; each key is asked of its first owner.
  const std::vector<std::vector<std::string>> owners = OwnersOfAll(keys);
  std::map<std::string, Status> reached;  // per member: its missed deletes replayed?
  std::vector<std::vector<size_t>> local_idx(group_ends.size());
  std::vector<std::unique_ptr<GroupCall>> calls;
  std::vector<size_t> calls_end(group_ends.size());  // group g's: [calls_end[g-1], calls_end[g])
  size_t reported = 0;
  // Group g's calls are answered (always at once over a transport that does not
  // pipeline, whose "started" calls ran to the end).
  auto answered = [&](size_t g) {
    for (size_t c = g == 0 ? 0 : calls_end[g - 1]; c < calls_end[g]; c++) {
      if (calls[c]->pending != nullptr && !calls[c]->pending->Ready()) return false;
    }
    return true;
  };
  auto finish = [&](size_t g) {
    const size_t first = g == 0 ? 0 : calls_end[g - 1];
    FinishGroup(
        local, options, keys, dests, local_idx[g],
        std::span<const std::unique_ptr<GroupCall>>(calls).subspan(first, calls_end[g] - first),
        results);
    if (on_ready) on_ready(g);
  };
  // The bytes each group may bring from other members.
  std::vector<uint64_t> group_bytes(group_ends.size());
  for (size_t g = 0, i = 0; g < group_ends.size(); g++) {
    for (; i < group_ends[g]; i++) {
      if (IsSelf(owners[i][0])) continue;
      for (const MutableSlice& d : dests[i]) group_bytes[g] += d.size();
    }
  }
  // Starts groups [first, end): each member's share of them in one call
  // (Transport::StartBatchGetGroups: one request over TCP, a group answered by a frame
  // of its own), so that a load of many small layers costs each member one request,
  // not one per layer.
  auto start = [&](size_t first, size_t end) {
    std::vector<std::string> run_owners;  // the members asked, in order of first ask
    for (size_t g = first; g < end; g++) {
      const size_t group_first = calls.size();
      for (size_t i = g == 0 ? 0 : group_ends[g - 1]; i < group_ends[g]; i++) {
        const std::string& owner = owners[i][0];
        if (IsSelf(owner)) {
          local_idx[g].push_back(i);
          continue;
        }
        GroupCall* call = nullptr;
        for (size_t c = group_first; c < calls.size() && call == nullptr; c++) {
          if (calls[c]->owner == owner) call = calls[c].get();
        }
        if (call == nullptr) {
          calls.push_back(std::make_unique<GroupCall>());
          call = calls.back().get();
          call->owner = owner;
          if (std::find(run_owners.begin(), run_owners.end(), owner) == run_owners.end()) {
            run_owners.push_back(owner);
          }
        }
        call->idx.push_back(i);
        call->keys.push_back(keys[i]);
        call->dests.push_back(dests[i]);
      }
      calls_end[g] = calls.size();
    }
    const size_t run_first = first == 0 ? 0 : calls_end[first - 1];
    for (const std::string& owner : run_owners) {
      Endpoint peer;
      Status ok = Endpoint::Parse(owner, &peer);
      auto it = reached.find(owner);
      if (it == reached.end()) {
        // Before anything else is sent to a member, the deletes it missed.
        if (ok.ok()) ok = ReplayFirst(peer);
        it = reached.emplace(owner, ok).first;
      }
      std::vector<GroupCall*> mine;
      std::vector<Transport::GetGroup> asks;
      for (size_t c = run_first; c < calls.size(); c++) {
        GroupCall* call = calls[c].get();
        if (call->owner != owner) continue;
        call->reached = it->second;
        if (!call->reached.ok()) continue;
        mine.push_back(call);
        asks.push_back({call->keys, call->dests, &call->r});
      }
      if (asks.empty()) continue;
      std::vector<std::unique_ptr<PendingGet>> pending;
      transport_->StartBatchGetGroups(peer, asks, &pending);
      for (size_t j = 0; j < mine.size() && j < pending.size(); j++) {
        mine[j]->pending = std::move(pending[j]);
      }
    }
  };
  // Groups are started in order, in runs: a run starts when the bytes of the groups
  // started and not yet reported fall below half of kLoadWindowBytes (or none are in
  // flight), and takes groups while they stay within the window (at least one).  The
  // oldest group is reported as soon as it is answered -- at once, between runs, when
  // its answer is already in.
  //
  // The first group goes alone when other members hold part of it: its own small
  // request to each of its owners, ahead of the rest.  Asked together with the later
  // groups, its answer waited behind them: the member looks up and pins a request's
  // every group before it writes the first, and where the member and this client share
  // CPUs (loopback, a busy host) the member, woken by the request, writes its whole
  // share before this thread runs again -- 0.36-0.53 ms for the first of 32 layers of
  // 64 KiB over 3 members, against 0.07-0.17 ms alone (docs/benchmarks.md).  Its answer
  // is then taken in before the rest is asked for, when it is already in.
  const bool first_alone = group_ends.size() > 1 && group_bytes[0] > 0;
  uint64_t in_flight = 0;
  size_t started = 0;
  while (reported < group_ends.size()) {
    if (started < group_ends.size() && (started == reported || in_flight < kLoadWindowBytes / 2)) {
      const size_t first = started;
      const bool alone = first == 0 && first_alone;
      while (started < group_ends.size() &&
             (started == first || (!alone && in_flight < kLoadWindowBytes))) {
        in_flight += group_bytes[started++];
      }
      start(first, started);
      while (reported < started && answered(reported)) {
        in_flight -= group_bytes[reported];
        finish(reported++);
      }
      continue;
    }
    in_flight -= group_bytes[reported];
    finish(reported++);
  }
  return Status::OK();
}

void PeerRouter::FinishGroup(DB* local, const ReadOptions& options, std::span<const Slice> keys,
                             std::span<const Destination> dests,
                             const std::vector<size_t>& local_idx,
                             std::span<const std::unique_ptr<GroupCall>> calls,
                             std::vector<int64_t>* results) {
  if (!local_idx.empty()) {
    std::vector<int64_t> r;
    Status ls = local->BatchGetInto(options, Pick(keys, local_idx), Pick(dests, local_idx), &r);
    for (size_t j = 0; j < local_idx.size(); j++) {
      (*results)[local_idx[j]] = ls.ok() && j < r.size() ? r[j] : ls.ErrorCode();
    }
  }
  for (const std::unique_ptr<GroupCall>& call : calls) {
    Status cs = call->reached;
    if (call->pending != nullptr) {
      cs = call->pending->Wait();
      CountRemoteGet(cs, call->idx.size(), call->r);
    }
    NoteCall(call->owner, cs);
    if (!cs.ok()) {
      remote_errors_.fetch_add(1);
      Log(LogLevel::kInfo, "cluster: " + cs.ToString());
    }
    for (size_t j = 0; j < call->idx.size(); j++) {
      (*results)[call->idx[j]] = cs.ok() && j < call->r.size()
                                     ? call->r[j]
                                     : (cs.ok() ? Status::IOError("").ErrorCode() : cs.ErrorCode());
    }
  }
  if (!Replicated()) return;  // one owner per key: its answer stands, as BatchGetInto's
  // Keys their first owner did not serve: the other owners, as BatchGetInto asks them.
  // The first owner is named, not ranked: it may have left the member set meanwhile (a
  // dead member's lease lapsed while its reads timed out), and then its second owner
  // ranks first.
  std::vector<size_t> rest;
  std::vector<std::string> asked;
  for (const std::unique_ptr<GroupCall>& call : calls) {
    for (size_t i : call->idx) {
      if (SettlesGet((*results)[i])) continue;
      rest.push_back(i);
      asked.push_back(call->owner);
    }
  }
  for (size_t i : local_idx) {
    if (SettlesGet((*results)[i])) continue;
    rest.push_back(i);
    asked.push_back(self_);
  }
  if (rest.empty()) return;
  std::vector<int64_t> r;
  GetFromOwners(local, options, Pick(keys, rest), Pick(dests, rest), &r, asked);
  for (size_t j = 0; j < rest.size(); j++) (*results)[rest[j]] = r[j];
}

Status PeerRouter::BatchExists(DB* local, std::span<const Slice> keys,
                               std::vector<int64_t>* results) {
  Status checked = input::CheckBatch("BatchExists", results, keys.size(), keys.size(), "keys", 0);
  if (!checked.ok()) return checked;
  if (Replicated()) {
    if (closed()) return Status::Aborted("DB is closed");
    AskInOrder(
        keys, results, [](int64_t r) { return r == 1; },
        [&](const std::vector<size_t>& idx, std::vector<int64_t>* r) {
          return local->BatchExists(Pick(keys, idx), r);
        },
        [&](const Endpoint& peer, const std::vector<size_t>& idx, std::vector<int64_t>* r) {
          return transport_->BatchExists(peer, Pick(keys, idx), r);
        });
    // Exists answers 0 for absent, never NotFound.
    for (int64_t& r : *results) r = r == 1 ? 1 : 0;
    return Status::OK();
  }
  KV_SHARDED_BATCH(local->BatchExists(Pick(keys, idx), &r),
                   transport_->BatchExists(peer, Pick(keys, idx), &r));
}

Status PeerRouter::BatchDelete(DB* local, const WriteOptions& options, std::span<const Slice> keys,
                               std::vector<int64_t>* results) {
  Status checked = input::CheckBatch("BatchDelete", results, keys.size(), keys.size(), "keys", 0);
  if (!checked.ok()) return checked;
  if (closed()) return Status::Aborted("DB is closed");
  // One owner or R: the same walk, which records what an owner missed.
  DeleteOnOwners(local, options, keys, results);
  return Status::OK();
}

#undef KV_SHARDED_BATCH

namespace {

Status KeyResult(const Status& batch, const std::vector<int64_t>& r, const Endpoint& peer) {
  if (!batch.ok()) return batch;
  if (r.size() != 1) return Status::Corruption("peer " + peer.ToString() + ": no result");
  if (r[0] >= 0) return Status::OK();
  return Status::FromErrorCode(static_cast<int>(r[0]), "on peer " + peer.ToString());
}

}  // namespace

void PeerRouter::CountNotRead(const Status& why) {
  if (!why.ok()) {
    CountPeerFailure(why);
    return;
  }
  peer_tier_->Add(peer_tier_->misses);
  peer_tier_->Failed(ReadFailure::absent);
}

void PeerRouter::CountPeerFailure(const Status& s) {
  // The transports say which kind of failure in their messages only ("timed out after N
  // ms", "connect to ...", "connection closed by peer", "unavailable (...)"): this is
  // the one place that reads them.
  const std::string& m = s.message();
  auto says = [&m](const char* what) { return m.find(what) != std::string::npos; };
  ReadFailure why = ReadFailure::io_error;
  if (s.IsCorruption()) {
    why = ReadFailure::checksum_mismatch;
  } else if (says("connect to ") || says("unavailable (") || says("connection closed") ||
             says("Connection refused") || says("Connection reset") || says("Broken pipe")) {
    why = ReadFailure::peer_down;
  } else if (says("timed out")) {
    why = ReadFailure::timeout;
  }
  peer_tier_->Failed(why);
}

Status PeerRouter::RemoteGet(const Endpoint& peer, std::span<const Slice> keys,
                             std::span<const Destination> dests, std::vector<int64_t>* r) {
  Status s = transport_->BatchGet(peer, keys, dests, r);
  CountRemoteGet(s, keys.size(), *r);
  return s;
}

void PeerRouter::CountRemoteGet(const Status& s, size_t n, const std::vector<int64_t>& r) {
  for (size_t j = 0; j < n; j++) {
    const int64_t result = s.ok() && j < r.size() ? r[j] : s.ErrorCode();
    if (result >= 0) {
      peer_tier_->Hit(static_cast<uint64_t>(result));
    } else if (result == Status::NotFound("").ErrorCode()) {
      peer_tier_->Add(peer_tier_->misses);
    } else if (result != Status::BufferTooSmall("").ErrorCode()) {
      CountPeerFailure(s.ok() ? Status::FromErrorCode(static_cast<int>(result)) : s);
    }
  }
}

Status PeerRouter::RemotePut(const Endpoint& peer, std::span<const Slice> keys,
                             std::span<const ValueParts> values, std::vector<int64_t>* r) {
  Status s = transport_->BatchPut(peer, keys, values, r);
  for (size_t j = 0; s.ok() && j < r->size() && j < values.size(); j++) {
    if ((*r)[j] >= 0) peer_tier_->Add(peer_tier_->bytes_in, PartsSize(values[j]));
  }
  return s;
}

void PeerRouter::AppendPrometheus(std::string* out) const {
  size_t failing = 0;
  {
    MutexLock lock(&health_mu_);
    failing = failing_.size();
  }
  const size_t members = Members().size() + (self_.empty() ? 0 : 1);
  *out +=
      "# HELP kvengine_cluster_members Members this host routes over, itself included "
      "when it serves.\n# TYPE kvengine_cluster_members gauge\nkvengine_cluster_members " +
      std::to_string(members) +
      "\n# HELP kvengine_cluster_failing_members Members whose last call from this host "
      "failed.\n# TYPE kvengine_cluster_failing_members gauge\n"
      "kvengine_cluster_failing_members " +
      std::to_string(failing) + "\n";
  if (server_ == nullptr) return;
  *out +=
      "# HELP kvengine_peer_permission_denied_total Peer requests refused for naming a "
      "namespace their tenant is not bound to, by tenant.\n"
      "# TYPE kvengine_peer_permission_denied_total counter\n";
  for (const auto& [tenant, refused] : server_->permission_denied_by_tenant()) {
    *out += "kvengine_peer_permission_denied_total{tenant=\"" + tenant + "\"} " +
            std::to_string(refused) + "\n";
  }
}

std::string PeerRouter::Readiness() const {
  return membership_ != nullptr ? membership_->Readiness() : "cluster_member: ok\n";
}

Status PeerRouter::Put(const Endpoint& owner, const Slice& key, const Slice& value) {
  if (closed()) return Status::Aborted("DB is closed");
  if (Status replay = ReplayFirst(owner); !replay.ok()) return replay;
  std::vector<int64_t> r;
  const ValueParts parts{value};
  Status s =
      RemotePut(owner, std::span<const Slice>(&key, 1), std::span<const ValueParts>(&parts, 1), &r);
  return KeyResult(s, r, owner);
}

Status PeerRouter::Get(const Endpoint& owner, const Slice& key, std::string* value) {
  if (closed()) return Status::Aborted("DB is closed");
  if (Status replay = ReplayFirst(owner); !replay.ok()) return replay;
  std::vector<int64_t> r;
  std::vector<std::string> values;
  Status s = transport_->BatchGetOwned(owner, std::span<const Slice>(&key, 1), &values, &r);
  s = KeyResult(s, r, owner);
  if (s.ok()) {
    *value = std::move(values[0]);
    peer_tier_->Hit(value->size());
  } else if (s.IsNotFound()) {
    peer_tier_->Add(peer_tier_->misses);
  } else {
    CountPeerFailure(s);
  }
  return s;
}

Status PeerRouter::GetInto(const Endpoint& owner, const Slice& key, MutableSlice buffer,
                           size_t* size) {
  if (closed()) return Status::Aborted("DB is closed");
  if (Status replay = ReplayFirst(owner); !replay.ok()) {
    if (size != nullptr) *size = 0;
    return replay;
  }
  std::vector<int64_t> r;
  const Destination dest{buffer};
  Status s =
      RemoteGet(owner, std::span<const Slice>(&key, 1), std::span<const Destination>(&dest, 1), &r);
  Status k = KeyResult(s, r, owner);
  if (size != nullptr) *size = k.ok() ? static_cast<size_t>(r[0]) : 0;
  return k;
}

Status PeerRouter::Delete(const Endpoint& owner, const Slice& key) {
  if (closed()) return Status::Aborted("DB is closed");
  if (Status replay = ReplayFirst(owner); !replay.ok()) return replay;
  std::vector<int64_t> r;
  Status s = transport_->BatchDelete(owner, std::span<const Slice>(&key, 1), &r);
  return KeyResult(s, r, owner);
}

Status PeerRouter::GetValueSize(const Endpoint& owner, const Slice& key, uint64_t* size) {
  if (closed()) return Status::Aborted("DB is closed");
  if (Status replay = ReplayFirst(owner); !replay.ok()) return replay;
  std::vector<int64_t> r;
  Status s = transport_->BatchValueSize(owner, std::span<const Slice>(&key, 1), &r);
  s = KeyResult(s, r, owner);
  if (s.ok()) *size = static_cast<uint64_t>(r[0]);
  return s;
}

Status PeerRouter::DeleteByRegex(DB* local, const std::string& pattern, uint64_t* deleted) {
  if (pattern.size() > wire::kMaxPatternLen) {
    return Status::InvalidArgument("DeleteByRegex: pattern of " + std::to_string(pattern.size()) +
                                   " bytes exceeds the peer protocol's limit of " +
                                   std::to_string(wire::kMaxPatternLen));
  }
  Hint hint;
  hint.patterns.push_back(pattern);
  return DeleteEverywhere(
      "delete_by_regex", [&](uint64_t* n) { return local->DeleteByRegex(pattern, n); },
      [&](const Endpoint& peer, uint64_t* n) {
        return transport_->DeleteByRegex(peer, pattern, n);
      },
      deleted, hint);
}

Status PeerRouter::DeleteAll(DB* local, uint64_t* deleted) {
  Hint hint;
  hint.all = true;
  return DeleteEverywhere(
      "delete_all", [&](uint64_t* n) { return local->DeleteAll(n); },
      [&](const Endpoint& peer, uint64_t* n) { return transport_->DeleteAll(peer, n); }, deleted,
      hint);
}

Status PeerRouter::DeleteEverywhere(const char* what, const std::function<Status(uint64_t*)>& local,
                                    const std::function<Status(const Endpoint&, uint64_t*)>& remote,
                                    uint64_t* deleted, const Hint& hint) {
  if (closed()) return Status::Aborted("DB is closed");
  const std::vector<Endpoint> peers = Members();
  // Slot 0 is this host; slot j > 0 is peers[j - 1].
  std::vector<Status> status(peers.size() + 1);
  std::vector<uint64_t> counts(peers.size() + 1, 0);
  ForEachParallel(peers.size() + 1, [&](size_t j) {
    if (j == 0) {
      status[0] = local(&counts[0]);
    } else {
      status[j] = ReplayFirst(peers[j - 1]);
      if (status[j].ok()) status[j] = remote(peers[j - 1], &counts[j]);
    }
  });
  // The members that missed it apply it when they are back (record and replay).
  for (size_t j = 1; j < status.size(); j++) {
    if (!status[j].ok()) RecordHint(peers[j - 1].ToString(), hint);
  }
  for (const std::string& member : Departed()) RecordHint(member, hint);
  uint64_t total = 0;
  size_t failures = 0;
  std::string why;
  for (size_t j = 0; j < status.size(); j++) {
    if (status[j].ok()) {
      total += counts[j];
      continue;
    }
    failures++;
    if (!why.empty()) why += "; ";
    if (j == 0) {
      why += "this host" + (self_.empty() ? std::string() : " " + self_) + ": ";
    } else {
      remote_errors_.fetch_add(1);
    }
    why += status[j].ToString();  // a peer's names the peer
  }
  if (deleted != nullptr) *deleted = total;
  if (failures == 0) return Status::OK();
  Status s = Status::IOError(std::string(what) + " failed on " + std::to_string(failures) + " of " +
                                 std::to_string(status.size()) + " hosts (" +
                                 std::to_string(total) + " keys removed by the others)",
                             why);
  Log(LogLevel::kWarn, s.ToString());
  return s;
}

void PeerRouter::ReadThroughGet(std::span<const Slice> keys, std::span<const Destination> dests,
                                std::vector<int64_t>* results, const PromoteFn& promote) {
  const int64_t kNotFound = Status::NotFound("").ErrorCode();
  std::vector<size_t> missing;
  for (size_t i = 0; i < keys.size(); i++) {
    if ((*results)[i] == kNotFound) missing.push_back(i);
  }
  if (missing.empty()) return;
  const std::vector<Endpoint> peers = Members();
  if (peers.empty()) return;
  const std::vector<Slice> ask = Pick(keys, missing);
  // 1. Who has what: every peer at once; the first "present" answer claims the key.
  Mutex mu;
  std::vector<int> claimed(missing.size(), -1);
  Status unasked;  // the first peer that could not be asked
  ForEachParallel(peers.size(), [&](size_t p) {
    std::vector<int64_t> r;
    Status s = transport_->BatchExists(peers[p], ask, &r);
    if (!s.ok()) {
      remote_errors_.fetch_add(1);
      Log(LogLevel::kInfo, "read-through: " + s.ToString());
      MutexLock lock(&mu);
      if (unasked.ok()) unasked = s;
      return;
    }
    MutexLock lock(&mu);
    for (size_t j = 0; j < r.size() && j < missing.size(); j++) {
      if (r[j] == 1 && claimed[j] < 0) claimed[j] = static_cast<int>(p);
    }
  });
  // 2. The bytes, from each key's claimer, straight into the caller's buffers.
  std::vector<std::vector<size_t>> by_peer(peers.size());
  for (size_t j = 0; j < missing.size(); j++) {
    if (claimed[j] >= 0) {
      by_peer[claimed[j]].push_back(missing[j]);
    } else {
      CountNotRead(unasked);  // perhaps on the peer that could not be asked
    }
  }
  std::vector<size_t> busy;
  for (size_t p = 0; p < peers.size(); p++) {
    if (!by_peer[p].empty()) busy.push_back(p);
  }
  if (busy.empty()) return;
  remote_gets_.fetch_add(missing.size(), std::memory_order_relaxed);
  ForEachParallel(busy.size(), [&](size_t b) {
    const std::vector<size_t>& idx = by_peer[busy[b]];
    std::vector<int64_t> r;
    Status s = RemoteGet(peers[busy[b]], Pick(keys, idx), Pick(dests, idx), &r);
    if (!s.ok()) remote_errors_.fetch_add(1);
    for (size_t j = 0; j < idx.size(); j++) {
      const size_t i = idx[j];
      if (j >= r.size() || r[j] == kNotFound) continue;  // gone meanwhile: still a miss
      (*results)[i] = r[j];
      if (r[j] < 0) continue;
      remote_hits_.fetch_add(1, std::memory_order_relaxed);
      if (!promote || !options_.promote_from_peers) continue;
      promote(keys[i], FilledParts(dests[i], static_cast<uint64_t>(r[j])),
              static_cast<uint64_t>(r[j]));
      promotions_.fetch_add(1, std::memory_order_relaxed);
    }
  });
}

Status PeerRouter::ReadThroughGetString(const Slice& key, std::string* value,
                                        const PromoteFn& promote) {
  std::vector<int64_t> exists{0};
  Status failed;  // the first peer that could not be asked, or could not be read
  ReadThroughExists(std::span<const Slice>(&key, 1), &exists, &failed);
  if (exists[0] != 1) {
    CountNotRead(failed);
    return Status::NotFound("key not found locally or on any peer");
  }
  for (const Endpoint& peer : Members()) {
    std::vector<int64_t> r;
    std::vector<std::string> values;
    Status s = transport_->BatchGetOwned(peer, std::span<const Slice>(&key, 1), &values, &r);
    s = KeyResult(s, r, peer);
    if (!s.ok()) {
      if (!s.IsNotFound() && failed.ok()) failed = s;
      continue;
    }
    remote_hits_.fetch_add(1, std::memory_order_relaxed);
    peer_tier_->Hit(values[0].size());
    *value = std::move(values[0]);
    if (promote && options_.promote_from_peers) {
      const Slice part(*value);
      promote(key, std::span<const Slice>(&part, 1), value->size());
      promotions_.fetch_add(1, std::memory_order_relaxed);
    }
    return Status::OK();
  }
  CountNotRead(failed);  // the holder failed, or let the key go meanwhile
  return Status::NotFound("key not found locally or on any peer");
}

void PeerRouter::ReadThroughExists(std::span<const Slice> keys, std::vector<int64_t>* results,
                                   Status* unasked) {
  std::vector<size_t> absent;
  for (size_t i = 0; i < keys.size(); i++) {
    if ((*results)[i] == 0) absent.push_back(i);
  }
  if (absent.empty()) return;
  const std::vector<Endpoint> peers = Members();
  const std::vector<Slice> ask = Pick(keys, absent);
  Mutex mu;
  ForEachParallel(peers.size(), [&](size_t p) {
    std::vector<int64_t> r;
    Status s = transport_->BatchExists(peers[p], ask, &r);
    MutexLock lock(&mu);
    if (!s.ok()) {
      remote_errors_.fetch_add(1);
      if (unasked != nullptr && unasked->ok()) *unasked = s;
      return;
    }
    for (size_t j = 0; j < r.size() && j < absent.size(); j++) {
      if (r[j] == 1) (*results)[absent[j]] = 1;
    }
  });
}

Status PeerRouter::ReadThroughValueSize(const Slice& key, uint64_t* size) {
  const std::vector<Endpoint> peers = Members();
  Mutex mu;
  bool found = false;
  ForEachParallel(peers.size(), [&](size_t p) {
    std::vector<int64_t> r;
    if (!transport_->BatchValueSize(peers[p], std::span<const Slice>(&key, 1), &r).ok()) {
      remote_errors_.fetch_add(1);
      return;
    }
    MutexLock lock(&mu);
    if (!found && r.size() == 1 && r[0] >= 0) {
      found = true;
      *size = static_cast<uint64_t>(r[0]);
    }
  });
  return found ? Status::OK() : Status::NotFound("no peer holds the key");
}

// ---------------------------------------------------------------- delete hints

bool PeerRouter::AdmitHintLocked(uint64_t limit, uint64_t* dropped) {
  if (hint_count_ >= limit) {
    (*dropped)++;
    return false;
  }
  hint_count_++;
  hints_recorded_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void PeerRouter::RecordHint(const std::string& member, const Hint& delta) {
  if (options_.cluster_delete_hints == 0) return;
  uint64_t dropped = 0;
  {
    MutexLock lock(&hints_mu_);
    Hint& h = hints_[member];
    const uint64_t limit = options_.cluster_delete_hints;
    if (delta.all) {
      // Covers everything recorded before it.
      hint_count_ -= h.size();
      h = Hint();
      h.all = true;
      hint_count_++;
      hints_recorded_.fetch_add(1, std::memory_order_relaxed);
    } else if (!h.all) {
      for (const std::string& p : delta.patterns) {
        if (AdmitHintLocked(limit, &dropped)) h.patterns.push_back(p);
      }
      for (const std::string& k : delta.keys) {
        if (h.keys.count(k) == 0 && AdmitHintLocked(limit, &dropped)) h.keys.insert(k);
      }
    }
    if (h.size() == 0) hints_.erase(member);
    hinted_members_.store(hints_.size());
  }
  if (dropped > 0) {
    hints_dropped_.fetch_add(dropped, std::memory_order_relaxed);
    Log(LogLevel::kWarn, "cluster: " + std::to_string(dropped) + " deletes " + member +
                             " missed were not recorded (cluster_delete_hints " +
                             std::to_string(options_.cluster_delete_hints) +
                             " reached): they may be read again when it returns");
  }
}

void PeerRouter::ForgetHint(const std::string& member, const Hint& done) {
  MutexLock lock(&hints_mu_);
  auto it = hints_.find(member);
  if (it == hints_.end()) return;
  Hint& h = it->second;
  const size_t before = h.size();
  if (done.all) h.all = false;
  for (const std::string& p : done.patterns) {
    auto at = std::find(h.patterns.begin(), h.patterns.end(), p);
    if (at != h.patterns.end()) h.patterns.erase(at);
  }
  for (const std::string& k : done.keys) h.keys.erase(k);
  hint_count_ -= before - h.size();
  hints_replayed_.fetch_add(before - h.size(), std::memory_order_relaxed);
  if (h.size() == 0) hints_.erase(it);
  hinted_members_.store(hints_.size());
}

Status PeerRouter::ReplayFirst(const Endpoint& peer) {
  if (hinted_members_.load() == 0) return Status::OK();
  const std::string member = peer.ToString();
  {
    MutexLock lock(&hints_mu_);
    if (hints_.find(member) == hints_.end()) return Status::OK();
  }
  return ReplayTo(member);
}

Status PeerRouter::ReplayTo(const std::string& member) {
  MutexLock replay(&replay_mu_);
  Hint h;
  {
    MutexLock lock(&hints_mu_);
    const auto it = hints_.find(member);
    if (it == hints_.end()) return Status::OK();  // replayed while this call waited
    h = it->second;
  }
  Endpoint peer;
  Status s = Endpoint::Parse(member, &peer);
  if (!s.ok()) return s;
  // In the order they were made, as far as it matters: a DeleteAll covers the rest.
  uint64_t n = 0;
  if (h.all) {
    s = transport_->DeleteAll(peer, &n);
    if (!s.ok()) return s;
    Hint done;
    done.all = true;
    ForgetHint(member, done);
  }
  for (const std::string& p : h.patterns) {
    s = transport_->DeleteByRegex(peer, p, &n);
    if (!s.ok()) return s;
    Hint done;
    done.patterns.push_back(p);
    ForgetHint(member, done);
  }
  std::vector<std::string> chunk;
  auto send = [&]() {
    std::vector<Slice> keys(chunk.begin(), chunk.end());
    std::vector<int64_t> r;
    Status sent = transport_->BatchDelete(peer, keys, &r);
    if (!sent.ok()) return sent;
    Hint done;
    done.keys.insert(chunk.begin(), chunk.end());
    ForgetHint(member, done);
    chunk.clear();
    return Status::OK();
  };
  for (const std::string& k : h.keys) {
    chunk.push_back(k);
    if (chunk.size() == kReplayChunk && !(s = send()).ok()) return s;
  }
  if (!chunk.empty() && !(s = send()).ok()) return s;
  Log(LogLevel::kInfo, "cluster: replayed " + std::to_string(h.size()) + " deletes to " + member);
  return Status::OK();
}

void PeerRouter::ReplayLoop() {
  MutexLock lock(&hints_mu_);
  while (!closed()) {
    if (!replay_wake_) replay_cv_.WaitFor(&hints_mu_, std::chrono::milliseconds(200));
    replay_wake_ = false;
    if (closed() || hints_.empty()) continue;
    std::vector<std::string> pending;
    for (const auto& [member, hint] : hints_) pending.push_back(member);
    lock.Unlock();
    const std::vector<Endpoint> members = Members();
    for (const std::string& m : pending) {
      if (closed()) break;
      const bool listed = std::any_of(members.begin(), members.end(),
                                      [&](const Endpoint& e) { return e.ToString() == m; });
      if (listed) ReplayTo(m);  // a failure leaves it for the next round
    }
    lock.Lock();
  }
}

uint64_t PeerRouter::PendingDeleteHints() const {
  MutexLock lock(&hints_mu_);
  return hint_count_;
}

std::string PeerRouter::StatsText() const {
  std::ostringstream out;
  out << "listen: " << self_ << "\n"
      << "mode: " << (options_.peer_mode == PeerMode::kSharded ? "sharded" : "read_through") << "\n"
      << "transport: " << transport_->Name() << "\n"
      << "peers: " << Members().size() << "\n"
      << "replicas: " << options_.cluster_replicas << "\n"
      << membership_->StatsText();
  if (!self_.empty()) out << "member: " << self_ << " self\n";
  {
    MutexLock lock(&health_mu_);
    for (const Endpoint& e : Members()) {
      const auto it = failing_.find(e.ToString());
      out << "member: " << e.ToString()
          << (it == failing_.end() ? " live" : " failing (" + it->second + ")") << "\n";
    }
  }
  out << "remote_gets: " << remote_gets_.load() << "\n"
      << "remote_hits: " << remote_hits_.load() << "\n"
      << "remote_puts: " << remote_puts_.load() << "\n"
      << "remote_errors: " << remote_errors_.load() << "\n"
      << "promotions: " << promotions_.load() << "\n"
      << "join_grace_hits: " << grace_hits_.load() << "\n"
      << "moved_on_read: " << moved_.load() << "\n"
      << "delete_hints: " << PendingDeleteHints() << "\n"
      << "delete_hints_recorded: " << hints_recorded_.load() << "\n"
      << "delete_hints_replayed: " << hints_replayed_.load() << "\n"
      << "delete_hints_dropped: " << hints_dropped_.load() << "\n"
      << transport_->StatsText();
  if (ucx_server_ != nullptr) out << ucx_server_->StatsText();
  if (server_ != nullptr) {
    out << "served_requests: " << server_->requests() << "\n"
        << "leases_held: " << server_->leases_held() << "\n"
        << "rejected_frames: " << server_->rejected_frames() << "\n"
        << "refused_auth: " << server_->refused_auth() << "\n"
        << "slow_readers_closed: " << server_->slow_readers_closed() << "\n"
        << "refused_over_budget: " << server_->refused_over_budget() << "\n"
        << "permission_denied: " << server_->permission_denied() << "\n";
    for (const auto& [tenant, refused] : server_->permission_denied_by_tenant()) {
      if (!tenant.empty()) out << "permission_denied." << tenant << ": " << refused << "\n";
    }
  }
  return out.str();
}

}  // namespace kvengine
