// The benchmarks themselves, each a function from what it needs to its Result: the
// key-level ones (db_bench's, which also serve as peer_put and peer_get against the peer
// engine), the vLLM scenarios, gc_churn (benchmarks.cc) and the physical baselines
// (baselines.cc).
#ifndef KVENGINE_DB_BENCH_BENCHMARKS_H_
#define KVENGINE_DB_BENCH_BENCHMARKS_H_

#include <string>
#include <vector>

#include "db_bench/engine.h"
#include "db_bench/flags.h"
#include "db_bench/report.h"
#include "db_bench/runner.h"
#include "db_bench/workload.h"

namespace kvbench {

struct BenchContext {
  const BenchConfig* config = nullptr;
  Engine* engine = nullptr;  // nullptr for the baselines
  const ValuePool* pool = nullptr;
  std::string label;       // "fillrandom" or "fillrandom[rocksdb]"
  std::string raw_dir;     // where rawwrite/rawread put their files
  uint64_t seed_salt = 0;  // varies the random streams from benchmark to benchmark

  RunSpec Spec(uint64_t total_ops) const;
  KeySpace Keys() const { return KeySpace(config->num, config->key_size); }
};

// fillseq, fillrandom, overwrite.
Result RunFill(const BenchContext& b, bool sequential);
enum class ReadKind { kRandom, kSequential, kMissing };
Result RunRead(const BenchContext& b, ReadKind kind);
Result RunDeleteRandom(const BenchContext& b);
Result RunExistRandom(const BenchContext& b);

// kLoad: a layer-wise load as the vLLM connector's workers make it (one group per
// layer, Engine::BatchGetIntoGroups); kLoadSerial: the same, one BatchGetInto per layer
// in turn.  Both report the time to the first layer ready beside the whole load's.
enum class VllmKind { kWrite, kExist, kGet, kAll, kLoad, kLoadSerial };
Result RunVllm(const BenchContext& b, VllmKind kind);
// cluster_failover (db_bench/cluster_failover.cc).
Result RunClusterFailover(const BenchContext& b);
// cluster_join (db_bench/cluster_join.cc).
Result RunClusterJoin(const BenchContext& b);

Result RunGcChurn(const BenchContext& b);

// ns_hotcold (db_bench/ns_hotcold.cc): the sizes its three configurations share.
// The tier is the memory tier, or the SSD tier with --ns_hotcold_ssd.
struct NsHotColdPlan {
  uint64_t cold_keys = 0;   // --ns_cold_keys, or a quarter of the tier's worth
  uint64_t cold_quota = 0;  // bytes: --ns_cold_quota, or half the tier
  uint64_t hot_quota = 0;   // bytes: --ns_hot_quota, or the tier less cold's quota
  bool ssd = false;         // the tenants share the SSD tier (--ns_hotcold_ssd)
};
NsHotColdPlan PlanNsHotCold(const BenchConfig& c);
// Its results: one per configuration (prefix, shares, quotas), and the ratios of the cold
// tenant's hit ratios (memory hits; with --ns_hotcold_ssd, reads found in any tier) and
// of the hot tenant's put throughputs, shares/prefix and quotas/prefix (0 when the prefix
// run had none), as a text line and a JSON object.
struct NsHotColdOutcome {
  std::vector<Result> results;
  double cold_hit_ratio_shares = 0, cold_hit_ratio_quotas = 0;
  double hot_puts_shares = 0, hot_puts_quotas = 0;
  double hot_puts_cpu_shares = 0, hot_puts_cpu_quotas = 0;  // per CPU second of the puts
  bool baseline_hits = false;  // the prefix run's cold reads hit at all
  std::string text, json;
};
// Opens its own in-process kvengine DBs (with --memory and --options, memory only unless
// --options gives an SSD tier) in raw_dir, one after another -- in the opposite order
// with `reverse` -- and b.engine is not used.
NsHotColdOutcome RunNsHotCold(const BenchContext& b, bool reverse);

// delete_regex (db_bench/delete_regex.cc): another client's BatchExists latency beside
// one DeleteByRegex of half of --num keys, and alone before it, on an in-process kvengine
// DB of its own (memory only unless --options gives an SSD tier); b.engine is not used.
struct DeleteRegexOutcome {
  std::string error;     // set when the run failed: nothing else is
  double p99_ratio = 0;  // the reader's P99 beside the delete over its P99 alone
  uint64_t wrong = 0;    // reader calls that failed or answered wrong
  std::string text, json;
};
DeleteRegexOutcome RunDeleteRegex(const BenchContext& b);

// Deletes --compact_delete_fraction of the keys (untimed), flushes, then times the
// engine's garbage collection run to completion; MB/s are bytes reclaimed per second.
Result RunCompact(const BenchContext& b);
// load_plan (db_bench/load_plan.cc): kvengine::LoadPlanner::Plan's own cost, no engine.
Result RunLoadPlan(const BenchConfig& c);

// memcpy, memcpy_read, then memcpy_layers and memcpy_layers_read (the vLLM requests'
// shape: --num_layers distinct buffers per thread): all four when `which` is "memcpy",
// else only the one it names.
std::vector<Result> RunMemcpy(const BenchContext& b, const std::string& which);
Result RunRawWrite(const BenchContext& b);
Result RunRawRead(const BenchContext& b);
// The read pattern of a batched readrandom without an engine: --batch_size distinct
// random values of rawwrite's file per call, all in flight at once (io_uring, O_DIRECT).
Result RunRawRandRead(const BenchContext& b);
// The yardstick of the peer benchmarks: a peer get's shape over plain loopback TCP --
// per call a small request naming --batch_size random values, answered with their bytes
// back to back from a region as large as the data set -- with no protocol beyond that.
Result RunRawSocket(const BenchContext& b);
// rawexist (copy_values false) and rawlookup: existrandom's and readrandom's work without
// an engine -- per call --batch_size random keys of the same key space, each hashed and
// looked up in a plain open-addressing table holding the keys' bytes, and for rawlookup
// the value copied from an arena like the memory tier's into the caller's buffer.  Its
// growth with --num is the cache and TLB misses that no engine can avoid.
Result RunRawLookup(const BenchContext& b, bool copy_values);
// The ceiling: one loopback TCP stream of --value_size chunks, no request, no round trip.
Result RunRawStream(const BenchContext& b);
// The files rawwrite leaves in dir, for cleanup.
std::vector<std::string> RawFiles(const std::string& dir, uint64_t threads);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_BENCHMARKS_H_
