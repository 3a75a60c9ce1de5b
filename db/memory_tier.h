// MemoryTier: values in DRAM, in one NUMA-local arena registered for peers.
//
// A sharded hash index maps key -> Item; the SlabAllocator places value bytes in the
// arena and keeps the LRU order.  A put copies the caller's buffers into the arena once;
// a read pins the item and copies it out once.  Overwrites and deletes unpublish the old
// item at once and its room is reused only after the last reader unpins it.
//
// When the arena is full, the coldest values are evicted.  Before an evicted value is
// dropped, the EvictionHandler (the SSD tier, when configured) is offered it; if the
// handler refuses, the value stays and other victims are tried.
//
// Thread-safety: all methods are thread-safe.
#ifndef KVENGINE_DB_MEMORY_TIER_H_
#define KVENGINE_DB_MEMORY_TIER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "db/arena_layout.h"
#include "db/item.h"
#include "db/key_index.h"
#include "db/namespace_usage.h"
#include "db/slab_allocator.h"
#include "kvengine/options.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/log_limiter.h"
#include "util/mutex.h"
#include "util/numa_arena.h"

namespace kvengine {

class Logger;
class RemovalFeed;

// Offered each value the memory tier is about to evict (write-back offload).
class EvictedKeys;

class EvictionHandler {
 public:
  virtual ~EvictionHandler() = default;
  // Returns true when the value is safe elsewhere (or may be dropped), false to keep it
  // in memory.  `value` stays valid only during the call.
  virtual bool OnEvict(const Slice& key, const Slice& value, uint64_t version) = 0;
};

class MemoryTier {
 public:
  struct Stats {
    uint64_t items = 0;
    uint64_t value_bytes = 0;      // sum of value sizes held
    uint64_t allocated_bytes = 0;  // room taken in the arena (class sizes)
    uint64_t capacity_bytes = 0;
    uint64_t evictions = 0;
    uint64_t evicted_bytes = 0;
    uint64_t eviction_refusals = 0;  // values the handler refused to take
    uint64_t rejected_puts = 0;      // puts failed with NoSpace
    uint64_t lookup_hits = 0;        // Lookup() calls that found the key
    uint64_t lookup_misses = 0;      // Lookup() calls that did not
    // RAM of the index, beside the keys' and the values' bytes: the slabs' item arrays
    // and the index shards' slots.
    uint64_t index_bytes = 0;
    // RAM mapped for the keys' bytes (db/key_arena.h; keys over 4 KiB are on the heap).
    uint64_t key_arena_bytes = 0;
  };

  // A pinned value: its bytes stay valid and unchanged until the handle is released.
  class Handle {
   public:
    Handle() = default;
    ~Handle() { Release(); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    Handle(Handle&& other) noexcept : tier_(other.tier_), item_(other.item_) {
      other.item_ = nullptr;
    }
    bool valid() const { return item_ != nullptr; }
    Slice value() const { return Slice(tier_->AllocatorOf(item_).DataOf(item_), item_->size); }
    uint64_t version() const { return item_->version; }
    void Release();

   private:
    friend class MemoryTier;
    MemoryTier* tier_ = nullptr;
    Item* item_ = nullptr;
  };

  // Room for one value that nobody can see yet: the first half of a put made in two
  // steps, for attached clients that copy the bytes in themselves (db/shared_arena.h).
  // The caller fills data() and then Commit()s the reservation; a reservation destroyed
  // uncommitted gives its room back.  From Reserve to Commit or Abandon its bytes are
  // charged to the namespace it was reserved for (NamespaceUsage::Slot::reserved): they
  // count against its quota and its fair share as its values do.
  class Reservation {
   public:
    Reservation() = default;
    ~Reservation() { Abandon(); }
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    Reservation(Reservation&& other) noexcept
        : tier_(other.tier_), item_(other.item_), charged_(other.charged_) {
      other.item_ = nullptr;
      other.charged_ = nullptr;
    }
    Reservation& operator=(Reservation&& other) noexcept {
      if (this != &other) {
        Abandon();
        tier_ = other.tier_;
        item_ = other.item_;
        charged_ = other.charged_;
        other.item_ = nullptr;
        other.charged_ = nullptr;
      }
      return *this;
    }
    bool valid() const { return item_ != nullptr; }
    char* data() const { return tier_->AllocatorOf(item_).DataOf(item_); }
    // The arena part the room is in (db/arena_layout.h).
    uint32_t part() const { return tier_->PartOf(item_); }
    uint64_t size() const { return item_->size; }
    // Gives the room back, and its namespace's charge (no-op when already committed or
    // abandoned).
    void Abandon();

   private:
    friend class MemoryTier;
    // Drops the namespace's charge (at Commit: its value is charged instead).
    void Uncharge();
    MemoryTier* tier_ = nullptr;
    Item* item_ = nullptr;
    NamespaceUsage::Slot* charged_ = nullptr;  // null: charged to no namespace
  };

  // How a reservation makes room under its namespace's memory quota.
  enum class QuotaRoom {
    // A put's: the namespace's own coldest values are evicted until it fits.
    kEvictOwn,
    // A slot reserved ahead of a put that may never come (an attached client's spare):
    // refused, evicting nothing of its namespace, when it does not fit as things are.
    kNoEvict,
  };

  // Maps the arena and builds the index.  `version_source` hands out versions; it is
  // shared with the other tiers so versions are monotonic across the DB.
  static Status Create(const Options& options, Logger* logger,
                       std::atomic<uint64_t>* version_source, std::unique_ptr<MemoryTier>* result);
  ~MemoryTier();

  void SetEvictionHandler(EvictionHandler* handler) { eviction_handler_ = handler; }
  // Where the tier announces the values it evicts or erases (not owned; outlives the
  // tier).  Set before the tier is used.
  void SetRemovalFeed(RemovalFeed* feed) { removal_feed_ = feed; }
  // Told the hash of every key evicted without a handler to take it (the value is lost).
  // Not owned; set before the tier is used.  nullptr: nobody is told.
  void SetEvictedKeys(EvictedKeys* evicted) { evicted_keys_ = evicted; }
  // Where the tier charges each value to its namespace, and reads the namespaces'
  // quotas and fair shares (not owned; outlives the tier).  Set before the tier is
  // used.  nullptr: no namespaces, plain recency.
  void SetNamespaceUsage(NamespaceUsage* usage) { usage_ = usage; }

  // Runs under the key's shard lock, the DB's per-key lock: whatever it changes in the
  // other tiers changes atomically with the memory tier for that key.
  using VersionHook = std::function<void(uint64_t version)>;
  using CheckHook = std::function<bool()>;

  // Stores the concatenation of parts (total bytes `size`) under key.  Stores the new
  // version in *version (may be nullptr).  `published`, when set, is called with the new
  // version under the key's lock, right after the value became visible.  NoSpace when
  // the arena is full and eviction is off or impossible; InvalidArgument when the value
  // can never fit.
  Status Put(const Slice& key, std::span<const Slice> parts, uint64_t size, uint64_t* version,
             const VersionHook& published = nullptr);

  // Put in two steps: Reserve room for `size` bytes (evicting as Put does; same errors),
  // then Commit the filled reservation under key, which publishes it exactly as Put
  // would (version, `published` hook, replaced value unpublished).
  //
  // The reservation is charged to the namespace `key` names (its first nine bytes,
  // util/namespace_key.h: ns::Prefix(id) alone names namespace id; any other key, the
  // empty one included, the default namespace) until it is committed or abandoned.
  // NoSpace naming the namespace and its quota when the room would take the namespace
  // past its memory quota and `room` lets nothing of it go (or nothing can); room in a
  // full tier is made as for a put of that namespace (PickVictims).  Commit under a key
  // of another namespace moves the charge, making room there as a put would.
  Status Reserve(const Slice& key, uint64_t size, QuotaRoom room, Reservation* reservation);
  Status Commit(const Slice& key, Reservation* reservation, uint64_t* version,
                const VersionHook& published = nullptr);

  // Inserts a value read from another tier with its existing `version` (promotion).
  // Under the key's lock it gives up, returning false, when the key is already in memory
  // or `still_valid` returns false.  Never evicts to make room: returns false instead.
  bool Insert(const Slice& key, std::span<const Slice> parts, uint64_t size, uint64_t version,
              const CheckHook& still_valid);

  // Calls fn with the version and size of key's value in memory (both 0 when absent)
  // under the key's lock.
  void WithKeyLocked(const Slice& key,
                     const std::function<void(uint64_t version, uint64_t size)>& fn);

  // Pins the value of key into *handle.  Returns false when absent.
  bool Lookup(const Slice& key, Handle* handle);
  // Lookup that never waits for the key's lock: false also when another thread holds
  // it.  For threads that must not wait even the short holds (a shard's keys copied
  // by CopyKeys, an eviction round): the peer server's poller.
  bool TryLookup(const Slice& key, Handle* handle);
  bool Contains(const Slice& key);
  // Contains() of every key at once: (*found)[i] is 1 when keys[i] is in memory, else
  // 0.  Overlaps the keys' cache misses (prefetching in stages), so a batch costs far
  // less than its keys' Contains() one by one.
  void BatchContains(std::span<const Slice> keys, std::vector<uint8_t>* found);
  // Lookup() of every key at once: (*handles)[i] pins keys[i]'s value, or is not valid
  // when it is absent.  The probes' misses overlap as in BatchContains, and the values'
  // first bytes are prefetched before any is used.
  void BatchLookup(std::span<const Slice> keys, std::vector<Handle>* handles);
  // Removes key; returns false when absent.  `also`, when set, runs under the key's lock
  // whether or not the key was in memory, and its result is or-ed into the return value.
  // *in_memory (when not null) tells whether the memory tier held it.
  bool Erase(const Slice& key, const CheckHook& also = nullptr, bool* in_memory = nullptr);
  // The number of index shards: CopyKeys' `shard` runs over [0, shard_count()).
  size_t shard_count() const { return shards_.size(); }
  // Appends the keys of index shard `shard` to *keys, copied under the shard's lock with
  // nothing else done there.  DeleteByRegex matches them afterwards holding no lock, so
  // that a slow pattern costs its caller and not the shard's readers and writers, who
  // wait at most for one shard's keys to be copied.
  void CopyKeys(size_t shard, std::vector<std::string>* keys);
  // Calls fn(key, size, version) for every key (no order; concurrent writes may or may
  // not be seen).
  void ForEach(const std::function<void(std::string_view, uint64_t, uint64_t)>& fn);

  Stats GetStats() const;
  char* arena_base() const { return arena_->base(); }
  size_t arena_size() const { return arena_->size(); }
  const NumaArena& arena() const { return *arena_; }
  // How the arena is cut into arenas per trust boundary (Options::namespace_arenas).
  const ArenaLayout& layout() const { return layout_; }
  // What part `part` of the arena holds: its capacity and the room handed out there.
  void PartUsage(uint32_t part, uint64_t* allocated_bytes, uint64_t* capacity_bytes) const;

 private:
  struct Shard {
    Mutex mu;
    KeyIndex index;  // by Hash64 of the key
  };

  MemoryTier(const Options& options, Logger* logger, std::unique_ptr<NumaArena> arena,
             ArenaLayout layout, std::atomic<uint64_t>* version_source);
  // The part of the arena an item's room is in, and the allocator that placed it.
  uint32_t PartOf(const Item* item) const {
    return allocators_.size() == 1 ? 0 : part_of_slab_[item->slab];
  }
  SlabAllocator& AllocatorOf(const Item* item) const { return *allocators_[PartOf(item)]; }
  // Hash64 of the key: its low bits choose the shard, its high bits the slot there.
  Shard& ShardFor(uint64_t hash) { return shards_[hash % shards_.size()]; }
  // Finds every key of `keys` at once and calls found(i, item) for each keys[i] that is
  // indexed, under its shard's lock: the dependent reads of a wave of lookups are made
  // in stages that prefetch for every key of the wave before reading any, so that their
  // misses overlap, each stage locking each shard of the wave once (one at a time).
  template <typename Fn>
  void ProbeBatch(std::span<const Slice> keys, Fn&& found);
  // Allocates room for `size` bytes in arena part `part`, evicting there to make it;
  // `putter` is the namespace the room is for (null: none known).
  Item* AllocateWithEviction(uint64_t size, uint32_t part, NamespaceUsage::Slot* putter,
                             Status* status);
  // Picks the victims of one eviction round for room of `size`: by recency, or, while
  // several namespaces hold values, from the namespaces over their fair share first --
  // the putter's own first when it is over its share, and then never a namespace within
  // its share (false rather than one of those: the put fails NoSpace).
  // Only values of arena part `part` are candidates: each part evicts within itself.
  bool PickVictims(uint64_t size, uint32_t part, NamespaceUsage::Slot* putter,
                   std::vector<Item*>* victims);
  // Charges `size` bytes of reservation to `ns` within its memory quota, evicting its
  // own coldest values first when `room` allows.  NoSpace naming the namespace and its
  // quota, counted and logged, when it cannot.
  Status ChargeQuota(NamespaceUsage::Slot* ns, uint64_t size, QuotaRoom room);
  // Reserve, charging the reservation to key's namespace only when `charge`.
  Status ReserveRoom(const Slice& key, uint64_t size, QuotaRoom room, bool charge,
                     Reservation* reservation);
  // Evicts values of `ns` until `size` more bytes fit its memory quota.  False when none
  // could go.
  bool MakeQuotaRoom(NamespaceUsage::Slot* ns, uint64_t size);
  // The NoSpace of a value of `size` refused by `ns`'s quota, counted and logged.
  Status QuotaRefusal(NamespaceUsage::Slot* ns, uint64_t size);
  // Commit, once the reservation is charged to key's namespace; `hash` is Hash64(key).
  Status CommitWithinQuota(const Slice& key, uint64_t hash, Reservation* reservation,
                           uint64_t* version, const VersionHook& published);
  // " in the arena of NAMES" when the layout has several parts, for messages; else "".
  std::string ArenaNamed(uint32_t part) const;
  // Lookup, or TryLookup when !wait.
  bool Pin(const Slice& key, bool wait, Handle* handle);
  void Evict(Item* victim);
  void Unref(Item* item);
  // Starts the cache misses of what a read of the item touches after the item itself:
  // its value's first bytes, and its LRU neighbours, which Touch relinks.
  // REQUIRES: the item is pinned, or indexed and its shard's lock held.
  void PrefetchForRead(const Item* item) const;
  // `hash` is Hash64 of the item's key.
  // REQUIRES: item's key not indexed.
  void IndexLocked(Shard& shard, uint64_t hash, Item* item) REQUIRES(shard.mu);
  // REQUIRES: item indexed.
  void UnindexLocked(Shard& shard, uint64_t hash, Item* item) REQUIRES(shard.mu);

  const Options options_;
  Logger* const logger_;
  std::unique_ptr<NumaArena> arena_;
  const ArenaLayout layout_;
  // One allocator per part of the layout, over that part's slabs.
  std::vector<std::unique_ptr<SlabAllocator>> allocators_;
  std::vector<uint8_t> part_of_slab_;  // by Item::slab, when there are several parts
  std::atomic<uint64_t>* const version_source_;
  std::vector<Shard> shards_;
  EvictionHandler* eviction_handler_ = nullptr;
  RemovalFeed* removal_feed_ = nullptr;
  EvictedKeys* evicted_keys_ = nullptr;
  NamespaceUsage* usage_ = nullptr;
  LogLimiter quota_log_{std::chrono::seconds(10)};  // the quota refusals' warnings

  std::atomic<uint64_t> items_{0};
  std::atomic<uint64_t> value_bytes_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> evicted_bytes_{0};
  std::atomic<uint64_t> eviction_refusals_{0};
  std::atomic<uint64_t> rejected_puts_{0};
  std::atomic<uint64_t> lookup_hits_{0};
  std::atomic<uint64_t> lookup_misses_{0};
  std::atomic<uint64_t> index_slot_bytes_{0};  // sum of the shards' KeyIndex::bytes()
};

}  // namespace kvengine

#endif  // KVENGINE_DB_MEMORY_TIER_H_
