#include "attach/local_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#include "attach/namespace_wire.h"
#include "attach/resident_wire.h"
#include "attach/staging_window.h"
#include "db/shared_arena.h"
#include "env/descriptor_budget.h"
#include "kvengine/db.h"
#include "namespaces/namespace_keys.h"
#include "namespaces/namespace_view.h"
#include "transport/busy_poll.h"
#include "transport/db_ops.h"
#include "transport/figure_scope.h"
#include "transport/read_validation.h"
#include "transport/shm_channel.h"
#include "transport/unix_socket.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/namespace_key.h"
#include "util/printable.h"

namespace kvengine {

namespace {

// Most reservations plus pins one connection may hold at once: a client that never
// commits or releases runs out, instead of the arena.
constexpr size_t kMaxHeldPerConnection = 1u << 20;

// Whether a request of `op` reads or changes keys of the connection's namespace (the
// others -- properties, Flush, CompactBuckets, the channel, UNPIN of the connection's own
// pins, the namespace requests, checked on their own -- are not about its keys).
bool TouchesKeys(uint8_t op) {
  switch (op) {
    case wire::kExists:
    case wire::kDelete:
    case wire::kValueSize:
    case wire::kDeleteMatching:
    case wire::kPrefetch:
    case wire::kReserve:
    case wire::kCommit:
    case wire::kCommitReserve:
    case wire::kPin:
    case wire::kPinGroups:
    case wire::kLocate:
    case wire::kReadRemovals:
    case wire::kReadResident:
      return true;
    default:
      return false;
  }
}

// What a client may see of the DB's figures (properties): the whole DB's with a grant of
// every namespace and '@admin' (the owner's uid, root, a plain entry), else only its
// namespaces' (transport/figure_scope.h; docs/attach.md, "What a client sees of the DB").
FigureScope FiguresOf(const LocalGrant& grant, uid_t uid) {
  if (grant.every && grant.admin) return FigureScope();
  return FigureScope::Of("uid " + std::to_string(uid), grant.every, grant.names);
}

// How a namespace is named in messages ("": the default namespace).
std::string NamespaceName(const std::string& name) {
  return name.empty() ? "the default namespace" : "namespace '" + name + "'";
}

}  // namespace

struct LocalServer::Connection {
  int fd = -1;
  LocalPeer peer;    // its process's credentials, from the kernel
  LocalGrant grant;  // what local_allowed_uids lets it do
  std::thread thread;
  std::atomic<bool> done{false};
};

// One connection's requests and what it holds in the arena.  Destroying the session
// gives every reservation and pin back.
class LocalServer::Session {
 public:
  Session(LocalServer* server, Connection* conn)
      : server_(server),
        db_(server->db_),
        arena_(server->arena_),
        conn_(conn),
        part_(server->ReachesDefaultArena(conn->grant) ? 0 : -1),
        region_(part_ == 0 ? server->arena_->arena_part(0) : SharedArena::Part()),
        busy_poll_(server->options_.local_busy_poll_us),
        who_("attached client pid " + std::to_string(conn->peer.pid) + " uid " +
             std::to_string(conn->peer.uid)),
        figures_(FiguresOf(conn->grant, conn->peer.uid)) {
    Bind("", nullptr);  // the default namespace, or refused when the grant lacks it
  }

  void Run() {
    const std::string& who = who_;
    uint8_t last_op = 0;  // the op of the request served last (0: none yet)
    for (;;) {
      // Idle clients may wait forever; a frame once begun must arrive within the timeout.
      // Their reservations may not: they are reclaimed while waiting.
      wire::FrameHeader h;
      std::string meta;
      Status s = WaitForRequest(last_op);
      ExpireReservations();
      if (s.ok()) {
        const Deadline deadline = DeadlineIn(server_->options_.peer_timeout_ms);
        s = channel_ != nullptr ? channel_->ReadFrame(deadline, &h, &meta)
                                : ReadFrame(conn_->fd, deadline, &h, &meta, &server_->stopping_);
      }
      if (!s.ok()) {
        if (s.IsCorruption() || s.message() == "receive timed out") {
          server_->Refuse(who, s);  // garbage, or a frame begun and never finished
        } else if (!s.IsAborted() && s.message() != "connection closed by peer") {
          server_->logger_->Logf(LogLevel::kInfo, "local: %s: %s", who.c_str(),
                                 s.ToString().c_str());
        }
        return;
      }
      last_op = h.op;
      if (!Serve(h, meta)) {
        if (answer_error_.ok()) {
          server_->Refuse(
              who, Status::Corruption("malformed request (op " + std::to_string(h.op) + ")"));
        } else {  // usually a client that exited (or was killed) before its answer
          server_->logger_->Logf(LogLevel::kInfo, "local: %s did not take its answer: %s",
                                 who.c_str(), answer_error_.ToString().c_str());
        }
        return;
      }
    }
  }

 private:
  using Clock = std::chrono::steady_clock;

  // TakeWindowRoom's answer for a value the window can never hold: it is staged in the
  // arena instead (ReadIntoStaging).  Never sent.
  static constexpr int64_t kLargerThanWindow = 3;

  struct Lease {
    MemoryTier::Handle handle;
    MemoryTier::Reservation staging;
    bool in_window = false;  // its value is in window_, which it holds room of
  };

  struct Held {  // a reserved slot not yet committed
    MemoryTier::Reservation slot;
    Clock::time_point expires;  // Clock::time_point::max(): never
  };

  // Waits for the client's next request, which usually follows the answer to `last_op`
  // after a pattern the client repeats (a put's copy between RESERVE and COMMIT).
  Status WaitForRequest(uint8_t last_op) {
    if (channel_ != nullptr) {
      for (bool first = true;; first = false) {  // spins only before the first sleep
        bool arrived = false;
        Status s =
            channel_->WaitForFrame(last_op, DeadlineIn(100), &server_->stopping_, first, &arrived);
        if (!s.ok() || arrived) return s;
        ExpireReservations();
        if (window_ != nullptr) window_->ReleaseIfIdle();
      }
    }
    const auto began = BusyPollPredictor::Clock::now();
    if (busy_poll_.Spin(conn_->fd, last_op)) {
      busy_poll_.Done(last_op, began);
      return Status::OK();
    }
    for (;;) {
      if (server_->stopping_.load()) return Status::Aborted("stopping");
      pollfd p{conn_->fd, POLLIN, 0};
      const int n = poll(&p, 1, 100);
      if (n > 0) {
        busy_poll_.Done(last_op, began);
        return Status::OK();
      }
      ExpireReservations();
      if (window_ != nullptr) window_->ReleaseIfIdle();
    }
  }

  // A spare is reserved before the client knows it will need it: it holds arena room
  // only briefly, and is given back silently.
  Clock::time_point SpareDeadline() const {
    return Clock::now() + std::chrono::milliseconds(server_->spare_lifetime_ms());
  }

  Clock::time_point ReservationDeadline() const {
    const uint64_t ms = server_->options_.local_reservation_timeout_ms;
    return ms == 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(ms);
  }

  // Gives back the slots reserved longer than local_reservation_timeout_ms ago.  Ids
  // grow with time, so the oldest come first.
  void ExpireReservations() {
    const Clock::time_point now = Clock::now();
    while (!spares_.empty() && spares_.begin()->second.expires <= now) {
      expired_ids_.insert(spares_.begin()->first);
      spares_.erase(spares_.begin());
    }
    size_t expired = 0;
    while (!reservations_.empty() && reservations_.begin()->second.expires <= now) {
      expired_ids_.insert(reservations_.begin()->first);
      reservations_.erase(reservations_.begin());
      expired++;
    }
    while (expired_ids_.size() > kMaxHeldPerConnection) expired_ids_.erase(expired_ids_.begin());
    if (expired == 0) return;
    server_->counters_->reservations_expired.fetch_add(expired);
    server_->logger_->Logf(
        LogLevel::kWarn,
        "local: attached client pid %d held %zu reserved slots longer than "
        "local_reservation_timeout_ms (%llu): given back",
        static_cast<int>(conn_->peer.pid), expired,
        static_cast<unsigned long long>(server_->options_.local_reservation_timeout_ms));
  }

  bool Answer(const wire::FrameHeader& h, const std::string& meta) {
    const Deadline deadline = DeadlineIn(server_->options_.peer_timeout_ms);
    answer_error_ =
        channel_ != nullptr
            ? channel_->SendFrame(h.op, wire::kFlagResponse, h.request_id, meta, deadline)
            : SendFrame(conn_->fd, h.op, wire::kFlagResponse, h.request_id, meta, {}, deadline);
    return answer_error_.ok();
  }

  // Answers h on the socket (before any channel): `memfd` alongside (closed here; -1:
  // none), then `out`.  False when the client did not take it.
  bool AnswerWithRegion(const wire::FrameHeader& h, int memfd, const std::string& out) {
    const Deadline deadline = DeadlineIn(server_->options_.peer_timeout_ms);
    answer_error_ = SendDescriptor(conn_->fd, memfd, deadline);
    if (memfd >= 0) close(memfd);
    if (answer_error_.ok()) {
      answer_error_ =
          SendFrame(conn_->fd, h.op, wire::kFlagResponse, h.request_id, out, {}, deadline);
    }
    return answer_error_.ok();
  }

  // Sets up the connection's shared channel and answers on the socket, the memfd
  // alongside; every later frame goes through the channel.
  bool OpenChannel(const wire::FrameHeader& h) {
    std::unique_ptr<ShmChannel> channel;
    int memfd = -1;
    Status s =
        ShmChannel::Create(conn_->fd, server_->options_.local_busy_poll_us, &channel, &memfd);
    std::string out;
    wire::PutBatchStatus(&out, s);
    if (!AnswerWithRegion(h, memfd, out)) return false;
    if (channel != nullptr) {
      channel_ = std::move(channel);
      server_->counters_->shared_channels.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
  }

  // Sets up the connection's staging window (StagingWindow) and answers on the socket,
  // the memfd and the window's size alongside: the client asks before its channel.
  bool OpenStaging(const wire::FrameHeader& h) {
    std::unique_ptr<StagingWindow> window;
    int memfd = -1;
    Status s = StagingWindow::Create(&window, &memfd);
    std::string out;
    wire::PutBatchStatus(&out, s);
    PutFixed64(&out, s.ok() ? window->size() : 0);
    if (!AnswerWithRegion(h, memfd, out)) return false;
    if (window != nullptr) {
      window_ = std::move(window);
      server_->counters_->staging_windows.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
  }

  bool AnswerResults(const wire::FrameHeader& h, const Status& s,
                     const std::vector<int64_t>& results) {
    std::string out;
    wire::PutBatchStatus(&out, s);
    wire::PutResults(&out, s.ok() ? results : std::vector<int64_t>());
    return Answer(h, out);
  }

  bool AnswerLocations(const wire::FrameHeader& h, const std::vector<int64_t>& results,
                       const std::vector<RemoteLocation>& locations) {
    std::string out;
    wire::PutBatchStatus(&out, Status::OK());
    EncodeLocations(&out, results, locations);
    return Answer(h, out);
  }

  uint64_t OffsetOf(const char* p) const { return static_cast<uint64_t>(p - region_.base); }
  // Whether [p, p + n) lies in the arena the client maps: the one part of the arena it
  // was passed.  Room or a value anywhere else is never shown to it.
  bool InClientArena(const char* p, uint64_t n) const {
    return region_.base != nullptr && p >= region_.base && n <= region_.size &&
           static_cast<uint64_t>(p - region_.base) <= region_.size - n;
  }
  Status OutsideClientArena() const {
    return Status::PermissionDenied("the value's room is outside the arena this connection maps");
  }

  bool Full() const {
    return reservations_.size() + spares_.size() + leases_.size() >= kMaxHeldPerConnection;
  }
  static Status HeldTooMuch() {
    return Status::Busy("the connection holds " + std::to_string(kMaxHeldPerConnection) +
                        " reservations and pins already");
  }

  // Reserves a slot of `size` bytes into `held` (reservations_, or spares_: key null);
  // kLookupPinned and its location, or an error code.
  int64_t Reserve(const Slice* key, uint64_t size, std::map<uint64_t, Held>* held,
                  RemoteLocation* loc) {
    if (Full()) return HeldTooMuch().ErrorCode();
    MemoryTier::Reservation r;
    // A spare is charged to the connection's namespace, a keyed slot to its key's.
    Status s =
        key == nullptr
            ? arena_->ReserveSpare(view_ == nullptr ? 0 : ns::IdOf(namespace_), size, &r)
            : WithArenaKey(*key, [&](const Slice& k) { return arena_->Reserve(k, size, &r); });
    if (!s.ok()) return s.ErrorCode();
    if (!InClientArena(r.data(), size)) return OutsideClientArena().ErrorCode();
    const uint64_t id = ++next_id_;
    *loc = {OffsetOf(r.data()), size, 0, id};
    held->emplace(id,
                  Held{std::move(r), held == &spares_ ? SpareDeadline() : ReservationDeadline()});
    return kLookupPinned;
  }

  // Publishes the slots `ids` (reservations or spares) under `keys`, as one put of the
  // DB served: through the top of the arena's stack (db/shared_arena.h), which sends
  // each key to its owners when the DB is a cluster's.
  void Commit(const std::vector<Slice>& keys, const std::vector<uint64_t>& ids,
              std::vector<int64_t>* results) {
    ExpireReservations();  // exactly at the timeout, not at the next poll
    results->assign(keys.size(), 0);
    struct Found {
      size_t index;
      std::map<uint64_t, Held>* held;
      std::map<uint64_t, Held>::iterator it;
    };
    std::vector<Found> found;
    std::set<uint64_t> named_ids;  // a slot named twice is published once
    for (size_t i = 0; i < keys.size(); i++) {
      std::map<uint64_t, Held>* held = &reservations_;
      auto it = held->find(ids[i]);
      if (it == held->end()) {
        held = &spares_;
        it = held->find(ids[i]);
      }
      if (it == held->end() || !named_ids.insert(ids[i]).second) {
        const bool expired = expired_ids_.erase(ids[i]) != 0;
        (*results)[i] =
            (expired ? Status::Aborted("the reserved slot was given back at its timeout")
                     : Status::InvalidArgument("no reserved slot has id " + std::to_string(ids[i])))
                .ErrorCode();
        continue;
      }
      found.push_back({i, held, it});
    }
    std::vector<Slice> named;
    std::vector<MemoryTier::Reservation*> slots;
    for (const Found& f : found) {
      named.push_back(keys[f.index]);
      slots.push_back(&f.it->second.slot);
    }
    std::vector<int64_t> r;
    WithArenaKeys(
        named, &r,
        [&](std::span<const Slice> k, std::span<const size_t> idx, std::vector<int64_t>* out) {
          std::vector<MemoryTier::Reservation*> picked;
          for (size_t j : idx) picked.push_back(slots[j]);
          arena_->Commit(k, picked, out);
        });
    for (size_t j = 0; j < found.size(); j++) {
      const Found& f = found[j];
      (*results)[f.index] = r[j];
      if (f.held == &spares_ && r[j] == 0) {
        server_->counters_->spare_commits.fetch_add(1, std::memory_order_relaxed);
      }
      f.held->erase(f.it);  // gives back what was not published here
    }
  }

  // Reads key's value through the connection's namespace (SSD, peers; promoted by its
  // policy) into a reservation of the arena that only this client sees: for clients
  // without a staging window, and values larger than the window.  The value may
  // change size between the size and the read: then it is read again.
  Status ReadIntoStaging(const Slice& key, uint64_t capacity, MemoryTier::Reservation* staging,
                         Slice* value) {
    for (int attempt = 0; attempt < 4; attempt++) {
      uint64_t size = 0;
      Status s = served_->GetValueSize(key, &size);
      if (!s.ok()) return s;
      if (size > capacity) return TooSmall(key, size, capacity);
      s = WithArenaKey(key, [&](const Slice& k) { return arena_->Reserve(k, size, staging); });
      if (!s.ok()) return s;
      if (!InClientArena(staging->data(), size)) return OutsideClientArena();
      std::vector<Destination> dest(1);
      dest[0].emplace_back(staging->data(), size);
      std::vector<int64_t> result;
      s = served_->BatchGetInto(ReadOptions(), std::span<const Slice>(&key, 1), dest, &result);
      if (!s.ok()) return s;
      if (result[0] >= 0) {
        *value = Slice(staging->data(), static_cast<size_t>(result[0]));
        return Status::OK();
      }
      staging->Abandon();
      if (result[0] != Status::BufferTooSmall("").ErrorCode()) {
        return Status::FromErrorCode(static_cast<int>(result[0]), "key " + Printable(key));
      }
    }
    return Status::Busy("key " + Printable(key) + " kept changing size while it was read");
  }

  // A put's commit, and the slots of the client's next put, which usually has the same
  // shape (a vLLM request's layers), reserved now: one round trip a put.  False: the
  // request was malformed.
  bool ServeCommitReserve(const wire::FrameHeader& h, std::string_view meta) {
    std::vector<std::string_view> views;
    std::vector<uint64_t> ids;
    std::vector<int64_t> given_back, wanted;
    if (!wire::GetKeys(&meta, &views, &ids) || !wire::GetResults(&meta, &given_back) ||
        !wire::GetResults(&meta, &wanted) || !meta.empty()) {
      return false;
    }
    const std::vector<Slice> keys(views.begin(), views.end());
    std::vector<int64_t> results;
    Commit(keys, ids, &results);
    for (int64_t id : given_back) {
      spares_.erase(static_cast<uint64_t>(id));
      reservations_.erase(static_cast<uint64_t>(id));
    }
    std::vector<int64_t> reserved(wanted.size(), 0);
    std::vector<RemoteLocation> locs(wanted.size());
    for (size_t i = 0; i < wanted.size(); i++) {
      reserved[i] = wanted[i] < 0
                        ? Status::InvalidArgument("a spare of negative size").ErrorCode()
                        : Reserve(nullptr, static_cast<uint64_t>(wanted[i]), &spares_, &locs[i]);
    }
    std::string out;
    wire::PutBatchStatus(&out, Status::OK());
    wire::PutResults(&out, results);
    EncodeLocations(&out, reserved, locs);
    return Answer(h, out);
  }

  // Pins keys[i] for a destination of capacities[i] bytes, each under a lease of its own:
  // in place when the memory tier holds it, else read through the DB -- into the
  // connection's staging window when it has one and the value fits there (the keys of
  // the request in one batch read, so the DB reads them together), else into the arena
  // (Pin).  A key whose value would fit the window but not its room left is answered
  // kPinLater: the client asks again once it released this round's pins.
  bool ServePins(const wire::FrameHeader& h, const std::vector<Slice>& keys,
                 const std::vector<uint64_t>& capacities) {
    std::vector<int64_t> results(keys.size(), 0);
    std::vector<RemoteLocation> locs(keys.size());
    std::vector<size_t> staged;  // keys read into the window, below
    for (size_t i = 0; i < keys.size(); i++) {
      if (Full()) {
        results[i] = HeldTooMuch().ErrorCode();
        continue;
      }
      const uint64_t id = ++next_id_;
      Lease& lease = leases_[id];
      Status s = WithArenaKey(keys[i], [&](const Slice& k) {
        return arena_->PinInMemory(k, capacities[i], &lease.handle);
      });
      if (s.ok() && !InClientArena(lease.handle.value().data(), lease.handle.value().size())) {
        lease.handle.Release();  // not where the client maps: read through the DB instead
        s = Status::NotFound("");
      }
      if (s.IsNotFound() && window_ != nullptr) {
        results[i] = TakeWindowRoom(keys[i], capacities[i], id, &lease, &locs[i]);
        if (results[i] == kLookupPinned) {
          staged.push_back(i);
          continue;
        }
        if (results[i] != kLargerThanWindow) {
          DropLease(id);
          continue;
        }
      }
      Slice value;
      if (s.ok()) {
        value = lease.handle.value();
      } else if (s.IsNotFound()) {
        s = ReadIntoStaging(keys[i], capacities[i], &lease.staging, &value);
      }
      if (!s.ok()) {
        results[i] = s.ErrorCode();
        DropLease(id);
        continue;
      }
      results[i] = kLookupPinned;  // the size travels in the location
      locs[i] = {OffsetOf(value.data()), value.size(), 0, id};
    }
    ReadIntoWindow(keys, staged, &results, &locs);
    return AnswerLocations(h, results, locs);
  }

  // Room in the window for key's value, held by lease `id`: kLookupPinned with *loc
  // its place (the value read later, ReadIntoWindow); kPinLater when the room left is
  // too small; kLargerThanWindow when the value is larger than the whole window;
  // or the error code of its size (NotFound, BufferTooSmall beyond `capacity`).
  int64_t TakeWindowRoom(const Slice& key, uint64_t capacity, uint64_t id, Lease* lease,
                         RemoteLocation* loc) {
    uint64_t size = 0;
    Status s = served_->GetValueSize(key, &size);
    if (!s.ok()) return s.ErrorCode();
    if (size > capacity) return TooSmall(key, size, capacity).ErrorCode();
    if (size > window_->size()) return kLargerThanWindow;
    uint64_t offset = 0;
    if (!window_->Take(size, &offset)) {
      server_->counters_->window_deferred_keys.fetch_add(1, std::memory_order_relaxed);
      return wire::kPinLater;
    }
    lease->in_window = true;
    *loc = {offset, size, wire::kPinInWindow, id};
    return kLookupPinned;
  }

  // Reads the values of keys[staged[j]] through the connection's namespace (SSD, peers;
  // promoted by its policy) into the window rooms their locations name, in one batch.
  // A value that grew since it was sized is answered kPinLater (sized again next
  // round); one that shrank has its location's size cut.
  void ReadIntoWindow(const std::vector<Slice>& keys, const std::vector<size_t>& staged,
                      std::vector<int64_t>* results, std::vector<RemoteLocation>* locs) {
    if (staged.empty()) return;
    std::vector<Slice> batch;
    std::vector<Destination> dest(staged.size());
    for (size_t j = 0; j < staged.size(); j++) {
      const RemoteLocation& loc = (*locs)[staged[j]];
      batch.push_back(keys[staged[j]]);
      dest[j].emplace_back(window_->base() + loc.offset, loc.size);
    }
    std::vector<int64_t> got;
    const Status s = served_->BatchGetInto(ReadOptions(), batch, dest, &got);
    uint64_t read = 0;
    for (size_t j = 0; j < staged.size(); j++) {
      const size_t i = staged[j];
      RemoteLocation& loc = (*locs)[i];
      const int64_t r = s.ok() ? got[j] : s.ErrorCode();
      if (r >= 0) {
        loc.size = static_cast<uint64_t>(r);
        read++;
        continue;
      }
      (*results)[i] = r == Status::BufferTooSmall("").ErrorCode() ? wire::kPinLater : r;
      DropLease(loc.lease);
      loc = RemoteLocation();
    }
    server_->counters_->window_staged_values.fetch_add(read, std::memory_order_relaxed);
  }

  // A layer-wise load's pins (PIN_GROUPS): keys[ends[g-1], ends[g]) are group g.  Every
  // key is pinned as ServePins pins it -- in place when in memory, else given room of
  // its destination's capacity in the staging window (no sizing round trip to a peer),
  // else staged in the arena -- until the window is full: from there on the keys are
  // kPinLater, for the client's next round, so a round holds at most the window's
  // bytes.  The keys given window room are then read by ONE DB::BatchGetIntoGroups of
  // the groups (ClusterDB's pipelined load over the peers in a sharded cluster), and
  // each group is answered from its on_ready, while the later groups are still on their
  // way.  False: the request was malformed, or the client did not take an answer.
  bool ServePinGroups(const wire::FrameHeader& h, const std::vector<Slice>& keys,
                      const std::vector<uint64_t>& capacities, const std::vector<int64_t>& ends) {
    if (ends.size() > wire::kMaxKeysPerRequest) return false;  // an answer frame each
    for (size_t g = 0; g < ends.size(); g++) {
      if (ends[g] < (g == 0 ? 0 : ends[g - 1])) return false;
    }
    if (ends.empty() ? !keys.empty() : static_cast<uint64_t>(ends.back()) != keys.size()) {
      return false;
    }
    server_->counters_->group_loads.fetch_add(1, std::memory_order_relaxed);
    std::vector<int64_t> results(keys.size(), 0);
    std::vector<RemoteLocation> locs(keys.size());
    std::vector<size_t> staged;  // keys given room in the window, read below
    bool full = false;           // the window had no room for a key: the rest wait
    for (size_t i = 0; i < keys.size(); i++) {
      if (full) {
        results[i] = wire::kPinLater;
        server_->counters_->window_deferred_keys.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      results[i] = PinForGroups(keys[i], capacities[i], &locs[i], &full);
      if (results[i] == kLookupPinned && locs[i].version == wire::kPinInWindow) staged.push_back(i);
    }
    // The staged keys in groups of their own: staged_ends[g] counts those of groups <= g.
    std::vector<Slice> batch;
    std::vector<Destination> dest(staged.size());
    std::vector<size_t> staged_ends(ends.size());
    for (size_t j = 0, g = 0; g < ends.size(); g++) {
      for (; j < staged.size() && staged[j] < static_cast<size_t>(ends[g]); j++) {
        const RemoteLocation& loc = locs[staged[j]];
        batch.push_back(keys[staged[j]]);
        dest[j].emplace_back(window_->base() + loc.offset, loc.size);
      }
      staged_ends[g] = batch.size();
    }
    std::vector<int64_t> got;
    size_t answered = 0;  // groups answered so far
    uint64_t read = 0;
    auto answer_group = [&](size_t g) {
      if (!answer_error_.ok()) return;  // the client is gone: nothing more to send
      for (size_t j = g == 0 ? 0 : staged_ends[g - 1]; j < staged_ends[g]; j++) {
        RemoteLocation& loc = locs[staged[j]];
        if (got[j] >= 0) {  // BufferTooSmall is the client's: its destination is the room
          loc.size = static_cast<uint64_t>(got[j]);
          read++;
          continue;
        }
        results[staged[j]] = got[j];
        DropLease(loc.lease);
        loc = RemoteLocation();
      }
      const size_t first = g == 0 ? 0 : static_cast<size_t>(ends[g - 1]);
      const size_t n = static_cast<size_t>(ends[g]) - first;
      std::string out;
      wire::PutBatchStatus(&out, Status::OK());
      EncodeLocations(&out, std::span<const int64_t>(results).subspan(first, n),
                      std::span<const RemoteLocation>(locs).subspan(first, n));
      answered = g + 1;
      Answer(h, out);
    };
    Status s = staged.empty() ? Status::OK()
                              : served_->BatchGetIntoGroups(ReadOptions(), batch, dest, staged_ends,
                                                            answer_group, &got);
    server_->counters_->window_staged_values.fetch_add(read, std::memory_order_relaxed);
    if (staged.empty()) {
      got.clear();
      for (size_t g = 0; g < ends.size(); g++) answer_group(g);
    }
    if (!s.ok() && answer_error_.ok() && answered < ends.size()) {
      // The DB closed meanwhile: the unanswered groups' pins go, and one answer with the
      // error ends the request.
      for (size_t i = answered == 0 ? 0 : static_cast<size_t>(ends[answered - 1]); i < keys.size();
           i++) {
        if (results[i] == kLookupPinned) DropLease(locs[i].lease);
      }
      std::string out;
      wire::PutBatchStatus(&out, s);
      Answer(h, out);
    }
    return answer_error_.ok();
  }

  // One key of a PIN_GROUPS: kLookupPinned with *loc (in place, in the window -- not
  // read yet -- or staged in the arena), kPinLater setting *full when the window has no
  // room left for it, or the key's error.
  int64_t PinForGroups(const Slice& key, uint64_t capacity, RemoteLocation* loc, bool* full) {
    if (Full()) return HeldTooMuch().ErrorCode();
    const uint64_t id = ++next_id_;
    Lease& lease = leases_[id];
    Status s = WithArenaKey(
        key, [&](const Slice& k) { return arena_->PinInMemory(k, capacity, &lease.handle); });
    if (s.ok() && !InClientArena(lease.handle.value().data(), lease.handle.value().size())) {
      lease.handle.Release();  // not where the client maps: read through the DB instead
      s = Status::NotFound("");
    }
    Slice value;
    if (s.ok()) {
      value = lease.handle.value();
    } else if (s.IsNotFound() && window_ != nullptr && capacity <= window_->size()) {
      uint64_t offset = 0;
      if (!window_->Take(capacity, &offset)) {
        DropLease(id);
        *full = true;
        server_->counters_->window_deferred_keys.fetch_add(1, std::memory_order_relaxed);
        return wire::kPinLater;
      }
      lease.in_window = true;
      *loc = {offset, capacity, wire::kPinInWindow, id};
      return kLookupPinned;
    } else if (s.IsNotFound()) {  // no window, or a destination larger than it
      s = ReadIntoStaging(key, capacity, &lease.staging, &value);
    }
    if (!s.ok()) {
      DropLease(id);
      return s.ErrorCode();
    }
    *loc = {OffsetOf(value.data()), value.size(), 0, id};
    return kLookupPinned;
  }

  // Releases lease `id` (a client's UNPIN, or a pin that failed): its pin, its staging
  // reservation, or its room of the window.
  void DropLease(uint64_t id) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    if (it->second.in_window) window_->Release();
    leases_.erase(it);
  }

  bool ServeReadRemovals(const wire::FrameHeader& h, std::string_view meta) {
    uint64_t after = 0, max_events = 0;
    if (!GetFixed64(&meta, &after) || !GetFixed64(&meta, &max_events) || !meta.empty()) {
      return false;
    }
    RemovalBatch batch;
    // The DB holds max_events to its batch limit; one past any limit is refused there.
    Status s = served_->ReadRemovals(
        after, static_cast<size_t>(std::min<uint64_t>(max_events, SIZE_MAX)), &batch);
    // An answer stays well inside a frame's metadata limit: the events past it are
    // left for the reader's next call (its cursor is the last event it got).
    uint64_t bytes = 0;
    size_t fit = 0;
    for (; fit < batch.events.size(); fit++) {
      bytes += 19 + 10 + batch.events[fit].key.size();
      if (bytes > wire::kMaxMetaLen / 2) break;
    }
    batch.events.resize(fit);
    std::string out;
    wire::PutBatchStatus(&out, s);
    if (s.ok()) wire::PutRemovalBatch(&out, batch);
    return Answer(h, out);
  }

  // ---- the resident set (READ_RESIDENT, attach/resident_wire.h)

  // Streams served_'s ReadResident -- the connection's namespace, its keys as the client
  // names them -- one KEYS answer per batch (or per kResidentFrameBytes of one), each
  // sent once the client asked for it, and ends with the snapshot's END (or its error).
  // False: the request was malformed, or the client went away or stopped asking.
  bool ServeReadResident(const wire::FrameHeader& h, std::string_view meta) {
    wire::ResidentStep step;
    std::string_view prefix;
    uint64_t max_batch = 0;
    if (!wire::GetResidentRequest(&meta, &step, &prefix, &max_batch)) return false;
    std::string out;
    if (step != wire::kResidentStart) {
      wire::PutBatchStatus(&out, Status::InvalidArgument("READ_RESIDENT: no snapshot in progress"));
      return Answer(h, out);
    }
    wire::FrameHeader asked = h;  // the request the next answer answers
    bool broken = false;          // the client went away, or sent something else
    uint64_t sent = 0;
    ResidentSnapshot snapshot;
    Status s = served_->ReadResident(
        Slice(prefix.data(), prefix.size()),
        static_cast<size_t>(std::min<uint64_t>(max_batch, SIZE_MAX)),
        [&](std::span<const ResidentKey> keys) {
          for (size_t first = 0; first < keys.size();) {
            size_t end = first;
            uint64_t bytes = 0;
            while (end < keys.size() &&
                   (end == first ||
                    bytes + wire::ResidentKeyBytes(keys[end]) <= wire::kResidentFrameBytes)) {
              bytes += wire::ResidentKeyBytes(keys[end++]);
            }
            out.clear();
            wire::PutBatchStatus(&out, Status::OK());
            wire::PutResidentKeys(&out, keys.subspan(first, end - first));
            sent += end - first;
            bool more = false;
            if (!Answer(asked, out) || !NextResidentStep(&asked, &more)) {
              broken = true;
              return false;
            }
            if (!more) return false;  // the client's ResidentFn stopped
            first = end;
          }
          return true;
        },
        &snapshot);
    if (broken) return false;
    out.clear();
    wire::PutBatchStatus(&out, s);
    if (s.ok()) {
      snapshot.keys = sent;  // what the client was sent, however the walk ended
      wire::PutResidentEnd(&out, snapshot);
    }
    return Answer(asked, out);
  }

  // Reads the client's next READ_RESIDENT request (NEXT or STOP) into *asked, within
  // peer_timeout_ms: *more is whether it asked for more.  False (answer_error_ set when
  // the connection failed, OK when the request was something else) ends the connection.
  bool NextResidentStep(wire::FrameHeader* asked, bool* more) {
    ExpireReservations();  // a long stream holds no spare past its lifetime
    const Deadline deadline = DeadlineIn(server_->options_.peer_timeout_ms);
    std::string meta;
    Status s;
    if (channel_ != nullptr) {
      bool arrived = false;
      s = channel_->WaitForFrame(wire::kReadResident, deadline, &server_->stopping_, true,
                                 &arrived);
      if (s.ok() && !arrived)
        s = Status::IOError("the client did not ask for the next batch in time");
      if (s.ok()) s = channel_->ReadFrame(deadline, asked, &meta);
    } else {
      s = ReadFrame(conn_->fd, deadline, asked, &meta, &server_->stopping_);
    }
    if (!s.ok()) {
      answer_error_ = s;
      return false;
    }
    wire::ResidentStep step;
    std::string_view in(meta), prefix;
    uint64_t max_batch = 0;
    if (asked->op != wire::kReadResident ||
        !wire::GetResidentRequest(&in, &step, &prefix, &max_batch) ||
        step == wire::kResidentStart) {
      return false;
    }
    *more = step == wire::kResidentNext;
    return true;
  }

  // ---- namespaces

  // Runs fn(key as the arena knows it) for `key`, a key of the connection's namespace:
  // checked and mapped by the owner's own rule (never the client's), and, in a
  // namespace, under its guard, so that a DropNamespace cannot run between the mapping
  // and what fn publishes or pins.
  template <class Fn>
  Status WithArenaKey(const Slice& key, Fn fn) {
    if (view_ == nullptr) {
      Status s = default_rule_.Check(key);
      return s.ok() ? fn(key) : s;
    }
    return view_->Guarded([&](const NamespaceKeys& rule) {
      PrefixedKey internal;
      Status s = rule.ToInternal(key, &internal);
      return s.ok() ? fn(internal.slice()) : s;
    });
  }

  // WithArenaKey for a batch: fn(mapped keys, their indexes in `keys`, their results)
  // once, for the keys that pass the rule, inside one guard; (*results)[i] gets each
  // key's result, or why it was refused.
  template <class Fn>
  void WithArenaKeys(std::span<const Slice> keys, std::vector<int64_t>* results, Fn fn) {
    results->assign(keys.size(), 0);
    auto map_and_run = [&](const NamespaceKeys& rule) {
      std::unique_ptr<PrefixedKey[]> internal(new PrefixedKey[keys.size()]);
      std::vector<Slice> mapped;
      std::vector<size_t> idx;
      for (size_t i = 0; i < keys.size(); i++) {
        Status s = rule.is_default() ? rule.Check(keys[i]) : rule.ToInternal(keys[i], &internal[i]);
        if (!s.ok()) {
          (*results)[i] = s.ErrorCode();
          continue;
        }
        mapped.push_back(rule.is_default() ? keys[i] : internal[i].slice());
        idx.push_back(i);
      }
      if (mapped.empty()) return Status::OK();
      std::vector<int64_t> out;
      fn(std::span<const Slice>(mapped), std::span<const size_t>(idx), &out);
      for (size_t j = 0; j < idx.size(); j++) (*results)[idx[j]] = out[j];
      return Status::OK();
    };
    Status s = view_ == nullptr ? map_and_run(default_rule_) : view_->Guarded(map_and_run);
    if (!s.ok()) results->assign(keys.size(), s.ErrorCode());
  }

  // The PermissionDenied of a client whose grant lacks namespace `name`.
  Status Refusal(const std::string& name, const char* why = "may not use") const {
    return Status::PermissionDenied(
        "uid " + std::to_string(conn_->peer.uid) + " " + why + " " + NamespaceName(name) + " of " +
        server_->path_ + " (local_allowed_uids grants it " + conn_->grant.ToString() + ")");
  }

  // Makes `name` the connection's namespace ("": the default one); stores its id in *id
  // (0 for the default).  A namespace outside the grant is refused, the connection left
  // where it was; the default namespace outside the grant binds, refusing every request
  // with keys.
  Status Bind(const std::string& name, uint64_t* id) {
    if (name.empty() && part_ > 0) {
      return Status::InvalidArgument(
          "this connection maps the arena of another namespace, not the default one");
    }
    if (name.empty()) {
      namespace_.clear();
      handle_.reset();
      view_ = nullptr;
      served_ = db_;
      denied_ = conn_->grant.Allows("") ? Status::OK() : Refusal("");
      if (id != nullptr) *id = 0;
      return Status::OK();
    }
    if (!conn_->grant.Allows(name)) return Refusal(name);
    const uint32_t part = arena_->ArenaPartOf(ns::IdOf(name));
    if (part_ >= 0 && static_cast<uint32_t>(part_) != part) {
      return Status::InvalidArgument(
          NamespaceName(name) +
          " has an arena of its own (namespace_arenas): a connection "
          "reaches it through OPEN_ARENA, before its channel, not USE_NAMESPACE");
    }
    std::unique_ptr<DB> handle;
    Status s = db_->OpenNamespace(name, &handle);
    if (!s.ok()) return s;
    auto* view = dynamic_cast<NamespaceView*>(handle.get());
    if (view == nullptr) return Status::NotSupported("the DB served has no namespace views");
    namespace_ = name;
    handle_ = std::move(handle);
    view_ = view;
    served_ = view;
    denied_ = Status::OK();
    if (id != nullptr) *id = ns::IdOf(name);
    return Status::OK();
  }

  // Answers a request refused whole for its namespace, in the shape of its op's answer
  // (every client reads the status first and stops at an error), and counts it.
  bool AnswerRefused(const wire::FrameHeader& h, const Status& why) {
    server_->Deny(who_, why);
    std::string out;
    wire::PutBatchStatus(&out, why);
    switch (h.op) {
      case wire::kExists:
      case wire::kDelete:
      case wire::kValueSize:
      case wire::kPrefetch:
      case wire::kLocate:
      case wire::kCommit:
        wire::PutResults(&out, {});
        break;
      case wire::kDeleteMatching:
        PutFixed64(&out, 0);
        break;
      default:  // RESERVE, PIN, COMMIT_RESERVE, READ_REMOVALS: the status alone
        break;
    }
    return Answer(h, out);
  }

  // The answer of a namespace request: its status and one fixed64; a PermissionDenied
  // counted and logged.
  bool AnswerNamespace(const wire::FrameHeader& h, const Status& s, uint64_t n) {
    if (s.IsPermissionDenied()) server_->Deny(who_, s);
    std::string out;
    wire::PutBatchStatus(&out, s);
    PutFixed64(&out, n);
    return Answer(h, out);
  }

  // Whether the connection holds reservations, spares or pins (all in its arena).
  bool Holds() const { return !reservations_.empty() || !spares_.empty() || !leases_.empty(); }

  // OPEN_ARENA: binds the connection to a namespace, as USE_NAMESPACE, and to the part
  // of the arena that holds its values, whose memfd goes with the answer (on the
  // socket).  A client granted only namespaces with arenas of their own is passed no
  // other memory than theirs.
  bool ServeOpenArena(const wire::FrameHeader& h, std::string_view meta) {
    std::string_view name;
    if (!GetLengthPrefixed(&meta, &name) || !meta.empty()) return false;
    const std::string wanted(name);
    const int old_part = part_;
    part_ = -1;  // binds whatever part the namespace is in
    uint64_t id = 0;
    Status s = Bind(wanted, &id);
    std::string out;
    int memfd = -1;
    if (s.ok()) {
      const uint32_t part = arena_->ArenaPartOf(id);
      const SharedArena::Part region = arena_->arena_part(part);
      memfd = region.fd >= 0 ? dup(region.fd) : -1;
      if (memfd < 0) {
        s = Status::IOError("cannot pass the arena of " + NamespaceName(wanted), strerror(errno));
      } else {
        part_ = static_cast<int>(part);
        region_ = region;
      }
    }
    if (!s.ok()) {
      part_ = old_part;
      if (s.IsPermissionDenied()) server_->Deny(who_, s);
    }
    wire::PutBatchStatus(&out, s);
    PutFixed64(&out, s.ok() ? id : 0);
    PutFixed64(&out, s.ok() ? region_.size : 0);
    return AnswerWithRegion(h, memfd, out);
  }

  bool ServeUse(const wire::FrameHeader& h, std::string_view meta) {
    std::string_view name;
    if (!GetLengthPrefixed(&meta, &name) || !meta.empty()) return false;
    uint64_t id = 0;
    Status s = Bind(std::string(name), &id);
    return AnswerNamespace(h, s, id);
  }

  // Whether the grant lets the client create or drop `name`.
  Status MayAdminister(const std::string& name) const {
    if (!conn_->grant.Allows(name)) return Refusal(name, "may not create or drop");
    if (!conn_->grant.admin) return Refusal(name, "(no @admin) may not create or drop");
    return Status::OK();
  }

  bool ServeCreate(const wire::FrameHeader& h, std::string_view meta) {
    std::string name;
    NamespaceOptions options;
    if (!wire::GetCreateNamespace(&meta, &name, &options) || !meta.empty()) return false;
    Status s = MayAdminister(name);
    std::unique_ptr<DB> handle;  // released at once: the client's USE opens its own
    if (s.ok()) s = db_->CreateNamespace(name, options, &handle);
    return AnswerNamespace(h, s, s.ok() ? ns::IdOf(name) : 0);
  }

  bool ServeDrop(const wire::FrameHeader& h, std::string_view meta) {
    std::string_view name;
    if (!GetLengthPrefixed(&meta, &name) || !meta.empty()) return false;
    Status s = MayAdminister(std::string(name));
    uint64_t deleted = 0;
    if (s.ok()) s = db_->DropNamespace(std::string(name), &deleted);
    return AnswerNamespace(h, s, deleted);
  }

  // The registered namespaces the grant lets the client use; the others it never sees.
  bool ServeList(const wire::FrameHeader& h) {
    std::vector<NamespaceInfo> all, granted;
    Status s = db_->ListNamespaces(&all);
    for (NamespaceInfo& n : all) {
      if (conn_->grant.Allows(n.name)) granted.push_back(std::move(n));
    }
    std::string out;
    wire::PutBatchStatus(&out, s);
    if (s.ok()) wire::PutNamespaceList(&out, granted);
    return Answer(h, out);
  }

  // False: the request was malformed; close the connection.
  bool Serve(const wire::FrameHeader& h, const std::string& meta_bytes) {
    std::string_view meta(meta_bytes);
    if (!denied_.ok() && TouchesKeys(h.op)) return AnswerRefused(h, denied_);
    if (IsDbOp(h.op)) {  // exists, deletes, value sizes, properties: as the peer server
      // Properties are the whole DB's, the owner's local counters included, cut to what
      // the grant may see.
      DbOpsOverDB ops(h.op == wire::kProperty ? db_ : served_, &figures_);
      std::string out;
      return ServeDbOp(&ops, h.op, meta, &out) && Answer(h, out);
    }
    std::vector<std::string_view> views;
    std::vector<uint64_t> extra;
    std::vector<Slice> keys;
    auto get_keys = [&](bool with_extra) {
      if (!wire::GetKeys(&meta, &views, with_extra ? &extra : nullptr) || !meta.empty()) {
        return false;
      }
      keys.assign(views.begin(), views.end());
      return true;
    };
    std::vector<int64_t> results;
    switch (h.op) {
      case wire::kReserve: {
        if (!get_keys(true)) return false;
        server_->counters_->reserve_requests.fetch_add(1, std::memory_order_relaxed);
        std::vector<RemoteLocation> locs(keys.size());
        results.assign(keys.size(), 0);
        for (size_t i = 0; i < keys.size(); i++) {
          results[i] = Reserve(&keys[i], extra[i], &reservations_, &locs[i]);
        }
        return AnswerLocations(h, results, locs);
      }
      case wire::kCommit: {
        if (!get_keys(true)) return false;
        Commit(keys, extra, &results);
        return AnswerResults(h, Status::OK(), results);
      }
      case wire::kCommitReserve:
        return ServeCommitReserve(h, meta);
      case wire::kPin:
        return get_keys(true) && ServePins(h, keys, extra);
      case wire::kPinGroups: {
        std::vector<int64_t> ends;
        if (!wire::GetKeys(&meta, &views, &extra) || !wire::GetResults(&meta, &ends) ||
            !meta.empty()) {
          return false;
        }
        keys.assign(views.begin(), views.end());
        return ServePinGroups(h, keys, extra, ends);
      }
      case wire::kUnpin: {
        uint32_t n = 0;
        if (!GetFixed32(&meta, &n) || meta.size() != 8ull * n) return false;
        for (uint32_t i = 0; i < n; i++) {
          uint64_t id = 0;
          GetFixed64(&meta, &id);
          DropLease(id);
        }
        return true;  // one-way
      }
      case wire::kOpenChannel:
        return meta.empty() && channel_ == nullptr && OpenChannel(h);  // asked once
      case wire::kOpenArena:  // on the socket, before the channel, holding nothing
        return channel_ == nullptr && window_ == nullptr && !Holds() && ServeOpenArena(h, meta);
      case wire::kOpenStaging:  // once, on the socket: before the channel
        return meta.empty() && channel_ == nullptr && window_ == nullptr && OpenStaging(h);
      case wire::kFlush: {
        std::string out;
        wire::PutBatchStatus(&out, db_->Flush());
        return Answer(h, out);
      }
      case wire::kLocate: {
        if (!get_keys(false)) return false;
        Status s = served_->BatchLocate(keys, &results);
        return AnswerResults(h, s, results);
      }
      case wire::kReadRemovals:
        return ServeReadRemovals(h, meta);
      case wire::kReadResident:
        return ServeReadResident(h, meta);
      case wire::kUseNamespace:
        return ServeUse(h, meta);
      case wire::kCreateNamespace:
        return ServeCreate(h, meta);
      case wire::kDropNamespace:
        return ServeDrop(h, meta);
      case wire::kListNamespaces:
        return meta.empty() && ServeList(h);
      case wire::kCompactBuckets: {
        uint64_t reclaimed = 0;
        Status s = db_->CompactBuckets(&reclaimed);
        std::string out;
        wire::PutBatchStatus(&out, s);
        PutFixed64(&out, reclaimed);
        return Answer(h, out);
      }
      default: {
        std::string out;
        wire::PutBatchStatus(
            &out, Status::NotSupported("the owner does not know op " + std::to_string(h.op)));
        return Answer(h, out);
      }
    }
  }

  LocalServer* const server_;
  DB* const db_;  // the whole DB: its default namespace, properties, namespace requests
  SharedArena* const arena_;
  Connection* const conn_;
  // The part of the arena the client was passed and maps (SharedArena::arena_part):
  // every location it is sent is an offset in it.  -1 (and no base): none yet.
  int part_;
  SharedArena::Part region_;
  BusyPollPredictor busy_poll_;
  const std::string who_;      // the client, in messages
  const FigureScope figures_;  // what the grant may see of the DB's figures
  // The namespace the connection's requests are in (Bind): its name ("": the default
  // namespace), its handle (null for the default one), the DB its requests go to (db_ or
  // the handle), and, when the grant lacks it, the PermissionDenied every request with
  // keys is answered.
  std::string namespace_;
  std::unique_ptr<DB> handle_;
  NamespaceView* view_ = nullptr;  // handle_, for the arena path (Guarded)
  DB* served_ = nullptr;
  Status denied_;
  const NamespaceKeys default_rule_;
  std::unique_ptr<ShmChannel> channel_;    // once the client opened one: every frame
  std::unique_ptr<StagingWindow> window_;  // once the client opened one (OPEN_STAGING)
  uint64_t next_id_ = 0;
  Status answer_error_;                    // why the last answer could not be sent
  std::map<uint64_t, Held> reservations_;  // by id: oldest first
  std::map<uint64_t, Held> spares_;        // reserved ahead of a put (kCommitReserve)
  std::set<uint64_t> expired_ids_;         // reclaimed, not yet named by a COMMIT
  std::unordered_map<uint64_t, Lease> leases_;
};

std::atomic<uint64_t> LocalServer::withheld_features_{0};

LocalServer::LocalServer(const Options& options, DB* db, SharedArena* arena, Logger* logger,
                         LocalServerCounters* counters)
    : options_(options),
      db_(db),
      arena_(arena),
      logger_(logger),
      counters_(counters),
      path_(options.local_listen) {}

LocalServer::~LocalServer() { Stop(); }

Status LocalServer::Start(const Options& options, DB* db, SharedArena* arena, Logger* logger,
                          LocalServerCounters* counters, std::unique_ptr<LocalServer>* result) {
  std::unique_ptr<LocalServer> server(new LocalServer(options, db, arena, logger, counters));
  Status s = LocalAccess::Parse(options.local_allowed_uids, geteuid(), &server->access_);
  if (!s.ok()) return s;
  const mode_t mode =
      static_cast<mode_t>(std::strtoul(options.local_listen_mode.c_str(), nullptr, 8));
  s = ListenUnix(server->path_, mode, options.local_listen_group, &server->listen_fd_);
  if (!s.ok()) return s;
  const DescriptorBudget budget = DescriptorBudget::Plan(
      options.env != nullptr ? options.env : Env::Default(), options.max_open_files);
  bool clamped = false;
  server->max_connections_ = budget.ConnectionCap(
      options.local_max_connections, kDescriptorsPerConnection, !options.listen.empty(), &clamped);
  if (clamped) {
    logger->Logf(LogLevel::kWarn,
                 "local_max_connections %llu clamped to %llu: the descriptor budget "
                 "(RLIMIT_NOFILE %llu, %llu in use) holds no more",
                 static_cast<unsigned long long>(options.local_max_connections),
                 static_cast<unsigned long long>(server->max_connections_),
                 static_cast<unsigned long long>(budget.limit),
                 static_cast<unsigned long long>(budget.in_use));
  }
  server->acceptor_ = std::thread([raw = server.get()] { raw->AcceptLoop(); });
  logger->Logf(LogLevel::kInfo, "serving local clients on %s (at most %llu connections)",
               server->path_.c_str(), static_cast<unsigned long long>(server->max_connections_));
  *result = std::move(server);
  return Status::OK();
}

void LocalServer::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::unique_ptr<Connection>> conns;
  {
    MutexLock lock(&mu_);
    conns.swap(connections_);
  }
  for (auto& c : conns) shutdown(c->fd, SHUT_RDWR);  // wakes a thread blocked on it
  for (auto& c : conns) {
    c->thread.join();
    close(c->fd);
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(path_.c_str());
    listen_fd_ = -1;
  }
}

void LocalServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) AcceptAll();
    MutexLock lock(&mu_);
    ReapLocked();
  }
}

void LocalServer::AcceptAll() {
  // At most a batch per call: the caller reaps the connections that ended in between,
  // however fast clients keep connecting.
  for (int batch = 0; batch < 256 && !stopping_.load(); batch++) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (!Triage(fd)) {
        close(fd);
      } else if (!HasRoom()) {
        RefuseOverBudget(fd);
        close(fd);
      } else {
        Admit(fd);
      }
      continue;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) {
      // Out of descriptors or memory: the queue stays readable, so pause instead of
      // spinning on it; the clients waiting wait in their connect.
      uint64_t held_back = 0;
      if (accept_log_.Admit(&held_back)) {
        logger_->Logf(LogLevel::kWarn, "local: accepting on %s: %s (pausing 100 ms)", path_.c_str(),
                      std::strerror(err));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return;
  }
}

void LocalServer::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      close((*it)->fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

bool LocalServer::Triage(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return true;  // silent and connected, as a client should be
  if (p.revents & POLLIN) {
    // The owner speaks first: bytes before its greeting are not the attach protocol.
    uid_t uid = 0;
    pid_t pid = 0;
    PeerCredentials(fd, &uid, &pid);
    Refuse("client pid " + std::to_string(pid) + " uid " + std::to_string(uid),
           Status::Corruption("it sent bytes before the owner's greeting"));
  }
  return false;  // or hung up already: killed, or it only connected
}

void LocalServer::Admit(int fd) {
  auto conn = std::make_unique<Connection>();
  conn->fd = fd;
  Connection* raw = conn.get();
  {
    MutexLock lock(&mu_);
    connections_.push_back(std::move(conn));
  }
  raw->thread = std::thread([this, raw] {
    if (Greet(raw)) {
      Session session(this, raw);
      session.Run();
    }  // gives back what the client held before the connection counts as done
    raw->done.store(true);
  });
}

bool LocalServer::HasRoom() {
  MutexLock lock(&mu_);
  ReapLocked();  // a connection that ended frees its room now, not at the next poll
  return connections_.size() < max_connections_;
}

void LocalServer::RefuseOverBudget(int fd) {
  counters_->clients_over_budget.fetch_add(1, std::memory_order_relaxed);
  const std::string why = "the owner at " + path_ + " serves " + std::to_string(max_connections_) +
                          " attached connections, its descriptor budget "
                          "(local_max_connections); raise ulimit -n";
  // A fresh socket's buffer takes the few bytes of a greeting at once; the short
  // deadline only bounds the acceptor's wait should it not.
  SendGreeting(fd, Status::Busy(why), nullptr, DeadlineIn(kOverBudgetGreetingMs));
  uint64_t held_back = 0;
  if (!over_budget_log_.Admit(&held_back)) return;
  uid_t uid = 0;
  pid_t pid = 0;
  PeerCredentials(fd, &uid, &pid);
  logger_->Logf(
      LogLevel::kWarn,
      "local: refused client pid %d uid %u: %s (and %llu more such connections since "
      "the last line; at most one line per %lld s)",
      static_cast<int>(pid), static_cast<unsigned>(uid), why.c_str(),
      static_cast<unsigned long long>(held_back),
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::seconds>(over_budget_log_.interval()).count()));
}

bool LocalServer::ReachesDefaultArena(const LocalGrant& grant) const {
  if (grant.every || arena_->arena_part_count() == 1) return true;
  for (const std::string& name : grant.names) {
    if (name.empty() || arena_->ArenaPartOf(ns::IdOf(name)) == 0) return true;
  }
  return false;
}

Status LocalServer::SendGreeting(int fd, const Status& s, const LocalGrant* grant,
                                 Deadline deadline) {
  // The default arena's memfd goes with the answer only to an accepted client whose
  // grant reaches it; the others are passed their namespaces' arenas by OPEN_ARENA.
  const bool pass = s.ok() && grant != nullptr && ReachesDefaultArena(*grant);
  const SharedArena::Part region = arena_->arena_part(0);
  std::string meta;
  wire::PutBatchStatus(&meta, s);
  PutFixed64(&meta, pass ? region.size : 0);
  PutFixed64(&meta, options_.local_reservation_timeout_ms);  // the client's copy deadline
  PutFixed64(&meta, (wire::kFeatureSpares | wire::kFeatureChannel | wire::kFeatureStaging |
                     wire::kFeatureArenas | wire::kFeatureGroups | wire::kFeatureResident) &
                        ~withheld_features_.load(std::memory_order_relaxed));
  PutFixed64(&meta, spare_lifetime_ms());  // the copy deadline of spares
  Status sent = SendDescriptor(fd, pass ? region.fd : -1, deadline);
  if (sent.ok()) sent = SendFrame(fd, wire::kAttach, wire::kFlagResponse, 0, meta, {}, deadline);
  return sent;
}

bool LocalServer::Greet(Connection* conn) {
  const Deadline deadline = DeadlineIn(options_.peer_timeout_ms);
  Status s = LocalPeer::Of(conn->fd, &conn->peer);
  if (s.ok() && !access_.Admit(conn->peer, &conn->grant)) {
    s = Status::InvalidArgument("refused: uid " + std::to_string(conn->peer.uid) +
                                " may not attach to " + path_);
    counters_->clients_refused.fetch_add(1);
    logger_->Logf(LogLevel::kWarn,
                  "local: refused pid %d uid %u gid %u on %s: local_allowed_uids names "
                  "neither its uid nor its groups",
                  static_cast<int>(conn->peer.pid), static_cast<unsigned>(conn->peer.uid),
                  static_cast<unsigned>(conn->peer.gid), path_.c_str());
  }
  const Status sent = SendGreeting(conn->fd, s, &conn->grant, deadline);
  // A client gone before its greeting (killed, or one that only connects) costs nothing
  // more; the acceptor closes its socket.
  if (!s.ok() || !sent.ok()) return false;
  counters_->clients_accepted.fetch_add(1);
  return true;
}

void LocalServer::LogLimited(LogLimiter* limiter, const std::string& line, const char* events) {
  uint64_t held_back = 0;
  if (!limiter->Admit(&held_back)) return;
  logger_->Logf(LogLevel::kWarn,
                "%s (and %llu more such %s since the last line; at most one line per %lld s)",
                line.c_str(), static_cast<unsigned long long>(held_back), events,
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::seconds>(limiter->interval()).count()));
}

void LocalServer::Deny(const std::string& who, const Status& why) {
  counters_->namespace_refusals.fetch_add(1, std::memory_order_relaxed);
  LogLimited(&denied_log_, "local: refused a request of " + who + ": " + why.ToString(),
             "refusals");
}

void LocalServer::Refuse(const std::string& who, const Status& why) {
  counters_->clients_malformed.fetch_add(1, std::memory_order_relaxed);
  LogLimited(&malformed_log_,
             "local: closed " + who + " on " + path_ +
                 ": malformed handshake or request: " + why.ToString(),
             "connections");
}

}  // namespace kvengine
