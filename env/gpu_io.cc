#include "env/gpu_io.h"

#include <memory>
#include <vector>

#include "util/config_parse.h"
#include "util/logging.h"

namespace kvengine {

namespace {

const GpuIo::Hooks* g_hooks = nullptr;

std::string DeviceName(int device) { return "CUDA device " + std::to_string(device); }

Status Labeled(const std::string& label, const Status& s) {
  if (s.ok() || label.empty()) return s;
  return Status::FromErrorCode(s.ErrorCode(), label + ": " + s.message());
}

}  // namespace

void GpuIo::SetHooksForTesting(const Hooks* hooks) { g_hooks = hooks; }

GpuIo::GpuIo(const Options& options, Logger* logger, char* arena, size_t arena_size)
    : staging_options_{static_cast<size_t>(options.gpu_staging_bytes),
                       static_cast<size_t>(options.gpu_chunk_bytes),
                       static_cast<int>(options.gpu_streams)},
      logger_(logger),
      arena_(arena),
      arena_size_(arena_size) {}

GpuIo::~GpuIo() {
  MutexLock lock(&mu_);
  for (auto& [device, lane] : lanes_) {
    MutexLock lane_lock(&lane->mu);
    lane->pipeline->WaitAll();
  }
  // Before the pipelines (and their copiers) go, and before the arena is unmapped.
  if (arena_registered_) arena_registrar_->UnregisterHost(arena_);
  lanes_.clear();
}

void GpuIo::BeginBatch() { RefreshCudaDriverProbe(); }

Status GpuIo::Classify(const void* ptr, PointerInfo* info) const {
  if (g_hooks != nullptr && g_hooks->classify && g_hooks->classify(ptr, info)) {
    return Status::OK();
  }
  return ClassifyPointer(ptr, info);
}

Status GpuIo::ScanOne(const void* ptr, size_t size, size_t index, const char* what, int* device) {
  if (ptr == nullptr || size == 0) return Status::OK();  // the DB's own checks report these
  PointerInfo info;
  Status s = Classify(ptr, &info);
  if (!s.ok()) return s;
  if (info.kind != MemoryKind::kDevice) return Status::OK();
  const bool can_copy = GpuSupportBuilt() || (g_hooks != nullptr && g_hooks->new_copier);
  if (!can_copy) {
    return Status::NotSupported(std::string(what) + " buffer " + std::to_string(index) +
                                " is GPU memory (" + DeviceName(info.device) +
                                ") but kvengine was built without CUDA (KV_WITH_CUDA); "
                                "nothing was copied");
  }
  if (*device >= 0 && *device != info.device) {
    return Status::InvalidArgument(std::string(what) + " buffers are on two GPUs (" +
                                   DeviceName(*device) + " and " + DeviceName(info.device) +
                                   "); one key's buffers must share a device");
  }
  *device = info.device;
  return Status::OK();
}

Status GpuIo::Scan(std::span<const Slice> parts, int* device) {
  *device = -1;
  for (size_t i = 0; i < parts.size(); i++) {
    Status s = ScanOne(parts[i].data(), parts[i].size(), i, "value", device);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status GpuIo::Scan(std::span<const MutableSlice> dest, int* device) {
  *device = -1;
  for (size_t i = 0; i < dest.size(); i++) {
    Status s = ScanOne(dest[i].data(), dest[i].size(), i, "destination", device);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status GpuIo::GetLane(int device, Lane** lane) {
  *lane = nullptr;
  MutexLock lock(&mu_);
  auto it = lanes_.find(device);
  if (it != lanes_.end()) {
    *lane = it->second.get();
    return Status::OK();
  }
  auto failed = lane_errors_.find(device);
  if (failed != lane_errors_.end()) return failed->second;

  std::unique_ptr<DeviceCopier> copier;
  Status s = (g_hooks != nullptr && g_hooks->new_copier) ? g_hooks->new_copier(device, &copier)
                                                         : NewCudaCopier(device, &copier);
  // Built here and handed to the lane last: no other thread sees the lane before then.
  std::unique_ptr<StagingPipeline> pipeline;
  if (s.ok()) s = StagingPipeline::Create(std::move(copier), staging_options_, &pipeline);
  if (!s.ok()) {
    // Remembered: a device that could not start fails each of its keys at once.
    s = Status::FromErrorCode(s.ErrorCode(),
                              "GPU staging for " + DeviceName(device) + ": " + s.message());
    if (logger_ != nullptr) logger_->Logf(LogLevel::kWarn, "%s", s.ToString().c_str());
    lane_errors_.emplace(device, s);
    return s;
  }
  if (!arena_attempted_ && arena_ != nullptr && arena_size_ != 0) {
    arena_attempted_ = true;
    DeviceCopier* copier_ptr = pipeline->copier();
    Status r = copier_ptr->RegisterHost(arena_, arena_size_);
    if (r.ok()) {
      arena_registrar_ = copier_ptr;
      arena_registered_ = true;
      if (logger_ != nullptr) {
        logger_->Logf(LogLevel::kInfo, "GPU staging: arena of %s page-locked for direct DMA",
                      FormatSize(arena_size_).c_str());
      }
    } else if (logger_ != nullptr) {
      logger_->Logf(LogLevel::kWarn,
                    "GPU staging: could not page-lock the arena (%s); copies go through the "
                    "staging ring",
                    r.ToString().c_str());
    }
  }
  if (logger_ != nullptr) {
    const StagingPipeline& p = *pipeline;
    logger_->Logf(LogLevel::kInfo, "GPU staging: %s lane with %d slots of %s on %d streams",
                  p.copier()->Name().c_str(), p.slots(), FormatSize(p.chunk_bytes()).c_str(),
                  p.streams());
  }
  auto created = std::make_unique<Lane>();
  created->pipeline = std::move(pipeline);
  *lane = created.get();
  lanes_.emplace(device, std::move(created));
  return Status::OK();
}

Status GpuIo::AddSources(std::span<const Slice> parts, Transfer* t) const {
  t->src.reserve(parts.size());
  for (const Slice& part : parts) {
    PointerInfo info;
    if (part.size() != 0) {
      Status s = Classify(part.data(), &info);
      if (!s.ok()) return s;
    }
    t->src.push_back({part.data(), part.size(), info.kind});
  }
  return Status::OK();
}

GpuIo::Queue::~Queue() {
  for (size_t n = 0; n < copies_.size(); n++) (void)Wait(n);
}

GpuIo::Queue::Copy* GpuIo::Queue::NewCopy(const std::string& label, PerfKey key) {
  copies_.push_back(std::make_unique<Copy>(label, key));
  return copies_.back().get();
}

size_t GpuIo::Queue::Submit(Copy* c, const Status& prepared) {
  if (prepared.ok()) {
    MutexLock lock(&c->lane->mu);
    c->lane->pipeline->Submit(&c->transfer);
  } else {
    c->lane = nullptr;
    c->finished = true;
    c->status = Labeled(c->label, prepared);
    c->perf.Abandon();
  }
  return copies_.size() - 1;
}

size_t GpuIo::Queue::FromDevice(const std::string& label, int device, std::span<const Slice> parts,
                                char* dst, uint64_t size) {
  Copy* c = NewCopy(label, PerfKey::gpu_stage_d2h);
  Status s = io_->GetLane(device, &c->lane);  // page-locks the arena on first use
  if (s.ok()) s = io_->AddSources(parts, &c->transfer);
  const MemoryKind kind =
      io_->arena_registered_.load() ? MemoryKind::kPinnedHost : MemoryKind::kHost;
  c->transfer.dst.push_back({dst, static_cast<size_t>(size), kind});
  return Submit(c, s);
}

size_t GpuIo::Queue::ToDevice(const std::string& label, int device, const Slice& value,
                              bool in_arena, std::span<const MutableSlice> dest) {
  Copy* c = NewCopy(label, PerfKey::gpu_stage_h2d);
  Status s = io_->GetLane(device, &c->lane);
  const bool pinned = in_arena && io_->arena_registered_.load();
  c->transfer.src.push_back(
      {value.data(), value.size(), pinned ? MemoryKind::kPinnedHost : MemoryKind::kHost});
  c->transfer.dst.reserve(dest.size());
  for (const MutableSlice& d : dest) {
    PointerInfo info;
    if (s.ok() && d.size() != 0) s = io_->Classify(d.data(), &info);
    c->transfer.dst.push_back({d.data(), d.size(), info.kind});
  }
  return Submit(c, s);
}

Status GpuIo::Queue::Wait(size_t n) {
  Copy& c = *copies_[n];
  if (!c.finished) {
    MutexLock lock(&c.lane->mu);
    c.lane->pipeline->Wait(&c.transfer);
    c.status = Labeled(c.label, c.transfer.status);
    c.finished = true;
    c.perf.End();
  }
  return c.status;
}

Status GpuIo::GetViaHost(const std::string& label, int device, std::span<const MutableSlice> dest,
                         uint64_t capacity,
                         const std::function<Status(MutableSlice bounce, uint64_t* size)>& read,
                         uint64_t* size) {
  *size = 0;
  Lane* lane;
  Status s = GetLane(device, &lane);
  if (!s.ok()) return Labeled(label, s);
  std::vector<DestBuffer> dst;
  dst.reserve(dest.size());
  for (const MutableSlice& d : dest) {
    PointerInfo info;
    if (d.size() != 0) {
      s = Classify(d.data(), &info);
      if (!s.ok()) return Labeled(label, s);
    }
    dst.push_back({d.data(), d.size(), info.kind});
  }
  MutexLock lock(&lane->mu);
  StagingPipeline* pipeline = lane->pipeline.get();
  pipeline->WaitAll();  // copies a Queue left in flight may be using the staging memory
  std::unique_ptr<char[]> heap;
  char* bounce = pipeline->staging();
  MemoryKind bounce_kind = MemoryKind::kPinnedHost;
  if (capacity > pipeline->staging_size()) {
    heap = std::make_unique_for_overwrite<char[]>(capacity);
    bounce = heap.get();
    bounce_kind = MemoryKind::kHost;
  }
  s = read(MutableSlice(bounce, capacity), size);
  if (!s.ok()) return s;  // the DB's read names the key already
  Transfer t;
  t.src.push_back({bounce, static_cast<size_t>(*size), bounce_kind});
  t.dst = std::move(dst);
  return Labeled(label, pipeline->Run(&t));
}

}  // namespace kvengine
