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
#include "util/stream_copy.h"

namespace kvengine {

// The bytes of a value given as parts (the sum of their sizes).
inline uint64_t PartsSize(std::span<const Slice> parts) {
  uint64_t size = 0;
  for (const Slice& part : parts) size += part.size();
  return size;
}

// Copies n contiguous bytes from src into the buffers of dest, in order.  Ordinary
// stores: a reader's buffers are typically reused request after request (a serving
// engine's staging buffers), and stay cached that way; streaming stores, which would
// send every byte to memory, made vllm_get at 64 KiB 0.75x slower.  FetchCopy, so the
// speed does not depend on where the caller's buffers start (util/stream_copy.h).
// REQUIRES: the buffers hold at least n bytes.
inline void ScatterCopy(const char* src, uint64_t n, std::span<const MutableSlice> dest) {
  for (const MutableSlice& d : dest) {
    if (n == 0) break;
    const uint64_t k = std::min<uint64_t>(n, d.size());
    FetchCopy(d.data(), src, k);
    src += k;
    n -= k;
  }
}

// Copies the parts of a value of `size` bytes, in order, to dst -- a put's copy into the
// arena -- with streaming stores when the value is large (util/stream_copy.h).
// REQUIRES: size is the parts' total.
inline void GatherCopy(std::span<const Slice> parts, uint64_t size, char* dst) {
  const bool large = size >= kStreamingCopyMin;
  for (const Slice& part : parts) {
    if (large) {
      StreamingCopy(dst, part.data(), part.size());
    } else if (part.size() != 0) {
      std::memcpy(dst, part.data(), part.size());
    }
    dst += part.size();
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
