// Helpers for a value spread over a list of caller buffers (a multi-buffer destination,
// e.g. one buffer per model layer), filled in order.
#ifndef KVENGINE_UTIL_BUFFERS_H_
#define KVENGINE_UTIL_BUFFERS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvengine/slice.h"

namespace kvengine {

// Copies n contiguous bytes from src into the buffers of dest, in order.
// REQUIRES: the buffers hold at least n bytes.
inline void ScatterCopy(const char* src, uint64_t n, std::span<const MutableSlice> dest) {
  for (const MutableSlice& d : dest) {
    if (n == 0) break;
    const uint64_t k = std::min<uint64_t>(n, d.size());
    std::memcpy(d.data(), src, k);
    src += k;
    n -= k;
  }
}

// The first n bytes held by dest's buffers, as read-only parts (to store them again).
inline std::vector<Slice> FilledParts(std::span<const MutableSlice> dest, uint64_t n) {
  std::vector<Slice> parts;
  for (const MutableSlice& d : dest) {
    if (n == 0) break;
    const uint64_t k = std::min<uint64_t>(n, d.size());
    parts.emplace_back(d.data(), k);
    n -= k;
  }
  return parts;
}

}  // namespace kvengine

#endif  // KVENGINE_UTIL_BUFFERS_H_
