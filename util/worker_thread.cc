#include "util/worker_thread.h"

namespace kvengine {

WorkerThread::WorkerThread() : thread_([this] { Loop(); }) {}

WorkerThread::~WorkerThread() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void WorkerThread::Submit(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
    submitted_++;
  }
  cv_.NotifyAll();
}

void WorkerThread::Drain() {
  MutexLock lock(&mu_);
  const uint64_t target = submitted_;
  while (finished_ < target) cv_.Wait(&mu_);
}

void WorkerThread::Loop() {
  MutexLock lock(&mu_);
  for (;;) {
    while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) return;  // stopping, and nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.Unlock();
    task();
    task = nullptr;  // what it captured goes here too, off the lock
    lock.Lock();
    finished_++;
    cv_.NotifyAll();
  }
}

}  // namespace kvengine
