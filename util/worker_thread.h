// WorkerThread: one long-lived thread that runs tasks in the order they were submitted.
//
// For work that must leave the calling thread, without a thread per task: a thread that
// comes and goes also sets up and tears down its per-thread state each time (the
// io_uring Env's ring, for one).  The SSD tier keeps two: one reads compaction chunks
// while the GC thread writes, one closes retired bucket files (closing the last
// descriptor of a deleted 64 MiB file makes the filesystem free its extents, ~12 ms
// here, which the GC round would otherwise wait for -- RocksDB defers obsolete-file
// deletion for the same reason, avoid_unnecessary_blocking_io).
//
// Thread-safety: Submit() and Drain() may be called from any thread, but not from a
// task (Drain would wait for itself).
#ifndef KVENGINE_UTIL_WORKER_THREAD_H_
#define KVENGINE_UTIL_WORKER_THREAD_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "util/mutex.h"

namespace kvengine {

class WorkerThread {
 public:
  WorkerThread();
  // Runs every task still queued, then stops the thread.
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Queues `task`; it runs, and is destroyed, on the worker thread.
  void Submit(std::function<void()> task);
  // Returns once every task submitted before the call has run and been destroyed.
  void Drain();

 private:
  void Loop();

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  uint64_t submitted_ GUARDED_BY(mu_) = 0;
  uint64_t finished_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;                       // last: it starts in the constructor
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_WORKER_THREAD_H_
