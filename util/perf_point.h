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
// nothing else runs, not even a clock read.  Samples land in per-stripe lock-free
// histograms (threads are spread over 16 stripes), so threads rarely share a cache line.
//
// Thread-safety: a PerfPoint belongs to one thread; the recording machinery is
// thread-safe.
#ifndef KVENGINE_UTIL_PERF_POINT_H_
#define KVENGINE_UTIL_PERF_POINT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

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

inline const PerfKeyInfo& GetPerfKeyInfo(PerfKey key) { return kPerfKeys[static_cast<int>(key)]; }

namespace perf_internal {
extern std::atomic<int> g_level;
void Record(PerfKey key, uint64_t nanos);
inline uint64_t NowNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
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
    if (__builtin_expect(PerfEnabled(key), 0)) start_ = perf_internal::NowNanos();
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
  void Start() { start_ = PerfEnabled(key_) ? perf_internal::NowNanos() : kStopped; }
  // Records the time since Start and stops; a no-op when stopped.
  void End() {
    if (start_ == kStopped) return;
    const uint64_t now = perf_internal::NowNanos();
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

// The merged histogram of `key` over every thread.  Thread-safe.
HistogramData PerfSnapshot(PerfKey key);

// "| key | layer | level | what it times |" markdown table of every key, in .def order
// (the table in docs/observability.md; perf_test checks that they match).
std::string PerfKeyMarkdownTable();

}  // namespace kvengine

#endif  // KVENGINE_UTIL_PERF_POINT_H_
