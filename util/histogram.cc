#include "util/histogram.h"

#include <algorithm>

namespace kvengine {

void HistogramData::Add(uint64_t value) {
  buckets[HistogramBuckets::BucketFor(value)]++;
  count++;
  sum += value;
  min = std::min(min, value);
  max = std::max(max, value);
}

void HistogramData::Merge(const HistogramData& other) {
  count += other.count;
  sum += other.sum;
  min = std::min(min, other.min);
  max = std::max(max, other.max);
  for (int b = 0; b < HistogramBuckets::kNumBuckets; b++) buckets[b] += other.buckets[b];
}

double HistogramData::Mean() const {
  return count == 0 ? 0.0 : static_cast<double>(sum) / static_cast<double>(count);
}

double HistogramData::Percentile(double p) const {
  // The buckets, not `count`, are the population: a snapshot taken while samples land
  // may see a count that runs ahead of the buckets.
  uint64_t total = 0;
  for (uint64_t n : buckets) total += n;
  if (total == 0) return 0.0;
  p = std::clamp(p, 0.0, 1.0);
  const double rank = p * static_cast<double>(total);
  double cumulative = 0;
  for (int b = 0; b < HistogramBuckets::kNumBuckets; b++) {
    if (buckets[b] == 0) continue;
    const double next = cumulative + static_cast<double>(buckets[b]);
    if (next >= rank) {
      const double lo = static_cast<double>(HistogramBuckets::LowerBound(b));
      const double hi = b + 1 < HistogramBuckets::kNumBuckets
                            ? static_cast<double>(HistogramBuckets::UpperBound(b))
                            : static_cast<double>(max) + 1;
      const double fraction = (rank - cumulative) / static_cast<double>(buckets[b]);
      const double value = lo + (hi - lo) * fraction;
      const double low_clamp = min == ~uint64_t{0} ? 0.0 : static_cast<double>(min);
      return std::clamp(value, low_clamp, static_cast<double>(max));
    }
    cumulative = next;
  }
  return static_cast<double>(max);
}

void Histogram::MergeInto(HistogramData* data) const {
  HistogramData mine;
  mine.sum = sum_.load(std::memory_order_relaxed);
  mine.max = max_.load(std::memory_order_relaxed);
  for (int b = 0; b < HistogramBuckets::kNumBuckets; b++) {
    mine.buckets[b] = buckets_[b].load(std::memory_order_relaxed);
    mine.count += mine.buckets[b];
    if (mine.buckets[b] != 0 && mine.min == ~uint64_t{0}) {
      mine.min = HistogramBuckets::LowerBound(b);
    }
  }
  data->Merge(mine);
}

void Histogram::Clear() {
  for (auto& b : buckets_) b.store(0, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  max_.store(0, std::memory_order_relaxed);
}

}  // namespace kvengine
