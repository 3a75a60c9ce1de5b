// The removal feed (DB::ReadRemovals) and BatchLocate: every way a value leaves a tier is
// announced once, with its tier and reason; readers keep their own cursors; a reader that
// falls behind the ring learns how many events it missed; attached clients read the
// owner's feed.  Also the ring itself (db/removal_feed.h).
#include "db/removal_feed.h"

#include <algorithm>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "kvengine/env.h"
#include "test/test_util.h"
#include "util/namespace_key.h"

namespace kvengine {
namespace {

constexpr size_t kValue = 64 << 10;

class RemovalFeedTest : public ::testing::Test {
 protected:
  RemovalFeedTest() {
    options_.apply_environment = false;
    options_.memory_capacity_bytes = 1 << 20;  // 16 values of 64 KiB
    options_.memory_slab_size = 64 << 10;
    options_.prefault_memory = false;
    options_.bucket_keys_limit = 4;
    options_.bucket_size_limit = 1 << 20;
    options_.gc_interval_ms = 0;
    options_.promote_on_read = false;
  }
  void TearDown() override {
    if (db_) db_->Close();
    db_.reset();
  }
  void Open() {
    db_.reset();
    Status s = DB::Open(options_, dir_.path(), &db_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void Put(const std::string& key) {
    Status s = db_->Put(WriteOptions(), key, test::MakeValue(key.size(), kValue));
    ASSERT_TRUE(s.ok()) << key << ": " << s.ToString();
  }
  // Everything after `cursor_`, read in small batches; advances the cursor.
  std::vector<RemovalEvent> Drain(DB* db, uint64_t* missed = nullptr) {
    std::vector<RemovalEvent> all;
    RemovalBatch batch;
    do {
      Status s = db->ReadRemovals(cursor_, 3, &batch);
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) break;
      if (missed != nullptr) *missed += batch.missed;
      for (auto& e : batch.events) {
        EXPECT_GT(e.sequence, cursor_);
        cursor_ = e.sequence;
        all.push_back(e);
      }
    } while (!batch.events.empty());
    return all;
  }
  static std::string Describe(const RemovalEvent& e) {
    return e.key + (e.tier == RemovalEvent::kMemory ? "@memory" : "@ssd") +
           (e.reason == RemovalEvent::kCapacity ? ":capacity" : ":deleted");
  }
  static std::multiset<std::string> Described(const std::vector<RemovalEvent>& events) {
    std::multiset<std::string> out;
    for (const auto& e : events) out.insert(Describe(e));
    return out;
  }

  test::TempDir dir_;
  Options options_;
  std::unique_ptr<DB> db_;
  uint64_t cursor_ = 0;
};

TEST_F(RemovalFeedTest, DeletesAreAnnouncedPerTierFromTheFirstReadOn) {
  options_.ssd_capacity_bytes = 0;
  Open();
  Put("before");
  ASSERT_TRUE(db_->Delete(WriteOptions(), "before").ok());
  EXPECT_TRUE(Drain(db_.get()).empty());  // recording starts with the first read
  const uint64_t t0 = Env::Default()->NowMicros();
  Put("a");
  Put("b");
  Put("c");
  ASSERT_TRUE(db_->Delete(WriteOptions(), "a").ok());
  std::vector<int64_t> results;
  const std::vector<Slice> keys = {"b", "nope"};
  ASSERT_TRUE(db_->BatchDelete(WriteOptions(), keys, &results).ok());
  uint64_t n = 0;
  ASSERT_TRUE(db_->DeleteByRegex("c", &n).ok());
  ASSERT_TRUE(db_->Put(WriteOptions(), "b", "overwrite is no removal").ok());
  ASSERT_TRUE(db_->Put(WriteOptions(), "b", "again").ok());
  const std::vector<RemovalEvent> events = Drain(db_.get());
  EXPECT_EQ(Described(events), (std::multiset<std::string>{"a@memory:deleted", "b@memory:deleted",
                                                           "c@memory:deleted"}));
  for (size_t i = 0; i < events.size(); i++) {
    EXPECT_EQ(events[i].sequence, events[0].sequence + i);
    EXPECT_GE(events[i].time_micros, t0);
  }
  // A second reader from 0 sees the same events: reads take nothing from each other.
  RemovalBatch again;
  ASSERT_TRUE(db_->ReadRemovals(0, 100, &again).ok());
  EXPECT_EQ(Described(again.events), Described(events));
  EXPECT_EQ(again.last_sequence, events.back().sequence);
}

// An overwrite whose new value is not written to SSD drops the key's older SSD copy: the
// SSD tier no longer holds the key, and the feed says so (one SSD event, no memory one),
// so that a subscriber indexing the SSD tier drops its entry.  A second overwrite, with
// no SSD copy left, announces nothing.
TEST_F(RemovalFeedTest, AnOverwriteThatDropsTheSsdCopyIsAnSsdRemoval) {
  options_.ssd_capacity_bytes = 64 << 20;
  Open();
  Put("k");
  Put("other");
  ASSERT_TRUE(db_->Flush().ok());         // both on SSD too
  EXPECT_TRUE(Drain(db_.get()).empty());  // recording starts
  ASSERT_TRUE(db_->Put(WriteOptions(), "k", "new value").ok());
  EXPECT_EQ(Described(Drain(db_.get())), (std::multiset<std::string>{"k@ssd:deleted"}));
  ASSERT_TRUE(db_->Put(WriteOptions(), "k", "newer value").ok());
  EXPECT_TRUE(Drain(db_.get()).empty());
  std::set<std::pair<std::string, int64_t>> resident;
  ResidentSnapshot snapshot;
  ASSERT_TRUE(db_->ReadResident(
                     "", 16,
                     [&](std::span<const ResidentKey> keys) {
                       for (const ResidentKey& k : keys) resident.insert({k.key, k.tier});
                       return true;
                     },
                     &snapshot)
                  .ok());
  EXPECT_EQ(resident,
            (std::set<std::pair<std::string, int64_t>>{
                {"k", kLocatedMemory}, {"other", kLocatedMemory}, {"other", kLocatedSsd}}));
}

TEST_F(RemovalFeedTest, EvictionsFromMemoryAndSsdAndDeletesOfBoth) {
  options_.ssd_capacity_bytes = 2 << 20;  // room for ~28 values of 64 KiB in buckets of 4
  options_.ssd_eviction = SsdEviction::kFifo;
  Open();
  EXPECT_TRUE(Drain(db_.get()).empty());
  for (int i = 0; i < 64; i++) Put("k" + std::to_string(i));
  ASSERT_TRUE(db_->Flush().ok());
  const std::vector<RemovalEvent> events = Drain(db_.get());
  std::map<std::string, std::set<std::string>> by_key;
  for (const auto& e : events) {
    EXPECT_EQ(e.reason, RemovalEvent::kCapacity) << Describe(e);
    by_key[e.key].insert(e.tier == RemovalEvent::kMemory ? "memory" : "ssd");
  }
  // The memory tier holds 16: the others were evicted from it (onto SSD); the SSD tier
  // evicted its oldest buckets to make room.  What either tier announced is gone there.
  std::vector<Slice> keys;
  std::vector<std::string> names;
  for (int i = 0; i < 64; i++) names.push_back("k" + std::to_string(i));
  for (const auto& k : names) keys.emplace_back(k);
  std::vector<int64_t> where;
  ASSERT_TRUE(db_->BatchLocate(keys, &where).ok());
  int from_memory = 0, from_ssd = 0;
  for (int i = 0; i < 64; i++) {
    const auto& tiers = by_key[names[i]];
    from_memory += tiers.count("memory");
    from_ssd += tiers.count("ssd");
    if (tiers.count("ssd")) {
      EXPECT_EQ(where[i], kLocatedAbsent) << names[i];
    } else if (tiers.count("memory")) {
      EXPECT_EQ(where[i], kLocatedSsd) << names[i];
    } else {
      EXPECT_EQ(where[i], kLocatedMemory) << names[i];
    }
  }
  EXPECT_EQ(from_memory, 48);
  EXPECT_GT(from_ssd, 0);
  // A key in memory and on SSD (flushed): its delete is announced for both tiers.
  ASSERT_TRUE(db_->Delete(WriteOptions(), "k63").ok());
  EXPECT_EQ(Described(Drain(db_.get())),
            (std::multiset<std::string>{"k63@memory:deleted", "k63@ssd:deleted"}));
  // DeleteAll announces every key it removes, from each tier that held it.
  ASSERT_TRUE(db_->BatchLocate(keys, &where).ok());
  const auto in_memory = std::count(where.begin(), where.end(), int64_t{kLocatedMemory});
  EXPECT_EQ(in_memory, 15);
  uint64_t n = 0;
  ASSERT_TRUE(db_->DeleteAll(&n).ok());
  std::set<std::string> removed;
  int memory_events = 0;
  for (const auto& e : Drain(db_.get())) {
    EXPECT_EQ(e.reason, RemovalEvent::kDeleted) << Describe(e);
    removed.insert(e.key);
    memory_events += e.tier == RemovalEvent::kMemory;
  }
  EXPECT_EQ(removed.size(), n);
  EXPECT_EQ(memory_events, in_memory);
}

// The Prometheus sample `name` (exactly as written) of db's exposition, or -1.
double Sample(DB* db, const std::string& name) {
  std::string text;
  EXPECT_TRUE(db->GetProperty("kvengine.stats.prometheus", &text));
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

// kvengine_tier_evictions_total{tier,reason} counts what the feed announces, reason by
// reason: capacity evictions of the memory tier (onto SSD) and of the SSD tier (whole
// buckets), and deletes in each tier.  No tier has a watermark eviction.
TEST_F(RemovalFeedTest, EachTiersEvictionsByReasonAreWhatTheFeedAnnounces) {
  options_.ssd_capacity_bytes = 2 << 20;
  options_.ssd_eviction = SsdEviction::kFifo;
  Open();
  EXPECT_TRUE(Drain(db_.get()).empty());
  for (int i = 0; i < 64; i++) Put("k" + std::to_string(i));
  ASSERT_TRUE(db_->Flush().ok());                        // k48..k63: in memory and on SSD
  ASSERT_TRUE(db_->Delete(WriteOptions(), "k63").ok());  // both tiers
  Put("fresh");  // memory only: write_back has not offloaded it
  ASSERT_TRUE(db_->Delete(WriteOptions(), "fresh").ok());
  std::map<std::string, int> announced;
  for (const auto& e : Drain(db_.get())) {
    announced[std::string(e.tier == RemovalEvent::kMemory ? "memory" : "ssd") +
              (e.reason == RemovalEvent::kCapacity ? ",capacity" : ",explicit")]++;
  }
  EXPECT_EQ(announced["memory,capacity"], 48);  // "fresh" took the slot k63 left
  EXPECT_GT(announced["ssd,capacity"], 0);
  EXPECT_EQ(announced["memory,explicit"], 2);  // k63, fresh
  EXPECT_EQ(announced["ssd,explicit"], 1);     // k63
  for (const char* tier : {"memory", "ssd"}) {
    for (const char* reason : {"capacity", "explicit"}) {
      const std::string sample = std::string("kvengine_tier_evictions_total{tier=\"") + tier +
                                 "\",reason=\"" + reason + "\"}";
      EXPECT_EQ(Sample(db_.get(), sample), announced[std::string(tier) + "," + reason]) << sample;
    }
    EXPECT_EQ(Sample(db_.get(), std::string("kvengine_tier_evictions_total{tier=\"") + tier +
                                    "\",reason=\"watermark\"}"),
              -1);
  }
}

TEST_F(RemovalFeedTest, AReaderBehindTheRingIsToldHowManyItMissed) {
  options_.ssd_capacity_bytes = 0;
  options_.removal_feed_capacity = 4;
  Open();
  EXPECT_TRUE(Drain(db_.get()).empty());
  for (int i = 0; i < 10; i++) {
    ASSERT_TRUE(db_->Put(WriteOptions(), "k" + std::to_string(i), "v").ok());
    ASSERT_TRUE(db_->Delete(WriteOptions(), "k" + std::to_string(i)).ok());
  }
  uint64_t missed = 0;
  const std::vector<RemovalEvent> events = Drain(db_.get(), &missed);
  EXPECT_EQ(missed, 6u);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events.front().key, "k6");
  EXPECT_EQ(events.back().key, "k9");
  std::string stats;
  ASSERT_TRUE(db_->GetProperty("kvengine.stats", &stats));
  EXPECT_NE(stats.find("removal_feed_missed: 6\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("removal_feed_read: 4\n"), std::string::npos) << stats;
  // max_events 0 asks only for the newest sequence, and counts nothing as missed.
  RemovalBatch probe;
  ASSERT_TRUE(db_->ReadRemovals(0, 0, &probe).ok());
  EXPECT_TRUE(probe.events.empty());
  EXPECT_EQ(probe.missed, 0u);
  EXPECT_EQ(probe.last_sequence, 10u);
}

TEST_F(RemovalFeedTest, BadCallsAndAFeedTurnedOff) {
  options_.ssd_capacity_bytes = 0;
  options_.removal_feed_capacity = 0;
  Open();
  RemovalBatch batch;
  EXPECT_TRUE(db_->ReadRemovals(0, 10, &batch).IsNotSupported());
  EXPECT_TRUE(db_->ReadRemovals(0, 10, nullptr).IsInvalidArgument());
  db_->Close();
  options_.removal_feed_capacity = 16;
  Open();
  Status s = db_->ReadRemovals(0, options_.max_batch_size + 1, &batch);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("max_events"), std::string::npos);
  db_->Close();
  EXPECT_TRUE(db_->ReadRemovals(0, 10, &batch).IsAborted());
  std::vector<int64_t> results;
  const std::vector<Slice> keys = {"a"};
  EXPECT_TRUE(db_->BatchLocate(keys, &results).IsAborted());
}

TEST_F(RemovalFeedTest, AttachedClientsReadTheOwnersFeedAndLocate) {
  options_.ssd_capacity_bytes = 0;
  options_.local_listen = dir_.Sub("kv.sock");
  Open();
  Options client;
  client.apply_environment = false;
  client.peer_timeout_ms = 2000;
  std::unique_ptr<DB> attached;
  ASSERT_TRUE(DB::Attach(client, options_.local_listen, &attached).ok());
  EXPECT_TRUE(Drain(attached.get()).empty());
  ASSERT_TRUE(attached->Put(WriteOptions(), std::string("bin\0key", 7), "v").ok());
  ASSERT_TRUE(attached->Put(WriteOptions(), "kept", "v").ok());
  ASSERT_TRUE(db_->Delete(WriteOptions(), std::string("bin\0key", 7)).ok());
  const std::vector<RemovalEvent> events = Drain(attached.get());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].key, std::string("bin\0key", 7));
  EXPECT_EQ(events[0].tier, RemovalEvent::kMemory);
  EXPECT_EQ(events[0].reason, RemovalEvent::kDeleted);
  std::vector<int64_t> where;
  const std::vector<Slice> keys = {"kept", Slice("bin\0key", 7), ""};
  ASSERT_TRUE(attached->BatchLocate(keys, &where).ok());
  EXPECT_EQ(where, (std::vector<int64_t>{kLocatedMemory, kLocatedAbsent,
                                         Status::InvalidArgument("").ErrorCode()}));
  attached->Close();
}

// The ring alone: a full ring overwrites its oldest events, slot by slot.
TEST(RemovalFeedRingTest, KeepsTheNewestCapacityEvents) {
  RemovalFeed feed(3, Env::Default());
  feed.Record("ignored", RemovalEvent::kMemory, RemovalEvent::kDeleted);  // not recording
  RemovalBatch batch;
  feed.Read(0, 10, &batch);
  EXPECT_EQ(batch.last_sequence, 0u);
  for (int i = 0; i < 5; i++) {
    feed.Record(std::string(i + 1, 'x'), RemovalEvent::kSsd, RemovalEvent::kCapacity);
  }
  feed.Read(0, 10, &batch);
  EXPECT_EQ(batch.missed, 2u);
  ASSERT_EQ(batch.events.size(), 3u);
  EXPECT_EQ(batch.events[0].sequence, 3u);
  EXPECT_EQ(batch.events[0].key, "xxx");
  EXPECT_EQ(batch.events[2].key, "xxxxx");
  feed.Read(4, 1, &batch);
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].sequence, 5u);
  feed.Read(5, 10, &batch);
  EXPECT_TRUE(batch.events.empty());
  EXPECT_EQ(feed.recorded(), 5u);
}

// Each namespace's events are numbered among its own (issue #45): a reader of one
// namespace -- a tenant -- learns nothing of how many removals the others made, from its
// events' numbers, last_sequence or missed; the whole feed still numbers them all.
TEST(RemovalFeedRingTest, NumbersEachNamespacesEventsAmongItsOwn) {
  RemovalFeed feed(5, Env::Default());
  RemovalBatch batch;
  const uint64_t a = ns::IdOf("tenantA"), b = ns::IdOf("tenantB");
  feed.ReadNamespace(a, 0, 10, &batch);  // starts the recording
  EXPECT_EQ(batch.last_sequence, 0u);
  const std::string pa = ns::Prefix(a), pb = ns::Prefix(b);
  // b b a b d a b: a's are the 3rd and 6th of the whole feed, its 1st and 2nd.
  for (const std::string& key :
       {pb + "1", pb + "2", pa + "1", pb + "3", std::string("d"), pa + "2", pb + "4"}) {
    feed.Record(key, RemovalEvent::kMemory, RemovalEvent::kDeleted);
  }
  feed.ReadNamespace(a, 0, 10, &batch);
  EXPECT_EQ(batch.last_sequence, 2u);
  EXPECT_EQ(batch.missed, 0u);  // the ring lost b's, not a's
  ASSERT_EQ(batch.events.size(), 2u);
  EXPECT_EQ(batch.events[0].sequence, 1u);
  EXPECT_EQ(batch.events[0].key, pa + "1");
  EXPECT_EQ(batch.events[1].sequence, 2u);
  EXPECT_EQ(batch.events[1].key, pa + "2");
  feed.ReadNamespace(a, 1, 10, &batch);
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].key, pa + "2");
  // The default namespace (keys without the prefix) has its own numbering too.
  feed.ReadNamespace(0, 0, 10, &batch);
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].sequence, 1u);
  EXPECT_EQ(batch.events[0].key, "d");
  // b's 4 events: the ring (5 slots) lost its first two.
  feed.ReadNamespace(b, 0, 1, &batch);
  EXPECT_EQ(batch.missed, 2u);
  EXPECT_EQ(batch.last_sequence, 4u);
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].sequence, 3u);
  EXPECT_EQ(batch.events[0].key, pb + "3");
  // The whole feed: every event, numbered in one sequence.
  feed.Read(0, 10, &batch);
  EXPECT_EQ(batch.last_sequence, 7u);
  EXPECT_EQ(batch.missed, 2u);
  ASSERT_EQ(batch.events.size(), 5u);
  EXPECT_EQ(batch.events[0].sequence, 3u);
  // Once a namespace's events have all left the ring, its numbering goes on from where
  // it was, so that no reader's cursor is passed by a restart.
  for (int i = 0; i < 4; i++) feed.Record(pb + "x", RemovalEvent::kSsd, RemovalEvent::kCapacity);
  feed.ReadNamespace(a, 2, 10, &batch);
  EXPECT_TRUE(batch.events.empty());
  EXPECT_EQ(batch.last_sequence, 2u);
  feed.Record(pa + "3", RemovalEvent::kMemory, RemovalEvent::kDeleted);
  feed.ReadNamespace(a, 2, 10, &batch);
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].sequence, 3u);
  feed.ReadNamespace(ns::IdOf("nobody"), 0, 10, &batch);
  EXPECT_TRUE(batch.events.empty());
  EXPECT_EQ(batch.last_sequence, 0u);
}

// Through the DB: a namespace's handle and the DB itself (the default namespace) read
// their own events numbered 1, 2, ... whatever the others removed.
TEST_F(RemovalFeedTest, ANamespaceReadsItsOwnNumbering) {
  options_.ssd_capacity_bytes = 0;
  Open();
  std::unique_ptr<DB> a, b;
  ASSERT_TRUE(db_->CreateNamespace("tenantA", NamespaceOptions(), &a).ok());
  ASSERT_TRUE(db_->CreateNamespace("tenantB", NamespaceOptions(), &b).ok());
  RemovalBatch batch;
  ASSERT_TRUE(a->ReadRemovals(0, 0, &batch).ok());  // starts the recording
  for (int i = 0; i < 5; i++) {
    const std::string k = "k" + std::to_string(i);
    ASSERT_TRUE(b->Put(WriteOptions(), k, "v").ok());
    ASSERT_TRUE(b->Delete(WriteOptions(), k).ok());
  }
  ASSERT_TRUE(a->Put(WriteOptions(), "mine", "v").ok());
  ASSERT_TRUE(a->Delete(WriteOptions(), "mine").ok());
  ASSERT_TRUE(db_->Put(WriteOptions(), "dflt", "v").ok());
  ASSERT_TRUE(db_->Delete(WriteOptions(), "dflt").ok());
  ASSERT_TRUE(a->ReadRemovals(0, 100, &batch).ok());
  EXPECT_EQ(batch.last_sequence, 1u);  // not 6: b's five are not a's business
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].sequence, 1u);
  EXPECT_EQ(batch.events[0].key, "mine");
  ASSERT_TRUE(b->ReadRemovals(3, 100, &batch).ok());
  EXPECT_EQ(batch.last_sequence, 5u);
  ASSERT_EQ(batch.events.size(), 2u);
  EXPECT_EQ(batch.events[0].key, "k3");
  ASSERT_TRUE(db_->ReadRemovals(0, 100, &batch).ok());
  EXPECT_EQ(batch.last_sequence, 1u);
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].key, "dflt");
}

}  // namespace
}  // namespace kvengine
