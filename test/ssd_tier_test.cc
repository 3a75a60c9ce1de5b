// The SSD tier end to end through the DB: offload, reads from SSD, deletes and
// tombstones, GC, recovery, space limits and injected faults.
#include "db/ssd_tier.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "env/fault_injection_env.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "table/bucket_reader.h"
#include "test/bucket_test_util.h"
#include "test/test_util.h"
#include "util/coding.h"
#include "util/hash.h"
#include "util/logging.h"

namespace kvengine {
namespace {

constexpr size_t kValue = 64 << 10;

uint64_t Stat(DB* db, const std::string& name) {
  std::string text;
  EXPECT_TRUE(db->GetProperty("kvengine.stats", &text));
  const std::string needle = name + ": ";
  size_t pos = text.find(needle);
  if (pos == std::string::npos) {
    ADD_FAILURE() << "no stat " << name;
    return 0;
  }
  return std::stoull(text.substr(pos + needle.size()));
}

class SsdTierTest : public ::testing::Test {
 protected:
  SsdTierTest() {
    options_.apply_environment = false;
    options_.memory_capacity_bytes = 1 << 20;  // 16 values of 64 KiB
    options_.memory_slab_size = 64 << 10;
    options_.bucket_keys_limit = 4;
    options_.bucket_size_limit = 1 << 20;
    options_.gc_interval_ms = 0;  // GC only when the test asks
    options_.promote_on_read = false;
  }
  // The DB goes first: its threads may use an Env the test owns.
  void TearDown() override {
    if (db_) db_->Close();
    db_.reset();
  }
  void Open() {
    db_.reset();
    Status s = DB::Open(options_, dir_.path(), &db_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void Reopen() {
    ASSERT_TRUE(db_->Close().ok());
    Open();
  }
  void Put(const std::string& key, const std::string& value) {
    Status s = db_->Put(WriteOptions(), key, value);
    ASSERT_TRUE(s.ok()) << key << ": " << s.ToString();
  }
  std::string Get(const std::string& key) {
    std::string v;
    Status s = db_->Get(ReadOptions(), key, &v);
    return s.ok() ? v : s.IsNotFound() ? "<absent>" : s.ToString();
  }
  // Pushes everything written so far out of memory (onto SSD, under write-back).
  void SpillMemory() {
    for (int i = 0; i < 32; i++)
      Put("filler." + std::to_string(filler_++), std::string(kValue, 'f'));
    ASSERT_TRUE(db_->Flush().ok());
  }

  // Puts prefix.0 .. prefix.<count-1>, value i of seed + i and kValue - shrink * i bytes;
  // returns what was put.
  std::map<std::string, std::string> PutNumbered(const std::string& prefix, int count,
                                                 uint64_t seed, size_t shrink) {
    std::map<std::string, std::string> put;
    for (int i = 0; i < count; i++) {
      const std::string key = prefix + "." + std::to_string(i);
      put[key] = test::MakeValue(seed + i, kValue - shrink * i);
      Put(key, put[key]);
    }
    return put;
  }

  // Every file through fault_env_ (io_uring would bypass it), every put on SSD,
  // tombstones synced only when the test says.
  void UseFaultEnvWriteThrough() {
    options_.env = &fault_env_;
    options_.use_io_uring = false;
    options_.offload_policy = OffloadPolicy::kWriteThrough;
    options_.tombstone_sync_interval_ms = 0;
  }

  test::TempDir dir_;
  Options options_;
  FaultInjectionEnv fault_env_{Env::Default()};  // declared before db_, so it outlives it
  std::unique_ptr<DB> db_;
  int filler_ = 0;
};

TEST_F(SsdTierTest, EvictedValuesAreReadBackFromSsd) {
  Open();
  std::vector<std::string> values;
  for (int i = 0; i < 40; i++) {
    values.push_back(test::MakeValue(i, kValue - 1000 + i * 37));
    Put("k" + std::to_string(i), values.back());
  }
  ASSERT_TRUE(db_->Flush().ok());
  EXPECT_GT(Stat(db_.get(), "ssd.offloads"), 20u);
  EXPECT_GT(Stat(db_.get(), "ssd.bucket_writes"), 3u);
  for (int i = 0; i < 40; i++) EXPECT_TRUE(Get("k" + std::to_string(i)) == values[i]) << i;
  EXPECT_GT(Stat(db_.get(), "ssd.hits"), 20u);
  // Batched: all SSD misses of one call in one submission, scattered into two buffers.
  std::vector<Slice> keys;
  std::vector<std::string> a(40, std::string(30000, '\0')), b(40, std::string(kValue, '\0'));
  std::vector<Destination> dests;
  std::vector<std::string> names;
  for (int i = 0; i < 40; i++) names.push_back("k" + std::to_string(i));
  for (int i = 0; i < 40; i++) {
    keys.emplace_back(names[i]);
    dests.push_back(
        {MutableSlice(a[i].data(), a[i].size()), MutableSlice(b[i].data(), b[i].size())});
  }
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), keys, dests, &results).ok());
  for (int i = 0; i < 40; i++) {
    ASSERT_EQ(results[i], static_cast<int64_t>(values[i].size())) << i;
    std::string joined = a[i] + b[i].substr(0, values[i].size() - a[i].size());
    EXPECT_TRUE(joined == values[i]) << i;
  }
  std::vector<int64_t> exists;
  ASSERT_TRUE(db_->BatchExists(keys, &exists).ok());
  for (int64_t e : exists) EXPECT_EQ(e, 1);
}

TEST_F(SsdTierTest, PromotionBringsValuesBackToMemory) {
  options_.promote_on_read = true;
  Open();
  const std::string v = test::MakeValue(9, kValue);
  Put("hot", v);
  SpillMemory();
  const uint64_t hits_before = Stat(db_.get(), "ssd.hits");
  EXPECT_TRUE(Get("hot") == v);
  EXPECT_EQ(Stat(db_.get(), "ssd.hits"), hits_before + 1);
  EXPECT_EQ(Stat(db_.get(), "promotions"), 1u);
  EXPECT_TRUE(Get("hot") == v);  // now from memory
  EXPECT_EQ(Stat(db_.get(), "ssd.hits"), hits_before + 1);
}

TEST_F(SsdTierTest, DeleteGcKeepsSurvivorsBitExactAndReclaimsSpace) {
  options_.gc_punch_holes = false;  // copy-on-write compaction alone
  Open();
  const std::string a = test::MakeValue(1, kValue), b = test::MakeValue(2, kValue + 5),
                    c = test::MakeValue(3, kValue - 5);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  SpillMemory();
  ASSERT_TRUE(db_->Delete(WriteOptions(), "b").ok());
  // Delete most fillers too, so their buckets qualify for compaction.
  for (int i = 0; i < filler_; i++) {
    if (i % 4 != 0) db_->Delete(WriteOptions(), "filler." + std::to_string(i));
  }
  const uint64_t used_before = Stat(db_.get(), "ssd.used_bytes");
  uint64_t reclaimed = 0;
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_GT(reclaimed, 0u);
  EXPECT_LT(Stat(db_.get(), "ssd.used_bytes"), used_before);
  EXPECT_GT(Stat(db_.get(), "ssd.gc_buckets_compacted"), 0u);
  EXPECT_TRUE(Get("a") == a);
  EXPECT_TRUE(Get("c") == c);
  EXPECT_TRUE(Get("b") == "<absent>");
  for (int i = 0; i < filler_; i += 4) {
    EXPECT_TRUE(Get("filler." + std::to_string(i)) == std::string(kValue, 'f')) << i;
  }
  Reopen();  // GC + reopen
  EXPECT_TRUE(Get("a") == a);
  EXPECT_TRUE(Get("c") == c);
  EXPECT_TRUE(Get("b") == "<absent>");
  EXPECT_TRUE(Get("filler.1") == "<absent>");
}

TEST_F(SsdTierTest, GcMapsEverySurvivorToItsOwnBytes) {
  // Values of many sizes, every third deleted: after compaction each key must still
  // read its own bytes (survivors re-mapped by key, not by position).  Write-through puts
  // every value on SSD; reopening empties memory so the reads below come from SSD.
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  Open();
  std::map<std::string, std::string> expect;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 60; i++) {
    std::string key = "key." + std::to_string(i);
    expect[key] = test::MakeValue(rng(), 1000 + rng() % (3 * kValue));
    Put(key, expect[key]);
  }
  SpillMemory();
  for (int i = 0; i < 60; i += 3) {
    ASSERT_TRUE(db_->Delete(WriteOptions(), "key." + std::to_string(i)).ok());
    expect.erase("key." + std::to_string(i));
  }
  options_.gc_deleted_ratio = 0.01;
  ASSERT_TRUE(db_->Flush().ok());
  Reopen();  // picks up the low ratio; also exercises recovery of tombstones
  for (int round = 0; round < 20; round++) {
    uint64_t reclaimed = 0;
    ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
    if (reclaimed == 0) break;
  }
  for (const auto& [key, value] : expect) {
    std::string got = Get(key);
    EXPECT_TRUE(got == value) << key << " size " << got.size() << " vs " << value.size() << " "
                              << got.substr(0, 80);
  }
  for (int i = 0; i < 60; i += 3) EXPECT_TRUE(Get("key." + std::to_string(i)) == "<absent>");
  Reopen();
  for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;
}

TEST_F(SsdTierTest, DeletesAndOverwritesSurviveReopen) {
  Open();
  Put("gone", test::MakeValue(1, kValue));
  Put("changed", test::MakeValue(2, kValue));
  Put("kept", test::MakeValue(3, kValue));
  SpillMemory();
  ASSERT_TRUE(db_->Delete(WriteOptions(), "gone").ok());
  Put("changed", test::MakeValue(4, kValue));
  SpillMemory();  // the new "changed" goes to SSD too
  uint64_t n = 0;
  ASSERT_TRUE(db_->DeleteByRegex("filler\\.1.*", &n).ok());
  EXPECT_GT(n, 0u);
  ASSERT_TRUE(db_->Flush().ok());
  Reopen();
  // The recovered tombstones are counted too (they were not, once).
  EXPECT_GT(Stat(db_.get(), "ssd.tombstones"), 0u);
  EXPECT_TRUE(Get("gone") == "<absent>");
  EXPECT_TRUE(Get("changed") == test::MakeValue(4, kValue));
  EXPECT_TRUE(Get("kept") == test::MakeValue(3, kValue));
  EXPECT_TRUE(Get("filler.1") == "<absent>");
  EXPECT_TRUE(Get("filler.2") == std::string(kValue, 'f'));
  Reopen();  // a second restart, after the log was rewritten by recovery
  EXPECT_TRUE(Get("gone") == "<absent>");
  EXPECT_TRUE(Get("changed") == test::MakeValue(4, kValue));
  uint64_t all = 0;
  ASSERT_TRUE(db_->DeleteAll(&all).ok());
  EXPECT_GT(all, 3u);
  Reopen();
  EXPECT_TRUE(Get("kept") == "<absent>");
  EXPECT_EQ(Stat(db_.get(), "ssd.keys"), 0u);
}

// ------------------------------------------------------------------ damaged DB at open

// Damaged files at Open used to crash the process (the failed tier's destructor synced a
// tombstone log it never opened).  Open must now fail with a Status naming the file, or
// open with the damage moved aside; the DB opens again once the damage is undone.
class DamagedOpenTest : public SsdTierTest {
 protected:
  // A DB whose values are on SSD, with some of them deleted; closed.
  void MakeDbWithDeletes() {
    UseFaultEnvWriteThrough();
    Open();
    expect_ = PutNumbered("k", 12, 7, 0);
    ASSERT_TRUE(db_->Flush().ok());  // every value in a bucket file before it is deleted
    for (int i = 0; i < 12; i += 3) {
      ASSERT_TRUE(db_->Delete(WriteOptions(), "k." + std::to_string(i)).ok());
      expect_.erase("k." + std::to_string(i));
    }
    ASSERT_TRUE(db_->Close().ok());
    db_.reset();
    // These tests damage the files the full scan reads: no map checkpoint stands in.
    std::filesystem::remove(dir_.Sub("SSDMAP"));
  }
  Status TryOpen() {
    db_.reset();
    return DB::Open(options_, dir_.path(), &db_);
  }
  void ExpectIntact() {
    for (int i = 0; i < 12; i++) {
      const std::string key = "k." + std::to_string(i);
      auto it = expect_.find(key);
      EXPECT_TRUE(Get(key) == (it == expect_.end() ? "<absent>" : it->second)) << key;
    }
  }
  static std::string ReadFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  static void WriteFile(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  }
  std::vector<std::string> BucketFiles() {
    std::vector<std::string> names;
    for (auto& e : std::filesystem::directory_iterator(dir_.path())) {
      const std::string name = e.path().filename();
      if (name.starts_with("bucket-")) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::map<std::string, std::string> expect_;
};

TEST_F(DamagedOpenTest, DamagedTombstoneLogFailsOpenWithAStatusNamingIt) {
  MakeDbWithDeletes();
  const std::string log = dir_.Sub("TOMBSTONES");
  std::string good = ReadFile(log);
  ASSERT_GT(good.size(), 16u);
  struct Damage {
    const char* what;
    std::function<void()> apply;
  };
  const Damage damages[] = {
      {"a flipped magic byte",
       [&] {
         std::string d = good;
         d[3] ^= 0x20;
         WriteFile(log, d);
       }},
      {"a flipped version byte",
       [&] {
         std::string d = good;
         d[9] ^= 0x01;
         WriteFile(log, d);
       }},
      {"garbage", [&] { WriteFile(log, std::string(good.size(), 'x')); }},
      {"a directory",
       [&] {
         std::filesystem::remove(log);
         std::filesystem::create_directory(log);
       }},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.what);
    damage.apply();
    Status s = TryOpen();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.ToString().find("TOMBSTONES"), std::string::npos) << s.ToString();
    EXPECT_EQ(db_, nullptr);
    // Nothing was rewritten away: undo the damage and the DB opens whole.
    std::filesystem::remove_all(log);
    WriteFile(log, good);
    ASSERT_TRUE(TryOpen().ok());
    ExpectIntact();
    ASSERT_TRUE(db_->Close().ok());
    // The Open rewrote the log (a new generation): the next damage starts from that one,
    // the copy before it is an older copy now, which its guard refuses.
    good = ReadFile(log);
  }
}

TEST_F(DamagedOpenTest, FullDiskAtOpenFailsCleanly) {
  MakeDbWithDeletes();
  fault_env_.SetSpaceLimit(fault_env_.bytes_written());  // not one byte more
  Status s = TryOpen();
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_EQ(db_, nullptr);
  fault_env_.SetSpaceLimit(UINT64_MAX);
  ASSERT_TRUE(TryOpen().ok());
  ExpectIntact();
}

TEST_F(DamagedOpenTest, LeftoverTemporaryThatIsADirectoryIsMovedAside) {
  MakeDbWithDeletes();
  std::filesystem::create_directory(dir_.Sub("TOMBSTONES.tmp"));
  ASSERT_TRUE(TryOpen().ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir_.Sub("quarantine/TOMBSTONES.tmp")));
  EXPECT_EQ(Stat(db_.get(), "ssd.quarantined_buckets"), 1u);
  ExpectIntact();
  Reopen();
  ExpectIntact();
}

TEST_F(DamagedOpenTest, FilesNamedLikeBucketsButNotWrittenByTheDbAreQuarantined) {
  MakeDbWithDeletes();
  const std::vector<std::string> buckets = BucketFiles();
  ASSERT_GE(buckets.size(), 2u);
  // Copies of real buckets under other spellings of their ids (they once made recovery
  // open the canonical name, or a bucket twice), a directory and a stranger's file.
  const uint64_t first = std::stoull(buckets[0].substr(7));
  const uint64_t last = std::stoull(buckets.back().substr(7));
  const std::string strays[] = {"bucket-" + std::to_string(first) + ".kvb",
                                "bucket-0" + buckets.back().substr(7),
                                "bucket-" + std::to_string(last + 5) + ".kvb", "bucket-x.kvb"};
  std::filesystem::copy_file(dir_.Sub(buckets[0]), dir_.Sub(strays[0]));
  std::filesystem::copy_file(dir_.Sub(buckets.back()), dir_.Sub(strays[1]));
  std::filesystem::create_directory(dir_.Sub(strays[2]));
  WriteFile(dir_.Sub(strays[3]), "not a bucket");
  // And a directory with a canonical name.
  const std::string dir_bucket = "bucket-" + std::string(6 - std::to_string(last + 9).size(), '0') +
                                 std::to_string(last + 9) + ".kvb";
  std::filesystem::create_directory(dir_.Sub(dir_bucket));

  Status s = TryOpen();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Stat(db_.get(), "ssd.quarantined_buckets"), 5u);
  for (const std::string& name : strays) {
    EXPECT_FALSE(std::filesystem::exists(dir_.Sub(name))) << name;
    EXPECT_TRUE(std::filesystem::exists(dir_.Sub("quarantine/" + name))) << name;
  }
  EXPECT_TRUE(std::filesystem::is_directory(dir_.Sub("quarantine/" + dir_bucket)));
  EXPECT_EQ(BucketFiles(), buckets);
  ExpectIntact();
  // New buckets are written, and the DB reopens without quarantining anything more.
  Put("new", test::MakeValue(99, kValue));
  SpillMemory();
  Reopen();
  EXPECT_EQ(Stat(db_.get(), "ssd.quarantined_buckets"), 0u);
  EXPECT_TRUE(Get("new") == test::MakeValue(99, kValue));
  ExpectIntact();
}

// A flipped bit in one tombstone record brought back every deleted key after it; then
// (resynchronising) it brought back the one delete the record held.  Now no delete comes
// back: every value the lost record may have deleted is dropped.
TEST_F(DamagedOpenTest, DamagedTombstoneRecordDropsWhatItMayHaveDeleted) {
  MakeDbWithDeletes();  // deletes k.0, k.3, k.6, k.9, one record each, in that order
  const std::string log = dir_.Sub("TOMBSTONES");
  std::string damaged = ReadFile(log);
  damaged[24 + 4 + 1] ^= 0x04;  // the first record's key
  WriteFile(log, damaged);
  ASSERT_TRUE(TryOpen().ok());
  EXPECT_GT(Stat(db_.get(), "ssd.damaged_tombstone_bytes"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.torn_tombstone_bytes"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.lost_tombstone_logs"), 1u);
  // The deletes name versions up to k.9's: every value that old whose delete is not in
  // the log is dropped (k.0, whose record was damaged, and k.1 ... k.8 but k.3 and k.6);
  // k.10 and k.11 are newer than any record and stay.
  EXPECT_EQ(Stat(db_.get(), "ssd.lost_delete_drops"), 7u);
  for (int i = 0; i < 10; i++) expect_.erase("k." + std::to_string(i));
  ExpectIntact();
  // The damaged log was kept aside, byte for byte, before the log was rewritten.
  EXPECT_EQ(ReadFile(dir_.Sub("quarantine/TOMBSTONES.damaged")), damaged);
  EXPECT_NE(ReadFile(log), damaged);
  Reopen();
  EXPECT_EQ(Stat(db_.get(), "ssd.damaged_tombstone_bytes"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.lost_tombstone_logs"), 0u);
  ExpectIntact();
}

// Buckets of format version 1 (entry checksums of the value alone) are read after an
// upgrade, and the GC carries their values into buckets of the current version.
TEST_F(DamagedOpenTest, Version1BucketsAreReadAndCompactedIntoTheCurrentFormat) {
  options_.gc_punch_holes = false;
  MakeDbWithDeletes();
  for (const std::string& name : BucketFiles()) {
    ASSERT_TRUE(test::ConvertBucketToVersion1(dir_.Sub(name))) << name;
  }
  ASSERT_TRUE(TryOpen().ok());
  ExpectIntact();
  uint64_t reclaimed = 0;
  options_.gc_deleted_ratio = 0.01;
  Reopen();
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_GT(reclaimed, 0u);
  ExpectIntact();
  Reopen();
  ExpectIntact();
  int current = 0;
  for (const std::string& name : BucketFiles()) {
    std::unique_ptr<BucketReader> r;
    ASSERT_TRUE(BucketReader::Open(Env::Default(), dir_.Sub(name), FileOptions(), &r).ok());
    current += r->header().format_version == kBucketFormatVersion;
  }
  EXPECT_GT(current, 0);
}

// The same write committed twice (a Flush persisting a value while the memory tier
// evicts it: both stage it, both commit it under the key's lock) is one write on SSD.
// The second commit used to tombstone the first copy, and as a tombstone names the write
// (key and version), not the copy, the next Open buried both: a flushed key, never
// deleted, was gone after a restart (found by kv_stress, docs/kv_stress.md).
TEST(SsdTierCommitTest, TheSameVersionCommittedTwiceSurvivesReopen) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  Options o;
  o.apply_environment = false;
  o.gc_interval_ms = 0;
  o.ssd_map_checkpoint = false;  // Open replays the buckets and the tombstone log
  Logger logger;
  const std::string value = test::MakeValue(7, 3000);
  const Slice part(value);
  for (int open = 0; open < 2; open++) {
    std::unique_ptr<SsdTier> tier;
    const Status opened = SsdTier::Open(o, dir.path(), Env::Default(), &logger, &tier);
    ASSERT_TRUE(opened.ok()) << opened.ToString();
    if (open == 0) {
      for (int copy = 0; copy < 2; copy++) {
        SsdTier::Ticket ticket;
        ASSERT_TRUE(tier->Stage("k", std::span<const Slice>(&part, 1), value.size(), &ticket).ok());
        tier->Commit(&ticket, 7);
      }
      ASSERT_TRUE(tier->Flush().ok());
    }
    EXPECT_TRUE(tier->HasVersion("k", 7)) << "open " << open;
    ASSERT_TRUE(tier->Close().ok());
  }
}

// Staging threads that waited for a writer that was behind could find the open bucket
// filled by another meanwhile; the retry then called Stage again with the tier's mutex
// still held and the thread deadlocked on itself, and every other thread with it (found
// by kv_stress: an attach owner under SSD pressure stopped answering).  Values of 60% of
// a bucket, write-through, from more threads than sealed buckets may wait.
TEST_F(SsdTierTest, StagingRacesForTheLastRoomWithoutDeadlock) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.memory_capacity_bytes = 8 << 20;
  options_.bucket_size_limit = 1 << 20;
  Open();
  const std::string value = test::MakeValue(1, 600 << 10);
  auto work = std::async(std::launch::async, [&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; t++) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 60; i++) {
          Status s = db_->Put(WriteOptions(), "race." + std::to_string(t * 1000 + i % 10), value);
          EXPECT_TRUE(s.ok() || s.IsNoSpace()) << s.ToString();
        }
      });
    }
    for (auto& th : threads) th.join();
  });
  if (work.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "StagingRacesForTheLastRoomWithoutDeadlock: puts stuck for 120 s\n");
    std::_Exit(1);  // the threads are deadlocked: nothing can join them
  }
  EXPECT_EQ(Get("race.0").size(), value.size());
}

// A put whose staging finds the bucket writer behind (here: every bucket write fails
// for a full disk, so sealed buckets pile up) fails NoSpace within SsdTier::kPutStageWait
// -- a put runs inside a call its caller waits on, an attached client's request with a
// 2 s timeout by default -- where it waited 10 s before; a Flush still waits longer.
TEST_F(SsdTierTest, APutDoesNotWaitLongForAWriterThatIsBehind) {
  UseFaultEnvWriteThrough();
  options_.bucket_size_limit = 256 << 10;
  Open();
  fault_env_.SetSpaceLimit(fault_env_.bytes_written());  // no bucket write succeeds now
  const std::string value = test::MakeValue(1, 100 << 10);
  int refused = 0;
  auto slowest = std::chrono::steady_clock::duration::zero();
  for (int i = 0; i < 40; i++) {
    const auto start = std::chrono::steady_clock::now();
    Status s = db_->Put(WriteOptions(), "behind." + std::to_string(i), value);
    slowest = std::max(slowest, std::chrono::steady_clock::now() - start);
    if (!s.ok()) {
      EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
      refused++;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_LT(slowest, std::chrono::milliseconds(2000))
      << std::chrono::duration_cast<std::chrono::milliseconds>(slowest).count() << " ms";
  fault_env_.SetSpaceLimit(UINT64_MAX);  // the writer catches up; puts are taken again
  Status s;
  for (int attempt = 0; attempt < 100; attempt++) {
    s = db_->Put(WriteOptions(), "after", value);
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Get("after") == value);
}

TEST_F(SsdTierTest, WriteThroughPersistsEveryFlushedPut) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.memory_capacity_bytes = 16 << 20;
  options_.memory_slab_size = 1 << 20;
  Open();
  for (int i = 0; i < 10; i++) Put("wt." + std::to_string(i), test::MakeValue(i, 5000 + i));
  ASSERT_TRUE(db_->Flush().ok());
  Reopen();
  for (int i = 0; i < 10; i++)
    EXPECT_TRUE(Get("wt." + std::to_string(i)) == test::MakeValue(i, 5000 + i));
}

TEST_F(SsdTierTest, FullTierWithoutEvictionFailsCleanly) {
  options_.ssd_capacity_bytes = 1 << 20;
  options_.bucket_size_limit = 256 << 10;
  options_.ssd_eviction = SsdEviction::kNone;
  Open();
  int stored = 0;
  Status last;
  for (int i = 0; i < 64; i++) {
    last = db_->Put(WriteOptions(), "k" + std::to_string(i), test::MakeValue(i, kValue));
    if (!last.ok()) break;
    stored++;
  }
  EXPECT_TRUE(last.IsNoSpace()) << last.ToString();
  EXPECT_GT(Stat(db_.get(), "ssd.offload_failures"), 0u);
  // Nothing acknowledged is lost or corrupted.
  for (int i = 0; i < stored; i++)
    EXPECT_TRUE(Get("k" + std::to_string(i)) == test::MakeValue(i, kValue)) << i;
}

TEST_F(SsdTierTest, FullTierWithLruEvictionDropsWholeBuckets) {
  // Twice the memory tier: Flush() also writes the 16 values only in memory, so the tier
  // holds them and 16 more that only SSD has.
  options_.ssd_capacity_bytes = 2 << 20;
  options_.bucket_size_limit = 256 << 10;
  options_.ssd_eviction = SsdEviction::kLru;
  Open();
  for (int i = 0; i < 64; i++) Put("k" + std::to_string(i), test::MakeValue(i, kValue));
  ASSERT_TRUE(db_->Flush().ok());
  EXPECT_GT(Stat(db_.get(), "ssd.evicted_buckets"), 0u);
  EXPECT_LE(Stat(db_.get(), "ssd.used_bytes"), 2u << 20);
  int present = 0;
  for (int i = 0; i < 64; i++) {
    std::string v = Get("k" + std::to_string(i));
    if (v == "<absent>") continue;
    EXPECT_TRUE(v == test::MakeValue(i, kValue)) << i;
    present++;
  }
  EXPECT_GT(present, 16);
  EXPECT_TRUE(Get("k63") == test::MakeValue(63, kValue));
}

TEST_F(SsdTierTest, CorruptBucketIsQuarantinedAndTheRestOpens) {
  Open();
  for (int i = 0; i < 24; i++) Put("k" + std::to_string(i), test::MakeValue(i, kValue));
  ASSERT_TRUE(db_->Flush().ok());
  ASSERT_TRUE(db_->Close().ok());
  // Damage the footer of the first bucket and leave a stray temporary file behind.
  std::string victim;
  for (auto& e : std::filesystem::directory_iterator(dir_.path())) {
    std::string name = e.path().filename();
    if (name.starts_with("bucket-") && (victim.empty() || name < victim)) victim = name;
  }
  ASSERT_FALSE(victim.empty());
  const std::string path = dir_.Sub(victim);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(path) - 30));
    f.write("garbage", 7);
  }
  std::ofstream(dir_.Sub("bucket-999999.kvb.tmp")) << "half-written";
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.quarantined_buckets"), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir_.Sub("quarantine/" + victim)));
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("bucket-999999.kvb.tmp")));
  int present = 0;
  for (int i = 0; i < 24; i++) {
    std::string v = Get("k" + std::to_string(i));
    if (v == "<absent>") continue;
    EXPECT_TRUE(v == test::MakeValue(i, kValue)) << i;
    present++;
  }
  EXPECT_GT(present, 0);
  EXPECT_LT(present, 24);
}

TEST_F(SsdTierTest, CorruptValueOnSsdFailsThatKeyOnly) {
  options_.use_direct_io = false;
  Open();
  Put("a", test::MakeValue(1, kValue));
  Put("b", test::MakeValue(2, kValue));
  SpillMemory();
  ASSERT_TRUE(db_->Close().ok());
  // Flip a byte inside the first value of the oldest bucket ("a" went first).
  std::string first;
  for (auto& e : std::filesystem::directory_iterator(dir_.path())) {
    std::string name = e.path().filename();
    if (name.starts_with("bucket-") && (first.empty() || name < first)) first = name;
  }
  {
    std::fstream f(dir_.Sub(first), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 100);
    f.write("X", 1);
  }
  Open();
  std::string v;
  Status s = db_->Get(ReadOptions(), "a", &v);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_TRUE(Get("b") == test::MakeValue(2, kValue));
}

TEST_F(SsdTierTest, InjectedWriteFailureIsReportedAndRetried) {
  FaultInjectionEnv& env = fault_env_;
  options_.env = &env;
  options_.use_io_uring = false;
  Open();
  for (int i = 0; i < 3; i++) Put("k" + std::to_string(i), test::MakeValue(i, kValue));
  env.FailAfter(FaultInjectionEnv::Op::kSync, 1);
  // Spill without SpillMemory's Flush: a Flush that runs before the retry reports the
  // failure (as it must), which made this test flaky.
  for (int i = 0; i < 32; i++) Put("filler." + std::to_string(i), std::string(kValue, 'f'));
  Status s = db_->Flush();
  for (int attempt = 0; !s.ok() && attempt < 100; attempt++) {
    EXPECT_TRUE(s.IsIOError()) << s.ToString();  // the injected fault, until the retry
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = db_->Flush();
  }
  ASSERT_TRUE(s.ok()) << s.ToString();  // the write was retried and succeeded
  EXPECT_GE(env.injected_failures(), 1);
  EXPECT_GE(Stat(db_.get(), "ssd.bucket_write_errors"), 1u);
  for (int i = 0; i < 3; i++)
    EXPECT_TRUE(Get("k" + std::to_string(i)) == test::MakeValue(i, kValue));
  Reopen();
  for (int i = 0; i < 3; i++)
    EXPECT_TRUE(Get("k" + std::to_string(i)) == test::MakeValue(i, kValue));
}

TEST_F(SsdTierTest, WriteFailureMidCompactionLeavesOldBucketsAuthoritative) {
  // The compaction appends its new image chunk by chunk while it is still reading; a
  // write failing after the first chunk must leave the old buckets in charge, and no
  // file behind.
  UseFaultEnvWriteThrough();
  options_.gc_deleted_ratio = 0.3;
  options_.gc_punch_holes = false;  // copy-on-write compaction alone
  Open();
  std::map<std::string, std::string> expect = PutNumbered("g", 16, 100, 7);
  ASSERT_TRUE(db_->Flush().ok());
  for (int i = 1; i < 16; i += 2) {  // half of every bucket
    ASSERT_TRUE(db_->Delete(WriteOptions(), "g." + std::to_string(i)).ok());
    expect.erase("g." + std::to_string(i));
  }
  ASSERT_TRUE(db_->Flush().ok());
  Reopen();  // memory is empty: the compaction reads every survivor from its bucket
  const uint64_t buckets = Stat(db_.get(), "ssd.buckets");
  ASSERT_GE(buckets, 4u);

  fault_env_.FailAfter(FaultInjectionEnv::Op::kWrite, 2);  // the second chunk
  uint64_t reclaimed = 0;
  Status s = db_->CompactBuckets(&reclaimed);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_EQ(fault_env_.injected_failures(), 1);
  EXPECT_EQ(reclaimed, 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.buckets"), buckets);
  for (auto& e : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_FALSE(e.path().filename().string().ends_with(".tmp")) << e.path();
  }
  for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;

  // The next round succeeds, and the result survives a restart.
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_GT(reclaimed, 0u);
  EXPECT_LT(Stat(db_.get(), "ssd.buckets"), buckets);
  for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;
  Reopen();
  for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;
  for (int i = 1; i < 16; i += 2) EXPECT_TRUE(Get("g." + std::to_string(i)) == "<absent>") << i;
}

// Disk blocks held by the DB's bucket files.
uint64_t AllocatedBucketBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("bucket-") || e.path().parent_path().filename() == "quarantine") continue;
    struct stat st;
    if (::stat(e.path().c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

TEST_F(SsdTierTest, GcPunchesHolesOverDeletedValuesInPlace) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.gc_merge_deleted_ratio = 0.7;
  Open();
  const std::string a = test::MakeValue(1, kValue), b = test::MakeValue(2, kValue + 5),
                    c = test::MakeValue(3, kValue - 5);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  for (int i = 0; i < 5; i++) Put("x." + std::to_string(i), test::MakeValue(10 + i, kValue));
  Reopen();  // memory is empty: every read below comes from SSD
  const uint64_t buckets = Stat(db_.get(), "ssd.buckets");
  ASSERT_EQ(buckets, 2u);  // {a, b, c, x.0}, {x.1 .. x.4}
  const uint64_t used_before = Stat(db_.get(), "ssd.used_bytes");
  const uint64_t allocated_before = AllocatedBucketBytes(dir_.path());
  ASSERT_TRUE(db_->Delete(WriteOptions(), "b").ok());
  EXPECT_EQ(Stat(db_.get(), "ssd.deleted_bytes"), kValue + 5);

  uint64_t reclaimed = 0;
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  const uint64_t padded = (kValue + 5 + 4095) / 4096 * 4096;
  EXPECT_EQ(reclaimed, padded);
  EXPECT_EQ(Stat(db_.get(), "ssd.gc_bytes_punched"), padded);
  EXPECT_EQ(Stat(db_.get(), "ssd.gc_buckets_compacted"), 0u);  // nothing copied
  EXPECT_EQ(Stat(db_.get(), "ssd.buckets"), buckets);
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used_before - padded);
  EXPECT_EQ(Stat(db_.get(), "ssd.deleted_bytes"), 0u);
  EXPECT_LE(AllocatedBucketBytes(dir_.path()), allocated_before - padded);
  EXPECT_TRUE(Get("a") == a);
  EXPECT_TRUE(Get("c") == c);
  EXPECT_TRUE(Get("b") == "<absent>");
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_EQ(reclaimed, 0u);  // nothing new to punch

  Reopen();  // the hole stays a dead value's: never read, punched again harmlessly
  EXPECT_TRUE(Get("b") == "<absent>");
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_TRUE(Get("a") == a);
  EXPECT_TRUE(Get("c") == c);
  EXPECT_TRUE(Get("b") == "<absent>");
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used_before - padded);

  // Once most of a bucket is dead it is merged after all; an empty one just goes.
  for (int i = 0; i < 5; i++)
    ASSERT_TRUE(db_->Delete(WriteOptions(), "x." + std::to_string(i)).ok());
  ASSERT_TRUE(db_->Delete(WriteOptions(), "a").ok());
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_EQ(Stat(db_.get(), "ssd.gc_buckets_compacted"), 2u);
  EXPECT_EQ(Stat(db_.get(), "ssd.buckets"), 1u);
  EXPECT_TRUE(Get("c") == c);
  Reopen();
  EXPECT_TRUE(Get("c") == c);
  EXPECT_TRUE(Get("a") == "<absent>");
  EXPECT_TRUE(Get("b") == "<absent>");
  EXPECT_TRUE(Get("x.0") == "<absent>");
}

TEST_F(SsdTierTest, ValuesDeadBeforeTheirBucketIsWrittenArePunchedToo) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.bucket_flush_timeout_ms = 60000;  // the bucket stays open until Flush
  Open();
  const std::string v0 = test::MakeValue(30, kValue), v2 = test::MakeValue(32, kValue - 1);
  Put("d.0", v0);
  Put("d.1", test::MakeValue(31, kValue));
  Put("d.2", v2);
  ASSERT_TRUE(db_->Delete(WriteOptions(), "d.1").ok());  // still in the open bucket
  ASSERT_TRUE(db_->Flush().ok());
  uint64_t reclaimed = 0;
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_EQ(reclaimed, kValue);
  EXPECT_EQ(Stat(db_.get(), "ssd.gc_buckets_compacted"), 0u);
  Reopen();
  EXPECT_TRUE(Get("d.0") == v0);
  EXPECT_TRUE(Get("d.2") == v2);
  EXPECT_TRUE(Get("d.1") == "<absent>");
}

// Bucket format v3 packs values under 64 KiB on 512-byte units: 512-byte and 4097-byte
// values take within 1.15x of their bytes on disk (they took 8x and 2x when every value
// was padded to 4 KiB), index, header and footer included.
TEST_F(SsdTierTest, SmallValuesTakeAboutTheirSizeOnDisk) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.bucket_keys_limit = 512;
  options_.bucket_size_limit = 64 << 20;
  options_.memory_capacity_bytes = 8 << 20;
  options_.memory_slab_size = 1 << 20;
  Open();
  uint64_t value_bytes = 0;
  std::map<std::string, std::string> expect;
  auto put = [&](const std::string& prefix, size_t size, int count) {
    for (int i = 0; i < count; i++) {
      const std::string key = prefix + std::to_string(100000 + i);  // 16-byte keys
      expect[key] = test::MakeValue(i, size);
      Put(key, expect[key]);
      value_bytes += size;
    }
    ASSERT_TRUE(db_->Flush().ok());
  };
  put("packed.512.key.", 512, 2048);
  const uint64_t small = AllocatedBucketBytes(dir_.path());
  EXPECT_LE(small, value_bytes * 115 / 100) << small << " bytes on disk for " << value_bytes;
  const uint64_t small_values = value_bytes;
  put("packed.4097.key", 4097, 1024);
  const uint64_t larger = AllocatedBucketBytes(dir_.path()) - small;
  EXPECT_LE(larger, (value_bytes - small_values) * 115 / 100)
      << larger << " bytes on disk for " << value_bytes - small_values;
  Reopen();
  for (const auto& [key, value] : expect) ASSERT_TRUE(Get(key) == value) << key;
}

// With values packed several to a 4 KiB block, a hole gives back only the blocks that no
// live value shares: deleting seven of a block's eight values frees nothing, the eighth
// frees the block.  What was punched is remembered across a restart, through the map
// checkpoint and through a full scan alike (never punched or counted twice).
TEST_F(SsdTierTest, PackedValuesGiveBackOnlyBlocksNoLiveValueShares) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.bucket_keys_limit = 64;
  options_.gc_deleted_ratio = 2;  // punching only: no compaction in this test
  options_.gc_merge_deleted_ratio = 2;
  Open();
  std::map<std::string, std::string> expect;
  for (int i = 0; i < 64; i++) {
    const std::string key = "p." + std::to_string(i);
    expect[key] = test::MakeValue(i, 500);
    Put(key, expect[key]);
  }
  ASSERT_TRUE(db_->Flush().ok());
  Reopen();
  ASSERT_EQ(Stat(db_.get(), "ssd.buckets"), 1u);
  const uint64_t used_before = Stat(db_.get(), "ssd.used_bytes");
  auto remove = [&](int i) {
    ASSERT_TRUE(db_->Delete(WriteOptions(), "p." + std::to_string(i)).ok());
    expect.erase("p." + std::to_string(i));
  };
  auto punch = [&] {
    uint64_t reclaimed = 0;
    EXPECT_TRUE(db_->CompactBuckets(&reclaimed).ok());
    return reclaimed;
  };
  auto check = [&] {
    for (int i = 0; i < 64; i++) {
      const std::string key = "p." + std::to_string(i);
      EXPECT_TRUE(Get(key) == (expect.count(key) ? expect[key] : "<absent>")) << key;
    }
  };
  for (int i = 0; i < 7; i++) remove(i);
  EXPECT_EQ(punch(), 0u);  // p.7 shares the block
  remove(7);
  EXPECT_EQ(punch(), 4096u);
  for (int i = 9; i < 16; i += 2) remove(i);  // half of the second block
  EXPECT_EQ(punch(), 0u);
  check();
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used_before - 4096);

  Reopen();  // through the checkpoint
  EXPECT_EQ(punch(), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used_before - 4096);
  ASSERT_TRUE(db_->Close().ok());
  std::filesystem::remove(dir_.Sub("SSDMAP"));
  Open();  // through a full scan
  EXPECT_EQ(punch(), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used_before - 4096);
  check();

  for (int i = 8; i < 16; i += 2) remove(i);  // the rest of the second block
  EXPECT_EQ(punch(), 4096u);
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used_before - 8192);
  check();
  Reopen();
  check();
}

TEST_F(SsdTierTest, TombstonesOfPunchedValuesDoNotOutgrowTheLiveKeys) {
  // A punched value's tombstone stays until its bucket is compacted.  Values deleted at
  // random leave every bucket below gc_merge_deleted_ratio, so without a bound the
  // tombstones (memory and log) would outnumber the live keys for good.  Values of one
  // page each: every delete frees a page (smaller values share pages, and a page with a
  // live value is never punched).
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.bucket_keys_limit = 512;
  options_.bucket_size_limit = 4 << 20;
  Open();
  constexpr int kKeys = 10000;
  auto value = [](int i) {
    std::string v = "v" + std::to_string(i);
    v.resize(4096, '.');
    return v;
  };
  for (int i = 0; i < kKeys; i++) Put("t." + std::to_string(i), value(i));
  ASSERT_TRUE(db_->Flush().ok());
  for (int i = 0; i < kKeys; i++) {
    if (i % 5 < 3) {
      ASSERT_TRUE(db_->Delete(WriteOptions(), "t." + std::to_string(i)).ok());
    }
  }
  ASSERT_TRUE(db_->Flush().ok());
  EXPECT_GT(Stat(db_.get(), "ssd.tombstones"), Stat(db_.get(), "ssd.keys"));
  for (int round = 0; round < 10; round++) ASSERT_TRUE(db_->CompactBuckets(nullptr).ok());
  EXPECT_GT(Stat(db_.get(), "ssd.gc_bytes_punched"), 0u);
  EXPECT_GT(Stat(db_.get(), "ssd.gc_buckets_compacted"), 0u);
  EXPECT_LE(Stat(db_.get(), "ssd.tombstones"), Stat(db_.get(), "ssd.keys"));
  Reopen();
  EXPECT_LE(Stat(db_.get(), "ssd.tombstones"), Stat(db_.get(), "ssd.keys"));
  for (int i = 0; i < kKeys; i += 7) {
    EXPECT_TRUE(Get("t." + std::to_string(i)) == (i % 5 < 3 ? "<absent>" : value(i))) << i;
  }
}

TEST_F(SsdTierTest, FailedPunchChangesNothingAndIsRetried) {
  UseFaultEnvWriteThrough();
  Open();
  std::map<std::string, std::string> expect = PutNumbered("p", 8, 200, 11);
  ASSERT_TRUE(db_->Flush().ok());
  ASSERT_TRUE(db_->Delete(WriteOptions(), "p.3").ok());
  expect.erase("p.3");
  const uint64_t used = Stat(db_.get(), "ssd.used_bytes");

  fault_env_.FailAfter(FaultInjectionEnv::Op::kWrite, 1);
  uint64_t reclaimed = 0;
  Status s = db_->CompactBuckets(&reclaimed);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_EQ(fault_env_.injected_failures(), 1);
  EXPECT_EQ(reclaimed, 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used);
  for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;
  EXPECT_TRUE(Get("p.3") == "<absent>");

  // The extent was not lost: the next round gives it back, and the result survives a
  // restart.
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_EQ(reclaimed, (kValue - 33 + 4095) / 4096 * 4096);
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used - reclaimed);
  for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;
  EXPECT_TRUE(Get("p.3") == "<absent>");
  Reopen();
  for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;
  EXPECT_TRUE(Get("p.3") == "<absent>");
}

TEST_F(SsdTierTest, SimulatedPowerCutKeepsWhatFlushAcknowledged) {
  FaultInjectionEnv& env = fault_env_;
  UseFaultEnvWriteThrough();
  options_.bucket_flush_timeout_ms = 100000;
  Open();
  for (int i = 0; i < 6; i++) Put("durable." + std::to_string(i), test::MakeValue(i, 20000));
  ASSERT_TRUE(db_->Delete(WriteOptions(), "durable.0").ok());
  ASSERT_TRUE(db_->Flush().ok());
  for (int i = 0; i < 3; i++) Put("volatile." + std::to_string(i), test::MakeValue(i, 20000));
  ASSERT_TRUE(db_->Delete(WriteOptions(), "durable.1").ok());  // not flushed
  // The power goes: nothing more reaches the disk, then unsynced bytes are lost.
  env.SetFilesystemActive(false);
  db_->Close();  // its shutdown writes fail: the disk is gone
  db_.reset();
  ASSERT_TRUE(env.DropUnsyncedData().ok());
  options_.env = nullptr;
  Open();
  EXPECT_TRUE(Get("durable.0") == "<absent>");
  for (int i = 2; i < 6; i++)
    EXPECT_TRUE(Get("durable." + std::to_string(i)) == test::MakeValue(i, 20000)) << i;
  // durable.1's delete was not flushed: the value may be there or not, but intact.
  std::string d1 = Get("durable.1");
  EXPECT_TRUE(d1 == "<absent>" || d1 == test::MakeValue(1, 20000));
}

TEST_F(SsdTierTest, GcRacingDeletesOverwritesAndReads) {
  options_.gc_interval_ms = 5;
  options_.gc_deleted_ratio = 0.1;
  options_.bucket_flush_timeout_ms = 5;
  Open();
  const int kKeys = 48;
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, reads{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<char> buf(3 * kValue);
      while (!stop) {
        std::string key = "key." + std::to_string(rng() % kKeys);
        int op = static_cast<int>(rng() % 6);
        if (op == 0) {
          db_->Delete(WriteOptions(), key);
        } else if (op <= 2) {
          std::string v = test::MakeSelfCheckingValue(rng, 4096 + rng() % (2 * kValue));
          Status s = db_->Put(WriteOptions(), key, v);
          if (!s.ok()) bad++;
        } else {
          size_t n = 0;
          Status s = db_->GetInto(ReadOptions(), key, MutableSlice(buf.data(), buf.size()), &n);
          if (s.ok()) {
            reads++;
            if (!test::SelfCheck(buf.data(), n)) bad++;
          } else if (!s.IsNotFound()) {
            bad++;
          }
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_GT(Stat(db_.get(), "ssd.gc_rounds"), 0u);
  // Everything still readable is intact after a restart.
  std::vector<std::string> present;
  for (int i = 0; i < kKeys; i++) {
    std::string v = Get("key." + std::to_string(i));
    if (v != "<absent>") {
      EXPECT_TRUE(test::SelfCheck(v.data(), v.size())) << i;
    }
  }
}

// ---------------------------------------------------------------- file descriptors

// Runs in a child process (EXPECT_EXIT) whose descriptor limit is `limit`: a failure
// prints what went wrong and exits 1.
[[noreturn]] void FailChild(const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void LowerDescriptorLimit(rlim_t limit) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = std::min<rlim_t>(limit, rl.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) FailChild("setrlimit", Status::IOError("failed"));
}

uint64_t ChildStat(DB* db, const std::string& name) {
  std::string text;
  db->GetProperty("kvengine.stats", &text);
  const size_t pos = text.find(name + ": ");
  return pos == std::string::npos ? ~0ull : std::stoull(text.substr(pos + name.size() + 2));
}

// Every put on SSD, in a bucket of its own; reads from SSD stay there.
Options OneBucketPerValue(uint64_t max_open_files) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 1 << 20;
  o.memory_slab_size = 64 << 10;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  o.bucket_keys_limit = 1;
  o.gc_interval_ms = 0;
  o.promote_on_read = false;
  o.max_open_files = max_open_files;
  return o;
}

// More buckets than the process may open descriptors: writes, reads, GC and reopen all
// work, with at most max_open_files bucket files open.
void ManyBucketsUnderALowDescriptorLimit(const std::string& dir) {
  LowerDescriptorLimit(64);
  const Options o = OneBucketPerValue(/*max_open_files=*/16);  // 300 buckets
  constexpr int kKeys = 300;
  auto value = [](int i) { return test::MakeValue(i, 5000 + i); };
  std::unique_ptr<DB> db;
  Status s = DB::Open(o, dir, &db);
  if (!s.ok()) FailChild("open", s);
  for (int i = 0; i < kKeys; i++) {
    s = db->Put(WriteOptions(), "k" + std::to_string(i), value(i));
    if (!s.ok()) FailChild("put " + std::to_string(i), s);
  }
  s = db->Flush();
  if (!s.ok()) FailChild("flush", s);
  for (int i = 0; i < kKeys; i += 2) {
    s = db->Delete(WriteOptions(), "k" + std::to_string(i));
    if (!s.ok()) FailChild("delete", s);
  }
  s = db->CompactBuckets(nullptr);
  if (!s.ok()) FailChild("compact", s);
  for (int round = 0; round < 2; round++) {
    s = db->Close();
    if (!s.ok()) FailChild("close", s);
    s = DB::Open(o, dir, &db);  // memory starts empty: every read goes to a bucket
    if (!s.ok()) FailChild("reopen", s);
    for (int i = 0; i < kKeys; i++) {
      std::string got;
      s = db->Get(ReadOptions(), "k" + std::to_string(i), &got);
      if (i % 2 == 0 ? !s.IsNotFound() : (!s.ok() || got != value(i))) {
        FailChild("get k" + std::to_string(i) + " after reopen", s);
      }
    }
    if (ChildStat(db.get(), "ssd.open_files") > o.max_open_files) {
      FailChild("ssd.open_files " + std::to_string(ChildStat(db.get(), "ssd.open_files")),
                Status::InvalidArgument("more than max_open_files"));
    }
  }
  s = db->Close();
  if (!s.ok()) FailChild("final close", s);
  std::_Exit(0);
}

TEST_F(SsdTierTest, MoreBucketsThanFileDescriptors) {
  EXPECT_EXIT(ManyBucketsUnderALowDescriptorLimit(dir_.path()), ::testing::ExitedWithCode(0), "");
}

// The process runs out of descriptors anyway (something else took them): puts fail at
// once with a Status naming EMFILE, never stall; once descriptors are back, all works.
void OutOfDescriptorsIsAClearError(const std::string& dir) {
  LowerDescriptorLimit(128);
  const Options o = OneBucketPerValue(/*max_open_files=*/8);
  std::unique_ptr<DB> db;
  Status s = DB::Open(o, dir, &db);
  if (!s.ok()) FailChild("open", s);
  std::vector<int> hogged;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) hogged.push_back(fd);
  const auto start = std::chrono::steady_clock::now();
  int i = 0;
  for (; i < 20; i++) {
    s = db->Put(WriteOptions(), "k" + std::to_string(i), std::string(5000, 'v'));
    if (!s.ok()) break;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.ok()) FailChild("puts without descriptors", Status::InvalidArgument("all succeeded"));
  if (s.ToString().find("EMFILE") == std::string::npos) FailChild("error without EMFILE", s);
  if (seconds > 5) FailChild("stalled " + std::to_string(seconds) + " s", s);
  for (int fd : hogged) ::close(fd);
  // Flush reports the writer's failure until its next retry goes through.
  for (int attempt = 0; attempt < 100; attempt++) {
    s = db->Flush();
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!s.ok()) FailChild("flush after descriptors came back", s);
  for (int k = 0; k < i; k++) {
    std::string got;
    s = db->Get(ReadOptions(), "k" + std::to_string(k), &got);
    if (!s.ok() || got != std::string(5000, 'v')) FailChild("get after recovery", s);
  }
  s = db->Close();
  if (!s.ok()) FailChild("close", s);
  std::_Exit(0);
}

TEST_F(SsdTierTest, RunningOutOfDescriptorsFailsFastNamingEmfile) {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan's vptr check probes memory through a pipe: with every descriptor taken it calls
  // each shared_ptr an "invalid vptr".  The Release suite runs this test.
  GTEST_SKIP() << "the sanitizer runtime itself needs descriptors";
#endif
  EXPECT_EXIT(OutOfDescriptorsIsAClearError(dir_.path()), ::testing::ExitedWithCode(0), "");
}

// The SSD tier's RAM per key is reported (ssd.index_bytes), stays bounded with long keys
// (the keys are held once, in the map: bucket indexes stay on disk), survives a reopen,
// and is given back when the keys go.
TEST_F(SsdTierTest, IndexBytesPerKeyAreReportedAndGivenBack) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  options_.bucket_keys_limit = 64;
  options_.memory_capacity_bytes = 4 << 20;
  Open();
  constexpr int kKeys = 400;
  auto key = [](int i) { return std::string(36, 'k') + std::to_string(1000 + i); };  // 40 B
  for (int i = 0; i < kKeys; i++) Put(key(i), std::string(100, 'v'));
  ASSERT_TRUE(db_->Flush().ok());
  for (int round = 0; round < 2; round++) {
    EXPECT_EQ(Stat(db_.get(), "ssd.keys"), uint64_t{kKeys});
    const uint64_t per_key = Stat(db_.get(), "ssd.index_bytes_per_key");
    // A 40-byte slot per key (the key itself stays on disk), at a small table's load;
    // a copy of the key in RAM would take it past 80.
    EXPECT_GE(per_key, 40u);
    EXPECT_LE(per_key, 80u);
    Reopen();
  }
  uint64_t deleted = 0;
  ASSERT_TRUE(db_->DeleteAll(&deleted).ok());
  // Tombstones go with their buckets' compaction, gc_max_buckets_per_round at a time.
  for (int round = 0; round < 4; round++) ASSERT_TRUE(db_->CompactBuckets(nullptr).ok());
  EXPECT_EQ(Stat(db_.get(), "ssd.keys"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.tombstones"), 0u);
  EXPECT_LE(Stat(db_.get(), "ssd.index_bytes"), uint64_t{kKeys} * 40);
  EXPECT_EQ(Get(key(7)), "<absent>");
}

// The keys are not in RAM: DeleteByRegex lists them from the buckets' indexes on disk
// (and the pending buckets' entries), while the GC compacts and puts go on.
TEST_F(SsdTierTest, DeleteByRegexFindsKeysThatLiveOnlyOnSsd) {
  options_.offload_policy = OffloadPolicy::kWriteThrough;
  Open();
  std::map<std::string, std::string> expect;
  for (int i = 0; i < 24; i++) {
    for (const char* prefix : {"a.", "b."}) {
      const std::string key = prefix + std::to_string(i);
      Put(key, expect[key] = test::MakeValue(i + (prefix[0] == 'a' ? 0 : 100), 5000));
    }
  }
  Reopen();  // memory is empty: every key is on SSD only
  for (int i = 0; i < 24; i += 3)
    ASSERT_TRUE(db_->Delete(WriteOptions(), "b." + std::to_string(i)).ok());
  for (int i = 0; i < 24; i += 3) expect.erase("b." + std::to_string(i));
  Put("a.pending", "in the open bucket");  // also in memory: counted once
  std::atomic<bool> stop{false};
  std::thread gc([&] {
    while (!stop) db_->CompactBuckets(nullptr);
  });
  std::thread writer([&] {
    for (int i = 0; !stop; i++) db_->Put(WriteOptions(), "c." + std::to_string(i % 50), "x");
  });
  uint64_t deleted = 0;
  Status s = db_->DeleteByRegex("a\\..*", &deleted);
  stop = true;
  gc.join();
  writer.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(deleted, 25u);
  for (const auto& [key, value] : expect) {
    EXPECT_EQ(Get(key), key[0] == 'a' ? "<absent>" : value) << key;
  }
  EXPECT_EQ(Get("a.pending"), "<absent>");
  Reopen();
  for (const auto& [key, value] : expect) {
    EXPECT_EQ(Get(key), key[0] == 'a' ? "<absent>" : value) << key;
  }
}

// The map checkpoint (SSDMAP) written at Close.
class MapCheckpointTest : public SsdTierTest {
 protected:
  MapCheckpointTest() { options_.offload_policy = OffloadPolicy::kWriteThrough; }
  std::string Checkpoint() const { return dir_.Sub("SSDMAP"); }
  // Closes the DB, then puts the saved checkpoint back: as if the session since it was
  // saved had crashed after its last Flush (Close would have written a newer one).
  void CrashBackTo(const std::string& saved) {
    ASSERT_TRUE(db_->Close().ok());
    db_.reset();
    std::filesystem::copy_file(saved, Checkpoint(),
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::string Save() const {
    const std::string saved = dir_.Sub("saved.SSDMAP");
    std::filesystem::copy_file(Checkpoint(), saved,
                               std::filesystem::copy_options::overwrite_existing);
    return saved;
  }
  void ExpectExactly(const std::map<std::string, std::string>& expect, int absent_from) {
    for (const auto& [key, value] : expect) EXPECT_TRUE(Get(key) == value) << key;
    for (int i = absent_from; i < absent_from + 4; i++) {
      EXPECT_EQ(Get("gone." + std::to_string(i)), "<absent>");
    }
  }
  void PunchedExtentsStayPunched();
  std::map<std::string, std::string> expect_;
};

TEST_F(MapCheckpointTest, OpenLoadsTheCheckpointAndSeesWhatAFullScanSees) {
  Open();
  expect_ = PutNumbered("k", 20, 1, 3);
  for (int i = 0; i < 4; i++) Put("gone." + std::to_string(i), "x");
  ASSERT_TRUE(db_->Flush().ok());  // in their buckets' indexes, which a full scan reads
  for (int i = 0; i < 4; i++)
    ASSERT_TRUE(db_->Delete(WriteOptions(), "gone." + std::to_string(i)).ok());
  Put("k.3", expect_["k.3"] = "overwritten");
  Reopen();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 20u);
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_rejected"), 0u);
  ExpectExactly(expect_, 0);
  const uint64_t deleted = Stat(db_.get(), "ssd.deleted_bytes");
  const uint64_t tombstones = Stat(db_.get(), "ssd.tombstones");
  // The same counts as a full scan finds.
  ASSERT_TRUE(db_->Close().ok());
  std::filesystem::remove(Checkpoint());
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.keys"), 20u);
  EXPECT_EQ(Stat(db_.get(), "ssd.deleted_bytes"), deleted);
  EXPECT_EQ(Stat(db_.get(), "ssd.tombstones"), tombstones);
  ExpectExactly(expect_, 0);
}

// Buckets written after the checkpoint, and deletes logged after it, are replayed on
// top of it.
TEST_F(MapCheckpointTest, NewerBucketsAndDeletesAreRecoveredOnTopOfIt) {
  Open();
  expect_ = PutNumbered("k", 12, 1, 3);
  for (int i = 0; i < 4; i++) Put("gone." + std::to_string(i), "x");
  Reopen();
  const std::string saved = Save();
  for (int i = 0; i < 4; i++)
    ASSERT_TRUE(db_->Delete(WriteOptions(), "gone." + std::to_string(i)).ok());
  Put("k.5", expect_["k.5"] = "overwritten after the checkpoint");
  for (int i = 0; i < 6; i++)
    Put("new." + std::to_string(i),
        expect_["new." + std::to_string(i)] = test::MakeValue(50 + i, 9000));
  ASSERT_TRUE(db_->Flush().ok());
  CrashBackTo(saved);
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 16u);
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_rejected"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.keys"), 18u);
  ExpectExactly(expect_, 0);
  Reopen();  // and once more through the checkpoint this Close writes
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 18u);
  ExpectExactly(expect_, 0);
}

// A checkpoint older than a compaction is still used: the keys of the buckets compacted
// away since are dropped, the compaction's output is replayed, and the result is what a
// full scan finds (it used to be thrown away, and the full scan to run).
TEST_F(MapCheckpointTest, CheckpointOlderThanACompactionIsUsedAndItsOutputReplayed) {
  Open();
  expect_ = PutNumbered("k", 12, 1, 3);
  for (int i = 0; i < 8; i++) Put("gone." + std::to_string(i), "x");
  Reopen();
  const std::string saved = Save();
  for (int i = 0; i < 8; i++)
    ASSERT_TRUE(db_->Delete(WriteOptions(), "gone." + std::to_string(i)).ok());
  ASSERT_TRUE(db_->CompactBuckets(nullptr).ok());
  ASSERT_GT(Stat(db_.get(), "ssd.gc_buckets_compacted"), 0u);
  const uint64_t deleted = Stat(db_.get(), "ssd.deleted_bytes");
  CrashBackTo(saved);
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_rejected"), 0u);
  EXPECT_GT(Stat(db_.get(), "ssd.checkpoint_keys"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.keys"), 12u);
  EXPECT_EQ(Stat(db_.get(), "ssd.deleted_bytes"), deleted);
  ExpectExactly(expect_, 0);
  Reopen();
  ExpectExactly(expect_, 0);
}

// The GC thread writes checkpoints while puts, overwrites, deletes and compactions go
// on, copying the map a shard at a time.  Opening through one of them after a crash (it
// is put back over the one Close wrote) finds exactly what a full scan finds.
TEST_F(MapCheckpointTest, CheckpointWrittenWhileRunningOpensToWhatAFullScanFinds) {
  options_.gc_interval_ms = 2;
  options_.ssd_map_checkpoint_interval_keys = 50;
  options_.bucket_keys_limit = 32;
  options_.gc_deleted_ratio = 0.3;
  Open();
  // Cold keys in buckets nobody touches again (the checkpoint's keys that survive), then
  // hot keys that churn (their buckets are compacted away as the test goes).
  std::map<std::string, std::string> state;
  for (int i = 0; i < 2000; i++) {
    const std::string key = "s." + std::to_string(i);
    Put(key, state[key] = test::MakeValue(100000 + i, 600));
  }
  ASSERT_TRUE(db_->Flush().ok());
  std::atomic<bool> stop{false};
  std::atomic<int> writes{0};
  std::thread writer([&] {
    std::mt19937 rng(7);
    for (int n = 0; !stop.load(); n++) {
      const std::string key = "w." + std::to_string(rng() % 400);
      Status s = rng() % 4 == 0 ? db_->Delete(WriteOptions(), key)
                                : db_->Put(WriteOptions(), key, test::MakeValue(n, 1000 + n % 900));
      ASSERT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();
      writes++;
    }
  });
  std::string saved;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Stat(db_.get(), "ssd.checkpoint_writes") < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  saved = Save();  // taken while the writer runs
  const int at_save = writes.load();
  while (writes.load() < at_save + 200) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop = true;
  writer.join();
  ASSERT_GE(Stat(db_.get(), "ssd.checkpoint_writes"), 3u);
  ASSERT_TRUE(db_->Flush().ok());
  ASSERT_TRUE(db_->CompactBuckets(nullptr).ok());
  for (int i = 0; i < 400; i++) state["w." + std::to_string(i)] = Get("w." + std::to_string(i));
  CrashBackTo(saved);
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_rejected"), 0u);
  EXPECT_GT(Stat(db_.get(), "ssd.checkpoint_keys"), 0u);
  for (const auto& [key, value] : state) EXPECT_TRUE(Get(key) == value) << key;
  const uint64_t keys = Stat(db_.get(), "ssd.keys"), live = Stat(db_.get(), "ssd.live_bytes");
  ASSERT_TRUE(db_->Close().ok());
  std::filesystem::remove(Checkpoint());
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.keys"), keys);
  EXPECT_EQ(Stat(db_.get(), "ssd.live_bytes"), live);
  for (const auto& [key, value] : state) EXPECT_TRUE(Get(key) == value) << key;
}

// Bucket ids far apart (here: a checkpoint header's next bucket id damaged to 2^31, then
// a checkpoint written while running that lists the buckets before and after it) are
// pruned without a table as long as the largest id: the Open that followed allocated 24
// bytes per id below it (48 GiB) and died of it.
TEST_F(MapCheckpointTest, BucketIdsFarApartDoNotSizeTheOpensTables) {
  Open();
  expect_ = PutNumbered("k", 40, 1, 3);
  ASSERT_TRUE(db_->Close().ok());
  db_.reset();
  {
    std::fstream f(Checkpoint(), std::ios::in | std::ios::out | std::ios::binary);
    char header[48];
    ASSERT_TRUE(f.read(header, sizeof(header)).good());
    EncodeFixed64(header + 24, uint64_t{1} << 31);  // the next bucket id (the map takes 32 bits)
    EncodeFixed64(header + 40, Hash64(header, 40));
    f.seekp(0);
    f.write(header, sizeof(header));
  }
  options_.gc_interval_ms = 2;
  options_.ssd_map_checkpoint_interval_keys = 20;
  options_.bucket_keys_limit = 8;
  Open();
  for (int i = 0; i < 60; i++) {
    const std::string key = "n." + std::to_string(i);
    Put(key, expect_[key] = "v");
  }
  ASSERT_TRUE(db_->Flush().ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Stat(db_.get(), "ssd.checkpoint_writes") < 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(Stat(db_.get(), "ssd.checkpoint_writes"), 1u);
  CrashBackTo(Save());  // the one written while running: its counts are pruned at Open
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_rejected"), 0u);
  ExpectExactly(expect_, 0);
}

// Close keeps a checkpoint on disk that leaves little to replay (for a large map it
// would spend a second writing a new one); with nothing new, it writes nothing.
TEST_F(MapCheckpointTest, CloseWritesNoCheckpointWhenNothingChanged) {
  Open();
  expect_ = PutNumbered("k", 12, 1, 3);
  Reopen();
  const auto written = std::filesystem::last_write_time(Checkpoint());
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_backlog"), 0u);
  ExpectExactly(expect_, 0);
  Reopen();
  EXPECT_EQ(std::filesystem::last_write_time(Checkpoint()), written);
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 12u);
  ExpectExactly(expect_, 0);
}

// A bucket the checkpoint lists that is not the file it described (written again: another
// creation time) makes the checkpoint stale: the full scan runs.
TEST_F(MapCheckpointTest, StaleCheckpointFallsBackToTheFullScan) {
  Open();
  expect_ = PutNumbered("k", 12, 1, 3);
  Reopen();
  const std::string saved = Save();
  ASSERT_TRUE(db_->Close().ok());
  db_.reset();
  std::string first;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("bucket-") && (first.empty() || name < first)) first = name;
  }
  ASSERT_FALSE(first.empty());
  {
    // Same entries, another creation time: a file of that name written again.
    std::fstream f(dir_.Sub(first), std::ios::in | std::ios::out | std::ios::binary);
    std::string header(kBucketHeaderSize, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header.size()));
    BucketHeader h;
    ASSERT_TRUE(h.DecodeFrom(header).ok());
    h.created_micros++;
    h.EncodeTo(header.data());
    f.seekp(0);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
  }
  std::filesystem::copy_file(saved, Checkpoint(),
                             std::filesystem::copy_options::overwrite_existing);
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_rejected"), 1u);
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.keys"), 12u);
  ExpectExactly(expect_, 0);
}

TEST_F(MapCheckpointTest, DamagedCheckpointFallsBackToTheFullScan) {
  Open();
  expect_ = PutNumbered("k", 12, 1, 3);
  ASSERT_TRUE(db_->Close().ok());
  db_.reset();
  const uint64_t size = std::filesystem::file_size(Checkpoint());
  for (uint64_t at : {uint64_t{3}, uint64_t{100}, size / 2, size - 3}) {
    std::string data;
    {
      std::ifstream f(Checkpoint(), std::ios::binary);
      data.assign(std::istreambuf_iterator<char>(f), {});
    }
    const std::string good = data;
    data[at] ^= 0x10;
    { std::ofstream(Checkpoint(), std::ios::binary | std::ios::trunc) << data; }
    Open();
    EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_rejected"), 1u) << at;
    EXPECT_EQ(Stat(db_.get(), "ssd.keys"), 12u) << at;
    ExpectExactly(expect_, 0);
    ASSERT_TRUE(db_->Close().ok());  // writes a good one again
    db_.reset();
    std::ifstream f(Checkpoint(), std::ios::binary);
    EXPECT_TRUE(std::string(std::istreambuf_iterator<char>(f), {}) == good);
  }
}

// A hole punched before Close is remembered: the first GC round after the restart
// neither punches it again nor counts it again.
TEST_F(MapCheckpointTest, PunchedExtentsStayPunchedAcrossRestart) { PunchedExtentsStayPunched(); }

// Without a checkpoint the full scan asks the file where its holes are.
TEST_F(MapCheckpointTest, PunchedExtentsStayPunchedAcrossAFullScan) {
  options_.ssd_map_checkpoint = false;
  PunchedExtentsStayPunched();
}

void MapCheckpointTest::PunchedExtentsStayPunched() {
  options_.gc_deleted_ratio = 2.0;  // holes only, no compaction
  options_.gc_merge_deleted_ratio = 2.0;
  Open();
  expect_ = PutNumbered("k", 12, 1, 3);
  for (int i = 0; i < 4; i++) Put("gone." + std::to_string(i), test::MakeValue(90 + i, kValue));
  ASSERT_TRUE(db_->Flush().ok());
  for (int i = 0; i < 4; i++)
    ASSERT_TRUE(db_->Delete(WriteOptions(), "gone." + std::to_string(i)).ok());
  ASSERT_TRUE(db_->CompactBuckets(nullptr).ok());
  ASSERT_EQ(Stat(db_.get(), "ssd.gc_bytes_punched"), 4 * uint64_t{kValue});
  ASSERT_EQ(Stat(db_.get(), "ssd.gc_buckets_compacted"), 0u);
  const uint64_t used = Stat(db_.get(), "ssd.used_bytes");
  Reopen();
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used);
  ASSERT_TRUE(db_->CompactBuckets(nullptr).ok());
  EXPECT_EQ(Stat(db_.get(), "ssd.gc_bytes_punched"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.used_bytes"), used);
  ExpectExactly(expect_, 0);
}

}  // namespace
}  // namespace kvengine
