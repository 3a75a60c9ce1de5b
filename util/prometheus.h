// Exposition: a writer of the Prometheus text exposition format (version 0.0.4), and
// the families every process exports about its perf histograms (util/perf.def).
//
// Every layer that renders metrics writes through it: the engine's statistics
// (db/db_impl_stats.cc) and an attached client's own (attach/attached_db.cc).  Names
// follow Prometheus' conventions: a kvengine_ prefix, _total for counters, _bytes /
// _seconds for units; a family's samples follow its HELP and TYPE lines, together.
//
// Thread-safety: an Exposition belongs to one thread.
#ifndef KVENGINE_UTIL_PROMETHEUS_H_
#define KVENGINE_UTIL_PROMETHEUS_H_

#include <cstdint>
#include <string>

namespace kvengine {

class Exposition {
 public:
  // One metric family with a single, unlabelled sample.
  void Metric(const std::string& name, const char* type, const char* help, uint64_t value);
  // The HELP and TYPE lines of a family.
  void Header(const std::string& name, const char* type, const char* help);
  // One sample; `labels` is "" or `{a="b",...}`.
  void Sample(const std::string& name, const std::string& labels, double value);
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// The perf histograms of this process (util/perf_point.h), for the keys with samples:
//   kvengine_perf_latency_seconds{key,layer,quantile}  summary (P50, P90, P99, P99.9)
//   kvengine_perf_latency_max_seconds{key,layer}       gauge
//   kvengine_operation_latency_seconds{operation,layer,le}  histogram with cumulative
//       buckets from 1 us to 10 s (kLatencyBucketsSeconds), which a fleet can sum
//       across processes, unlike quantiles.
void AppendPerfFamilies(Exposition* e);

// The upper bounds of kvengine_operation_latency_seconds' buckets, in seconds (+Inf
// is added).
inline constexpr double kLatencyBucketsSeconds[] = {
    1e-6, 2.5e-6, 5e-6,   1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
    5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1,      2.5,  5,    10};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_PROMETHEUS_H_
