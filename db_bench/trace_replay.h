// The trace benchmark: replays a request trace (db_bench/trace.h) against an engine the
// way an inference server's KV connector uses it, and prices what the cache saved.
//
// Each request goes through two steps, as in vLLM (the scheduler's
// get_num_new_matched_tokens, then the worker's load) and SGLang (batch_exists, then the
// prefetch and load):
//   1. Lookup, on the scheduler's side, when the request arrives: one BatchExists over
//      the keys of all its blocks (BatchLocate with the load planner); its hits are the
//      leading blocks whose every key exists.  The load planner (kvengine::LoadPlanner,
//      on unless --planner=off) keeps the leading hits that load no slower than they
//      compute at --prefill_tokens_per_s.  Then the lookup hook runs with the keys of
//      those planned blocks (the place where the scheduler tells the engine what the
//      worker will load).
//   2. Load and save, on the worker's side, `lookahead_us` after the lookup: with the
//      planner, the plan re-checked first (BatchLocate of the planned keys: where a key
//      has moved since the lookup, the planner plans again and the load is cut to that,
//      never lengthened; the re-check's time counts as the load's); then the planned
//      blocks read with BatchGetInto into a registered buffer (the load, timed per
//      request; its time and tiers feed the planner's estimates), then the blocks it
//      did not load written from it with BatchPut (the save) -- the hits the planner
//      left to recompute too: the connectors save those again from the recomputed KV,
//      which brings them back into memory without an SSD read.
// Arrivals: with speed 0 each request as soon as the scheduler has room, with speed N at
// its timestamp / N.  The scheduler looks up at most `depth` requests ahead of the
// worker's loads (depth 1: a request is looked up lookahead_us before its load, after the
// previous request's save; more: later arrivals are looked up during that wait, as a
// scheduler runs ahead of its workers).  One thread runs both steps in time order, so the
// engine's counters read around a load belong to that load alone.
//
// Keys: "kvbench-trace@tp0/layer.<l>/<hash id>" per (block, layer), as the vLLM
// connector stores a block, or "kvbench-trace@tp0/<hash id>" per block.  A value is the
// block's (or layer's) bytes of KV, its first 16 bytes stamped with (hash id, layer) so
// that a load that returns another key's bytes is caught.
#ifndef KVENGINE_DB_BENCH_TRACE_REPLAY_H_
#define KVENGINE_DB_BENCH_TRACE_REPLAY_H_

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "db_bench/engine.h"
#include "db_bench/report.h"
#include "db_bench/trace.h"
#include "db_bench/trace_config.h"
#include "kvengine/load_planner.h"

namespace kvbench {

// A request between the scheduler's lookup and the worker's load.
struct LookupPlan {
  size_t request = 0;             // its index in the trace
  uint64_t found_blocks = 0;      // leading blocks whose every key the lookup found
  uint64_t hit_blocks = 0;        // of those, the leading ones to load (the planner's)
  std::vector<std::string> keys;  // every key of every block, block by block
  double lookup_at_s = 0;         // seconds since the replay began
  double lookup_s = 0;            // the lookup's time (BatchExists or BatchLocate, and the plan)
  uint64_t prefetched_keys = 0;   // hit keys the hook started bringing up from SSD
  // The replay's loads and saves issued before the lookup: where none has been issued
  // since, the planned keys are where the lookup found them (see Replay::Recheck).
  uint64_t engine_writes_at_lookup = 0;
  std::vector<int64_t> tiers;  // with the planner: where the planned keys were (BatchLocate)
  // With the planner: its estimate of the planned blocks' load, and the SSD estimate it
  // planned with (printed by --trace_print_off_memory_loads).
  double planned_load_s = 0;
  kvengine::TierReadEstimate planned_ssd;
};

// Called right after a lookup with the keys of the request's hit blocks, in block order.
// The place for the scheduler's prefetch of what the worker will load; returns how many
// of the keys it started bringing up from a slower tier (the request's load is then
// reported apart, as "prefetched").
using LookupHook = std::function<uint64_t(const LookupPlan& plan, std::span<const Slice> hit_keys)>;

// Replays `trace` against `engine` (open, owned by the caller) and returns the result:
// ops are requests, the histogram is the load latency per request with hits, and
// detail_text / detail_json carry every figure of the report.
Result RunTraceReplay(const TraceConfig& config, const std::vector<TraceRequest>& trace,
                      Engine* engine, bool verify, double progress_interval,
                      const LookupHook& hook = nullptr);

// Two replays of `trace` interleaved request by request (one request's lookup, load and
// save of each in turn), each on its own engine: --compare_planner --trace_interleave, so that
// both see the same moments of a noisy host.  Without pacing only (speed 0, no
// lookahead) and without a lookup hook, where each replay's order of steps depends on
// nothing but the trace.
std::pair<Result, Result> RunTraceReplayInterleaved(const TraceConfig& config_a,
                                                    const TraceConfig& config_b,
                                                    const std::vector<TraceRequest>& trace,
                                                    Engine* engine_a, Engine* engine_b, bool verify,
                                                    double progress_interval);

// One line (or one JSON object) comparing a replay with the load planner (`on`) and one
// without (`off`), both of this run: prefill saved, requests loaded slower than
// recompute, TTFT saved, bytes loaded.  Empty when either is not a trace result.
std::string FormatPlannerComparison(const Result& on, const Result& off, bool json);

// The ideal caches' figures for `trace` (they depend on nothing else), as text lines and as
// JSON members, computed once per run and added to every engine's report.
struct IdealCacheReport {
  std::string text;
  std::string json;  // "ideal_lru_memory":{...},... without braces
};
IdealCacheReport ComputeIdealCaches(const TraceConfig& config,
                                    const std::vector<TraceRequest>& trace);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_TRACE_REPLAY_H_
