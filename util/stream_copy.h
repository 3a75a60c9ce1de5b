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
// memcpy: see ScatterCopy in util/buffers.h.)
//
// The copy is complete and globally visible when CopyValue returns (it ends with a store
// fence), so publishing the value afterwards -- under a lock, or by a message to another
// process -- publishes its bytes too.
#ifndef KVENGINE_UTIL_STREAM_COPY_H_
#define KVENGINE_UTIL_STREAM_COPY_H_

#include <cstddef>
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

}  // namespace kvengine

#endif  // KVENGINE_UTIL_STREAM_COPY_H_
