// Zeroed arrays for the big hash tables (the memory tier's key index, the SSD tier's
// object map).
//
// An array of kMapped bytes or more is a mapping of its own, not heap memory: a table
// that grows frees its old array back to the system at once.  (From malloc, a freed
// array of a few MB stays resident as a hole in the heap that only an allocation of
// about its size reuses: at 5M SSD keys such holes made the resident memory per key
// nearly twice the table's.)  The mapping is 2 MiB-aligned, and the whole 2 MiB pages
// it fills are advised MADV_HUGEPAGE: at millions of keys a lookup is a cache miss into
// a table of hundreds of MB, and with 4 KiB pages also a TLB miss and a page walk that
// misses too (hosts commonly run transparent huge pages in "madvise" mode, where only
// advised memory gets them).  Its tail is left to 4 KiB pages: a huge page there would
// be resident in full however little of it the array uses.
#ifndef KVENGINE_UTIL_HUGE_ARRAY_H_
#define KVENGINE_UTIL_HUGE_ARRAY_H_

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace kvengine {

// Frees a HugeArray: unmaps what was mapped (`mapped` bytes), else free()s.
struct HugeArrayFree {
  size_t mapped = 0;
  void operator()(void* p) const {
    if (mapped != 0) {
      ::munmap(p, mapped);
    } else {
      std::free(p);
    }
  }
};
template <typename T>
using HugeArray = std::unique_ptr<T[], HugeArrayFree>;

namespace huge_array_internal {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = size_t{4} << 10;
// Arrays this big or bigger are mapped on their own.
constexpr size_t kMapped = size_t{256} << 10;

// `bytes` of zeroed memory, 2 MiB-aligned when that large; stores the length to unmap
// in *mapped.  nullptr when the system refuses.
inline void* MapZeroed(size_t bytes, size_t* mapped) {
  const size_t length = (bytes + kPage - 1) / kPage * kPage;
  const size_t slack = length >= kHugePage ? kHugePage : 0;  // room to align the start
  void* raw =
      ::mmap(nullptr, length + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* start = static_cast<char*>(raw);
  if (slack != 0) {  // give back the unaligned head and what follows the array
    const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
    start = reinterpret_cast<char*>((at + kHugePage - 1) / kHugePage * kHugePage);
    const size_t head = static_cast<size_t>(start - static_cast<char*>(raw));
    if (head != 0) ::munmap(raw, head);
    if (slack - head != 0) ::munmap(start + length, slack - head);
    // A hint: failure is fine.
    ::madvise(start, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
  }
  *mapped = length;
  return start;  // fresh anonymous memory reads as zero
}
}  // namespace huge_array_internal

// n elements, all bytes zero.  REQUIRES: T is trivially copyable and all-zero is a
// valid (empty) T.  Throws std::bad_alloc as new would.
template <typename T>
HugeArray<T> NewZeroedHugeArray(size_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t bytes = n * sizeof(T);
  HugeArrayFree free_with;
  void* p = nullptr;
  if (bytes >= huge_array_internal::kMapped) {
    p = huge_array_internal::MapZeroed(bytes, &free_with.mapped);
  } else {
    p = std::calloc(bytes == 0 ? 1 : bytes, 1);
  }
  if (p == nullptr) throw std::bad_alloc();
  return HugeArray<T>(static_cast<T*>(p), free_with);
}

}  // namespace kvengine

#endif  // KVENGINE_UTIL_HUGE_ARRAY_H_
