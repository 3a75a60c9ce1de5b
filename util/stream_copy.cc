#include "util/stream_copy.h"

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvengine {

#if defined(__x86_64__)
namespace {

// Copies the bytes before dst's next 32-byte boundary with memcpy (streaming stores need
// aligned destinations); returns how many.
size_t AlignHead(char* dst, const char* src, size_t n) {
  const size_t head = std::min<size_t>(n, (32 - reinterpret_cast<uintptr_t>(dst) % 32) % 32);
  if (head != 0) std::memcpy(dst, src, head);
  return head;
}

__attribute__((target("avx2"))) void CopyAvx2(char* dst, const char* src, size_t n) {
  size_t i = AlignHead(dst, src, n);
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  _mm_sfence();
  if (i < n) std::memcpy(dst + i, src + i, n - i);
}

void CopySse2(char* dst, const char* src, size_t n) {
  size_t i = AlignHead(dst, src, n);
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();
  if (i < n) std::memcpy(dst + i, src + i, n - i);
}

// Copies the bytes after dst+n's last 32-byte boundary with memcpy (so the loop's
// stores are aligned); returns where the loop ends.
size_t AlignTail(char* dst, const char* src, size_t n) {
  const size_t tail = std::min<size_t>(n, reinterpret_cast<uintptr_t>(dst + n) % 32);
  if (tail != 0) std::memcpy(dst + n - tail, src + n - tail, tail);
  return n - tail;
}

__attribute__((target("avx2"))) void BackwardAvx2(char* dst, const char* src, size_t n) {
  size_t e = AlignTail(dst, src, n);
  for (; e >= 128; e -= 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + e - 32));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + e - 64));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + e - 96));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + e - 128));
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + e - 32), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + e - 64), b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + e - 96), c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + e - 128), d);
  }
  if (e != 0) std::memcpy(dst, src, e);  // under 128 bytes: too few to alias
}

void BackwardSse2(char* dst, const char* src, size_t n) {
  size_t e = AlignTail(dst, src, n);
  for (; e >= 64; e -= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + e - 16));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + e - 32));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + e - 48));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + e - 64));
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + e - 16), a);
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + e - 32), b);
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + e - 48), c);
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + e - 64), d);
  }
  if (e != 0) std::memcpy(dst, src, e);
}

bool HaveAvx2() {
  static const bool avx2 = [] {
    __builtin_cpu_init();  // may run before the constructor that would have
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return avx2;
}

}  // namespace

void StreamingCopy(void* dst, const void* src, size_t n) {
  if (HaveAvx2()) {
    CopyAvx2(static_cast<char*>(dst), static_cast<const char*>(src), n);
  } else {
    CopySse2(static_cast<char*>(dst), static_cast<const char*>(src), n);
  }
}

void BackwardCopy(void* dst, const void* src, size_t n) {
  if (HaveAvx2()) {
    BackwardAvx2(static_cast<char*>(dst), static_cast<const char*>(src), n);
  } else {
    BackwardSse2(static_cast<char*>(dst), static_cast<const char*>(src), n);
  }
}

#else

void StreamingCopy(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }
void BackwardCopy(void* dst, const void* src, size_t n) { std::memmove(dst, src, n); }

#endif

}  // namespace kvengine
