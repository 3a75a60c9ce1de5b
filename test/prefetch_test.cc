// DB::Prefetch: promotion ahead of the load (db/prefetcher.h).  Values are put on SSD by
// a Close and a reopen (the memory tier restarts empty), then prefetched and read.
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

constexpr size_t kValueSize = 64 << 10;

std::string ValueOf(const std::string& key, size_t size = kValueSize) {
  return test::MakeValue(std::hash<std::string>()(key), size);
}

uint64_t Stat(DB* db, const std::string& name) { return test::StatOf(db, name); }

class PrefetchTest : public ::testing::Test {
 protected:
  Options DbOptions() const {
    Options o;
    o.apply_environment = false;
    o.memory_capacity_bytes = 64ull << 20;
    o.memory_slab_size = 1ull << 20;
    o.prefault_memory = false;
    o.ssd_capacity_bytes = 256ull << 20;
    o.use_direct_io = false;
    o.promote_on_read = false;  // a memory hit is then the prefetch's doing
    return o;
  }
  // Writes `n` keys, closes (making them durable) and reopens: every value is on SSD
  // only.  Reopens with `options`.
  void WriteAndReopen(size_t n, const Options& options) {
    ASSERT_TRUE(DB::Open(options, dir_.path(), &db_).ok());
    for (size_t i = 0; i < n; i++) {
      keys_.push_back("model@tp0/layer." + std::to_string(i));
      ASSERT_TRUE(db_->Put(WriteOptions(), keys_.back(), ValueOf(keys_.back())).ok());
    }
    ASSERT_TRUE(db_->Close().ok());
    db_.reset();
    Status s = DB::Open(options, dir_.path(), &db_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    slices_.assign(keys_.begin(), keys_.end());
  }
  // Reads every key into its own buffer and checks the bytes.
  void ReadAllAndCheck() {
    std::vector<std::string> buffers(keys_.size(), std::string(kValueSize, '\0'));
    std::vector<Destination> dests;
    for (std::string& b : buffers) dests.push_back({MutableSlice(b.data(), b.size())});
    std::vector<int64_t> results;
    ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), slices_, dests, &results).ok());
    for (size_t i = 0; i < keys_.size(); i++) {
      ASSERT_EQ(results[i], static_cast<int64_t>(kValueSize)) << keys_[i];
      ASSERT_TRUE(buffers[i] == ValueOf(keys_[i])) << keys_[i];
    }
  }
  // Waits (bounded) until the prefetcher has brought `n` values into memory.
  bool AwaitPrefetched(uint64_t n) {
    for (int i = 0; i < 500; i++) {
      if (Stat(db_.get(), "prefetched") >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  test::TempDir dir_;
  std::unique_ptr<DB> db_;
  std::vector<std::string> keys_;
  std::vector<Slice> slices_;
};

TEST_F(PrefetchTest, BringsSsdValuesIntoMemoryAndReadsHitThere) {
  WriteAndReopen(32, DbOptions());
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->Prefetch(slices_, &results).ok());
  ASSERT_EQ(results, std::vector<int64_t>(keys_.size(), 1));
  ASSERT_TRUE(AwaitPrefetched(keys_.size()));
  const uint64_t ssd_reads = Stat(db_.get(), "ssd.reads");
  ReadAllAndCheck();
  EXPECT_EQ(Stat(db_.get(), "memory.hits"), keys_.size());
  EXPECT_EQ(Stat(db_.get(), "ssd.hits"), 0u);
  EXPECT_EQ(Stat(db_.get(), "ssd.reads"), ssd_reads);  // nothing read a second time
  EXPECT_EQ(Stat(db_.get(), "prefetch_hits"), keys_.size());
  ReadAllAndCheck();  // a hit counts once per prefetch
  EXPECT_EQ(Stat(db_.get(), "prefetch_hits"), keys_.size());
  EXPECT_EQ(Stat(db_.get(), "prefetch_requested"), keys_.size());
  EXPECT_EQ(Stat(db_.get(), "prefetch_wasted"), 0u);
}

TEST_F(PrefetchTest, AReadRightAfterThePrefetchWaitsForItInsteadOfReadingAgain) {
  WriteAndReopen(64, DbOptions());
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->Prefetch(slices_, &results).ok());
  ReadAllAndCheck();  // at once: every key is still on its way, or just arrived
  EXPECT_EQ(Stat(db_.get(), "ssd.hits"), 0u);
  EXPECT_EQ(Stat(db_.get(), "memory.hits"), keys_.size());
  EXPECT_EQ(Stat(db_.get(), "ssd.reads"), keys_.size());  // each value read from SSD once
}

TEST_F(PrefetchTest, SkipsWhatNeedsNoReadAndRefusesBadKeys) {
  WriteAndReopen(4, DbOptions());
  ASSERT_TRUE(db_->Put(WriteOptions(), "in-memory", "v").ok());
  std::vector<Slice> keys = {slices_[0], Slice("in-memory"), Slice("absent"), Slice(""),
                             slices_[0]};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->Prefetch(keys, &results).ok());
  ASSERT_EQ(results.size(), keys.size());
  EXPECT_EQ(results[0], 1);
  EXPECT_EQ(results[1], 0);  // in memory
  EXPECT_EQ(results[2], 0);  // absent
  EXPECT_EQ(results[3], Status::InvalidArgument("").ErrorCode());  // empty key
  EXPECT_EQ(results[4], 0);  // already on its way
  EXPECT_TRUE(db_->Prefetch(keys, nullptr).IsInvalidArgument());
  // A closed DB refuses.
  ASSERT_TRUE(db_->Close().ok());
  EXPECT_TRUE(db_->Prefetch(keys, &results).IsAborted());
}

TEST_F(PrefetchTest, StaysWithinItsByteBoundAndDropsTheRest) {
  Options o = DbOptions();
  o.prefetch_max_bytes = 4 * kValueSize;
  WriteAndReopen(16, o);
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->Prefetch(slices_, &results).ok());
  uint64_t started = 0;
  for (int64_t r : results) started += r == 1;
  EXPECT_GE(started, 1u);
  EXPECT_LE(started, 4u);
  EXPECT_EQ(Stat(db_.get(), "prefetch_dropped"), keys_.size() - started);
  ReadAllAndCheck();  // the rest is read from SSD as usual
}

TEST_F(PrefetchTest, ANewerWriteOrADeleteWins) {
  WriteAndReopen(16, DbOptions());
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->Prefetch(slices_, &results).ok());
  // While the reads may be on their way: overwrite one key, delete another.
  ASSERT_TRUE(db_->Put(WriteOptions(), slices_[3], "newer").ok());
  ASSERT_TRUE(db_->Delete(WriteOptions(), slices_[5]).ok());
  ASSERT_TRUE(AwaitPrefetched(keys_.size() - 2));
  std::string v;
  ASSERT_TRUE(db_->Get(ReadOptions(), slices_[3], &v).ok());
  EXPECT_EQ(v, "newer");
  EXPECT_TRUE(db_->Get(ReadOptions(), slices_[5], &v).IsNotFound());
  ASSERT_TRUE(db_->Get(ReadOptions(), slices_[7], &v).ok());
  EXPECT_TRUE(v == ValueOf(keys_[7]));
}

TEST_F(PrefetchTest, AValueThatLeftMemoryUnreadCountsWasted) {
  WriteAndReopen(8, DbOptions());
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->Prefetch(slices_, &results).ok());
  ASSERT_TRUE(AwaitPrefetched(keys_.size()));
  ASSERT_TRUE(db_->Delete(WriteOptions(), slices_[0]).ok());
  std::string v;
  EXPECT_TRUE(db_->Get(ReadOptions(), slices_[0], &v).IsNotFound());
  EXPECT_EQ(Stat(db_.get(), "prefetch_wasted"), 1u);
}

TEST_F(PrefetchTest, WorksThroughAnAttachedClient) {
  Options o = DbOptions();
  const std::string socket = dir_.Sub("kv.sock");
  o.local_listen = socket;
  WriteAndReopen(8, o);
  std::unique_ptr<DB> client;
  Options c;
  c.apply_environment = false;
  c.peer_timeout_ms = 5000;
  Status s = DB::Attach(c, socket, &client);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<int64_t> results;
  ASSERT_TRUE(client->Prefetch(slices_, &results).ok());
  EXPECT_EQ(results, std::vector<int64_t>(keys_.size(), 1));
  ASSERT_TRUE(AwaitPrefetched(keys_.size()));
  std::string v;
  ASSERT_TRUE(client->Get(ReadOptions(), slices_[2], &v).ok());
  EXPECT_TRUE(v == ValueOf(keys_[2]));
  EXPECT_EQ(Stat(db_.get(), "ssd.hits"), 0u);
  std::vector<Slice> empty_key = {Slice("")};
  ASSERT_TRUE(client->Prefetch(empty_key, &results).ok());
  EXPECT_LT(results[0], 0);
  ASSERT_TRUE(client->Close().ok());
}

TEST(PrefetchWithoutSsd, QueuesNothing) {
  test::TempDir dir;
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 16ull << 20;
  o.memory_slab_size = 1ull << 20;
  o.prefault_memory = false;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  std::vector<Slice> keys = {Slice("a"), Slice("b")};
  std::vector<int64_t> results;
  ASSERT_TRUE(db->Prefetch(keys, &results).ok());
  EXPECT_EQ(results, std::vector<int64_t>(2, 0));
}

}  // namespace
}  // namespace kvengine
