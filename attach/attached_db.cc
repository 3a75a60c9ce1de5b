#include "attach/attached_db.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <unordered_set>

#include "attach/namespace_wire.h"
#include "attach/resident_wire.h"
#include "env/gpu_io.h"
#include "env/owned_fd.h"
#include "env/shared_mapping.h"
#include "transport/busy_poll.h"
#include "transport/read_validation.h"
#include "transport/shm_channel.h"
#include "transport/unix_socket.h"
#include "transport/wire.h"
#include "util/buffers.h"
#include "util/coding.h"
#include "util/input_check.h"
#include "util/key_pattern.h"
#include "util/namespace_key.h"
#include "util/printable.h"
#include "util/prometheus.h"

namespace kvengine {

namespace {

// The client's own checks of one key's buffers, a put's parts or a get's destination:
// none null with a length ("value" or "destination" buffer i of key K is null ...), all
// on one CUDA device, stored in *device (-1: host memory).
template <typename Buffer>
Status CheckBuffers(GpuIo* gpu, const NamespaceKeys& rule, const Slice& key,
                    const std::vector<Buffer>& buffers, const char* what, int* device) {
  // The owner checks the key again (and maps it into the namespace): this only fails early.
  Status s = rule.Check(key);
  if (s.ok()) s = CheckNoNullBuffer(key, buffers, what);
  if (!s.ok()) return s;
  s = gpu->Scan(std::span<const Buffer>(buffers), device);
  return s.ok() ? s : ForKey(key, s);
}

// Fails keys[i] for each i of `which` with Busy: the rounds of a read stalled.
void FailBusy(std::span<const Slice> keys, const std::vector<size_t>& which, const char* why,
              std::vector<int64_t>* results) {
  for (size_t i : which) {
    (*results)[i] = Status::Busy("key " + Printable(keys[i]) + " " + why).ErrorCode();
  }
}

}  // namespace

AttachedDB::AttachedDB(const Options& options, std::string socket_path, std::string name_space)
    : options_(options),
      socket_path_(std::move(socket_path)),
      namespace_(std::move(name_space)),
      // The size limit is the owner's (it checks again): the client's own check is only
      // of what every owner refuses.
      rule_(namespace_.empty()
                ? NamespaceKeys()
                : NamespaceKeys(ns::IdOf(namespace_), std::numeric_limits<uint64_t>::max())) {
  // A log file that cannot be opened leaves stderr, the default.
  Status ignored = logger_.Configure(options_);
  (void)ignored;
}

AttachedDB::~AttachedDB() { Close(); }

// One mapping of the owner's arena (a memfd), identified by the memfd's file: a new
// connection to the same owner shares it, one to a restarted owner maps the new arena.
struct AttachedDB::ArenaMapping {
  std::unique_ptr<SharedMapping> memory;
  SharedMapping::FileId file;
  // Copies between device buffers and this mapping (it page-locks the mapping the first
  // time a device buffer is seen).  Declared after `memory`: destroyed first, so that it
  // unregisters the mapping from CUDA before the mapping goes.
  std::unique_ptr<GpuIo> gpu;
  // The address of [offset, offset + n), or nullptr when outside the mapping (or there
  // is none: a client passed no arena, whose requests with keys the owner refuses).
  char* At(uint64_t offset, uint64_t n) const {
    if (memory == nullptr || offset > memory->size() || n > memory->size() - offset) {
      return nullptr;
    }
    return memory->base() + offset;
  }
};

struct AttachedDB::Connection {
  OwnedFd socket;
  // Set by Lost: the call fails and the connection is not reused.  Its socket stays
  // open until the call gives the connection back, after the call's copies into and out
  // of the arena are done: the owner reclaims a connection's slots and pins when its
  // socket closes, and must not while a DMA still writes or reads them.
  bool lost = false;
  uint64_t generation = 0;
  uint64_t next_request = 0;
  uint64_t reservation_timeout_ms = 0;  // the owner's local_reservation_timeout_ms
  std::shared_ptr<ArenaMapping> arena;  // everything this connection pins is in it
  BusyPollPredictor busy_poll;          // waits for answers, per op
  // Owners that reserve spare slots (wire::kFeatureSpares) give them this long; 0: none.
  uint64_t spare_lifetime_ms = 0;
  uint64_t features = 0;     // the owner's wire::kFeature* bits, from its greeting
  std::vector<Slot> spares;  // reserved for this connection's next put
  // Owners with wire::kFeatureChannel: every frame after the greeting goes through it.
  std::unique_ptr<ShmChannel> channel;
  // Owners with wire::kFeatureStaging: where the owner reads this connection's pins of
  // values that are not in memory (PIN locations marked wire::kPinInWindow).
  std::unique_ptr<SharedMapping> window;
  // Requests sent and not yet answered, oldest first, with where their answers go.
  struct Posted {
    uint8_t op;
    uint64_t id;
    std::string* answer;
  };
  std::vector<Posted> posted;
  explicit Connection(uint64_t busy_poll_us) : busy_poll(busy_poll_us) {}
};

// A connection of the pool for the length of one call.
class AttachedDB::Checkout {
 public:
  explicit Checkout(AttachedDB* db) : db_(db) { status_ = db->Acquire(&conn_); }
  ~Checkout() {
    if (conn_ != nullptr) db_->Release(std::move(conn_));
  }
  Checkout(const Checkout&) = delete;
  Checkout& operator=(const Checkout&) = delete;

  const Status& status() const { return status_; }
  Connection* get() const { return conn_.get(); }

 private:
  AttachedDB* const db_;
  Status status_;
  std::unique_ptr<Connection> conn_;
};

Status AttachedDB::Connect() {
  Checkout c(this);
  return c.status();
}

Status AttachedDB::Close() {
  std::vector<std::unique_ptr<Connection>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::OK();
    closed_ = true;
    idle.swap(idle_);
    open_ -= idle.size();
  }
  released_.notify_all();
  return Status::OK();  // connections in use close as their calls end
}

Status AttachedDB::Acquire(std::unique_ptr<Connection>* conn) {
  std::vector<std::unique_ptr<Connection>> retired;  // closed outside mu_
  uint64_t generation;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (closed_) return Status::Aborted("DB is closed");
      while (!idle_.empty()) {
        std::unique_ptr<Connection> c = std::move(idle_.back());
        idle_.pop_back();
        if (c->generation == generation_) {
          *conn = std::move(c);
          return Status::OK();
        }
        retired.push_back(std::move(c));
        open_--;
      }
      if (open_ < max_open_) break;
      released_.wait(lock);
    }
    open_++;
    generation = generation_;
  }
  auto c = std::make_unique<Connection>(options_.local_busy_poll_us);
  c->generation = generation;
  Status s = Open(c.get());
  if (!s.ok()) {
    bool wait_for_one = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_--;
      // The owner serves as many connections as its descriptor budget allows: this
      // client makes do with those it has.
      if (s.IsBusy() && open_ > 0) {
        max_open_ = open_;
        wait_for_one = true;
      }
    }
    released_.notify_one();
    return wait_for_one ? Acquire(conn) : s;
  }
  *conn = std::move(c);
  return Status::OK();
}

void AttachedDB::Release(std::unique_ptr<Connection> conn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_ && !conn->lost && conn->socket.valid() && conn->generation == generation_) {
      idle_.push_back(std::move(conn));
    } else {
      open_--;
    }
  }
  released_.notify_one();
  // A connection not kept is closed here, outside mu_ (its mapping may be the last).
}

Status AttachedDB::Gone() const {
  return Status::IOError("attached DB at " + socket_path_, "the connection was lost earlier");
}

Status AttachedDB::Lost(Connection* conn, const std::string& what) {
  conn->lost = true;  // closed by Release, once the call is over
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_++;  // the idle ones most likely lost their owner too
  }
  return Status::IOError("attached DB at " + socket_path_, what);
}

Status AttachedDB::Open(Connection* conn) {
  const Deadline deadline = DeadlineIn(options_.peer_timeout_ms);
  int fd = -1;
  Status s = ConnectUnix(socket_path_, deadline, &fd);
  if (!s.ok()) return Status::IOError("attached DB at " + socket_path_, s.ToString());
  conn->socket.Reset(fd);
  int received = -1;
  s = ReceiveDescriptor(conn->socket.get(), deadline, &received);
  const OwnedFd arena_fd(received);  // closed on every path: a mapping keeps the memory
  wire::FrameHeader h;
  std::string meta;
  if (s.ok()) s = ReadFrame(conn->socket.get(), deadline, &h, &meta);
  std::string_view in(meta);
  Status owner;
  uint64_t size = 0;
  if (s.ok() &&
      (h.op != wire::kAttach || !wire::GetBatchStatus(&in, &owner) || !GetFixed64(&in, &size))) {
    s = Status::Corruption("malformed greeting from the owner");
  }
  if (!s.ok() || !owner.ok()) return s.ok() ? owner : Lost(conn, s.ToString());
  uint64_t timeout_ms = 0;  // sent by owners that reclaim idle reservations
  conn->reservation_timeout_ms = GetFixed64(&in, &timeout_ms) ? timeout_ms : 0;
  uint64_t features = 0, spare_lifetime_ms = 0;  // sent by owners that have features
  const bool has_features = GetFixed64(&in, &features);
  conn->features = features;
  if (has_features && (features & wire::kFeatureSpares) && GetFixed64(&in, &spare_lifetime_ms)) {
    conn->spare_lifetime_ms = spare_lifetime_ms;
  }
  // An owner with arenas per trust boundary passes the default arena only to a client
  // whose grant reaches it, and a namespace's arena with OPEN_ARENA (before the channel).
  const bool arenas = (features & wire::kFeatureArenas) != 0;
  OwnedFd namespace_arena;
  if (arenas && !namespace_.empty()) {
    s = OpenArena(conn, deadline, &namespace_arena, &size);
    if (!s.ok()) return s;
  }
  const OwnedFd& mapped_fd = namespace_arena.valid() ? namespace_arena : arena_fd;
  SharedMapping::FileId file;
  if (!mapped_fd.valid() && !(arenas && size == 0)) {
    return Lost(conn, Status::Corruption("no arena was passed").ToString());
  }
  if (mapped_fd.valid()) {
    s = SharedMapping::Identify(mapped_fd.get(), &file);
    if (!s.ok()) return Lost(conn, s.ToString());
  }
  if (features & wire::kFeatureStaging) {  // on the socket: before the channel
    s = OpenStaging(conn, deadline);
    if (!s.ok()) return s;
  }
  if ((features & wire::kFeatureChannel) && options_.local_shared_channel) {
    s = OpenChannel(conn, deadline);
    if (!s.ok()) return s;
  }
  s = mapped_fd.valid() ? MapArena(conn, mapped_fd.get(), file, size) : NoArena(conn);
  if (!s.ok() || namespace_.empty() || arenas) return s;  // OPEN_ARENA bound it
  return UseNamespace(conn);
}

Status AttachedDB::OpenArena(Connection* conn, Deadline deadline, OwnedFd* memfd, uint64_t* size) {
  std::string meta, rest;
  PutLengthPrefixed(&meta, namespace_);
  Status owner;
  Status s = RequestRegion(conn, wire::kOpenArena, deadline, memfd, &owner, &rest, meta);
  if (!s.ok()) return Lost(conn, s.ToString());
  if (!owner.ok()) return owner;  // the connection closes with the failed Open
  std::string_view in(rest);
  uint64_t ns_id = 0;
  if (!GetFixed64(&in, &ns_id) || !GetFixed64(&in, size) || ns_id != ns::IdOf(namespace_) ||
      !memfd->valid() || *size == 0) {
    return Lost(conn, "malformed answer to OPEN_ARENA");
  }
  return Status::OK();
}

Status AttachedDB::NoArena(Connection* conn) {
  // The owner passed no arena: the client's grant holds no namespace of the default
  // arena, so the owner refuses every request of this handle that has keys; the
  // namespaces it may use are opened with OpenNamespace, each with its own arena.
  conn->arena = std::make_shared<ArenaMapping>();
  conn->arena->gpu = std::make_unique<GpuIo>(options_, &logger_, nullptr, 0);
  return Status::OK();
}

Status AttachedDB::UseNamespace(Connection* conn) {
  std::string meta, answer;
  PutLengthPrefixed(&meta, namespace_);
  Status s = Call(conn, wire::kUseNamespace, meta, &answer);
  if (!s.ok()) return s;
  std::string_view in(answer);
  Status owner;
  uint64_t id = 0;
  if (!wire::GetBatchStatus(&in, &owner)) return Lost(conn, "malformed answer to USE_NAMESPACE");
  if (!owner.ok()) return owner;  // the connection closes with the failed Open
  if (!GetFixed64(&in, &id) || id != ns::IdOf(namespace_)) {
    return Lost(conn, "malformed answer to USE_NAMESPACE");
  }
  return Status::OK();
}

Status AttachedDB::MapArena(Connection* conn, int fd, const SharedMapping::FileId& file,
                            uint64_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<ArenaMapping> shared = arena_.lock();
    if (shared != nullptr && shared->file == file && shared->memory->size() == size) {
      conn->arena = std::move(shared);
      return Status::OK();
    }
  }
  // Page tables of this mapping are the client's own: without them every first touch of
  // a page by a copy would fault (measured: vllm_write at 64 KiB 7x slower).  Huge pages
  // when the owner's memfd has them; prefaulted like the owner's arena.
  auto mapping = std::make_shared<ArenaMapping>();
  Status s = SharedMapping::Map(fd, size, options_.prefault_memory, &mapping->memory);
  if (!s.ok()) return Lost(conn, "cannot map the arena: " + s.ToString());
  mapping->file = file;
  mapping->gpu = std::make_unique<GpuIo>(options_, &logger_, mapping->memory->base(), size);
  conn->arena = mapping;
  std::lock_guard<std::mutex> lock(mu_);
  arena_ = mapping;
  return Status::OK();
}

Status AttachedDB::RequestRegion(Connection* conn, uint8_t op, Deadline deadline, OwnedFd* memfd,
                                 Status* owner, std::string* rest, const std::string& meta) {
  const uint64_t id = ++conn->next_request;
  Status s = SendFrame(conn->socket.get(), op, 0, id, meta, {}, deadline);
  int received = -1;
  if (s.ok()) s = ReceiveDescriptor(conn->socket.get(), deadline, &received);
  memfd->Reset(received);  // the caller's to close: a mapping keeps the region
  wire::FrameHeader h;
  if (s.ok()) s = ReadFrame(conn->socket.get(), deadline, &h, rest);
  std::string_view in(*rest);
  if (s.ok() && (h.op != op || h.request_id != id || !wire::GetBatchStatus(&in, owner))) {
    s = Status::Corruption("malformed answer to op " + std::to_string(op));
  }
  if (s.ok()) *rest = std::string(in);
  return s;
}

Status AttachedDB::OpenChannel(Connection* conn, Deadline deadline) {
  OwnedFd memfd;
  Status owner;
  std::string rest;
  Status s = RequestRegion(conn, wire::kOpenChannel, deadline, &memfd, &owner, &rest);
  if (s.ok() && owner.ok()) {
    s = !memfd.valid() ? Status::Corruption("no shared channel was passed")
                       : ShmChannel::Attach(memfd.get(), conn->socket.get(),
                                            options_.local_busy_poll_us, &conn->channel);
  }
  // An owner that could not set one up (out of memory) serves the socket as before.
  return s.ok() ? Status::OK() : Lost(conn, s.ToString());
}

Status AttachedDB::OpenStaging(Connection* conn, Deadline deadline) {
  OwnedFd memfd;
  Status owner;
  std::string rest;
  Status s = RequestRegion(conn, wire::kOpenStaging, deadline, &memfd, &owner, &rest);
  std::string_view in(rest);
  uint64_t size = 0;
  if (s.ok() && owner.ok()) {
    // Not prefaulted: the window's pages exist only while the owner stages values in it.
    s = !memfd.valid() || !GetFixed64(&in, &size)
            ? Status::Corruption("no staging window was passed")
            : SharedMapping::Map(memfd.get(), size, false, &conn->window);
  }
  // An owner that could not make one (out of memory) stages in the arena, as before.
  return s.ok() ? Status::OK() : Lost(conn, s.ToString());
}

Status AttachedDB::Call(Connection* conn, uint8_t op, const std::string& meta,
                        std::string* answer) {
  Status s = Post(conn, op, meta, answer);
  return s.ok() ? CollectAnswers(conn) : s;
}

Status AttachedDB::Post(Connection* conn, uint8_t op, const std::string& meta,
                        std::string* answer) {
  Status s = Send(conn, op, meta);
  if (s.ok()) conn->posted.push_back({op, conn->next_request, answer});
  return s;
}

Status AttachedDB::PostAll(Connection* conn, uint8_t op, const std::vector<std::string>& metas,
                           std::vector<std::string>* answers) {
  answers->resize(metas.size());
  if (conn->channel == nullptr) {
    for (size_t i = 0; i < metas.size(); i++) {
      Status s = Post(conn, op, metas[i], &(*answers)[i]);
      if (!s.ok()) return s;
    }
    return Status::OK();
  }
  if (conn->lost) return Gone();
  std::vector<ShmChannel::OutFrame> frames(metas.size());
  for (size_t i = 0; i < metas.size(); i++) frames[i] = {op, 0, ++conn->next_request, &metas[i]};
  Status s = conn->channel->SendFrames(frames, DeadlineIn(options_.peer_timeout_ms));
  if (!s.ok()) return Lost(conn, s.ToString());
  for (size_t i = 0; i < metas.size(); i++) {
    conn->posted.push_back({op, frames[i].request_id, &(*answers)[i]});
  }
  return Status::OK();
}

Status AttachedDB::CollectAnswers(Connection* conn, size_t count) {
  if (conn->lost) return Gone();
  const Deadline deadline = DeadlineIn(options_.peer_timeout_ms);
  count = std::min(count, conn->posted.size());
  for (size_t i = 0; i < count; i++) {  // the owner answers in order
    const Connection::Posted& p = conn->posted[i];
    Status s = ReadAnswer(conn, p.op, p.id, deadline, p.answer);
    if (!s.ok()) {
      conn->posted.clear();  // the connection is lost with them
      return s;
    }
  }
  conn->posted.erase(conn->posted.begin(), conn->posted.begin() + count);
  return Status::OK();
}

Status AttachedDB::ReadAnswer(Connection* conn, uint8_t op, uint64_t id, Deadline deadline,
                              std::string* answer) {
  if (conn->lost) return Gone();
  wire::FrameHeader h;
  Status s;
  if (conn->channel != nullptr) {
    bool arrived = false;
    s = conn->channel->WaitForFrame(op, deadline, nullptr, /*spin=*/true, &arrived);
    if (s.ok() && !arrived) s = Status::IOError("receive timed out");
    if (s.ok()) s = conn->channel->ReadFrame(deadline, &h, answer);
  } else {
    const auto began = BusyPollPredictor::Clock::now();
    conn->busy_poll.Spin(conn->socket.get(), op);  // the owner usually answers in microseconds
    s = ReadFrame(conn->socket.get(), deadline, &h, answer);
    if (s.ok()) conn->busy_poll.Done(op, began);
  }
  if (s.ok() && (h.op != op || h.request_id != id || !(h.flags & wire::kFlagResponse))) {
    s = Status::IOError("answer out of step with the request");
  }
  return s.ok() ? s : Lost(conn, s.ToString());
}

Status AttachedDB::Send(Connection* conn, uint8_t op, const std::string& meta) {
  if (conn->lost) return Gone();
  const Deadline deadline = DeadlineIn(options_.peer_timeout_ms);
  const uint64_t id = ++conn->next_request;
  Status s = conn->channel != nullptr
                 ? conn->channel->SendFrame(op, 0, id, meta, deadline)
                 : SendFrame(conn->socket.get(), op, 0, id, meta, {}, deadline);
  return s.ok() ? s : Lost(conn, s.ToString());
}

uint64_t AttachedDB::GroupBytes(const std::vector<uint64_t>& sizes) {
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  return std::max(kMinGroupBytes, total / kMaxGroups);
}

Status AttachedDB::CallForResults(uint8_t op, const std::string& meta, size_t expected,
                                  std::vector<int64_t>* results) {
  results->clear();
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  std::string answer;
  Status s = Call(c.get(), op, meta, &answer);
  if (!s.ok()) return s;
  std::string_view in(answer);
  Status batch;
  if (!wire::GetBatchStatus(&in, &batch)) return Lost(c.get(), "malformed answer");
  if (!batch.ok()) return batch;
  if (!wire::GetResults(&in, results) || results->size() != expected) {
    results->clear();
    return Lost(c.get(), "malformed answer");
  }
  return Status::OK();
}

Status AttachedDB::CallForCount(uint8_t op, const std::string& meta, uint64_t* count) {
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  std::string answer;
  Status s = Call(c.get(), op, meta, &answer);
  if (!s.ok()) return s;
  std::string_view in(answer);
  Status batch;
  uint64_t n = 0;
  if (!wire::GetBatchStatus(&in, &batch) || !GetFixed64(&in, &n))
    return Lost(c.get(), "malformed answer");
  if (count != nullptr) *count = n;
  return batch;
}

// ------------------------------------------------------------------ puts

// The values of a BatchPut that passed the client's own checks, in the batch's order:
// each goes to the owner, into the slot TakeSlots found for it.
struct AttachedDB::PutPlan {
  std::vector<size_t> index;  // the value's index in the batch
  std::vector<Slice> keys;
  std::vector<uint64_t> sizes;
  std::vector<int> devices;  // the CUDA device of the value's parts; -1: host memory
  std::vector<Slot> slots;
};

// One BatchPut's copies into its slots and the commits that publish them, on one
// connection.  Each value is copied into its slot: the one copy of its bytes.  Owners
// with spares take the commits in groups while the rest is copied: the owner publishes
// a group (and reserves the next put's spares with the first) on its own core
// meanwhile, so that only the last group's commit is waited for.  (Only batches whose
// answers all fit in the channel or socket at once: answers are read at the end, and an
// owner stuck writing one would stop reading requests.)
//
// Values in device memory are queued ahead of the one being waited for, so that the bus
// moves key after key, and each is waited for where a host value is copied.  A slot's
// deadline is checked before its copy is queued; at most gpu_staging_bytes are queued
// ahead, so that a copy starts soon after that check.  (Copies still in flight when the
// call fails are waited for before the connection closes: see Lost.)
class AttachedDB::PutRun {
 public:
  PutRun(AttachedDB* db, Connection* conn, std::span<const ValueParts> values, const PutPlan& plan,
         std::vector<int64_t>* results)
      : db_(db),
        conn_(conn),
        values_(values),
        plan_(plan),
        results_(results),
        with_spares_(conn->spare_lifetime_ms > 0),
        pipelined_(with_spares_ && plan.keys.size() <= kMaxPipelinedKeys),
        per_group_(GroupBytes(plan.sizes)),
        device_copies_(conn->arena->gpu.get()),
        queued_(plan.keys.size(), kNotQueued) {}

  // Copies every value into its slot and publishes them, storing each key's outcome in
  // its result.  Fails as a whole when whether the owner published them is unknown.
  Status Run() {
    for (size_t j = 0; j < plan_.keys.size(); j++) {
      Status s = CopyOne(j);
      if (!s.ok()) return s;
    }
    if (groups_.empty() && committed_.empty() && unused_.empty()) return Status::OK();
    if (!with_spares_) return CommitPlain();
    Status s;
    if (groups_.empty() || posted_ < commit_keys_.size() || !unused_.empty()) s = PostGroup();
    if (s.ok()) s = db_->CollectAnswers(conn_);
    return s.ok() ? ReadGroups() : s;
  }

 private:
  static constexpr size_t kNotQueued = ~size_t{0};

  // Copies value j into its slot, or fails its key; posts the group being built once it
  // holds enough.  A failure is the connection's.
  Status CopyOne(size_t j) {
    const Slot& slot = plan_.slots[j];
    const size_t i = plan_.index[j];
    if (slot.code < 0) {
      (*results_)[i] = slot.code;
      return Status::OK();
    }
    char* dst = conn_->arena->At(slot.offset, plan_.sizes[j]);
    if (dst == nullptr) return db_->Lost(conn_, "slot outside the arena");
    const bool on_device = plan_.devices[j] >= 0;
    if (on_device) QueueDeviceCopies(j);
    if (on_device ? queued_[j] == kNotQueued : Clock::now() >= slot.copy_deadline) {
      // The owner may soon give the slot to another value (a device value's slot was
      // checked when its copy would have been queued).
      (*results_)[i] = Status::Aborted("the copy into the reserved slot came too late").ErrorCode();
      unused_.push_back(slot.id);
      return Status::OK();
    }
    if (on_device) {  // device -> the slot, queued
      Status copied = device_copies_.Wait(queued_[j]);
      queued_ahead_ -= plan_.sizes[j];
      if (!copied.ok()) {  // not committed: given back
        (*results_)[i] = copied.ErrorCode();
        unused_.push_back(slot.id);
        return Status::OK();
      }
    } else {
      GatherCopy(values_[i], plan_.sizes[j], dst);
    }
    commit_keys_.push_back(plan_.keys[j]);
    ids_.push_back(slot.id);
    committed_.push_back(i);
    group_bytes_ += plan_.sizes[j];
    const bool more = j + 1 < plan_.keys.size();
    return pipelined_ && group_bytes_ >= per_group_ && more ? PostGroup() : Status::OK();
  }

  // Queues the device copies of the values up to `last`, and of the ones after it while
  // less than gpu_staging_bytes are queued ahead.
  void QueueDeviceCopies(size_t last) {
    for (; next_to_queue_ < plan_.keys.size() &&
           (next_to_queue_ <= last || queued_ahead_ < db_->options_.gpu_staging_bytes);
         next_to_queue_++) {
      const size_t j = next_to_queue_;
      const Slot& slot = plan_.slots[j];
      if (plan_.devices[j] < 0 || slot.code < 0 || Clock::now() >= slot.copy_deadline) continue;
      char* dst = conn_->arena->At(slot.offset, plan_.sizes[j]);
      if (dst == nullptr) continue;  // reported when CopyOne reaches it
      queued_[j] = device_copies_.FromDevice(plan_.keys[j].ToString(), plan_.devices[j],
                                             values_[plan_.index[j]], dst, plan_.sizes[j]);
      queued_ahead_ += plan_.sizes[j];
    }
  }

  // Posts the values copied since the last group as one COMMIT_RESERVE; the first
  // group also gives back the spares this put did not use and asks for the next put's.
  Status PostGroup() {
    CommitGroup& g = groups_.emplace_back();
    g.first = posted_;
    g.count = commit_keys_.size() - posted_;
    posted_ = commit_keys_.size();
    if (groups_.size() == 1) {
      // Spares of other sizes than this put's, or too old to copy into, go back; the
      // next put's are reserved.
      for (const Slot& spare : conn_->spares) unused_.push_back(spare.id);
      conn_->spares.clear();
      g.wanted = plan_.sizes;
    }
    std::string meta;
    wire::PutKeys(&meta, std::span<const Slice>(commit_keys_).subspan(g.first, g.count),
                  ids_.data() + g.first);
    wire::PutResults(&meta, std::vector<int64_t>(unused_.begin(), unused_.end()));
    wire::PutResults(&meta, std::vector<int64_t>(g.wanted.begin(), g.wanted.end()));
    unused_.clear();
    group_bytes_ = 0;
    g.sent = Clock::now();
    return db_->Post(conn_, wire::kCommitReserve, meta, &g.answer);
  }

  // Reads each group's answer: its keys' results, and the spares it reserved.
  Status ReadGroups() {
    for (const CommitGroup& g : groups_) {
      std::string_view in(g.answer);
      Status batch;
      std::vector<int64_t> published, reserved;
      std::vector<RemoteLocation> locs;
      if (!wire::GetBatchStatus(&in, &batch)) return db_->Lost(conn_, "malformed answer to COMMIT");
      if (!batch.ok()) return batch;
      if (!wire::GetResults(&in, &published) || published.size() != g.count ||
          !DecodeLocations(&in, &reserved, &locs) || reserved.size() != g.wanted.size()) {
        return db_->Lost(conn_, "malformed answer to COMMIT");
      }
      for (size_t k = 0; k < g.count; k++) (*results_)[committed_[g.first + k]] = published[k];
      db_->AddSpares(conn_, g.sent, g.wanted, reserved, locs);
    }
    return Status::OK();
  }

  // An owner without COMMIT_RESERVE: one plain COMMIT of every value copied.
  Status CommitPlain() {
    std::vector<int64_t> published;
    Status s = db_->CommitSlots(conn_, commit_keys_, ids_, &published);
    if (!s.ok()) return s;
    for (size_t j = 0; j < committed_.size(); j++) (*results_)[committed_[j]] = published[j];
    return Status::OK();
  }

  AttachedDB* const db_;
  Connection* const conn_;
  const std::span<const ValueParts> values_;
  const PutPlan& plan_;
  std::vector<int64_t>* const results_;
  const bool with_spares_;
  const bool pipelined_;
  const uint64_t per_group_;
  GpuIo::Queue device_copies_;
  std::vector<size_t> queued_;  // per value: its device copy's number, or kNotQueued
  size_t next_to_queue_ = 0;
  uint64_t queued_ahead_ = 0;  // bytes queued and not yet waited for
  // The values copied, to be committed: keys, slot ids and indexes in the batch.
  std::vector<Slice> commit_keys_;
  std::vector<uint64_t> ids_;
  std::vector<size_t> committed_;
  std::vector<uint64_t> unused_;    // slots to give back with the next group
  std::deque<CommitGroup> groups_;  // posted, answers pending
  size_t posted_ = 0;               // commit_keys_ posted in groups so far
  uint64_t group_bytes_ = 0;        // of the values copied since the last group
};

void AttachedDB::PlanPut(GpuIo* gpu, std::span<const Slice> keys,
                         std::span<const ValueParts> values, PutPlan* plan,
                         std::vector<int64_t>* results, Status* refusal) const {
  for (size_t i = 0; i < keys.size(); i++) {
    int device = -1;
    Status s = CheckBuffers(gpu, rule_, keys[i], values[i], "value", &device);
    if (!s.ok()) {
      (*results)[i] = s.ErrorCode();
      if (refusal != nullptr && refusal->ok()) *refusal = s;
      continue;
    }
    plan->index.push_back(i);
    plan->keys.push_back(keys[i]);
    plan->sizes.push_back(PartsSize(values[i]));
    plan->devices.push_back(device);
  }
}

Status AttachedDB::BatchPut(const WriteOptions&, std::span<const Slice> keys,
                            std::span<const ValueParts> values, std::vector<int64_t>* results) {
  return PutValues(keys, values, results, nullptr);
}

Status AttachedDB::PutValues(std::span<const Slice> keys, std::span<const ValueParts> values,
                             std::vector<int64_t>* results, Status* refusal) {
  Status s = PutValuesUncounted(keys, values, results, refusal);
  if (results == nullptr) return s;
  AttachedClientCounters::CountResults(s, keys.size(), *results, &counters_.puts, nullptr,
                                       &counters_.put_failures, nullptr);
  for (size_t i = 0; s.ok() && i < results->size() && i < values.size(); i++) {
    if ((*results)[i] >= 0) counters_.put_bytes.fetch_add(PartsSize(values[i]));
  }
  return s;
}

Status AttachedDB::PutValuesUncounted(std::span<const Slice> keys,
                                      std::span<const ValueParts> values,
                                      std::vector<int64_t>* results, Status* refusal) {
  Status s = input::CheckBatch("BatchPut", results, keys.size(), values.size(), "values", 0);
  if (s.ok()) s = input::CheckUniqueKeys(keys);
  if (!s.ok()) return s;
  results->clear();
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  GpuIo* gpu = c.get()->arena->gpu.get();
  gpu->BeginBatch();
  results->assign(keys.size(), 0);
  PutPlan plan;
  PlanPut(gpu, keys, values, &plan, results, refusal);
  if (plan.keys.empty()) return Status::OK();
  // A slot for each value: a spare of its size left by the previous put when there is
  // one (no round trip), else reserved now.
  s = TakeSlots(c.get(), plan.keys, plan.sizes, &plan.slots);
  if (s.ok()) s = PutRun(this, c.get(), values, plan, results).Run();
  // A value whose copy missed its slot's deadline (a host that stalled the copier, a
  // batch bigger than half the owner's timeout can copy) was not published: it goes
  // again into slots reserved now, as long as the rounds get some of them in, rather
  // than fail a put the owner would take.  A loaded host can stall the copier past the
  // timeout for a whole round (one Aborted key in twelve loaded runs of
  // AttachTest.ValuesCopiedTooLateGoAgainIntoNewSlots gave up after one such round), so
  // only kMaxRoundsWithoutProgress of them in a row end it.  Only keys answered Aborted:
  // any other outcome is final.
  constexpr int kMaxRoundsWithoutProgress = 3;
  const int64_t aborted = Status::Aborted("").ErrorCode();
  size_t late = SIZE_MAX;
  for (int idle = 0; s.ok();) {
    PutPlan again;
    for (size_t j = 0; j < plan.keys.size(); j++) {
      if ((*results)[plan.index[j]] != aborted) continue;
      again.index.push_back(plan.index[j]);
      again.keys.push_back(plan.keys[j]);
      again.sizes.push_back(plan.sizes[j]);
      again.devices.push_back(plan.devices[j]);
    }
    if (again.keys.empty()) break;  // all in
    idle = again.keys.size() < late ? 0 : idle + 1;
    if (idle == kMaxRoundsWithoutProgress) break;  // they stay Aborted
    late = again.keys.size();
    s = TakeSlots(c.get(), again.keys, again.sizes, &again.slots, /*fresh=*/true);
    if (s.ok()) s = PutRun(this, c.get(), values, again, results).Run();
    plan = std::move(again);
  }
  // Whether the owner published them is unknown: every key of the batch fails.
  if (!s.ok()) results->clear();
  return s;
}

Status AttachedDB::TakeSlots(Connection* conn, const std::vector<Slice>& keys,
                             const std::vector<uint64_t>& sizes, std::vector<Slot>* slots,
                             bool fresh) {
  slots->assign(keys.size(), Slot());
  const Clock::time_point now = Clock::now();
  std::vector<Slice> need_keys;
  std::vector<uint64_t> need_sizes;
  std::vector<size_t> need;
  for (size_t j = 0; j < keys.size(); j++) {
    auto spare = fresh ? conn->spares.end()
                       : std::find_if(conn->spares.begin(), conn->spares.end(), [&](const Slot& x) {
                           return x.size == sizes[j] && now < x.copy_deadline;
                         });
    if (spare != conn->spares.end()) {
      (*slots)[j] = *spare;
      conn->spares.erase(spare);
    } else {
      need.push_back(j);
      need_keys.push_back(keys[j]);
      need_sizes.push_back(sizes[j]);
    }
  }
  if (need.empty()) return Status::OK();
  std::string meta, answer;
  wire::PutKeys(&meta, need_keys, need_sizes.data());
  // The owner reclaims the slots local_reservation_timeout_ms after it received this
  // request; they are written only within half of that from before it was sent.
  const Clock::time_point sent = Clock::now();
  Status s = Call(conn, wire::kReserve, meta, &answer);
  if (!s.ok()) return s;
  const Clock::time_point copy_deadline =
      conn->reservation_timeout_ms == 0
          ? Clock::time_point::max()
          : sent + std::chrono::milliseconds(conn->reservation_timeout_ms) / 2;
  std::string_view in(answer);
  Status batch;
  std::vector<int64_t> reserved;
  std::vector<RemoteLocation> locs;
  if (!wire::GetBatchStatus(&in, &batch) ||
      (batch.ok() && (!DecodeLocations(&in, &reserved, &locs) || reserved.size() != need.size()))) {
    return Lost(conn, "malformed answer to RESERVE");
  }
  if (!batch.ok()) return batch;
  for (size_t k = 0; k < need.size(); k++) {
    (*slots)[need[k]] = {reserved[k], locs[k].offset, need_sizes[k], locs[k].lease, copy_deadline};
  }
  return Status::OK();
}

Status AttachedDB::CommitSlots(Connection* conn, const std::vector<Slice>& keys,
                               const std::vector<uint64_t>& ids, std::vector<int64_t>* published) {
  if (keys.empty()) return Status::OK();  // unused slots go back at the owner's timeout
  std::string meta, answer;
  wire::PutKeys(&meta, keys, ids.data());
  Status s = Call(conn, wire::kCommit, meta, &answer);
  if (!s.ok()) return s;
  std::string_view in(answer);
  Status batch;
  if (!wire::GetBatchStatus(&in, &batch)) return Lost(conn, "malformed answer to COMMIT");
  if (!batch.ok()) return batch;
  if (!wire::GetResults(&in, published) || published->size() != keys.size()) {
    return Lost(conn, "malformed answer to COMMIT");
  }
  return Status::OK();
}

void AttachedDB::AddSpares(Connection* conn, Clock::time_point sent,
                           const std::vector<uint64_t>& sizes, const std::vector<int64_t>& reserved,
                           const std::vector<RemoteLocation>& locs) {
  const Clock::time_point copy_deadline =
      sent + std::chrono::milliseconds(conn->spare_lifetime_ms) / 2;
  for (size_t k = 0; k < reserved.size(); k++) {
    if (reserved[k] >= 0 && locs[k].size == sizes[k]) {
      conn->spares.push_back({reserved[k], locs[k].offset, sizes[k], locs[k].lease, copy_deadline});
    }
  }
}

Status AttachedDB::Put(const WriteOptions&, const Slice& key, const Slice& value) {
  const ValueParts parts{value};
  std::vector<int64_t> results;
  Status refusal;  // the client's own check's, which names the problem
  Status s = PutValues(std::span<const Slice>(&key, 1), std::span<const ValueParts>(&parts, 1),
                       &results, &refusal);
  if (!s.ok()) return s;
  if (!refusal.ok()) return refusal;
  if (results[0] == Status::Aborted("").ErrorCode()) {
    return Status::Aborted("put: the owner reclaimed the reserved slot before the commit",
                           "the put took longer than local_reservation_timeout_ms");
  }
  if (results[0] == Status::NoSpace("").ErrorCode()) {
    // The owner's reason -- its tier full, or the namespace at its memory quota, named
    // with the quota -- is in the owner's log: the answer carries only the code.
    return Status::NoSpace("put of key " + Printable(key) +
                               (namespace_.empty() ? "" : " in namespace '" + namespace_ + "'"),
                           "the owner found no room: its memory tier (or the namespace's arena) "
                           "is full of values that cannot go, or the namespace is at its memory "
                           "quota; the owner's log names which");
  }
  return results[0] == 0
             ? Status::OK()
             : Status::FromErrorCode(static_cast<int>(results[0]), "put of key " + Printable(key));
}

// ------------------------------------------------------------------ gets

// A BatchGetInto's destinations after the client's own checks, and the groups its keys
// are pinned in: the client copies out one group while the owner pins the next.
struct AttachedDB::GetPlan {
  std::vector<uint64_t> capacity;  // of each key's destination; 0 for a refused key
  std::vector<int64_t> refused;    // the key's error code before any request; 0: none
  std::vector<int> devices;        // the destination's CUDA device; -1: host memory
  std::vector<size_t> bounds;      // group g is keys [bounds[g], bounds[g + 1])
  size_t groups() const { return bounds.size() - 1; }
};

// One BatchGetInto's reads of its pinned values, on one connection: each group's pins
// are read as the owner answers them and copied out of the arena (the one copy of their
// bytes), then every pin is released with one UNPIN.  Copies to device memory are
// queued as their keys come, back to back on the bus, and waited for before the pins are
// released.
class AttachedDB::GetRun {
 public:
  // The answers are those of the plan's groups' PINs, posted (answers[g] group g's), or,
  // with `grouped` set, the frames of the one PIN_GROUPS request `grouped` names, read
  // here as they come; then, when `on_group` is set, on_group(g) runs once group g's
  // values are in their destinations (device copies included), before the next group's
  // answer is read.
  struct Grouped {
    uint64_t request = 0;  // the PIN_GROUPS request's id
    // `whole`: none of the group's keys was answered wire::kPinLater.
    std::function<void(size_t group, bool whole)> on_group;
  };
  GetRun(AttachedDB* db, Connection* conn, std::span<const Slice> keys,
         std::span<const Destination> destinations, const GetPlan& plan,
         std::vector<std::string>* answers, std::vector<int64_t>* results,
         const Grouped* grouped = nullptr)
      : db_(db),
        conn_(conn),
        keys_(keys),
        destinations_(destinations),
        plan_(plan),
        answers_(answers),
        results_(results),
        grouped_(grouped),
        device_copies_(conn->arena->gpu.get()) {
    PutFixed32(&unpin_, 0);  // the count, set once known
  }

  Status Run() {
    Status s;
    for (size_t g = 0; s.ok() && g < plan_.groups(); g++) {
      std::vector<int64_t> pinned;
      std::vector<RemoteLocation> locs;
      s = ReadPins(g, &pinned, &locs);
      for (size_t k = 0; s.ok() && k < pinned.size(); k++) {
        s = CopyOut(plan_.bounds[g] + k, pinned[k], locs[k]);
      }
      if (s.ok() && grouped_ != nullptr && grouped_->on_group) {
        WaitForDeviceCopies();
        grouped_->on_group(g, later_.empty() || later_.back() < plan_.bounds[g]);
      }
    }
    // The owner's error on a PIN_GROUPS ends it: the pins of the groups read go back.
    if (!s.ok() && (grouped_ == nullptr || conn_->lost)) return s;
    WaitForDeviceCopies();
    if (leases_ > 0) {
      std::memcpy(unpin_.data(), &leases_, 4);  // fixed32 is little-endian, as the host
      // Not waited for; a failure drops the connection, and the owner's pins with it.
      (void)db_->Send(conn_, wire::kUnpin, unpin_);
    }
    return s;
  }

  // The keys the owner answered wire::kPinLater: its staging window was full of this
  // batch's values, so they are read in another round, after the UNPIN.
  const std::vector<size_t>& later() const { return later_; }

 private:
  // Waits for the answer to group g's PIN and decodes it.
  Status ReadPins(size_t g, std::vector<int64_t>* pinned, std::vector<RemoteLocation>* locs) {
    Status s = grouped_ == nullptr
                   ? db_->CollectAnswers(conn_, 1)
                   : db_->ReadAnswer(conn_, wire::kPinGroups, grouped_->request,
                                     DeadlineIn(db_->options_.peer_timeout_ms), &(*answers_)[g]);
    if (!s.ok()) return s;
    std::string_view in((*answers_)[g]);
    Status batch;
    const size_t count = plan_.bounds[g + 1] - plan_.bounds[g];
    if (!wire::GetBatchStatus(&in, &batch) ||
        (batch.ok() && (!DecodeLocations(&in, pinned, locs) || pinned->size() != count))) {
      return db_->Lost(conn_, "malformed answer to PIN");
    }
    // Answers of later groups are still on their way: the connection cannot go on (an
    // error is the last answer to a PIN_GROUPS).
    if (!batch.ok() && grouped_ == nullptr && g + 1 < plan_.groups()) {
      return db_->Lost(conn_, batch.ToString());
    }
    return batch;
  }

  // Waits for the device copies queued so far; a copy that failed fails its key.
  void WaitForDeviceCopies() {
    for (const auto& [i, copy] : queued_) {
      Status copied = device_copies_.Wait(copy);
      if (!copied.ok()) (*results_)[i] = copied.ErrorCode();
    }
    queued_.clear();
  }

  // Copies key i's value, pinned at `loc` (pinned: 0) or not (its error code, or
  // kPinLater), into its destination, and adds its lease to the UNPIN.  A failure is
  // the connection's.
  Status CopyOut(size_t i, int64_t pinned, const RemoteLocation& loc) {
    if (pinned == wire::kPinLater && plan_.refused[i] == 0) {
      later_.push_back(i);
      return Status::OK();
    }
    if (pinned != kLookupPinned) {
      (*results_)[i] = plan_.refused[i] != 0 ? plan_.refused[i] : pinned;
      return Status::OK();
    }
    // In the connection's staging window (a value read from SSD or a peer), or in place
    // in the arena.
    const bool in_window = loc.version == wire::kPinInWindow;
    if (in_window && conn_->window == nullptr) return db_->Lost(conn_, "no staging window");
    const char* src = in_window ? (loc.offset <= conn_->window->size() &&
                                           loc.size <= conn_->window->size() - loc.offset
                                       ? conn_->window->base() + loc.offset
                                       : nullptr)
                                : conn_->arena->At(loc.offset, loc.size);
    if (src == nullptr) return db_->Lost(conn_, "value outside the arena");
    if (plan_.refused[i] != 0) {
      (*results_)[i] = plan_.refused[i];
    } else if (plan_.devices[i] >= 0) {  // host -> device straight from the arena
      queued_.emplace_back(
          i, device_copies_.ToDevice(keys_[i].ToString(), plan_.devices[i], Slice(src, loc.size),
                                     !in_window, destinations_[i]));
      (*results_)[i] = static_cast<int64_t>(loc.size);
    } else {
      ScatterCopy(src, loc.size, destinations_[i]);
      (*results_)[i] = static_cast<int64_t>(loc.size);
    }
    PutFixed64(&unpin_, loc.lease);
    leases_++;
    return Status::OK();
  }

  AttachedDB* const db_;
  Connection* const conn_;
  const std::span<const Slice> keys_;
  const std::span<const Destination> destinations_;
  const GetPlan& plan_;
  std::vector<std::string>* const answers_;  // to each group's PIN, as they arrive
  std::vector<int64_t>* const results_;
  const Grouped* const grouped_;  // null: PINs, posted
  GpuIo::Queue device_copies_;
  std::vector<std::pair<size_t, size_t>> queued_;  // (key, device copy)
  std::string unpin_;                              // the UNPIN request, growing
  uint32_t leases_ = 0;
  std::vector<size_t> later_;  // keys for another round
};

void AttachedDB::PlanGet(GpuIo* gpu, std::span<const Slice> keys,
                         std::span<const Destination> destinations, GetPlan* plan,
                         Status* refusal) const {
  plan->capacity.assign(keys.size(), 0);
  plan->refused.assign(keys.size(), 0);
  plan->devices.assign(keys.size(), -1);
  for (size_t i = 0; i < keys.size(); i++) {
    Status s = CheckBuffers(gpu, rule_, keys[i], destinations[i], "destination", &plan->devices[i]);
    if (!s.ok()) {
      plan->refused[i] = s.ErrorCode();  // still pinned, with no room: the owner's answer
      if (refusal != nullptr && refusal->ok()) *refusal = s;
      continue;
    }
    for (const MutableSlice& d : destinations[i]) plan->capacity[i] += d.size();
  }
  // Groups of at least GroupBytes; batches too large to pipeline make one.
  plan->bounds = {0};
  uint64_t group_bytes = 0;
  const uint64_t per_group = GroupBytes(plan->capacity);
  for (size_t i = 0; i + 1 < keys.size() && keys.size() <= kMaxPipelinedKeys; i++) {
    group_bytes += plan->capacity[i];
    if (group_bytes >= per_group) {
      plan->bounds.push_back(i + 1);
      group_bytes = 0;
    }
  }
  plan->bounds.push_back(keys.size());
}

Status AttachedDB::BatchGetInto(const ReadOptions&, std::span<const Slice> keys,
                                std::span<const Destination> destinations,
                                std::vector<int64_t>* results) {
  return GetValues(keys, destinations, results, nullptr);
}

Status AttachedDB::GetValues(std::span<const Slice> keys, std::span<const Destination> destinations,
                             std::vector<int64_t>* results, Status* refusal) {
  return CountGets(GetValuesUncounted(keys, destinations, results, refusal), keys.size(), results);
}

Status AttachedDB::CountGets(const Status& s, size_t keys, const std::vector<int64_t>* results) {
  if (results != nullptr) {
    AttachedClientCounters::CountResults(s, keys, *results, &counters_.gets, &counters_.get_bytes,
                                         &counters_.get_failures, &counters_.misses);
  }
  return s;
}

Status AttachedDB::GetValuesUncounted(std::span<const Slice> keys,
                                      std::span<const Destination> destinations,
                                      std::vector<int64_t>* results, Status* refusal) {
  Status s = input::CheckBatch("BatchGetInto", results, keys.size(), destinations.size(),
                               "destinations", 0);
  if (!s.ok()) return s;
  results->clear();
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  GpuIo* gpu = c.get()->arena->gpu.get();
  gpu->BeginBatch();
  // In rounds: the keys the owner could not stage in this connection's window with the
  // round's other values go again, once the round's pins are released.  Every round
  // reads at least one of them unless values keep changing size under the reads.
  std::vector<int64_t> round_results;
  std::vector<size_t> later;
  s = GetRound(c.get(), gpu, keys, destinations, refusal, &round_results, &later);
  if (!s.ok()) return s;
  *results = std::move(round_results);
  std::vector<size_t> todo = later;  // indices into keys
  for (int stalls = 0; !todo.empty();) {
    std::vector<Slice> round_keys;
    std::vector<Destination> round_dest;
    for (size_t i : todo) {
      round_keys.push_back(keys[i]);
      round_dest.push_back(destinations[i]);
    }
    s = GetRound(c.get(), gpu, round_keys, round_dest, nullptr, &round_results, &later);
    if (!s.ok()) {
      results->clear();
      return s;
    }
    stalls = later.size() == todo.size() ? stalls + 1 : 0;
    std::vector<size_t> next;
    for (size_t k = 0; k < todo.size(); k++) (*results)[todo[k]] = round_results[k];
    for (size_t k : later) next.push_back(todo[k]);
    todo = std::move(next);
    if (stalls >= kMaxStalledRounds) {
      FailBusy(keys, todo, "kept changing size while it was read", results);
      break;
    }
  }
  return Status::OK();
}

Status AttachedDB::GetRound(Connection* conn, GpuIo* gpu, std::span<const Slice> keys,
                            std::span<const Destination> destinations, Status* refusal,
                            std::vector<int64_t>* results, std::vector<size_t>* later) {
  GetPlan plan;
  PlanGet(gpu, keys, destinations, &plan, refusal);
  // Every group's pins are asked for at once.
  std::vector<std::string> metas(plan.groups()), answers;
  for (size_t g = 0; g < plan.groups(); g++) {
    wire::PutKeys(&metas[g], keys.subspan(plan.bounds[g], plan.bounds[g + 1] - plan.bounds[g]),
                  plan.capacity.data() + plan.bounds[g]);
  }
  Status s = PostAll(conn, wire::kPin, metas, &answers);
  if (!s.ok()) return s;
  results->assign(keys.size(), 0);
  GetRun run(this, conn, keys, destinations, plan, &answers, results);
  s = run.Run();
  if (!s.ok()) results->clear();
  *later = run.later();
  return s;
}

Status AttachedDB::BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                                      std::span<const Destination> destinations,
                                      std::span<const size_t> group_ends,
                                      const GroupReadyFn& on_ready, std::vector<int64_t>* results) {
  bool fallback = false;
  Status s = GroupsUncounted(keys, destinations, group_ends, on_ready, results, &fallback);
  if (!fallback) return CountGets(s, keys.size(), results);
  // An owner without PIN_GROUPS: one BatchGetInto per group (counted there).
  return DB::BatchGetIntoGroups(options, keys, destinations, group_ends, on_ready, results);
}

Status AttachedDB::GroupsUncounted(std::span<const Slice> keys,
                                   std::span<const Destination> destinations,
                                   std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                                   std::vector<int64_t>* results, bool* fallback) {
  Status s = input::CheckGroupedBatch(results, keys.size(), destinations.size(), group_ends);
  if (!s.ok()) return s;
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  if ((c.get()->features & wire::kFeatureGroups) == 0) {
    *fallback = true;  // the connection goes back first: the fallback takes one
    return Status::OK();
  }
  results->assign(keys.size(), 0);
  GpuIo* gpu = c.get()->arena->gpu.get();
  gpu->BeginBatch();
  // Rounds: each asks for the keys not read yet of the groups not reported yet, in one
  // PIN_GROUPS.  A round reports its groups up to the first with a key the owner's
  // staging window had no room for; that key and the rest go in the next round, once
  // the round's pins are released (the window empty again).
  const size_t groups = group_ends.size();
  size_t reported = 0;  // groups reported so far
  std::vector<size_t> todo(keys.size());
  for (size_t i = 0; i < todo.size(); i++) todo[i] = i;
  for (int stalls = 0; reported < groups;) {
    std::vector<Slice> round_keys;
    std::vector<Destination> round_dest;
    std::vector<size_t> round_ends, index;  // index: the round's keys' in `keys`
    for (size_t g = reported, t = 0; g < groups; g++) {
      for (; t < todo.size() && todo[t] < group_ends[g]; t++) {
        round_keys.push_back(keys[todo[t]]);
        round_dest.push_back(destinations[todo[t]]);
        index.push_back(todo[t]);
      }
      round_ends.push_back(round_keys.size());
    }
    if (round_keys.empty()) break;  // the groups left are read (or empty)
    std::vector<int64_t> round_results;
    std::vector<size_t> later;
    const size_t first = reported;
    bool blocked = false;  // a group of the round waits for the next round
    auto on_group = [&](size_t k, bool whole) {
      for (size_t j = k == 0 ? 0 : round_ends[k - 1]; j < round_ends[k]; j++) {
        (*results)[index[j]] = round_results[j];  // those deferred are read again
      }
      blocked = blocked || !whole;
      if (blocked) return;
      reported = first + k + 1;
      if (!on_ready) return;
      try {
        on_ready(first + k);
      } catch (...) {
        // The later groups' answers are still coming: the connection cannot be reused.
        Lost(c.get(), "on_ready threw");
        throw;
      }
    };
    s = GroupRound(c.get(), gpu, round_keys, round_dest, round_ends, on_group, &round_results,
                   &later);
    if (!s.ok()) return s;  // the groups reported stay so
    stalls = later.size() == round_keys.size() ? stalls + 1 : 0;
    todo.clear();
    for (size_t j : later) todo.push_back(index[j]);
    if (stalls >= kMaxStalledRounds) {
      FailBusy(keys, todo, "found no room in the staging window", results);
      break;
    }
  }
  for (; reported < groups; reported++) {
    if (on_ready) on_ready(reported);
  }
  return Status::OK();
}

Status AttachedDB::GroupRound(Connection* conn, GpuIo* gpu, std::span<const Slice> keys,
                              std::span<const Destination> destinations,
                              std::span<const size_t> ends,
                              const std::function<void(size_t, bool)>& on_group,
                              std::vector<int64_t>* results, std::vector<size_t>* later) {
  GetPlan plan;
  PlanGet(gpu, keys, destinations, &plan, nullptr);
  plan.bounds.assign(1, 0);  // the caller's groups, not PlanGet's
  plan.bounds.insert(plan.bounds.end(), ends.begin(), ends.end());
  std::string meta;
  wire::PutKeys(&meta, keys, plan.capacity.data());
  wire::PutResults(&meta, std::vector<int64_t>(ends.begin(), ends.end()));
  Status s = Send(conn, wire::kPinGroups, meta);
  if (!s.ok()) return s;
  results->assign(keys.size(), 0);
  std::vector<std::string> answers(plan.groups());
  const GetRun::Grouped grouped{conn->next_request, on_group};
  GetRun run(this, conn, keys, destinations, plan, &answers, results, &grouped);
  s = run.Run();
  *later = run.later();
  return s;
}

Status AttachedDB::GetInto(const ReadOptions&, const Slice& key, MutableSlice buffer,
                           size_t* value_size) {
  const Destination dest{buffer};
  std::vector<int64_t> results;
  Status refusal;  // the client's own check's, which names the problem
  Status s = GetValues(std::span<const Slice>(&key, 1), std::span<const Destination>(&dest, 1),
                       &results, &refusal);
  if (!s.ok()) return s;
  if (results[0] >= 0) {
    *value_size = static_cast<size_t>(results[0]);
    return Status::OK();
  }
  if (!refusal.ok()) return refusal;
  if (results[0] == Status::BufferTooSmall("").ErrorCode()) {
    uint64_t size = 0;
    if (GetValueSize(key, &size).ok()) *value_size = size;
  }
  return Status::FromErrorCode(static_cast<int>(results[0]), "get of key " + Printable(key));
}

Status AttachedDB::Get(const ReadOptions& options, const Slice& key, std::string* value) {
  // Sized first, then read; a value that grew in between is read again.
  for (int attempt = 0; attempt < 4; attempt++) {
    uint64_t size = 0;
    Status s = GetValueSize(key, &size);
    if (!s.ok()) return s;
    value->resize(size);
    size_t got = 0;
    s = GetInto(options, key, MutableSlice(value->data(), size), &got);
    if (s.ok()) {
      value->resize(got);
      return s;
    }
    if (!s.IsBufferTooSmall()) return s;
  }
  return Status::Busy("value kept changing size while it was read");
}

Status AttachedDB::GetValueSize(const Slice& key, uint64_t* size) {
  std::string meta;
  wire::PutKeys(&meta, std::span<const Slice>(&key, 1), nullptr);
  std::vector<int64_t> results;
  Status s = CallForResults(wire::kValueSize, meta, 1, &results);
  if (!s.ok()) return s;
  if (results[0] < 0) {
    return Status::FromErrorCode(static_cast<int>(results[0]),
                                 "value size of key " + Printable(key));
  }
  *size = static_cast<uint64_t>(results[0]);
  return Status::OK();
}

// ------------------------------------------------------------------ plain requests

Status AttachedDB::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  Status s = input::CheckBatch("BatchExists", results, keys.size(), keys.size(), "keys", 0);
  if (!s.ok()) return s;
  std::string meta;
  wire::PutKeys(&meta, keys, nullptr);
  counters_.exists_queries.fetch_add(keys.size());
  return CallForResults(wire::kExists, meta, keys.size(), results);
}

Status AttachedDB::Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) {
  Status s = input::CheckBatch("Prefetch", results, keys.size(), keys.size(), "keys", 0);
  if (!s.ok()) return s;
  std::string meta;
  wire::PutKeys(&meta, keys, nullptr);
  return CallForResults(wire::kPrefetch, meta, keys.size(), results);
}

Status AttachedDB::BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) {
  Status s = input::CheckBatch("BatchLocate", results, keys.size(), keys.size(), "keys", 0);
  if (!s.ok()) return s;
  std::string meta;
  wire::PutKeys(&meta, keys, nullptr);
  return CallForResults(wire::kLocate, meta, keys.size(), results);
}

Status AttachedDB::ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) {
  if (batch == nullptr) return Status::InvalidArgument("ReadRemovals: batch is null");
  *batch = RemovalBatch();
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  std::string meta, answer;
  PutFixed64(&meta, after);
  PutFixed64(&meta, max_events);
  Status s = Call(c.get(), wire::kReadRemovals, meta, &answer);
  if (!s.ok()) return s;
  std::string_view in(answer);
  Status owner;
  if (!wire::GetBatchStatus(&in, &owner)) return Lost(c.get(), "malformed answer");
  if (!owner.ok()) return owner;
  if (!wire::GetRemovalBatch(&in, batch)) {
    *batch = RemovalBatch();
    return Lost(c.get(), "malformed answer to READ_REMOVALS");
  }
  return Status::OK();
}

Status AttachedDB::ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                                ResidentSnapshot* snapshot) {
  if (snapshot == nullptr || !batch) {
    return Status::InvalidArgument("ReadResident: snapshot or batch is null");
  }
  *snapshot = ResidentSnapshot();
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  Connection* conn = c.get();
  if ((conn->features & wire::kFeatureResident) == 0) {
    return Status::NotSupported("ReadResident: the owner at " + socket_path_ +
                                " predates READ_RESIDENT");
  }
  // Until the stream's END, the connection is in the middle of it: leaving early (an
  // exception out of `batch`) must not give it back to the pool in that state.
  struct MidStream {
    Connection* conn;
    bool ended = false;
    ~MidStream() {
      if (!ended) conn->lost = true;
    }
  } mid{conn};
  std::string meta, answer;
  wire::PutResidentStart(&meta, prefix.view(), max_batch);
  std::vector<ResidentKey> keys;
  uint64_t delivered = 0;
  for (;;) {
    Status s = Call(conn, wire::kReadResident, meta, &answer);
    if (!s.ok()) return s;
    std::string_view in(answer);
    Status owner;
    if (!wire::GetBatchStatus(&in, &owner)) return Lost(conn, "malformed answer to READ_RESIDENT");
    mid.ended = !owner.ok();
    if (!owner.ok()) return owner;  // ends the stream
    bool end = false;
    ResidentSnapshot got;
    if (!wire::GetResidentAnswer(&in, &end, &keys, &got) ||
        (!end && (keys.empty() || keys.size() > max_batch))) {
      return Lost(conn, "malformed answer to READ_RESIDENT");
    }
    if (end) {
      mid.ended = true;
      *snapshot = got;
      snapshot->keys = delivered;
      return Status::OK();
    }
    delivered += keys.size();
    const bool more = batch(keys);
    meta.clear();
    wire::PutResidentStep(&meta, more ? wire::kResidentNext : wire::kResidentStop);
  }
}

Status AttachedDB::BatchDelete(const WriteOptions&, std::span<const Slice> keys,
                               std::vector<int64_t>* results) {
  Status s = input::CheckBatch("BatchDelete", results, keys.size(), keys.size(), "keys", 0);
  if (!s.ok()) return s;
  std::string meta;
  wire::PutKeys(&meta, keys, nullptr);
  s = CallForResults(wire::kDelete, meta, keys.size(), results);
  for (size_t i = 0; s.ok() && i < results->size(); i++) counters_.deletes += (*results)[i] == 0;
  return s;
}

Status AttachedDB::Delete(const WriteOptions& options, const Slice& key) {
  std::vector<int64_t> results;
  Status s = BatchDelete(options, std::span<const Slice>(&key, 1), &results);
  if (!s.ok()) return s;
  return results[0] == 0 ? Status::OK()
                         : Status::FromErrorCode(static_cast<int>(results[0]),
                                                 "delete of key " + Printable(key));
}

Status AttachedDB::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
  // Refused here too, so that a pattern the owner would refuse is not sent at all.
  KeyPattern re;
  Status s = re.Compile(pattern);
  if (!s.ok()) return s;
  std::string meta;
  wire::PutDeleteMatching(&meta, wire::kMatchRegex, pattern);
  return CallForCount(wire::kDeleteMatching, meta, deleted);
}

Status AttachedDB::DeleteAll(uint64_t* deleted) {
  std::string meta;
  wire::PutDeleteMatching(&meta, wire::kMatchAll, "");
  return CallForCount(wire::kDeleteMatching, meta, deleted);
}

Status AttachedDB::Flush() {
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  std::string answer;
  Status s = Call(c.get(), wire::kFlush, "", &answer);
  if (!s.ok()) return s;
  std::string_view in(answer);
  Status owner;
  if (!wire::GetBatchStatus(&in, &owner)) return Lost(c.get(), "malformed answer to FLUSH");
  return owner;
}

Status AttachedDB::CompactBuckets(uint64_t* reclaimed_bytes) {
  return CallForCount(wire::kCompactBuckets, "", reclaimed_bytes);
}

bool AttachedDB::GetProperty(const std::string& name, std::string* value) {
  if (name == "kvengine.attached") {  // answered here: the owner does not know it
    *value = socket_path_;
    return true;
  }
  if (name == "kvengine.namespace" && !namespace_.empty()) {
    *value = namespace_;
    return true;
  }
  if (name == "kvengine.metrics") {  // this client's own calls, and its process's perf
    Exposition e;
    AppendPerfFamilies(&e);
    *value = e.Take();
    counters_.AppendPrometheus(value);
    return true;
  }
  Checkout c(this);
  if (!c.status().ok()) return false;
  std::string meta, answer;
  PutLengthPrefixed(&meta, name);
  if (!Call(c.get(), wire::kProperty, meta, &answer).ok()) return false;
  std::string_view in(answer), text;
  Status known;
  if (!wire::GetBatchStatus(&in, &known) || !GetLengthPrefixed(&in, &text) || !known.ok()) {
    return false;
  }
  value->assign(text);
  return true;
}

// Buffers are the caller's own: nothing to register with the owner, but the rules on
// overlap are the same as a local DB's.
Status AttachedDB::RegisterBuffer(void* addr, size_t length) {
  return registered_buffers_.Add(addr, length, "RegisterBuffer");
}

Status AttachedDB::UnregisterBuffer(void* addr) {
  if (registered_buffers_.Remove(addr) == 0) {
    return Status::NotFound("UnregisterBuffer: no registered buffer starts at this address");
  }
  return Status::OK();
}

}  // namespace kvengine

namespace kvengine {

// ------------------------------------------------------------------ namespaces

Status AttachedDB::NotNested(const char* call) const {
  if (namespace_.empty()) return Status::OK();
  return Status::InvalidArgument(std::string("namespaces do not nest: ") + call +
                                 " on the DB, not on the handle of namespace '" + namespace_ + "'");
}

Status AttachedDB::CreateNamespace(const std::string& name, const NamespaceOptions& options,
                                   std::unique_ptr<DB>* handle) {
  handle->reset();
  Status s = NotNested("CreateNamespace");
  if (!s.ok()) return s;
  std::string meta;
  wire::PutCreateNamespace(&meta, name, options);
  s = CallForCount(wire::kCreateNamespace, meta, nullptr);
  return s.ok() ? OpenNamespace(name, handle) : s;
}

Status AttachedDB::OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) {
  handle->reset();
  Status s = NotNested("OpenNamespace");
  // Checked here too: an empty name would bind the handle to the default namespace.
  if (s.ok()) s = input::CheckNamespaceName(name);
  if (!s.ok()) return s;
  auto db = std::make_unique<AttachedDB>(options_, socket_path_, name);
  s = db->Connect();  // its first connection, bound to the namespace, or the refusal
  if (!s.ok()) return s;
  *handle = std::move(db);
  return Status::OK();
}

Status AttachedDB::DropNamespace(const std::string& name, uint64_t* deleted) {
  if (deleted != nullptr) *deleted = 0;
  Status s = NotNested("DropNamespace");
  if (!s.ok()) return s;
  std::string meta;
  PutLengthPrefixed(&meta, name);
  return CallForCount(wire::kDropNamespace, meta, deleted);
}

Status AttachedDB::ListNamespaces(std::vector<NamespaceInfo>* namespaces) {
  if (namespaces == nullptr) return Status::InvalidArgument("ListNamespaces: result is null");
  namespaces->clear();
  Status s = NotNested("ListNamespaces");
  if (!s.ok()) return s;
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  std::string answer;
  s = Call(c.get(), wire::kListNamespaces, "", &answer);
  if (!s.ok()) return s;
  std::string_view in(answer);
  Status owner;
  if (!wire::GetBatchStatus(&in, &owner)) return Lost(c.get(), "malformed answer");
  if (!owner.ok()) return owner;
  if (!wire::GetNamespaceList(&in, namespaces) || !in.empty()) {
    namespaces->clear();
    return Lost(c.get(), "malformed answer to LIST_NAMESPACES");
  }
  return Status::OK();
}

}  // namespace kvengine
