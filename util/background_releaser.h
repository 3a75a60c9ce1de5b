// BackgroundReleaser: drops references on a thread of its own.
//
// For objects whose destruction blocks.  Closing the last descriptor of a deleted bucket
// file makes the filesystem free its extents (about 12 ms per 64 MiB file on the
// project's machines); the GC would otherwise pay that inside every round, with the disk
// idle.  RocksDB defers obsolete-file deletion for the same reason
// (avoid_unnecessary_blocking_io).
//
// Thread-safety: Release() and Drain() may be called from any thread.
#ifndef KVENGINE_UTIL_BACKGROUND_RELEASER_H_
#define KVENGINE_UTIL_BACKGROUND_RELEASER_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace kvengine {

class BackgroundReleaser {
 public:
  BackgroundReleaser();
  // Releases everything still queued, then stops the thread.
  ~BackgroundReleaser();
  BackgroundReleaser(const BackgroundReleaser&) = delete;
  BackgroundReleaser& operator=(const BackgroundReleaser&) = delete;

  // Takes over one reference; the thread drops it soon.  Any other holder keeps the
  // object alive as usual.
  void Release(std::shared_ptr<void> object);
  // Returns once every reference handed over before the call has been dropped.
  void Drain();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<void>> queue_;  // guarded by mu_
  uint64_t queued_ = 0;                      // handed over so far; guarded by mu_
  uint64_t released_ = 0;                    // dropped so far; guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;                       // last: it starts in the constructor
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_BACKGROUND_RELEASER_H_
