// LogLimiter: lets one kind of log line through at most once per interval and counts
// the events it held back meanwhile, so that a flood of one event -- a client sending
// garbage, connections over a cap, peers that do not read -- costs one line per
// interval, never one per event, and the line still says how many there were.
//
// Thread-safety: thread-safe.
#ifndef KVENGINE_UTIL_LOG_LIMITER_H_
#define KVENGINE_UTIL_LOG_LIMITER_H_

#include <chrono>
#include <cstdint>

#include "util/mutex.h"

namespace kvengine {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogLimiter(Clock::duration interval) : interval_(interval) {}
  LogLimiter(const LogLimiter&) = delete;
  LogLimiter& operator=(const LogLimiter&) = delete;

  // Records one event.  True when its line may be written now: then *held_back is the
  // number of events since the last line that were not logged (0 for the first).
  bool Admit(uint64_t* held_back) {
    const Clock::time_point now = Clock::now();
    MutexLock lock(&mu_);
    if (now < next_) {
      held_back_++;
      return false;
    }
    next_ = now + interval_;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

  Clock::duration interval() const { return interval_; }

 private:
  const Clock::duration interval_;
  Mutex mu_;
  Clock::time_point next_ GUARDED_BY(mu_){};
  uint64_t held_back_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_LOG_LIMITER_H_
