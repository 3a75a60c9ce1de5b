#include "tools/stress/stress_value.h"

#include <cstring>

#include "util/hash.h"

namespace kvengine::stress {
namespace {

constexpr uint64_t kValueMagic = 0x45554c4156535653ull;  // "SVSVALUE"

struct Header {
  uint64_t magic;
  uint32_t key;
  uint32_t version;
  uint32_t size;
  uint32_t check;
};
static_assert(sizeof(Header) == kValueHeaderBytes);

uint32_t HeaderCheck(const Header& h) {
  return static_cast<uint32_t>(Hash64(&h, offsetof(Header, check)));
}

uint64_t StreamSeed(uint32_t key, uint32_t version, size_t size) {
  uint64_t x = (static_cast<uint64_t>(key) << 32 | version) * 0x9E3779B97F4A7C15ull;
  x ^= static_cast<uint64_t>(size) * 0xC2B2AE3D27D4EB4Full;
  return x == 0 ? 1 : x;
}

uint64_t Next(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

// Writes the stream into out[0, n), or compares it; returns false on the first mismatch.
template <bool kCompare>
bool Stream(uint64_t seed, char* out, const char* in, size_t n) {
  uint64_t x = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t w = Next(x);
    if constexpr (kCompare) {
      uint64_t got;
      std::memcpy(&got, in + i, 8);
      if (got != w) return false;
    } else {
      std::memcpy(out + i, &w, 8);
    }
  }
  if (i < n) {
    const uint64_t w = Next(x);
    if constexpr (kCompare) {
      if (std::memcmp(in + i, &w, n - i) != 0) return false;
    } else {
      std::memcpy(out + i, &w, n - i);
    }
  }
  return true;
}

}  // namespace

void FillValue(uint32_t key, uint32_t version, size_t size, char* out) {
  Header h{kValueMagic, key, version, static_cast<uint32_t>(size), 0};
  h.check = HeaderCheck(h);
  std::memcpy(out, &h, sizeof(h));
  Stream<false>(StreamSeed(key, version, size), out + sizeof(h), nullptr, size - sizeof(h));
}

Observation ReadValue(uint32_t key, const char* data, size_t size) {
  Observation corrupt{Observation::kCorrupt, 0};
  if (size < sizeof(Header)) return corrupt;
  Header h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kValueMagic || h.check != HeaderCheck(h) || h.key != key || h.size != size) {
    return corrupt;
  }
  if (!Stream<true>(StreamSeed(key, h.version, size), nullptr, data + sizeof(h),
                    size - sizeof(h))) {
    return corrupt;
  }
  return Observation{Observation::kValue, h.version};
}

}  // namespace kvengine::stress
