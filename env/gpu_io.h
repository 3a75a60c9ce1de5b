// GpuIo: the DB's door to GPU memory (the GPU staging Env of DESIGN.md).
//
// The DB asks Scan() whether a key's buffers include device memory; when none do, the
// key takes the ordinary host path and GpuIo costs one pointer query per buffer (none at
// all until the process has loaded the CUDA driver).  When some do:
//   * puts: the DB reserves the value's room in the memory tier's arena, which GpuIo
//     page-locks (cudaHostRegister) the first time a device buffer is seen; a Queue
//     copies the value device -> that room (one crossing of the bus, chunked over the
//     streams, through the staging ring only when the registration failed), and the DB
//     publishes the reservation;
//   * gets: a Queue copies a value host -> device straight from the arena; GetViaHost
//     serves values that are not in the arena (SSD, peers) through a page-locked bounce
//     buffer.
// A batch's copies are queued back to back and waited for once each (GpuIo::Queue).
// Work for one CUDA device goes through that device's lane: a StagingPipeline (its
// streams and staging ring) behind a mutex, created on first use.
//
// Thread-safety: all methods are thread-safe.  Failure: a Status naming the key's
// problem or the CUDA call that failed, prefixed with the caller's `label` (the key); a
// failure affects only the key it belongs to.
#ifndef KVENGINE_ENV_GPU_IO_H_
#define KVENGINE_ENV_GPU_IO_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "env/gpu_staging.h"
#include "kvengine/options.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/mutex.h"
#include "util/perf_point.h"

namespace kvengine {

class Logger;

class GpuIo {
 public:
  // Test seams: a classifier that may call host memory "device" memory, and a copier
  // factory (a HostCopier), so the DB's GPU path runs on machines without a GPU.
  struct Hooks {
    // Returns true and fills *info to override ClassifyPointer for ptr.
    std::function<bool(const void* ptr, PointerInfo* info)> classify;
    // Replaces NewCudaCopier when set.
    std::function<Status(int device, std::unique_ptr<DeviceCopier>* result)> new_copier;
  };
  // Installs hooks for every GpuIo (nullptr removes them).  Not thread-safe: call it
  // while no DB is open.  The hooks must outlive their use.
  static void SetHooksForTesting(const Hooks* hooks);

  // `arena` is the memory tier's arena; it is page-locked lazily (see above) and
  // unregistered by the destructor.
  GpuIo(const Options& options, Logger* logger, char* arena, size_t arena_size);
  ~GpuIo();
  GpuIo(const GpuIo&) = delete;
  GpuIo& operator=(const GpuIo&) = delete;

  // Called once per batch call before Scan: notices a CUDA driver loaded meanwhile.
  void BeginBatch();

  // Classifies a key's buffers.  Stores in *device the CUDA device of its device
  // buffers, or -1 when every buffer is host memory (take the ordinary path).
  // NotSupported when a buffer is device memory that this build or machine cannot reach;
  // InvalidArgument when buffers of one key live on two devices.
  Status Scan(std::span<const Slice> parts, int* device);
  Status Scan(std::span<const MutableSlice> dest, int* device);

 private:
  struct Lane;

 public:
  // Copies between device buffers and host memory of a batch call, queued one after
  // another so that the bus moves key after key with no pause between them (a wait per
  // key costs about as long as copying 1 MiB), and waited for in the order queued.
  // Copies of other callers may run in between: a queue takes its device's lane for
  // each step only.  The destructor waits for the copies still in flight, so their
  // buffers must outlive the queue.  A queue is used by one thread.
  class Queue {
   public:
    explicit Queue(GpuIo* io) : io_(io) {}
    ~Queue();
    Queue(const Queue&) = delete;
    Queue& operator=(const Queue&) = delete;

    // Queues a copy of the value (the concatenation of parts, `size` bytes, some on
    // `device`) into `dst`, host memory inside the arena: straight by DMA once the arena
    // is page-locked, else through the staging ring.  For puts: into the room the DB
    // reserved for the value, or the slot an attached client (attach/attached_db.h)
    // reserved in the owner's arena; one crossing of the bus, no host copy.  Returns
    // the copy's number for Wait.
    size_t FromDevice(const std::string& label, int device, std::span<const Slice> parts, char* dst,
                      uint64_t size);
    // Queues a copy of `value` (host memory; in the arena when in_arena) into dest's
    // buffers, filled in order.  REQUIRES: value fits in dest.
    size_t ToDevice(const std::string& label, int device, const Slice& value, bool in_arena,
                    std::span<const MutableSlice> dest);

    // Waits for copy `n` (and the copies queued before it on its device); its outcome,
    // prefixed with its label.  A copy that could not be queued fails here.
    Status Wait(size_t n);

   private:
    struct Copy {
      Copy(const std::string& l, PerfKey key) : label(l), perf(key) {}
      std::string label;
      Lane* lane = nullptr;  // nullptr: not queued, `status` says why
      Transfer transfer;
      bool finished = false;
      Status status;
      PerfPoint perf;  // gpu_stage_d2h or gpu_stage_h2d: from queued to done
    };
    Copy* NewCopy(const std::string& label, PerfKey key);
    // Submits c's transfer on its lane when `prepared` is OK, else finishes c with that
    // error.  Returns c's number.
    size_t Submit(Copy* c, const Status& prepared);

    GpuIo* const io_;
    // Each Copy on the heap (the pipeline holds its transfer), and none at all for a
    // batch without device buffers: a vector allocates nothing until used.
    std::vector<std::unique_ptr<Copy>> copies_;
  };

  // Calls read(bounce, &size) with a host buffer of `capacity` bytes, then copies the
  // `size` bytes read into dest.  For values that must be read from elsewhere first.
  // Stores the size read in *size (also when read fails with BufferTooSmall).
  Status GetViaHost(const std::string& label, int device, std::span<const MutableSlice> dest,
                    uint64_t capacity,
                    const std::function<Status(MutableSlice bounce, uint64_t* size)>& read,
                    uint64_t* size);

 private:
  struct Lane {
    Mutex mu;
    std::unique_ptr<StagingPipeline> pipeline PT_GUARDED_BY(mu);
  };

  // Returns device's lane, creating it (and page-locking the arena) on first use.
  Status GetLane(int device, Lane** lane) EXCLUDES(mu_);
  Status Classify(const void* ptr, PointerInfo* info) const;
  // Appends parts to t's sources, each with the kind of memory it is in.
  Status AddSources(std::span<const Slice> parts, Transfer* t) const;
  Status ScanOne(const void* ptr, size_t size, size_t index, const char* what, int* device);

  const StagingOptions staging_options_;
  Logger* const logger_;
  char* const arena_;
  const size_t arena_size_;

  mutable Mutex mu_;
  std::map<int, std::unique_ptr<Lane>> lanes_ GUARDED_BY(mu_);
  std::map<int, Status> lane_errors_ GUARDED_BY(mu_);  // lanes that failed to start
  DeviceCopier* arena_registrar_ GUARDED_BY(mu_) = nullptr;  // who page-locked the arena
  bool arena_attempted_ GUARDED_BY(mu_) = false;
  std::atomic<bool> arena_registered_{false};
};

}  // namespace kvengine

#endif  // KVENGINE_ENV_GPU_IO_H_
