// The benchmark runner: runs one operation function on --threads threads, for --num
// operations or --duration seconds, times each call, shows progress on stderr and merges
// the threads' counters into a Result.
#ifndef KVENGINE_DB_BENCH_RUNNER_H_
#define KVENGINE_DB_BENCH_RUNNER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "db_bench/histogram.h"
#include "db_bench/report.h"

namespace kvbench {

using Clock = std::chrono::steady_clock;

struct RunSpec {
  std::string label;  // for progress lines
  uint64_t threads = 1;
  uint64_t total_ops = 0;  // split among the threads when duration == 0
  double duration = 0;     // seconds; > 0 runs until then instead
  double progress_interval = 0;
  uint64_t seed = 0;
};

// What one thread sees: its share of the work, its random stream and its counters.
// Only its own thread touches it while the benchmark runs.
class ThreadContext {
 public:
  ThreadContext(uint64_t tid, const RunSpec& spec, std::atomic<uint64_t>* progress);

  uint64_t tid() const { return tid_; }
  uint64_t threads() const { return threads_; }
  std::mt19937_64& rng() { return rng_; }

  // This thread's slice [begin, end) of n items (sequential benchmarks).
  uint64_t SliceBegin(uint64_t n) const { return n * tid_ / threads_; }
  uint64_t SliceEnd(uint64_t n) const { return n * (tid_ + 1) / threads_; }

  // Whether another operation should run.
  bool More() const;
  // Operations this thread still owes (unbounded with --duration).
  uint64_t Remaining() const {
    return timed_ ? std::numeric_limits<uint64_t>::max() : quota_ - ops_;
  }
  uint64_t ops_done() const { return ops_; }

  // Records a call that began at `start`: its latency goes to the histogram once (per
  // call, not per key) and counts as `ops` operations touching `keys` keys and `bytes`.
  // Returns the latency in microseconds.
  double Record(Clock::time_point start, uint64_t ops, uint64_t keys, uint64_t bytes);
  // Counts time that belongs to the benchmark but is no operation (a final fsync).
  void AddBusy(Clock::time_point start);
  void CountLookups(uint64_t lookups, uint64_t found) {
    lookups_ += lookups;
    found_ += found;
  }
  void CountVerified(uint64_t n) { verified_ += n; }
  void Error(const std::string& what);

  // Set by the runner.
  void SetDeadline(Clock::time_point deadline) { deadline_ = deadline; }
  // The CPU time this thread spent from its first operation to its last (its own work
  // and the engine's on this thread, not its waits for a core).
  void SetCpuSeconds(double seconds) { cpu_seconds_ = seconds; }
  void MergeInto(Result* r) const;

  Histogram extra[3];  // per-kind histograms for benchmarks that mix kinds (gc_churn)
  // Called on the thread after its last operation, inside the timed span (a final fsync).
  std::function<void(ThreadContext&)> on_finish;

 private:
  uint64_t tid_;
  uint64_t threads_;
  bool timed_;
  uint64_t quota_;
  Clock::time_point deadline_;
  std::atomic<uint64_t>* progress_;
  std::mt19937_64 rng_;
  Histogram hist_;
  uint64_t ops_ = 0, keys_ = 0, bytes_ = 0;
  uint64_t lookups_ = 0, found_ = 0, verified_ = 0, errors_ = 0;
  std::string first_error_;
  double busy_us_ = 0;
  double cpu_seconds_ = 0;
};

using OpFn = std::function<void(ThreadContext&)>;

// The calling thread's CPU time so far, in seconds (CLOCK_THREAD_CPUTIME_ID).
double ThreadCpuSeconds();

// For each thread, calls make_worker(ctx) on that thread before the clock starts (to
// allocate its buffers) and then the returned function while ctx.More().
Result RunParallel(const RunSpec& spec, const std::function<OpFn(ThreadContext&)>& make_worker);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_RUNNER_H_
