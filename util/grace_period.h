// GracePeriod: lets a writer wait until every reader that started before a point in
// time has finished, without waiting for readers that start later (which a plain
// count of readers would: under steady load it never reaches zero).
//
// Readers are counted in one of two epochs.  Wait() moves new readers to the other
// epoch and waits until the one they left is empty.  Because each Wait() empties the
// epoch it leaves, the epoch it moves readers to is always empty when it does.
//
// The SSD tier uses it before punching holes: a reader that found a value's location
// before the value was deleted may still be reading it; one that starts after the
// delete cannot find it.
//
// Thread-safety: thread-safe.  Wait() calls are serialized.
#ifndef KVENGINE_UTIL_GRACE_PERIOD_H_
#define KVENGINE_UTIL_GRACE_PERIOD_H_

#include <cstdint>

#include "util/mutex.h"

namespace kvengine {

class GracePeriod {
 public:
  // Marks a reader as started; pass the result to Exit().
  int Enter() {
    MutexLock lock(&mu_);
    active_[current_]++;
    return current_;
  }

  void Exit(int epoch) {
    MutexLock lock(&mu_);
    if (--active_[epoch] == 0) cv_.NotifyAll();
  }

  // Returns once every reader that had entered when it was called has exited.
  void Wait() {
    MutexLock one_at_a_time(&wait_mu_);
    MutexLock lock(&mu_);
    const int old = current_;
    current_ ^= 1;
    while (active_[old] != 0) cv_.Wait(&mu_);
  }

 private:
  Mutex wait_mu_ ACQUIRED_BEFORE(mu_);
  Mutex mu_;
  CondVar cv_;
  int current_ GUARDED_BY(mu_) = 0;
  uint64_t active_[2] GUARDED_BY(mu_) = {0, 0};
};

// Enters a GracePeriod for the lifetime of a scope.
class GracePeriodReader {
 public:
  explicit GracePeriodReader(GracePeriod* period) : period_(period), epoch_(period->Enter()) {}
  ~GracePeriodReader() { period_->Exit(epoch_); }
  GracePeriodReader(const GracePeriodReader&) = delete;
  GracePeriodReader& operator=(const GracePeriodReader&) = delete;

 private:
  GracePeriod* const period_;
  const int epoch_;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_GRACE_PERIOD_H_
