// Histogram: latency samples (microseconds) in geometric buckets, printed in db_bench's
// style (Count/Average/StdDev, Min/Median/Max, Percentiles, then a bar per bucket).
//
// Thread-safety: none.  Each benchmark thread owns one and the runner merges them.
#ifndef KVENGINE_DB_BENCH_HISTOGRAM_H_
#define KVENGINE_DB_BENCH_HISTOGRAM_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

class Histogram {
 public:
  Histogram();

  void Clear();
  void Add(double micros);
  void Merge(const Histogram& other);

  uint64_t count() const { return count_; }
  double min() const { return count_ ? min_ : 0; }
  double max() const { return count_ ? max_ : 0; }
  double Average() const;
  double StandardDeviation() const;
  // The p-th percentile (0 < p <= 100), interpolated inside its bucket.
  double Percentile(double p) const;

  // The db_bench text: three summary lines and one line per non-empty bucket.
  std::string ToString() const;

 private:
  // Upper limits of the buckets, shared by every histogram.
  static const std::vector<double>& Limits();

  uint64_t count_ = 0;
  double min_ = 0;
  double max_ = 0;
  double sum_ = 0;
  double sum_squares_ = 0;
  std::vector<uint64_t> buckets_;
};

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_HISTOGRAM_H_
