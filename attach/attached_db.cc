#include "attach/attached_db.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <unordered_set>

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

namespace kvengine {

namespace {

uint64_t PartsTotal(const ValueParts& parts) {
  uint64_t n = 0;
  for (const Slice& p : parts) n += p.size();
  return n;
}

}  // namespace

AttachedDB::AttachedDB(const Options& options, std::string socket_path)
    : options_(options), socket_path_(std::move(socket_path)) {
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
  // The address of [offset, offset + n), or nullptr when outside the mapping.
  char* At(uint64_t offset, uint64_t n) const {
    if (offset > memory->size() || n > memory->size() - offset) return nullptr;
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
  std::vector<Slot> spares;  // reserved for this connection's next put
  // Owners with wire::kFeatureChannel: every frame after the greeting goes through it.
  std::unique_ptr<ShmChannel> channel;
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
      if (open_ < kMaxConnections) break;
      released_.wait(lock);
    }
    open_++;
    generation = generation_;
  }
  auto c = std::make_unique<Connection>(options_.local_busy_poll_us);
  c->generation = generation;
  Status s = Open(c.get());
  if (!s.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_--;
    }
    released_.notify_one();
    return s;
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
  if (s.ok() && owner.ok() && !arena_fd.valid()) s = Status::Corruption("no arena was passed");
  SharedMapping::FileId file;
  if (s.ok() && owner.ok()) s = SharedMapping::Identify(arena_fd.get(), &file);
  if (!s.ok() || !owner.ok()) return s.ok() ? owner : Lost(conn, s.ToString());
  uint64_t timeout_ms = 0;  // sent by owners that reclaim idle reservations
  conn->reservation_timeout_ms = GetFixed64(&in, &timeout_ms) ? timeout_ms : 0;
  uint64_t features = 0, spare_lifetime_ms = 0;  // sent by owners that have features
  if (GetFixed64(&in, &features) && (features & wire::kFeatureSpares) &&
      GetFixed64(&in, &spare_lifetime_ms)) {
    conn->spare_lifetime_ms = spare_lifetime_ms;
  }
  if ((features & wire::kFeatureChannel) && options_.local_shared_channel) {
    s = OpenChannel(conn, deadline);
    if (!s.ok()) return s;
  }
  return MapArena(conn, arena_fd.get(), file, size);
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

Status AttachedDB::OpenChannel(Connection* conn, Deadline deadline) {
  const uint64_t id = ++conn->next_request;
  Status s = SendFrame(conn->socket.get(), wire::kOpenChannel, 0, id, "", {}, deadline);
  int received = -1;
  if (s.ok()) s = ReceiveDescriptor(conn->socket.get(), deadline, &received);
  const OwnedFd memfd(received);  // closed on every path: the mapping keeps the region
  wire::FrameHeader h;
  std::string meta;
  if (s.ok()) s = ReadFrame(conn->socket.get(), deadline, &h, &meta);
  std::string_view in(meta);
  Status owner;
  if (s.ok() &&
      (h.op != wire::kOpenChannel || h.request_id != id || !wire::GetBatchStatus(&in, &owner))) {
    s = Status::Corruption("malformed answer to OPEN_CHANNEL");
  }
  if (s.ok() && owner.ok()) {
    s = !memfd.valid() ? Status::Corruption("no shared channel was passed")
                       : ShmChannel::Attach(memfd.get(), conn->socket.get(),
                                            options_.local_busy_poll_us, &conn->channel);
  }
  // An owner that could not set one up (out of memory) serves the socket as before.
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
    wire::FrameHeader h;
    Status s;
    if (conn->channel != nullptr) {
      bool arrived = false;
      s = conn->channel->WaitForFrame(p.op, deadline, nullptr, /*spin=*/true, &arrived);
      if (s.ok() && !arrived) s = Status::IOError("receive timed out");
      if (s.ok()) s = conn->channel->ReadFrame(deadline, &h, p.answer);
    } else {
      const auto began = BusyPollPredictor::Clock::now();
      conn->busy_poll.Spin(conn->socket.get(), p.op);  // the owner usually answers in microseconds
      s = ReadFrame(conn->socket.get(), deadline, &h, p.answer);
      if (s.ok()) conn->busy_poll.Done(p.op, began);
    }
    if (s.ok() && (h.op != p.op || h.request_id != p.id || !(h.flags & wire::kFlagResponse))) {
      s = Status::IOError("answer out of step with the request");
    }
    if (!s.ok()) {
      conn->posted.clear();  // the connection is lost with them
      return Lost(conn, s.ToString());
    }
  }
  conn->posted.erase(conn->posted.begin(), conn->posted.begin() + count);
  return Status::OK();
}

Status AttachedDB::Send(Connection* conn, uint8_t op, const std::string& meta) {
  if (conn->lost) return Gone();
  const Deadline deadline = DeadlineIn(options_.peer_timeout_ms);
  const uint64_t id = ++conn->next_request;
  Status s = conn->channel != nullptr ? conn->channel->SendFrame(op, 0, id, meta, deadline)
                                      : SendFrame(conn->socket.get(), op, 0, id, meta, {}, deadline);
  return s.ok() ? s : Lost(conn, s.ToString());
}

uint64_t AttachedDB::GroupBytes(const std::vector<uint64_t>& sizes) {
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  return std::max(kMinGroupBytes, total / kMaxGroups);
}

Status AttachedDB::CheckBatch(size_t keys, size_t others, const void* results,
                              const char* what) const {
  if (results == nullptr) return Status::InvalidArgument("results pointer is null");
  if (keys != others) {
    return Status::InvalidArgument(std::to_string(keys) + " keys but " + std::to_string(others) +
                                   " " + what);
  }
  return Status::OK();
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

Status AttachedDB::BatchPut(const WriteOptions&, std::span<const Slice> keys,
                            std::span<const ValueParts> values, std::vector<int64_t>* results) {
  Status s = CheckBatch(keys.size(), values.size(), results, "values");
  if (!s.ok()) return s;
  results->clear();
  if (keys.size() > 1) {
    std::unordered_set<std::string_view> seen;
    for (const Slice& key : keys) {
      if (!seen.insert(key.view()).second) {
        return Status::InvalidArgument("BatchPut names a key more than once; nothing was written");
      }
    }
  }
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  GpuIo* gpu = c.get()->arena->gpu.get();
  gpu->BeginBatch();
  results->assign(keys.size(), 0);
  // Keys whose buffers are fine go to the owner; sent[j] is their index in keys, and
  // devices[j] the CUDA device of its buffers (-1: host memory).
  std::vector<size_t> sent;
  std::vector<Slice> sent_keys;
  std::vector<uint64_t> sizes;
  std::vector<int> devices;
  for (size_t i = 0; i < keys.size(); i++) {
    bool ok = true;
    for (const Slice& part : values[i]) ok = ok && (part.data() != nullptr || part.size() == 0);
    int device = -1;
    Status scanned = ok ? gpu->Scan(values[i], &device) : Status::InvalidArgument("");
    if (!scanned.ok()) {
      (*results)[i] = scanned.ErrorCode();
      continue;
    }
    sent.push_back(i);
    sent_keys.push_back(keys[i]);
    sizes.push_back(PartsTotal(values[i]));
    devices.push_back(device);
  }
  if (sent.empty()) return Status::OK();

  // A slot for each value: a spare of its size left by the previous put when there is
  // one (no round trip), else reserved now.
  std::vector<Slot> slots;
  s = TakeSlots(c.get(), sent_keys, sizes, &slots);
  if (!s.ok()) {
    results->clear();
    return s;
  }
  // Copy each value into its slot: the one copy of its bytes.  Owners with spares take
  // the commits in groups while the rest is copied: the owner publishes a group (and
  // reserves the next put's spares with the first) on its own core meanwhile, so that
  // only the last group's commit is waited for.
  Connection* conn = c.get();
  // (Only batches whose answers all fit in the channel or socket at once: answers are
  // read at the end, and an owner stuck writing one would stop reading requests.)
  const bool with_spares = conn->spare_lifetime_ms > 0;
  const bool pipelined = with_spares && sent.size() <= kMaxPipelinedKeys;
  std::vector<Slice> commit_keys;
  std::vector<uint64_t> ids, unused;
  std::vector<size_t> committed;
  std::deque<CommitGroup> groups;  // posted, answers pending
  size_t posted = 0;               // commit_keys posted in groups so far
  uint64_t group_bytes = 0;
  const uint64_t per_group = GroupBytes(sizes);
  // Values in device memory are queued ahead of the one being waited for, so that the
  // bus moves key after key, and each is waited for where a host value is copied.  A
  // slot's deadline is checked before its copy is queued; at most gpu_staging_bytes are
  // queued ahead, so that a copy starts soon after that check.  (Copies still in flight
  // when the call fails are waited for before the connection closes: see Lost.)
  GpuIo::Queue device_copies(gpu);
  constexpr size_t kNotQueued = ~size_t{0};
  std::vector<size_t> queued(sent.size(), kNotQueued);
  size_t next_to_queue = 0;
  uint64_t queued_ahead = 0;  // bytes queued and not yet waited for
  auto queue_through = [&](size_t last) {
    for (; next_to_queue < sent.size() &&
           (next_to_queue <= last || queued_ahead < options_.gpu_staging_bytes);
         next_to_queue++) {
      const size_t j = next_to_queue;
      if (devices[j] < 0 || slots[j].code < 0 || Clock::now() >= slots[j].copy_deadline) continue;
      char* dst = conn->arena->At(slots[j].offset, sizes[j]);
      if (dst == nullptr) continue;  // reported when the loop below reaches it
      queued[j] = device_copies.FromDevice(sent_keys[j].ToString(), devices[j], values[sent[j]],
                                           dst, sizes[j]);
      queued_ahead += sizes[j];
    }
  };
  auto post_group = [&] {
    CommitGroup& g = groups.emplace_back();
    g.first = posted;
    g.count = commit_keys.size() - posted;
    posted = commit_keys.size();
    if (groups.size() == 1) {
      // Spares of other sizes than this put's, or too old to copy into, go back; the
      // next put's are reserved.
      for (const Slot& spare : conn->spares) unused.push_back(spare.id);
      conn->spares.clear();
      g.wanted = sizes;
    }
    std::string meta;
    wire::PutKeys(&meta, std::span<const Slice>(commit_keys).subspan(g.first, g.count),
                  ids.data() + g.first);
    wire::PutResults(&meta, std::vector<int64_t>(unused.begin(), unused.end()));
    wire::PutResults(&meta, std::vector<int64_t>(g.wanted.begin(), g.wanted.end()));
    unused.clear();
    group_bytes = 0;
    g.sent = Clock::now();
    return Post(conn, wire::kCommitReserve, meta, &g.answer);
  };
  for (size_t j = 0; j < sent.size(); j++) {
    if (slots[j].code < 0) {
      (*results)[sent[j]] = slots[j].code;
      continue;
    }
    char* dst = conn->arena->At(slots[j].offset, sizes[j]);
    if (dst == nullptr) return Lost(conn, "slot outside the arena");
    if (devices[j] >= 0) queue_through(j);
    if (devices[j] >= 0 ? queued[j] == kNotQueued : Clock::now() >= slots[j].copy_deadline) {
      // The owner may soon give the slot to another value (a device value's slot was
      // checked when its copy would have been queued).
      (*results)[sent[j]] = Status::Aborted("").ErrorCode();
      unused.push_back(slots[j].id);
      continue;
    }
    if (devices[j] >= 0) {  // device -> the slot, queued above
      Status copied = device_copies.Wait(queued[j]);
      queued_ahead -= sizes[j];
      if (!copied.ok()) {  // not committed: given back
        (*results)[sent[j]] = copied.ErrorCode();
        unused.push_back(slots[j].id);
        continue;
      }
    } else {
      GatherCopy(values[sent[j]], sizes[j], dst);
    }
    commit_keys.push_back(sent_keys[j]);
    ids.push_back(slots[j].id);
    committed.push_back(sent[j]);
    group_bytes += sizes[j];
    if (pipelined && group_bytes >= per_group && j + 1 < sent.size()) {
      s = post_group();
      if (!s.ok()) {
        results->clear();
        return s;
      }
    }
  }
  if (groups.empty() && committed.empty() && unused.empty()) return Status::OK();
  if (!with_spares) {  // an owner without COMMIT_RESERVE: one plain COMMIT
    std::vector<int64_t> published;
    s = CommitSlots(conn, commit_keys, ids, &published);
    if (!s.ok()) {
      // Whether the owner published them is unknown: every key of the batch fails.
      results->clear();
      return s;
    }
    for (size_t j = 0; j < committed.size(); j++) (*results)[committed[j]] = published[j];
    return Status::OK();
  }
  if (groups.empty() || posted < commit_keys.size() || !unused.empty()) s = post_group();
  if (s.ok()) s = CollectAnswers(conn);
  if (!s.ok()) {
    // Whether the owner published them is unknown: every key of the batch fails.
    results->clear();
    return s;
  }
  for (const CommitGroup& g : groups) {
    std::string_view in(g.answer);
    Status batch;
    std::vector<int64_t> published, reserved;
    std::vector<RemoteLocation> locs;
    if (!wire::GetBatchStatus(&in, &batch)) return Lost(conn, "malformed answer to COMMIT");
    if (!batch.ok()) {
      results->clear();
      return batch;
    }
    if (!wire::GetResults(&in, &published) || published.size() != g.count ||
        !DecodeLocations(&in, &reserved, &locs) || reserved.size() != g.wanted.size()) {
      results->clear();
      return Lost(conn, "malformed answer to COMMIT");
    }
    for (size_t k = 0; k < g.count; k++) (*results)[committed[g.first + k]] = published[k];
    AddSpares(conn, g.sent, g.wanted, reserved, locs);
  }
  return Status::OK();
}

Status AttachedDB::TakeSlots(Connection* conn, const std::vector<Slice>& keys,
                             const std::vector<uint64_t>& sizes, std::vector<Slot>* slots) {
  slots->assign(keys.size(), Slot());
  const Clock::time_point now = Clock::now();
  std::vector<Slice> need_keys;
  std::vector<uint64_t> need_sizes;
  std::vector<size_t> need;
  for (size_t j = 0; j < keys.size(); j++) {
    auto spare = std::find_if(conn->spares.begin(), conn->spares.end(), [&](const Slot& x) {
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

Status AttachedDB::Put(const WriteOptions& options, const Slice& key, const Slice& value) {
  const ValueParts parts{value};
  std::vector<int64_t> results;
  Status s = BatchPut(options, std::span<const Slice>(&key, 1),
                      std::span<const ValueParts>(&parts, 1), &results);
  if (!s.ok()) return s;
  if (results[0] == Status::Aborted("").ErrorCode()) {
    return Status::Aborted("put: the owner reclaimed the reserved slot before the commit",
                           "the put took longer than local_reservation_timeout_ms");
  }
  return results[0] == 0 ? Status::OK()
                         : Status::FromErrorCode(static_cast<int>(results[0]), "put");
}

// ------------------------------------------------------------------ gets

Status AttachedDB::BatchGetInto(const ReadOptions&, std::span<const Slice> keys,
                                std::span<const Destination> destinations,
                                std::vector<int64_t>* results) {
  Status s = CheckBatch(keys.size(), destinations.size(), results, "destinations");
  if (!s.ok()) return s;
  results->clear();
  Checkout c(this);
  if (!c.status().ok()) return c.status();
  GpuIo* gpu = c.get()->arena->gpu.get();
  gpu->BeginBatch();
  std::vector<uint64_t> capacity(keys.size(), 0);
  std::vector<int64_t> bad(keys.size(), 0);  // the key's error code before any request
  std::vector<int> devices(keys.size(), -1);
  for (size_t i = 0; i < keys.size(); i++) {
    for (const MutableSlice& d : destinations[i]) {
      if (d.data() == nullptr && d.size() != 0) bad[i] = Status::InvalidArgument("").ErrorCode();
      capacity[i] += d.size();
    }
    if (bad[i] == 0) {
      Status scanned = gpu->Scan(destinations[i], &devices[i]);
      if (!scanned.ok()) bad[i] = scanned.ErrorCode();
    }
    if (bad[i] != 0) capacity[i] = 0;
  }
  // The keys are pinned in groups, all asked for at once: the client copies out one
  // group while the owner pins the next.
  Connection* conn = c.get();
  std::vector<size_t> bounds{0};  // group g is keys [bounds[g], bounds[g + 1])
  uint64_t group_bytes = 0;
  const uint64_t per_group = GroupBytes(capacity);
  for (size_t i = 0; i + 1 < keys.size() && keys.size() <= kMaxPipelinedKeys; i++) {
    group_bytes += capacity[i];
    if (group_bytes >= per_group) {
      bounds.push_back(i + 1);
      group_bytes = 0;
    }
  }
  bounds.push_back(keys.size());
  const size_t groups = bounds.size() - 1;
  std::vector<std::string> metas(groups), answers;
  for (size_t g = 0; g < groups; g++) {
    wire::PutKeys(&metas[g], keys.subspan(bounds[g], bounds[g + 1] - bounds[g]),
                  capacity.data() + bounds[g]);
  }
  s = PostAll(conn, wire::kPin, metas, &answers);
  if (!s.ok()) return s;
  results->assign(keys.size(), 0);
  std::string unpin;
  uint32_t leases = 0;
  PutFixed32(&unpin, 0);
  std::vector<int64_t> pinned;
  std::vector<RemoteLocation> locs;
  // Copies to device memory are queued as their keys come, back to back on the bus, and
  // waited for before the pins are released.
  GpuIo::Queue device_copies(gpu);
  std::vector<std::pair<size_t, size_t>> queued;  // (key, copy)
  for (size_t i = 0, g = 0; i < keys.size(); i++) {
    if (i == bounds[g]) {  // the next group's pins
      s = CollectAnswers(conn, 1);
      if (!s.ok()) return s;
      std::string_view in(answers[g]);
      Status batch;
      if (!wire::GetBatchStatus(&in, &batch) ||
          (batch.ok() &&
           (!DecodeLocations(&in, &pinned, &locs) || pinned.size() != bounds[g + 1] - bounds[g]))) {
        return Lost(conn, "malformed answer to PIN");
      }
      // Answers of later groups are still on their way: the connection cannot go on.
      if (!batch.ok()) return g + 1 < groups ? Lost(conn, batch.ToString()) : batch;
      g++;
    }
    const size_t k = i - bounds[g - 1];
    if (pinned[k] < 0) {
      (*results)[i] = bad[i] != 0 ? bad[i] : pinned[k];
      continue;
    }
    const char* src = conn->arena->At(locs[k].offset, locs[k].size);
    if (src == nullptr) return Lost(conn, "value outside the arena");
    if (bad[i] != 0) {
      (*results)[i] = bad[i];
    } else if (devices[i] >= 0) {  // host -> device straight from the arena
      queued.emplace_back(
          i, device_copies.ToDevice(keys[i].ToString(), devices[i], Slice(src, locs[k].size), true,
                                    destinations[i]));
      (*results)[i] = static_cast<int64_t>(locs[k].size);
    } else {
      ScatterCopy(src, locs[k].size, destinations[i]);
      (*results)[i] = static_cast<int64_t>(locs[k].size);
    }
    PutFixed64(&unpin, locs[k].lease);
    leases++;
  }
  if (keys.empty()) {  // the one empty group was not read above
    s = CollectAnswers(conn);
    if (!s.ok()) return s;
  }
  for (const auto& [i, copy] : queued) {
    Status copied = device_copies.Wait(copy);
    if (!copied.ok()) (*results)[i] = copied.ErrorCode();
  }
  if (leases > 0) {
    std::memcpy(unpin.data(), &leases, 4);  // fixed32 is little-endian, as the host
    // Not waited for; a failure drops the connection, and the owner's pins with it.
    (void)Send(conn, wire::kUnpin, unpin);
  }
  return Status::OK();
}

Status AttachedDB::GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                           size_t* value_size) {
  const Destination dest{buffer};
  std::vector<int64_t> results;
  Status s = BatchGetInto(options, std::span<const Slice>(&key, 1),
                          std::span<const Destination>(&dest, 1), &results);
  if (!s.ok()) return s;
  if (results[0] >= 0) {
    *value_size = static_cast<size_t>(results[0]);
    return Status::OK();
  }
  if (results[0] == Status::BufferTooSmall("").ErrorCode()) {
    uint64_t size = 0;
    if (GetValueSize(key, &size).ok()) *value_size = size;
  }
  return Status::FromErrorCode(static_cast<int>(results[0]), "get");
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
  if (results[0] < 0) return Status::FromErrorCode(static_cast<int>(results[0]), "value size");
  *size = static_cast<uint64_t>(results[0]);
  return Status::OK();
}

// ------------------------------------------------------------------ plain requests

Status AttachedDB::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  if (results == nullptr) return Status::InvalidArgument("results pointer is null");
  std::string meta;
  wire::PutKeys(&meta, keys, nullptr);
  return CallForResults(wire::kExists, meta, keys.size(), results);
}

Status AttachedDB::BatchDelete(const WriteOptions&, std::span<const Slice> keys,
                               std::vector<int64_t>* results) {
  if (results == nullptr) return Status::InvalidArgument("results pointer is null");
  std::string meta;
  wire::PutKeys(&meta, keys, nullptr);
  return CallForResults(wire::kDelete, meta, keys.size(), results);
}

Status AttachedDB::Delete(const WriteOptions& options, const Slice& key) {
  std::vector<int64_t> results;
  Status s = BatchDelete(options, std::span<const Slice>(&key, 1), &results);
  if (!s.ok()) return s;
  return results[0] == 0 ? Status::OK()
                         : Status::FromErrorCode(static_cast<int>(results[0]), "delete");
}

Status AttachedDB::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
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
  std::lock_guard<std::mutex> lock(mu_);
  const auto start = reinterpret_cast<uintptr_t>(addr);
  if (addr == nullptr || length == 0) return Status::InvalidArgument("empty buffer");
  auto next = registered_buffers_.lower_bound(start);
  if ((next != registered_buffers_.end() && next->first < start + length) ||
      (next != registered_buffers_.begin() &&
       std::prev(next)->first + std::prev(next)->second > start)) {
    return Status::InvalidArgument("buffer overlaps a registered one");
  }
  registered_buffers_[start] = length;
  return Status::OK();
}

Status AttachedDB::UnregisterBuffer(void* addr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (registered_buffers_.erase(reinterpret_cast<uintptr_t>(addr)) == 0) {
    return Status::NotFound("no registered buffer starts there");
  }
  return Status::OK();
}

}  // namespace kvengine
