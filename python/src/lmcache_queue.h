// LMCacheQueue: the engine half of kvengine's LMCache native plug-in (docs/lmcache.md).
//
// LMCache's NativeConnectorL2Adapter calls submit_batch_{set,get,exists,delete} while it
// holds a lock shared by its store, prefetch and demux threads, so a submit that waits
// stalls every L2 transfer of that LMCache process.  Here a submit only appends the batch
// to a queue and returns its future id; a pool of worker threads runs the engine's batch
// calls (the one copy between the caller's buffers and the store happens there), and the
// last to finish appends the batch's completion and signals an eventfd.  Drain() resets
// the eventfd and hands the completions over.
//
// A set or get of many bytes is cut into parts of at most `part_bytes` (whole keys), one
// engine call each, which the workers run side by side: a 256 MiB store of eight 32 MiB
// chunks is four calls on four threads, and an attached store's copy into its reserved
// slots stays well within the slots' lifetime (docs/attach.md, "spare slots").
//
// Results, as LMCache reads them:
//   set     ok when every key was stored (LMCache counts the whole batch); no per-key list.
//   get     per key: true when the value was copied and filled the buffer exactly; a
//           missing key, or a value of another size (stale), is false.  ok when all were.
//   exists  per key: true when present.  ok unless the batch itself failed.
//   delete  per key: true when the key was there and is gone.  ok unless the batch failed.
// A batch that fails as a whole (closed store, too many keys, the owner of an attached
// store gone) gives ok=false, the engine's error, and every per-key result false.
//
// Thread-safety: every method may be called from any thread.  Buffers passed to Submit
// must stay valid until their completion is drained (LMCache keeps them until then); the
// request's `keepalive` is moved into the completion and released with it.
#ifndef KVENGINE_PYTHON_SRC_LMCACHE_QUEUE_H_
#define KVENGINE_PYTHON_SRC_LMCACHE_QUEUE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/mutex.h"

namespace kvengine {
namespace lmcache {

enum class BatchOp { kSet, kGet, kExists, kDelete };

struct BatchRequest {
  BatchOp op = BatchOp::kExists;
  std::vector<std::string> keys;
  // set: the values (read); get: the destinations (written).  Empty for exists/delete.
  std::vector<MutableSlice> buffers;
  // Whatever keeps `buffers` valid; released when the completion is dropped.
  std::shared_ptr<void> keepalive;
};

struct BatchCompletion {
  uint64_t future_id = 0;
  bool ok = false;
  std::string error;             // "" when ok
  bool has_per_key = false;      // false for set
  std::vector<uint8_t> per_key;  // 1 = found / loaded / deleted
  std::shared_ptr<void> keepalive;
};

struct QueueOptions {
  // Threads that run batches; each runs one batch at a time.
  // Default: 4
  int workers = 4;
  // Registers each buffer address the first time a batch names it (DB::RegisterBuffer),
  // for transports that pin memory (RDMA).  Measured no faster on the CPU paths, so off
  // (docs/lmcache.md, "Buffers").
  // Default: false
  bool register_buffers = false;
  // Most value bytes in one engine call: a set or get batch larger than this is cut into
  // parts that run on several workers (a key is never cut; a set naming a key twice is
  // not cut, so that the engine refuses it whole).
  // Default: 64 MiB
  uint64_t part_bytes = 64ull << 20;
};

class LMCacheQueue {
 public:
  // Starts the workers.  InvalidArgument for a null db or workers < 1; IOError when the
  // eventfd cannot be made.
  static Status Create(std::shared_ptr<DB> db, const QueueOptions& options,
                       std::unique_ptr<LMCacheQueue>* result);
  ~LMCacheQueue();  // Close()
  LMCacheQueue(const LMCacheQueue&) = delete;
  LMCacheQueue& operator=(const LMCacheQueue&) = delete;

  // The eventfd (EFD_NONBLOCK) that becomes readable when a completion is ready; -1 after
  // Close().
  int event_fd() const { return event_fd_; }

  // Queues the batch (in parts) and stores its future id; never waits for a batch.
  // InvalidArgument when buffers do not match keys (one per key for set/get, none
  // otherwise); Aborted after Close().  On failure nothing is queued and
  // request.keepalive is dropped.
  Status Submit(BatchRequest request, uint64_t* future_id);

  // Resets the eventfd, then returns every completion finished since the last call (a
  // completion that finishes meanwhile signals the fd again).
  std::vector<BatchCompletion> Drain();

  // The store later batches use (after the owner of an attached store went away and
  // another took over).  Batches running keep the one they started with.
  void ReplaceDb(std::shared_ptr<DB> db);

  // Refuses new submits, fails the parts still queued ("closed"), waits for the running
  // ones (so every batch completes), stops the workers, unregisters the buffers it registered and
  // closes the eventfd.  Completions not drained stay for Drain().  Idempotent.
  void Close();

 private:
  // One submitted batch: its parts write disjoint ranges of `results`.
  struct Batch {
    uint64_t future_id = 0;
    BatchRequest request;
    std::vector<int64_t> results;  // per key: the engine's result, or the part's error code
    size_t parts_left = 0;         // GUARDED_BY(mu_) (a member of a struct the queue owns)
    std::string error;             // the first part that failed as a whole; GUARDED_BY(mu_)
  };
  // Keys [begin, end) of a batch: one engine call.
  struct Part {
    std::shared_ptr<Batch> batch;
    size_t begin = 0;
    size_t end = 0;
  };

  LMCacheQueue(std::shared_ptr<DB> db, const QueueOptions& options, int event_fd);
  std::vector<Part> Cut(const std::shared_ptr<Batch>& batch) const;
  void WorkLoop();
  Status RunPart(const Part& part);
  static Status Put(DB* db, std::span<const Slice> keys, std::span<const MutableSlice> buffers,
                    std::vector<int64_t>* results);
  void FinishPart(const Part& part, const Status& s);
  static BatchCompletion Evaluate(Batch* batch);
  void RegisterOnFirstSight(const std::shared_ptr<DB>& db, std::span<const MutableSlice> buffers);
  std::shared_ptr<DB> CurrentDb();

  const QueueOptions options_;
  int event_fd_;

  Mutex mu_;
  CondVar work_cv_;
  std::shared_ptr<DB> db_ GUARDED_BY(mu_);
  std::deque<Part> queue_ GUARDED_BY(mu_);
  std::vector<BatchCompletion> completed_ GUARDED_BY(mu_);
  uint64_t next_future_id_ GUARDED_BY(mu_) = 1;
  bool closing_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;

  Mutex registered_mu_;
  // Addresses registered with the DB (register_buffers), and those it refused (overlaps).
  std::vector<std::pair<std::shared_ptr<DB>, void*>> registered_ GUARDED_BY(registered_mu_);
  std::unordered_set<const void*> seen_ GUARDED_BY(registered_mu_);

  std::vector<std::thread> workers_;  // started last, in Create
};

}  // namespace lmcache
}  // namespace kvengine

#endif  // KVENGINE_PYTHON_SRC_LMCACHE_QUEUE_H_
