// PerfPoint: times one scope into the latency histogram of its perf key.
//
// Perf keys are declared once, in util/perf.def; this header turns them into the PerfKey
// enum and a constexpr table of names, layers, levels and help texts.
//
//   Status DBImpl::BatchPut(...) {
//     PerfPoint perf(PerfKey::db_batch_put);  // starts now if the level records it
//     ...
//   }                                         // ends (records) when it goes out of scope
//
// Start() (re)starts the timer, End() records and stops it, Abandon() stops it without
// recording (a scope that turned out not to be worth a sample, e.g. an early return
// before any work).  All three are no-ops for a key the current level does not record.
//
// With PerfLevel::kOff the constructor is one relaxed load and one predictable branch;
// nothing else runs, not even a clock read.  When on, a scope reads the CPU's time-stamp
// counter twice (rdtsc on x86: invariant TSC, a fraction of a clock_gettime under a
// hypervisor's kvm-clock) and records ticks into per-stripe lock-free histograms
// (threads are spread over 16 stripes, so they rarely share a cache line).  Ticks become
// nanoseconds when read, at a rate calibrated against steady_clock.  Elsewhere the
// ticks are steady_clock nanoseconds.
//
// Thread-safety: a PerfPoint belongs to one thread; the recording machinery is
// thread-safe.
#ifndef KVENGINE_UTIL_PERF_POINT_H_
#define KVENGINE_UTIL_PERF_POINT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvengine/perf.h"
#include "util/histogram.h"

namespace kvengine {

enum class PerfKey : int {
#define KV_PERF_KEY(name, layer, level, help) name,
#include "util/perf.def"
#undef KV_PERF_KEY
};

inline constexpr int kNumPerfKeys = 0
#define KV_PERF_KEY(name, layer, level, help) +1
#include "util/perf.def"
#undef KV_PERF_KEY
    ;

struct PerfKeyInfo {
  const char* name;
  const char* layer;
  PerfLevel level;  // the least level that records the key: kEntry or kAll
  const char* help;
};

namespace perf_internal {
inline constexpr PerfLevel entry = PerfLevel::kEntry;
inline constexpr PerfLevel inner = PerfLevel::kAll;
}  // namespace perf_internal

inline constexpr PerfKeyInfo kPerfKeys[kNumPerfKeys] = {
#define KV_PERF_KEY(name, layer, level, help) {#name, #layer, perf_internal::level, help},
#include "util/perf.def"
#undef KV_PERF_KEY
};

namespace perf_internal {
extern std::atomic<int> g_level;
void Record(PerfKey key, uint64_t ticks);
inline uint64_t NowNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
inline uint64_t NowTicks() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_ia32_rdtsc();
#else
  return NowNanos();
#endif
}
// Nanoseconds per tick of NowTicks().
double NanosPerTick();
}  // namespace perf_internal

// True when the current level records `key`.
inline bool PerfEnabled(PerfKey key) {
  return perf_internal::g_level.load(std::memory_order_relaxed) >=
         static_cast<int>(kPerfKeys[static_cast<int>(key)].level);
}

class PerfPoint {
 public:
  // Starts timing now when the current level records `key`.
  explicit PerfPoint(PerfKey key) : key_(key) {
    if (__builtin_expect(PerfEnabled(key), 0)) start_ = perf_internal::NowTicks();
  }
  struct Deferred {};
  // Does not start: call Start() where the scope of interest begins.
  PerfPoint(PerfKey key, Deferred) : key_(key) {}
  ~PerfPoint() {
    if (__builtin_expect(start_ != kStopped, 0)) End();
  }
  PerfPoint(const PerfPoint&) = delete;
  PerfPoint& operator=(const PerfPoint&) = delete;

  // (Re)starts the timer when the current level records the key.
  void Start() { start_ = PerfEnabled(key_) ? perf_internal::NowTicks() : kStopped; }
  // Records the time since Start and stops; a no-op when stopped.
  void End() {
    if (start_ == kStopped) return;
    const uint64_t now = perf_internal::NowTicks();
    perf_internal::Record(key_, now > start_ ? now - start_ : 0);
    start_ = kStopped;
  }
  // Stops without recording.
  void Abandon() { start_ = kStopped; }
  bool running() const { return start_ != kStopped; }

 private:
  static constexpr uint64_t kStopped = ~uint64_t{0};
  const PerfKey key_;
  uint64_t start_ = kStopped;
};

// The samples of one key over every thread, in nanoseconds.
struct PerfStats {
  uint64_t count = 0;
  double sum_ns = 0, mean_ns = 0, p50_ns = 0, p90_ns = 0, p99_ns = 0, p999_ns = 0, max_ns = 0;
};
// Thread-safe.
PerfStats PerfSnapshot(PerfKey key);

// The samples of `key` at or below each of `bounds_ns` (ascending), cumulative, into
// *cumulative (one per bound); *count and *sum_ns of all of them.  A histogram bucket
// counts under the first bound its whole range is at or below (buckets are at most
// 6.25% wide).  Thread-safe.
void PerfCumulativeCounts(PerfKey key, std::span<const double> bounds_ns,
                          std::vector<uint64_t>* cumulative, uint64_t* count, double* sum_ns);

// "| key | layer | level | what it times |" markdown table of every key, in .def order
// (the table in docs/observability.md; perf_test checks that they match).
std::string PerfKeyMarkdownTable();

}  // namespace kvengine

#endif  // KVENGINE_UTIL_PERF_POINT_H_
