// TierCounters: what each tier a read may be served from counts -- hits, misses, bytes
// in and out, promotions, explicit removals, and the reads that failed there by reason
// -- one struct per tier (memory, ssd, peer), made from the per-tier lines of
// db/db_stats.def (KV_TIER_COUNTER, KV_READ_FAILURE), which also say how each is
// exported (KV_TIER_SAMPLE).
//
// The engine (DBImpl) holds one TierCounters per tier and counts the memory and SSD
// tiers; the cluster layer counts the peer tier into the engine's peer TierCounters,
// which api/db_open.cc hands it, so that the exposition shows every tier in one family
// (Prometheus wants a family's samples together).  This header is the only part of db/
// the cluster layer sees for it.
//
// Thread-safety: relaxed atomics, counted from any thread.
#ifndef KVENGINE_DB_TIER_COUNTERS_H_
#define KVENGINE_DB_TIER_COUNTERS_H_

#include <atomic>
#include <cstdint>

namespace kvengine {

// Why a read failed (KV_READ_FAILURE lines, in order).
enum class ReadFailure : int {
#define KV_READ_FAILURE(reason, help) reason,
#include "db/db_stats.def"
};

struct TierCounters {
#define KV_TIER_COUNTER(field, help) std::atomic<uint64_t> field{0};
#define KV_READ_FAILURE(reason, help) std::atomic<uint64_t> reason{0};
#include "db/db_stats.def"

  void Add(std::atomic<uint64_t>& counter, uint64_t n = 1) {
    counter.fetch_add(n, std::memory_order_relaxed);
  }
  void Hit(uint64_t bytes) {
    Add(hits);
    Add(bytes_out, bytes);
  }
  // A read that failed here for `reason`.
  void Failed(ReadFailure reason) {
    switch (reason) {
#define KV_READ_FAILURE(name, help) \
  case ReadFailure::name:           \
    Add(name);                      \
    break;
#include "db/db_stats.def"
    }
  }
};

// A plain copy of one TierCounters, for reading.
struct TierValues {
#define KV_TIER_COUNTER(field, help) uint64_t field = 0;
#define KV_READ_FAILURE(reason, help) uint64_t reason = 0;
#include "db/db_stats.def"
  static TierValues Of(const TierCounters& c) {
    TierValues v;
#define KV_TIER_COUNTER(field, help) v.field = c.field.load(std::memory_order_relaxed);
#define KV_READ_FAILURE(reason, help) v.reason = c.reason.load(std::memory_order_relaxed);
#include "db/db_stats.def"
    return v;
  }
};

// One TierCounters per KV_TIER line, named after it.
struct AllTierCounters {
#define KV_TIER(tier) TierCounters tier;
#include "db/db_stats.def"
};
struct AllTierValues {
#define KV_TIER(tier) TierValues tier;
#include "db/db_stats.def"
  static AllTierValues Of(const AllTierCounters& c) {
    AllTierValues v;
#define KV_TIER(tier) v.tier = TierValues::Of(c.tier);
#include "db/db_stats.def"
    return v;
  }
};

}  // namespace kvengine

#endif  // KVENGINE_DB_TIER_COUNTERS_H_
