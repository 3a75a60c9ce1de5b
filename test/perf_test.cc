// PerfPoint, histograms, perf levels, the perf report and the perf-key docs table.
#include "kvengine/perf.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test/json_check.h"
#include "util/histogram.h"
#include "util/perf_point.h"

namespace kvengine {
namespace {

// The width of the bucket that holds `value`.
double BucketWidth(double value) {
  const int b = HistogramBuckets::BucketFor(static_cast<uint64_t>(value));
  return static_cast<double>(HistogramBuckets::UpperBound(b) - HistogramBuckets::LowerBound(b));
}

// The exact p-quantile of sorted samples (the smallest value with rank >= p * n).
double ExactPercentile(const std::vector<uint64_t>& sorted, double p) {
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return static_cast<double>(sorted[rank - 1]);
}

void ExpectPercentilesMatch(const std::vector<uint64_t>& samples) {
  HistogramData h;
  for (uint64_t v : samples) h.Add(v);
  std::vector<uint64_t> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  for (double p : {0.5, 0.9, 0.99, 0.999}) {
    const double exact = ExactPercentile(sorted, p);
    EXPECT_NEAR(h.Percentile(p), exact, BucketWidth(exact)) << "p=" << p;
  }
  EXPECT_EQ(h.count, samples.size());
  EXPECT_EQ(h.max, sorted.back());
  EXPECT_EQ(h.min, sorted.front());
  double sum = 0;
  for (uint64_t v : samples) sum += static_cast<double>(v);
  EXPECT_DOUBLE_EQ(h.Mean(), sum / static_cast<double>(samples.size()));
}

TEST(HistogramTest, BucketsTileTheRange) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; i++) {
    const uint64_t v = rng() >> (rng() % 64);
    const int b = HistogramBuckets::BucketFor(v);
    ASSERT_GE(b, 0);
    ASSERT_LT(b, HistogramBuckets::kNumBuckets);
    ASSERT_LE(HistogramBuckets::LowerBound(b), v);
    if (b + 1 < HistogramBuckets::kNumBuckets) {
      ASSERT_LT(v, HistogramBuckets::UpperBound(b));
      // At most 1/16 of the lower bound wide (exact buckets below 16).
      const uint64_t width = HistogramBuckets::UpperBound(b) - HistogramBuckets::LowerBound(b);
      ASSERT_LE(width, std::max<uint64_t>(1, HistogramBuckets::LowerBound(b) / 16));
    }
  }
  for (int b = 0; b + 1 < HistogramBuckets::kNumBuckets; b++) {
    ASSERT_EQ(HistogramBuckets::UpperBound(b), HistogramBuckets::LowerBound(b + 1));
    ASSERT_EQ(HistogramBuckets::BucketFor(HistogramBuckets::LowerBound(b)), b);
  }
}

TEST(HistogramTest, UniformDistribution) {
  std::vector<uint64_t> samples;
  for (uint64_t v = 1; v <= 100000; v++) samples.push_back(v);
  ExpectPercentilesMatch(samples);
}

TEST(HistogramTest, ExponentialDistribution) {
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> dist(1.0 / 20000.0);  // mean 20 us in ns
  std::vector<uint64_t> samples;
  for (int i = 0; i < 200000; i++) samples.push_back(static_cast<uint64_t>(dist(rng)));
  ExpectPercentilesMatch(samples);
}

TEST(HistogramTest, LogNormalWithHeavyTail) {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> dist(10.0, 2.0);
  std::vector<uint64_t> samples;
  for (int i = 0; i < 100000; i++) samples.push_back(static_cast<uint64_t>(dist(rng)));
  ExpectPercentilesMatch(samples);
}

TEST(HistogramTest, SingleValueAndEmpty) {
  HistogramData empty;
  EXPECT_EQ(empty.Percentile(0.5), 0.0);
  EXPECT_EQ(empty.Mean(), 0.0);
  HistogramData one;
  one.Add(12345);
  for (double p : {0.5, 0.9, 0.99, 0.999}) EXPECT_EQ(one.Percentile(p), 12345.0);
}

TEST(HistogramTest, ConcurrentAddsLoseNothing) {
  Histogram h;
  constexpr int kThreads = 8, kPerThread = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kPerThread; i++) h.Add(static_cast<uint64_t>(t * 1000 + i % 1000));
    });
  }
  for (auto& th : threads) th.join();
  HistogramData d;
  h.MergeInto(&d);
  EXPECT_EQ(d.count, static_cast<uint64_t>(kThreads) * kPerThread);
  uint64_t in_buckets = 0;
  for (uint64_t n : d.buckets) in_buckets += n;
  EXPECT_EQ(in_buckets, d.count);
  EXPECT_EQ(d.max, static_cast<uint64_t>((kThreads - 1) * 1000 + 999));
  EXPECT_EQ(d.min, 0u);
  h.Clear();
  HistogramData cleared;
  h.MergeInto(&cleared);
  EXPECT_EQ(cleared.count, 0u);
}

class PerfPointTest : public ::testing::Test {
 protected:
  void SetUp() override { ResetPerf(); }
  void TearDown() override {
    SetPerfLevel(PerfLevel::kOff);
    ResetPerf();
  }
  static uint64_t Count(PerfKey key) { return PerfSnapshot(key).count; }
};

TEST_F(PerfPointTest, LevelOffRecordsNothing) {
  SetPerfLevel(PerfLevel::kOff);
  for (int i = 0; i < 10; i++) {
    PerfPoint entry(PerfKey::db_batch_put);
    PerfPoint inner(PerfKey::memory_put);
    EXPECT_FALSE(entry.running());
  }
  for (int k = 0; k < kNumPerfKeys; k++) EXPECT_EQ(Count(static_cast<PerfKey>(k)), 0u);
}

TEST_F(PerfPointTest, EntryLevelRecordsEntryKeysOnly) {
  SetPerfLevel(PerfLevel::kEntry);
  {
    PerfPoint entry(PerfKey::db_batch_put);
    PerfPoint py(PerfKey::py_batch_put);
    PerfPoint inner(PerfKey::memory_put);
    PerfPoint env(PerfKey::env_file_write);
  }
  EXPECT_EQ(Count(PerfKey::db_batch_put), 1u);
  EXPECT_EQ(Count(PerfKey::py_batch_put), 1u);
  EXPECT_EQ(Count(PerfKey::memory_put), 0u);
  EXPECT_EQ(Count(PerfKey::env_file_write), 0u);
}

TEST_F(PerfPointTest, AllLevelRecordsEveryKey) {
  SetPerfLevel(PerfLevel::kAll);
  for (int k = 0; k < kNumPerfKeys; k++) {
    PerfPoint p(static_cast<PerfKey>(k));
  }
  for (int k = 0; k < kNumPerfKeys; k++) {
    EXPECT_EQ(Count(static_cast<PerfKey>(k)), 1u) << kPerfKeys[k].name;
  }
}

TEST_F(PerfPointTest, StartEndAbandon) {
  SetPerfLevel(PerfLevel::kAll);
  {
    PerfPoint deferred(PerfKey::memory_lookup, PerfPoint::Deferred{});
    EXPECT_FALSE(deferred.running());
  }
  EXPECT_EQ(Count(PerfKey::memory_lookup), 0u);
  {
    PerfPoint p(PerfKey::memory_lookup, PerfPoint::Deferred{});
    p.Start();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    p.End();
    p.End();  // a second End records nothing
  }
  PerfStats d = PerfSnapshot(PerfKey::memory_lookup);
  EXPECT_EQ(d.count, 1u);
  EXPECT_GE(d.max_ns, 1'900'000.0);  // the 2 ms slept (1% calibration slack)
  EXPECT_LT(d.max_ns, 2'000'000'000.0);
  {
    PerfPoint p(PerfKey::memory_lookup);
    p.Abandon();
    EXPECT_FALSE(p.running());
  }
  EXPECT_EQ(Count(PerfKey::memory_lookup), 1u);
  {
    PerfPoint p(PerfKey::memory_lookup);
    p.Abandon();
    p.Start();  // restarted after an abandon: records once, at scope end
  }
  EXPECT_EQ(Count(PerfKey::memory_lookup), 2u);
  // A point started while the level allowed it still records after the level drops.
  {
    PerfPoint p(PerfKey::memory_erase);
    SetPerfLevel(PerfLevel::kOff);
  }
  EXPECT_EQ(Count(PerfKey::memory_erase), 1u);
}

TEST_F(PerfPointTest, ConcurrentRecordingLosesNoCounts) {
  SetPerfLevel(PerfLevel::kAll);
  constexpr int kThreads = 24, kPerThread = 5000;  // more threads than stripes
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([] {
      for (int i = 0; i < kPerThread; i++) {
        PerfPoint outer(PerfKey::db_batch_get_into);
        PerfPoint inner(PerfKey::db_get_one);
      }
    });
  }
  // Read while they record: must be safe (TSan) and never exceed the final count.
  for (int i = 0; i < 20; i++) {
    EXPECT_LE(Count(PerfKey::db_batch_get_into), uint64_t{kThreads} * kPerThread);
    std::string report = PerfReport(true);
    EXPECT_FALSE(report.empty());
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(Count(PerfKey::db_batch_get_into), uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(Count(PerfKey::db_get_one), uint64_t{kThreads} * kPerThread);
}

TEST_F(PerfPointTest, ReportNamesEveryDeclaredKey) {
  SetPerfLevel(PerfLevel::kAll);
  { PerfPoint p(PerfKey::db_batch_put); }
  const std::string text = PerfReport(false);
  const std::string json = PerfReport(true);
  std::string error;
  EXPECT_TRUE(test::JsonChecker::Valid(json, &error)) << error << "\n" << json;
  for (const PerfKeyInfo& info : kPerfKeys) {
    EXPECT_NE(text.find(std::string("\n") + info.name + " "), std::string::npos) << info.name;
    EXPECT_NE(json.find(std::string("\"") + info.name + "\":{"), std::string::npos) << info.name;
  }
  EXPECT_NE(json.find("\"db_batch_put\":{\"layer\":\"db\",\"level\":\"entry\",\"count\":1,"),
            std::string::npos)
      << json;
  EXPECT_NE(text.find("level=all"), std::string::npos);
  ResetPerf();
  EXPECT_NE(PerfReport(true).find("\"db_batch_put\":{\"layer\":\"db\",\"level\":\"entry\","
                                  "\"count\":0,"),
            std::string::npos);
}

TEST(PerfKeysTest, DeclarationsAreWellFormed) {
  const std::vector<std::string> layers = {"python", "db",    "memory",    "ssd",
                                           "env",    "uring", "transport", "gpu"};
  std::vector<std::string> names;
  for (const PerfKeyInfo& info : kPerfKeys) {
    names.emplace_back(info.name);
    EXPECT_NE(std::find(layers.begin(), layers.end(), info.layer), layers.end()) << info.name;
    EXPECT_TRUE(info.level == PerfLevel::kEntry || info.level == PerfLevel::kAll) << info.name;
    EXPECT_GT(std::string(info.help).size(), 5u) << info.name;
    EXPECT_EQ(std::string(info.help).find('|'), std::string::npos) << info.name;
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "duplicate key";
  // Every layer the design names has keys (those of later layers are declared ahead).
  for (const std::string& layer : layers) {
    bool found = false;
    for (const PerfKeyInfo& info : kPerfKeys) found |= layer == info.layer;
    EXPECT_TRUE(found) << layer;
  }
}

// docs/observability.md carries the perf-key table generated from util/perf.def between
// two markers.  Run with KV_REGENERATE_DOCS=1 to rewrite it after editing the .def.
TEST(PerfKeysTest, DocsTableMatchesDef) {
  const std::string path = std::string(KV_SOURCE_DIR) + "/docs/observability.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string doc = buffer.str();
  const std::string begin = "<!-- perf-keys:begin (generated from util/perf.def) -->\n";
  const std::string end = "<!-- perf-keys:end -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "marker missing: " << begin;
  ASSERT_NE(e, std::string::npos) << "marker missing: " << end;
  ASSERT_LT(b, e);
  const std::string table = doc.substr(b + begin.size(), e - b - begin.size());
  const std::string expected = PerfKeyMarkdownTable();
  const char* regenerate = std::getenv("KV_REGENERATE_DOCS");
  if (regenerate != nullptr && std::string(regenerate) == "1" && table != expected) {
    doc.replace(b + begin.size(), e - b - begin.size(), expected);
    std::ofstream(path) << doc;
    GTEST_SKIP() << "rewrote the table in " << path;
  }
  EXPECT_EQ(table, expected) << "docs/observability.md is out of date with util/perf.def; "
                                "rerun this test with KV_REGENERATE_DOCS=1";
}

}  // namespace
}  // namespace kvengine
