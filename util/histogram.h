// Histogram: a latency histogram that many threads record into without locks.
//
// Values (nanoseconds, or any non-negative integer) fall into log-linear buckets: values
// below 16 get a bucket each, and every power of two above is split into 16 equal
// buckets, so a bucket is at most 1/16 (6.25%) of its lower bound wide.  Values at or
// above 2^44 (about 4.9 hours in ns) share the last bucket.
//
// Add() is two relaxed atomic increments (the bucket, the sum) and a load (the max): safe
// from any number of threads.  The count is the sum of the buckets; a reader sees each
// sample either wholly or partly (bucket and sum are separate atomics, so a snapshot
// taken while samples land may be off by those samples).
// Percentiles are estimated by linear interpolation inside the bucket that holds them,
// so they are exact to within one bucket's width.
#ifndef KVENGINE_UTIL_HISTOGRAM_H_
#define KVENGINE_UTIL_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace kvengine {

class HistogramBuckets {
 public:
  static constexpr int kSubBits = 4;  // 16 buckets per power of two
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kMaxExponent = 43;  // values up to 2^44 - 1 are bucketed exactly
  static constexpr int kNumBuckets = kSub + (kMaxExponent - kSubBits + 1) * kSub;

  static int BucketFor(uint64_t value) {
    if (value < static_cast<uint64_t>(kSub)) return static_cast<int>(value);
    const int e = 63 - __builtin_clzll(value);
    if (e > kMaxExponent) return kNumBuckets - 1;
    const int sub = static_cast<int>((value >> (e - kSubBits)) & (kSub - 1));
    return kSub + (e - kSubBits) * kSub + sub;
  }
  // The smallest value of bucket b.
  static uint64_t LowerBound(int b) {
    if (b < kSub) return static_cast<uint64_t>(b);
    const int e = (b - kSub) / kSub + kSubBits;
    const uint64_t sub = static_cast<uint64_t>((b - kSub) % kSub);
    return (uint64_t{1} << e) + (sub << (e - kSubBits));
  }
  // One past the largest value of bucket b.
  static uint64_t UpperBound(int b) {
    return b + 1 < kNumBuckets ? LowerBound(b + 1) : ~uint64_t{0};
  }
};

// A plain copy of a histogram's contents, for reading and merging.
struct HistogramData {
  uint64_t count = 0;
  uint64_t sum = 0;
  // ~0 when empty.  Exact for HistogramData::Add; Histogram::MergeInto reports the lower
  // bound of the least bucket used (it keeps no minimum, to keep Add cheap).
  uint64_t min = ~uint64_t{0};
  uint64_t max = 0;
  std::array<uint64_t, HistogramBuckets::kNumBuckets> buckets{};

  void Add(uint64_t value);  // single-threaded
  void Merge(const HistogramData& other);
  double Mean() const;
  // The value below which a fraction p (0 < p <= 1) of the samples lie, interpolated
  // inside its bucket and clamped to [min, max].  0 when empty.
  double Percentile(double p) const;
};

class Histogram {
 public:
  Histogram() = default;
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Thread-safe, lock-free.
  void Add(uint64_t value) {
    buckets_[HistogramBuckets::BucketFor(value)].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(value, std::memory_order_relaxed);
    uint64_t seen = max_.load(std::memory_order_relaxed);
    while (value > seen && !max_.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
  }
  // Adds this histogram's contents to *data.  Thread-safe.
  void MergeInto(HistogramData* data) const;
  // Thread-safe; samples added meanwhile may be kept in part.
  void Clear();

 private:
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> max_{0};
  std::array<std::atomic<uint64_t>, HistogramBuckets::kNumBuckets> buckets_{};
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_HISTOGRAM_H_
