#include "util/worker_thread.h"

namespace kvengine {

WorkerThread::WorkerThread() : thread_([this] { Loop(); }) {}

WorkerThread::~WorkerThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WorkerThread::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    submitted_++;
  }
  cv_.notify_all();
}

void WorkerThread::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = submitted_;
  cv_.wait(lock, [&] { return finished_ >= target; });
}

void WorkerThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what it captured goes here too, off the lock
    lock.lock();
    finished_++;
    cv_.notify_all();
  }
}

}  // namespace kvengine
