// LMCacheQueue (python/src/lmcache_queue.h), the C++ core of kvengine's LMCache plug-in,
// over a real DB: the per-key results LMCache reads, the eventfd, submits that only
// queue, Close with batches queued and running, concurrent submitters.  Run under
// ASan/UBSan and TSan as well (docs/lmcache.md).
#include "python/src/lmcache_queue.h"

#include <poll.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"
#include "util/printable.h"

namespace kvengine {
namespace lmcache {
namespace {

class LMCacheQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options o;
    o.apply_environment = false;
    o.memory_capacity_bytes = 64ull << 20;
    o.prefault_memory = false;
    std::unique_ptr<DB> db;
    ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
    db_ = std::shared_ptr<DB>(std::move(db));
  }
  void TearDown() override {
    queue_.reset();
    if (db_) db_->Close();
  }

  void Start(int workers = 2, bool register_buffers = false, uint64_t part_bytes = 64 << 20) {
    QueueOptions o;
    o.workers = workers;
    o.register_buffers = register_buffers;
    o.part_bytes = part_bytes;
    ASSERT_TRUE(LMCacheQueue::Create(db_, o, &queue_).ok());
  }

  uint64_t Submit(BatchOp op, std::vector<std::string> keys, std::vector<MutableSlice> buffers,
                  std::shared_ptr<void> keepalive = nullptr) {
    BatchRequest r{op, std::move(keys), std::move(buffers), std::move(keepalive)};
    uint64_t id = 0;
    Status s = queue_->Submit(std::move(r), &id);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return id;
  }

  // Waits on the eventfd until n completions have been drained (bounded).
  std::vector<BatchCompletion> DrainN(size_t n) {
    std::vector<BatchCompletion> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
      pollfd p{queue_->event_fd(), POLLIN, 0};
      ::poll(&p, 1, 200);
      for (auto& c : queue_->Drain()) out.push_back(std::move(c));
    }
    EXPECT_EQ(out.size(), n);
    return out;
  }

  BatchCompletion One() {
    auto v = DrainN(1);
    return v.empty() ? BatchCompletion{} : std::move(v[0]);
  }

  test::TempDir dir_;
  std::shared_ptr<DB> db_;
  std::unique_ptr<LMCacheQueue> queue_;
};

MutableSlice Of(std::string& s) { return MutableSlice(s.data(), s.size()); }

// LMCache logs a completion's error: a failed key of 64 KiB is named by its first 64
// bytes, its length and its hash (issue #49 item 4), not whole.
TEST_F(LMCacheQueueTest, AFailedLongKeyIsNamedShortened) {
  Start();
  const std::string key(65536, 'm');
  std::string buf(64, 'x');
  Submit(BatchOp::kGet, {key}, {Of(buf)});
  BatchCompletion get = One();
  EXPECT_FALSE(get.ok);
  EXPECT_LT(get.error.size(), 400u);
  EXPECT_NE(get.error.find("first: key " + Printable(Slice(key))), std::string::npos) << get.error;
}

TEST_F(LMCacheQueueTest, PerKeyResultsAsLMCacheReadsThem) {
  Start();
  std::string a = test::MakeValue(1, 4096), b = test::MakeValue(2, 4096);
  Submit(BatchOp::kSet, {"a", "b"}, {Of(a), Of(b)});
  BatchCompletion set = One();
  EXPECT_TRUE(set.ok) << set.error;
  EXPECT_FALSE(set.has_per_key);

  // Lookup with a hole, then a load over stale bytes.
  Submit(BatchOp::kExists, {"a", "hole", "b"}, {});
  BatchCompletion exists = One();
  EXPECT_TRUE(exists.ok);
  EXPECT_EQ(exists.per_key, (std::vector<uint8_t>{1, 0, 1}));

  std::string da(4096, 'x'), dh(4096, 'x'), db(4096, 'x');
  Submit(BatchOp::kGet, {"a", "hole", "b"}, {Of(da), Of(dh), Of(db)});
  BatchCompletion get = One();
  EXPECT_FALSE(get.ok);
  EXPECT_NE(get.error.find("1 of 3 keys failed; first: key 'hole'"), std::string::npos)
      << get.error;
  EXPECT_EQ(get.per_key, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(da, a);
  EXPECT_EQ(db, b);
  EXPECT_EQ(dh, std::string(4096, 'x'));

  Submit(BatchOp::kDelete, {"a", "hole"}, {});
  BatchCompletion del = One();
  EXPECT_TRUE(del.ok) << del.error;
  EXPECT_EQ(del.per_key, (std::vector<uint8_t>{1, 0}));
}

TEST_F(LMCacheQueueTest, AValueOfAnotherSizeIsNotLoaded) {
  Start();
  std::string v = test::MakeValue(3, 1000);
  Submit(BatchOp::kSet, {"k"}, {Of(v)});
  ASSERT_TRUE(One().ok);
  std::string bigger(2000, 0), smaller(500, 0);
  Submit(BatchOp::kGet, {"k"}, {Of(bigger)});
  BatchCompletion c = One();
  EXPECT_EQ(c.per_key, std::vector<uint8_t>{0});
  EXPECT_NE(c.error.find("value is 1000 bytes, buffer 2000"), std::string::npos) << c.error;
  Submit(BatchOp::kGet, {"k"}, {Of(smaller)});
  c = One();
  EXPECT_EQ(c.per_key, std::vector<uint8_t>{0});
  EXPECT_NE(c.error.find("buffer_too_small"), std::string::npos) << c.error;
}

TEST_F(LMCacheQueueTest, AWholeBatchFailureFailsEveryKey) {
  Start();
  std::string v = "value";
  Submit(BatchOp::kSet, {"dup", "dup"}, {Of(v), Of(v)});
  BatchCompletion c = One();
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("set: InvalidArgument"), std::string::npos) << c.error;
  db_->Close();  // the store goes away under the queue
  Submit(BatchOp::kExists, {"x", "y"}, {});
  c = One();
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("Aborted"), std::string::npos) << c.error;
  EXPECT_EQ(c.per_key, (std::vector<uint8_t>{0, 0}));
}

TEST_F(LMCacheQueueTest, BadRequestsAreRefusedAndQueueNothing) {
  Start();
  std::string v = "v";
  uint64_t id = 0;
  std::weak_ptr<void> weak;
  {
    auto keepalive = std::make_shared<int>(1);
    weak = keepalive;
    BatchRequest r{BatchOp::kSet, {"a", "b"}, {Of(v)}, keepalive};
    keepalive.reset();
    Status s = queue_->Submit(std::move(r), &id);
    EXPECT_TRUE(s.IsInvalidArgument());
    EXPECT_NE(s.ToString().find("1 buffers for 2 keys"), std::string::npos);
  }
  EXPECT_TRUE(weak.expired());  // dropped at once
  BatchRequest r{BatchOp::kExists, {"a"}, {Of(v)}, nullptr};
  EXPECT_TRUE(queue_->Submit(std::move(r), &id).IsInvalidArgument());
  EXPECT_EQ(Submit(BatchOp::kExists, {"a"}, {}), 1u);  // the first id: nothing was queued
  QueueOptions o;
  o.workers = 0;
  std::unique_ptr<LMCacheQueue> q;
  EXPECT_TRUE(LMCacheQueue::Create(db_, o, &q).IsInvalidArgument());
  EXPECT_TRUE(LMCacheQueue::Create(nullptr, QueueOptions(), &q).IsInvalidArgument());
}

TEST_F(LMCacheQueueTest, DrainResetsTheEventfdAndKeepaliveGoesWithTheCompletion) {
  Start();
  std::string v = "v";
  auto keepalive = std::make_shared<int>(7);
  std::weak_ptr<void> weak = keepalive;
  Submit(BatchOp::kSet, {"a"}, {Of(v)}, std::move(keepalive));
  {
    BatchCompletion c = One();
    EXPECT_FALSE(weak.expired());  // the buffers stay pinned until the completion goes
  }
  EXPECT_TRUE(weak.expired());
  pollfd p{queue_->event_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  EXPECT_TRUE(queue_->Drain().empty());
}

TEST_F(LMCacheQueueTest, SubmitsOnlyQueue) {
  Start(/*workers=*/1);
  std::string big(4 << 20, 'b');
  const int n = 16;
  for (int i = 0; i < n; ++i) Submit(BatchOp::kSet, {"big" + std::to_string(i)}, {Of(big)});
  // Not a timing check: evidence that Submit returned before the batches ran.
  std::vector<BatchCompletion> early = queue_->Drain();
  EXPECT_LT(early.size(), static_cast<size_t>(n));
  for (auto& c : DrainN(n - early.size())) EXPECT_TRUE(c.ok) << c.error;
}

TEST_F(LMCacheQueueTest, CloseCancelsQueuedBatchesAndWaitsForRunningOnes) {
  Start(/*workers=*/1);
  std::string big(4 << 20, 'c');
  std::vector<std::weak_ptr<void>> pins;
  for (int i = 0; i < 8; ++i) {
    auto k = std::make_shared<int>(i);
    pins.push_back(k);
    Submit(BatchOp::kSet, {"c" + std::to_string(i)}, {Of(big)}, std::move(k));
  }
  queue_->Close();
  queue_->Close();
  EXPECT_EQ(queue_->event_fd(), -1);
  uint64_t id;
  EXPECT_TRUE(queue_->Submit(BatchRequest{BatchOp::kExists, {"a"}, {}, nullptr}, &id).IsAborted());
  std::vector<BatchCompletion> done = queue_->Drain();
  ASSERT_EQ(done.size(), 8u);
  size_t cancelled = 0;
  for (auto& c : done) {
    if (!c.ok) {
      ++cancelled;
      EXPECT_NE(c.error.find("closed"), std::string::npos) << c.error;
    }
  }
  EXPECT_GE(cancelled, 1u);
  done.clear();
  for (auto& w : pins) EXPECT_TRUE(w.expired());
}

TEST_F(LMCacheQueueTest, ConcurrentSubmittersEachGetTheirOwnResults) {
  Start(/*workers=*/3);
  const int per_thread = 50;
  std::vector<std::string> values(3 * per_thread);
  for (size_t i = 0; i < values.size(); ++i) values[i] = test::MakeValue(i, 1024);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        const int k = t * per_thread + i;
        Submit(BatchOp::kSet, {"t" + std::to_string(k)}, {Of(values[k])});
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& c : DrainN(3 * per_thread)) EXPECT_TRUE(c.ok) << c.error;
  std::vector<std::string> keys;
  std::vector<std::string> dest(values.size(), std::string(1024, 0));
  std::vector<MutableSlice> bufs;
  for (size_t i = 0; i < values.size(); ++i) {
    keys.push_back("t" + std::to_string(i));
    bufs.push_back(Of(dest[i]));
  }
  Submit(BatchOp::kGet, keys, bufs);
  BatchCompletion c = One();
  EXPECT_TRUE(c.ok) << c.error;
  EXPECT_EQ(dest, values);
}

TEST_F(LMCacheQueueTest, RegisterBuffersOnFirstSight) {
  Start(/*workers=*/1, /*register_buffers=*/true);
  std::string v(4096, 'r');
  Submit(BatchOp::kSet, {"r"}, {Of(v)});
  EXPECT_TRUE(One().ok);
  // Registered: registering it again is refused as an overlap.
  EXPECT_TRUE(db_->RegisterBuffer(v.data(), v.size()).IsInvalidArgument());
  // A buffer overlapping a registered one still works, unregistered.
  MutableSlice inner(v.data() + 100, 1000);
  Submit(BatchOp::kSet, {"inner"}, {inner});
  EXPECT_TRUE(One().ok);
  queue_->Close();  // unregisters what it registered
  EXPECT_TRUE(db_->RegisterBuffer(v.data(), v.size()).ok());
  EXPECT_TRUE(db_->UnregisterBuffer(v.data()).ok());
}

TEST_F(LMCacheQueueTest, BatchesCutIntoPartsKeepEveryKeysResult) {
  Start(/*workers=*/3, /*register_buffers=*/false, /*part_bytes=*/3000);
  std::vector<std::string> keys, values, dest;
  std::vector<MutableSlice> src, dst;
  for (int i = 0; i < 10; ++i) {
    keys.push_back("p" + std::to_string(i));
    values.push_back(test::MakeValue(100 + i, 1000));
    dest.push_back(std::string(1000, '-'));
  }
  for (int i = 0; i < 10; ++i) src.push_back(Of(values[i]));
  for (int i = 0; i < 10; ++i) dst.push_back(Of(dest[i]));
  // Stored in four parts of at most 3 keys; key 5 is then deleted: a hole in a middle part.
  Submit(BatchOp::kSet, keys, src);
  BatchCompletion set = One();
  ASSERT_TRUE(set.ok) << set.error;
  ASSERT_TRUE(db_->Delete(WriteOptions(), "p5").ok());
  Submit(BatchOp::kGet, keys, dst);
  BatchCompletion get = One();
  EXPECT_FALSE(get.ok);
  EXPECT_NE(get.error.find("1 of 10 keys failed; first: key 'p5': not_found"), std::string::npos)
      << get.error;
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(get.per_key[i], i == 5 ? 0 : 1) << i;
    EXPECT_EQ(dest[i], i == 5 ? std::string(1000, '-') : values[i]) << i;
  }
  // A set naming a key twice is not cut: the engine refuses it whole, as uncut.
  std::vector<std::string> dup_keys(keys);
  dup_keys[9] = "p0";
  Submit(BatchOp::kSet, dup_keys, src);
  BatchCompletion dup = One();
  EXPECT_FALSE(dup.ok);
  EXPECT_NE(dup.error.find("set: InvalidArgument"), std::string::npos) << dup.error;
}

TEST_F(LMCacheQueueTest, AnEmptyBatchCompletes) {
  Start();
  Submit(BatchOp::kExists, {}, {});
  BatchCompletion c = One();
  EXPECT_TRUE(c.has_per_key);
  EXPECT_TRUE(c.per_key.empty());
  EXPECT_TRUE(c.ok) << c.error;
}

TEST_F(LMCacheQueueTest, ReplaceDbSendsLaterBatchesToTheNewStore) {
  Start();
  test::TempDir other_dir;
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 16ull << 20;
  o.prefault_memory = false;
  std::unique_ptr<DB> other;
  ASSERT_TRUE(DB::Open(o, other_dir.path(), &other).ok());
  std::string v = "in-the-other";
  ASSERT_TRUE(other->Put(WriteOptions(), "only-there", v).ok());
  queue_->ReplaceDb(std::shared_ptr<DB>(std::move(other)));
  Submit(BatchOp::kExists, {"only-there"}, {});
  EXPECT_EQ(One().per_key, std::vector<uint8_t>{1});
  queue_.reset();  // closes the other store before its directory goes
}

}  // namespace
}  // namespace lmcache
}  // namespace kvengine
