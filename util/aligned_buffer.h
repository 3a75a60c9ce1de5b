// AlignedBuffer: a heap buffer aligned for O_DIRECT, with a fixed capacity.
#ifndef KVENGINE_UTIL_ALIGNED_BUFFER_H_
#define KVENGINE_UTIL_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace kvengine {

inline constexpr size_t RoundUpTo(size_t v, size_t to) { return (v + to - 1) / to * to; }
inline constexpr size_t RoundDownTo(size_t v, size_t to) { return v / to * to; }

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 4096;

  AlignedBuffer() = default;
  // Allocates capacity bytes (rounded up to the alignment), uninitialized.  Throws
  // std::bad_alloc only when memory is exhausted (callers on hot paths use TryAllocate).
  explicit AlignedBuffer(size_t capacity) {
    if (!TryAllocate(capacity)) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), capacity_(o.capacity_) {
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(capacity_, o.capacity_);
    return *this;
  }

  bool TryAllocate(size_t capacity) {
    std::free(data_);
    capacity_ = RoundUpTo(capacity == 0 ? 1 : capacity, kAlignment);
    data_ = static_cast<char*>(std::aligned_alloc(kAlignment, capacity_));
    if (data_ == nullptr) {
      capacity_ = 0;
      return false;
    }
    return true;
  }

  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_ALIGNED_BUFFER_H_
