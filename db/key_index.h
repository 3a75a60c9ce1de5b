// KeyIndex: one memory-tier index shard's map key -> Item*.
//
// An open-addressing table (linear probing, backward-shift deletion) of {hash, item}
// slots, 16 bytes each, four to a cache line.  It replaces std::unordered_map, whose
// lookup walked bucket -> previous node -> node -> key bytes: four dependent cache
// misses per key, ~350 ns of a 1024-key BatchExists each (docs/benchmarks.md).  Here a
// lookup reads the home slot's line, compares 64-bit hashes there, and reads the
// key bytes of a matching item only to confirm it; and the table can prefetch, so a
// batch of lookups (MemoryTier::BatchContains) overlaps its misses.
//
// The caller hashes the key (Hash64) once; the low bits choose the shard (MemoryTier),
// the high bits the home slot here, so the two do not correlate.  Keys are those of the
// items (Item::KeyEquals), which stay put while indexed, as before.  The slot is the only
// place the hash is kept (an Item has no room for it).
//
// Thread-safety: none; the shard's mutex guards it.
#ifndef KVENGINE_DB_KEY_INDEX_H_
#define KVENGINE_DB_KEY_INDEX_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "db/item.h"
#include "util/huge_array.h"

namespace kvengine {

class KeyIndex {
 public:
  KeyIndex();
  KeyIndex(const KeyIndex&) = delete;
  KeyIndex& operator=(const KeyIndex&) = delete;

  size_t size() const { return size_; }
  // RAM of the slots (the table never shrinks: erased keys leave their slots empty).
  size_t bytes() const { return (mask_ + 1) * sizeof(Slot); }

  // The item indexed under key (whose Hash64 is `hash`), or nullptr.
  Item* Find(std::string_view key, uint64_t hash) const {
    for (size_t i = Home(hash);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.item == nullptr) return nullptr;
      if (s.hash == hash && s.item->KeyEquals(key)) return s.item;
    }
  }
  // Whether item is indexed under `hash` (no key comparison: the item is known).
  bool Contains(uint64_t hash, const Item* item) const {
    for (size_t i = Home(hash);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.item == nullptr) return false;
      if (s.item == item) return true;
    }
  }
  // Asks the CPU to bring the home slot of `hash` into cache (a batch's first stage).
  void PrefetchHome(uint64_t hash) const { __builtin_prefetch(HomeAddress(hash)); }
  // The same from any thread, without the shard's lock: a put prefetches its slot before
  // it copies its value, so that the miss overlaps the copy instead of following the
  // lock.  The address comes from a hint that Grow may have made stale; a stale one
  // costs a useless prefetch, never a fault, and nothing is read through it.
  void PrefetchHomeUnlocked(uint64_t hash) const { __builtin_prefetch(HintedHome(hash)); }
  // The home slot's address (under the lock), and the one the hint gives (without it):
  // the same while no Grow runs.
  const void* HomeAddress(uint64_t hash) const { return &slots_[Home(hash)]; }
  const void* HintedHome(uint64_t hash) const {
    const uintptr_t hint = prefetch_hint_.load(std::memory_order_relaxed);
    const int shift = static_cast<int>(hint >> kHintShiftBit);
    const uintptr_t base = hint & kHintBaseMask;
    return reinterpret_cast<const void*>(base + (hash >> shift) * sizeof(Slot));
  }
  // The first item whose hash equals `hash`, without comparing keys, or nullptr: a
  // batch's second stage, which then prefetches the item and its key bytes.
  Item* FirstWithHash(uint64_t hash) const {
    for (size_t i = Home(hash);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.item == nullptr) return nullptr;
      if (s.hash == hash) return s.item;
    }
  }

  // Indexes item (its key must not be indexed yet) under `hash`.
  void Insert(uint64_t hash, Item* item);
  // Removes item, which must be indexed under `hash`.
  void Erase(uint64_t hash, const Item* item);

  // Calls fn(item, hash) for every item.  fn must not change the index.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (size_t i = 0; i <= mask_; i++) {
      if (slots_[i].item != nullptr) fn(slots_[i].item, slots_[i].hash);
    }
  }

 private:
  struct Slot {
    uint64_t hash;
    Item* item;  // nullptr: empty
  };

  size_t Home(uint64_t hash) const { return static_cast<size_t>(hash >> shift_); }
  void Grow();
  // Stores the slots' address and shift_ in prefetch_hint_ (after each change).
  void PublishHint();

  // prefetch_hint_: the slot array's address in the low 56 bits (user addresses are
  // below 2^56 even with 5-level paging), shift_ above them, in one word so that a
  // reader sees a pair that once was true.
  static constexpr int kHintShiftBit = 56;
  static constexpr uintptr_t kHintBaseMask = (uintptr_t{1} << kHintShiftBit) - 1;

  HugeArray<Slot> slots_;
  size_t mask_ = 0;  // capacity - 1; the capacity is a power of two
  int shift_ = 0;    // 64 - log2(capacity)
  size_t size_ = 0;
  std::atomic<uintptr_t> prefetch_hint_{0};
};

}  // namespace kvengine

#endif  // KVENGINE_DB_KEY_INDEX_H_
