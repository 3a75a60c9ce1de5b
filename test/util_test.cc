// Status, option parsing and the environment-variable configuration.
#include <sys/mman.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/options.h"
#include "kvengine/status.h"
#include "util/buffers.h"
#include "util/call_gate.h"
#include "util/config_parse.h"
#include "util/grace_period.h"
#include "util/hash.h"
#include "util/huge_array.h"
#include "util/huge_block_pool.h"
#include "util/input_check.h"
#include "util/numa_arena.h"
#include "util/printable.h"
#include "util/region_map.h"
#include "util/stream_copy.h"
#include "util/worker_thread.h"

namespace kvengine {
namespace {

TEST(StatusTest, CodesAndMessages) {
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(Status::OK().ToString(), "OK");
  Status s = Status::NotFound("key 'a'");
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_EQ(s.ErrorCode(), -1);
  EXPECT_EQ(s.ToString(), "NotFound: key 'a'");
  EXPECT_EQ(Status::InvalidArgument("x", "y").message(), "x: y");
  EXPECT_EQ(Status::BufferTooSmall("b").ErrorCode(), -9);
  EXPECT_EQ(Status::NoSpace("n").ErrorCode(), -5);
  EXPECT_TRUE(Status::FromErrorCode(-5).IsNoSpace());
  EXPECT_TRUE(Status::FromErrorCode(-42).IsInvalidArgument());
  EXPECT_TRUE(Status::FromErrorCode(7).IsInvalidArgument());
  EXPECT_TRUE(Status::FromErrorCode(0).ok());
  Status copy = s;
  EXPECT_EQ(copy.ToString(), s.ToString());
  EXPECT_STREQ(Status::CodeName(Status::Code::kIOError), "io_error");
  // PermissionDenied travels as -10 (batch results, the peer protocol's batch status).
  Status denied = Status::PermissionDenied("namespace 'b'");
  EXPECT_EQ(denied.ErrorCode(), -10);
  EXPECT_EQ(denied.ToString(), "PermissionDenied: namespace 'b'");
  EXPECT_TRUE(Status::FromErrorCode(-10).IsPermissionDenied());
  EXPECT_STREQ(Status::CodeName(Status::Code::kPermissionDenied), "permission_denied");
}

// An error without a message is its code alone (no allocation: the misses said between
// the engine's layers are such errors); it behaves as any other status.
TEST(StatusTest, AnErrorWithoutAMessageIsItsCodeAlone) {
  for (int code = 1; code <= static_cast<int>(Status::kLastCode); code++) {
    const Status bare = Status::FromErrorCode(-code);
    EXPECT_FALSE(bare.ok());
    EXPECT_EQ(bare.ErrorCode(), -code);
    EXPECT_EQ(bare.message(), "");
    const std::string worded = Status::FromErrorCode(-code, "m").ToString();  // "Code: m"
    EXPECT_EQ(bare.ToString(), worded.substr(0, worded.size() - 1));
  }
  Status bare = Status::NotFound({});
  EXPECT_TRUE(bare.IsNotFound());
  EXPECT_EQ(bare.ToString(), "NotFound: ");
  Status copy = bare;
  EXPECT_TRUE(copy.IsNotFound());
  Status moved = std::move(copy);
  EXPECT_TRUE(moved.IsNotFound());
  EXPECT_TRUE(copy.ok());  // NOLINT(bugprone-use-after-move): a moved-from status is OK
  // Assignments between the two kinds, both ways (ASan checks nothing leaks).
  Status worded = Status::Corruption("bytes");
  worded = bare;
  EXPECT_TRUE(worded.IsNotFound());
  EXPECT_EQ(worded.message(), "");
  worded = Status::IOError("disk");
  EXPECT_EQ(worded.ToString(), "IOError: disk");
  bare = worded;
  EXPECT_EQ(bare.ToString(), "IOError: disk");
  bare = std::move(worded);
  EXPECT_EQ(bare.ToString(), "IOError: disk");
  bare = Status::Busy({});
  EXPECT_TRUE(bare.IsBusy());
  const Status& same = bare;
  bare = same;  // self-assignment keeps it
  EXPECT_TRUE(bare.IsBusy());
}

TEST(ConfigParseTest, Sizes) {
  uint64_t v = 0;
  ASSERT_TRUE(ParseSize("4096", &v).ok());
  EXPECT_EQ(v, 4096u);
  ASSERT_TRUE(ParseSize("64MiB", &v).ok());
  EXPECT_EQ(v, 64ull << 20);
  ASSERT_TRUE(ParseSize(" 2GiB ", &v).ok());
  EXPECT_EQ(v, 2ull << 30);
  ASSERT_TRUE(ParseSize("1.5KiB", &v).ok());
  EXPECT_EQ(v, 1536u);
  ASSERT_TRUE(ParseSize("10MB", &v).ok());
  EXPECT_EQ(v, 10000000u);
  ASSERT_TRUE(ParseSize("0", &v).ok());
  EXPECT_EQ(v, 0u);
  for (const char* bad : {"", "abc", "12XB", "-1", "1.3B", "0.1", "1..2MiB", "99999999999999999999",
                          "20000000TiB", "MiB"}) {
    v = 7;
    EXPECT_FALSE(ParseSize(bad, &v).ok()) << bad;
    EXPECT_EQ(v, 7u) << bad;
  }
}

TEST(ConfigParseTest, RatiosBoolsIntsEnums) {
  double d = 0;
  ASSERT_TRUE(ParseRatio("0.25", &d).ok());
  EXPECT_DOUBLE_EQ(d, 0.25);
  ASSERT_TRUE(ParseRatio("1", &d).ok());
  EXPECT_FALSE(ParseRatio("1.5", &d).ok());
  EXPECT_FALSE(ParseRatio("-0.1", &d).ok());
  EXPECT_FALSE(ParseRatio("nan", &d).ok());
  bool b = false;
  ASSERT_TRUE(ParseBool("YES", &b).ok());
  EXPECT_TRUE(b);
  ASSERT_TRUE(ParseBool("off", &b).ok());
  EXPECT_FALSE(b);
  EXPECT_FALSE(ParseBool("maybe", &b).ok());
  int64_t i = 0;
  ASSERT_TRUE(ParseInt("-12", &i).ok());
  EXPECT_EQ(i, -12);
  EXPECT_FALSE(ParseInt("0.25", &i).ok());
  EXPECT_FALSE(ParseInt("12abc", &i).ok());
  uint64_t u = 0;
  EXPECT_FALSE(ParseUInt("-3", &u).ok());
  int e = -1;
  ASSERT_TRUE(ParseEnum("NONE", {"lru", "none"}, &e).ok());
  EXPECT_EQ(e, 1);
  Status s = ParseEnum("fifo", {"lru", "none"}, &e);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lru|none"), std::string::npos);
}

TEST(OptionsTest, SetByName) {
  Options o;
  ASSERT_TRUE(o.Set("memory_capacity_bytes", "64MiB").ok());
  EXPECT_EQ(o.memory_capacity_bytes, 64ull << 20);
  ASSERT_TRUE(o.Set("memory_eviction", "none").ok());
  EXPECT_EQ(o.memory_eviction, MemoryEviction::kNone);
  Status s = o.Set("memory_capacity_bytes", "0.25");
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("memory_capacity_bytes"), std::string::npos);
  EXPECT_NE(s.message().find("0.25"), std::string::npos);
  EXPECT_EQ(o.memory_capacity_bytes, 64ull << 20);  // unchanged
  EXPECT_TRUE(o.Set("no_such_option", "1").IsInvalidArgument());
  EXPECT_NE(o.ToString().find("memory_eviction=none"), std::string::npos);
  EXPECT_FALSE(Options::SettableNames().empty());
}

class EnvVarTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const auto& name : Options::SettableNames()) {
      std::string var = "KVENGINE_";
      for (char c : name) var += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      unsetenv(var.c_str());
    }
  }
};

TEST_F(EnvVarTest, UnsetLeavesDefaults) {
  Options o;
  ASSERT_TRUE(o.ApplyEnvironment().ok());
  EXPECT_EQ(o.memory_capacity_bytes, Options().memory_capacity_bytes);
}

TEST_F(EnvVarTest, ValidValuesApply) {
  setenv("KVENGINE_MEMORY_CAPACITY_BYTES", "32MiB", 1);
  setenv("KVENGINE_USE_HUGE_PAGES", "off", 1);
  setenv("KVENGINE_MEMORY_EVICTION", "NONE", 1);
  Options o;
  ASSERT_TRUE(o.ApplyEnvironment().ok());
  EXPECT_EQ(o.memory_capacity_bytes, 32ull << 20);
  EXPECT_FALSE(o.use_huge_pages);
  EXPECT_EQ(o.memory_eviction, MemoryEviction::kNone);
}

TEST_F(EnvVarTest, MalformedValueNamesVariableAndChangesNothing) {
  setenv("KVENGINE_USE_HUGE_PAGES", "false", 1);
  setenv("KVENGINE_MEMORY_CAPACITY_BYTES", "lots", 1);
  Options o;
  Status s = o.ApplyEnvironment();
  ASSERT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("KVENGINE_MEMORY_CAPACITY_BYTES"), std::string::npos);
  EXPECT_NE(s.message().find("lots"), std::string::npos);
  EXPECT_TRUE(o.use_huge_pages);  // all or nothing: the valid variable did not apply
}

TEST_F(EnvVarTest, EmptyValueIsMalformedNotDefault) {
  setenv("KVENGINE_MAX_KEY_SIZE", "", 1);
  Options o;
  EXPECT_TRUE(o.ApplyEnvironment().IsInvalidArgument());
}

TEST(OptionsTest, Validate) {
  Options o;
  EXPECT_TRUE(o.Validate().ok());
  o.memory_slab_size = 3 << 20;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
  o = Options();
  o.memory_capacity_bytes = 1 << 20;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
  o = Options();
  o.index_shards = 0;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
}

TEST(PrintableTest, EscapesUnprintableBytesQuotesAndBackslashesAndCutsAt64) {
  EXPECT_EQ(Printable(Slice("layer.0")), "'layer.0'");
  EXPECT_EQ(Printable(Slice("")), "''");
  EXPECT_EQ(Printable(Slice("a\0b", 3)), "'a\\x00b'");
  EXPECT_EQ(Printable(Slice("\xfe\x7f\x1f\x20~\\'")), "'\\xfe\\x7f\\x1f ~\\x5c\\x27'");
  std::string all;
  for (int c = 0; c < 256; c++) all += static_cast<char>(c);
  const std::string shown = Printable(Slice(all));
  EXPECT_EQ(shown.substr(0, 9), "'\\x00\\x01");
  EXPECT_NE(shown.find("\\x1e\\x1f !\"#$%&\\x27()"), std::string::npos) << shown;
  // bytes 0 to 63, then "...", the length and the hash
  EXPECT_NE(shown.find("<=>?...' (256 bytes, hash " + KeyDigest(Slice(all)).substr(16) + ")"),
            std::string::npos)
      << shown;
  EXPECT_EQ(Printable(Slice(std::string(64, 'k'))), "'" + std::string(64, 'k') + "'");
  const std::string k65(65, 'k');
  EXPECT_EQ(Printable(Slice(k65)),
            "'" + std::string(64, 'k') + "...' (" + KeyDigest(Slice(k65)) + ")");
}

// A long key in a message or a log line: its first 64 bytes, its length and its hash,
// which tell it from another key that begins alike (issue #49 item 4: a 64 KiB key
// filled a log line).
TEST(PrintableTest, ALongKeyShowsItsLengthAndHashNotItsBytes) {
  const std::string a = std::string(65536, 'k') + "a", b = std::string(65536, 'k') + "b";
  const std::string shown = Printable(Slice(a));
  EXPECT_LT(shown.size(), 64u + 64u);
  EXPECT_NE(shown.find("(65537 bytes, hash "), std::string::npos) << shown;
  EXPECT_NE(Printable(Slice(b)), shown);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Hash64(a)));
  EXPECT_EQ(KeyDigest(Slice(a)), "65537 bytes, hash " + std::string(hex));
  const Status miss = KeyNotFound(Slice(a), "tenant");
  EXPECT_LT(miss.ToString().size(), 200u) << miss.ToString();
  EXPECT_NE(miss.ToString().find(shown + " (namespace tenant)"), std::string::npos)
      << miss.ToString();
}

// ShowsWholeKey agrees with Printable: every key of up to 64 bytes is shown by what
// Printable prints between its quotes and by nothing else close to it.
TEST(PrintableTest, ShowsWholeKeyIsPrintablesInverse) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 2000; round++) {
    std::string key(rng() % 65, '\0');
    for (char& c : key) c = static_cast<char>(rng() % 4 == 0 ? rng() : 'a' + rng() % 26);
    const std::string shown = Printable(Slice(key));
    const std::string_view inside(shown.data() + 1, shown.size() - 2);
    ASSERT_TRUE(ShowsWholeKey(inside, Slice(key))) << shown;
    if (!key.empty()) {
      EXPECT_FALSE(ShowsWholeKey(inside.substr(0, inside.size() - 1), Slice(key))) << shown;
      std::string other = key;
      other[rng() % other.size()] ^= static_cast<char>(1 + rng() % 255);
      EXPECT_FALSE(ShowsWholeKey(inside, Slice(other))) << shown;
    }
    EXPECT_FALSE(ShowsWholeKey(std::string(inside) + "x", Slice(key))) << shown;
  }
  EXPECT_TRUE(ShowsWholeKey("a\\x27b", Slice("a'b")));
  EXPECT_FALSE(ShowsWholeKey("a'b", Slice("a'b")));  // a quote is always escaped
  EXPECT_FALSE(ShowsWholeKey(std::string(64, 'k') + "...", Slice(std::string(65, 'k'))));
}

TEST(PrintableTest, KeyNotFoundNamesTheKeyAndItsNamespace) {
  EXPECT_EQ(KeyNotFound(Slice("a\0b", 3)).ToString(), "NotFound: key 'a\\x00b'");
  EXPECT_EQ(KeyNotFound(Slice("k"), "tenant-a").ToString(),
            "NotFound: key 'k' (namespace tenant-a)");
  const std::string long_key(100, 'k');
  EXPECT_EQ(KeyNotFound(Slice(long_key), std::string(64, 'n')).message(),
            "key " + Printable(Slice(long_key)) + " (namespace " + std::string(64, 'n') + ")");
  // Every byte escaped: the longest key shown, in the longest name.
  const std::string worst(64, '\xff');
  EXPECT_EQ(KeyNotFound(Slice(worst), std::string(64, 'n')).message(),
            "key " + Printable(Slice(worst)) + " (namespace " + std::string(64, 'n') + ")");
  // A name is at most 64 bytes: one longer (never a namespace's) is cut, not overrun.
  EXPECT_EQ(KeyNotFound(Slice("k"), std::string(200, 'n')).message(),
            "key 'k' (namespace " + std::string(64, 'n') + ")");
}

TEST(HashTest, SameValuesAsPlainXxh3) {
  // Bucket files and frames store these checksums: the run-time dispatched XXH3 must
  // give the reference implementation's values for every length class.
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<char>(i * 131 + (i >> 9));
  for (size_t n : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 4096, 65537, 1 << 20, 3 << 20}) {
    EXPECT_EQ(Hash64(data.data(), n), XXH3_64bits(data.data(), n)) << n;
    Hasher64 h;
    h.Update(data.data(), n / 3);
    h.Update(data.data() + n / 3, n - n / 3);
    EXPECT_EQ(h.Digest(), XXH3_64bits(data.data(), n)) << n;
  }
  EXPECT_EQ(Hash64("", 0), 0x2D06800538D394C2ull);  // XXH3-64 of nothing, seed 0
}

TEST(HashTest, IncrementalEqualsOneShot) {
  std::string data(100000, 'x');
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<char>(i * 31);
  Hasher64 h;
  h.Update(data.data(), 12345);
  h.Update(data.data() + 12345, data.size() - 12345);
  EXPECT_EQ(h.Digest(), Hash64(data));
  EXPECT_NE(Hash64("a"), Hash64("b"));
}

TEST(WorkerThreadTest, TasksRunInOrderOffTheCallersThread) {
  WorkerThread worker;
  std::vector<int> order;  // touched by the worker only, until Drain returns
  std::thread::id where;
  for (int i = 0; i < 100; i++) {
    worker.Submit([&order, &where, i] {
      order.push_back(i);
      where = std::this_thread::get_id();
    });
  }
  worker.Drain();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; i++) EXPECT_EQ(order[i], i);
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(WorkerThreadTest, WhatATaskCapturedIsDestroyedOnTheWorker) {
  struct Tracker {
    std::thread::id* where;
    ~Tracker() { *where = std::this_thread::get_id(); }
  };
  std::thread::id where;
  WorkerThread worker;
  auto tracked = std::make_shared<Tracker>(Tracker{&where});
  worker.Submit([t = std::move(tracked)]() mutable { t.reset(); });
  worker.Drain();
  EXPECT_NE(where, std::thread::id());
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(WorkerThreadTest, DestructorRunsEverythingQueued) {
  std::atomic<int> ran{0};
  {
    WorkerThread worker;
    for (int i = 0; i < 100; i++) {
      worker.Submit([&ran] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ran.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(ran.load(), 100);
}

// GracePeriod::Wait() on a thread of its own; done() once it has returned.
class BackgroundWait {
 public:
  explicit BackgroundWait(GracePeriod* period)
      : thread_([this, period] {
          period->Wait();
          done_ = true;
        }) {}
  ~BackgroundWait() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(GracePeriodTest, WaitsForReadersThatEnteredBeforeIt) {
  GracePeriod period;
  const int early = period.Enter();
  BackgroundWait waiter(&period);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(waiter.done());  // the early reader is still in
  period.Exit(early);
  waiter.Join();
  EXPECT_TRUE(waiter.done());
}

TEST(GracePeriodTest, DoesNotWaitForReadersThatEnteredAfterIt) {
  GracePeriod period;
  const int early = period.Enter();
  BackgroundWait waiter(&period);
  // A reader arriving once the wait has begun lands in the new epoch.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int late = period.Enter();
  EXPECT_NE(late, early);
  period.Exit(early);
  waiter.Join();  // returns while `late` is still in
  EXPECT_TRUE(waiter.done());
  // And the next wait does wait for it.
  BackgroundWait again(&period);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(again.done());
  period.Exit(late);
  again.Join();
  EXPECT_TRUE(again.done());
}

TEST(GracePeriodTest, WaitWithNoReadersReturnsAtOnce) {
  GracePeriod period;
  period.Wait();
  { GracePeriodReader r(&period); }
  period.Wait();
  period.Wait();
}

TEST(CallGateTest, CloseWaitsForTheCallsInsideAndRefusesLaterOnes) {
  CallGate gate;
  ASSERT_TRUE(gate.Enter());
  ASSERT_TRUE(gate.Enter());
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    gate.Close();
    closed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(closed.load());  // two calls are still inside
  if (gate.Enter()) {           // no new call may get in
    ADD_FAILURE() << "a call entered a closing gate";
    gate.Exit();
  }
  gate.Exit();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(closed.load());  // one is
  gate.Exit();
  closer.join();
  EXPECT_TRUE(closed.load());
  EXPECT_TRUE(gate.closed());
  if (gate.Enter()) {
    ADD_FAILURE() << "a call entered a closed gate";
    gate.Exit();
  }
  gate.Close();  // again: nothing inside, returns at once
}

TEST(CallGateTest, NoCallRunsAfterCloseReturnsWhateverTheInterleaving) {
  // Callers enter and exit as fast as they can while the gate closes: once Close()
  // returns, no caller may be inside or get in (the Dekker pair of count and flag).
  for (int round = 0; round < 50; round++) {
    CallGate gate;
    std::atomic<bool> closed{false};
    std::atomic<int> inside_after_close{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; t++) {
      callers.emplace_back([&] {
        for (int i = 0; i < 2000; i++) {
          CallGateEntry entry(&gate);
          if (entry.entered() && closed.load()) inside_after_close.fetch_add(1);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (round % 5)));
    gate.Close();
    closed = true;
    for (auto& t : callers) t.join();
    EXPECT_EQ(inside_after_close.load(), 0) << "round " << round;
  }
}

// A shared arena and a second mapping of its memfd (as an attached client maps it) are
// 2 MiB-aligned, so huge pages -- given by MADV_COLLAPSE where the kernel allows, which
// the backing reports -- map as such in both; the bytes are the same memory.
TEST(NumaArenaTest, SharedArenaIsAlignedAndMapsTwice) {
  NumaArena::Params params;
  params.size = 8u << 20;
  params.huge_pages = true;
  params.shared = true;
  std::unique_ptr<NumaArena> arena;
  ASSERT_TRUE(NumaArena::Create(params, nullptr, &arena).ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena->base()) % (2u << 20), 0u);
  const std::string backing = arena->backing();
  EXPECT_TRUE(backing == "thp" || backing == "4k" || backing == "hugetlb") << backing;
  void* p = MapSharedAligned(arena->fd(), arena->size());
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (2u << 20), 0u);
  char* other = static_cast<char*>(p);
  for (size_t off = 0; off < arena->size(); off += 1 << 20) arena->base()[off] = 'a' + off % 26;
  for (size_t off = 0; off < arena->size(); off += 1 << 20) {
    EXPECT_EQ(other[off], static_cast<char>('a' + off % 26)) << off;
  }
  ::munmap(p, arena->size());
}

// Blocks are distinct and 8-aligned in chunks of whole huge pages; freed blocks are reused
// before a chunk is added, and a pool whose blocks are all freed keeps one spare chunk
// mapped, whatever the order of the frees.
// The process's resident memory (VmRSS), in bytes.
uint64_t ResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) << 10;
  }
  return 0;
}

TEST(HugeArrayTest, BigArraysAreZeroedAndAligned) {
  for (size_t n : {size_t{1}, size_t{4096}, (size_t{3} << 20) + 123}) {
    HugeArray<uint64_t> a = NewZeroedHugeArray<uint64_t>(n);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(a[i], 0u) << i;
    if (n * sizeof(uint64_t) >= (size_t{2} << 20)) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % (size_t{2} << 20), 0u);
    }
    std::memset(a.get(), 0xab, n * sizeof(uint64_t));  // all of it is writable
  }
}

// A table that grows by 10% at a time (the SSD tier's map shards) frees each old array:
// from the heap, those arrays stayed resident as holes (at 5M SSD keys the resident
// memory per key was nearly twice the table's); mapped on their own, they go back.
TEST(HugeArrayTest, ATableThatGrowsGivesItsOldArraysBack) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory is resident too: measured in plain builds";
#endif
  const uint64_t before = ResidentBytes();
  HugeArray<char> table;
  size_t bytes = 1 << 20;
  for (int step = 0; step < 30; step++, bytes = bytes * 11 / 10) {
    HugeArray<char> grown = NewZeroedHugeArray<char>(bytes);
    std::memset(grown.get(), 1, bytes);  // touched, as a table's slots are
    table = std::move(grown);
  }
  const uint64_t table_bytes = bytes * 10 / 11;
  const uint64_t resident = ResidentBytes() - std::min(before, ResidentBytes());
  EXPECT_LE(resident, table_bytes + (table_bytes / 4))
      << "resident " << resident << " for a table of " << table_bytes;
}

TEST(HugeBlockPoolTest, ReusesBlocksAndUnmapsEmptyChunks) {
  for (size_t block_size : {size_t{16}, size_t{48} * 8192, size_t{3} << 20, size_t{20} << 20}) {
    HugeBlockPool pool(block_size);
    EXPECT_EQ(pool.chunk_size() % (2u << 20), 0u) << block_size;
    const size_t per_chunk = (pool.chunk_size() - 64) / block_size;
    ASSERT_GE(per_chunk, 1u) << block_size;
    const size_t n = block_size < 4096 ? 3 * per_chunk + 5 : 3 * per_chunk;
    std::vector<char*> blocks;
    std::set<char*> distinct;
    for (size_t i = 0; i < n; i++) {
      char* b = static_cast<char*>(pool.Allocate());
      ASSERT_EQ(reinterpret_cast<uintptr_t>(b) % 8, 0u);
      b[0] = 'x';
      b[block_size - 1] = 'y';  // the whole block is writable
      blocks.push_back(b);
      distinct.insert(b);
    }
    EXPECT_EQ(distinct.size(), n);
    const size_t chunks = (n + per_chunk - 1) / per_chunk;
    EXPECT_EQ(pool.mapped_bytes(), chunks * pool.chunk_size()) << block_size;

    // Free a random half and allocate as many again: no chunk is added.
    std::mt19937_64 rng(block_size);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (size_t i = 0; i < n / 2; i++) pool.Free(blocks[i]);
    for (size_t i = 0; i < n / 2; i++) blocks[i] = static_cast<char*>(pool.Allocate());
    EXPECT_LE(pool.mapped_bytes(), chunks * pool.chunk_size()) << block_size;

    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (char* b : blocks) pool.Free(b);
    EXPECT_EQ(pool.mapped_bytes(), pool.chunk_size()) << block_size;  // the spare
    // Allocating across a chunk boundary and back maps nothing new.
    for (int round = 0; round < 3; round++) {
      void* b = pool.Allocate();
      EXPECT_EQ(pool.mapped_bytes(), pool.chunk_size());
      pool.Free(b);
    }
  }
}

// Streaming stores need a 32-byte-aligned destination and move 128 bytes a step: every
// alignment of either side and every length around those steps must copy exactly, and
// write nothing past the end.
TEST(StreamCopyTest, CopiesEveryAlignmentAndLengthExactly) {
  std::mt19937_64 rng(7);
  std::vector<char> src(kStreamingCopyMin * 2 + 512), dst(src.size() + 512);
  for (char& c : src) c = static_cast<char>(rng());
  const size_t lengths[] = {0,
                            1,
                            31,
                            32,
                            127,
                            128,
                            129,
                            4095,
                            kStreamingCopyMin - 1,
                            kStreamingCopyMin,
                            kStreamingCopyMin + 1,
                            kStreamingCopyMin + 97,
                            2 * kStreamingCopyMin};
  for (size_t n : lengths) {
    for (size_t src_off : {0, 1, 17, 32, 63}) {
      for (size_t dst_off : {0, 3, 16, 31, 64}) {
        std::fill(dst.begin(), dst.end(), '\x5a');
        StreamingCopy(dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0)
            << n << " " << src_off << " " << dst_off;
        for (size_t i = 0; i < dst_off; i++) ASSERT_EQ(dst[i], '\x5a');
        for (size_t i = dst_off + n; i < dst.size(); i++) ASSERT_EQ(dst[i], '\x5a') << n;
        std::fill(dst.begin(), dst.end(), '\x5a');
        CopyValue(dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0);
      }
    }
  }
}

// A get's copy goes backwards exactly when memcpy would alias (the destination 1-63
// bytes past the source within a page, 2 KiB or more), and copies every byte either
// way, writing nothing outside the destination.
TEST(StreamCopyTest, FetchCopyIsExactAtEveryOffsetFromTheSource) {
  std::mt19937_64 rng(9);
  alignas(4096) static char src[3 * 4096 + 4096];
  static char dst[sizeof(src) + 8192];
  for (char& c : src) c = static_cast<char>(rng());
  char* const page =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(dst) + 4095) & ~uintptr_t{4095});
  EXPECT_FALSE(AliasesForward(page, src, 1 << 20));
  EXPECT_TRUE(AliasesForward(page + 16, src, 2048));
  EXPECT_FALSE(AliasesForward(page + 16, src, 2047));
  EXPECT_FALSE(AliasesForward(page + 64, src, 1 << 20));
  EXPECT_FALSE(AliasesForward(page + 4080, src, 1 << 20));  // behind: forward is fine
  for (size_t n : {0, 1, 127, 128, 129, 2047, 2048, 2049, 4096, 3 * 4096 + 77}) {
    for (size_t src_off : {0, 5, 32}) {
      for (size_t dst_off : {0, 1, 8, 16, 24, 31, 63, 64, 100}) {
        char* to = page + src_off + dst_off;
        std::memset(dst, 0x5a, sizeof(dst));
        FetchCopy(to, src + src_off, n);
        ASSERT_EQ(std::memcmp(to, src + src_off, n), 0) << n << " " << src_off << " " << dst_off;
        for (char* p = dst; p < to; p++) ASSERT_EQ(*p, '\x5a');
        for (char* p = to + n; p < dst + sizeof(dst); p++) ASSERT_EQ(*p, '\x5a') << n;
        std::memset(dst, 0x5a, sizeof(dst));
        BackwardCopy(to, src + src_off, n);
        ASSERT_EQ(std::memcmp(to, src + src_off, n), 0) << n << " " << src_off << " " << dst_off;
        for (char* p = to + n; p < dst + sizeof(dst); p++) ASSERT_EQ(*p, '\x5a') << n;
      }
    }
  }
}

// A large value in parts, gathered into one buffer and scattered back over others of
// odd sizes, streaming, comes back byte for byte.
TEST(StreamCopyTest, LargeValuesGatherAndScatterAcrossParts) {
  std::mt19937_64 rng(8);
  const size_t size = 3 * kStreamingCopyMin + 333;
  std::vector<char> value(size);
  for (char& c : value) c = static_cast<char>(rng());
  const std::vector<Slice> parts{Slice(value.data(), 1000), Slice(value.data() + 1000, 0),
                                 Slice(value.data() + 1000, size - 1000)};
  std::vector<char> gathered(size);
  GatherCopy(parts, size, gathered.data());
  ASSERT_EQ(std::memcmp(gathered.data(), value.data(), size), 0);
  std::vector<char> a(77777), b(size - 77777 + 10);
  const std::vector<MutableSlice> dest{MutableSlice(a.data(), a.size()),
                                       MutableSlice(b.data(), b.size())};
  ScatterCopy(gathered.data(), size, dest);
  ASSERT_EQ(std::memcmp(a.data(), value.data(), a.size()), 0);
  ASSERT_EQ(std::memcmp(b.data(), value.data() + a.size(), size - a.size()), 0);
}

// db.h's input rules, written once (util/input_check.h): each failure names the problem.
TEST(InputCheckTest, EachRuleNamesTheProblem) {
  EXPECT_TRUE(input::CheckKey("k", 8).ok());
  EXPECT_EQ(input::CheckKey("", 8).message(), "key is empty");
  EXPECT_NE(
      input::CheckKey("a long key", 8).message().find("exceeds max_key_size (8): 'a long key'"),
      std::string::npos);
  EXPECT_NE(
      input::CheckValueSize("k", 9, 8).message().find("value of key 'k' exceeds max_value_size"),
      std::string::npos);
  std::vector<int64_t> results;
  EXPECT_EQ(input::CheckBatch("BatchPut", nullptr, 1, 1, "values", 0).message(),
            "BatchPut: results pointer is null");
  EXPECT_EQ(input::CheckBatch("BatchPut", &results, 2, 1, "values", 0).message(),
            "batch has 2 keys but 1 values");
  EXPECT_EQ(input::CheckBatch("BatchGetInto", &results, 3, 3, "destinations", 2).message(),
            "batch of 3 keys exceeds max_batch_size (2)");
  EXPECT_TRUE(input::CheckBatch("BatchGetInto", &results, 3, 3, "destinations", 0).ok());
  const std::vector<Slice> keys{"a", "b", "a"};
  EXPECT_EQ(input::CheckUniqueKeys(keys).message(),
            "BatchPut names key 'a' more than once; nothing was written");
  EXPECT_TRUE(input::CheckUniqueKeys(std::span<const Slice>(keys.data(), 2)).ok());
}

// Batches past the table kept on the stack, and the key named: the first one, in batch
// order, that an earlier key repeats.
TEST(InputCheckTest, UniqueKeysInBatchesOfAnySize) {
  for (size_t n : {2, 3, 64, 127, 128, 129, 1000, 5000}) {
    std::vector<std::string> names;
    for (size_t i = 0; i < n; i++) names.push_back("key-" + std::to_string(i));
    names.push_back(std::string("\0", 1));
    names.push_back("");
    std::vector<Slice> keys(names.begin(), names.end());
    EXPECT_TRUE(input::CheckUniqueKeys(keys).ok()) << n;
    keys.push_back(Slice(names[n / 2]));
    keys.push_back(Slice(names[0]));
    EXPECT_EQ(input::CheckUniqueKeys(keys).message(),
              "BatchPut names key '" + names[n / 2] + "' more than once; nothing was written")
        << n;
    keys.insert(keys.begin() + 1, Slice(""));  // now the empty key repeats first
    EXPECT_EQ(input::CheckUniqueKeys(keys).message(),
              "BatchPut names key '' more than once; nothing was written")
        << n;
  }
}

TEST(RegionMapTest, RefusesOverlapsAndGivesBackWhatItHolds) {
  RegionMap map;
  char buf[64];
  ASSERT_TRUE(map.Add(buf, 16, "RegisterBuffer").ok());
  ASSERT_TRUE(map.Add(buf + 16, 16, "RegisterBuffer").ok());  // adjacent: no overlap
  EXPECT_EQ(map.Add(buf + 8, 4, "RegisterBuffer").message(),
            "RegisterBuffer: region overlaps a registered one");
  EXPECT_EQ(map.Add(buf + 31, 8, "RegisterBuffer").message(),
            "RegisterBuffer: region overlaps a registered one");
  EXPECT_EQ(map.Add(nullptr, 8, "RegisterBuffer").message(), "RegisterBuffer: address is null");
  EXPECT_EQ(map.Add(buf, 0, "RegisterBuffer").message(), "RegisterBuffer: length is zero");
  EXPECT_EQ(map.Remove(buf + 1), 0u);
  EXPECT_EQ(map.Remove(buf), 16u);
  EXPECT_EQ(map.size(), 1u);
  const auto all = map.TakeAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].first, buf + 16);
  EXPECT_EQ(map.size(), 0u);
}

}  // namespace
}  // namespace kvengine
