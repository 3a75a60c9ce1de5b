// RemovalFeed: the ring behind DB::ReadRemovals (include/kvengine/db.h).
//
// The tiers Record() each value that leaves them; readers Read() from their own cursor.
// The ring holds the newest `capacity` events; a slot's key string keeps its buffer, so
// once the ring has gone round a removal costs a lock and a copy of the key, no
// allocation.  Until the first Read() the feed is inactive and Record() returns after
// one relaxed load: a DB whose feed nobody reads pays nothing more.
//
// Thread-safety: all methods are thread-safe.  The mutex is a leaf: Record() is called
// under the tiers' locks (a memory shard's, the SSD tier's) and takes no other lock.
#ifndef KVENGINE_DB_REMOVAL_FEED_H_
#define KVENGINE_DB_REMOVAL_FEED_H_

#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/env.h"
#include "util/mutex.h"

namespace kvengine {

class RemovalFeed {
 public:
  // `clock` (not owned) stamps the events; capacity 0 makes a feed that is always off.
  RemovalFeed(uint64_t capacity, Env* clock) : capacity_(capacity), clock_(clock) {}

  bool enabled() const { return capacity_ != 0; }
  bool recording() const { return recording_.load(std::memory_order_relaxed); }

  // Records that `key` left `tier`, when recording.
  void Record(std::string_view key, RemovalEvent::Tier tier, RemovalEvent::Reason reason) {
    if (recording()) RecordSlow(key, tier, reason);
  }

  // DB::ReadRemovals: starts recording on the first call.  REQUIRES: enabled().
  void Read(uint64_t after, size_t max_events, RemovalBatch* batch);

  // Events recorded since the feed started.
  uint64_t recorded() const;

 private:
  void RecordSlow(std::string_view key, RemovalEvent::Tier tier, RemovalEvent::Reason reason);

  const uint64_t capacity_;
  Env* const clock_;
  std::atomic<bool> recording_{false};
  mutable Mutex mu_;
  // Event n (1-based) is in ring_[(n - 1) % capacity_] while n > next_ - 1 - capacity_.
  std::vector<RemovalEvent> ring_ GUARDED_BY(mu_);
  uint64_t next_ GUARDED_BY(mu_) = 1;  // the sequence the next event gets
};

}  // namespace kvengine

#endif  // KVENGINE_DB_REMOVAL_FEED_H_
