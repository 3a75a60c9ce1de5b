#include "db_bench/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace kvbench {

// Bucket i holds samples in [Limits()[i-1], Limits()[i]).  The limits grow by about 10%
// per bucket from 1 us to about 1e10 us, rounded to 2 significant digits so that the
// printed table reads well; percentiles are within a few percent of the true value.
const std::vector<double>& Histogram::Limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> v;
    double x = 1;
    while (x < 1e10) {
      const double scale = std::pow(10.0, std::floor(std::log10(x)) - 1);
      const double rounded = std::round(x / scale) * scale;
      if (v.empty() || rounded > v.back()) v.push_back(rounded);
      x *= 1.1;
    }
    v.push_back(std::numeric_limits<double>::infinity());
    return v;
  }();
  return limits;
}

Histogram::Histogram() { Clear(); }

void Histogram::Clear() {
  count_ = 0;
  min_ = std::numeric_limits<double>::infinity();
  max_ = 0;
  sum_ = 0;
  sum_squares_ = 0;
  buckets_.assign(Limits().size(), 0);
}

void Histogram::Add(double micros) {
  const auto& limits = Limits();
  const size_t b = std::upper_bound(limits.begin(), limits.end(), micros) - limits.begin();
  buckets_[std::min(b, limits.size() - 1)]++;
  count_++;
  min_ = std::min(min_, micros);
  max_ = std::max(max_, micros);
  sum_ += micros;
  sum_squares_ += micros * micros;
}

void Histogram::Merge(const Histogram& other) {
  if (other.count_ == 0) return;
  count_ += other.count_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  sum_ += other.sum_;
  sum_squares_ += other.sum_squares_;
  for (size_t i = 0; i < buckets_.size(); i++) buckets_[i] += other.buckets_[i];
}

double Histogram::Average() const { return count_ ? sum_ / static_cast<double>(count_) : 0; }

double Histogram::StandardDeviation() const {
  if (count_ == 0) return 0;
  const double n = static_cast<double>(count_);
  const double variance = (sum_squares_ * n - sum_ * sum_) / (n * n);
  return variance > 0 ? std::sqrt(variance) : 0;
}

double Histogram::Percentile(double p) const {
  if (count_ == 0) return 0;
  const auto& limits = Limits();
  const double threshold = static_cast<double>(count_) * (p / 100.0);
  double cumulative = 0;
  for (size_t b = 0; b < buckets_.size(); b++) {
    if (buckets_[b] == 0) continue;
    const double before = cumulative;
    cumulative += static_cast<double>(buckets_[b]);
    if (cumulative >= threshold) {
      // Interpolate inside the bucket, clamped to the samples actually seen.
      const double left = std::max(b == 0 ? 0.0 : limits[b - 1], min_);
      const double right = std::min(limits[b], max_);
      const double pos = (threshold - before) / static_cast<double>(buckets_[b]);
      return std::clamp(left + (right - left) * pos, min_, max_);
    }
  }
  return max_;
}

std::string Histogram::ToString() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "Count: %llu  Average: %.4f  StdDev: %.2f\n",
                static_cast<unsigned long long>(count_), Average(), StandardDeviation());
  out += line;
  std::snprintf(line, sizeof(line), "Min: %.4f  Median: %.4f  Max: %.4f\n", min(), Percentile(50),
                max());
  out += line;
  std::snprintf(line, sizeof(line),
                "Percentiles: P50: %.2f P75: %.2f P90: %.2f P99: %.2f P99.9: %.2f P99.99: %.2f\n",
                Percentile(50), Percentile(75), Percentile(90), Percentile(99), Percentile(99.9),
                Percentile(99.99));
  out += line;
  out += "------------------------------------------------------\n";
  if (count_ == 0) return out;
  const auto& limits = Limits();
  const double mult = 100.0 / static_cast<double>(count_);
  double cumulative = 0;
  for (size_t b = 0; b < buckets_.size(); b++) {
    if (buckets_[b] == 0) continue;
    cumulative += static_cast<double>(buckets_[b]);
    const double left = b == 0 ? 0 : limits[b - 1];
    const double pct = mult * static_cast<double>(buckets_[b]);
    std::snprintf(line, sizeof(line), "[ %11.1f, %11.1f ) %8llu %7.3f%% %7.3f%% ", left, limits[b],
                  static_cast<unsigned long long>(buckets_[b]), pct, mult * cumulative);
    out += line;
    // One '#' per 5% of the samples, as db_bench does.
    out += std::string(static_cast<size_t>(pct / 5.0 + 0.5), '#');
    out += "\n";
  }
  return out;
}

}  // namespace kvbench
