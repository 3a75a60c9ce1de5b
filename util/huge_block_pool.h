// HugeBlockPool: blocks of one size carved out of chunks advised MADV_HUGEPAGE.
//
// For the memory tier's small, randomly reached metadata (the slabs' item arrays, the
// keys' bytes).  From the heap, at millions of keys, each such access was a TLB miss and
// a page walk on top of its cache miss: hosts commonly run transparent huge pages in
// "madvise" mode, where only advised memory gets them (util/huge_array.h does the same
// for the hash tables).  Blocks also carry no allocator header.
//
// A chunk is a power of two of at least 2 MiB, mapped at an address aligned to its size,
// so a block finds its chunk by masking its address.  The chunk's first bytes are its
// header (free list, counts, links); blocks follow, carved in order and then reused from
// the chunk's free list.  A chunk whose blocks are all free is unmapped, except one kept
// spare so that a pool going back and forth across a chunk boundary does not map and
// fault 2 MiB each time.
//
// Thread-safety: none; the owner serializes calls.
#ifndef KVENGINE_UTIL_HUGE_BLOCK_POOL_H_
#define KVENGINE_UTIL_HUGE_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvengine {

class HugeBlockPool {
 public:
  // REQUIRES: block_size is a multiple of 8 and >= 8 (a free block holds the free
  // list's link).
  explicit HugeBlockPool(size_t block_size);
  ~HugeBlockPool();  // unmaps every chunk, whether or not its blocks were freed
  HugeBlockPool(const HugeBlockPool&) = delete;
  HugeBlockPool& operator=(const HugeBlockPool&) = delete;

  // An uninitialized block of block_size() bytes, 8-aligned.  Throws std::bad_alloc when
  // no chunk can be mapped.
  void* Allocate();
  // REQUIRES: block came from this pool's Allocate and is not freed yet.
  void Free(void* block);

  size_t block_size() const { return block_size_; }
  size_t chunk_size() const { return chunk_size_; }
  // RAM mapped: every chunk, the spare included.
  size_t mapped_bytes() const { return chunks_.size() * chunk_size_; }

 private:
  struct Chunk;

  Chunk* ChunkOf(void* block) const {
    return reinterpret_cast<Chunk*>(reinterpret_cast<uintptr_t>(block) & ~(chunk_size_ - 1));
  }
  Chunk* TakeChunk();
  void ReturnChunk(Chunk* chunk);
  void LinkPartial(Chunk* chunk);
  void UnlinkPartial(Chunk* chunk);

  const size_t block_size_;
  const size_t chunk_size_;
  const uint32_t blocks_per_chunk_;
  std::vector<Chunk*> chunks_;  // all mapped, the spare included
  Chunk* partial_ = nullptr;    // chunks with a free or not yet carved block
  Chunk* spare_ = nullptr;      // an empty chunk, or nullptr
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_HUGE_BLOCK_POOL_H_
