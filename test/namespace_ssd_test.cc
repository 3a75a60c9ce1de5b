// Namespaces in the SSD tier (db/ssd_namespaces.cc): each namespace's ssd_bytes and
// ssd_items are exactly what it holds there, through overwrites, deletes, compactions,
// bucket evictions and reopens (from the map checkpoint, from a partial one written while
// running, and from a full scan); a namespace at its SSD quota drops its own values and
// nobody else's, and one that cannot fit fails NoSpace for itself only; under pressure
// the tier evicts the buckets of the namespace most over its share first.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "db/ssd_bucket.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

constexpr size_t kValueSize = 16 << 10;

std::string Value(char tag, int i, size_t size = kValueSize) {
  std::string v(size, tag);
  std::memcpy(v.data(), &i, sizeof(i));
  return v;
}

// The stats line `name` ("ssd.keys", "namespace.a.ssd_bytes"); -1 when absent.
int64_t Stat(DB* db, const std::string& name) {
  std::string text;
  if (!db->GetProperty("kvengine.stats", &text)) return -1;
  const std::string line = "\n" + name + ": ";
  const size_t at = text.find(line);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + line.size()));
}

int64_t Figure(DB* db, const std::string& ns, const std::string& field) {
  return Stat(db, "namespace." + ns + "." + field);
}

class NamespaceSsdTest : public ::testing::Test {
 protected:
  NamespaceSsdTest() {
    options_.apply_environment = false;
    options_.memory_capacity_bytes = 256 << 20;
    options_.memory_slab_size = 1 << 20;
    options_.ssd_capacity_bytes = 1ull << 30;
    options_.bucket_size_limit = 1 << 20;
    options_.offload_policy = OffloadPolicy::kWriteThrough;
    options_.log_level = LogLevel::kError;
  }

  void Open() {
    ASSERT_TRUE(DB::Open(options_, dir_.path(), &db_).ok());
    for (const char* name : {"a", "b"}) {
      std::unique_ptr<DB>& handle = handles_[name];
      Status s = db_->OpenNamespace(name, &handle);
      if (s.IsNotFound()) s = db_->CreateNamespace(name, ns_options_[name], &handle);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
  void Close() {
    handles_.clear();
    ASSERT_TRUE(db_->Close().ok());
    db_.reset();
  }
  DB* ns(const std::string& name) { return name == "default" ? db_.get() : handles_[name].get(); }

  void Put(const std::string& name, const std::string& key, const std::string& value) {
    Status s = ns(name)->Put(WriteOptions(), key, value);
    ASSERT_TRUE(s.ok()) << name << "/" << key << ": " << s.ToString();
    expect_[name][key] = value;
  }
  void Delete(const std::string& name, const std::string& key) {
    Status s = ns(name)->Delete(WriteOptions(), key);
    ASSERT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();
    expect_[name].erase(key);
  }
  // Each namespace's SSD figures are what it holds: expect_'s values, all on SSD
  // (write_through).
  void ExpectFiguresExact() {
    for (const char* name : {"default", "a", "b"}) {
      int64_t bytes = 0;
      for (const auto& [key, value] : expect_[name]) bytes += static_cast<int64_t>(value.size());
      EXPECT_EQ(Figure(db_.get(), name, "ssd_items"), static_cast<int64_t>(expect_[name].size()))
          << name;
      EXPECT_EQ(Figure(db_.get(), name, "ssd_bytes"), bytes) << name;
    }
  }
  void ExpectValues() {
    for (const auto& [name, values] : expect_) {
      for (const auto& [key, value] : values) {
        std::string got;
        Status s = ns(name)->Get(ReadOptions(), key, &got);
        ASSERT_TRUE(s.ok()) << name << "/" << key << ": " << s.ToString();
        EXPECT_TRUE(got == value) << name << "/" << key;
      }
    }
  }
  // The three namespaces' figures add up to the tier's own counts.
  void ExpectFiguresAddUp() {
    int64_t items = 0, bytes = 0;
    for (const char* name : {"default", "a", "b"}) {
      items += Figure(db_.get(), name, "ssd_items");
      bytes += Figure(db_.get(), name, "ssd_bytes");
    }
    EXPECT_EQ(items, Stat(db_.get(), "ssd.keys"));
    EXPECT_EQ(bytes, Stat(db_.get(), "ssd.live_bytes"));
  }
  // Opens a 24 MiB tier, writes 3 MiB to b (the cold namespace), then 62 MiB of new keys
  // to a (the hot one), flushed.
  void ColdThenHot() {
    options_.ssd_capacity_bytes = 24 << 20;
    options_.gc_interval_ms = 0;
    Open();
    for (int i = 0; i < 200; i++) Put("b", "k" + std::to_string(i), Value('b', i));
    ASSERT_TRUE(db_->Flush().ok());
    for (int i = 0; i < 4000; i++) {
      Status s = ns("a")->Put(WriteOptions(), "k" + std::to_string(i), Value('a', i));
      ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
    }
    ASSERT_TRUE(db_->Flush().ok());
  }
  // A mix of puts, overwrites of other sizes and deletes over the three namespaces.
  void Churn(int rounds, int seed) {
    for (int n = 0; n < rounds; n++) {
      const int i = (n * 37 + seed) % 97;
      const char* name = n % 3 == 0 ? "default" : n % 3 == 1 ? "a" : "b";
      const std::string key = "k" + std::to_string(i);
      if (n % 7 == 6) {
        Delete(name, key);
      } else {
        Put(name, key, Value('c', n, 1000 + static_cast<size_t>((n * 131) % 20000)));
      }
    }
  }

  test::TempDir dir_;
  Options options_;
  std::map<std::string, NamespaceOptions> ns_options_;
  std::unique_ptr<DB> db_;
  std::map<std::string, std::unique_ptr<DB>> handles_;
  std::map<std::string, std::map<std::string, std::string>> expect_;
};

TEST_F(NamespaceSsdTest, FiguresStayExactThroughChurnCompactionAndEveryKindOfReopen) {
  options_.gc_interval_ms = 0;      // compactions only when asked
  options_.gc_punch_holes = false;  // so that they copy live values to new buckets
  Open();
  Churn(1200, 1);
  // Buckets two thirds dead, which the compaction copies the last third of.
  for (const char* name : {"default", "a", "b"}) {
    for (int i = 0; i < 150; i++) Put(name, "c" + std::to_string(i), Value(name[0], i, 5000));
  }
  ASSERT_TRUE(db_->Flush().ok());
  for (const char* name : {"default", "a", "b"}) {
    for (int i = 0; i < 150; i++) {
      if (i % 3 != 0) Delete(name, "c" + std::to_string(i));
    }
  }
  ASSERT_TRUE(db_->Flush().ok());
  ExpectFiguresExact();
  ExpectFiguresAddUp();
  uint64_t reclaimed = 0;
  ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  EXPECT_GT(reclaimed, 0u) << "the churn left garbage to compact";
  for (int round = 0; round < 20 && reclaimed != 0; round++) {  // a few buckets a round
    ASSERT_TRUE(db_->CompactBuckets(&reclaimed).ok());
  }
  EXPECT_GT(Stat(db_.get(), "ssd.gc_bytes_rewritten"), 0) << "live values moved";
  ExpectFiguresExact();
  // From the checkpoint Close writes.
  Close();
  Open();
  EXPECT_GT(Stat(db_.get(), "ssd.checkpoint_keys"), 0);
  ExpectFiguresExact();
  ExpectValues();
  Churn(300, 5);  // deletes after the checkpoint: the tombstones replayed over it
  ASSERT_TRUE(db_->Flush().ok());
  ExpectFiguresExact();
  // From a full scan of every bucket.
  Close();
  std::filesystem::remove(dir_.Sub("SSDMAP"));
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 0);
  ExpectFiguresExact();
  ExpectValues();
}

// A checkpoint from an older format (no tallies) is not used: the full scan counts.
TEST_F(NamespaceSsdTest, ACheckpointWithoutTalliesIsReplacedByAFullScan) {
  Open();
  Churn(200, 2);
  Close();
  const std::string path = dir_.Sub("SSDMAP");
  ASSERT_TRUE(std::filesystem::exists(path));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const uint32_t version2 = 2;
    f.write(reinterpret_cast<const char*>(&version2), sizeof(version2));
  }
  Open();
  EXPECT_EQ(Stat(db_.get(), "ssd.checkpoint_keys"), 0);
  ExpectFiguresExact();
  ExpectValues();
}

// Written while puts, overwrites and deletes go on, a checkpoint's tallies are scaled
// to its map's counts at Open after a crash: the namespaces' figures add up to the
// tier's, and the full scan afterwards gives the exact ones.
TEST_F(NamespaceSsdTest, APartialCheckpointGivesFiguresThatAddUp) {
  options_.gc_interval_ms = 2;
  options_.ssd_map_checkpoint_interval_keys = 50;
  options_.bucket_keys_limit = 32;
  Open();
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int n = 0; !stop.load(); n++) {
      const std::string key = "w" + std::to_string(n % 300);
      DB* target = ns(n % 2 == 0 ? "a" : "b");
      Status s = n % 5 == 4 ? target->Delete(WriteOptions(), key)
                            : target->Put(WriteOptions(), key, Value('w', n, 700 + n % 900));
      ASSERT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Stat(db_.get(), "ssd.checkpoint_writes") < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::string saved = dir_.Sub("saved.SSDMAP");
  std::filesystem::copy_file(dir_.Sub("SSDMAP"), saved);
  stop = true;
  writer.join();
  ASSERT_GE(Stat(db_.get(), "ssd.checkpoint_writes"), 3);
  Close();
  // As if the DB had crashed after that checkpoint (Close wrote a newer one).
  std::filesystem::copy_file(saved, dir_.Sub("SSDMAP"),
                             std::filesystem::copy_options::overwrite_existing);
  Open();
  EXPECT_GT(Stat(db_.get(), "ssd.checkpoint_keys"), 0);
  ExpectFiguresAddUp();
  const int64_t a = Figure(db_.get(), "a", "ssd_items"), b = Figure(db_.get(), "b", "ssd_items");
  Close();
  std::filesystem::remove(dir_.Sub("SSDMAP"));
  Open();
  ExpectFiguresAddUp();
  // Scaled within a bucket, not invented: each namespace's count is close to its count.
  EXPECT_NEAR(a, Figure(db_.get(), "a", "ssd_items"), 40);
  EXPECT_NEAR(b, Figure(db_.get(), "b", "ssd_items"), 40);
}

TEST(NamespaceTallyTest, APartialCheckpointsTallyIsScaledToTheMapsCounts) {
  SsdBucket b;
  b.namespaces = {{0, 3000, 3}, {7, 1000, 1}, {9, 6000, 6}};
  b.live_keys = 10;
  b.FitNamespacesTo(10000);  // agrees already: unchanged
  ASSERT_EQ(b.namespaces.size(), 3u);
  EXPECT_EQ(b.namespaces[2].bytes, 6000u);
  b.live_keys = 5;
  b.FitNamespacesTo(5000);  // half of each
  uint64_t bytes = 0, items = 0;
  for (const auto& t : b.namespaces) {
    bytes += t.bytes;
    items += t.items;
  }
  EXPECT_EQ(bytes, 5000u);
  EXPECT_EQ(items, 5u);
  // Namespace 7's one value rounded away: its bytes went to the largest.
  ASSERT_EQ(b.namespaces.size(), 2u);
  EXPECT_EQ(b.namespaces.back().id, 9u);
  EXPECT_EQ(b.namespaces.back().bytes, 3500u);
  EXPECT_EQ(b.namespaces.back().items, 4u);
  b.live_keys = 7;
  b.FitNamespacesTo(7001);  // the remainder goes to the largest
  bytes = items = 0;
  for (const auto& t : b.namespaces) {
    bytes += t.bytes;
    items += t.items;
  }
  EXPECT_EQ(bytes, 7001u);
  EXPECT_EQ(items, 7u);
  b.namespaces.clear();
  b.FitNamespacesTo(7001);  // nothing to scale: the default namespace's
  ASSERT_EQ(b.namespaces.size(), 1u);
  EXPECT_EQ(b.namespaces[0].id, 0u);
  EXPECT_EQ(b.namespaces[0].items, 7u);
  b.live_keys = 0;
  b.FitNamespacesTo(0);
  EXPECT_TRUE(b.namespaces.empty());
}

TEST_F(NamespaceSsdTest, ANamespaceAtItsSsdQuotaDropsOnlyItsOwnValues) {
  ns_options_["a"].ssd_quota_bytes = 4 << 20;
  Open();
  for (int i = 0; i < 40; i++) Put("b", "k" + std::to_string(i), Value('b', i));
  for (int i = 0; i < 40; i++) Put("default", "k" + std::to_string(i), Value('d', i));
  for (int i = 0; i < 600; i++) Put("a", "k" + std::to_string(i), Value('a', i));  // 9.4 MiB
  ASSERT_TRUE(db_->Flush().ok());
  EXPECT_LE(Figure(db_.get(), "a", "ssd_bytes"), 4 << 20);
  EXPECT_GE(Figure(db_.get(), "a", "ssd_bytes"), (4 << 20) * 7 / 8 - int64_t{kValueSize});
  EXPECT_GE(Figure(db_.get(), "a", "quota_evictions"), 340);
  EXPECT_EQ(Figure(db_.get(), "b", "ssd_items"), 40);
  EXPECT_EQ(Figure(db_.get(), "default", "ssd_items"), 40);
  ExpectFiguresAddUp();
  // Memory still holds everything (write_through); after a restart only the SSD's.
  ExpectValues();
  Delete("a", "k0");  // dropped from SSD by the quota: this delete must still hold
  const int64_t on_ssd = Figure(db_.get(), "a", "ssd_items");
  Close();
  Open();
  int found = 0;
  for (int i = 0; i < 600; i++) {
    std::string v;
    Status s = ns("a")->Get(ReadOptions(), "k" + std::to_string(i), &v);
    if (s.ok()) {
      EXPECT_TRUE(v == Value('a', i)) << i;
      found++;
    } else {
      EXPECT_TRUE(s.IsNotFound()) << s.ToString();
    }
  }
  EXPECT_EQ(found, on_ssd);
  std::string v;
  EXPECT_TRUE(ns("a")->Get(ReadOptions(), "k0", &v).IsNotFound());
  for (int i = 0; i < 40; i++) {
    ASSERT_TRUE(ns("b")->Get(ReadOptions(), "k" + std::to_string(i), &v).ok());
    EXPECT_TRUE(v == Value('b', i));
  }
  EXPECT_EQ(Figure(db_.get(), "a", "ssd_items"), on_ssd);
}

// Four threads put, overwrite, delete and read in two namespaces, one with an SSD quota,
// while the GC compacts: the figures add up to the tier's counts, the quota holds (give
// or take the values committed at once), and after a reopen each namespace reads back
// exactly as many values as its figure says, each the one written.
TEST_F(NamespaceSsdTest, TheSsdAccountStaysExactUnderConcurrentChurn) {
  options_.gc_interval_ms = 5;
  options_.gc_punch_holes = false;
  ns_options_["a"].ssd_quota_bytes = 2 << 20;
  Open();
  constexpr int kKeys = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    DB* target = ns(t % 2 == 0 ? "a" : "b");
    threads.emplace_back([target, t] {
      std::string v;
      for (int n = 0; n < 800; n++) {
        const int i = (n * 7 + t * 13) % kKeys;
        const std::string key = "k" + std::to_string(i);
        Status s;
        if (n % 5 == 4) {
          s = target->Delete(WriteOptions(), key);
        } else if (n % 3 == 2) {
          s = target->Get(ReadOptions(), key, &v);
          if (s.ok()) {
            EXPECT_TRUE(v == Value('x', i, 4000 + i)) << key;
          }
        } else {
          s = target->Put(WriteOptions(), key, Value('x', i, 4000 + i));
        }
        EXPECT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(db_->Flush().ok());  // write_through: everything was staged by its put
  ExpectFiguresAddUp();
  EXPECT_LE(Figure(db_.get(), "a", "ssd_bytes"), (2 << 20) + 4 * 4300);
  std::map<std::string, int64_t> items;
  for (const char* name : {"a", "b"}) items[name] = Figure(db_.get(), name, "ssd_items");
  Close();
  Open();
  for (const char* name : {"a", "b"}) {
    int64_t found = 0;
    for (int i = 0; i < kKeys; i++) {
      std::string v;
      Status s = ns(name)->Get(ReadOptions(), "k" + std::to_string(i), &v);
      if (s.ok()) {
        EXPECT_TRUE(v == Value('x', i, 4000 + i)) << name << i;
        found++;
      } else {
        EXPECT_TRUE(s.IsNotFound()) << s.ToString();
      }
    }
    EXPECT_EQ(found, items[name]) << name;
  }
}

TEST_F(NamespaceSsdTest, AValueLargerThanTheSsdQuotaFailsForThatNamespaceOnly) {
  ns_options_["a"].ssd_quota_bytes = 64 << 10;
  Open();
  Status s = ns("a")->Put(WriteOptions(), "big", Value('a', 1, 128 << 10));
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_NE(s.ToString().find("namespace a"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("can never fit"), std::string::npos) << s.ToString();
  std::string v;
  EXPECT_TRUE(ns("a")->Get(ReadOptions(), "big", &v).IsNotFound()) << "nothing changed";
  Put("b", "big", Value('b', 1, 128 << 10));
  Put("a", "small", Value('a', 2, 32 << 10));
  EXPECT_EQ(Figure(db_.get(), "a", "quota_rejections"), 1);
  ExpectValues();
}

// write_back: evictions offload to SSD; a namespace's SSD quota drops its own older
// SSD values for them, and values its quota can never take leave memory anyway (kept,
// they would stay in memory for good).
TEST_F(NamespaceSsdTest, WriteBackOffloadsKeepTheSsdQuotaAndNeverStickInMemory) {
  options_.offload_policy = OffloadPolicy::kWriteBack;
  options_.memory_capacity_bytes = 8 << 20;
  ns_options_["a"].ssd_quota_bytes = 2 << 20;
  ns_options_["b"].ssd_quota_bytes = 8 << 10;  // smaller than any of its values
  Open();
  for (int i = 0; i < 2000; i++) {
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(ns("a")->Put(WriteOptions(), key, Value('a', i)).ok()) << i;
    ASSERT_TRUE(ns("b")->Put(WriteOptions(), key, Value('b', i)).ok()) << i;
  }
  EXPECT_LE(Figure(db_.get(), "a", "ssd_bytes"), 2 << 20);
  EXPECT_GT(Figure(db_.get(), "a", "ssd_items"), 0);
  EXPECT_EQ(Figure(db_.get(), "b", "ssd_items"), 0);
  EXPECT_GT(Figure(db_.get(), "b", "quota_rejections"), 1000);
  EXPECT_GT(Figure(db_.get(), "b", "memory_evictions"), 1000);
  // Whatever reads back is the value written.
  for (const char* name : {"a", "b"}) {
    for (int i = 0; i < 2000; i += 7) {
      std::string v;
      Status s = ns(name)->Get(ReadOptions(), "k" + std::to_string(i), &v);
      if (s.ok()) {
        EXPECT_TRUE(v == Value(name[0], i)) << name << i;
      } else {
        EXPECT_TRUE(s.IsNotFound()) << s.ToString();
      }
    }
  }
  // Flush cannot make b's values durable: it says so, naming why.
  Status s = db_->Flush();
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_NE(s.ToString().find("namespace b"), std::string::npos) << s.ToString();
}

// Under pressure, without quotas: the tier evicts the buckets of the namespace most over
// its share first, so a cold namespace within its share keeps its values on SSD while a
// hot one churns, though its buckets are the oldest.
TEST_F(NamespaceSsdTest, UnderPressureTheNamespaceMostOverItsShareLosesBucketsFirst) {
  ColdThenHot();
  EXPECT_EQ(Figure(db_.get(), "b", "ssd_items"), 200);
  EXPECT_EQ(Figure(db_.get(), "b", "ssd_evictions"), 0);
  EXPECT_GT(Figure(db_.get(), "a", "ssd_evictions"), 2000);
  ExpectFiguresAddUp();
}

// A namespace held to its SSD quota leaves dead values in its buckets (until the GC
// punches or compacts them), which fill the tier all the same: the buckets evicted for
// room are those, not a cold namespace's older but live ones, though nobody is over
// their share.
TEST_F(NamespaceSsdTest, TheDeadValuesAQuotaLeavesGoBeforeAColdNamespacesBuckets) {
  ns_options_["a"].ssd_quota_bytes = 8 << 20;  // 62 MiB of puts through it
  ColdThenHot();
  EXPECT_LE(Figure(db_.get(), "a", "ssd_bytes"), 8 << 20);
  EXPECT_GT(Stat(db_.get(), "ssd.evicted_buckets"), 0) << "the dead values filled the tier";
  EXPECT_EQ(Figure(db_.get(), "b", "ssd_items"), 200);
  EXPECT_EQ(Figure(db_.get(), "b", "ssd_evictions"), 0);
  ExpectFiguresAddUp();
}

}  // namespace
}  // namespace kvengine
