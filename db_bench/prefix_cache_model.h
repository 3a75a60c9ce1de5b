// The hit ratios a trace would get from ideal caches, computed from the trace alone: the
// yardsticks beside which kv_bench's trace benchmark shows what the engine achieved.
//
// A request looks its blocks up in order and uses its leading hits (a prefix cache can
// only use the blocks before the first miss: a block's KV depends on every token before
// it); then the cache holds all of its blocks.  Two caches:
//   BlockLruCache   capacity_blocks blocks, least recently used evicted first; a request's
//                   hits become its most recent blocks, then its new blocks are added.
//   infinite        nothing is ever evicted: the ceiling of any cache on this trace.
//
// Thread-safety: none (one replay thread owns each).
#ifndef KVENGINE_DB_BENCH_PREFIX_CACHE_MODEL_H_
#define KVENGINE_DB_BENCH_PREFIX_CACHE_MODEL_H_

#include <cstdint>
#include <list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "db_bench/trace.h"

namespace kvbench {

// An ideal prefix cache over block ids.  capacity_blocks == 0 holds nothing;
// UINT64_MAX holds everything (the infinite cache).
class BlockLruCache {
 public:
  explicit BlockLruCache(uint64_t capacity_blocks) : capacity_(capacity_blocks) {}

  // Serves one request: returns its leading hits, then holds its blocks (a request
  // longer than the capacity keeps its last capacity_blocks blocks).
  uint64_t Access(const std::vector<uint64_t>& hash_ids);

  uint64_t size() const { return index_.size(); }

 private:
  void Touch(uint64_t id);

  const uint64_t capacity_;
  std::list<uint64_t> order_;  // most recent first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
};

// The hit counts of a cache over a whole trace.
struct PrefixHits {
  uint64_t blocks = 0;      // blocks asked for
  uint64_t hit_blocks = 0;  // leading hits
  uint64_t tokens = 0;      // input tokens
  uint64_t hit_tokens = 0;  // tokens of the leading hits (at most the request's input)

  double Ratio() const {
    return blocks == 0 ? 0 : static_cast<double>(hit_blocks) / static_cast<double>(blocks);
  }
  void Add(const TraceRequest& r, uint64_t hits, uint64_t block_tokens);
};

// The trace through a BlockLruCache of capacity_blocks (UINT64_MAX: infinite).
PrefixHits SimulatePrefixCache(const std::vector<TraceRequest>& trace, uint64_t capacity_blocks,
                               uint64_t block_tokens);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_PREFIX_CACHE_MODEL_H_
