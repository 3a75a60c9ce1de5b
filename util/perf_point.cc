#include "util/perf_point.h"

#include <cinttypes>
#include <cstdio>
#include <sstream>

namespace kvengine {

namespace perf_internal {

std::atomic<int> g_level{static_cast<int>(PerfLevel::kOff)};

namespace {

// Threads are spread over kStripes sets of histograms, one histogram per key per stripe,
// each allocated the first time its stripe records its key.  They are never freed (a
// few KiB each, at most kStripes * kNumPerfKeys of them), so a recorder never races a
// free, even at process exit.
constexpr int kStripes = 16;

struct Slots {
  std::atomic<Histogram*> h[kStripes][kNumPerfKeys] = {};
};

Slots& GetSlots() {
  static Slots* slots = new Slots;
  return *slots;
}

int MyStripe() {
  static std::atomic<unsigned> next{0};
  thread_local int stripe = -1;  // constant-initialized: no TLS guard on the hot path
  if (__builtin_expect(stripe < 0, 0)) {
    stripe = static_cast<int>(next.fetch_add(1, std::memory_order_relaxed) % kStripes);
  }
  return stripe;
}

}  // namespace

namespace {
struct Origin {
  uint64_t ticks;
  uint64_t nanos;
};
const Origin& GetOrigin() {
  static const Origin origin{NowTicks(), NowNanos()};
  return origin;
}
// Taken at load time, so that the calibration interval is usually the process's age.
[[maybe_unused]] const Origin& g_origin = GetOrigin();
}  // namespace

double NanosPerTick() {
#if defined(__x86_64__) || defined(__i386__)
  const Origin& o = GetOrigin();
  uint64_t ticks, nanos;
  // At least 5 ms of calibration (spent only by a report in a process younger than that).
  do {
    nanos = NowNanos();
    ticks = NowTicks();
  } while (nanos - o.nanos < 5'000'000 || ticks <= o.ticks);
  return static_cast<double>(nanos - o.nanos) / static_cast<double>(ticks - o.ticks);
#else
  return 1.0;
#endif
}

void Record(PerfKey key, uint64_t ticks) {
  std::atomic<Histogram*>& slot = GetSlots().h[MyStripe()][static_cast<int>(key)];
  Histogram* h = slot.load(std::memory_order_acquire);
  if (h == nullptr) {
    Histogram* fresh = new Histogram;
    if (slot.compare_exchange_strong(h, fresh, std::memory_order_acq_rel)) {
      h = fresh;
    } else {
      delete fresh;  // another thread of this stripe won; h holds its histogram
    }
  }
  h->Add(ticks);
}

}  // namespace perf_internal

namespace {

const char* PerfLevelName(PerfLevel level) {
  switch (level) {
    case PerfLevel::kOff:
      return "off";
    case PerfLevel::kEntry:
      return "entry";
    case PerfLevel::kAll:
      return "all";
    case PerfLevel::kAuto:
      return "auto";
  }
  return "?";
}

// Key levels as the .def spells them.
const char* KeyLevelName(PerfLevel level) { return level == PerfLevel::kEntry ? "entry" : "inner"; }

double Micros(double nanos) { return nanos / 1000.0; }

}  // namespace

void SetPerfLevel(PerfLevel level) {
  if (level == PerfLevel::kAuto) level = PerfLevel::kOff;  // only DB::Open knows its options
  perf_internal::g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

PerfLevel GetPerfLevel() {
  return static_cast<PerfLevel>(perf_internal::g_level.load(std::memory_order_relaxed));
}

namespace {
PerfStats ToStats(const HistogramData& d, double scale) {
  PerfStats st;
  st.count = d.count;
  if (d.count == 0) return st;
  st.sum_ns = static_cast<double>(d.sum) * scale;
  st.mean_ns = d.Mean() * scale;
  st.p50_ns = d.Percentile(0.50) * scale;
  st.p90_ns = d.Percentile(0.90) * scale;
  st.p99_ns = d.Percentile(0.99) * scale;
  st.p999_ns = d.Percentile(0.999) * scale;
  st.max_ns = static_cast<double>(d.max) * scale;
  return st;
}

HistogramData MergedTicks(PerfKey key) {
  HistogramData data;
  auto& slots = perf_internal::GetSlots();
  for (int s = 0; s < perf_internal::kStripes; s++) {
    const Histogram* h = slots.h[s][static_cast<int>(key)].load(std::memory_order_acquire);
    if (h != nullptr) h->MergeInto(&data);
  }
  return data;
}
}  // namespace

PerfStats PerfSnapshot(PerfKey key) {
  return ToStats(MergedTicks(key), perf_internal::NanosPerTick());
}

void PerfCumulativeCounts(PerfKey key, std::span<const double> bounds_ns,
                          std::vector<uint64_t>* cumulative, uint64_t* count, double* sum_ns) {
  const HistogramData d = MergedTicks(key);
  const double scale = perf_internal::NanosPerTick();
  cumulative->assign(bounds_ns.size(), 0);
  *count = d.count;
  *sum_ns = static_cast<double>(d.sum) * scale;
  if (d.count == 0) return;
  size_t bound = 0;
  for (int b = 0; b < HistogramBuckets::kNumBuckets && bound < bounds_ns.size(); b++) {
    if (d.buckets[b] == 0) continue;
    const double top_ns = static_cast<double>(HistogramBuckets::UpperBound(b) - 1) * scale;
    while (bound < bounds_ns.size() && top_ns > bounds_ns[bound]) bound++;
    if (bound < bounds_ns.size()) (*cumulative)[bound] += d.buckets[b];
  }
  for (size_t i = 1; i < cumulative->size(); i++) (*cumulative)[i] += (*cumulative)[i - 1];
}

void ResetPerf() {
  auto& slots = perf_internal::GetSlots();
  for (int s = 0; s < perf_internal::kStripes; s++) {
    for (int k = 0; k < kNumPerfKeys; k++) {
      Histogram* h = slots.h[s][k].load(std::memory_order_acquire);
      if (h != nullptr) h->Clear();
    }
  }
}

std::string PerfReport(bool json) {
  std::ostringstream out;
  char line[512];
  if (json) {
    out << "{\"level\":\"" << PerfLevelName(GetPerfLevel()) << "\",\"unit\":\"us\",\"keys\":{";
  } else {
    out << "** kvengine perf (level=" << PerfLevelName(GetPerfLevel()) << ", times in us) **\n";
    std::snprintf(line, sizeof(line), "%-22s %-9s %-5s %10s %10s %10s %10s %10s %10s %10s\n", "key",
                  "layer", "level", "count", "mean", "p50", "p90", "p99", "p99.9", "max");
    out << line;
  }
  const double scale = perf_internal::NanosPerTick();
  for (int k = 0; k < kNumPerfKeys; k++) {
    const PerfKeyInfo& info = kPerfKeys[k];
    const PerfStats d = ToStats(MergedTicks(static_cast<PerfKey>(k)), scale);
    const double mean = Micros(d.mean_ns), p50 = Micros(d.p50_ns), p90 = Micros(d.p90_ns),
                 p99 = Micros(d.p99_ns), p999 = Micros(d.p999_ns), max = Micros(d.max_ns);
    if (json) {
      std::snprintf(line, sizeof(line),
                    "%s\"%s\":{\"layer\":\"%s\",\"level\":\"%s\",\"count\":%" PRIu64
                    ",\"mean\":%.3f,\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"p99.9\":%.3f,"
                    "\"max\":%.3f}",
                    k == 0 ? "" : ",", info.name, info.layer, KeyLevelName(info.level), d.count,
                    mean, p50, p90, p99, p999, max);
    } else {
      std::snprintf(line, sizeof(line),
                    "%-22s %-9s %-5s %10" PRIu64 " %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f\n",
                    info.name, info.layer, KeyLevelName(info.level), d.count, mean, p50, p90, p99,
                    p999, max);
    }
    out << line;
  }
  if (json) out << "}}";
  return out.str();
}

std::string PerfKeyMarkdownTable() {
  std::ostringstream out;
  out << "| key | layer | level | what it times |\n";
  out << "|---|---|---|---|\n";
  for (const PerfKeyInfo& info : kPerfKeys) {
    out << "| `" << info.name << "` | " << info.layer << " | " << KeyLevelName(info.level) << " | "
        << info.help << " |\n";
  }
  return out.str();
}

}  // namespace kvengine
