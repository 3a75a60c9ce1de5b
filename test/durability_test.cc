// Flush() and Close() make the DB durable in both offload policies: values that are only in
// the memory tier (write_back) reach SSD buckets, and a process killed right after a
// completed Flush() reopens with them bit-exact.  (crash_test.cc kills at random points;
// these tests pin down each promise on its own.)

#include <sstream>

#include "env/fault_injection_env.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

constexpr int kValues = 48;

std::string Key(int i) { return "durable." + std::to_string(i); }
size_t ValueSize(int i) { return 1000 + 3777 * static_cast<size_t>(i); }

// Room for every value in memory: with write_back nothing would reach SSD by eviction.
Options RoomyWriteBack() {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 32 << 20;
  o.memory_slab_size = 1 << 20;
  o.offload_policy = OffloadPolicy::kWriteBack;
  o.bucket_keys_limit = 16;
  o.bucket_flush_timeout_ms = 60000;  // only Flush() seals
  o.tombstone_sync_interval_ms = 0;   // only Flush() makes deletes durable
  o.log_level = LogLevel::kError;
  return o;
}

using test::StatOf;

// Puts kValues values, deletes every fifth, then checks what a reopened DB holds.
void PutAndDelete(DB* db) {
  for (int i = 0; i < kValues; i++) {
    ASSERT_TRUE(db->Put(WriteOptions(), Key(i), test::MakeValue(i, ValueSize(i))).ok());
  }
  for (int i = 0; i < kValues; i += 5) ASSERT_TRUE(db->Delete(WriteOptions(), Key(i)).ok());
}

void ExpectAllThere(DB* db) {
  for (int i = 0; i < kValues; i++) {
    std::string got;
    Status s = db->Get(ReadOptions(), Key(i), &got);
    if (i % 5 == 0) {
      EXPECT_TRUE(s.IsNotFound()) << Key(i) << ": " << s.ToString();
    } else {
      ASSERT_TRUE(s.ok()) << Key(i) << ": " << s.ToString();
      EXPECT_TRUE(got == test::MakeValue(i, ValueSize(i))) << Key(i) << " differs";
    }
  }
}

TEST(DurabilityTest, WriteBackFlushSurvivesSigkill) {
  test::TempDir dir;
  const int rc = test::KillAfter([&] {
    std::unique_ptr<DB> db;
    if (!DB::Open(RoomyWriteBack(), dir.path(), &db).ok()) return 3;
    for (int i = 0; i < kValues; i++) {
      if (!db->Put(WriteOptions(), Key(i), test::MakeValue(i, ValueSize(i))).ok()) return 4;
    }
    for (int i = 0; i < kValues; i += 5) {
      if (!db->Delete(WriteOptions(), Key(i)).ok()) return 5;
    }
    return db->Flush().ok() ? 0 : 6;
  });
  ASSERT_EQ(rc, 0) << "the child failed before its Flush completed";

  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(RoomyWriteBack(), dir.path(), &db).ok());
  ExpectAllThere(db.get());
}

TEST(DurabilityTest, FlushKeepsValuesInMemoryAndWritesEachOnce) {
  test::TempDir dir;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(RoomyWriteBack(), dir.path(), &db).ok());
  PutAndDelete(db.get());
  ASSERT_TRUE(db->Flush().ok());
  const uint64_t live = kValues - (kValues + 4) / 5;
  EXPECT_EQ(StatOf(db.get(), "ssd.offloads"), live);
  EXPECT_EQ(StatOf(db.get(), "memory.items"), live);  // still served from memory
  ASSERT_TRUE(db->Flush().ok());
  EXPECT_EQ(StatOf(db.get(), "ssd.offloads"), live) << "a second Flush wrote values again";
  // A value written after the Flush is the only one the next Flush writes.
  ASSERT_TRUE(db->Put(WriteOptions(), Key(1), test::MakeValue(1, ValueSize(1))).ok());
  ASSERT_TRUE(db->Flush().ok());
  EXPECT_EQ(StatOf(db.get(), "ssd.offloads"), live + 1);
  ExpectAllThere(db.get());
}

TEST(DurabilityTest, CloseWritesMemoryOnlyValuesUnlessTurnedOff) {
  test::TempDir dir;
  {
    std::unique_ptr<DB> db;
    ASSERT_TRUE(DB::Open(RoomyWriteBack(), dir.path(), &db).ok());
    PutAndDelete(db.get());
    ASSERT_TRUE(db->Close().ok());
  }
  {
    std::unique_ptr<DB> db;
    ASSERT_TRUE(DB::Open(RoomyWriteBack(), dir.path(), &db).ok());
    ExpectAllThere(db.get());
  }
  // A pure memory cache: nothing new reaches the disk at Close.
  Options no_flush = RoomyWriteBack();
  no_flush.flush_on_close = false;
  {
    std::unique_ptr<DB> db;
    ASSERT_TRUE(DB::Open(no_flush, dir.path(), &db).ok());
    ASSERT_TRUE(db->Put(WriteOptions(), "memory.only", "gone after close").ok());
    ASSERT_TRUE(db->Close().ok());
  }
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(no_flush, dir.path(), &db).ok());
  std::string got;
  EXPECT_TRUE(db->Get(ReadOptions(), "memory.only", &got).IsNotFound());
  ExpectAllThere(db.get());  // what the first Close wrote is still there
}

TEST(DurabilityTest, FlushIntoAFullSsdTierSaysHowManyFailed) {
  test::TempDir dir;
  Options o = RoomyWriteBack();
  o.ssd_capacity_bytes = 256 << 10;
  o.disable_ssd_eviction = true;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  for (int i = 0; i < 8; i++) {
    ASSERT_TRUE(db->Put(WriteOptions(), Key(i), test::MakeValue(i, 100 << 10)).ok());
  }
  Status s = db->Flush();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_NE(s.ToString().find("values could not be written to SSD"), std::string::npos)
      << s.ToString();
  for (int i = 0; i < 8; i++) {  // every value is still served
    std::string got;
    ASSERT_TRUE(db->Get(ReadOptions(), Key(i), &got).ok());
    EXPECT_TRUE(got == test::MakeValue(i, 100 << 10));
  }
  EXPECT_FALSE(db->Close().ok());  // Close reports the same shortfall, and still closes
  EXPECT_TRUE(db->Close().ok());
}

// Values of over a third of a small tier, on a disk slower than the puts: the room a new
// bucket needs is held by buckets the writer has not written yet, which cannot be evicted
// before they are. The put waits for the writer (within its own wait) and succeeds,
// rather than failing NoSpace "nothing on disk can be evicted yet".
TEST(DurabilityTest, APutWaitsForAWriterBehindInsteadOfFindingNoRoom) {
  test::TempDir dir;
  FaultInjectionEnv env(Env::Default());
  Options o = RoomyWriteBack();
  o.env = &env;
  o.use_direct_io = false;  // every write through env, which delays them
  o.use_io_uring = false;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  o.ssd_capacity_bytes = 2 << 20;
  o.ssd_eviction = SsdEviction::kFifo;
  o.gc_interval_ms = 0;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  env.SetWriteDelay(std::chrono::milliseconds(40));
  const size_t kSize = 700 << 10;  // a bucket of its own, over a third of the tier
  for (int i = 0; i < 8; i++) {
    const Status s = db->Put(WriteOptions(), Key(i), test::MakeValue(i, kSize));
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }
  const Status flushed = db->Flush();
  EXPECT_TRUE(flushed.ok()) << flushed.ToString();
  env.SetWriteDelay(std::chrono::microseconds(0));
  std::string got;
  ASSERT_TRUE(db->Get(ReadOptions(), Key(7), &got).ok());
  EXPECT_TRUE(got == test::MakeValue(7, kSize));
}

}  // namespace
}  // namespace kvengine
