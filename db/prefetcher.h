// Prefetcher: promotion ahead of the load.  DB::Prefetch hands it keys a caller will read
// soon (a scheduler that matched a prefix before its worker loads it); one background
// thread reads the values that lie only on SSD and inserts them into the memory tier, so
// that the read, when it comes, is a memory hit.
//
// Bounds: at most Options::prefetch_max_bytes of values are queued or being read at once
// (default a quarter of the memory tier), and one Submit never queues more than that.
// Since a batch is smaller than the memory tier's LRU tail by that margin, inserting it
// evicts colder values, never what the same batch brought in.  What does not fit the
// bound, or finds no room in memory, is dropped without error (counted): a prefetch is a
// hint, the read still works from SSD.
//
// A read of a key whose prefetch is on its way waits for it (AwaitKeys) instead of
// reading the same bytes from SSD a second time.
//
// Counters: requested (keys asked), queued, prefetched (values inserted into memory),
// hits (a later read found a prefetched value in memory, counted once per prefetch),
// wasted (a prefetched value left memory unread: evicted or deleted), dropped (over the
// bound, no room, or failed to read).  A prefetched value is followed until it is read,
// found gone, or pushed out of a bounded list of the newest kPendingReads prefetches
// (then it is neither hit nor wasted).
//
// Thread-safety: every method is thread-safe.  Stop() before the tiers go away.
#ifndef KVENGINE_DB_PREFETCHER_H_
#define KVENGINE_DB_PREFETCHER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "db/memory_tier.h"
#include "db/ssd_tier.h"
#include "kvengine/slice.h"
#include "util/mutex.h"

namespace kvengine {

class Prefetcher {
 public:
  // Where the counters go (the DB's table, db/db_stats.def); each outlives the prefetcher.
  struct Counters {
    std::atomic<uint64_t>* requested;
    std::atomic<uint64_t>* queued;
    std::atomic<uint64_t>* prefetched;
    std::atomic<uint64_t>* hits;
    std::atomic<uint64_t>* wasted;
    std::atomic<uint64_t>* dropped;
  };
  // Prefetched values followed for hits and waste.
  static constexpr size_t kPendingReads = 1 << 16;

  // Neither tier is owned; both outlive the prefetcher (Stop() first).  Starts the thread.
  Prefetcher(MemoryTier* memory, SsdTier* ssd, uint64_t max_bytes, bool verify_checksums,
             const Counters& counters);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Queues the keys that are on SSD, not in memory and not already on their way, while
  // the bound allows; (*results)[i] is 1 for a key queued, 0 otherwise.  Returns at once.
  // REQUIRES: results->size() == keys.size(); the keys are valid (DB's input rules).
  void Submit(std::span<const Slice> keys, std::vector<int64_t>* results);

  // Returns once no prefetch of any of `keys` is queued or being read.  Cheap (one
  // atomic load) when nothing is in flight.
  void AwaitKeys(std::span<const Slice> keys);
  void AwaitKey(const Slice& key) { AwaitKeys(std::span<const Slice>(&key, 1)); }

  // A read found keys[i] in memory (found[i] true) or missed it: a prefetched value read
  // for the first time counts a hit; one found gone counts wasted.  Cheap when no
  // prefetched value is followed.
  void NoteReads(std::span<const Slice> keys, const std::vector<bool>& found);
  // Whether a prefetched value is followed (NoteReads has anything to do): one relaxed load.
  bool following() const { return unread_count_.load(std::memory_order_relaxed) != 0; }
  void NoteRead(const Slice& key, bool found) {
    if (!following()) return;
    NoteReads(std::span<const Slice>(&key, 1), std::vector<bool>{found});
  }

  // Drops what is queued, waits for the read under way, stops the thread.  Idempotent.
  void Stop();

  uint64_t in_flight_bytes() const { return in_flight_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    std::string key;
    uint64_t size = 0;  // the value's size when queued (it is read at its size then)
  };

  void Run();
  // Reads the jobs from SSD and inserts each value still current into memory.
  void Load(std::vector<Job>* jobs);
  // The jobs are done: forgets them as in flight, wakes the waiters.
  void Finish(const std::vector<Job>& jobs);
  // Follows `key` for NoteReads; drops the oldest followed when there are too many.
  void Follow(const std::string& key) REQUIRES(mu_);

  MemoryTier* const memory_;
  SsdTier* const ssd_;
  const uint64_t max_bytes_;
  const bool verify_checksums_;
  const Counters counters_;

  Mutex mu_;
  CondVar work_cv_;  // jobs queued, or stop
  CondVar done_cv_;  // jobs finished
  std::deque<Job> queue_ GUARDED_BY(mu_);
  std::unordered_set<std::string> in_flight_ GUARDED_BY(mu_);  // queued or being read
  std::atomic<uint64_t> in_flight_keys_{0};   // in_flight_.size(), for the cheap checks
  std::atomic<uint64_t> in_flight_bytes_{0};  // their sizes
  bool stopping_ GUARDED_BY(mu_) = false;
  // Prefetched values not read yet, oldest first, with their place in the list.
  std::list<std::string> unread_order_ GUARDED_BY(mu_);
  std::unordered_map<std::string, std::list<std::string>::iterator> unread_ GUARDED_BY(mu_);
  std::atomic<uint64_t> unread_count_{0};
  std::thread thread_;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_PREFETCHER_H_
