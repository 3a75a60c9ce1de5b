// Slice: a borrowed, read-only view of bytes (pointer + length), as in LevelDB.
// MutableSlice: a borrowed, writable view of a caller's buffer.
//
// Neither owns its bytes: the caller keeps them alive and unchanged for as long as the
// view is used.  Both are trivially copyable and cheap to pass by value.
#ifndef KVENGINE_SLICE_H_
#define KVENGINE_SLICE_H_

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace kvengine {

class Slice {
 public:
  constexpr Slice() noexcept = default;
  constexpr Slice(const char* data, size_t size) noexcept : data_(data), size_(size) {}
  Slice(const void* data, size_t size) noexcept
      : data_(static_cast<const char*>(data)), size_(size) {}
  Slice(const std::string& s) noexcept : data_(s.data()), size_(s.size()) {}          // NOLINT
  constexpr Slice(std::string_view s) noexcept : data_(s.data()), size_(s.size()) {}  // NOLINT
  Slice(const char* s) noexcept : data_(s), size_(s ? std::strlen(s) : 0) {}          // NOLINT

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  char operator[](size_t n) const { return data_[n]; }

  std::string ToString() const { return std::string(data_, size_); }
  std::string_view view() const { return std::string_view(data_, size_); }

  bool operator==(const Slice& o) const {
    return size_ == o.size_ && (size_ == 0 || std::memcmp(data_, o.data_, size_) == 0);
  }
  bool operator!=(const Slice& o) const { return !(*this == o); }

 private:
  const char* data_ = "";
  size_t size_ = 0;
};

class MutableSlice {
 public:
  constexpr MutableSlice() noexcept = default;
  MutableSlice(void* data, size_t size) noexcept : data_(static_cast<char*>(data)), size_(size) {}

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_SLICE_H_
