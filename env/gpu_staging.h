// GPU staging: moving bytes between GPU memory and host memory in chunks, through a
// ring of page-locked staging buffers, on several streams at once.
//
// Three pieces, one job each:
//   * DeviceCopier: the door to the copy engine.  CudaCopier (built with KV_WITH_CUDA)
//     drives the CUDA runtime; HostCopier plays a "device" with ordinary host memory and
//     worker threads, so the pipeline's logic runs and is tested on every machine.
//   * StagingPipeline: splits a Transfer (a gather list -> a scatter list) into chunks
//     and moves each chunk either directly (when the host side is page-locked) or through
//     a staging slot, keeping up to `slots` chunks in flight on round-robin streams so the
//     CPU side of chunk k+1 overlaps the DMA of chunk k (double buffering).
//   * ClassifyPointer: tells device memory from host memory (cudaPointerGetAttributes).
//
// Nothing here is public API; the DB reaches it through env/gpu_io.h.
#ifndef KVENGINE_ENV_GPU_STAGING_H_
#define KVENGINE_ENV_GPU_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/status.h"

namespace kvengine {

// Where a buffer lives, as far as a copy is concerned.
enum class MemoryKind : uint8_t {
  kHost = 0,        // pageable host memory: reachable by memcpy, DMA only through staging
  kPinnedHost = 1,  // page-locked host memory (cudaHostAlloc/cudaHostRegister): direct DMA
  kDevice = 2,      // GPU memory: never dereferenced on the host
};

inline bool IsDeviceMemory(MemoryKind k) { return k == MemoryKind::kDevice; }

// ---------------------------------------------------------------- DeviceCopier

// Asynchronous copies on numbered streams, completion tracked by numbered events, as
// in the CUDA runtime.  Copies on one stream run in order; copies on different streams
// may overlap.  An event recorded on a stream completes when every copy enqueued on that
// stream before it has completed.
//
// Thread-safety: a copier is used by one thread at a time (its StagingPipeline's owner).
// Failure: every method returns a Status naming the call that failed
// ("cudaMemcpyAsync(...): cudaErrorInvalidValue: invalid argument").
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;

  // A short name for messages: "cuda:0", "host".
  virtual std::string Name() const = 0;

  // Creates `streams` streams and `events` events.  Called once, before anything else.
  virtual Status Init(int streams, int events) = 0;

  // Allocates `bytes` of page-locked host memory into *ptr (nullptr on failure).  Freed
  // with FreePinned.
  virtual Status AllocatePinned(size_t bytes, void** ptr) = 0;
  virtual void FreePinned(void* ptr) = 0;

  // Page-locks [addr, addr+bytes) so DMA reaches it directly; UnregisterHost undoes it.
  virtual Status RegisterHost(void* addr, size_t bytes) = 0;
  virtual void UnregisterHost(void* addr) = 0;

  // Enqueues a copy of n bytes on `stream`.  dst and src stay valid, and src unchanged,
  // until an event recorded after it completes.  An error here means nothing was queued;
  // an error of the copy itself is reported by WaitEvent.
  virtual Status CopyAsync(void* dst, const void* src, size_t n, int stream) = 0;

  // Records `event` on `stream` (replacing an earlier recording of the same event).
  virtual Status RecordEvent(int event, int stream) = 0;

  // Blocks until `event` has completed.  Returns the first error of the copies it covers
  // that were not yet reported.
  virtual Status WaitEvent(int event) = 0;

  // Blocks until every stream is idle.  Used before freeing memory copies may touch.
  virtual Status Synchronize() = 0;
};

// A copier that plays the device with ordinary host memory: one worker thread per stream
// runs the queued copies in order (memcpy), so copies are truly asynchronous.  Faults and
// delays can be injected; counters show what the pipeline asked for.  For tests, and for
// checking the pipeline's logic on machines without a GPU.
class HostCopier final : public DeviceCopier {
 public:
  struct Faults {
    // Called for each CopyAsync; when it returns true the call fails (nothing queued).
    std::function<bool(const void* dst, const void* src, size_t n)> fail_submit;
    // Called when a queued copy runs; when it returns true the copy is skipped and the
    // next WaitEvent on that stream's events reports an error.
    std::function<bool(const void* dst, const void* src, size_t n)> fail_complete;
    // Each queued copy first sleeps a random 0..max_delay_us microseconds.
    int max_delay_us = 0;
  };
  struct Counters {
    uint64_t copies = 0;            // copies queued
    uint64_t bytes = 0;             // bytes queued
    uint64_t max_in_flight = 0;     // most copies queued but not yet finished at once
    uint64_t streams_used = 0;      // bit i set when stream i ran a copy
    uint64_t max_copy_bytes = 0;    // the largest single copy
    uint64_t pinned_allocated = 0;  // bytes handed out by AllocatePinned
    uint64_t registered = 0;        // bytes currently registered
  };

  HostCopier();
  explicit HostCopier(Faults faults);
  ~HostCopier() override;

  std::string Name() const override { return "host"; }
  Status Init(int streams, int events) override;
  Status AllocatePinned(size_t bytes, void** ptr) override;
  void FreePinned(void* ptr) override;
  Status RegisterHost(void* addr, size_t bytes) override;
  void UnregisterHost(void* addr) override;
  Status CopyAsync(void* dst, const void* src, size_t n, int stream) override;
  Status RecordEvent(int event, int stream) override;
  Status WaitEvent(int event) override;
  Status Synchronize() override;

  // A snapshot of the counters (thread-safe).
  Counters counters() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Creates a copier for CUDA device `device`.  NotSupported in a build without CUDA.
Status NewCudaCopier(int device, std::unique_ptr<DeviceCopier>* result);

// ---------------------------------------------------------------- StagingPipeline

struct StagingOptions {
  size_t staging_bytes = 64ull << 20;  // the whole ring
  size_t chunk_bytes = 2ull << 20;     // one slot, and the most bytes one copy moves
  int streams = 2;
};

// One buffer of a transfer.
struct SourceBuffer {
  const char* data = nullptr;
  size_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
};
struct DestBuffer {
  char* data = nullptr;
  size_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
};

// Moves the concatenation of `src` into `dst`, filled in order.  The dst buffers must
// hold at least as many bytes as the src buffers.  `status` is the outcome: the first
// error of any of its copies (a failed transfer leaves its dst bytes unspecified, and
// never affects another transfer).
struct Transfer {
  std::vector<SourceBuffer> src;
  std::vector<DestBuffer> dst;
  Status status;

  // Bookkeeping of the pipeline.
  uint64_t pending = 0;    // chunks in flight
  uint64_t submitted = 0;  // bytes handed to copies or memcpy so far
};

class StagingPipeline {
 public:
  // Counters of what the pipeline did, for stats and tests.
  struct Counters {
    uint64_t transfers = 0;
    uint64_t failed_transfers = 0;
    uint64_t direct_chunks = 0;  // DMA straight to/from page-locked host memory
    uint64_t staged_chunks = 0;  // through a staging slot
    uint64_t host_chunks = 0;    // host to host (memcpy)
    uint64_t bytes = 0;
  };

  // Allocates the staging ring (page-locked, from the copier) of
  // max(2, staging_bytes / chunk_bytes) slots of chunk_bytes each.
  // On failure stores nullptr and returns the copier's error.
  static Status Create(std::unique_ptr<DeviceCopier> copier, const StagingOptions& options,
                       std::unique_ptr<StagingPipeline>* result);
  ~StagingPipeline();
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  // Starts moving t's bytes and returns once all of them are queued (the host side of
  // staged chunks may still be pending).  t and its buffers must stay valid until Wait(t)
  // or WaitAll() returns.  Sets t->status on a malformed transfer or a failed submit.
  // REQUIRES: called by the pipeline's owner (the pipeline is not thread-safe).
  void Submit(Transfer* t);
  // Blocks until t has completed (and everything submitted before it).
  void Wait(Transfer* t);
  // Blocks until every submitted transfer has completed.
  void WaitAll();

  // Submit + Wait.  Returns t->status.
  Status Run(Transfer* t);

  DeviceCopier* copier() const { return copier_.get(); }
  int slots() const { return static_cast<int>(tickets_.size()); }
  size_t chunk_bytes() const { return chunk_; }
  int streams() const { return streams_; }
  // The page-locked staging memory (slots() * chunk_bytes() bytes).  The owner may use it
  // as a bounce buffer while no transfer that goes through staging slots is in flight.
  char* staging() const { return staging_; }
  size_t staging_size() const { return tickets_.size() * chunk_; }
  const Counters& counters() const { return counters_; }

 private:
  // One chunk in flight: its slot, event and stream are fixed by its index in the ring.
  struct Ticket {
    Transfer* transfer = nullptr;
    // For a staged device->host chunk: the memcpy from the slot once the DMA is done.
    char* drain_dst = nullptr;
    const char* drain_src = nullptr;
    size_t drain_bytes = 0;
  };

  StagingPipeline(std::unique_ptr<DeviceCopier> copier, size_t chunk, int streams, int slots,
                  char* staging);
  // Takes the next ticket in ring order, retiring the oldest one first when all are busy.
  int Acquire();
  // Gives back the most recently acquired ticket (its copy was never queued).
  void Unacquire();
  // Waits for the oldest ticket and finishes its chunk.
  void RetireOldest();
  // Queues one chunk that needs the copier; returns false when t failed.
  bool SubmitDeviceChunk(Transfer* t, char* dst, MemoryKind dst_kind, const char* src,
                         MemoryKind src_kind, size_t n);
  void Fail(Transfer* t, Status s);

  std::unique_ptr<DeviceCopier> copier_;
  const size_t chunk_;
  const int streams_;
  char* const staging_;
  std::vector<Ticket> tickets_;
  int head_ = 0;   // oldest ticket in flight
  int count_ = 0;  // tickets in flight
  Counters counters_;
};

// ---------------------------------------------------------------- detection

struct PointerInfo {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // for kDevice: the CUDA device ordinal
};

// True when this kvengine was built with the CUDA runtime (KV_WITH_CUDA).
bool GpuSupportBuilt();

// The number of CUDA devices this process can use, asked once and cached.  0 without
// CUDA, a driver or a GPU; *why (may be nullptr) then says which.
int CudaDeviceCount(std::string* why);

// Looks again whether the process has loaded the CUDA driver (libcuda).  Cheap but not
// free: called once per batch, not per buffer.  Without the driver no buffer can be
// device memory, and ClassifyPointer answers kHost without asking CUDA (so a host-only
// user of a CUDA build never initializes CUDA).
void RefreshCudaDriverProbe();

// Classifies ptr: kDevice for GPU memory, kPinnedHost for page-locked host memory, kHost
// for the rest (managed memory counts as host: the host may touch it).  With CUDA built
// in this asks cudaPointerGetAttributes; without, it still asks the loaded CUDA driver
// (cuPointerGetAttribute) so device memory can be refused rather than dereferenced.  On a
// machine without a driver or GPU every pointer is kHost.  Never dereferences ptr.
// Returns non-OK (naming the call) only when CUDA fails unexpectedly.
Status ClassifyPointer(const void* ptr, PointerInfo* info);

}  // namespace kvengine

#endif  // KVENGINE_ENV_GPU_STAGING_H_
