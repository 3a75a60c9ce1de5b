#include "util/prometheus.h"

#include <cstdio>
#include <span>
#include <vector>

#include "util/perf_point.h"

namespace kvengine {

void Exposition::Metric(const std::string& name, const char* type, const char* help,
                        uint64_t value) {
  Header(name, type, help);
  Sample(name, "", static_cast<double>(value));
}

void Exposition::Header(const std::string& name, const char* type, const char* help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += " ";
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += " ";
  out_ += type;
  out_ += "\n";
}

void Exposition::Sample(const std::string& name, const std::string& labels, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), " %.17g\n", value);
  out_ += name;
  out_ += labels;
  out_ += buf;
}

namespace {

std::string KeyLabels(const char* key_label, int k) {
  return std::string(key_label) + "=\"" + kPerfKeys[k].name + "\",layer=\"" +
         kPerfKeys[k].layer + "\"";
}

// One key's samples, read once for the three families.
struct KeySamples {
  int key;
  PerfStats stats;
  std::vector<uint64_t> cumulative;  // per kLatencyBucketsSeconds
  uint64_t count = 0;                // the histogram's, +Inf (read with `cumulative`)
  double sum_ns = 0;
};

std::vector<KeySamples> SampledKeys() {
  std::vector<double> bounds_ns;
  for (double s : kLatencyBucketsSeconds) bounds_ns.push_back(s * 1e9);
  std::vector<KeySamples> keys;
  for (int k = 0; k < kNumPerfKeys; k++) {
    KeySamples one{k, PerfSnapshot(static_cast<PerfKey>(k)), {}, 0, 0};
    if (one.stats.count == 0) continue;
    PerfCumulativeCounts(static_cast<PerfKey>(k), bounds_ns, &one.cumulative, &one.count,
                         &one.sum_ns);
    keys.push_back(std::move(one));
  }
  return keys;
}

void AppendSummaries(const std::vector<KeySamples>& keys, Exposition* e) {
  static const double kQuantiles[] = {0.5, 0.9, 0.99, 0.999};
  e->Header("kvengine_perf_latency_seconds", "summary",
            "Latency of each perf key (see docs/observability.md), process-wide.");
  for (const KeySamples& k : keys) {
    const PerfStats& d = k.stats;
    const std::string base = KeyLabels("key", k.key);
    const double quantile_ns[] = {d.p50_ns, d.p90_ns, d.p99_ns, d.p999_ns};
    for (int i = 0; i < 4; i++) {
      char label[48];
      std::snprintf(label, sizeof(label), ",quantile=\"%g\"}", kQuantiles[i]);
      e->Sample("kvengine_perf_latency_seconds", "{" + base + label, quantile_ns[i] / 1e9);
    }
    e->Sample("kvengine_perf_latency_seconds_sum", "{" + base + "}", d.sum_ns / 1e9);
    e->Sample("kvengine_perf_latency_seconds_count", "{" + base + "}",
              static_cast<double>(d.count));
  }
  e->Header("kvengine_perf_latency_max_seconds", "gauge",
            "Longest sample of each perf key since the last reset.");
  for (const KeySamples& k : keys) {
    e->Sample("kvengine_perf_latency_max_seconds", "{" + KeyLabels("key", k.key) + "}",
              k.stats.max_ns / 1e9);
  }
}

void AppendHistograms(const std::vector<KeySamples>& keys, Exposition* e) {
  static const std::string kName = "kvengine_operation_latency_seconds";
  e->Header(kName, "histogram",
            "Latency of each timed operation (a perf key: the operation label), "
            "process-wide, in buckets that sum across processes.");
  for (const KeySamples& k : keys) {
    const std::string base = KeyLabels("operation", k.key);
    for (size_t i = 0; i < k.cumulative.size(); i++) {
      char le[48];
      std::snprintf(le, sizeof(le), ",le=\"%g\"}", kLatencyBucketsSeconds[i]);
      e->Sample(kName + "_bucket", "{" + base + le, static_cast<double>(k.cumulative[i]));
    }
    const double count = static_cast<double>(k.count);
    e->Sample(kName + "_bucket", "{" + base + ",le=\"+Inf\"}", count);
    e->Sample(kName + "_sum", "{" + base + "}", k.sum_ns / 1e9);
    e->Sample(kName + "_count", "{" + base + "}", count);
  }
}

}  // namespace

void AppendPerfFamilies(Exposition* e) {
  const std::vector<KeySamples> keys = SampledKeys();
  AppendSummaries(keys, e);
  AppendHistograms(keys, e);
}

}  // namespace kvengine
