#include "db_bench/prefix_cache_model.h"

#include <algorithm>
#include <limits>

namespace kvbench {

void BlockLruCache::Touch(uint64_t id) {
  auto it = index_.find(id);
  if (it != index_.end()) {
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  if (capacity_ == 0) return;
  if (index_.size() >= capacity_) {
    index_.erase(order_.back());
    order_.pop_back();
  }
  order_.push_front(id);
  index_[id] = order_.begin();
}

uint64_t BlockLruCache::Access(const std::vector<uint64_t>& hash_ids) {
  uint64_t hits = 0;
  while (hits < hash_ids.size() && index_.count(hash_ids[hits]) > 0) hits++;
  // In request order, so the last blocks are the most recent (and a request longer than
  // the cache keeps its tail, as an engine that writes them in order would).
  for (uint64_t id : hash_ids) Touch(id);
  return hits;
}

void PrefixHits::Add(const TraceRequest& r, uint64_t hits, uint64_t block_tokens) {
  blocks += r.hash_ids.size();
  hit_blocks += hits;
  tokens += r.input_length;
  hit_tokens += std::min(r.input_length, hits * block_tokens);
}

PrefixHits SimulatePrefixCache(const std::vector<TraceRequest>& trace, uint64_t capacity_blocks,
                               uint64_t block_tokens) {
  BlockLruCache cache(capacity_blocks);
  PrefixHits hits;
  for (const TraceRequest& r : trace) hits.Add(r, cache.Access(r.hash_ids), block_tokens);
  return hits;
}

}  // namespace kvbench
