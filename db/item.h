// Item: the descriptor of one value held in the memory tier.
//
// Items live in arrays owned by their slab (see SlabAllocator), so storing a value costs
// no per-value allocation of its bytes.  An item is reference counted: the index holds one
// reference while the key maps to it, and every reader pins it while copying out, so an
// overwrite or delete never frees bytes that a reader is still copying.
#ifndef KVENGINE_DB_ITEM_H_
#define KVENGINE_DB_ITEM_H_

#include <atomic>
#include <cstdint>
#include <string>

namespace kvengine {

struct Item {
  // Written by the putting thread before the item is published; read-only afterwards
  // until the item is freed.
  std::string key;
  uint64_t key_hash = 0;  // Hash64(key): the index's, kept so unindexing needs no rehash
  uint64_t version = 0;
  uint64_t size = 0;     // value bytes
  char* data = nullptr;  // inside the arena

  // Placement, set by the allocator.
  uint32_t slab = 0;  // slab holding the value (the first one for a run)
  uint32_t slot = 0;  // index within the slab's item array
  uint16_t size_class = 0;

  // 1 per index reference + 1 per pin.  The item is freed when it drops to 0.
  std::atomic<uint32_t> refs{0};
  // True while the index maps key to this item.  Guarded by the index shard's mutex.
  bool indexed = false;

  // LRU links.  Guarded by the allocator's mutex.
  bool in_lru = false;
  Item* lru_prev = nullptr;
  Item* lru_next = nullptr;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_ITEM_H_
