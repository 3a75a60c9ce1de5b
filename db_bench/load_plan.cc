// load_plan: the load planner's own cost (kvengine::LoadPlanner::Plan), with no engine.
//
// Plans --num requests of the trace benchmark's model shape (--model_layers keys per
// block with --trace_keys=layer, else one; --block_tokens per block), each of 64 hit
// blocks: the first 16 in memory, the rest on SSD, one key of each block on SSD in
// every fourth request.  One thread; reports micros per plan and, in the note,
// nanoseconds per block planned, mean and median (the bound: 1 us per block).
#include <chrono>

#include "db_bench/benchmarks.h"
#include "kvengine/load_planner.h"

namespace kvbench {

Result RunLoadPlan(const BenchConfig& c) {
  using Clock = std::chrono::steady_clock;
  constexpr uint64_t kBlocks = 64;
  const TraceConfig& t = c.trace;
  const uint64_t per_block = t.KeysPerBlock();
  Result r;
  std::vector<int64_t> tiers(kBlocks * per_block, kvengine::kLocatedSsd);
  std::fill(tiers.begin(), tiers.begin() + 16 * per_block, kvengine::kLocatedMemory);
  std::vector<int64_t> holes = tiers;
  for (uint64_t b = 0; b < kBlocks; b++) holes[b * per_block] = kvengine::kLocatedSsd;
  kvengine::LoadPlannerOptions o;
  o.recompute_tokens_per_s = t.prefill_tokens_per_s;
  std::unique_ptr<kvengine::LoadPlanner> planner;
  Status s = kvengine::LoadPlanner::Create(o, &planner);
  if (!s.ok()) {
    r.errors = 1;
    r.first_error = s.ToString();
    return r;
  }
  kvengine::LoadPlanRequest request;
  request.keys_per_block = per_block;
  request.key_bytes = t.BytesPerKey();
  request.block_tokens = t.block_tokens;
  request.request_tokens = 2 * kBlocks * t.block_tokens;
  uint64_t loaded = 0;
  const auto start = Clock::now();
  for (uint64_t i = 0; i < c.num; i++) {
    request.key_tiers = i % 4 == 3 ? holes : tiers;
    kvengine::LoadPlan plan;
    const auto one = Clock::now();
    s = planner->Plan(request, &plan);
    r.hist.Add(std::chrono::duration<double, std::micro>(Clock::now() - one).count());
    if (!s.ok()) {
      r.errors++;
      r.first_error = s.ToString();
      break;
    }
    loaded += plan.load_blocks;
  }
  r.seconds = r.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.ops = c.num;
  r.keys = c.num * kBlocks;
  r.reports_latency = true;
  // The mean counts the plans a loaded machine preempted; the median is one plan's cost.
  const double ns_per_block = r.keys > 0 ? r.seconds * 1e9 / static_cast<double>(r.keys) : 0;
  const double p50_ns_per_block = r.hist.Percentile(50) * 1e3 / kBlocks;
  r.note = Printf("%.1f ns per block of %llu keys (P50 %.1f); %llu blocks planned to load",
                  ns_per_block, static_cast<unsigned long long>(per_block), p50_ns_per_block,
                  static_cast<unsigned long long>(loaded));
  r.detail_json =
      Printf("\"ns_per_block\":%.6g,\"p50_ns_per_block\":%.6g,\"keys_per_block\":%llu",
             ns_per_block, p50_ns_per_block, static_cast<unsigned long long>(per_block));
  return r;
}

}  // namespace kvbench
