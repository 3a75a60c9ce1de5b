// The data kv_bench moves: keys, deterministic values that a reader can check, and aligned
// buffers.
#ifndef KVENGINE_DB_BENCH_WORKLOAD_H_
#define KVENGINE_DB_BENCH_WORKLOAD_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvengine/slice.h"

namespace kvbench {

// splitmix64: a cheap, well-mixed 64-bit hash.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A page-aligned buffer (O_DIRECT needs 4 KiB alignment), faulted in at construction.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size);
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// Random bytes from which every value is a window: the value of id k starts at an offset
// derived from k, so values differ from key to key and a reader can check any of them
// without storing what was written.
class ValuePool {
 public:
  ValuePool(uint64_t value_size, uint64_t seed);

  kvengine::Slice For(uint64_t id) const {
    return kvengine::Slice(bytes_.data() + (Mix(id ^ salt_) % slots_) * 8, value_size_);
  }
  uint64_t value_size() const { return value_size_; }
  // Every value's bytes lie in [data(), data() + bytes()): what a client registers once.
  const char* data() const { return bytes_.data(); }
  size_t bytes() const { return bytes_.size(); }

 private:
  uint64_t value_size_;
  uint64_t salt_;
  uint64_t slots_;
  std::vector<char> bytes_;
};

// Key-level keys: the number k zero-padded to key_size digits (db_bench's layout).
// Missing keys end in '.', which no present key has.
class KeySpace {
 public:
  KeySpace(uint64_t num, uint64_t key_size) : num_(num), key_size_(key_size) {}

  uint64_t num() const { return num_; }
  void Format(uint64_t k, std::string* out) const;
  void FormatMissing(uint64_t k, std::string* out) const {
    Format(k, out);
    out->back() = '.';
  }

 private:
  uint64_t num_;
  uint64_t key_size_;
};

// vLLM keys: "kvbench-model@tp0/layer.<l>/<hash of the request>".
std::string VllmKey(uint64_t seed, uint64_t request, uint64_t layer);

// The value of a vLLM key: the layer's pool window, with (request, layer) stamped over its
// first 16 bytes so that every key's value differs and a stale one is caught.
void StampVllmValue(uint64_t request, uint64_t layer, char* buf, size_t size);

// Draws n distinct numbers below `num` (n <= num) into *out.
void DistinctRandom(std::mt19937_64* rng, uint64_t num, uint64_t n, std::vector<uint64_t>* out);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_WORKLOAD_H_
