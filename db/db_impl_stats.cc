// DBImpl, statistics: "kvengine.stats" as text and JSON, and StatsPrometheus, the DB's
// statistics and the perf histograms in the Prometheus text exposition format (version
// 0.0.4), for a serving process to publish unchanged.
//
// Every figure here is one that "kvengine.stats" reports too; tiers add their metrics
// here as they add them there.  Names follow Prometheus conventions: a kvengine_ prefix,
// _total for counters, _bytes / _seconds for units.
#include <cinttypes>
#include <cstdio>
#include <sstream>
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
    e.Metric("kvengine_local_shared_channels_total", "counter",
             "Connections of attached processes that carry their frames through shared memory.",
             l.shared_channels.load());
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

std::string DBImpl::StatsText() const {
  MemoryTier::Stats m = memory_->GetStats();
  std::ostringstream out;
  out << "** kvengine stats **\n"
      << "memory.items: " << m.items << "\n"
      << "memory.value_bytes: " << m.value_bytes << "\n"
      << "memory.allocated_bytes: " << m.allocated_bytes << "\n"
      << "memory.capacity_bytes: " << m.capacity_bytes << "\n"
      << "memory.hits: " << counters_.memory_hits.load() << "\n"
      << "memory.evictions: " << m.evictions << "\n"
      << "memory.evicted_bytes: " << m.evicted_bytes << "\n"
      << "memory.rejected_puts: " << m.rejected_puts << "\n"
      << "ssd.hits: " << counters_.ssd_hits.load() << "\n"
      << "promotions: " << counters_.promotions.load() << "\n"
      << "memory.eviction_refusals: " << m.eviction_refusals << "\n"
      << "memory.lookup_hits: " << m.lookup_hits << "\n"
      << "memory.lookup_misses: " << m.lookup_misses << "\n"
      << "memory.index_bytes: " << m.index_bytes << "\n"
      << "memory.index_bytes_per_key: " << (m.items == 0 ? 0 : m.index_bytes / m.items) << "\n"
      << "misses: " << counters_.misses.load() << "\n"
      << "puts: " << counters_.puts.load() << "\n"
      << "put_bytes: " << counters_.put_bytes.load() << "\n"
      << "put_failures: " << counters_.put_failures.load() << "\n"
      << "gets: " << counters_.gets.load() << "\n"
      << "get_bytes: " << counters_.get_bytes.load() << "\n"
      << "exists_queries: " << counters_.exists_queries.load() << "\n"
      << "deletes: " << counters_.deletes.load() << "\n"
      << "batch_calls: " << counters_.batch_calls.load() << "\n";
  out << errors_.ToText();
  if (ssd_ != nullptr) {
    const SsdTier::Stats d = ssd_->GetStats();
    const double ratio = d.live_bytes + d.deleted_bytes == 0
                             ? 0.0
                             : static_cast<double>(d.deleted_bytes) /
                                   static_cast<double>(d.live_bytes + d.deleted_bytes);
    out << "ssd.keys: " << d.keys << "\n"
        << "ssd.live_bytes: " << d.live_bytes << "\n"
        << "ssd.used_bytes: " << d.used_bytes << "\n"
        << "ssd.capacity_bytes: " << d.capacity_bytes << "\n"
        << "ssd.buckets: " << d.buckets << "\n"
        << "ssd.pending_buckets: " << d.pending_buckets << "\n"
        << "ssd.deleted_bytes: " << d.deleted_bytes << "\n"
        << "ssd.deleted_ratio: " << ratio << "\n"
        << "ssd.offloads: " << d.offloads << "\n"
        << "ssd.offload_bytes: " << d.offload_bytes << "\n"
        << "ssd.offload_failures: " << d.offload_failures << "\n"
        << "ssd.reads: " << d.reads << "\n"
        << "ssd.read_bytes: " << d.read_bytes << "\n"
        << "ssd.read_errors: " << d.read_errors << "\n"
        << "ssd.bucket_writes: " << d.bucket_writes << "\n"
        << "ssd.bucket_write_errors: " << d.bucket_write_errors << "\n"
        << "ssd.tombstones: " << d.tombstones << "\n"
        << "ssd.evicted_buckets: " << d.evicted_buckets << "\n"
        << "ssd.evicted_keys: " << d.evicted_keys << "\n"
        << "ssd.gc_rounds: " << d.gc_rounds << "\n"
        << "ssd.gc_buckets_compacted: " << d.gc_buckets_compacted << "\n"
        << "ssd.gc_bytes_reclaimed: " << d.gc_bytes_reclaimed << "\n"
        << "ssd.gc_bytes_punched: " << d.gc_bytes_punched << "\n"
        << "ssd.gc_bytes_rewritten: " << d.gc_bytes_rewritten << "\n"
        << "ssd.gc_keys_lost_race: " << d.gc_keys_lost_race << "\n"
        << "ssd.quarantined_buckets: " << d.quarantined_buckets << "\n"
        << "ssd.recovered_keys: " << d.recovered_keys << "\n"
        << "ssd.torn_tombstone_bytes: " << d.torn_tombstone_bytes << "\n"
        << "ssd.damaged_tombstone_bytes: " << d.damaged_tombstone_bytes << "\n"
        << "ssd.io_uring: " << (d.io_uring ? "true" : "false") << "\n"
        << "ssd.direct_io: " << (d.direct_io ? "true" : "false") << "\n"
        << "ssd.index_bytes: " << d.index_bytes << "\n"
        << "ssd.index_bytes_per_key: " << (d.keys == 0 ? 0 : d.index_bytes / d.keys) << "\n"
        << "ssd.open_files: " << d.open_files << "\n"
        << "ssd.file_opens: " << d.file_opens << "\n"
        << "ssd.open_micros: " << d.open_micros << "\n"
        << "ssd.checkpoint_keys: " << d.checkpoint_keys << "\n"
        << "ssd.checkpoint_rejected: " << d.checkpoint_rejected << "\n"
        << "ssd.checkpoint_writes: " << d.checkpoint_writes << "\n"
        << "ssd.checkpoint_backlog: " << d.checkpoint_backlog << "\n";
  }
  if (!options_.local_listen.empty()) {
    const LocalServerCounters& l = local_counters_;
    out << "local.clients_accepted: " << l.accepted.load() << "\n"
        << "local.clients_refused: " << l.refused.load() << "\n"
        << "local.reservations_expired: " << l.reservations_expired.load() << "\n"
        << "local.reserve_requests: " << l.reserve_requests.load() << "\n"
        << "local.spare_commits: " << l.spare_commits.load() << "\n"
        << "local.shared_channels: " << l.shared_channels.load() << "\n";
  }
  return out.str();
}

std::string DBImpl::StatsJson() const {
  MemoryTier::Stats m = memory_->GetStats();
  std::ostringstream out;
  out << "{\"memory\":{\"items\":" << m.items << ",\"value_bytes\":" << m.value_bytes
      << ",\"allocated_bytes\":" << m.allocated_bytes << ",\"capacity_bytes\":" << m.capacity_bytes
      << ",\"hits\":" << counters_.memory_hits.load() << ",\"evictions\":" << m.evictions
      << ",\"evicted_bytes\":" << m.evicted_bytes << ",\"rejected_puts\":" << m.rejected_puts
      << ",\"eviction_refusals\":" << m.eviction_refusals << ",\"lookup_hits\":" << m.lookup_hits
      << ",\"lookup_misses\":" << m.lookup_misses << ",\"index_bytes\":" << m.index_bytes
      << ",\"index_bytes_per_key\":" << (m.items == 0 ? 0 : m.index_bytes / m.items)
      << "},\"misses\":" << counters_.misses.load() << ",\"puts\":" << counters_.puts.load()
      << ",\"put_bytes\":" << counters_.put_bytes.load()
      << ",\"put_failures\":" << counters_.put_failures.load()
      << ",\"gets\":" << counters_.gets.load() << ",\"get_bytes\":" << counters_.get_bytes.load()
      << ",\"exists_queries\":" << counters_.exists_queries.load()
      << ",\"deletes\":" << counters_.deletes.load()
      << ",\"batch_calls\":" << counters_.batch_calls.load() << ",\"errors\":" << errors_.ToJson()
      << ",\"ssd_hits\":" << counters_.ssd_hits.load()
      << ",\"promotions\":" << counters_.promotions.load();
  if (ssd_ != nullptr) {
    const SsdTier::Stats d = ssd_->GetStats();
    out << ",\"ssd\":{\"keys\":" << d.keys << ",\"live_bytes\":" << d.live_bytes
        << ",\"used_bytes\":" << d.used_bytes << ",\"capacity_bytes\":" << d.capacity_bytes
        << ",\"buckets\":" << d.buckets << ",\"pending_buckets\":" << d.pending_buckets
        << ",\"deleted_bytes\":" << d.deleted_bytes << ",\"offloads\":" << d.offloads
        << ",\"offload_bytes\":" << d.offload_bytes
        << ",\"offload_failures\":" << d.offload_failures << ",\"reads\":" << d.reads
        << ",\"read_bytes\":" << d.read_bytes << ",\"read_errors\":" << d.read_errors
        << ",\"bucket_writes\":" << d.bucket_writes
        << ",\"bucket_write_errors\":" << d.bucket_write_errors
        << ",\"tombstones\":" << d.tombstones << ",\"evicted_buckets\":" << d.evicted_buckets
        << ",\"evicted_keys\":" << d.evicted_keys << ",\"gc_rounds\":" << d.gc_rounds
        << ",\"gc_buckets_compacted\":" << d.gc_buckets_compacted
        << ",\"gc_bytes_reclaimed\":" << d.gc_bytes_reclaimed
        << ",\"gc_bytes_punched\":" << d.gc_bytes_punched
        << ",\"gc_bytes_rewritten\":" << d.gc_bytes_rewritten
        << ",\"gc_keys_lost_race\":" << d.gc_keys_lost_race
        << ",\"quarantined_buckets\":" << d.quarantined_buckets
        << ",\"recovered_keys\":" << d.recovered_keys
        << ",\"torn_tombstone_bytes\":" << d.torn_tombstone_bytes
        << ",\"damaged_tombstone_bytes\":" << d.damaged_tombstone_bytes
        << ",\"io_uring\":" << (d.io_uring ? "true" : "false")
        << ",\"direct_io\":" << (d.direct_io ? "true" : "false")
        << ",\"index_bytes\":" << d.index_bytes << ",\"open_files\":" << d.open_files
        << ",\"file_opens\":" << d.file_opens << ",\"open_micros\":" << d.open_micros
        << ",\"checkpoint_keys\":" << d.checkpoint_keys
        << ",\"checkpoint_rejected\":" << d.checkpoint_rejected
        << ",\"checkpoint_writes\":" << d.checkpoint_writes
        << ",\"checkpoint_backlog\":" << d.checkpoint_backlog << "}";
  }
  if (!options_.local_listen.empty()) {
    const LocalServerCounters& l = local_counters_;
    out << ",\"local\":{\"clients_accepted\":" << l.accepted.load()
        << ",\"clients_refused\":" << l.refused.load()
        << ",\"reservations_expired\":" << l.reservations_expired.load()
        << ",\"reserve_requests\":" << l.reserve_requests.load()
        << ",\"spare_commits\":" << l.spare_commits.load()
        << ",\"shared_channels\":" << l.shared_channels.load() << "}";
  }
  out << "}";
  return out.str();
}

}  // namespace kvengine
