// RemovalFeed: the ring behind DB::ReadRemovals (include/kvengine/db.h).
//
// The tiers Record() each value that leaves them; readers Read() from their own cursor.
// The ring holds the newest `capacity` events; a slot's key string keeps its buffer, so
// once the ring has gone round a removal costs a lock and a copy of the key, no
// allocation.  Until the first Read() the feed is inactive and Record() returns after
// one relaxed load: a DB whose feed nobody reads pays nothing more.
//
// Each event has two numbers: its place in the whole DB's feed (Read), and its place
// among the events of its namespace (ReadNamespace), which is all a tenant's reader is
// shown -- its numbers must not tell how many removals the other tenants made
// (docs/observability.md, "The removal feed").  Per namespace the feed keeps the whole
// feed's numbers of its events still in the ring, oldest first, so that a namespace's
// read jumps to its events instead of scanning the ring; and its next number, kept
// after its events leave the ring, so that its numbering never restarts under a
// reader's cursor.
//
// Thread-safety: all methods are thread-safe.  The mutex is a leaf: Record() is called
// under the tiers' locks (a memory shard's, the SSD tier's) and takes no other lock.
#ifndef KVENGINE_DB_REMOVAL_FEED_H_
#define KVENGINE_DB_REMOVAL_FEED_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <string_view>
#include <unordered_map>
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

  // DB::ReadRemovals of the whole DB: every event, numbered in the whole feed.  Starts
  // recording on the first call.  REQUIRES: enabled().
  void Read(uint64_t after, size_t max_events, RemovalBatch* batch);
  // The same for namespace `id` (0: the default namespace, ns::IdOfKey for the others):
  // its events only, numbered 1, 2, ... among its own; last_sequence and missed count
  // its events only.  Keys are as stored (prefixed).  REQUIRES: enabled().
  void ReadNamespace(uint64_t id, uint64_t after, size_t max_events, RemovalBatch* batch);
  // The namespace whose event a removal of `key` is: 0 for a key of the default
  // namespace, else the id in its prefix (kNoNamespace for a prefix cut short).
  static uint64_t NamespaceOf(std::string_view key);
  static constexpr uint64_t kNoNamespace = ~uint64_t{0};

  // Events recorded since the feed started.
  uint64_t recorded() const;

 private:
  void RecordSlow(std::string_view key, RemovalEvent::Tier tier, RemovalEvent::Reason reason);

  // One namespace's events: the whole feed's numbers of those still in the ring, oldest
  // first (held.front() is the namespace's event next - held.size()), and the number its
  // next event gets.
  struct Track {
    uint64_t next = 1;
    std::deque<uint64_t> held;
  };

  const uint64_t capacity_;
  Env* const clock_;
  std::atomic<bool> recording_{false};
  mutable Mutex mu_;
  // Event n (1-based) is in ring_[(n - 1) % capacity_] while n > next_ - 1 - capacity_.
  std::vector<RemovalEvent> ring_ GUARDED_BY(mu_);
  std::vector<uint64_t> ring_namespace_ GUARDED_BY(mu_);  // beside ring_: its event's namespace
  std::unordered_map<uint64_t, Track> tracks_ GUARDED_BY(mu_);
  uint64_t next_ GUARDED_BY(mu_) = 1;  // the sequence the next event gets
};

// The engine's feed as the namespaces layer reads it (NamespaceDB for the default
// namespace, NamespaceView for the others): one namespace's events, numbered among its
// own.  DBImpl implements it.  The namespaces layer reaches the engine's feed through
// this instead of the DB below it because the feed of a ClusterDB is this host's engine's
// anyway (DB::ReadRemovals), and no layer in between numbers events.
class NamespaceRemovals {
 public:
  virtual ~NamespaceRemovals() = default;
  // DB::ReadRemovals of namespace `id` (0: the default namespace), with its contracts and
  // errors: RemovalFeed::ReadNamespace's events, numbers and keys (as stored).
  virtual Status ReadNamespaceRemovals(uint64_t id, uint64_t after, size_t max_events,
                                       RemovalBatch* batch) = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_REMOVAL_FEED_H_
