// EvictedKeys: a bounded memory of the keys the tiers dropped to make room, so that a
// read that finds no tier holding its key can say why: "evicted" (a tier held it and
// let it go) rather than "absent" (never stored, or deleted).
//
// A fixed table of 64-bit key hashes (Hash64), each eviction overwriting the slot its
// hash picks: a lookup answers true only for a hash noted there and not overwritten
// since -- no false "evicted" short of a 64-bit hash collision; an old eviction may be
// forgotten (reported "absent") once a later one takes its slot.  A delete of the key
// forgets it (a put need not: the key is then present).  Costs nothing on a hit or a
// put: only evictions, deletes and misses touch it.
//
// Thread-safety: relaxed atomics; any thread.
#ifndef KVENGINE_DB_EVICTED_KEYS_H_
#define KVENGINE_DB_EVICTED_KEYS_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace kvengine {

class EvictedKeys {
 public:
  static constexpr size_t kSlots = 1 << 16;  // 512 KiB

  void Note(uint64_t hash) { Slot(hash).store(hash, std::memory_order_relaxed); }
  void Forget(uint64_t hash) {
    uint64_t expected = hash;
    Slot(hash).compare_exchange_strong(expected, 0, std::memory_order_relaxed);
  }
  bool Contains(uint64_t hash) const {
    return hash != 0 && Slot(hash).load(std::memory_order_relaxed) == hash;
  }

 private:
  std::atomic<uint64_t>& Slot(uint64_t hash) { return slots_[hash & (kSlots - 1)]; }
  const std::atomic<uint64_t>& Slot(uint64_t hash) const { return slots_[hash & (kSlots - 1)]; }
  std::array<std::atomic<uint64_t>, kSlots> slots_{};
};

}  // namespace kvengine

#endif  // KVENGINE_DB_EVICTED_KEYS_H_
