#include "db/memory_tier.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "db/evicted_keys.h"
#include "db/removal_feed.h"
#include "util/buffers.h"
#include "util/config_parse.h"
#include "util/hash.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/namespace_key.h"
#include "util/perf_point.h"

namespace kvengine {

namespace {
// Each attempt evicts at least one value or waits for a reader to unpin one.
constexpr int kMaxAllocationAttempts = 4096;
// A read's first bytes prefetched by Lookup (larger values stream in behind them).
constexpr uint64_t kPrefetchValueBytes = 512;
// A quota's eviction gives up after this many searches in a row find none of the
// namespace's values (each looks SlabAllocator::kRankScan values deep per class).
constexpr int kQuotaSearches = 64;
}  // namespace

void MemoryTier::Handle::Release() {
  if (item_ != nullptr) {
    tier_->Unref(item_);
    item_ = nullptr;
  }
}

Status MemoryTier::Create(const Options& options, Logger* logger,
                          std::atomic<uint64_t>* version_source,
                          std::unique_ptr<MemoryTier>* result) {
  result->reset();
  ArenaLayout layout;
  Status s = ArenaLayout::Parse(options, &layout);
  if (!s.ok()) return s;
  NumaArena::Params params;
  params.size = layout.total_size();
  params.huge_pages = options.use_huge_pages;
  params.prefault = options.prefault_memory;
  // Attached clients map the arena: it must be a memfd they can receive, one per part,
  // so that a client receives only the parts it may map.
  params.shared = !options.local_listen.empty();
  if (!layout.single()) {
    for (size_t i = 0; i < layout.part_count(); i++) params.parts.push_back(layout.part(i).size);
  }
  std::unique_ptr<NumaArena> arena;
  s = NumaArena::Create(params, logger, &arena);
  if (!s.ok()) return s;
  result->reset(
      new MemoryTier(options, logger, std::move(arena), std::move(layout), version_source));
  return Status::OK();
}

MemoryTier::MemoryTier(const Options& options, Logger* logger, std::unique_ptr<NumaArena> arena,
                       ArenaLayout layout, std::atomic<uint64_t>* version_source)
    : options_(options),
      logger_(logger),
      arena_(std::move(arena)),
      layout_(std::move(layout)),
      version_source_(version_source),
      shards_(options.index_shards) {
  const uint64_t slab = options.memory_slab_size;
  for (uint32_t i = 0; i < layout_.part_count(); i++) {
    const ArenaLayout::Part& part = layout_.part(i);
    allocators_.push_back(std::make_unique<SlabAllocator>(
        arena_->base() + part.offset, part.size, slab, static_cast<uint32_t>(part.offset / slab)));
    if (layout_.single()) continue;
    part_of_slab_.resize((part.offset + part.size) / slab, static_cast<uint8_t>(i));
  }
  for (const Shard& shard : shards_) index_slot_bytes_.fetch_add(shard.index.bytes());
}

MemoryTier::~MemoryTier() = default;

void MemoryTier::Unref(Item* item) {
  if (item->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) AllocatorOf(item).Free(item);
}

void MemoryTier::IndexLocked(Shard& shard, uint64_t hash, Item* item) {
  const size_t before = shard.index.bytes();
  shard.index.Insert(hash, item);
  index_slot_bytes_.fetch_add(shard.index.bytes() - before, std::memory_order_relaxed);
  items_.fetch_add(1, std::memory_order_relaxed);
  value_bytes_.fetch_add(item->size, std::memory_order_relaxed);
  if (usage_ != nullptr) usage_->OfItem(*item)->Add(item->size);
}

void MemoryTier::UnindexLocked(Shard& shard, uint64_t hash, Item* item) {
  shard.index.Erase(hash, item);
  items_.fetch_sub(1, std::memory_order_relaxed);
  value_bytes_.fetch_sub(item->size, std::memory_order_relaxed);
  if (usage_ != nullptr) usage_->OfItem(*item)->Sub(item->size);
}

Item* MemoryTier::AllocateWithEviction(uint64_t size, uint32_t part, NamespaceUsage::Slot* putter,
                                       Status* status) {
  PerfPoint perf(PerfKey::memory_allocate);
  SlabAllocator& allocator = *allocators_[part];
  std::vector<Item*> victims;
  for (int attempt = 0; attempt < kMaxAllocationAttempts; attempt++) {
    if (Item* item = allocator.Allocate(size)) return item;
    if (options_.memory_eviction == MemoryEviction::kNone) {
      rejected_puts_.fetch_add(1, std::memory_order_relaxed);
      *status =
          Status::NoSpace("memory tier is full (" + FormatSize(allocator.allocated_bytes()) +
                          " of " + FormatSize(allocator.capacity()) + " in use" + ArenaNamed(part) +
                          ") and memory_eviction=none; value of " + FormatSize(size) + " rejected");
      return nullptr;
    }
    victims.clear();
    if (!PickVictims(size, part, putter, &victims)) break;
    for (Item* victim : victims) Evict(victim);
    // Victims pinned by readers free their room only when the reader is done.
    if (victims.empty() || attempt > 16) std::this_thread::yield();
  }
  rejected_puts_.fetch_add(1, std::memory_order_relaxed);
  *status = Status::NoSpace(
      "memory tier cannot make room for a value of " + FormatSize(size) +
      (putter != nullptr && usage_ != nullptr ? " of namespace " + usage_->NameOf(putter) : "") +
      ArenaNamed(part) +
      ": the values that could be evicted are in use, refused by the offload tier, or of "
      "namespaces within their fair share of it");
  return nullptr;
}

bool MemoryTier::PickVictims(uint64_t size, uint32_t part, NamespaceUsage::Slot* putter,
                             std::vector<Item*>* victims) {
  SlabAllocator& allocator = *allocators_[part];
  if (usage_ == nullptr) return allocator.PickVictims(size, victims);
  usage_->Refresh();
  NamespaceUsage::Slot* most = usage_->MostOver(part);
  // A putter over its share pays for its room itself, and while anybody is over their
  // share, nobody within theirs pays for it: the class of the room holding no value of
  // a namespace over its share used to fall back to the coldest values -- anybody's
  // (issue #45: a tenant's 64 KiB puts pushed out another's values of that class while
  // the tier was full of a third one's 1 MiB values).
  const bool putter_over =
      putter != nullptr && putter->pressure.load(std::memory_order_relaxed) > 1000;
  if (!usage_->Shared(part) || (most == nullptr && !putter_over)) {
    return allocator.PickVictims(size, victims);
  }
  // 3: the putter's own, when it is over its share; 2: the namespace most over its
  // share; 1: another over its share; 0: within it.
  if (allocator.PickRankedVictims(
          size,
          [&](const Item& item) {
            NamespaceUsage::Slot* ns = usage_->OfItem(item);
            if (putter_over && ns == putter) return 3;
            if (ns == most) return 2;
            return ns->pressure.load(std::memory_order_relaxed) > 1000 ? 1 : 0;
          },
          /*enough=*/putter_over ? 3 : 2, victims)) {
    return true;
  }
  // None over its share holds a value that can go.  The pressures may be up to 200 us
  // old: when, as things are now, nobody is over, the coldest go after all.
  usage_->Refresh(/*force=*/true);
  const bool still_over =
      usage_->MostOver(part) != nullptr ||
      (putter != nullptr && putter->pressure.load(std::memory_order_relaxed) > 1000);
  return !still_over && allocator.PickVictims(size, victims);
}

Status MemoryTier::ChargeQuota(NamespaceUsage::Slot* ns, uint64_t size, QuotaRoom room) {
  const uint64_t quota = ns->quota.load(std::memory_order_relaxed);
  // A put of a value larger than the quota, or a namespace whose values cannot go
  // (memory_eviction=none promises that nothing is evicted, for a quota either).
  const bool may_evict = room == QuotaRoom::kEvictOwn &&
                         options_.memory_eviction != MemoryEviction::kNone && size <= quota;
  // The room MakeQuotaRoom made can be taken by a concurrent reservation of the same
  // namespace before this one is charged: then it looks again, a few times.
  for (int attempt = 0; attempt < 8; attempt++) {
    if (ns->TryReserve(size)) return Status::OK();
    if (!may_evict || !MakeQuotaRoom(ns, size)) break;
  }
  if (room == QuotaRoom::kNoEvict) {  // a spare: given up silently, not a refused put
    return Status::NoSpace("namespace " + usage_->NameOf(ns) + " has no room for a spare slot");
  }
  return QuotaRefusal(ns, size);
}

bool MemoryTier::MakeQuotaRoom(NamespaceUsage::Slot* ns, uint64_t size) {
  // A namespace's values are all in its own part.
  SlabAllocator& allocator = *allocators_[usage_->PartOf(ns)];
  std::vector<Item*> victims;
  int fruitless = 0;  // searches in a row that found none of the namespace's values
  for (int attempt = 0; attempt < kMaxAllocationAttempts; attempt++) {
    if (ns->Fits(size)) return true;
    victims.clear();
    if (!allocator.PickVictimWhere(
            size, [&](const Item& item) { return usage_->OfItem(item) == ns; }, &victims)) {
      // Each search moves the other namespaces' values it passed out of the next one's
      // way: look again, deeper each time, before concluding there are none.
      if (++fruitless >= kQuotaSearches) break;
      continue;
    }
    fruitless = 0;
    for (Item* victim : victims) Evict(victim);
    ns->quota_evictions.fetch_add(victims.size(), std::memory_order_relaxed);
  }
  return ns->Fits(size);
}

Status MemoryTier::QuotaRefusal(NamespaceUsage::Slot* ns, uint64_t size) {
  const uint64_t quota = ns->quota.load(std::memory_order_relaxed);
  ns->Count(ns->quota_rejections);
  rejected_puts_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t reserved = ns->reserved.load(std::memory_order_relaxed);
  Status s = Status::NoSpace(
      "namespace " + usage_->NameOf(ns) + " is at its memory quota (" + FormatSize(ns->Held()) +
      " of " + FormatSize(quota) +
      (reserved != 0 ? ", " + FormatSize(reserved) + " reserved" : "") + "): " +
      (size > quota ? "a value of " + FormatSize(size) + " can never fit it"
                    : "none of its values can be evicted for one of " + FormatSize(size)));
  uint64_t held_back = 0;
  if (logger_ != nullptr && quota_log_.Admit(&held_back)) {
    logger_->Logf(LogLevel::kWarn, "memory tier: refused: %s (%llu more refusals held back)",
                  s.ToString().c_str(), static_cast<unsigned long long>(held_back));
  }
  return s;
}

void MemoryTier::Evict(Item* victim) {
  PerfPoint perf(PerfKey::memory_evict);
  // The item keeps no hash (db/item.h): hashing the key again costs far less than the
  // eviction's other work.  The pin keeps the key's bytes in place.
  const std::string key = victim->KeyString();
  const uint64_t hash = Hash64(key);
  Shard& shard = ShardFor(hash);
  SlabAllocator& allocator = AllocatorOf(victim);
  if (eviction_handler_ != nullptr) {
    bool indexed;
    {
      MutexLock lock(&shard.mu);
      indexed = shard.index.Contains(hash, victim);
    }
    if (indexed && !eviction_handler_->OnEvict(Slice(key.data(), key.size()),
                                               Slice(allocator.DataOf(victim), victim->size),
                                               victim->version)) {
      eviction_refusals_.fetch_add(1, std::memory_order_relaxed);
      allocator.Touch(victim);  // keep it, and look elsewhere next time
      Unref(victim);
      return;
    }
  }
  bool dropped = false;
  {
    MutexLock lock(&shard.mu);
    if (shard.index.Contains(hash, victim)) {
      UnindexLocked(shard, hash, victim);
      dropped = true;
    }
  }
  if (dropped) {
    if (removal_feed_ != nullptr) {
      removal_feed_->Record(key, RemovalEvent::kMemory, RemovalEvent::kCapacity);
    }
    if (eviction_handler_ == nullptr && evicted_keys_ != nullptr) evicted_keys_->Note(hash);
    evictions_.fetch_add(1, std::memory_order_relaxed);
    evicted_bytes_.fetch_add(victim->size, std::memory_order_relaxed);
    if (usage_ != nullptr) {
      NamespaceUsage::Slot* ns = usage_->OfItem(*victim);
      ns->Count(ns->memory_evictions);
    }
    Unref(victim);  // the index's reference
  }
  Unref(victim);  // the pin PickVictims took
}

void MemoryTier::Reservation::Uncharge() {
  if (charged_ != nullptr) {
    charged_->Unreserve(item_->size);
    charged_ = nullptr;
  }
}

void MemoryTier::Reservation::Abandon() {
  if (item_ != nullptr) {
    Uncharge();
    tier_->Unref(item_);  // the reservation's reference: never published, so freed
    item_ = nullptr;
  }
}

Status MemoryTier::Reserve(const Slice& key, uint64_t size, QuotaRoom room,
                           Reservation* reservation) {
  return ReserveRoom(key, size, room, /*charge=*/true, reservation);
}

Status MemoryTier::ReserveRoom(const Slice& key, uint64_t size, QuotaRoom room, bool charge,
                               Reservation* reservation) {
  reservation->Abandon();
  const uint32_t part = layout_.PartOfKey(key.view());
  const uint64_t capacity = allocators_[part]->capacity();
  if (size > capacity || size > Item::kMaxSize) {
    return Status::InvalidArgument(
        "value of " + FormatSize(size) + " is larger than the memory tier (" +
        FormatSize(std::min(capacity, Item::kMaxSize)) + ArenaNamed(part) + ")");
  }
  // Charged before the room is made: the namespace's own values make room for it first,
  // before any other's are evicted, and its reservations count while room is made.
  NamespaceUsage::Slot* ns = usage_ != nullptr ? usage_->Of(key.view()) : nullptr;
  NamespaceUsage::Slot* const charged = charge ? ns : nullptr;
  if (charged != nullptr) {
    Status s = ChargeQuota(charged, size, room);
    if (!s.ok()) return s;
  }
  Status s;
  Item* item = AllocateWithEviction(size, part, ns, &s);
  if (item == nullptr) {
    if (charged != nullptr) charged->Unreserve(size);
    return s;
  }
  item->size = size;
  // The reservation's reference; it becomes the index's at Commit.  Not in the LRU, so
  // eviction never picks it.
  item->refs.store(1, std::memory_order_relaxed);
  reservation->tier_ = this;
  reservation->item_ = item;
  reservation->charged_ = charged;
  return Status::OK();
}

Status MemoryTier::Put(const Slice& key, std::span<const Slice> parts, uint64_t size,
                       uint64_t* version, const VersionHook& published) {
  PerfPoint perf(PerfKey::memory_put);
  // Hashed first and the index slot prefetched, so that the slot's cache miss overlaps
  // the reservation and the copy instead of following the shard lock (at 32-byte keys a
  // namespace's 41-byte key made the put 0.89x per CPU second: docs/benchmarks.md).
  const uint64_t hash = Hash64(key.view());
  ShardFor(hash).index.PrefetchHomeUnlocked(hash);
  // This reservation lives for the copy alone: it is charged (a CAS on a counter every
  // thread putting into the namespace shares) only while some namespace has a memory
  // quota to keep; the value is charged when it is published either way.
  Reservation reservation;
  const bool charge = usage_ != nullptr && usage_->AnyMemoryQuota();
  Status s = ReserveRoom(key, size, QuotaRoom::kEvictOwn, charge, &reservation);
  if (!s.ok()) return s;
  GatherCopy(parts, size, reservation.data());
  return CommitWithinQuota(key, hash, &reservation, version, published);
}

Status MemoryTier::Commit(const Slice& key, Reservation* reservation, uint64_t* version,
                          const VersionHook& published) {
  // Room in one part is never published under a key of another: that would put a
  // namespace's value where clients of another trust boundary map it.
  if (reservation->valid() && reservation->part() != layout_.PartOfKey(key.view())) {
    return Status::InvalidArgument("the slot was reserved in the arena of " +
                                   layout_.part(reservation->part()).names +
                                   ", not in the arena of the key's namespace (" +
                                   layout_.part(layout_.PartOfKey(key.view())).names + ")");
  }
  // A reservation made for another namespace (a spare of a connection that has since
  // changed namespace) is charged to key's now, making room there as a put would.
  if (usage_ != nullptr && reservation->valid() && key.size() <= Item::kMaxKeySize) {
    NamespaceUsage::Slot* ns = usage_->Of(key.view());
    if (reservation->charged_ != ns) {
      Status s = ChargeQuota(ns, reservation->size(), QuotaRoom::kEvictOwn);
      if (!s.ok()) return s;
      reservation->Uncharge();
      reservation->charged_ = ns;
    }
  }
  return CommitWithinQuota(key, Hash64(key.view()), reservation, version, published);
}

Status MemoryTier::CommitWithinQuota(const Slice& key, uint64_t hash, Reservation* reservation,
                                     uint64_t* version, const VersionHook& published) {
  if (!reservation->valid()) return Status::InvalidArgument("commit of an empty reservation");
  if (key.size() > Item::kMaxKeySize) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes is longer than the memory tier holds");
  }
  Item* item = reservation->item_;
  NamespaceUsage::Slot* charged = reservation->charged_;
  reservation->item_ = nullptr;  // its reference is the index's from here on
  reservation->charged_ = nullptr;
  SlabAllocator& allocator = AllocatorOf(item);
  allocator.SetKey(item, key.view());

  Item* replaced = nullptr;
  {
    Shard& shard = ShardFor(hash);
    MutexLock lock(&shard.mu);
    item->version = version_source_->fetch_add(1, std::memory_order_relaxed) + 1;
    replaced = shard.index.Find(key.view(), hash);
    if (replaced != nullptr) UnindexLocked(shard, hash, replaced);  // the same key: the same hash
    IndexLocked(shard, hash, item);
    // The value is charged now (IndexLocked), the reservation no more: in this order
    // the namespace never looks to hold less than it does.
    if (charged != nullptr) charged->Unreserve(item->size);
    if (version != nullptr) *version = item->version;
    // Linked while the shard lock is held so a concurrent delete cannot free the item
    // before it is in the LRU.
    allocator.Touch(item);
    if (published) published(item->version);
  }
  if (replaced != nullptr) Unref(replaced);
  return Status::OK();
}

bool MemoryTier::Lookup(const Slice& key, Handle* handle) {
  return Pin(key, /*wait=*/true, handle);
}

bool MemoryTier::TryLookup(const Slice& key, Handle* handle) {
  return Pin(key, /*wait=*/false, handle);
}

bool MemoryTier::Pin(const Slice& key, bool wait, Handle* handle) {
  PerfPoint perf(PerfKey::memory_lookup);
  handle->Release();
  const uint64_t hash = Hash64(key.view());
  Shard& shard = ShardFor(hash);
  Item* item;
  {
    if (wait) {
      shard.mu.Lock();
    } else if (!shard.mu.TryLock()) {
      return false;  // neither a hit nor a miss
    }
    MutexLock lock(&shard.mu, std::adopt_lock);
    // The first item with the key's hash is the key's but once in 2^64: what the read
    // goes on to touch is prefetched as soon as the item is in, so that those misses
    // overlap the one of the key's bytes, which confirm it.
    item = shard.index.FirstWithHash(hash);
    if (item != nullptr) {
      PrefetchForRead(item);
      if (!item->KeyEquals(key.view())) item = shard.index.Find(key.view(), hash);
    }
    if (item == nullptr) {
      lookup_misses_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    item->refs.fetch_add(1, std::memory_order_relaxed);
  }
  lookup_hits_.fetch_add(1, std::memory_order_relaxed);
  AllocatorOf(item).Touch(item);
  handle->tier_ = this;
  handle->item_ = item;
  return true;
}

void MemoryTier::PrefetchForRead(const Item* item) const {
  const SlabAllocator& allocator = AllocatorOf(item);
  const char* data = allocator.DataOf(item);
  const uint64_t n = std::min<uint64_t>(item->size, kPrefetchValueBytes);
  for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(data + off);
  // The links Touch rewrites, for writing.  Read without the allocator's mutex they may
  // be stale (db/item.h); a prefetch of a stale address is only a wasted one.
  if (!allocator.WillRelink(item)) return;  // Touch will not write them
  const Item* prev = item->LruPrev();
  const Item* next = item->lru_next.load(std::memory_order_relaxed);
  if (prev != nullptr) __builtin_prefetch(&prev->lru_next, 1);
  if (next != nullptr) __builtin_prefetch(&next->lru_prev, 1);
}

bool MemoryTier::Contains(const Slice& key) {
  PerfPoint perf(PerfKey::memory_contains);
  const uint64_t hash = Hash64(key.view());
  Shard& shard = ShardFor(hash);
  MutexLock lock(&shard.mu);
  return shard.index.Find(key.view(), hash) != nullptr;
}

template <typename Fn>
void MemoryTier::ProbeBatch(std::span<const Slice> keys, Fn&& found) {
  const size_t n = keys.size();
  // A key with a null pointer (which the DB rejects) is looked up as the empty key,
  // which is never indexed.
  auto view = [&keys](size_t i) {
    return keys[i].data() == nullptr ? std::string_view() : keys[i].view();
  };
  if (n == 1) {  // nothing to group or overlap: spare the vectors below their allocations
    const uint64_t hash = Hash64(view(0));
    Shard& shard = ShardFor(hash);
    MutexLock lock(&shard.mu);
    if (Item* item = shard.index.Find(view(0), hash)) found(0, item);
    return;
  }
  // The keys' hashes, and their indices grouped by shard (a counting sort).
  std::vector<uint64_t> hashes(n);
  std::vector<uint32_t> start(shards_.size() + 1, 0);
  for (size_t i = 0; i < n; i++) {
    hashes[i] = Hash64(view(i));
    start[hashes[i] % shards_.size() + 1]++;
  }
  for (size_t s = 0; s < shards_.size(); s++) start[s + 1] += start[s];
  std::vector<uint32_t> order(n);
  {
    std::vector<uint32_t> next(start.begin(), start.end() - 1);
    for (size_t i = 0; i < n; i++)
      order[next[hashes[i] % shards_.size()]++] = static_cast<uint32_t>(i);
  }
  // The dependent reads of a lookup -- home slot, item, key bytes -- are made in stages
  // over a wave of keys (in shard order): a stage prefetches the next read of every key
  // of the wave before the next stage reads any, so that the wave's misses overlap.  A
  // wave spans shards (a batch of 32 keys lands in ~26 of 64), so each stage takes each
  // of its shards' locks once, one at a time; what a stage saw is not kept, as the
  // shard may change before the next, and the last stage looks every key up afresh, in
  // the cache by then.
  constexpr size_t kWave = 32;
  for (size_t first = 0; first < n; first += kWave) {
    const size_t end = std::min(n, first + kWave);
    auto each_locked = [&](auto&& stage) {  // stage(shard, i) for the wave's keys i
      for (size_t g = first; g < end;) {
        Shard& shard = ShardFor(hashes[order[g]]);
        MutexLock lock(&shard.mu);
        do {
          stage(shard, order[g]);
        } while (++g < end && &ShardFor(hashes[order[g]]) == &shard);
      }
    };
    each_locked([&](Shard& shard, uint32_t i) { shard.index.PrefetchHome(hashes[i]); });
    each_locked([&](Shard& shard, uint32_t i) {
      if (const Item* item = shard.index.FirstWithHash(hashes[i])) __builtin_prefetch(item);
    });
    // A key of up to 16 bytes (beyond its namespace's prefix, in a tagged namespace) is
    // compared in its item (db/item.h); only a longer one's rest is one more read,
    // prefetched in a stage of its own.
    bool long_keys = false;
    for (size_t g = first; g < end; g++) {
      const std::string_view key = view(order[g]);
      const bool prefixed = ns::IsNamespaced(key) && key.size() >= ns::kPrefixSize;
      long_keys |= key.size() - (prefixed ? ns::kPrefixSize : 0) > Item::kKeyHead;
    }
    if (long_keys) {
      each_locked([&](Shard& shard, uint32_t i) {
        const Item* item = shard.index.FirstWithHash(hashes[i]);
        if (item != nullptr && item->KeyRest() != nullptr) __builtin_prefetch(item->KeyRest());
      });
    }
    each_locked([&](Shard& shard, uint32_t i) {
      if (Item* item = shard.index.Find(view(i), hashes[i])) found(i, item);
    });
  }
}

void MemoryTier::BatchContains(std::span<const Slice> keys, std::vector<uint8_t>* found) {
  PerfPoint perf(PerfKey::memory_batch_contains);
  found->assign(keys.size(), 0);
  ProbeBatch(keys, [found](size_t i, Item*) { (*found)[i] = 1; });
}

void MemoryTier::BatchLookup(std::span<const Slice> keys, std::vector<Handle>* handles) {
  PerfPoint perf(PerfKey::memory_batch_lookup);
  handles->clear();
  handles->resize(keys.size());
  size_t hits = 0;
  ProbeBatch(keys, [&](size_t i, Item* item) {
    item->refs.fetch_add(1, std::memory_order_relaxed);  // under the shard lock, as Lookup
    (*handles)[i].tier_ = this;
    (*handles)[i].item_ = item;
    hits++;
  });
  lookup_hits_.fetch_add(hits, std::memory_order_relaxed);
  lookup_misses_.fetch_add(keys.size() - hits, std::memory_order_relaxed);
  // Every value's first lines and LRU neighbours are on their way before the first Touch.
  for (const Handle& h : *handles) {
    if (h.valid()) PrefetchForRead(h.item_);
  }
  for (const Handle& h : *handles) {
    if (h.valid()) AllocatorOf(h.item_).Touch(h.item_);
  }
}

bool MemoryTier::Erase(const Slice& key, const CheckHook& also, bool* in_memory) {
  PerfPoint perf(PerfKey::memory_erase);
  const uint64_t hash = Hash64(key.view());
  Shard& shard = ShardFor(hash);
  Item* item = nullptr;
  bool found_elsewhere = false;
  {
    MutexLock lock(&shard.mu);
    item = shard.index.Find(key.view(), hash);
    if (item != nullptr) {
      UnindexLocked(shard, hash, item);
      if (removal_feed_ != nullptr) {
        removal_feed_->Record(key.view(), RemovalEvent::kMemory, RemovalEvent::kDeleted);
      }
    }
    if (also) found_elsewhere = also();
  }
  if (in_memory != nullptr) *in_memory = item != nullptr;
  if (item == nullptr) return found_elsewhere;
  Unref(item);
  return true;
}

bool MemoryTier::Insert(const Slice& key, std::span<const Slice> parts, uint64_t size,
                        uint64_t version, const CheckHook& still_valid) {
  const uint32_t part = layout_.PartOfKey(key.view());
  SlabAllocator& allocator = *allocators_[part];
  if (size > allocator.capacity() || size > Item::kMaxSize || key.size() > Item::kMaxKeySize) {
    return false;
  }
  // A promotion never pushes its namespace over its quota: charged as a reservation
  // that evicts nothing of its namespace, until it is indexed.
  NamespaceUsage::Slot* ns = usage_ != nullptr ? usage_->Of(key.view()) : nullptr;
  if (ns != nullptr && !ns->TryReserve(size)) return false;
  Status ignored;
  Item* item = AllocateWithEviction(size, part, ns, &ignored);
  if (item == nullptr) {  // no room: the value stays where it is
    if (ns != nullptr) ns->Unreserve(size);
    return false;
  }
  GatherCopy(parts, size, allocator.DataOf(item));
  allocator.SetKey(item, key.view());
  const uint64_t hash = Hash64(key.view());
  item->size = size;
  item->refs.store(1, std::memory_order_relaxed);
  {
    Shard& shard = ShardFor(hash);
    MutexLock lock(&shard.mu);
    if (shard.index.Find(key.view(), hash) == nullptr && still_valid()) {
      item->version = version;
      IndexLocked(shard, hash, item);
      if (ns != nullptr) ns->Unreserve(size);
      allocator.Touch(item);
      return true;
    }
  }
  if (ns != nullptr) ns->Unreserve(size);
  Unref(item);  // frees it: it was never published
  return false;
}

void MemoryTier::WithKeyLocked(const Slice& key,
                               const std::function<void(uint64_t, uint64_t)>& fn) {
  const uint64_t hash = Hash64(key.view());
  Shard& shard = ShardFor(hash);
  MutexLock lock(&shard.mu);
  const Item* item = shard.index.Find(key.view(), hash);
  if (item == nullptr) {
    fn(0, 0);
  } else {
    fn(item->version, item->size);
  }
}

void MemoryTier::CopyKeys(size_t shard_index, std::vector<std::string>* keys) {
  PerfPoint perf(PerfKey::memory_copy_keys);
  Shard& shard = shards_[shard_index];
  MutexLock lock(&shard.mu);
  keys->reserve(keys->size() + shard.index.size());
  shard.index.ForEach([&](const Item* item, uint64_t) { keys->emplace_back(item->KeyString()); });
}

void MemoryTier::ForEach(const std::function<void(std::string_view, uint64_t, uint64_t)>& fn) {
  for (Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    shard.index.ForEach(
        [&](const Item* item, uint64_t) { fn(item->KeyString(), item->size, item->version); });
  }
}

MemoryTier::Stats MemoryTier::GetStats() const {
  Stats s;
  s.items = items_.load(std::memory_order_relaxed);
  s.value_bytes = value_bytes_.load(std::memory_order_relaxed);
  for (const auto& allocator : allocators_) {
    s.allocated_bytes += allocator->allocated_bytes();
    s.capacity_bytes += allocator->capacity();
    s.index_bytes += allocator->item_array_bytes();
    s.key_arena_bytes += allocator->key_arena_bytes();
  }
  s.evictions = evictions_.load(std::memory_order_relaxed);
  s.evicted_bytes = evicted_bytes_.load(std::memory_order_relaxed);
  s.eviction_refusals = eviction_refusals_.load(std::memory_order_relaxed);
  s.rejected_puts = rejected_puts_.load(std::memory_order_relaxed);
  s.lookup_hits = lookup_hits_.load(std::memory_order_relaxed);
  s.lookup_misses = lookup_misses_.load(std::memory_order_relaxed);
  s.index_bytes += index_slot_bytes_.load(std::memory_order_relaxed);
  return s;
}

void MemoryTier::PartUsage(uint32_t part, uint64_t* allocated_bytes,
                           uint64_t* capacity_bytes) const {
  *allocated_bytes = allocators_[part]->allocated_bytes();
  *capacity_bytes = allocators_[part]->capacity();
}

std::string MemoryTier::ArenaNamed(uint32_t part) const {
  return layout_.single() ? "" : " in the arena of " + layout_.part(part).names;
}

}  // namespace kvengine
