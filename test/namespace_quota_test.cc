// Namespaces' quotas and fair shares (include/kvengine/db.h, NamespaceOptions;
// db/namespace_usage.h): a namespace over its memory quota evicts its own values and
// nobody else's; a value that can never fit its quota, or a quota with nothing left to
// evict, fails NoSpace for that namespace only; under pressure without quotas the tier
// evicts from the namespace most over its weighted share, so a cold namespace within
// its share keeps its values while a hot one churns; the per-namespace counters say so
// in the stats, the JSON and Prometheus; quotas survive a reopen.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

constexpr size_t kValueSize = 16 << 10;

std::string Value(char tag, int i) {
  std::string v(kValueSize, tag);
  std::memcpy(v.data(), &i, sizeof(i));
  return v;
}

Options MemoryOnly(uint64_t capacity) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = capacity;
  o.memory_slab_size = 1 << 20;
  o.ssd_capacity_bytes = 0;
  o.log_level = LogLevel::kError;
  return o;
}

// The figure `field` of namespace `ns` in "kvengine.stats" (-1 when absent).
int64_t Figure(DB* db, const std::string& ns, const std::string& field) {
  std::string text;
  if (!db->GetProperty("kvengine.stats", &text)) return -1;
  const std::string line = "namespace." + ns + "." + field + ": ";
  const size_t at = text.find(line);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + line.size()));
}

// How many of keys [0, n) `db` still holds, each with the value it was given.
int Held(DB* db, char tag, int n) {
  int held = 0;
  for (int i = 0; i < n; i++) {
    std::string v;
    Status s = db->Get(ReadOptions(), "k" + std::to_string(i), &v);
    if (s.ok()) {
      EXPECT_EQ(v, Value(tag, i)) << "key " << i;
      held++;
    } else {
      EXPECT_TRUE(s.IsNotFound()) << s.ToString();
    }
  }
  return held;
}

void Fill(DB* db, char tag, int n) {
  for (int i = 0; i < n; i++) {
    ASSERT_TRUE(db->Put(WriteOptions(), "k" + std::to_string(i), Value(tag, i)).ok()) << i;
  }
}

TEST(NamespaceQuotaTest, ANamespaceOverItsQuotaEvictsOnlyItsOwnValues) {
  test::TempDir dir;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(MemoryOnly(64 << 20), dir.path(), &db).ok());
  NamespaceOptions limited;
  limited.memory_quota_bytes = 4 << 20;
  std::unique_ptr<DB> hot, cold;
  ASSERT_TRUE(db->CreateNamespace("hot", limited, &hot).ok());
  ASSERT_TRUE(db->CreateNamespace("cold", NamespaceOptions(), &cold).ok());
  Fill(cold.get(), 'c', 100);  // older than every hot value: plain LRU would take these
  Fill(db.get(), 'd', 100);
  Fill(hot.get(), 'h', 1000);  // 16 MiB into a 4 MiB quota

  EXPECT_LE(Figure(db.get(), "hot", "memory_bytes"), 4 << 20);
  EXPECT_GT(Figure(db.get(), "hot", "memory_bytes"), 3 << 20);
  EXPECT_GE(Figure(db.get(), "hot", "quota_evictions"), 700);
  EXPECT_EQ(Figure(db.get(), "hot", "quota_rejections"), 0);
  EXPECT_EQ(Held(cold.get(), 'c', 100), 100);
  EXPECT_EQ(Held(db.get(), 'd', 100), 100);
  EXPECT_EQ(Figure(db.get(), "cold", "memory_evictions"), 0);
  EXPECT_EQ(Figure(db.get(), "default", "memory_evictions"), 0);
  // The newest hot values stayed, the oldest went.
  const int held = Held(hot.get(), 'h', 1000);
  EXPECT_GE(held, 180);
  EXPECT_LE(held, 256);
  std::string v;
  EXPECT_TRUE(hot->Get(ReadOptions(), "k999", &v).ok());
  EXPECT_TRUE(hot->Get(ReadOptions(), "k0", &v).IsNotFound());
}

TEST(NamespaceQuotaTest, WithAnSsdTierTheQuotaEvictionsOffloadAndEveryValueReadsBack) {
  test::TempDir dir;
  Options o = MemoryOnly(32 << 20);
  o.ssd_capacity_bytes = 256 << 20;
  o.offload_policy = OffloadPolicy::kWriteBack;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  NamespaceOptions limited;
  limited.memory_quota_bytes = 2 << 20;
  std::unique_ptr<DB> ns;
  ASSERT_TRUE(db->CreateNamespace("ns", limited, &ns).ok());
  Fill(ns.get(), 'n', 600);  // 9.4 MiB through a 2 MiB quota
  EXPECT_LE(Figure(db.get(), "ns", "memory_bytes"), 2 << 20);
  EXPECT_GE(Figure(db.get(), "ns", "quota_evictions"), 400);
  EXPECT_EQ(Held(ns.get(), 'n', 600), 600);  // from SSD; promotion keeps to the quota
  EXPECT_LE(Figure(db.get(), "ns", "memory_bytes"), 2 << 20);
  EXPECT_EQ(Figure(db.get(), "ns", "hits"), 600);
}

TEST(NamespaceQuotaTest, APutThatCannotFitItsQuotaFailsForThatNamespaceOnly) {
  test::TempDir dir;
  Options o = MemoryOnly(32 << 20);
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  NamespaceOptions tiny;
  tiny.memory_quota_bytes = 8 << 10;  // less than one value
  std::unique_ptr<DB> small;
  ASSERT_TRUE(db->CreateNamespace("small", tiny, &small).ok());
  Status s = small->Put(WriteOptions(), "k", Value('s', 0));
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_NE(s.ToString().find("namespace small"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("can never fit"), std::string::npos) << s.ToString();
  EXPECT_EQ(Figure(db.get(), "small", "quota_rejections"), 1);
  EXPECT_TRUE(db->Put(WriteOptions(), "k", Value('d', 0)).ok());
  EXPECT_TRUE(small->Get(ReadOptions(), "k", nullptr).IsInvalidArgument());
  std::string v;
  EXPECT_TRUE(small->Get(ReadOptions(), "k", &v).IsNotFound());
}

TEST(NamespaceQuotaTest, WithEvictionOffAFullQuotaRefusesInsteadOfEvicting) {
  test::TempDir dir;
  Options o = MemoryOnly(32 << 20);
  o.memory_eviction = MemoryEviction::kNone;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  NamespaceOptions limited;
  limited.memory_quota_bytes = 10 * kValueSize;
  std::unique_ptr<DB> ns;
  ASSERT_TRUE(db->CreateNamespace("ns", limited, &ns).ok());
  Fill(ns.get(), 'n', 10);
  Status s = ns->Put(WriteOptions(), "k10", Value('n', 10));
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_NE(s.ToString().find("none of its values can be evicted"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(Held(ns.get(), 'n', 10), 10);
  // Room freed by a delete is the namespace's again.
  ASSERT_TRUE(ns->Delete(WriteOptions(), "k0").ok());
  EXPECT_TRUE(ns->Put(WriteOptions(), "k10", Value('n', 10)).ok());
  EXPECT_TRUE(db->Put(WriteOptions(), "x", Value('d', 0)).ok());
}

TEST(NamespaceQuotaTest, UnderPressureTheNamespaceMostOverItsShareLosesValuesFirst) {
  test::TempDir dir;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(MemoryOnly(32 << 20), dir.path(), &db).ok());
  std::unique_ptr<DB> hot, cold;
  ASSERT_TRUE(db->CreateNamespace("hot", NamespaceOptions(), &hot).ok());
  ASSERT_TRUE(db->CreateNamespace("cold", NamespaceOptions(), &cold).ok());
  // 4 MiB, within a half of the tier; written first, never read again: the coldest.
  Fill(cold.get(), 'c', 256);
  Fill(hot.get(), 'h', 8192);  // 128 MiB through a 32 MiB tier
  EXPECT_EQ(Held(cold.get(), 'c', 256), 256);
  EXPECT_EQ(Figure(db.get(), "cold", "memory_evictions"), 0);
  EXPECT_GE(Figure(db.get(), "hot", "memory_evictions"), 6000);
  EXPECT_EQ(Figure(db.get(), "cold", "hits"), 256);
  EXPECT_EQ(Figure(db.get(), "cold", "memory_items"), 256);
  EXPECT_EQ(Figure(db.get(), "cold", "memory_bytes"), 256 * int64_t{kValueSize});
}

// Issue #45: the tier full of one namespace's 1 MiB values (over its share), a second
// namespace's 64 KiB puts (within its share) must not push out a third's 64 KiB values
// (within its share) because the 64 KiB class holds none of the namespace over its
// share: the room comes from that namespace's slabs.  Before, the class fell back to
// plain recency and the third lost its values.
TEST(NamespaceQuotaTest, ANamespaceWithinItsShareKeepsItsValuesWhateverTheirSizeClass) {
  test::TempDir dir;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(MemoryOnly(32 << 20), dir.path(), &db).ok());
  std::unique_ptr<DB> small, putter;
  ASSERT_TRUE(db->CreateNamespace("small", NamespaceOptions(), &small).ok());
  ASSERT_TRUE(db->CreateNamespace("putter", NamespaceOptions(), &putter).ok());
  const std::string block(64 << 10, 's');
  for (int i = 0; i < 16; i++) {  // the oldest values of the tier, 1 MiB in all
    ASSERT_TRUE(small->Put(WriteOptions(), "k" + std::to_string(i), block).ok());
  }
  const std::string big(1 << 20, 'd');
  for (int i = 0; Figure(db.get(), "default", "memory_bytes") < (29 << 20); i++) {
    ASSERT_TRUE(db->Put(WriteOptions(), "d" + std::to_string(i), big).ok());
  }
  const std::string mine(64 << 10, 'p');
  for (int i = 0; i < 100; i++) {  // 6.25 MiB, within a third of the tier
    ASSERT_TRUE(putter->Put(WriteOptions(), "p" + std::to_string(i), mine).ok()) << i;
  }
  EXPECT_EQ(Figure(db.get(), "small", "memory_evictions"), 0);
  EXPECT_EQ(Figure(db.get(), "small", "memory_items"), 16);
  EXPECT_EQ(Figure(db.get(), "putter", "memory_items"), 100);
  EXPECT_GT(Figure(db.get(), "default", "memory_evictions"), 0);
}

TEST(NamespaceQuotaTest, AHeavierWeightKeepsALargerShare) {
  test::TempDir dir;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(MemoryOnly(32 << 20), dir.path(), &db).ok());
  NamespaceOptions heavy;
  heavy.weight = 3;
  std::unique_ptr<DB> a, b;
  ASSERT_TRUE(db->CreateNamespace("a", heavy, &a).ok());
  ASSERT_TRUE(db->CreateNamespace("b", NamespaceOptions(), &b).ok());
  // Both churn alike; a's share is three quarters of the tier, b's one quarter.
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 1024; i++) {
      const std::string key = "k" + std::to_string(round * 1024 + i);
      ASSERT_TRUE(a->Put(WriteOptions(), key, Value('a', i)).ok());
      ASSERT_TRUE(b->Put(WriteOptions(), key, Value('b', i)).ok());
    }
  }
  const double a_bytes = static_cast<double>(Figure(db.get(), "a", "memory_bytes"));
  const double b_bytes = static_cast<double>(Figure(db.get(), "b", "memory_bytes"));
  EXPECT_GT(a_bytes / b_bytes, 2.0) << a_bytes << " " << b_bytes;
  EXPECT_LT(a_bytes / b_bytes, 4.5) << a_bytes << " " << b_bytes;
}

TEST(NamespaceQuotaTest, TheAccountStaysExactUnderConcurrentChurn) {
  test::TempDir dir;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(MemoryOnly(16 << 20), dir.path(), &db).ok());
  NamespaceOptions limited;
  limited.memory_quota_bytes = 3 << 20;
  std::unique_ptr<DB> a, b;
  ASSERT_TRUE(db->CreateNamespace("a", limited, &a).ok());
  ASSERT_TRUE(db->CreateNamespace("b", NamespaceOptions(), &b).ok());
  constexpr int kKeysPerNs = 800;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    DB* target = t % 2 == 0 ? a.get() : b.get();
    threads.emplace_back([target, t] {
      std::string v;
      for (int n = 0; n < 1500; n++) {
        const int i = (n * 7 + t * 13) % kKeysPerNs;
        const std::string key = "k" + std::to_string(i);
        if (n % 5 == 4) {
          Status s = target->Delete(WriteOptions(), key);
          EXPECT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();
        } else if (n % 3 == 2) {
          Status s = target->Get(ReadOptions(), key, &v);
          EXPECT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();
        } else {
          Status s = target->Put(WriteOptions(), key, Value('x', i));
          EXPECT_TRUE(s.ok()) << s.ToString();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // Each namespace's items and bytes are exactly what it holds.
  for (auto [name, handle] : {std::pair{"a", a.get()}, std::pair{"b", b.get()}}) {
    const int held = Held(handle, 'x', kKeysPerNs);
    EXPECT_EQ(Figure(db.get(), name, "memory_items"), held) << name;
    EXPECT_EQ(Figure(db.get(), name, "memory_bytes"), held * int64_t{kValueSize}) << name;
  }
  EXPECT_LE(Figure(db.get(), "a", "memory_bytes"), (3 << 20) + 4 * int64_t{kValueSize});
}

TEST(NamespaceQuotaTest, TheCountersAreInTheJsonAndPrometheusAndQuotasSurviveAReopen) {
  test::TempDir dir;
  Options o = MemoryOnly(32 << 20);
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  std::string json;
  ASSERT_TRUE(db->GetProperty("kvengine.stats.json", &json));
  EXPECT_EQ(json.find("\"namespaces\""), std::string::npos) << "no namespaces, nothing new";
  NamespaceOptions limited;
  limited.memory_quota_bytes = 1 << 20;
  limited.weight = 7;
  std::unique_ptr<DB> ns;
  ASSERT_TRUE(db->CreateNamespace("tenant-a", limited, &ns).ok());
  Fill(ns.get(), 't', 3);
  std::string v;
  EXPECT_TRUE(ns->Get(ReadOptions(), "missing", &v).IsNotFound());
  ASSERT_TRUE(db->GetProperty("kvengine.stats.json", &json));
  EXPECT_NE(json.find("\"namespaces\":{\"default\":{"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tenant-a\":{\"memory_quota_bytes\":1048576,\"ssd_quota_bytes\":0,"
                      "\"weight\":7,\"memory_bytes\":49152,\"memory_items\":3"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"misses\":1"), std::string::npos) << json;
  std::string prom;
  ASSERT_TRUE(db->GetProperty("kvengine.stats.prometheus", &prom));
  EXPECT_NE(prom.find("# TYPE kvengine_namespace_memory_bytes gauge\n"), std::string::npos);
  EXPECT_NE(prom.find("kvengine_namespace_memory_bytes{namespace=\"tenant-a\"} 49152\n"),
            std::string::npos)
      << prom;
  EXPECT_NE(prom.find("kvengine_namespace_misses_total{namespace=\"tenant-a\"} 1\n"),
            std::string::npos)
      << prom;
  if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
    const std::string file = dir.path() + "/metrics.txt", out = dir.path() + "/promtool.out";
    std::ofstream(file) << prom;
    const int rc =
        std::system(("promtool check metrics < '" + file + "' > '" + out + "' 2>&1").c_str());
    std::ifstream in(out);
    const std::string report((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 0) << report;
    EXPECT_EQ(report, "") << report;  // not even a lint warning
  }

  // A dropped namespace leaves the figures with its keys.
  std::unique_ptr<DB> gone;
  ASSERT_TRUE(db->CreateNamespace("gone", NamespaceOptions(), &gone).ok());
  Fill(gone.get(), 'g', 2);
  EXPECT_EQ(Figure(db.get(), "gone", "memory_items"), 2);
  ASSERT_TRUE(db->DropNamespace("gone", nullptr).ok());
  ASSERT_TRUE(db->GetProperty("kvengine.stats", &json));
  EXPECT_EQ(json.find("gone"), std::string::npos) << json;
  EXPECT_EQ(json.find("id:"), std::string::npos) << json;

  ns.reset();
  ASSERT_TRUE(db->Close().ok());
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  ASSERT_TRUE(db->OpenNamespace("tenant-a", &ns).ok());
  EXPECT_EQ(Figure(db.get(), "tenant-a", "memory_quota_bytes"), 1 << 20);
  EXPECT_EQ(Figure(db.get(), "tenant-a", "weight"), 7);
  Fill(ns.get(), 't', 200);  // 3.2 MiB into 1 MiB
  EXPECT_LE(Figure(db.get(), "tenant-a", "memory_bytes"), 1 << 20);
}

}  // namespace
}  // namespace kvengine
