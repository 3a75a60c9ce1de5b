// What the trace benchmark is told by the flags (db_bench/flags.cc): the trace, the
// model whose KV cache it stores, the pacing and the prefill model.
#ifndef KVENGINE_DB_BENCH_TRACE_CONFIG_H_
#define KVENGINE_DB_BENCH_TRACE_CONFIG_H_

#include <cstdint>
#include <string>

#include "db_bench/trace_generator.h"

namespace kvbench {

struct TraceConfig {
  std::string file;  // --trace: replayed, or written first when generate is set
  bool generate = false;
  TraceGeneratorOptions generator;  // --trace_generate and its sizes
  // The model: bytes of KV per token = 2 (K and V) * layers * kv_heads * head_dim * dtype.
  uint64_t model_layers = 0;
  uint64_t kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t dtype_bytes = 0;
  uint64_t block_tokens = 0;  // tokens per hash id
  bool key_per_layer = true;  // one key per (block, layer), as the vLLM connector; else per block
  double speed = 0;           // 0: as fast as possible; N: timestamps / N
  uint64_t lookahead_us = 0;  // from the scheduler's lookup to the worker's load
  uint64_t depth = 1;         // requests looked up and not yet loaded, at most
  bool prefetch = false;      // the lookup asks the engine to prefetch its hits (DB::Prefetch)
  double prefill_tokens_per_s = 0;
  // The load planner (kvengine::LoadPlanner) decides how many of a request's hit blocks
  // to load, from where they are (BatchLocate) and the speeds it measures; off: every hit
  // is loaded.
  bool planner = true;
  // The SSD read bandwidth measured on this host, bytes per second, which the planner
  // trusts from the first plan (0: LoadPlannerOptions' nominal guess, priced cautiously
  // until SSD loads have measured it).
  double planner_ssd_bytes_per_s = 0;
  // One line on stderr per load that read a key off memory: measured against compute,
  // and the plan's estimates.
  bool print_off_memory_loads = false;
  // Where to write one line per request (--trace_dump_requests): PREFIX.on.tsv with the
  // planner, PREFIX.off.tsv without, so that the two replays of --compare_planner can be
  // paired request by request.  Empty: none.
  std::string dump_requests;
  // With --compare_planner: the two replays interleaved step by step
  // (RunTraceReplayInterleaved).
  bool interleave = false;
  uint64_t buffer_bytes = 0;  // the registered buffer loads and saves go through
  // The byte capacities of the ideal caches: the memory tier, and memory plus SSD (0:
  // no SSD tier).
  uint64_t memory_capacity = 0;
  uint64_t ssd_capacity = 0;

  uint64_t BytesPerBlock() const {
    return 2 * model_layers * kv_heads * head_dim * dtype_bytes * block_tokens;
  }
  uint64_t KeysPerBlock() const { return key_per_layer ? model_layers : 1; }
  uint64_t BytesPerKey() const { return BytesPerBlock() / KeysPerBlock(); }
};

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_TRACE_CONFIG_H_
