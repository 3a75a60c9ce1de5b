// Busy polling for a Unix socket's next message, where it pays.
//
// A request/answer over a local socket costs two wake-ups of a sleeping thread, and a
// wake-up is expensive on virtual machines: on the development VM a 40-byte ping-pong
// between two processes took 60-75 us blocking in poll() and 4 us when both sides
// polled without sleeping.  An attached client's put is two such round trips around a
// copy, so at 64 KiB values the wake-ups cost more than the copy.
//
// Spinning costs a core for as long as it lasts, so a waiter spins only when it expects
// its message soon: BusyPollPredictor keeps, per kind of wait (the op just answered or
// sent), an average of how long such waits took, and says spin only when that average
// is within the budget (Options::local_busy_poll_us).  A wait longer than the budget
// raises the average, so a connection whose client went quiet, or whose waits are long
// (a client computing for milliseconds between calls), stops spinning on its own; waits
// measured while sleeping keep the average current, so it starts again when they
// shorten.
#ifndef KVENGINE_TRANSPORT_BUSY_POLL_H_
#define KVENGINE_TRANSPORT_BUSY_POLL_H_

#include <array>
#include <chrono>
#include <cstdint>

namespace kvengine {

// Polls fd for input without sleeping (yielding the CPU between polls to any other
// runnable thread) until it is readable, has an error or hangup, or `budget` passed.
// True when fd is ready to be read.
bool BusyPollReadable(int fd, std::chrono::microseconds budget);

class BusyPollPredictor {
 public:
  using Clock = std::chrono::steady_clock;

  // budget_us 0: never spin.
  explicit BusyPollPredictor(uint64_t budget_us) : budget_us_(budget_us) {}

  // Waits (by spinning, when the waits after `kind` have been short) until fd is ready
  // to be read or the budget passed; returns whether it is ready.  The caller then
  // reads, or sleeps in poll() as without busy polling, and calls Done.
  bool Spin(int fd, uint8_t kind);
  // Whether waits after `kind` have been short enough to spin through.
  bool ShouldSpin(uint8_t kind) const {
    return budget_us_ != 0 && average_us_[kind] <= static_cast<float>(budget_us_);
  }
  std::chrono::microseconds budget() const { return std::chrono::microseconds(budget_us_); }
  // The wait after `kind` that began at `began` just ended (its message is readable).
  void Done(uint8_t kind, Clock::time_point began);

 private:
  const uint64_t budget_us_;
  std::array<float, 256> average_us_{};  // per kind; 0 until measured: spin at first
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_BUSY_POLL_H_
