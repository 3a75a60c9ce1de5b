// ns_hotcold: two tenants on one tier, one cold and one hot (issue #29 item 6;
// docs/benchmarks.md, "Namespaces, second pass").  The tier is the memory tier, or with
// --ns_hotcold_ssd the SSD tier behind a small memory tier (write_back): then the quotas
// are SSD quotas, and a cold read counts as a hit when it finds its value in any tier.
//
// The cold tenant writes a working set that fits its share of the tier; then the hot
// tenant puts --num new keys, far more than the tier holds, and every
// --ns_cold_read_every hot puts the cold tenant reads one of its keys at random (and puts
// it back when it missed, as a cache's client does after recomputing it).  The same
// workload, with the same keys and values, runs three times, each on a fresh DB:
//   prefix  both tenants in the default namespace, told apart by their keys' first byte
//           only: the tier evicts by recency alone (the baseline);
//   shares  each tenant in a namespace of its own, no quotas: the full tier evicts from
//           the namespace most over its fair share;
//   quotas  each tenant in a namespace with a memory quota (--ns_cold_quota,
//           --ns_hot_quota).
// Reported per configuration: the cold reads the memory tier served during the churn
// (its hit ratio), how many found their value at all, the hot puts' throughput, and the
// per-namespace counters of the stats ("namespace.NAME.memory_evictions" and so on);
// then the ratios of the cold hit ratios and of the hot put throughputs, shares/prefix
// and quotas/prefix, all from this run.
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <random>

#include "db_bench/benchmarks.h"
#include "kvengine/db.h"

namespace kvbench {

namespace {

struct Config {
  const char* name;  // "prefix", "shares", "quotas"
  bool namespaces;
  bool quotas;
};

constexpr Config kConfigs[] = {
    {"prefix", false, false}, {"shares", true, false}, {"quotas", true, true}};

// The figures of one tenant the stats report ("namespace.NAME.FIELD").
struct TenantFigures {
  uint64_t memory_bytes = 0, memory_evictions = 0, quota_evictions = 0, quota_rejections = 0;
  uint64_t hits = 0, misses = 0;
  uint64_t ssd_bytes = 0, ssd_evictions = 0;

  void Read(const std::string& stats, const std::string& ns) {
    auto figure = [&](const char* field) {
      return StatLine(stats, "namespace." + ns + "." + field);
    };
    memory_bytes = figure("memory_bytes");
    memory_evictions = figure("memory_evictions");
    quota_evictions = figure("quota_evictions");
    quota_rejections = figure("quota_rejections");
    hits = figure("hits");
    misses = figure("misses");
    ssd_bytes = figure("ssd_bytes");
    ssd_evictions = figure("ssd_evictions");
  }
  std::string Text(const char* ns) const {
    return Printf("%s: memory_bytes %" PRIu64 ", memory_evictions %" PRIu64 ", ssd_bytes %" PRIu64
                  ", ssd_evictions %" PRIu64 ", quota_evictions %" PRIu64
                  ", quota_rejections %" PRIu64 ", hits %" PRIu64 ", misses %" PRIu64,
                  ns, memory_bytes, memory_evictions, ssd_bytes, ssd_evictions, quota_evictions,
                  quota_rejections, hits, misses);
  }
  std::string Json(const char* ns) const {
    return Printf("\"%s\":{\"memory_bytes\":%" PRIu64 ",\"memory_evictions\":%" PRIu64
                  ",\"ssd_bytes\":%" PRIu64 ",\"ssd_evictions\":%" PRIu64
                  ",\"quota_evictions\":%" PRIu64 ",\"quota_rejections\":%" PRIu64
                  ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 "}",
                  ns, memory_bytes, memory_evictions, ssd_bytes, ssd_evictions, quota_evictions,
                  quota_rejections, hits, misses);
  }
};

// One configuration's run: its DB, the tenants' handles and what they counted.
class HotColdRun {
 public:
  HotColdRun(const BenchContext& b, const Config& config, const NsHotColdPlan& plan)
      : b_(b), c_(*b.config), config_(config), plan_(plan), buffer_(c_.value_size) {
    r_.benchmark = "ns_hotcold";
    r_.engine = std::string("kvengine+") + config.name;
    r_.label = "ns_hotcold[" + std::string(config.name) + "]";
  }

  Result Run() {
    const std::string dir = b_.raw_dir + "/ns_hotcold-" + config_.name;
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    Status s = Open(dir);
    if (s.ok()) s = FillCold();
    if (s.ok()) Churn();
    if (!s.ok()) Fail(s.ToString());
    if (db_) Report();
    cold_.reset();
    hot_.reset();
    if (db_) {
      s = db_->Close();
      if (!s.ok()) Fail("Close: " + s.ToString());
      db_.reset();
    }
    std::filesystem::remove_all(dir, ec);
    return r_;
  }

  // Cold reads the memory tier served (any tier, on the SSD tier), over cold reads
  // during the churn.
  double ColdHitRatio() const {
    const uint64_t hits = plan_.ssd ? cold_found_ : cold_memory_hits_;
    return cold_reads_ ? static_cast<double>(hits) / cold_reads_ : 0;
  }

 private:
  void Fail(const std::string& what) {
    if (r_.errors++ == 0) r_.first_error = what;
  }

  Status Open(const std::string& dir) {
    kvengine::Options options;
    options.ssd_capacity_bytes = 0;  // memory only, unless --options gives an SSD tier
    EngineConfig ec;
    ec.memory_budget = c_.memory_budget;
    ec.kvengine_options = c_.kvengine_options;
    Status s = KvengineOptions(ec, &options);
    if (plan_.ssd) {
      options.ssd_capacity_bytes = c_.ns_ssd;
      options.offload_policy = kvengine::OffloadPolicy::kWriteBack;
    }
    if (s.ok()) s = kvengine::DB::Open(options, dir, &db_);
    if (!s.ok() || !config_.namespaces) return s;
    kvengine::NamespaceOptions cold, hot;
    if (config_.quotas) {
      (plan_.ssd ? cold.ssd_quota_bytes : cold.memory_quota_bytes) = plan_.cold_quota;
      (plan_.ssd ? hot.ssd_quota_bytes : hot.memory_quota_bytes) = plan_.hot_quota;
    }
    s = db_->CreateNamespace("cold", cold, &cold_);
    if (s.ok()) s = db_->CreateNamespace("hot", hot, &hot_);
    return s;
  }

  kvengine::DB* Cold() const { return cold_ ? cold_.get() : db_.get(); }
  kvengine::DB* Hot() const { return hot_ ? hot_.get() : db_.get(); }

  // The tenant's byte first, then the key-level key: the same bytes in every
  // configuration.
  static void Key(char tenant, const KeySpace& space, uint64_t id, std::string* out) {
    space.Format(id, out);
    out->insert(out->begin(), tenant);
  }

  Status FillCold() {
    const KeySpace space(plan_.cold_keys, c_.key_size);
    std::string key;
    for (uint64_t id = 0; id < plan_.cold_keys; id++) {
      Key('c', space, id, &key);
      Status s = Cold()->Put(kvengine::WriteOptions(), key, b_.pool->For(id));
      if (!s.ok()) return Status::IOError("cold's put of " + key, s.ToString());
    }
    return Status::OK();
  }

  // One cold read of a random key of its working set; a miss puts the value back.
  void ColdRead(std::mt19937_64* rng) {
    const KeySpace space(plan_.cold_keys, c_.key_size);
    const uint64_t id = (*rng)() % plan_.cold_keys;
    Key('c', space, id, &key_);
    size_t size = 0;
    Status s = Cold()->GetInto(kvengine::ReadOptions(), key_,
                               MutableSlice(buffer_.data(), buffer_.size()), &size);
    cold_reads_++;
    if (s.ok()) {
      cold_found_++;
      const Slice want = b_.pool->For(id);
      if (!c_.verify) return;
      if (size != want.size() || std::memcmp(buffer_.data(), want.data(), size) != 0) {
        Fail("cold key '" + key_ + "': the bytes read differ from the bytes written");
      } else {
        r_.verified++;
      }
      return;
    }
    if (!s.IsNotFound()) {
      Fail("cold's get of " + key_ + ": " + s.ToString());
      return;
    }
    if (!c_.ns_cold_refill) return;
    s = Cold()->Put(kvengine::WriteOptions(), key_, b_.pool->For(id));
    if (s.ok()) {
      cold_refills_++;
    } else {
      Fail("cold's put back of " + key_ + ": " + s.ToString());
    }
  }

  // Hot puts --num new keys; cold reads one key every --ns_cold_read_every of them.
  void Churn() {
    const KeySpace space(c_.num, c_.key_size);
    std::mt19937_64 rng(c_.seed + b_.seed_salt * 7919);
    std::string stats;
    db_->GetProperty("kvengine.stats", &stats);
    const uint64_t memory_hits_before = StatLine(stats, "memory.hits");
    std::string key;
    const auto wall_start = Clock::now();
    const double cpu_start = ThreadCpuSeconds();
    double put_seconds = 0, cold_cpu = 0;
    for (uint64_t id = 0; id < c_.num; id++) {
      Key('h', space, id, &key);
      const Slice value = b_.pool->For(plan_.cold_keys + id);
      const auto start = Clock::now();
      Status s = Hot()->Put(kvengine::WriteOptions(), key, value);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      put_seconds += us / 1e6;
      r_.hist.Add(us);
      r_.ops++;
      r_.keys++;
      r_.bytes += key.size() + value.size();
      if (s.IsNoSpace()) {
        // A quota's refusal is the engine's answer, not a failure of the run: counted and
        // reported (the namespace counts it too, in quota_rejections).
        if (hot_refused_++ == 0) first_refusal_ = key + ": " + s.ToString();
      } else if (!s.ok()) {
        Fail("hot's put of " + key + ": " + s.ToString());
      }
      if ((id + 1) % c_.ns_cold_read_every == 0) {
        const double cold_start = ThreadCpuSeconds();
        ColdRead(&rng);
        cold_cpu += ThreadCpuSeconds() - cold_start;
      }
    }
    r_.seconds = put_seconds;
    // The hot puts' CPU time: the loop's less the cold reads' (and their put-backs).
    r_.cpu_seconds = ThreadCpuSeconds() - cpu_start - cold_cpu;
    r_.wall_seconds = std::chrono::duration<double>(Clock::now() - wall_start).count();
    db_->GetProperty("kvengine.stats", &stats);
    // Only the cold tenant reads, so the memory tier's hits in this span are its.
    cold_memory_hits_ = StatLine(stats, "memory.hits") - memory_hits_before;
  }

  void Report() {
    std::string stats;
    db_->GetProperty("kvengine.stats", &stats);
    TenantFigures cold, hot;
    cold.Read(stats, "cold");
    hot.Read(stats, "hot");
    const uint64_t evictions = StatLine(stats, "memory.evictions");
    r_.counts_found = true;
    r_.lookups = cold_reads_;
    r_.found = cold_found_;
    r_.note = Printf("hot puts; cold %s hit ratio %.3f", plan_.ssd ? "any-tier" : "memory",
                     ColdHitRatio());
    if (hot_refused_ > 0) {
      r_.note += Printf("; %" PRIu64 " hot puts refused NoSpace", hot_refused_);
      r_.detail_text += "  hot puts refused NoSpace: " + std::to_string(hot_refused_) +
                        "; the first, " + first_refusal_ + "\n";
    }
    r_.detail_text +=
        Printf("  cold: %" PRIu64 " keys (%.1f MiB), %" PRIu64 " reads during the churn: %" PRIu64
               " served by memory, %" PRIu64 " found, %" PRIu64 " put back after a miss\n",
               plan_.cold_keys, Mib(plan_.cold_keys * c_.value_size), cold_reads_,
               cold_memory_hits_, cold_found_, cold_refills_);
    r_.detail_json =
        Printf("\"cold_keys\":%" PRIu64 ",\"cold_reads\":%" PRIu64 ",\"cold_memory_hits\":%" PRIu64
               ",\"cold_found\":%" PRIu64 ",\"cold_refills\":%" PRIu64
               ",\"memory_evictions\":%" PRIu64 ",\"hot_refused\":%" PRIu64 ",\"tier\":\"%s\"",
               plan_.cold_keys, cold_reads_, cold_memory_hits_, cold_found_, cold_refills_,
               evictions, hot_refused_, plan_.ssd ? "ssd" : "memory");
    if (config_.namespaces) {
      r_.detail_text += "  " + cold.Text("cold") + "\n  " + hot.Text("hot") + "\n";
      r_.detail_json += ",\"namespaces\":{" + cold.Json("cold") + "," + hot.Json("hot") + "}";
      if (config_.quotas) {
        r_.detail_text +=
            Printf("  %squotas: cold %.1f MiB, hot %.1f MiB\n", plan_.ssd ? "SSD " : "",
                   Mib(plan_.cold_quota), Mib(plan_.hot_quota));
      }
    } else {
      r_.detail_text += Printf("  no namespaces: %" PRIu64
                               " memory evictions, both tenants' (memory.evictions)\n",
                               evictions);
    }
  }

  static double Mib(uint64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

  const BenchContext& b_;
  const BenchConfig& c_;
  const Config config_;
  const NsHotColdPlan plan_;
  AlignedBuffer buffer_;
  std::string key_;
  std::unique_ptr<kvengine::DB> db_, cold_, hot_;
  uint64_t cold_reads_ = 0, cold_found_ = 0, cold_memory_hits_ = 0, cold_refills_ = 0;
  uint64_t hot_refused_ = 0;  // hot puts that failed NoSpace
  std::string first_refusal_;
  Result r_;
};

}  // namespace

NsHotColdPlan PlanNsHotCold(const BenchConfig& c) {
  NsHotColdPlan p;
  const uint64_t tier = c.NsTier();
  p.ssd = c.ns_ssd != 0;
  p.cold_keys =
      c.ns_cold_keys > 0 ? c.ns_cold_keys : std::max<uint64_t>(tier / 4 / c.value_size, 1);
  p.cold_quota = c.ns_cold_quota > 0 ? c.ns_cold_quota : tier / 2;
  p.hot_quota = c.ns_hot_quota > 0 ? c.ns_hot_quota : tier - std::min(p.cold_quota, tier);
  return p;
}

NsHotColdOutcome RunNsHotCold(const BenchContext& b, bool reverse) {
  const NsHotColdPlan plan = PlanNsHotCold(*b.config);
  NsHotColdOutcome out;
  out.results.resize(3);
  double hit_ratio[3] = {}, put_rate[3] = {}, put_cpu_rate[3] = {};
  for (size_t k = 0; k < 3; k++) {
    const size_t i = reverse ? 2 - k : k;
    HotColdRun run(b, kConfigs[i], plan);
    out.results[i] = run.Run();
    hit_ratio[i] = run.ColdHitRatio();
    put_rate[i] = out.results[i].OpsPerSec();
    put_cpu_rate[i] = out.results[i].OpsPerCpuSecond();
  }
  auto ratio = [](double a, double base) { return base > 0 ? a / base : 0; };
  out.cold_hit_ratio_shares = ratio(hit_ratio[1], hit_ratio[0]);
  out.cold_hit_ratio_quotas = ratio(hit_ratio[2], hit_ratio[0]);
  out.hot_puts_shares = ratio(put_rate[1], put_rate[0]);
  out.hot_puts_quotas = ratio(put_rate[2], put_rate[0]);
  out.hot_puts_cpu_shares = ratio(put_cpu_rate[1], put_cpu_rate[0]);
  out.hot_puts_cpu_quotas = ratio(put_cpu_rate[2], put_cpu_rate[0]);
  // A baseline of no hits at all has no ratio: say so rather than print 0 or infinity.
  auto shown = [&](double r) { return hit_ratio[0] > 0 ? Printf("%.2fx", r) : std::string("n/a"); };
  out.text = Printf(
      "%-12s : cold %s hit ratio shares/prefix %s, quotas/prefix %s (%.3f, %.3f vs %.3f); "
      "hot puts ops/sec shares/prefix %.2fx, quotas/prefix %.2fx (%.0f, %.0f vs %.0f); per "
      "CPU second shares/prefix %.2fx, quotas/prefix %.2fx",
      "ns_hotcold", plan.ssd ? "any-tier" : "memory", shown(out.cold_hit_ratio_shares).c_str(),
      shown(out.cold_hit_ratio_quotas).c_str(), hit_ratio[1], hit_ratio[2], hit_ratio[0],
      out.hot_puts_shares, out.hot_puts_quotas, put_rate[1], put_rate[2], put_rate[0],
      out.hot_puts_cpu_shares, out.hot_puts_cpu_quotas);
  out.json = Printf(
      "{\"benchmark\":\"ns_hotcold\",\"engine\":\"ratios\",\"cold_hit_ratio\":{\"prefix\":%.4f,"
      "\"shares\":%.4f,\"quotas\":%.4f},\"hot_puts_per_sec\":{\"prefix\":%.1f,\"shares\":%.1f,"
      "\"quotas\":%.1f},\"cold_hit_ratio_shares_over_prefix\":%.4f,"
      "\"cold_hit_ratio_quotas_over_prefix\":%.4f,\"hot_puts_shares_over_prefix\":%.4f,"
      "\"hot_puts_quotas_over_prefix\":%.4f,\"hot_puts_per_cpu_second_shares_over_prefix\":%.4f,"
      "\"hot_puts_per_cpu_second_quotas_over_prefix\":%.4f}",
      hit_ratio[0], hit_ratio[1], hit_ratio[2], put_rate[0], put_rate[1], put_rate[2],
      out.cold_hit_ratio_shares, out.cold_hit_ratio_quotas, out.hot_puts_shares,
      out.hot_puts_quotas, out.hot_puts_cpu_shares, out.hot_puts_cpu_quotas);
  out.baseline_hits = hit_ratio[0] > 0;
  return out;
}

}  // namespace kvbench
