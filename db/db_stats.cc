// DBImpl::StatsPrometheus: the DB's statistics and the perf histograms in the Prometheus
// text exposition format (version 0.0.4), for a serving process to publish unchanged.
//
// Every figure here is one that "kvengine.stats" reports too; tiers add their metrics
// here as they add them there.  Names follow Prometheus conventions: a kvengine_ prefix,
// _total for counters, _bytes / _seconds for units.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "db/db_impl.h"

namespace kvengine {

namespace {

class Exposition {
 public:
  // One metric family with a single, unlabelled sample.
  void Metric(const char* name, const char* type, const char* help, uint64_t value) {
    Header(name, type, help);
    Sample(name, "", static_cast<double>(value));
  }
  void Header(const char* name, const char* type, const char* help) {
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
  // `labels` is "" or `{a="b",...}`.
  void Sample(const std::string& name, const std::string& labels, double value) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %.17g\n", value);
    out_ += name;
    out_ += labels;
    out_ += buf;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

std::string DBImpl::StatsPrometheus() const {
  const MemoryTier::Stats m = memory_->GetStats();
  Exposition e;
  e.Metric("kvengine_memory_items", "gauge", "Values held in the memory tier.", m.items);
  e.Metric("kvengine_memory_value_bytes", "gauge", "Bytes of the values held in the memory tier.",
           m.value_bytes);
  e.Metric("kvengine_memory_allocated_bytes", "gauge",
           "Arena bytes taken by the memory tier's values (slab class sizes).", m.allocated_bytes);
  e.Metric("kvengine_memory_capacity_bytes", "gauge", "Size of the memory tier's arena.",
           m.capacity_bytes);
  e.Metric("kvengine_memory_evictions_total", "counter", "Values evicted from the memory tier.",
           m.evictions);
  e.Metric("kvengine_memory_evicted_bytes_total", "counter",
           "Bytes of the values evicted from the memory tier.", m.evicted_bytes);
  e.Metric("kvengine_memory_eviction_refusals_total", "counter",
           "Evictions refused by the offload tier (the value stayed in memory).",
           m.eviction_refusals);
  e.Metric("kvengine_memory_rejected_puts_total", "counter",
           "Puts the memory tier rejected with NoSpace.", m.rejected_puts);
  e.Metric("kvengine_memory_lookup_hits_total", "counter",
           "Memory tier index lookups that found the key.", m.lookup_hits);
  e.Metric("kvengine_memory_lookup_misses_total", "counter",
           "Memory tier index lookups that did not find the key.", m.lookup_misses);
  e.Metric("kvengine_memory_index_bytes", "gauge",
           "RAM of the memory tier's index beside keys and values (item arrays, index slots).",
           m.index_bytes);

  e.Header("kvengine_tier_hits_total", "counter", "Reads (Get, GetInto, batch) served per tier.");
  e.Sample("kvengine_tier_hits_total", "{tier=\"memory\"}",
           static_cast<double>(counters_.memory_hits.load(std::memory_order_relaxed)));
  e.Metric("kvengine_misses_total", "counter", "Reads of keys found in no tier.",
           counters_.misses.load(std::memory_order_relaxed));
  e.Metric("kvengine_puts_total", "counter", "Keys stored.",
           counters_.puts.load(std::memory_order_relaxed));
  e.Metric("kvengine_put_bytes_total", "counter", "Value bytes stored.",
           counters_.put_bytes.load(std::memory_order_relaxed));
  e.Metric("kvengine_put_failures_total", "counter", "Keys whose put failed.",
           counters_.put_failures.load(std::memory_order_relaxed));
  e.Metric("kvengine_gets_total", "counter", "Keys read (Get, GetInto, BatchGetInto).",
           counters_.gets.load(std::memory_order_relaxed));
  e.Metric("kvengine_get_bytes_total", "counter", "Value bytes read.",
           counters_.get_bytes.load(std::memory_order_relaxed));
  e.Metric("kvengine_exists_queries_total", "counter", "Keys asked about by BatchExists.",
           counters_.exists_queries.load(std::memory_order_relaxed));
  e.Metric("kvengine_deletes_total", "counter", "Keys removed by deletes.",
           counters_.deletes.load(std::memory_order_relaxed));
  e.Metric("kvengine_batch_calls_total", "counter", "Batch calls accepted.",
           counters_.batch_calls.load(std::memory_order_relaxed));
  if (!options_.local_listen.empty()) {
    const LocalServerCounters& l = local_counters_;
    e.Metric("kvengine_local_clients_accepted_total", "counter",
             "Connections of attached processes admitted.", l.accepted.load());
    e.Metric("kvengine_local_clients_refused_total", "counter",
             "Connections of attached processes refused (uid not allowed).", l.refused.load());
    e.Metric("kvengine_local_reservations_expired_total", "counter",
             "Slots attached clients reserved and held past local_reservation_timeout_ms.",
             l.reservations_expired.load());
    e.Metric("kvengine_local_reserve_requests_total", "counter",
             "RESERVE round trips of attached clients' puts.", l.reserve_requests.load());
    e.Metric("kvengine_local_spare_commits_total", "counter",
             "Values attached clients put into spare slots (a put in one round trip).",
             l.spare_commits.load());
  }

  e.Header("kvengine_errors_total", "counter", "Failed keys and calls, by kind of error.");
  for (int c = 1; c < ErrorCounters::kNumCodes; c++) {
    const auto code = static_cast<Status::Code>(c);
    e.Sample("kvengine_errors_total", std::string("{kind=\"") + Status::CodeName(code) + "\"}",
             static_cast<double>(errors_.Get(code)));
  }

  // Perf histograms as summaries, for the keys that have samples.
  static const double kQuantiles[] = {0.5, 0.9, 0.99, 0.999};
  e.Header("kvengine_perf_latency_seconds", "summary",
           "Latency of each perf key (see docs/observability.md), process-wide.");
  for (int k = 0; k < kNumPerfKeys; k++) {
    const PerfStats d = PerfSnapshot(static_cast<PerfKey>(k));
    if (d.count == 0) continue;
    const std::string base =
        std::string("key=\"") + kPerfKeys[k].name + "\",layer=\"" + kPerfKeys[k].layer + "\"";
    const double quantile_ns[] = {d.p50_ns, d.p90_ns, d.p99_ns, d.p999_ns};
    for (int i = 0; i < 4; i++) {
      char label[48];
      std::snprintf(label, sizeof(label), ",quantile=\"%g\"}", kQuantiles[i]);
      e.Sample("kvengine_perf_latency_seconds", "{" + base + label, quantile_ns[i] / 1e9);
    }
    e.Sample("kvengine_perf_latency_seconds_sum", "{" + base + "}", d.sum_ns / 1e9);
    e.Sample("kvengine_perf_latency_seconds_count", "{" + base + "}", static_cast<double>(d.count));
  }
  e.Header("kvengine_perf_latency_max_seconds", "gauge",
           "Longest sample of each perf key since the last reset.");
  for (int k = 0; k < kNumPerfKeys; k++) {
    const PerfStats d = PerfSnapshot(static_cast<PerfKey>(k));
    if (d.count == 0) continue;
    e.Sample(
        "kvengine_perf_latency_max_seconds",
        std::string("{key=\"") + kPerfKeys[k].name + "\",layer=\"" + kPerfKeys[k].layer + "\"}",
        d.max_ns / 1e9);
  }
  return e.Take();
}

}  // namespace kvengine
