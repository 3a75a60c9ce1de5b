// Concurrency stress: threads of mixed put/get/delete/overwrite on a small DB for a
// bounded time, and a thread of Flush() calls.  Every value carries its own checksum, so a torn,
// mixed or freed read fails the check.  Also run under TSan (see docs/testing.md).
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

double StressSeconds() {
  const char* s = std::getenv("KV_STRESS_SECONDS");
  return s != nullptr ? std::atof(s) : 3.0;
}

TEST(StressTest, MixedOperationsNeverReturnTornValues) {
  test::TempDir dir;
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 4 << 20;  // small: eviction runs all the time
  o.memory_slab_size = 256 << 10;
  o.index_shards = 8;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());

  const int kThreads = 6;
  const int kKeys = 200;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0}, hits{0}, corrupt{0}, unexpected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::vector<char> a(96 << 10), b(96 << 10);
      WriteOptions wo;
      ReadOptions ro;
      while (!stop.load(std::memory_order_relaxed)) {
        const std::string key = "key." + std::to_string(rng() % kKeys);
        const int op = static_cast<int>(rng() % 10);
        Status s;
        if (op < 4) {  // put, from one or two buffers
          std::string v = test::MakeSelfCheckingValue(rng, 16 + rng() % (180 << 10));
          if (rng() % 2 == 0) {
            s = db->Put(wo, key, v);
          } else {
            size_t cut = v.size() / 3;
            std::vector<Slice> keys = {key};
            std::vector<ValueParts> values = {
                {Slice(v.data(), cut), Slice(v.data() + cut, v.size() - cut)}};
            std::vector<int64_t> r;
            s = db->BatchPut(wo, keys, values, &r);
            if (s.ok() && r[0] != 0) s = Status::FromErrorCode(static_cast<int>(r[0]));
          }
          if (!s.ok() && !s.IsNoSpace()) unexpected++;
        } else if (op < 8) {  // get, scattered across two buffers
          std::vector<Slice> keys = {key};
          std::vector<Destination> dest = {
              {MutableSlice(a.data(), a.size()), MutableSlice(b.data(), b.size())}};
          std::vector<int64_t> r;
          s = db->BatchGetInto(ro, keys, dest, &r);
          if (!s.ok()) {
            unexpected++;
          } else if (r[0] >= 0) {
            std::string joined(a.data(), std::min<size_t>(r[0], a.size()));
            if (static_cast<size_t>(r[0]) > a.size()) joined.append(b.data(), r[0] - a.size());
            if (!test::SelfCheck(joined.data(), joined.size())) corrupt++;
            hits++;
          } else if (r[0] != -1) {
            unexpected++;
          }
        } else if (op < 9) {
          s = db->Delete(wo, key);
          if (!s.ok() && !s.IsNotFound()) unexpected++;
        } else {
          std::vector<Slice> keys = {key, "key.0", "key.1"};
          std::vector<int64_t> r;
          if (!db->BatchExists(keys, &r).ok()) unexpected++;
        }
        ops++;
      }
    });
  }
  // Flush() races the writers: with write_back it writes the values only in memory while
  // they are overwritten, deleted and evicted.
  std::atomic<uint64_t> flushes{0};
  threads.emplace_back([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      if (!db->Flush().ok()) unexpected++;
      flushes++;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::this_thread::sleep_for(std::chrono::duration<double>(StressSeconds()));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_EQ(unexpected.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  EXPECT_GT(flushes.load(), 0u);
  std::string stats;
  ASSERT_TRUE(db->GetProperty("kvengine.stats", &stats));
  std::printf("stress: %llu ops, %llu hits\n%s", static_cast<unsigned long long>(ops.load()),
              static_cast<unsigned long long>(hits.load()), stats.c_str());
  ASSERT_TRUE(db->Close().ok());
}

}  // namespace
}  // namespace kvengine
