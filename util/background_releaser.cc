#include "util/background_releaser.h"

namespace kvengine {

BackgroundReleaser::BackgroundReleaser() : thread_([this] { Loop(); }) {}

BackgroundReleaser::~BackgroundReleaser() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundReleaser::Release(std::shared_ptr<void> object) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(object));
    queued_++;
  }
  cv_.notify_all();
}

void BackgroundReleaser::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = queued_;
  cv_.wait(lock, [&] { return released_ >= target; });
}

void BackgroundReleaser::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    std::shared_ptr<void> object = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    object.reset();  // the slow part, outside the lock
    lock.lock();
    released_++;
    cv_.notify_all();
  }
}

}  // namespace kvengine
