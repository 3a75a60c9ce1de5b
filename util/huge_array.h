// Zeroed arrays for the big hash tables (the memory tier's key index, the SSD tier's
// object map): an array of 2 MiB or more is 2 MiB-aligned and advised MADV_HUGEPAGE.
//
// At millions of keys a lookup is a cache miss into a table of hundreds of MB, and with
// 4 KiB pages also a TLB miss and a page walk that misses too; hosts commonly run
// transparent huge pages in "madvise" mode, where only advised memory gets them.
#ifndef KVENGINE_UTIL_HUGE_ARRAY_H_
#define KVENGINE_UTIL_HUGE_ARRAY_H_

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace kvengine {

struct HugeArrayFree {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using HugeArray = std::unique_ptr<T[], HugeArrayFree>;

// n elements, all bytes zero.  REQUIRES: T is trivially copyable and all-zero is a
// valid (empty) T.  Throws std::bad_alloc as new would.
template <typename T>
HugeArray<T> NewZeroedHugeArray(size_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = n * sizeof(T);
  void* p = nullptr;
  if (bytes >= kHuge) {
    const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    p = std::aligned_alloc(kHuge, rounded);
    if (p != nullptr) ::madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure is fine
  } else {
    p = std::malloc(bytes == 0 ? 1 : bytes);
  }
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return HugeArray<T>(static_cast<T*>(p));
}

}  // namespace kvengine

#endif  // KVENGINE_UTIL_HUGE_ARRAY_H_
