// Item: the descriptor of one value held in the memory tier.
//
// Items live in arrays owned by their slab (see SlabAllocator), so storing a value costs
// no per-value allocation of its bytes.  The arrays come from pools of huge-page-advised
// memory (util/huge_block_pool.h), and so do the keys' bytes (db/key_arena.h): a lookup
// reads its index slot, then its item, then its key, and at millions of keys each of
// these in 4 KiB-paged heap memory cost a TLB miss and a page walk besides the cache
// miss.  An item is reference counted: the index holds one reference while the key maps
// to it, and every reader pins it while copying out, so an overwrite or delete never
// frees bytes that a reader is still copying.
//
// An item is 48 bytes, because every slot of every slab in use has one: with the
// index's 16-byte slots between 35% and 70% full (db/key_index.h), a key costs 48 B plus
// 23-46 B of slots beside its own bytes and its value, within issue #16's 96 B (the
// unused slots of a slab not yet full add their items).  So it holds only what cannot
// be derived:
//   - the key is a pointer to a copy of its bytes (in the allocator's KeyArena), not a
//     std::string (32 B);
//   - no hash: the index slot keeps it, and the rare unindexing that has no lookup at
//     hand (an eviction) hashes the key again;
//   - no value pointer or slot number: SlabAllocator::DataOf computes the value's address
//     from the slab, the item's position in the slab's array and the class size;
//   - no "indexed" flag: the index itself is asked (KeyIndex::Contains), under the same
//     shard lock that guarded the flag;
//   - no "in LRU" flag: lru_prev is null exactly when the item is not linked;
//   - sizes as bit-fields, within the limits Options::Validate enforces.
// Fields written under different locks are never packed into one memory location (a
// bit-field's word is one), so each lock guards what it guarded before.
#ifndef KVENGINE_DB_ITEM_H_
#define KVENGINE_DB_ITEM_H_

#include <atomic>
#include <cstdint>
#include <string_view>

namespace kvengine {

struct Item {
  // Bit-field limits, above Options::Validate's: max_value_size <= 1 TiB, max_key_size
  // <= 1 MiB, at most 16M slabs, fewer than 256 size classes.
  static constexpr uint64_t kMaxSize = (uint64_t{1} << 43) - 1;
  static constexpr uint64_t kMaxKeySize = (uint64_t{1} << 21) - 1;
  static constexpr uint32_t kMaxSlabs = uint32_t{1} << 24;
  static constexpr uint32_t kMaxClasses = 256;

  // Written by the putting thread before the item is published (the key through
  // SlabAllocator::SetKey); read-only afterwards until the item is freed
  // (SlabAllocator::Free drops the key).
  char* key_data = nullptr;  // key_size bytes
  uint64_t version = 0;
  uint64_t size : 43 = 0;  // value bytes
  uint64_t key_size : 21 = 0;

  // LRU links.  Guarded by the allocator's mutex.  lru_prev is null exactly when the
  // item is not in the LRU.
  Item* lru_prev = nullptr;
  Item* lru_next = nullptr;

  // Placement, set by the allocator before it hands the item out.
  uint32_t slab : 24 = 0;  // slab holding the value (the first one for a run)
  uint32_t size_class : 8 = 0;

  // 1 per index reference + 1 per pin.  The item is freed when it drops to 0.
  std::atomic<uint32_t> refs{0};

  std::string_view key() const { return std::string_view(key_data, key_size); }
  bool in_lru() const { return lru_prev != nullptr; }
};

// Item + its share of the index slots must stay within 96 B a key (see above); a field
// added here has to pay for itself elsewhere.
static_assert(sizeof(Item) <= 48, "Item grew: the memory tier's RAM per key is bounded by it");

}  // namespace kvengine

#endif  // KVENGINE_DB_ITEM_H_
