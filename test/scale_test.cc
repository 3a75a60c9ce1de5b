// The SSD tier at scale, in a long mode: millions of small values on SSD, then Close and
// Open (through the map checkpoint), a sample of the values verified bit-exact, and the
// RAM per key and the open time reported.
//
// Not run unless asked (it writes ~550 bytes of disk per key):
//   KV_SCALE_KEYS=10000000 [KV_SCALE_DIR=/big/disk/dir] [KV_SCALE_FULL_SCAN=1]
//   build/test/scale_test
// KV_SCALE_FULL_SCAN=1 also times an Open without the checkpoint (every bucket read).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

constexpr size_t kValueSize = 512;

std::string Key(uint64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "scale.%012llu", static_cast<unsigned long long>(i));
  return buf;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

TEST(ScaleTest, MillionsOfSmallValuesReopenThroughTheCheckpoint) {
  const char* keys_env = std::getenv("KV_SCALE_KEYS");
  if (keys_env == nullptr) GTEST_SKIP() << "long mode: set KV_SCALE_KEYS (e.g. 10000000)";
  const uint64_t n = std::strtoull(keys_env, nullptr, 10);
  test::TempDir temp;
  const char* dir_env = std::getenv("KV_SCALE_DIR");
  const std::string dir = dir_env != nullptr ? std::string(dir_env) : temp.path();
  Options options;
  options.apply_environment = false;
  options.memory_capacity_bytes = 64ull << 20;
  options.offload_policy = OffloadPolicy::kWriteThrough;
  options.bucket_keys_limit = 4096;
  // The GC thread (default interval) writes map checkpoints as the fill goes, so that
  // Close need not write one of hundreds of MB.
  options.ssd_capacity_bytes = n * 4096 * 2 + (1ull << 30);
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(options, dir, &db).ok());
  auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < n; i++) {
    Status s = db->Put(WriteOptions(), Key(i), test::MakeValue(i, kValueSize));
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }
  ASSERT_TRUE(db->Flush().ok());
  const double fill = Seconds(start);
  EXPECT_EQ(test::StatOf(db.get(), "ssd.keys"), n);
  const uint64_t per_key = test::StatOf(db.get(), "ssd.index_bytes_per_key");
  EXPECT_LE(per_key, 48u);
  // Disk: bucket format v3 packs 512-byte values on 512-byte units.
  const double disk = static_cast<double>(test::StatOf(db.get(), "ssd.used_bytes")) /
                      static_cast<double>(test::StatOf(db.get(), "ssd.live_bytes"));
  EXPECT_LE(disk, 1.15);
  const uint64_t checkpoints = test::StatOf(db.get(), "ssd.checkpoint_writes");
  const uint64_t backlog = test::StatOf(db.get(), "ssd.checkpoint_backlog");
  start = std::chrono::steady_clock::now();
  ASSERT_TRUE(db->Close().ok());
  const double close = Seconds(start);
  db.reset();
  start = std::chrono::steady_clock::now();
  ASSERT_TRUE(DB::Open(options, dir, &db).ok());
  const double open = Seconds(start);
  EXPECT_GT(test::StatOf(db.get(), "ssd.checkpoint_keys"), 0u);
  EXPECT_EQ(test::StatOf(db.get(), "ssd.keys"), n);
  std::mt19937_64 rng(n);
  for (int k = 0; k < 10000; k++) {
    const uint64_t i = rng() % n;
    std::string got;
    ASSERT_TRUE(db->Get(ReadOptions(), Key(i), &got).ok()) << i;
    ASSERT_TRUE(got == test::MakeValue(i, kValueSize)) << i;
  }
  std::printf(
      "scale: %llu keys of %zu B: fill %.1f s; ssd index %llu B/key; bucket files %.3fx the "
      "value bytes; %llu map checkpoints while filling, %llu keys left to replay; close %.3f s; "
      "open %.3f s (ssd tier %.3f s)\n",
      static_cast<unsigned long long>(n), kValueSize, fill,
      static_cast<unsigned long long>(test::StatOf(db.get(), "ssd.index_bytes_per_key")), disk,
      static_cast<unsigned long long>(checkpoints), static_cast<unsigned long long>(backlog), close,
      open, static_cast<double>(test::StatOf(db.get(), "ssd.open_micros")) / 1e6);
  if (std::getenv("KV_SCALE_FULL_SCAN") != nullptr) {
    ASSERT_TRUE(db->Close().ok());
    db.reset();
    std::filesystem::remove(dir + "/SSDMAP");
    start = std::chrono::steady_clock::now();
    ASSERT_TRUE(DB::Open(options, dir, &db).ok());
    std::printf("scale: open without the checkpoint (every bucket read): %.3f s\n", Seconds(start));
    EXPECT_EQ(test::StatOf(db.get(), "ssd.keys"), n);
  }
  ASSERT_TRUE(db->Close().ok());
}

}  // namespace
}  // namespace kvengine
