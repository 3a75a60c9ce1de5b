#include "transport/server.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "transport/db_ops.h"
#include "transport/frame_reader.h"
#include "transport/get_answer.h"
#include "transport/socket_util.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/hash.h"
#include "util/key_pattern.h"
#include "util/log_limiter.h"
#include "util/mutex.h"

namespace kvengine {

namespace {

constexpr auto kNever = Deadline::max();
// How long accepting pauses when the process is out of descriptors (or memory).
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
// How often the poller looks for connections past their deadline.
constexpr auto kSweepInterval = std::chrono::milliseconds(50);
// The largest GET request the poller answers itself (about 2,500 keys of 16 bytes):
// pinning a larger one's values would keep it from the other connections for long.
constexpr uint32_t kMaxMetaServedHere = 64 << 10;

// How often a flood of connections closed for one reason may log a line.
constexpr auto kRefusalLogInterval = std::chrono::seconds(10);
// Longest the poller waits to tell a connection past max_connections why it is closed.
constexpr uint64_t kOverBudgetAnswerMs = 50;

// An answer on its way out: written as far as the socket takes it, the rest when the
// socket is writable again, never waiting for the client.
struct QueuedAnswer {
  std::unique_ptr<GetAnswer> answer;  // a GET's: keeps the values its body names valid
  std::unique_ptr<OutFrame> frame;
};

struct Conn {
  int fd = -1;
  std::string address;    // the client's IP: the per-address cap's key
  std::string peer;       // "ip:port" for messages
  bool loopback = false;  // the client's address is a loopback one
  std::string nonce;
  bool authed = false;
  // The tenant the connection proved (set once, at authentication); null when the
  // server requires no token: every namespace.
  const Tenant* tenant = nullptr;
  Deadline handshake_deadline = kNever;
  FrameReader frame;  // the request arriving; driven by whoever holds the connection
  // Answers not written whole yet, in the order of their requests, and their bytes not
  // written; driven by whoever holds the connection.  The client must take more of
  // them by out_deadline.
  std::deque<QueuedAnswer> out;
  uint64_t out_bytes = 0;
  Deadline out_deadline = kNever;
  // Held under the server's mu_ (the analysis cannot name another object's mutex
  // here; every access is inside a MutexLock on it).  Busy: queued for or held by a
  // worker (disarmed in epoll); otherwise only the poller touches it, and may close it
  // past `deadline`.
  bool busy = false;
  Deadline deadline = kNever;
  // The UCX client record this connection set up (ServerOptions::ucx_connect); released
  // with the connection, or replaced by a later kUcxConnect on it.
  std::shared_ptr<void> ucx_client;
};

// The client's address alone and with its port, and whether it is a loopback one,
// from an accepted socket.
void PeerAddress(int fd, std::string* address, std::string* peer, bool* loopback) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  *loopback = false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    *loopback = IsLoopbackAddress(addr);
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      port = ntohs(a->sin6_port);
    }
  }
  *address = host;
  *peer = *address + ":" + std::to_string(port);
}

// The requests refused for their tenant's namespaces: counted, and logged at most once
// per kRefusalLogInterval.
class Refusals {
 public:
  using LogFn = std::function<void(LogLevel, const std::string&)>;
  explicit Refusals(LogFn log) : log_(std::move(log)) {}
  // Counts a refusal `s` of `tenant`'s request from `peer`; returns `s`.
  Status Note(const Tenant* tenant, const std::string& peer, const Status& s) {
    total_.fetch_add(1, std::memory_order_relaxed);
    tenant->CountRefused();
    uint64_t held_back = 0;
    if (log_limit_.Admit(&held_back)) {
      log_(LogLevel::kWarn, "refused a request of " + peer + ": " + s.message() +
                                (held_back == 0 ? std::string()
                                                : "; and " + std::to_string(held_back) +
                                                      " more such refusals since the last line"));
    }
    return s;
  }
  uint64_t total() const { return total_.load(std::memory_order_relaxed); }

 private:
  const LogFn log_;
  LogLimiter log_limit_{kRefusalLogInterval};
  std::atomic<uint64_t> total_{0};
};

// The ops every server answers alike (transport/db_ops.h), run against the service for
// one connection: its tenant may name only keys of its namespaces, and its deletes by
// pattern touch only those; a peer's pattern is held to the peer protocol's limit before
// anything is removed.
class ServiceOps final : public DbOpsTarget {
 public:
  // `tenant` null: every namespace.
  ServiceOps(PeerService* service, const Tenant* tenant, Refusals* refusals,
             const std::string& peer)
      : service_(service), tenant_(tenant), refusals_(refusals), peer_(peer) {}
  Status Admit(std::span<const Slice> keys) override {
    if (tenant_ == nullptr) return Status::OK();
    Status s = tenant_->Permit(keys);
    return s.ok() ? s : refusals_->Note(tenant_, peer_, s);
  }
  // A tenant's properties are cut to its namespaces' figures (FigureScope, the same as
  // for attached clients); a property outside them is a refusal, counted.
  const FigureScope& figures() const override {
    return tenant_ != nullptr ? tenant_->figures() : DbOpsTarget::figures();
  }
  Status AdmitProperty(const std::string& name) override {
    Status s = figures().Admit(name);
    return s.ok() || tenant_ == nullptr ? s : refusals_->Note(tenant_, peer_, s);
  }
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return service_->BatchExists(keys, results);
  }
  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return service_->BatchDelete(keys, results);
  }
  Status GetValueSize(const Slice& key, uint64_t* size) override {
    return service_->GetValueSize(key, size);
  }
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override {
    if (pattern.size() > wire::kMaxPatternLen) {
      return Status::InvalidArgument("pattern of " + std::to_string(pattern.size()) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(wire::kMaxPatternLen));
    }
    if (tenant_ == nullptr || tenant_->unrestricted()) {
      return service_->DeleteByRegex(pattern, deleted);
    }
    // Compiled on its own first, so that it cannot close the group Restrict puts it in.
    KeyPattern alone;
    Status s = alone.Compile(pattern);
    if (!s.ok()) return s;
    return service_->DeleteByRegex(tenant_->Restrict(pattern), deleted);
  }
  Status DeleteAll(uint64_t* deleted) override {
    if (tenant_ == nullptr || tenant_->unrestricted()) return service_->DeleteAll(deleted);
    return service_->DeleteByRegex(tenant_->Restrict("[\\x00-\\xff]*"), deleted);
  }
  bool GetProperty(const std::string& name, std::string* value) override {
    return service_->GetProperty(name, value);
  }

 private:
  PeerService* const service_;
  const Tenant* const tenant_;
  Refusals* const refusals_;
  const std::string& peer_;
};

class TcpServer final : public TransportServer {
 public:
  TcpServer(const ServerOptions& options, PeerService* service)
      : options_(options),
        service_(service),
        tenants_(!options.tenants.empty()      ? options.tenants
                 : !options.auth_token.empty() ? TenantTable::OldForm(options.auth_token)
                                               : std::vector<TenantEntry>()),
        refusals_([this](LogLevel level, const std::string& line) { Log(level, line); }),
        leases_(std::chrono::milliseconds(options.lease_ttl_ms)),
        bodies_(options.kept_body_bytes) {}
  ~TcpServer() override { Stop(); }

  Status Listen(const Endpoint& at) {
    Status s = ListenTcp(at, &listen_fd_, &port_);
    if (!s.ok()) return s;
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) return Status::IOError("epoll/eventfd failed");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    ev.data.ptr = &wake_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    poller_ = std::thread([this] { PollLoop(); });
    for (int i = 0; i < std::max(1, options_.workers); i++) {
      workers_.emplace_back([this] { WorkLoop(); });
    }
    return Status::OK();
  }

  void Stop() override {
    {
      MutexLock lock(&mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stopping_.store(true);
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    }
    if (poller_.joinable()) poller_.join();
    {
      MutexLock lock(&mu_);
      queue_closed_ = true;
    }
    cv_.NotifyAll();
    for (auto& w : workers_) w.join();  // each finishes the request it is serving
    workers_.clear();
    DrainAnswers();
    // Nothing else runs now; the lock is for the analysis' sake.
    MutexLock lock(&mu_);
    for (Conn* c : conns_) {
      close(c->fd);
      c->frame.Reset(&bodies_);
      delete c;
    }
    conns_.clear();
    per_address_.clear();
    if (options_.ucx_connect) {
      // A UCX client trusts a lease for half its time to live without asking (ucx.h):
      // its pin must hold that long, even as the server goes.
      const auto until = SteadyClock::now() + std::chrono::milliseconds(options_.lease_ttl_ms);
      while (leases_.ReapExpired(), leases_.size() > 0 && SteadyClock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    leases_.Clear();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    listen_fd_ = epoll_fd_ = wake_fd_ = -1;
  }

  uint16_t port() const override { return port_; }
  uint64_t requests() const override { return requests_.load(); }
  uint64_t leases_held() override {
    leases_.ReapExpired();
    return leases_.size();
  }
  uint64_t rejected_frames() const override { return rejected_.load(); }
  uint64_t refused_auth() const override { return refused_auth_.load(); }
  uint64_t slow_readers_closed() const override { return slow_readers_closed_.load(); }
  uint64_t refused_over_budget() const override { return refused_over_budget_.load(); }
  uint64_t permission_denied() const override { return refusals_.total(); }
  std::vector<std::pair<std::string, uint64_t>> permission_denied_by_tenant() const override {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const auto& t : tenants_.tenants()) out.emplace_back(t->name(), t->refused());
    return out;
  }

 private:
  void Log(LogLevel level, const std::string& line) {
    if (options_.log) {
      options_.log(level, line);
    } else if (level >= LogLevel::kWarn) {
      std::fprintf(stderr, "[kvengine transport] %s\n", line.c_str());
    }
  }

  // The poller accepts, serves readable connections -- one of each wake-up's itself
  // when it can (ServeHere), the others by the workers -- and closes the connections
  // past their deadline.
  void PollLoop() {
    epoll_event events[64];
    std::vector<Conn*> readable;
    readable.reserve(64);
    Deadline next_sweep = SteadyClock::now() + kSweepInterval;
    while (!stopping_.load()) {
      const int n = epoll_wait(epoll_fd_, events, 64, 50);
      readable.clear();
      for (int i = 0; i < n; i++) {
        void* tag = events[i].data.ptr;
        if (tag == &wake_fd_) continue;
        if (tag == &listen_fd_) {
          Accept();
          continue;
        }
        readable.push_back(static_cast<Conn*>(tag));
      }
      if (!readable.empty()) {
        // The workers start on the others at once, in parallel, while the poller serves
        // the last: a lone request -- one client waiting on one call -- costs no
        // hand-over, and a busy server is served by the pool as before.  (HandOff takes
        // mu_ even with nothing to hand: the worker that last held `here` released it
        // after its last write to the connection, so the poller reads it after.)
        Conn* here = readable.back();
        readable.pop_back();
        HandOff(readable);
        ServeHere(here);
      }
      const Deadline now = SteadyClock::now();
      if (accept_paused_ && now >= accept_resume_) ResumeAccepting();
      if (now >= next_sweep) {
        CloseOverdue(now);
        next_sweep = now + kSweepInterval;
      }
    }
    if (!accept_paused_) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  }

  void Accept() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) PauseAccepting(errno);
        return;
      }
      if (accept_trouble_logged_) {
        accept_trouble_logged_ = false;
        Log(LogLevel::kWarn, "accepting connections again");
      }
      auto* c = new Conn;
      c->fd = fd;
      PeerAddress(fd, &c->address, &c->peer, &c->loopback);
      c->frame.AllowUnhashedBodies(UnhashedBodiesAllowed(c));
      if (!HasRoom()) {
        RefuseOverBudget(c);
        close(fd);
        delete c;
        continue;
      }
      if (!AdmitAddress(c->address)) {
        RefuseOverCap(c->peer);
        close(fd);
        delete c;
        continue;
      }
      TuneSocket(fd);
      c->nonce.resize(wire::kNonceSize);
      {
        std::random_device rd;
        for (size_t i = 0; i < wire::kNonceSize; i += 4) {
          const uint32_t r = rd();
          std::memcpy(&c->nonce[i], &r, 4);
        }
      }
      // The challenge: nonce, whether a token is required and, when it is, that a
      // tenant's name is read (clients built before tenants take any bit for
      // "required").  A fresh socket's send buffer takes these few bytes at once.
      std::string meta = c->nonce;
      meta.push_back(static_cast<char>(
          tenants_.required() ? wire::kChallengeTokenRequired | wire::kChallengeTakesTenant : 0));
      if (!SendFrame(fd, wire::kChallenge, wire::kFlagResponse, 0, meta, {},
                     DeadlineIn(options_.io_timeout_ms))
               .ok()) {
        MutexLock lock(&mu_);
        ForgetAddressLocked(c->address);
        close(fd);
        delete c;
        continue;
      }
      c->handshake_deadline = DeadlineIn(options_.handshake_timeout_ms);
      {
        MutexLock lock(&mu_);
        c->deadline = c->handshake_deadline;
        conns_.insert(c);
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLONESHOT | EPOLLRDHUP;
      ev.data.ptr = c;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
  }

  // Out of descriptors (EMFILE), or another accept failure: the pending connection
  // stays queued and the listening socket readable, so stop watching it for a while
  // instead of spinning on it.  Logged once per episode.
  void PauseAccepting(int err) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    accept_paused_ = true;
    accept_resume_ = SteadyClock::now() + kAcceptBackoff;
    if (!accept_trouble_logged_) {
      accept_trouble_logged_ = true;
      Log(LogLevel::kWarn, std::string("accept: ") + std::strerror(err) + "; retrying every " +
                               std::to_string(kAcceptBackoff.count()) + " ms");
    }
  }

  void ResumeAccepting() {
    accept_paused_ = false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    Accept();
  }

  // Counts a connection from `address`; false when it already holds its cap.
  bool AdmitAddress(const std::string& address) {
    MutexLock lock(&mu_);
    uint64_t& n = per_address_[address];
    if (n >= options_.max_connections_per_address) return false;
    n++;
    return true;
  }

  // False when the connections held fill max_connections.
  bool HasRoom() {
    if (options_.max_connections == 0) return true;
    MutexLock lock(&mu_);
    return conns_.size() < options_.max_connections;
  }

  // Tells a connection past max_connections why it is closed, as far as the handshake
  // lets a server speak first: the challenge (no token asked: the verdict comes
  // whatever the proof), then a Busy verdict, both taken at once by a fresh socket's
  // buffer (the short deadline only bounds the poller's wait should they not be).
  void RefuseOverBudget(Conn* c) {
    refused_over_budget_.fetch_add(1, std::memory_order_relaxed);
    const std::string why = "the server serves " + std::to_string(options_.max_connections) +
                            " connections, its descriptor budget (peer_max_connections); "
                            "raise ulimit -n";
    const Deadline deadline = DeadlineIn(kOverBudgetAnswerMs);
    std::string challenge(wire::kNonceSize, '\0');
    challenge.push_back(0);
    std::string verdict;
    wire::PutBatchStatus(&verdict, Status::Busy(why));
    if (SendFrame(c->fd, wire::kChallenge, wire::kFlagResponse, 0, challenge, {}, deadline).ok()) {
      SendFrame(c->fd, wire::kAuth, wire::kFlagResponse, 0, verdict, {}, deadline);
    }
    uint64_t held_back = 0;
    if (!over_budget_log_.Admit(&held_back)) return;
    Log(LogLevel::kWarn,
        "refused connection from " + c->peer + ": " + why + HeldBack(held_back, "such refusals"));
  }

  void ForgetAddressLocked(const std::string& address) REQUIRES(mu_) {
    auto it = per_address_.find(address);
    if (it != per_address_.end() && --it->second == 0) per_address_.erase(it);
  }

  void RefuseOverCap(const std::string& peer) {
    uint64_t held_back = 0;
    if (!cap_log_.Admit(&held_back)) return;
    Log(LogLevel::kWarn, "refused connection from " + peer + ": its address holds " +
                             std::to_string(options_.max_connections_per_address) +
                             " connections (max_connections_per_address)" +
                             HeldBack(held_back, "such refusals"));
  }

  // ", and N more <what> since the last line" for a line a LogLimiter let through.
  static std::string HeldBack(uint64_t held_back, const std::string& what) {
    return held_back == 0
               ? std::string()
               : "; and " + std::to_string(held_back) + " more " + what + " since the last line";
  }

  // Closes the idle connections past their deadline: a handshake or a frame that took
  // too long.  Only the poller makes a connection busy, so one found idle here is in
  // nobody else's hands.
  void CloseOverdue(Deadline now) {
    std::vector<Conn*> overdue;
    {
      MutexLock lock(&mu_);
      for (Conn* c : conns_) {
        if (!c->busy && c->deadline <= now) overdue.push_back(c);
      }
      for (Conn* c : overdue) {
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
        conns_.erase(c);
        ForgetAddressLocked(c->address);
      }
    }
    for (Conn* c : overdue) {
      if (!c->out.empty() && c->out_deadline <= now) {
        SlowReader(c, "it took none of its answers' bytes for " +
                          std::to_string(options_.io_timeout_ms) + " ms");
      } else {
        Log(LogLevel::kInfo,
            "closing connection from " + c->peer + ": " +
                (c->authed
                     ? "a frame took longer than " + std::to_string(options_.io_timeout_ms) + " ms"
                     : "no authentication within " + std::to_string(options_.handshake_timeout_ms) +
                           " ms"));
      }
      close(c->fd);
      c->frame.Reset(&bodies_);
      delete c;
    }
  }

  void WorkLoop() {
    for (;;) {
      Conn* c;
      {
        MutexLock lock(&mu_);
        while (!queue_closed_ && ready_.empty()) cv_.Wait(&mu_);
        if (ready_.empty()) return;
        c = ready_.front();
        ready_.pop_front();
      }
      if (Flush(c) && ServeAvailable(c)) {
        Rearm(c);
      } else {
        CloseConn(c);
      }
    }
  }

  // Queues connections for the workers.  REQUIRES: each in the poller's hands (not busy).
  void HandOff(std::span<Conn* const> conns) {
    {
      MutexLock lock(&mu_);
      for (Conn* c : conns) {
        c->busy = true;
        ready_.push_back(c);
      }
    }
    for (size_t i = 0; i < conns.size(); i++) cv_.NotifyOne();
  }

  // Answers c's next request on the poller when it is a small GET whose values are all
  // in the memory tier: no I/O and no waiting, and the answer written only as far as the
  // socket takes it now (the rest once it is writable), so a slow or stalled client
  // never holds the poller.  Anything else -- other ops, values on SSD, large requests,
  // connections not yet authenticated -- goes to the workers.
  // REQUIRES: c in the poller's hands (not busy).
  void ServeHere(Conn* c) {
    switch (TryServeHere(c)) {
      case Next::kWait:
        Rearm(c);
        break;
      case Next::kWorker:
        HandOff({&c, 1});
        break;
      case Next::kClose:
        CloseConn(c);
        break;
    }
  }

  enum class Next { kWait, kWorker, kClose };

  Next TryServeHere(Conn* c) {
    if (!c->authed) return Next::kWorker;
    if (!Flush(c)) return Next::kClose;
    FrameReader::Progress progress;
    if (!ReadRequest(c, /*header_only=*/true, &progress)) return Next::kClose;
    if (!c->frame.header_done()) return Next::kWait;
    const wire::FrameHeader h = c->frame.header();
    const bool grouped = h.op == wire::kGetGroups;
    if ((h.op != wire::kGet && !grouped) || h.meta_len > kMaxMetaServedHere) {
      return Next::kWorker;
    }
    if (!ReadRequest(c, /*header_only=*/false, &progress)) return Next::kClose;
    if (progress != FrameReader::Progress::kComplete) return Next::kWait;
    std::string_view meta = c->frame.meta();
    std::vector<uint32_t> counts;
    std::vector<std::string_view> key_views;
    std::vector<uint64_t> capacity;
    const bool decoded = grouped ? wire::GetGetGroups(&meta, &counts, &key_views, &capacity)
                                 : wire::GetKeys(&meta, &key_views, &capacity);
    if (!decoded || !meta.empty()) return Next::kWorker;  // which rejects it
    if (!grouped) counts.assign(1, static_cast<uint32_t>(key_views.size()));
    const std::vector<Slice> keys(key_views.begin(), key_views.end());
    // A request its tenant may not make goes to a worker, which refuses it.
    if (c->tenant != nullptr && !c->tenant->Permit(keys).ok()) return Next::kWorker;
    // Every group's values in memory, or none answered here.
    std::vector<std::unique_ptr<GetAnswer>> answers;
    size_t first = 0;
    for (uint32_t n : counts) {
      answers.push_back(std::make_unique<GetAnswer>(service_));
      if (!answers.back()->FromMemory(std::span<const Slice>(keys).subspan(first, n),
                                      std::span<const uint64_t>(capacity).subspan(first, n))) {
        return Next::kWorker;
      }
      first += n;
    }
    requests_.fetch_add(1);
    c->frame.Reset(&bodies_);
    // The first group's answer goes at once (the client's first layer), the others
    // together.
    wire::FrameHeader group = h;
    for (size_t g = 0; g < answers.size(); g++) {
      std::string answer_meta = answers[g]->TakeMeta();
      const bool flush = g == 0 || g + 1 == answers.size();
      if (!Answer(c, group, std::move(answer_meta), std::move(answers[g]), flush)) {
        return Next::kClose;
      }
      group.request_id++;
    }
    // Bytes of a next request read ahead would wait unseen by epoll: a worker takes them.
    return c->frame.buffered() > 0 ? Next::kWorker : Next::kWait;
  }

  // Writes what the socket takes of c's queued answers, in order, without waiting.
  // False: close the connection.  REQUIRES: c held by this thread (busy), or the poller.
  // Answers queued together (GET_GROUPS' groups) go in one sendmsg, up to
  // kFramesPerWrite of them.
  bool Flush(Conn* c) {
    constexpr size_t kFramesPerWrite = 64;
    OutFrame* frames[kFramesPerWrite];
    while (!c->out.empty()) {
      size_t n = 0;
      uint64_t before = 0;
      for (auto it = c->out.begin(); it != c->out.end() && n < kFramesPerWrite; ++it) {
        frames[n++] = it->frame.get();
        before += it->frame->left();
      }
      Status s = OutFrame::WriteAvailable(c->fd, std::span<OutFrame* const>(frames, n));
      if (!s.ok()) {
        Log(LogLevel::kInfo, "answering " + c->peer + ": " + s.ToString());
        return false;
      }
      uint64_t after = 0;
      for (size_t i = 0; i < n; i++) after += frames[i]->left();
      c->out_bytes -= before - after;
      if (after != before) c->out_deadline = DeadlineIn(options_.io_timeout_ms);
      while (!c->out.empty() && c->out.front().frame->done()) c->out.pop_front();
      if (after != 0) return true;  // the socket is full: more when it is writable
    }
    c->out_deadline = kNever;
    return true;
  }

  // Queues an answer behind c's others and writes what the socket takes.  An answer
  // that would take the bytes c has not read past max_queued_bytes closes the
  // connection instead (the first answer waiting may be of any size).  False: close it.
  // With `flush` false the answer waits for the next Flush (the rest of its request's
  // answers, written together).
  bool Queue(Conn* c, std::unique_ptr<OutFrame> frame, std::unique_ptr<GetAnswer> answer,
             bool flush = true) {
    const uint64_t bytes = frame->left();
    if (!c->out.empty() && c->out_bytes + bytes > options_.max_queued_bytes) {
      SlowReader(c, std::to_string(c->out_bytes + bytes) +
                        " bytes of answers not taken would exceed max_queued_bytes (" +
                        std::to_string(options_.max_queued_bytes) + ")");
      return false;
    }
    if (c->out.empty()) c->out_deadline = DeadlineIn(options_.io_timeout_ms);
    c->out_bytes += bytes;
    c->out.push_back({std::move(answer), std::move(frame)});
    return !flush || Flush(c);
  }

  // Counts a connection closed for not reading its answers, and logs it at most once per
  // kRefusalLogInterval.
  void SlowReader(const Conn* c, const std::string& why) {
    slow_readers_closed_.fetch_add(1);
    uint64_t held_back = 0;
    if (!slow_reader_log_.Admit(&held_back)) return;
    Log(LogLevel::kWarn, "closing connection from " + c->peer + ": " + why +
                             HeldBack(held_back, "connections closed for not reading"));
  }

  // At Stop, once no worker runs: writes the answers still queued, for every connection
  // at once, until they are written or io_timeout_ms passes.
  void DrainAnswers() {
    const Deadline deadline = DeadlineIn(options_.io_timeout_ms);
    std::vector<Conn*> waiting;
    {
      MutexLock lock(&mu_);  // nothing else runs now; the lock is for the analysis' sake
      waiting.assign(conns_.begin(), conns_.end());
    }
    std::vector<pollfd> fds;
    while (SteadyClock::now() < deadline) {
      std::erase_if(waiting, [this](Conn* c) { return !Flush(c) || c->out.empty(); });
      if (waiting.empty()) return;
      fds.clear();
      for (Conn* c : waiting) fds.push_back({c->fd, POLLOUT, 0});
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(1, ms.count())));
    }
  }

  // Hands c back to the poller, with the deadline of whatever it is waiting for: more of
  // a request, room for its answers (EPOLLOUT), authentication.
  void Rearm(Conn* c) {
    Deadline deadline = kNever;
    if (c->frame.in_progress()) {
      deadline = c->frame.started() + std::chrono::milliseconds(options_.io_timeout_ms);
    }
    if (!c->out.empty()) deadline = std::min(deadline, c->out_deadline);
    if (!c->authed) deadline = std::min(deadline, c->handshake_deadline);
    MutexLock lock(&mu_);
    c->busy = false;
    c->deadline = deadline;
    if (stopping_.load()) return;  // Stop() closes it
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT | EPOLLRDHUP | (c->out.empty() ? 0u : EPOLLOUT);
    ev.data.ptr = c;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev);
  }

  // REQUIRES: c held by this thread (busy), or by the poller.
  void CloseConn(Conn* c) {
    {
      MutexLock lock(&mu_);
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
      conns_.erase(c);
      ForgetAddressLocked(c->address);
    }
    close(c->fd);
    c->frame.Reset(&bodies_);
    delete c;
  }

  // Whether c may carry unhashed bodies: a loopback connection, unless the options
  // want bodies hashed there too (docs/transport.md, "Checksums on loopback").
  bool UnhashedBodiesAllowed(const Conn* c) const {
    return c->loopback && !options_.hash_loopback_bodies;
  }

  bool Reject(Conn* c, const std::string& why) {
    rejected_.fetch_add(1);
    Log(LogLevel::kWarn, "closing connection from " + c->peer + ": " + why);
    return false;
  }

  // Reads what c has of its request frame (only the header when header_only).  False:
  // close the connection.
  bool ReadRequest(Conn* c, bool header_only, FrameReader::Progress* progress) {
    Status s = header_only ? c->frame.ReadHeader(c->fd, c->authed, &bodies_, progress)
                           : c->frame.ReadAvailable(c->fd, c->authed, &bodies_, progress);
    if (s.ok()) return true;
    if (s.IsCorruption()) return Reject(c, s.ToString());
    if (s.message() != "connection closed by peer") {
      Log(LogLevel::kInfo, "connection from " + c->peer + ": " + s.ToString());
    }
    return false;
  }

  // Reads what c has and answers every whole frame in it, in order, without waiting
  // for more.  False: close the connection.
  bool ServeAvailable(Conn* c) {
    for (;;) {
      FrameReader::Progress progress;
      if (!ReadRequest(c, /*header_only=*/false, &progress)) return false;
      if (progress != FrameReader::Progress::kComplete) return true;
      requests_.fetch_add(1);
      const bool keep = Dispatch(c, c->frame.header(), c->frame.meta(), c->frame.body());
      c->frame.Reset(&bodies_);
      if (!keep) return false;
      if (stopping_.load()) return true;  // drain what was received, start nothing new
    }
  }

  // The flags of request h's answer.  A request with an unhashed body (allowed only
  // where the connection may send one) asks for an answer the same way.
  static uint16_t AnswerFlags(const wire::FrameHeader& h) {
    return wire::kFlagResponse | (h.flags & wire::kFlagBodyUnhashed);
  }

  // Answers request h: queued behind c's earlier answers, written as the socket takes
  // it.  A GET's `answer` names the body and keeps its bytes valid until written.
  bool Answer(Conn* c, const wire::FrameHeader& h, std::string meta,
              std::unique_ptr<GetAnswer> answer = nullptr, bool flush = true) {
    const std::span<const Slice> body =
        answer != nullptr ? answer->body() : std::span<const Slice>();
    auto frame =
        std::make_unique<OutFrame>(h.op, AnswerFlags(h), h.request_id, std::move(meta), body);
    return Queue(c, std::move(frame), std::move(answer), flush);
  }

  bool AnswerResults(Conn* c, const wire::FrameHeader& h, const Status& s,
                     const std::vector<int64_t>& results) {
    std::string out;
    wire::PutBatchStatus(&out, s);
    wire::PutResults(&out, s.ok() ? results : std::vector<int64_t>());
    return Answer(c, h, out);
  }

  // Answers c's AUTH request: binds c to the tenant its proof proves, or refuses it
  // (counted, logged) and closes the connection.  Every refusal reads alike, whatever
  // was wrong with the name or the token, so that it tells nothing of what exists.
  bool Authenticate(Conn* c, const wire::FrameHeader& h, std::string_view meta) {
    bool has_proof = false;
    uint64_t proof = 0;
    std::string_view name;
    const bool decoded = wire::GetAuth(meta, &has_proof, &proof, &name);
    const Tenant* tenant = nullptr;
    if (decoded && has_proof) tenant = tenants_.Authenticate(c->nonce, name, proof);
    std::string out;
    if (tenants_.required() && tenant == nullptr) {
      refused_auth_.fetch_add(1);
      Log(LogLevel::kWarn, "refused peer " + c->peer + ": " +
                               (!decoded    ? "malformed auth request"
                                : has_proof ? "wrong auth token"
                                            : "no auth token"));
      wire::PutBatchStatus(
          &out, Status::InvalidArgument("authentication refused",
                                        has_proof ? "wrong token" : "a token is required"));
      Answer(c, h, out);
      return false;
    }
    c->authed = true;
    c->tenant = tenant;
    wire::PutBatchStatus(&out, Status::OK());
    PutFixed32(&out, wire::kFeatureGetGroups |
                         (UnhashedBodiesAllowed(c) ? wire::kFeatureLoopbackUnhashed : 0));
    return Answer(c, h, out);
  }

  // OK when c's tenant may name every key; else the refusal, counted and logged.
  Status Permit(const Conn* c, std::span<const Slice> keys) {
    if (c->tenant == nullptr) return Status::OK();
    Status s = c->tenant->Permit(keys);
    return s.ok() ? s : refusals_.Note(c->tenant, c->peer, s);
  }

  // One-sided reads (RDMA, UCX) reach the whole arena, every namespace's values: only a
  // connection free to use every namespace may set them up.
  Status OneSidedAllowed(const Conn* c) {
    if (c->tenant == nullptr || c->tenant->unrestricted()) return Status::OK();
    return refusals_.Note(c->tenant, c->peer,
                          Status::PermissionDenied("tenant '" + c->tenant->name() +
                                                   "' may not read one-sided (RDMA, UCX): such "
                                                   "reads reach every namespace's values"));
  }

  // LOOKUP: pins each key's value held in memory under a lease (read_validation.h) and
  // encodes the batch status and locations in *out.
  void ServeLookup(std::span<const Slice> keys, std::string* out) {
    std::vector<RemoteLocation> locs(keys.size());
    std::vector<int64_t> results(keys.size(), 0);
    const char* base = service_->ArenaBase();
    for (size_t i = 0; i < keys.size(); i++) {
      PinnedValue v;
      if (base != nullptr && service_->Pin(keys[i], &v)) {
        locs[i] = {static_cast<uint64_t>(v.data - base), v.size, v.version,
                   leases_.Grant(std::move(v.pin))};
        results[i] = kLookupPinned;
      } else {
        uint64_t size;
        Status s = service_->GetValueSize(keys[i], &size);
        results[i] = s.ok() ? kLookupNotPinned : s.ErrorCode();
      }
    }
    wire::PutBatchStatus(out, Status::OK());
    EncodeLocations(out, results, locs);
  }

  // RELEASE: encodes in *out, per lease of the request, whether it was still held.
  // False when the request is undecodable.
  bool ServeRelease(std::string_view meta, std::string* out) {
    uint32_t n;
    if (!GetFixed32(&meta, &n) || meta.size() != 8ull * n) return false;
    std::vector<int64_t> results(n);
    for (uint32_t i = 0; i < n; i++) {
      uint64_t lease = 0;
      GetFixed64(&meta, &lease);
      results[i] = leases_.Release(lease) ? 1 : 0;
    }
    wire::PutBatchStatus(out, Status::OK());
    wire::PutResults(out, results);
    return true;
  }

  // A lease op (kLookup, kRelease) that came by another channel than a connection (UCX
  // active messages, from a client whose connection may use every namespace); the
  // answer as a connection's would be.  False when undecodable or of another op.
  bool ServeLeaseOp(uint8_t op, std::string_view meta, std::string* out) {
    if (op == wire::kRelease) return ServeRelease(meta, out);
    if (op != wire::kLookup) return false;
    std::vector<std::string_view> key_views;
    if (!wire::GetKeys(&meta, &key_views, nullptr) || !meta.empty()) return false;
    std::vector<Slice> keys(key_views.begin(), key_views.end());
    ServeLookup(keys, out);
    return true;
  }

  bool Dispatch(Conn* c, const wire::FrameHeader& h, std::string_view meta, const char* body) {
    if (IsDbOp(h.op)) {
      std::string out;
      ServiceOps ops(service_, c->tenant, &refusals_, c->peer);
      if (!ServeDbOp(&ops, h.op, meta, &out)) {
        return Reject(c, std::string("undecodable ") + DbOpName(h.op) + " request");
      }
      return Answer(c, h, out);
    }
    std::vector<std::string_view> key_views;
    std::vector<uint64_t> extra;
    std::vector<Slice> keys;
    auto get_keys = [&](bool with_extra) {
      if (!wire::GetKeys(&meta, &key_views, with_extra ? &extra : nullptr) || !meta.empty()) {
        return false;
      }
      keys.assign(key_views.begin(), key_views.end());
      return true;
    };
    std::vector<int64_t> results;
    switch (h.op) {
      case wire::kAuth:
        return Authenticate(c, h, meta);
      case wire::kSyncNamespaces: {
        std::string answer;
        Status s = service_->SyncNamespaces(c->tenant, meta, &answer);
        if (s.IsPermissionDenied() && c->tenant != nullptr) refusals_.Note(c->tenant, c->peer, s);
        std::string out;
        wire::PutBatchStatus(&out, s);
        PutLengthPrefixed(&out, s.ok() ? answer : "");
        return Answer(c, h, out);
      }
      case wire::kGet: {
        if (!get_keys(true)) return Reject(c, "undecodable get request");
        if (Status s = Permit(c, keys); !s.ok()) return AnswerResults(c, h, s, results);
        auto answer = std::make_unique<GetAnswer>(service_);
        answer->Build(keys, extra);
        std::string meta_out = answer->TakeMeta();
        return Answer(c, h, std::move(meta_out), std::move(answer));
      }
      case wire::kGetGroups: {
        // Each group answered (read from its tiers, then queued) before the next is read,
        // its frame carrying the request's id + its index.
        std::vector<uint32_t> counts;
        if (!wire::GetGetGroups(&meta, &counts, &key_views, &extra) || !meta.empty()) {
          return Reject(c, "undecodable get_groups request");
        }
        keys.assign(key_views.begin(), key_views.end());
        const Status permitted = Permit(c, keys);
        wire::FrameHeader group = h;
        size_t first = 0;
        for (uint32_t n : counts) {
          bool queued;
          if (permitted.ok()) {
            auto answer = std::make_unique<GetAnswer>(service_);
            answer->Build(std::span<const Slice>(keys).subspan(first, n),
                          std::span<const uint64_t>(extra).subspan(first, n));
            std::string meta_out = answer->TakeMeta();
            queued = Answer(c, group, std::move(meta_out), std::move(answer));
          } else {
            queued = AnswerResults(c, group, permitted, results);
          }
          if (!queued) return false;
          first += n;
          group.request_id++;
        }
        return true;
      }
      case wire::kPut: {
        if (!get_keys(true)) return Reject(c, "undecodable put request");
        uint64_t total = 0;
        for (uint64_t n : extra) {
          if (n > h.body_len - total) return Reject(c, "put sizes exceed the body");
          total += n;
        }
        if (total != h.body_len) return Reject(c, "put sizes do not add up to the body");
        if (Status s = Permit(c, keys); !s.ok()) return AnswerResults(c, h, s, results);
        std::vector<ValueParts> values(keys.size());
        uint64_t off = 0;
        for (size_t i = 0; i < keys.size(); i++) {
          values[i].emplace_back(body + off, extra[i]);
          off += extra[i];
        }
        Status s = service_->BatchPut(keys, values, &results);
        return AnswerResults(c, h, s, results);
      }
      case wire::kLookup: {
        if (!get_keys(false)) return Reject(c, "undecodable lookup request");
        if (Status s = Permit(c, keys); !s.ok()) {
          std::string out;
          wire::PutBatchStatus(&out, s);
          return Answer(c, h, out);
        }
        std::string out;
        ServeLookup(keys, &out);
        return Answer(c, h, out);
      }
      case wire::kRelease: {
        std::string out;
        if (!ServeRelease(meta, &out)) return Reject(c, "undecodable release request");
        return Answer(c, h, out);
      }
      case wire::kRdmaConnect: {
        // Retired with kvengine's own verbs transport: RDMA goes through UCX (kUcxConnect).
        // Answered as before, batch status and an empty answer, so an older client falls
        // back to TCP frames.
        std::string out;
        wire::PutBatchStatus(&out, Status::NotSupported(
                                       "the verbs transport was retired: RDMA goes through UCX "
                                       "(peer_transport=ucx or rdma)"));
        PutLengthPrefixed(&out, "");
        return Answer(c, h, out);
      }
      case wire::kUcxConnect: {
        std::string theirs, out;
        Status s = OneSidedAllowed(c);
        if (s.ok()) {
          std::shared_ptr<void> client;
          auto serve = [this](uint8_t op, std::string_view in, std::string* answer) {
            return ServeLeaseOp(op, in, answer);
          };
          s = options_.ucx_connect
                  ? options_.ucx_connect(meta, &theirs, &client, serve, options_.lease_ttl_ms)
                  : Status::NotSupported("this server does not serve UCX");
          if (s.ok()) c->ucx_client = std::move(client);
        }
        wire::PutBatchStatus(&out, s);
        PutLengthPrefixed(&out, theirs);
        return Answer(c, h, out);
      }
      case wire::kChallenge:
        return Reject(c, "a challenge sent to the server");
      default: {
        // A newer client's op.  The frame was whole and its checksum held, so the stream
        // is in step: refuse this request only.
        std::string out;
        wire::PutBatchStatus(
            &out, Status::NotSupported("this server does not know op " + std::to_string(h.op)));
        return Answer(c, h, out);
      }
    }
  }

  const ServerOptions options_;
  PeerService* const service_;
  const TenantTable tenants_;  // empty: no token required
  Refusals refusals_;
  LeaseTable leases_;
  BodyPool bodies_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread poller_;
  std::vector<std::thread> workers_;

  Mutex mu_;
  CondVar cv_;
  std::deque<Conn*> ready_ GUARDED_BY(mu_);
  std::unordered_set<Conn*> conns_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> per_address_ GUARDED_BY(mu_);  // open connections
  bool queue_closed_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;

  // The poller's own.
  bool accept_paused_ = false;
  bool accept_trouble_logged_ = false;
  Deadline accept_resume_{};

  LogLimiter cap_log_{std::chrono::seconds(1)};
  LogLimiter slow_reader_log_{kRefusalLogInterval};
  LogLimiter over_budget_log_{kRefusalLogInterval};
  std::atomic<uint64_t> requests_{0}, rejected_{0}, refused_auth_{0}, slow_readers_closed_{0},
      refused_over_budget_{0};
};

}  // namespace

Status TransportServer::Start(const Endpoint& at, const ServerOptions& options,
                              PeerService* service, std::unique_ptr<TransportServer>* result) {
  auto server = std::make_unique<TcpServer>(options, service);
  Status s = server->Listen(at);
  if (!s.ok()) return s;
  *result = std::move(server);
  return Status::OK();
}

}  // namespace kvengine
