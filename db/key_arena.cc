#include "db/key_arena.h"

#include <bit>
#include <cassert>

namespace kvengine {

int KeyArena::ClassOf(size_t size) {
  assert(size >= 1 && size <= kMaxPooledKey);
  if (size <= 64) return static_cast<int>((size + 7) / 8) - 1;
  // 2^(k-1) < size <= 2^k, in four steps of 2^(k-3).
  const int k = std::bit_width(size - 1);
  const size_t base = size_t{1} << (k - 1), step = size_t{1} << (k - 3);
  return 8 + 4 * (k - 7) + static_cast<int>((size - base + step - 1) / step) - 1;
}

size_t KeyArena::ClassSize(int cls) {
  if (cls < 8) return static_cast<size_t>(cls + 1) * 8;
  const int k = (cls - 8) / 4 + 7;
  return (size_t{1} << (k - 1)) + static_cast<size_t>((cls - 8) % 4 + 1) * (size_t{1} << (k - 3));
}

char* KeyArena::Allocate(size_t size) {
  if (size == 0) return nullptr;
  if (size > kMaxPooledKey) return new char[size];
  std::unique_ptr<HugeBlockPool>& pool = pools_[ClassOf(size)];
  if (pool == nullptr) pool = std::make_unique<HugeBlockPool>(ClassSize(ClassOf(size)));
  return static_cast<char*>(pool->Allocate());
}

void KeyArena::Free(char* key, size_t size) {
  if (size == 0) return;
  if (size > kMaxPooledKey) {
    delete[] key;
    return;
  }
  pools_[ClassOf(size)]->Free(key);
}

size_t KeyArena::mapped_bytes() const {
  size_t bytes = 0;
  for (const auto& pool : pools_) {
    if (pool != nullptr) bytes += pool->mapped_bytes();
  }
  return bytes;
}

}  // namespace kvengine
