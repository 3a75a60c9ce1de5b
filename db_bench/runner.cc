#include "db_bench/runner.h"

#include <time.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "util/mutex.h"

namespace kvbench {

namespace {
double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

ThreadContext::ThreadContext(uint64_t tid, const RunSpec& spec, std::atomic<uint64_t>* progress)
    : tid_(tid),
      threads_(spec.threads),
      timed_(spec.duration > 0),
      quota_(spec.total_ops * (tid + 1) / spec.threads - spec.total_ops * tid / spec.threads),
      progress_(progress),
      rng_(spec.seed * 1000003 + tid) {}

bool ThreadContext::More() const {
  if (timed_) return Clock::now() < deadline_;
  return ops_ < quota_;
}

double ThreadContext::Record(Clock::time_point start, uint64_t ops, uint64_t keys, uint64_t bytes) {
  const double us = Micros(Clock::now() - start);
  hist_.Add(us);
  busy_us_ += us;
  ops_ += ops;
  keys_ += keys;
  bytes_ += bytes;
  progress_->fetch_add(ops, std::memory_order_relaxed);
  return us;
}

void ThreadContext::AddBusy(Clock::time_point start) { busy_us_ += Micros(Clock::now() - start); }

void ThreadContext::Error(const std::string& what) {
  if (errors_++ == 0) first_error_ = what;
}

void ThreadContext::MergeInto(Result* r) const {
  r->ops += ops_;
  r->keys += keys_;
  r->bytes += bytes_;
  r->lookups += lookups_;
  r->found += found_;
  r->verified += verified_;
  r->errors += errors_;
  if (r->first_error.empty()) r->first_error = first_error_;
  r->seconds = std::max(r->seconds, busy_us_ / 1e6);
  r->cpu_seconds += cpu_seconds_;
  r->hist.Merge(hist_);
  for (int i = 0; i < 3; i++) r->kind_hist[i].Merge(extra[i]);
}

Result RunParallel(const RunSpec& spec, const std::function<OpFn(ThreadContext&)>& make_worker) {
  std::atomic<uint64_t> progress{0};
  std::vector<std::unique_ptr<ThreadContext>> contexts;
  for (uint64_t t = 0; t < spec.threads; t++) {
    contexts.push_back(std::make_unique<ThreadContext>(t, spec, &progress));
  }
  std::latch ready(static_cast<std::ptrdiff_t>(spec.threads));
  std::latch go(1);
  // The threads that are done, for the progress loop below to wait on.
  struct FinishLine {
    kvengine::Mutex mu;
    kvengine::CondVar cv;
    uint64_t finished GUARDED_BY(mu) = 0;
  } line;
  std::vector<std::thread> workers;
  for (uint64_t t = 0; t < spec.threads; t++) {
    workers.emplace_back([&, t] {
      ThreadContext& ctx = *contexts[t];
      OpFn op = make_worker(ctx);
      ready.count_down();
      go.wait();
      const double cpu_start = ThreadCpuSeconds();
      while (ctx.More()) op(ctx);
      if (ctx.on_finish) ctx.on_finish(ctx);
      ctx.SetCpuSeconds(ThreadCpuSeconds() - cpu_start);
      kvengine::MutexLock lock(&line.mu);
      line.finished++;
      line.cv.NotifyAll();
    });
  }
  ready.wait();
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(spec.duration));
  for (auto& c : contexts) c->SetDeadline(deadline);
  go.count_down();

  // Progress on stderr every few seconds while the threads work.
  auto last = start;
  kvengine::MutexLock lock(&line.mu);
  while (line.finished < spec.threads) {
    line.cv.WaitFor(&line.mu, std::chrono::milliseconds(250));
    const auto now = Clock::now();
    if (spec.progress_interval > 0 &&
        std::chrono::duration<double>(now - last).count() >= spec.progress_interval) {
      last = now;
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const uint64_t done = progress.load(std::memory_order_relaxed);
      if (spec.duration > 0) {
        std::fprintf(stderr, "... %s: %" PRIu64 " ops, %.0f of %.0f s\n", spec.label.c_str(), done,
                     elapsed, spec.duration);
      } else {
        std::fprintf(stderr, "... %s: %" PRIu64 " of %" PRIu64 " ops (%.0f%%), %.0f s\n",
                     spec.label.c_str(), done, spec.total_ops,
                     spec.total_ops ? 100.0 * static_cast<double>(done) / spec.total_ops : 100.0,
                     elapsed);
      }
    }
  }
  lock.Unlock();
  for (auto& w : workers) w.join();
  Result r;
  r.threads = spec.threads;
  r.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& c : contexts) c->MergeInto(&r);
  return r;
}

}  // namespace kvbench
