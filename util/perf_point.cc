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
  thread_local const int stripe =
      static_cast<int>(next.fetch_add(1, std::memory_order_relaxed) % kStripes);
  return stripe;
}

}  // namespace

void Record(PerfKey key, uint64_t nanos) {
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
  h->Add(nanos);
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
  }
  return "?";
}

// Key levels as the .def spells them.
const char* KeyLevelName(PerfLevel level) { return level == PerfLevel::kEntry ? "entry" : "inner"; }

double Micros(double nanos) { return nanos / 1000.0; }

}  // namespace

void SetPerfLevel(PerfLevel level) {
  perf_internal::g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

PerfLevel GetPerfLevel() {
  return static_cast<PerfLevel>(perf_internal::g_level.load(std::memory_order_relaxed));
}

HistogramData PerfSnapshot(PerfKey key) {
  HistogramData data;
  auto& slots = perf_internal::GetSlots();
  for (int s = 0; s < perf_internal::kStripes; s++) {
    const Histogram* h = slots.h[s][static_cast<int>(key)].load(std::memory_order_acquire);
    if (h != nullptr) h->MergeInto(&data);
  }
  return data;
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
  for (int k = 0; k < kNumPerfKeys; k++) {
    const PerfKeyInfo& info = kPerfKeys[k];
    const HistogramData d = PerfSnapshot(static_cast<PerfKey>(k));
    const double mean = Micros(d.Mean()), p50 = Micros(d.Percentile(0.50)),
                 p90 = Micros(d.Percentile(0.90)), p99 = Micros(d.Percentile(0.99)),
                 p999 = Micros(d.Percentile(0.999)), max = Micros(static_cast<double>(d.max));
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
