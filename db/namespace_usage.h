// NamespaceUsage: what each namespace holds in the engine's tiers, the limits it must
// keep there (NamespaceOptions' quotas and weight), and its counters (issue #29:
// quotas and fair eviction; docs/design.md, "Namespaces: quotas and fair shares").
//
// The engine knows a namespace only by the id its keys carry (util/namespace_key.h):
// every key is charged, as it enters or leaves a tier, to the namespace its first nine
// bytes name, or to the default namespace.  The namespace layer (NamespaceDB) tells the
// table each registered namespace's name and limits (SetLimits) and when one is dropped
// (Forget).  A namespace the table was never told of -- keys a peer sent -- is counted
// all the same, named by its id, with no quota and weight 1.
//
// What the tiers do with it:
//   * every reservation of the memory tier is charged to its namespace as it is made
//     (Slot::reserved, until it commits or is given back), so what a namespace holds
//     against its quota and its share is its values and its reservations;
//   * a put into a namespace at its tier quota first evicts that namespace's own
//     coldest values (memory tier: MemoryTier::MakeQuotaRoom; SSD tier:
//     SsdTier::MakeNamespaceRoomLocked); when it has none to evict, the put fails
//     NoSpace for that namespace only;
//   * when a tier is full, its victims come first from the namespaces most over their
//     fair share (in the memory tier: the putter's own first when it is over, and never
//     a namespace within its share while anybody is over): the tier's capacity split by
//     weight among the namespaces that hold something there (the memory tier: Refresh() and
//     MostOver(); the SSD tier, which evicts whole buckets, works its shares out from its buckets'
//     tallies).
// The SSD tier charges the ssd_* figures from per-bucket tallies (SsdBucket::namespaces):
// its index keeps key fingerprints, not keys, so what a bucket evicted whole held is
// read from its tally, not from the keys.
//
// Cost: one array slot per namespace (kSlots of them, ~1 MiB, touched only as used), no
// RAM per key.  Finding a key's slot is a branch for the default namespace and one
// probe of an open-addressed table for the others; counting is relaxed atomics.
//
// Thread-safety: every method from any thread.  Slots are claimed by CAS and never
// freed (a dropped namespace's slot keeps its counters until its id is seen again);
// names are guarded by names_mu_.
#ifndef KVENGINE_DB_NAMESPACE_USAGE_H_
#define KVENGINE_DB_NAMESPACE_USAGE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "db/arena_layout.h"
#include "util/mutex.h"
#include "util/namespace_key.h"
#include "util/thread_annotations.h"

namespace kvengine {

struct Item;

// The per-namespace figures, each one line: NS_GAUGE figures are what a namespace holds
// now, NS_COUNTER figures only grow.  Reported in "kvengine.stats" (namespace.NAME.field),
// the JSON's "namespaces" object and Prometheus (kvengine_namespace_field[_total] with
// a namespace label); see db/db_impl_stats.cc.
#define KV_NAMESPACE_FIGURES(NS_GAUGE, NS_COUNTER)                                         \
  NS_GAUGE(memory_bytes, "Value bytes the namespace holds in the memory tier.")            \
  NS_GAUGE(memory_items, "Values the namespace holds in the memory tier.")                 \
  NS_GAUGE(ssd_bytes, "Value bytes the namespace holds in the SSD tier.")                  \
  NS_GAUGE(ssd_items, "Values the namespace holds in the SSD tier.")                       \
  NS_GAUGE(memory_reserved_bytes,                                                          \
           "Memory tier bytes reserved for the namespace's puts not yet committed.")       \
  NS_COUNTER(hits, "Reads of the namespace's keys that found a value.")                    \
  NS_COUNTER(misses, "Reads of the namespace's keys found in no tier.")                    \
  NS_COUNTER(memory_evictions, "Values of the namespace evicted from the memory tier.")    \
  NS_COUNTER(ssd_evictions, "Values of the namespace dropped with SSD buckets evicted.")   \
  NS_COUNTER(quota_evictions, "Values evicted to keep the namespace within a tier quota.") \
  NS_COUNTER(quota_rejections,                                                             \
             "Puts and reservations refused because the namespace's quota left no room.")

class NamespaceUsage {
 public:
  // Namespaces the table tells apart; more (possible only with foreign keys: the
  // registry holds at most 4096) are counted together as "other".
  static constexpr size_t kSlots = 8192;

  struct Slot {
    std::atomic<uint64_t> id{0};  // 0: free (an id of 0 is never registered)
    // What the namespace holds in the memory tier: values published, and room reserved
    // for its puts not yet committed (MemoryTier::Reservation), which its quota and its
    // share count as held -- a tenant holding reservations holds the memory.
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> items{0};
    std::atomic<uint64_t> reserved{0};
#define KV_NS_COUNTER_FIELD(field, help) std::atomic<uint64_t> field{0};
#define KV_NS_SKIP(field, help)
    KV_NAMESPACE_FIGURES(KV_NS_SKIP, KV_NS_COUNTER_FIELD)
#undef KV_NS_COUNTER_FIELD
#undef KV_NS_SKIP
    // What the namespace holds in the SSD tier (the sum of its buckets' tallies).
    std::atomic<uint64_t> ssd_bytes{0};
    std::atomic<uint64_t> ssd_items{0};
    std::atomic<uint64_t> quota{0};      // memory quota; 0: none
    std::atomic<uint64_t> ssd_quota{0};  // SSD quota; 0: none
    std::atomic<uint32_t> weight{1};
    // Set by Refresh: bytes over fair share, in thousandths (1000: exactly its share).
    std::atomic<uint32_t> pressure{0};

    void Add(uint64_t size) {
      bytes.fetch_add(size, std::memory_order_relaxed);
      items.fetch_add(1, std::memory_order_relaxed);
    }
    void Sub(uint64_t size) {
      bytes.fetch_sub(size, std::memory_order_relaxed);
      items.fetch_sub(1, std::memory_order_relaxed);
    }
    void Count(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }
    // What the quota and the fair share count: values and reservations.
    uint64_t Held() const {
      return bytes.load(std::memory_order_relaxed) + reserved.load(std::memory_order_relaxed);
    }
    // Whether `size` more bytes fit the namespace's memory quota.
    bool Fits(uint64_t size) const {
      const uint64_t q = quota.load(std::memory_order_relaxed);
      return q == 0 || Held() + size <= q;
    }
    // Charges a reservation of `size` bytes when it fits the quota, as one step (a CAS),
    // so that concurrent reservations cannot together pass it.  False: it does not fit.
    bool TryReserve(uint64_t size) {
      const uint64_t q = quota.load(std::memory_order_relaxed);
      uint64_t r = reserved.load(std::memory_order_relaxed);
      do {
        if (q != 0 && bytes.load(std::memory_order_relaxed) + r + size > q) return false;
      } while (!reserved.compare_exchange_weak(r, r + size, std::memory_order_relaxed));
      return true;
    }
    void Unreserve(uint64_t size) { reserved.fetch_sub(size, std::memory_order_relaxed); }
  };

  // One namespace's figures, copied (for the stats).
  struct Report {
    std::string name;
    uint64_t memory_quota_bytes = 0, ssd_quota_bytes = 0;
    uint32_t weight = 1;
#define KV_NS_REPORT_FIELD(field, help) uint64_t field = 0;
    KV_NAMESPACE_FIGURES(KV_NS_REPORT_FIELD, KV_NS_REPORT_FIELD)
#undef KV_NS_REPORT_FIELD
  };

  // `memory_capacity`: the bytes of the memory tier that fair shares divide.  With a
  // `layout` of several arenas (Options::namespace_arenas) each arena's capacity is
  // divided among its own namespaces instead: they evict only one another.
  explicit NamespaceUsage(uint64_t memory_capacity, const ArenaLayout* layout = nullptr);
  NamespaceUsage(const NamespaceUsage&) = delete;
  NamespaceUsage& operator=(const NamespaceUsage&) = delete;

  // The slot of the namespace of a stored key.
  Slot* Of(std::string_view key) {
    if (!ns::IsNamespaced(key) || key.size() < ns::kPrefixSize) return &default_;
    return OfId(ns::IdOfKey(key));
  }
  // The slot of the namespace of an item in the memory tier.  REQUIRES: the item's key
  // is set (it is published, pinned or reserved with its key).
  Slot* OfItem(const Item& item);
  Slot* OfId(uint64_t id) {
    // The usual case, inline (every put and read of a namespace's key asks): the id is
    // in its home slot.  Id 0 is never in a slot (0 marks a free one).
    Slot& home = slots_[static_cast<size_t>(id) & (kSlots - 1)];
    if (id != 0 && home.id.load(std::memory_order_acquire) == id) return &home;
    return OfIdSlow(id);
  }
  Slot* default_slot() { return &default_; }

  // The namespace layer's: the name, quotas and weight of a registered namespace.
  void SetLimits(uint64_t id, const std::string& name, uint64_t memory_quota_bytes,
                 uint64_t ssd_quota_bytes, uint32_t weight) EXCLUDES(names_mu_);
  // Namespace `id` was dropped: its limits go, its counters stay (its keys are gone).
  void Forget(uint64_t id) EXCLUDES(names_mu_);

  // Recomputes every namespace's pressure from what each holds now, at most every
  // 200 us: cheap enough to call once per eviction round; a round that finds another
  // running skips.  `force`: now, waiting for one running (for a round about to give up
  // on pressures that may be stale).
  void Refresh(bool force = false) EXCLUDES(refresh_mu_);
  // Whether any namespace was ever given a memory quota: until one is, a put has no
  // quota to look up (never false again once true).
  bool AnyMemoryQuota() const { return memory_quotas_.load(std::memory_order_relaxed); }
  // Whether more than one namespace holds values or reservations: only then is fairness
  // a question (the default namespace alone evicts by plain recency).
  // Per arena part (db/arena_layout.h): only its namespaces share it.
  bool Shared(uint32_t part = 0) const { return active_[part].load(std::memory_order_relaxed) > 1; }
  // The slot of arena part `part` most over its fair share at the last Refresh (null:
  // none over).
  Slot* MostOver(uint32_t part = 0) const {
    return most_over_[part].load(std::memory_order_relaxed);
  }
  // The arena part holding the values of the namespace of `slot`.
  uint32_t PartOf(const Slot* slot) const {
    return layout_.single() ? 0 : layout_.PartOfId(slot->id.load(std::memory_order_relaxed));
  }

  // The name `slot` is reported by: "default", a registered name, "id:<hex>" or "other".
  std::string NameOf(const Slot* slot) const EXCLUDES(names_mu_);

  // Every namespace that was registered or holds or held something, the default first.
  // Empty while only the default namespace was ever seen, so that a DB without
  // namespaces reports nothing new.
  std::vector<Report> Reports() const EXCLUDES(names_mu_);

 private:
  Slot* OfIdSlow(uint64_t id);
  Slot* Probe(uint64_t id);
  Report ReportOf(const Slot& slot, std::string name) const;
  // The slots claimed so far, in claim order, the default's first (null: being claimed).
  template <typename Fn>
  void ForEachUsed(Fn&& fn) const;

  const uint64_t capacity_;
  const ArenaLayout layout_;  // a single part unless the tier is cut into arenas
  Slot default_;
  Slot other_;  // namespaces beyond kSlots
  std::unique_ptr<Slot[]> slots_;
  // claimed_[0, used_) are the slots claimed, in claim order.
  std::unique_ptr<std::atomic<Slot*>[]> claimed_;
  std::atomic<size_t> used_{0};
  std::atomic<int64_t> last_refresh_nanos_{0};
  // Per arena part.
  std::atomic<uint32_t> active_[ArenaLayout::kMaxNamedParts + 1] = {};
  std::atomic<Slot*> most_over_[ArenaLayout::kMaxNamedParts + 1] = {};
  std::atomic<bool> memory_quotas_{false};

  Mutex refresh_mu_;
  mutable Mutex names_mu_;
  // Registered namespaces' names, by id (the others are named by their id).
  std::map<uint64_t, std::string> names_ GUARDED_BY(names_mu_);
};

}  // namespace kvengine

#endif  // KVENGINE_DB_NAMESPACE_USAGE_H_
