// The SSD tier at scale, in a long mode: millions of small values on SSD, then Close and
// Open (through the map checkpoint), a sample of the values verified bit-exact, and the
// RAM per key and the open time reported.
//
// Not run unless asked (it writes ~550 bytes of disk per key):
//   KV_SCALE_KEYS=10000000 [KV_SCALE_DIR=/big/disk/dir] [KV_SCALE_FULL_SCAN=1]
//   build/test/scale_test
// KV_SCALE_FULL_SCAN=1 also times an Open without the checkpoint (every bucket read).
//
// The RAM per key is also measured from outside: a child process opens the DB, and this
// one reads the child's resident memory (/proc/PID/status: VmRSS once open, VmHWM for the
// peak during the open) less that of a child that opened an empty DB with the same
// options (the memory tier's arena, the libraries).
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// A child's resident memory, read from /proc/PID/status.
struct Resident {
  uint64_t rss = 0;                  // VmRSS, bytes
  uint64_t peak = 0;                 // VmHWM, bytes
  uint64_t keys = 0;                 // ssd.keys the child's DB reported
  uint64_t index_bytes_per_key = 0;  // and its ssd.index_bytes_per_key
};

uint64_t StatusKiB(const std::string& status, const std::string& field) {
  const size_t at = status.find(field + ":");
  return at == std::string::npos
             ? 0
             : std::strtoull(status.c_str() + at + field.size() + 1, nullptr, 10);
}

// Opens the DB at dir in a child process, waits until it is open, and reads the child's
// memory from here.
Resident OpenInChildAndMeasure(const Options& options, const std::string& dir) {
  int ready[2], done[2];
  if (pipe(ready) != 0 || pipe(done) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    close(done[1]);
    std::unique_ptr<DB> db;
    uint64_t said[2] = {~uint64_t{0}, 0};
    if (DB::Open(options, dir, &db).ok()) {
      said[0] = test::StatOf(db.get(), "ssd.keys");
      said[1] = test::StatOf(db.get(), "ssd.index_bytes_per_key");
    }
    if (write(ready[1], said, sizeof(said)) != sizeof(said)) _exit(1);
    char c;
    (void)!read(done[0], &c, 1);  // the parent has read our memory (or died)
    _exit(0);                     // no Close: only the open is measured
  }
  close(ready[1]);
  close(done[0]);
  Resident r;
  auto status = [pid] {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // The kernel updates VmHWM only now and then: the peak is also sampled while it opens.
  pollfd opened{ready[0], POLLIN, 0};
  while (poll(&opened, 1, 1) == 0) r.peak = std::max(r.peak, StatusKiB(status(), "VmRSS") << 10);
  uint64_t said[2];
  if (read(ready[0], said, sizeof(said)) == sizeof(said)) {
    r.keys = said[0];
    r.index_bytes_per_key = said[1];
    const std::string now = status();
    r.rss = StatusKiB(now, "VmRSS") << 10;
    r.peak = std::max({r.peak, r.rss, StatusKiB(now, "VmHWM") << 10});
  }
  close(done[1]);
  close(ready[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  return r;
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
  test::TempDir empty;
  const Resident baseline = OpenInChildAndMeasure(options, empty.path());
  ASSERT_EQ(baseline.keys, 0u);
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
  const Resident opened = OpenInChildAndMeasure(options, dir);
  ASSERT_EQ(opened.keys, n);
  const double rss_per_key =
      static_cast<double>(opened.rss - baseline.rss) / static_cast<double>(n);
  const double peak_per_key =
      static_cast<double>(opened.peak - baseline.rss) / static_cast<double>(n);
  std::printf(
      "scale: measured from outside: %.1f B/key resident once open, %.1f B/key at the peak of "
      "the open (its stats: %llu B/key); baseline %.1f MiB\n",
      rss_per_key, peak_per_key, static_cast<unsigned long long>(opened.index_bytes_per_key),
      static_cast<double>(baseline.rss) / (1 << 20));
  EXPECT_LE(rss_per_key, 48.0);
  EXPECT_LE(peak_per_key, 1.5 * 48.0);
  EXPECT_LE(std::abs(rss_per_key - static_cast<double>(opened.index_bytes_per_key)),
            0.1 * rss_per_key);
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
    // Every bucket's index read: held a window of buckets at a time, so the peak stays
    // near what the map itself takes.
    const Resident scanned = OpenInChildAndMeasure(options, dir);
    ASSERT_EQ(scanned.keys, n);
    const double scan_peak =
        static_cast<double>(scanned.peak - baseline.rss) / static_cast<double>(n);
    std::printf(
        "scale: open without the checkpoint, from outside: %.1f B/key resident, %.1f B/key at the "
        "peak\n",
        static_cast<double>(scanned.rss - baseline.rss) / static_cast<double>(n), scan_peak);
    EXPECT_LE(scan_peak, 1.5 * 48.0);
    std::filesystem::remove(dir + "/SSDMAP");  // the child's GC may have written one
    start = std::chrono::steady_clock::now();
    ASSERT_TRUE(DB::Open(options, dir, &db).ok());
    std::printf("scale: open without the checkpoint (every bucket read): %.3f s\n", Seconds(start));
    EXPECT_EQ(test::StatOf(db.get(), "ssd.keys"), n);
  }
  ASSERT_TRUE(db->Close().ok());
}

}  // namespace
}  // namespace kvengine
