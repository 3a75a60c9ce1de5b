// KeyArena: the memory tier's copies of its keys' bytes.
//
// A lookup reads the key of the item it finds (KeyIndex::Find confirms the hash), one of
// its dependent cache misses.  From the heap that was also a TLB miss and a page walk at
// millions of keys, and malloc spent a header and 16-byte rounding on each key (32 B for
// a 16-byte key).  Here keys of up to kMaxPooledKey bytes take blocks of size classes in
// HugeBlockPools (util/huge_block_pool.h): multiples of 8 bytes up to 64, then four
// classes per power of two (under a fifth of a block unused beyond 64 bytes).  Freed
// blocks are reused by keys of their class, and a chunk whose keys are all gone is
// unmapped (one spare kept per class), so churn does not grow it.  Longer keys (beyond
// the default max_key_size; it may be up to 1 MiB) come from the heap.
//
// Thread-safety: none; SlabAllocator's mutex guards it.
#ifndef KVENGINE_DB_KEY_ARENA_H_
#define KVENGINE_DB_KEY_ARENA_H_

#include <cstddef>
#include <memory>

#include "util/huge_block_pool.h"

namespace kvengine {

class KeyArena {
 public:
  static constexpr size_t kMaxPooledKey = 4096;

  KeyArena() = default;
  KeyArena(const KeyArena&) = delete;
  KeyArena& operator=(const KeyArena&) = delete;

  // Room for `size` bytes; nullptr for 0.  Throws std::bad_alloc as new would.
  char* Allocate(size_t size);
  // REQUIRES: key came from Allocate(size), with the same size.
  void Free(char* key, size_t size);

  // RAM mapped for pooled keys (the heap's long keys left out).
  size_t mapped_bytes() const;

  // The size class of a key of `size` bytes (1 <= size <= kMaxPooledKey) and its block size.
  static int ClassOf(size_t size);
  static size_t ClassSize(int cls);

 private:
  static constexpr int kClasses = 8 + 4 * 6;  // 8..64 by 8, then 4 each up to 128..4096

  // Created at a class's first key.
  std::unique_ptr<HugeBlockPool> pools_[kClasses];
};

}  // namespace kvengine

#endif  // KVENGINE_DB_KEY_ARENA_H_
