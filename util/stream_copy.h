// CopyValue: a put's copy of a value's bytes into the memory tier's arena -- the one
// copy a put makes.
//
// Large values are copied with non-temporal (streaming) stores.  A value of 64 KiB or
// more put into the arena is not read again soon by the core that wrote it -- it waits
// for a later get, an offload or another process -- and a 32-layer request of such
// values does not fit the caches anyway.  Ordinary stores first read every destination
// line from memory (read for ownership), then write it back when evicted: twice the
// memory traffic of the copy.  Streaming stores write whole lines without reading them.
// Measured on the development VM (AMD EPYC, 64 KiB and 1 MiB values from 32 layer
// buffers into a 1 GiB huge-page region): 1.6-1.9x glibc memcpy's bandwidth.  Below the
// threshold, where the destination may still be cached, it is memcpy.  (Gets copy with
// FetchCopy, below: see ScatterCopy in util/buffers.h.)
//
// The copy is complete and globally visible when CopyValue returns (it ends with a store
// fence), so publishing the value afterwards -- under a lock, or by a message to another
// process -- publishes its bytes too.
//
// FetchCopy: a get's copy of a value out of the store into the caller's buffer, at a
// speed that does not depend on where the caller's buffer starts.
//
// glibc's memcpy (2.36, on the development VM's AMD EPYC) copies blocks of 4 KiB and more
// with `rep movsb`, which slows down 5-100x when the destination starts 1-63 bytes past
// the source within a 4 KiB page: each load then looks like it may depend on a store
// just made to the same page offset (4K aliasing).  kvengine's values start on a page;
// numpy's buffers start 16 bytes into one, so a Python user's every get fell into that
// case (issue 49: 0.31 of memcpy's speed instead of 0.93).  In that case FetchCopy copies
// backwards, from the end, with 32-byte loads and aligned stores: the stores run ahead of
// the loads' page offsets instead of behind them, and nothing aliases.  Measured with
// `kv_bench --buffer_offset` (docs/benchmarks.md, "Buffer offset").  In every other case
// it is memcpy, which is fast there.  Ordinary (not streaming) stores: the caller reads
// what it fetched soon (see ScatterCopy in util/buffers.h).
#ifndef KVENGINE_UTIL_STREAM_COPY_H_
#define KVENGINE_UTIL_STREAM_COPY_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvengine {

// Values of at least this many bytes are copied with streaming stores.
inline constexpr size_t kStreamingCopyMin = 64 << 10;

// Copies n bytes with streaming stores where the CPU has them (x86-64: AVX2, else SSE2);
// elsewhere memcpy.  Any alignment; the ranges must not overlap.
void StreamingCopy(void* dst, const void* src, size_t n);

inline void CopyValue(void* dst, const void* src, size_t n) {
  if (n >= kStreamingCopyMin) {
    StreamingCopy(dst, src, n);
  } else if (n != 0) {
    std::memcpy(dst, src, n);
  }
}

// Copies n bytes backwards with AVX2 where the CPU has it (SSE2 otherwise); any
// alignment; the ranges must not overlap.
void BackwardCopy(void* dst, const void* src, size_t n);

// True when memcpy would be slowed by 4K aliasing: a block of 2 KiB or more whose
// destination starts 1-63 bytes past its source within a page.
inline bool AliasesForward(const void* dst, const void* src, size_t n) {
  const uintptr_t off =
      (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return n >= 2048 && off != 0 && off < 64;
}

inline void FetchCopy(void* dst, const void* src, size_t n) {
  if (AliasesForward(dst, src, n)) {
    BackwardCopy(dst, src, n);
  } else if (n != 0) {
    std::memcpy(dst, src, n);
  }
}

}  // namespace kvengine

#endif  // KVENGINE_UTIL_STREAM_COPY_H_
