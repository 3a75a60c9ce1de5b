#include "db_bench/workload.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <unordered_set>

namespace kvbench {

namespace {
constexpr size_t kAlignment = 4096;
// Distinct value windows in a pool: 1 MiB of slack past the value size.
constexpr uint64_t kPoolSlots = 1 << 17;
}  // namespace

AlignedBuffer::AlignedBuffer(size_t size) : size_(size) {
  const size_t rounded = (std::max<size_t>(size, 1) + kAlignment - 1) / kAlignment * kAlignment;
  data_ = static_cast<char*>(std::aligned_alloc(kAlignment, rounded));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0x5a, rounded);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

ValuePool::ValuePool(uint64_t value_size, uint64_t seed)
    : value_size_(value_size), salt_(Mix(seed)), slots_(kPoolSlots) {
  bytes_.resize(value_size + slots_ * 8);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= bytes_.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(&bytes_[i], &x, 8);
  }
  for (; i < bytes_.size(); i++) bytes_[i] = static_cast<char>(rng());
}

void KeySpace::Format(uint64_t k, std::string* out) const {
  char digits[24];
  const int n = std::snprintf(digits, sizeof(digits), "%llu", static_cast<unsigned long long>(k));
  const size_t width = std::max<size_t>(key_size_, static_cast<size_t>(n));
  out->assign(width - static_cast<size_t>(n), '0');
  out->append(digits, static_cast<size_t>(n));
}

std::string VllmKey(uint64_t seed, uint64_t request, uint64_t layer) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "kvbench-model@tp0/layer.%llu/%016llx",
                static_cast<unsigned long long>(layer),
                static_cast<unsigned long long>(Mix(seed * 0x100000001b3ull + request)));
  return buf;
}

void StampVllmValue(uint64_t request, uint64_t layer, char* buf, size_t size) {
  uint64_t stamp[2] = {request, layer};
  std::memcpy(buf, stamp, std::min(size, sizeof(stamp)));
}

void DistinctRandom(std::mt19937_64* rng, uint64_t num, uint64_t n, std::vector<uint64_t>* out) {
  out->clear();
  if (n == 1) {
    out->push_back((*rng)() % num);
    return;
  }
  if (n * 2 > num) {
    // Dense: a random window of consecutive keys, shuffled, is distinct.
    const uint64_t start = (*rng)() % num;
    for (uint64_t i = 0; i < n; i++) out->push_back((start + i) % num);
    std::shuffle(out->begin(), out->end(), *rng);
    return;
  }
  std::unordered_set<uint64_t> seen;
  while (out->size() < n) {
    const uint64_t k = (*rng)() % num;
    if (seen.insert(k).second) out->push_back(k);
  }
}

}  // namespace kvbench
