// The descriptor budget (env/descriptor_budget.h): a process with a low RLIMIT_NOFILE
// opens, reads and writes a DB of thousands of bucket files with the default
// max_open_files, and no call fails with EMFILE.  Each case runs in a child process
// (EXPECT_EXIT) that lowers its own limit; a failure prints what failed and exits 1.
#include <dirent.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

constexpr int kKeys = 2000;  // one bucket each

[[noreturn]] void Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void LowerLimit(rlim_t limit) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = std::min<rlim_t>(limit, rl.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) Fail("setrlimit", Status::IOError("failed"));
}

uint64_t OpenDescriptors() {
  uint64_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;
}

// Every put in a bucket of its own, the default max_open_files (1000), an owner's socket.
Options ManyBuckets(const std::string& dir) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 1 << 20;
  o.memory_slab_size = 64 << 10;
  o.prefault_memory = false;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  o.bucket_keys_limit = 1;
  o.gc_interval_ms = 0;
  o.promote_on_read = false;
  o.local_listen = dir + "/kv.sock";
  return o;
}

std::string Key(int i) { return "k" + std::to_string(i); }
std::string Value(int i) { return test::MakeValue(i, 600 + i % 700); }

// The budget holds: the cache within its clamped size, the process under its limit.
void CheckBudget(DB* db, rlim_t limit, const std::string& when) {
  const uint64_t open = test::StatOf(db, "ssd.open_files");
  const uint64_t max = test::StatOf(db, "ssd.max_open_files");
  if (max == 0 || max >= 1000 || open > max) {
    Fail(when + ": ssd.open_files " + std::to_string(open) + ", ssd.max_open_files " +
             std::to_string(max),
         Status::InvalidArgument("not within the budget"));
  }
  if (test::StatOf(db, "ssd.descriptor_limit") != limit) {
    Fail(when + ": ssd.descriptor_limit", Status::InvalidArgument("not the process's limit"));
  }
  if (OpenDescriptors() >= limit - 8) {
    Fail(when + ": " + std::to_string(OpenDescriptors()) + " descriptors open",
         Status::InvalidArgument("no headroom left"));
  }
}

void ReadAll(DB* db, int keys, const std::string& when) {
  for (int i = 0; i < keys; i++) {
    std::string got;
    Status s = db->Get(ReadOptions(), Key(i), &got);
    if (!s.ok() || got != Value(i)) Fail(when + ": get " + Key(i), s);
  }
}

// Under `limit`: writes keys [from, to) (one bucket each), reads every key, attaches
// four clients that read through the owner, reopens (through the map checkpoint, then
// with every bucket read), and reads every key again.
[[noreturn]] void UnderALimit(const std::string& dir, rlim_t limit, int from, int to) {
  LowerLimit(limit);
  const Options o = ManyBuckets(dir);
  std::unique_ptr<DB> db;
  Status s = DB::Open(o, dir, &db);
  if (!s.ok()) Fail("open", s);
  ReadAll(db.get(), from, "after open");
  for (int i = from; i < to; i++) {
    s = db->Put(WriteOptions(), Key(i), Value(i));
    if (!s.ok()) Fail("put " + Key(i), s);
  }
  s = db->Flush();
  if (!s.ok()) Fail("flush", s);
  ReadAll(db.get(), to, "after puts");
  CheckBudget(db.get(), limit, "after puts");
  {
    Options client;
    client.apply_environment = false;
    std::vector<std::unique_ptr<DB>> clients(4);
    for (auto& c : clients) {
      s = DB::Attach(client, o.local_listen, &c);
      if (!s.ok()) Fail("attach", s);
    }
    for (int i = 0; i < to; i += 7) {
      std::string got;
      s = clients[i % clients.size()]->Get(ReadOptions(), Key(i), &got);
      if (!s.ok() || got != Value(i)) Fail("attached get " + Key(i), s);
    }
    CheckBudget(db.get(), limit, "with attached clients");
  }
  for (bool checkpoint : {true, false}) {
    s = db->Close();
    if (!s.ok()) Fail("close", s);
    db.reset();
    if (!checkpoint) std::filesystem::remove(dir + "/SSDMAP");
    s = DB::Open(o, dir, &db);
    if (!s.ok()) Fail(checkpoint ? "reopen" : "reopen reading every bucket", s);
    ReadAll(db.get(), to, "after reopen");
    CheckBudget(db.get(), limit, "after reopen");
  }
  s = db->Close();
  if (!s.ok()) Fail("final close", s);
  std::_Exit(0);
}

TEST(DescriptorBudgetTest, ThousandsOfBucketsUnderLowLimits) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  // Written under 256, then opened, read and grown under 64 and 256 again.
  EXPECT_EXIT(UnderALimit(dir.path(), 256, 0, kKeys / 2), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(UnderALimit(dir.path(), 64, kKeys / 2, kKeys), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(UnderALimit(dir.path(), 256, kKeys, kKeys + 50), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvengine
