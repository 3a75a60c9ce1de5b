#include "transport/busy_poll.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>

namespace kvengine {

bool BusyPollReadable(int fd, std::chrono::microseconds budget) {
  const auto until = std::chrono::steady_clock::now() + budget;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    // Lets a thread that shares this CPU -- possibly the one about to answer -- run.
    sched_yield();
  }
}

bool BusyPollPredictor::Spin(int fd, uint8_t kind) {
  if (budget_us_ == 0 || average_us_[kind] > static_cast<float>(budget_us_)) return false;
  return BusyPollReadable(fd, std::chrono::microseconds(budget_us_));
}

void BusyPollPredictor::Done(uint8_t kind, Clock::time_point began) {
  // Capped at twice the budget, so that one idle spell (seconds) does not keep a busy
  // connection from spinning for dozens of waits after it: three short waits bring
  // the average back under the budget, as three long ones take it over.
  const float cap = 2.0f * static_cast<float>(budget_us_);
  const float us =
      std::min(cap, std::chrono::duration<float, std::micro>(Clock::now() - began).count());
  // An average over about the last four waits: quick to follow a change of pattern.
  average_us_[kind] += (us - average_us_[kind]) / 4;
}

}  // namespace kvengine
