// The staging pipeline and the host-memory copier.  The CUDA copier and pointer
// detection live in gpu_cuda.cc, the only file that includes CUDA headers.
#include "env/gpu_staging.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

namespace kvengine {

// ---------------------------------------------------------------- HostCopier

struct HostCopier::State {
  struct Op {
    bool is_event = false;
    int event = 0;
    uint64_t generation = 0;
    void* dst = nullptr;
    const void* src = nullptr;
    size_t n = 0;
  };
  struct Stream {
    std::deque<Op> ops;
    Status error;  // first failed copy since the last event recorded here
    std::thread worker;
  };
  struct Event {
    uint64_t recorded = 0;  // generation of the latest RecordEvent
    uint64_t done = 0;      // generation that has completed
    Status status;
  };

  Faults faults;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool initialized = false;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<Event> events;
  uint64_t in_flight = 0;
  Counters counters;
  std::map<void*, size_t> pinned;
  std::map<void*, size_t> registered;

  void Run(int index);
};

void HostCopier::State::Run(int index) {
  Stream& stream = *streams[index];
  std::minstd_rand rng(static_cast<unsigned>(index) * 7919u + 17u);
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    cv.wait(lock, [&] { return stop || !stream.ops.empty(); });
    if (stream.ops.empty()) return;  // stopping, and nothing left to run
    Op op = stream.ops.front();
    stream.ops.pop_front();
    if (op.is_event) {
      Event& e = events[op.event];
      e.done = std::max(e.done, op.generation);
      e.status = std::move(stream.error);
      stream.error = Status::OK();
      cv.notify_all();
      continue;
    }
    const int max_delay = faults.max_delay_us;
    lock.unlock();
    if (max_delay > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % (max_delay + 1)));
    }
    const bool fail = faults.fail_complete && faults.fail_complete(op.dst, op.src, op.n);
    if (!fail && op.n != 0) std::memcpy(op.dst, op.src, op.n);
    lock.lock();
    in_flight--;
    if (fail && stream.error.ok()) {
      stream.error =
          Status::IOError("HostCopier: copy of " + std::to_string(op.n) + " bytes on stream " +
                          std::to_string(index) + " failed (injected fault)");
    }
    cv.notify_all();
  }
}

HostCopier::HostCopier() : HostCopier(Faults()) {}

HostCopier::HostCopier(Faults faults) : state_(std::make_shared<State>()) {
  state_->faults = std::move(faults);
}

HostCopier::~HostCopier() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  for (auto& s : state_->streams) {
    if (s->worker.joinable()) s->worker.join();
  }
  for (auto& [ptr, size] : state_->pinned) std::free(ptr);
}

Status HostCopier::Init(int streams, int events) {
  if (streams < 1 || events < 1) {
    return Status::InvalidArgument("HostCopier::Init: streams and events must be positive");
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->initialized) return Status::InvalidArgument("HostCopier::Init called twice");
  state_->initialized = true;
  state_->events.resize(events);
  for (int i = 0; i < streams; i++) state_->streams.push_back(std::make_unique<State::Stream>());
  for (int i = 0; i < streams; i++) {
    state_->streams[i]->worker = std::thread([state = state_.get(), i] { state->Run(i); });
  }
  return Status::OK();
}

Status HostCopier::AllocatePinned(size_t bytes, void** ptr) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) & ~size_t{4095};
  *ptr = std::aligned_alloc(4096, rounded);
  if (*ptr == nullptr) {
    return Status::NoSpace("HostCopier::AllocatePinned(" + std::to_string(bytes) + " bytes)");
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pinned[*ptr] = rounded;
  state_->counters.pinned_allocated += rounded;
  return Status::OK();
}

void HostCopier::FreePinned(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->pinned.find(ptr);
    if (it == state_->pinned.end()) return;
    state_->counters.pinned_allocated -= it->second;
    state_->pinned.erase(it);
  }
  std::free(ptr);
}

Status HostCopier::RegisterHost(void* addr, size_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->registered.emplace(addr, bytes).second) {
    return Status::InvalidArgument("HostCopier::RegisterHost: already registered");
  }
  state_->counters.registered += bytes;
  return Status::OK();
}

void HostCopier::UnregisterHost(void* addr) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->registered.find(addr);
  if (it == state_->registered.end()) return;
  state_->counters.registered -= it->second;
  state_->registered.erase(it);
}

Status HostCopier::CopyAsync(void* dst, const void* src, size_t n, int stream) {
  if (state_->faults.fail_submit && state_->faults.fail_submit(dst, src, n)) {
    return Status::IOError("HostCopier::CopyAsync(" + std::to_string(n) +
                           " bytes) failed (injected fault)");
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  if (stream < 0 || stream >= static_cast<int>(state_->streams.size())) {
    return Status::InvalidArgument("HostCopier::CopyAsync: no stream " + std::to_string(stream));
  }
  State::Op op;
  op.dst = dst;
  op.src = src;
  op.n = n;
  state_->streams[stream]->ops.push_back(op);
  state_->in_flight++;
  Counters& c = state_->counters;
  c.copies++;
  c.bytes += n;
  c.max_in_flight = std::max(c.max_in_flight, state_->in_flight);
  c.streams_used |= uint64_t{1} << (stream & 63);
  c.max_copy_bytes = std::max<uint64_t>(c.max_copy_bytes, n);
  state_->cv.notify_all();
  return Status::OK();
}

Status HostCopier::RecordEvent(int event, int stream) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (stream < 0 || stream >= static_cast<int>(state_->streams.size()) || event < 0 ||
      event >= static_cast<int>(state_->events.size())) {
    return Status::InvalidArgument("HostCopier::RecordEvent: no such stream or event");
  }
  State::Op op;
  op.is_event = true;
  op.event = event;
  op.generation = ++state_->events[event].recorded;
  state_->streams[stream]->ops.push_back(op);
  state_->cv.notify_all();
  return Status::OK();
}

Status HostCopier::WaitEvent(int event) {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (event < 0 || event >= static_cast<int>(state_->events.size())) {
    return Status::InvalidArgument("HostCopier::WaitEvent: no event " + std::to_string(event));
  }
  State::Event& e = state_->events[event];
  state_->cv.wait(lock, [&] { return e.done >= e.recorded; });
  Status s = std::move(e.status);
  e.status = Status::OK();
  return s;
}

Status HostCopier::Synchronize() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] {
    if (state_->in_flight != 0) return false;
    for (const auto& s : state_->streams) {
      if (!s->ops.empty()) return false;
    }
    return true;
  });
  return Status::OK();
}

HostCopier::Counters HostCopier::counters() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->counters;
}

// ---------------------------------------------------------------- StagingPipeline

Status StagingPipeline::Create(std::unique_ptr<DeviceCopier> copier, const StagingOptions& options,
                               std::unique_ptr<StagingPipeline>* result) {
  result->reset();
  if (copier == nullptr) return Status::InvalidArgument("StagingPipeline: no copier");
  if (options.chunk_bytes == 0) {
    return Status::InvalidArgument("StagingPipeline: chunk_bytes must be positive");
  }
  if (options.streams < 1) {
    return Status::InvalidArgument("StagingPipeline: streams must be positive");
  }
  const size_t slots = std::max<size_t>(2, options.staging_bytes / options.chunk_bytes);
  if (slots > 4096) {
    return Status::InvalidArgument("StagingPipeline: more than 4096 slots (" +
                                   std::to_string(slots) + "); raise chunk_bytes");
  }
  Status s = copier->Init(options.streams, static_cast<int>(slots));
  if (!s.ok()) return s;
  void* staging = nullptr;
  s = copier->AllocatePinned(slots * options.chunk_bytes, &staging);
  if (!s.ok()) return s;
  result->reset(new StagingPipeline(std::move(copier), options.chunk_bytes, options.streams,
                                    static_cast<int>(slots), static_cast<char*>(staging)));
  return Status::OK();
}

StagingPipeline::StagingPipeline(std::unique_ptr<DeviceCopier> copier, size_t chunk, int streams,
                                 int slots, char* staging)
    : copier_(std::move(copier)),
      chunk_(chunk),
      streams_(streams),
      staging_(staging),
      tickets_(slots) {}

StagingPipeline::~StagingPipeline() {
  WaitAll();
  copier_->Synchronize();  // a failed RecordEvent may have left a copy unwatched
  copier_->FreePinned(staging_);
}

void StagingPipeline::Fail(Transfer* t, Status s) {
  if (t->status.ok()) {
    t->status = std::move(s);
    counters_.failed_transfers++;
  }
}

int StagingPipeline::Acquire() {
  if (count_ == static_cast<int>(tickets_.size())) RetireOldest();
  const int k = (head_ + count_) % static_cast<int>(tickets_.size());
  count_++;
  return k;
}

void StagingPipeline::Unacquire() {
  count_--;
  tickets_[(head_ + count_) % tickets_.size()] = Ticket();
}

void StagingPipeline::RetireOldest() {
  Ticket& tk = tickets_[head_];
  Status s = copier_->WaitEvent(head_);
  Transfer* t = tk.transfer;
  if (!s.ok()) {
    Fail(t, std::move(s));
  } else if (tk.drain_bytes != 0 && t->status.ok()) {
    std::memcpy(tk.drain_dst, tk.drain_src, tk.drain_bytes);
  }
  t->pending--;
  tk = Ticket();
  head_ = (head_ + 1) % static_cast<int>(tickets_.size());
  count_--;
}

bool StagingPipeline::SubmitDeviceChunk(Transfer* t, char* dst, MemoryKind dst_kind,
                                        const char* src, MemoryKind src_kind, size_t n) {
  const int k = Acquire();
  Ticket& tk = tickets_[k];
  tk.transfer = t;
  const int stream = k % streams_;
  char* slot = staging_ + static_cast<size_t>(k) * chunk_;
  const bool src_dev = IsDeviceMemory(src_kind);
  const bool dst_dev = IsDeviceMemory(dst_kind);
  Status s;
  if ((src_dev && dst_dev) || (src_dev && dst_kind == MemoryKind::kPinnedHost) ||
      (dst_dev && src_kind == MemoryKind::kPinnedHost)) {
    s = copier_->CopyAsync(dst, src, n, stream);
    counters_.direct_chunks++;
  } else if (src_dev) {
    // device -> pageable host: DMA into the slot now, memcpy out when it is retired.
    s = copier_->CopyAsync(slot, src, n, stream);
    tk.drain_dst = dst;
    tk.drain_src = slot;
    tk.drain_bytes = n;
    counters_.staged_chunks++;
  } else {
    // pageable host -> device: fill the slot while earlier slots are on the bus.
    std::memcpy(slot, src, n);
    s = copier_->CopyAsync(dst, slot, n, stream);
    counters_.staged_chunks++;
  }
  if (s.ok()) {
    s = copier_->RecordEvent(k, stream);
    // The copy is queued but unwatched: wait for it before the slot can be reused.
    if (!s.ok()) copier_->Synchronize();
  }
  if (!s.ok()) {
    Unacquire();
    Fail(t, std::move(s));
    return false;
  }
  t->pending++;
  return true;
}

void StagingPipeline::Submit(Transfer* t) {
  counters_.transfers++;
  t->status = Status::OK();
  t->pending = 0;
  t->submitted = 0;
  uint64_t src_total = 0, dst_total = 0;
  for (size_t i = 0; i < t->src.size(); i++) {
    if (t->src[i].data == nullptr && t->src[i].size != 0) {
      return Fail(
          t, Status::InvalidArgument("transfer source buffer " + std::to_string(i) + " is null"));
    }
    src_total += t->src[i].size;
  }
  for (size_t i = 0; i < t->dst.size(); i++) {
    if (t->dst[i].data == nullptr && t->dst[i].size != 0) {
      return Fail(t, Status::InvalidArgument("transfer destination buffer " + std::to_string(i) +
                                             " is null"));
    }
    dst_total += t->dst[i].size;
  }
  if (dst_total < src_total) {
    return Fail(t,
                Status::BufferTooSmall("transfer of " + std::to_string(src_total) +
                                       " bytes into buffers holding " + std::to_string(dst_total)));
  }
  size_t si = 0, so = 0, di = 0, doff = 0;
  while (t->status.ok()) {
    while (si < t->src.size() && so == t->src[si].size) {
      si++;
      so = 0;
    }
    if (si == t->src.size()) break;
    while (doff == t->dst[di].size) {  // dst_total >= src_total: a non-empty one remains
      di++;
      doff = 0;
    }
    const SourceBuffer& sb = t->src[si];
    const DestBuffer& db = t->dst[di];
    const size_t n = std::min({chunk_, sb.size - so, db.size - doff});
    if (!IsDeviceMemory(sb.kind) && !IsDeviceMemory(db.kind)) {
      std::memcpy(db.data + doff, sb.data + so, n);
      counters_.host_chunks++;
    } else if (!SubmitDeviceChunk(t, db.data + doff, db.kind, sb.data + so, sb.kind, n)) {
      break;
    }
    so += n;
    doff += n;
    t->submitted += n;
    counters_.bytes += n;
  }
}

void StagingPipeline::Wait(Transfer* t) {
  while (t->pending > 0) RetireOldest();
}

void StagingPipeline::WaitAll() {
  while (count_ > 0) RetireOldest();
}

Status StagingPipeline::Run(Transfer* t) {
  Submit(t);
  Wait(t);
  return t->status;
}

}  // namespace kvengine
