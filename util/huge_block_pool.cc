#include "util/huge_block_pool.h"

#include <sys/mman.h>

#include <bit>
#include <cassert>
#include <cstdint>
#include <new>

#include "util/numa_arena.h"

namespace kvengine {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHeaderSize = 64;     // sizeof(Chunk), rounded up to a cache line
constexpr int kMaxChunkDoublings = 3;  // shared chunks are 2 to 16 MiB

// The chunk size for blocks of `block` bytes: the smallest of 2, 4, 8 and 16 MiB that
// leaves at most 1/16 of itself uncarved (the tail of a chunk is RAM too once its huge
// page is faulted), else the one that leaves the least; a block too large for 16 MiB
// gets a chunk of its own.  The item arrays of the default 4 MiB slabs are 384 KiB for
// 512-byte values (5 in 2 MiB) and 768 KiB for 256-byte ones (5 in 4 MiB).
size_t ChunkSizeFor(size_t block) {
  size_t best = 0, best_waste = SIZE_MAX;
  for (int i = 0; i <= kMaxChunkDoublings; i++) {
    const size_t chunk = kHugePage << i;
    if (block > chunk - kHeaderSize) continue;
    const size_t waste = kHeaderSize + (chunk - kHeaderSize) % block;
    if (waste <= chunk / 16) return chunk;
    if (waste < best_waste) {
      best = chunk;
      best_waste = waste;
    }
  }
  return best != 0 ? best : std::bit_ceil(block + kHeaderSize);
}
}  // namespace

struct HugeBlockPool::Chunk {
  Chunk* prev;  // in partial_, while the chunk has room
  Chunk* next;
  void* free_list;  // freed blocks; each holds the address of the next
  uint32_t live;    // blocks handed out
  uint32_t carved;  // blocks handed out at least once since the chunk was (re)used
  size_t index;     // in chunks_

  void* Carve(size_t block_size) {
    return reinterpret_cast<char*>(this) + kHeaderSize + carved++ * block_size;
  }
};

HugeBlockPool::HugeBlockPool(size_t block_size)
    : block_size_(block_size),
      chunk_size_(ChunkSizeFor(block_size)),
      blocks_per_chunk_(static_cast<uint32_t>((chunk_size_ - kHeaderSize) / block_size)) {
  static_assert(sizeof(Chunk) <= kHeaderSize);
  assert(block_size >= 8 && block_size % 8 == 0);
}

HugeBlockPool::~HugeBlockPool() {
  for (Chunk* chunk : chunks_) ::munmap(chunk, chunk_size_);
}

void* HugeBlockPool::Allocate() {
  if (partial_ == nullptr) LinkPartial(TakeChunk());
  Chunk* chunk = partial_;
  void* block = chunk->free_list;
  if (block != nullptr) {
    chunk->free_list = *static_cast<void**>(block);
  } else {
    block = chunk->Carve(block_size_);
  }
  if (++chunk->live == blocks_per_chunk_) UnlinkPartial(chunk);
  return block;
}

void HugeBlockPool::Free(void* block) {
  Chunk* chunk = ChunkOf(block);
  if (chunk->live-- == blocks_per_chunk_) LinkPartial(chunk);
  *static_cast<void**>(block) = chunk->free_list;
  chunk->free_list = block;
  if (chunk->live == 0) {
    UnlinkPartial(chunk);
    ReturnChunk(chunk);
  }
}

HugeBlockPool::Chunk* HugeBlockPool::TakeChunk() {
  Chunk* chunk = spare_;
  if (chunk != nullptr) {
    spare_ = nullptr;
    return chunk;
  }
  void* p = MapAligned(-1, chunk_size_, chunk_size_);
  if (p == MAP_FAILED) throw std::bad_alloc();
  ::madvise(p, chunk_size_, MADV_HUGEPAGE);  // a hint: failure is fine
  chunk = static_cast<Chunk*>(p);            // fresh anonymous memory: the header is zero
  chunk->index = chunks_.size();
  chunks_.push_back(chunk);
  return chunk;
}

void HugeBlockPool::ReturnChunk(Chunk* chunk) {
  // Carved again from its start when reused: its blocks are all free.
  chunk->free_list = nullptr;
  chunk->carved = 0;
  if (spare_ == nullptr) {
    spare_ = chunk;
    return;
  }
  Chunk* moved = chunks_.back();
  chunks_[chunk->index] = moved;
  moved->index = chunk->index;
  chunks_.pop_back();
  ::munmap(chunk, chunk_size_);
}

void HugeBlockPool::LinkPartial(Chunk* chunk) {
  chunk->prev = nullptr;
  chunk->next = partial_;
  if (partial_ != nullptr) partial_->prev = chunk;
  partial_ = chunk;
}

void HugeBlockPool::UnlinkPartial(Chunk* chunk) {
  if (chunk->prev != nullptr) chunk->prev->next = chunk->next;
  if (chunk->next != nullptr) chunk->next->prev = chunk->prev;
  if (partial_ == chunk) partial_ = chunk->next;
  chunk->prev = chunk->next = nullptr;
}

}  // namespace kvengine
