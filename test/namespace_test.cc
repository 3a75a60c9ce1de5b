// Namespaces (include/kvengine/db.h, "namespaces"; docs/namespace_format.md): two
// namespaces and the default one hold the same user keys, and every call of one touches
// only its own; DropNamespace removes only its keys, in memory and on SSD, across a
// reopen; the registry survives a reopen and a kill -9, and a damaged one fails Open.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "namespaces/namespace_keys.h"
#include "namespaces/namespace_registry.h"
#include "test/test_util.h"
#include "util/coding.h"
#include "util/hash.h"
#include "util/namespace_key.h"
#include "util/printable.h"

namespace kvengine {
namespace {

constexpr int kKeys = 10;

std::string Key(int i) { return "k" + std::to_string(i); }
// Each namespace's value of a key differs, in bytes and in size.
std::string Value(const std::string& ns, int i) {
  return ns + ":" + std::to_string(i) + std::string(static_cast<size_t>(i) + ns.size(), 'v');
}

Options SsdOptions() {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 8 << 20;
  o.memory_slab_size = 1 << 20;
  o.ssd_capacity_bytes = 64 << 20;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  o.log_level = LogLevel::kError;
  return o;
}

std::vector<Slice> Slices(const std::vector<std::string>& keys) {
  return std::vector<Slice>(keys.begin(), keys.end());
}

std::vector<std::string> AllKeys() {
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; i++) keys.push_back(Key(i));
  return keys;
}

// What `db` answers for Key(i): its value, "<absent>" or the error.
std::string Get(DB* db, int i) {
  std::string v;
  Status s = db->Get(ReadOptions(), Key(i), &v);
  return s.ok() ? v : s.IsNotFound() ? "<absent>" : s.ToString();
}

class NamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open() {
    db_.reset();
    ASSERT_TRUE(DB::Open(options_, dir_.path(), &db_).ok());
  }
  void Reopen() {
    a_.reset();
    b_.reset();
    ASSERT_TRUE(db_->Close().ok());
    Open();
  }
  void CreateBoth() {
    NamespaceOptions o;
    ASSERT_TRUE(db_->CreateNamespace("a", o, &a_).ok());
    ASSERT_TRUE(db_->CreateNamespace("b", o, &b_).ok());
  }
  // The three keyspaces, named as Value() names them.
  std::vector<std::pair<std::string, DB*>> All() {
    return {{"default", db_.get()}, {"a", a_.get()}, {"b", b_.get()}};
  }
  // Fills every keyspace with the same keys, their own values: default and a by Put, b
  // by BatchPut.
  void Fill() {
    for (int i = 0; i < kKeys; i++) {
      ASSERT_TRUE(db_->Put(WriteOptions(), Key(i), Value("default", i)).ok());
      ASSERT_TRUE(a_->Put(WriteOptions(), Key(i), Value("a", i)).ok());
    }
    const std::vector<std::string> keys = AllKeys();
    std::vector<std::string> values;
    std::vector<ValueParts> parts;
    for (int i = 0; i < kKeys; i++) values.push_back(Value("b", i));
    for (const std::string& v : values) parts.push_back({Slice(v)});
    std::vector<int64_t> results;
    ASSERT_TRUE(b_->BatchPut(WriteOptions(), Slices(keys), parts, &results).ok());
    for (int64_t r : results) ASSERT_EQ(r, 0);
  }
  // Key(i) of keyspace `name` holds its own value (or is absent when `present` is false).
  void Expect(const std::string& name, DB* db, int i, bool present) {
    EXPECT_EQ(Get(db, i), present ? Value(name, i) : "<absent>") << name << " " << Key(i);
  }

  test::TempDir dir_;
  Options options_ = SsdOptions();
  std::unique_ptr<DB> db_, a_, b_;
};

TEST_F(NamespaceTest, AnErrorNamesTheKeyAsItsUserGaveIt) {
  CreateBoth();
  std::string v;
  Status s = a_->Get(ReadOptions(), "missing", &v);
  ASSERT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_EQ(s.ToString(), "NotFound: key 'missing' (namespace a)");
  char small[1];
  size_t size = 0;
  ASSERT_TRUE(a_->Put(WriteOptions(), "k", "value").ok());
  s = a_->GetInto(ReadOptions(), "k", MutableSlice(small, sizeof(small)), &size);
  EXPECT_TRUE(s.IsBufferTooSmall()) << s.ToString();
  EXPECT_NE(s.ToString().find("'k' (namespace a)"), std::string::npos) << s.ToString();
  EXPECT_EQ(s.ToString().find("\\xfe"), std::string::npos) << s.ToString();
}

// The rewrite the handle's errors go through, on messages made the way the layers below
// make them: the internal key as Printable shows it, whatever bytes the key holds and
// however long it is; a message naming another key, or none, comes back as it was.
TEST(NamespaceKeysTest, NameUserKeyRenamesOnlyThisKeysInternalForm) {
  const NamespaceKeys keys(ns::IdOf("a"), 4096);
  const auto internal = [&](const std::string& key) { return keys.prefix() + key; };
  const auto renamed = [&](const std::string& key, const std::string& message) {
    return keys.NameUserKey(Status::NotFound(message), Slice(key), "a").ToString();
  };
  for (const std::string& key :
       {std::string("k"), std::string("q'uo\\te"), std::string("\x00\xfe\x01", 3),
        std::string(54, 'x'), std::string(55, 'y'), std::string(56, 'z'), std::string(64, 'w'),
        std::string(200, 'v'), std::string()}) {
    const std::string stored = Printable(Slice(internal(key)));
    EXPECT_EQ(renamed(key, "key " + stored + " gone"),
              "NotFound: key " + Printable(Slice(key)) + " (namespace a) gone")
        << Printable(Slice(key));
    // Another key of the same namespace is left as the layer below named it (where
    // Printable tells the two apart: not past the bytes it shows).
    const std::string other = Printable(Slice(internal(key + "2")));
    if (other != stored) {
      EXPECT_EQ(renamed(key, "key " + other), "NotFound: key " + other) << Printable(Slice(key));
    }
  }
  EXPECT_EQ(renamed("k", "no key named"), "NotFound: no key named");
  EXPECT_EQ(renamed("k", "cut " + Printable(Slice(internal("k"))).substr(0, 12)),
            "NotFound: cut " + Printable(Slice(internal("k"))).substr(0, 12));
  EXPECT_TRUE(keys.NameUserKey(Status::OK(), Slice("k"), "a").ok());
}

TEST_F(NamespaceTest, ReadsSeeOnlyTheirNamespace) {
  CreateBoth();
  Fill();
  const std::vector<std::string> keys = AllKeys();
  for (auto& [name, db] : All()) {
    for (int i = 0; i < kKeys; i++) {
      Expect(name, db, i, true);
      uint64_t size = 0;
      ASSERT_TRUE(db->GetValueSize(Key(i), &size).ok());
      EXPECT_EQ(size, Value(name, i).size()) << name;
      char buf[256];
      size_t got = 0;
      ASSERT_TRUE(db->GetInto(ReadOptions(), Key(i), MutableSlice(buf, sizeof(buf)), &got).ok());
      EXPECT_EQ(std::string(buf, got), Value(name, i));
    }
    std::vector<std::string> bufs(kKeys, std::string(256, '\0'));
    std::vector<Destination> dests;
    for (std::string& b : bufs) dests.push_back({MutableSlice(b.data(), b.size())});
    std::vector<int64_t> results;
    ASSERT_TRUE(db->BatchGetInto(ReadOptions(), Slices(keys), dests, &results).ok());
    for (int i = 0; i < kKeys; i++) {
      ASSERT_EQ(results[i], static_cast<int64_t>(Value(name, i).size())) << name;
      EXPECT_EQ(bufs[i].substr(0, results[i]), Value(name, i));
    }
    // A key only this keyspace has.
    const std::string own = "only-" + name;
    ASSERT_TRUE(db->Put(WriteOptions(), own, "x").ok());
    std::vector<Slice> probe = {Slice(own), Slice("only-a"), Slice("only-b"),
                                Slice("only-default")};
    ASSERT_TRUE(db->BatchExists(probe, &results).ok());
    ASSERT_EQ(results.size(), 4u);
    EXPECT_EQ(results[0], 1) << name;
    EXPECT_EQ(results[1] + results[2] + results[3], 1) << name << ": only its own key";
    ASSERT_TRUE(db->BatchLocate(probe, &results).ok());
    EXPECT_EQ(results[0], kLocatedMemory) << name;
    EXPECT_EQ(results[1] + results[2] + results[3], kLocatedMemory) << name;
    ASSERT_TRUE(db->Prefetch(probe, &results).ok());
    EXPECT_EQ(results.size(), 4u);
  }
}

// Prefetch in a namespace promotes that namespace's value, not the default's.
TEST_F(NamespaceTest, PrefetchPromotesTheNamespacesValue) {
  CreateBoth();
  Fill();
  ASSERT_TRUE(db_->Flush().ok());
  Reopen();  // the memory tier starts empty: every value is on SSD only
  ASSERT_TRUE(db_->OpenNamespace("a", &a_).ok());
  std::vector<Slice> keys = {Slice("k3")};
  std::vector<int64_t> results;
  ASSERT_TRUE(a_->BatchLocate(keys, &results).ok());
  EXPECT_EQ(results[0], kLocatedSsd);
  ASSERT_TRUE(a_->Prefetch(keys, &results).ok());
  EXPECT_EQ(results[0], 1);
  for (int tries = 0; tries < 500; tries++) {
    ASSERT_TRUE(a_->BatchLocate(keys, &results).ok());
    if (results[0] == kLocatedMemory) break;
    usleep(2000);
  }
  EXPECT_EQ(results[0], kLocatedMemory);
  ASSERT_TRUE(db_->BatchLocate(keys, &results).ok());
  EXPECT_EQ(results[0], kLocatedSsd) << "the default namespace's k3 was not prefetched";
  Expect("a", a_.get(), 3, true);
  Expect("default", db_.get(), 3, true);
}

TEST_F(NamespaceTest, DeletesTouchOnlyTheirNamespace) {
  CreateBoth();
  Fill();
  // Delete: a's k1.
  ASSERT_TRUE(a_->Delete(WriteOptions(), Key(1)).ok());
  EXPECT_TRUE(a_->Delete(WriteOptions(), Key(1)).IsNotFound());
  // BatchDelete: b's k2 and k3.
  std::vector<Slice> two = {Slice("k2"), Slice("k3")};
  std::vector<int64_t> results;
  ASSERT_TRUE(b_->BatchDelete(WriteOptions(), two, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{0, 0}));
  // DeleteByRegex: the pattern matches the key as the namespace's user sees it.
  uint64_t deleted = 0;
  ASSERT_TRUE(a_->DeleteByRegex("k[45]", &deleted).ok());
  EXPECT_EQ(deleted, 2u);
  ASSERT_TRUE(db_->DeleteByRegex("k6", &deleted).ok());
  EXPECT_EQ(deleted, 1u);
  // A pattern anchored at the start of the user key matches in a namespace; '^' inside a
  // class is a character like any other.
  ASSERT_TRUE(b_->DeleteByRegex("^k7$", &deleted).ok());
  EXPECT_EQ(deleted, 1u);
  ASSERT_TRUE(b_->DeleteByRegex("k[\\^8]x", &deleted).ok());
  EXPECT_EQ(deleted, 0u);
  for (int i = 0; i < kKeys; i++) {
    Expect("default", db_.get(), i, i != 6);
    Expect("a", a_.get(), i, i != 1 && i != 4 && i != 5);
    Expect("b", b_.get(), i, i != 2 && i != 3 && i != 7);
  }
  // DeleteAll of b, then of the default: a keeps its keys.
  ASSERT_TRUE(b_->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, kKeys - 3u);
  ASSERT_TRUE(db_->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, kKeys - 1u);
  for (int i = 0; i < kKeys; i++) {
    Expect("default", db_.get(), i, false);
    Expect("b", b_.get(), i, false);
    Expect("a", a_.get(), i, i != 1 && i != 4 && i != 5);
  }
}

// An overwrite in a namespace replaces only its own value.
TEST_F(NamespaceTest, OverwritesStayInTheirNamespace) {
  CreateBoth();
  Fill();
  ASSERT_TRUE(a_->Put(WriteOptions(), Key(0), "new").ok());
  EXPECT_EQ(Get(a_.get(), 0), "new");
  Expect("default", db_.get(), 0, true);
  Expect("b", b_.get(), 0, true);
}

TEST_F(NamespaceTest, RemovalFeedShowsEachNamespaceItsOwnEvents) {
  CreateBoth();
  RemovalBatch batch;
  ASSERT_TRUE(db_->ReadRemovals(0, 0, &batch).ok());  // recording starts
  Fill();
  ASSERT_TRUE(a_->Delete(WriteOptions(), Key(2)).ok());
  ASSERT_TRUE(db_->Delete(WriteOptions(), Key(3)).ok());
  auto keys_of = [](DB* db) {
    RemovalBatch got;
    EXPECT_TRUE(db->ReadRemovals(0, 100, &got).ok());
    std::set<std::string> keys;
    for (const RemovalEvent& e : got.events) keys.insert(e.key);
    return keys;
  };
  EXPECT_EQ(keys_of(a_.get()), std::set<std::string>{"k2"});
  EXPECT_EQ(keys_of(db_.get()), std::set<std::string>{"k3"});
  EXPECT_TRUE(keys_of(b_.get()).empty());
}

TEST_F(NamespaceTest, DefaultNamespaceRefusesNamespacedKeys) {
  CreateBoth();
  ASSERT_TRUE(a_->Put(WriteOptions(), "k", "a's").ok());
  // The internal form of a's "k": the default namespace may not name it.
  const std::string internal = ns::Prefix(ns::IdOf("a")) + "k";
  Status s = db_->Put(WriteOptions(), internal, "overwrite");
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("0xfe"), std::string::npos) << s.ToString();
  std::string v;
  EXPECT_TRUE(db_->Get(ReadOptions(), internal, &v).IsInvalidArgument());
  EXPECT_TRUE(db_->Delete(WriteOptions(), internal).IsInvalidArgument());
  uint64_t size = 0;
  EXPECT_TRUE(db_->GetValueSize(internal, &size).IsInvalidArgument());
  // In a batch only that key fails.
  std::vector<Slice> keys = {Slice(internal), Slice("plain")};
  std::vector<ValueParts> values = {{Slice("x")}, {Slice("y")}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{Status::InvalidArgument("").ErrorCode(), 0}));
  ASSERT_TRUE(db_->BatchExists(keys, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{Status::InvalidArgument("").ErrorCode(), 1}));
  ASSERT_TRUE(db_->BatchDelete(WriteOptions(), keys, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{Status::InvalidArgument("").ErrorCode(), 0}));
  // Every key of the default namespace, by regex: a's key stays.
  uint64_t deleted = 0;
  ASSERT_TRUE(db_->DeleteByRegex("[\\x00-\\xff]*", &deleted).ok());
  EXPECT_EQ(Get(a_.get(), 0), "<absent>");  // (a has no k0)
  ASSERT_TRUE(a_->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "a's");
}

// A namespace's key is checked as the user gave it: an empty key is not made valid by
// the prefix, and the prefix counts against max_key_size.
TEST_F(NamespaceTest, NamespaceKeysAreCheckedAsGiven) {
  CreateBoth();
  EXPECT_TRUE(a_->Put(WriteOptions(), "", "x").IsInvalidArgument());
  const std::string longest(options_.max_key_size - ns::kPrefixSize, 'x');
  EXPECT_TRUE(a_->Put(WriteOptions(), longest, "x").ok());
  Status s = a_->Put(WriteOptions(), longest + "x", "x");
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("namespace prefix"), std::string::npos) << s.ToString();
  std::vector<Slice> keys = {Slice(""), Slice("ok")};
  std::vector<ValueParts> values = {{Slice("x")}, {Slice("y")}};
  std::vector<int64_t> results;
  ASSERT_TRUE(a_->BatchPut(WriteOptions(), keys, values, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{Status::InvalidArgument("").ErrorCode(), 0}));
  // Batch rules still hold, and name the user's key.
  keys = {Slice("dup"), Slice("dup")};
  s = a_->BatchPut(WriteOptions(), keys, values, &results);
  EXPECT_TRUE(s.IsInvalidArgument());
  // The DB below finds the duplicate; the handle words it with the user's key.
  EXPECT_EQ(s.message(), "BatchPut names key 'dup' more than once; nothing was written");
  EXPECT_TRUE(a_->BatchExists(keys, nullptr).IsInvalidArgument());
  // With a key refused here as well, the batch is still refused whole.
  keys = {Slice("dup2"), Slice(""), Slice("dup2")};
  values = {{Slice("x")}, {Slice("y")}, {Slice("z")}};
  s = a_->BatchPut(WriteOptions(), keys, values, &results);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(s.message(), "BatchPut names key 'dup2' more than once; nothing was written");
  // And so is one whose keys are all refused here, twice the same (none goes down).
  keys = {Slice(""), Slice("")};
  values = {{Slice("x")}, {Slice("y")}};
  s = a_->BatchPut(WriteOptions(), keys, values, &results);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(s.message(), "BatchPut names key '' more than once; nothing was written");
  std::string v;
  EXPECT_TRUE(a_->Get(ReadOptions(), "dup", &v).IsNotFound());
  EXPECT_TRUE(a_->Get(ReadOptions(), "dup2", &v).IsNotFound());
}

// A pattern that does not compile on its own is refused, so that none can close the
// namespace's group and match outside it.
TEST_F(NamespaceTest, APatternCannotEscapeItsNamespace) {
  CreateBoth();
  Fill();
  uint64_t deleted = 99;
  EXPECT_TRUE(a_->DeleteByRegex(")|(.*", &deleted).IsInvalidArgument());
  EXPECT_TRUE(a_->DeleteByRegex("k1)|(k2", &deleted).IsInvalidArgument());
  EXPECT_TRUE(db_->DeleteByRegex(")|(.*", &deleted).IsInvalidArgument());
  // Assertions on what precedes a position would see the prefix: refused, but for a
  // leading '^' (the match is of the whole key anyway).
  EXPECT_TRUE(a_->DeleteByRegex("k1|^k2", &deleted).IsInvalidArgument());
  EXPECT_TRUE(a_->DeleteByRegex("\\bk1", &deleted).IsInvalidArgument());
  EXPECT_TRUE(a_->DeleteByRegex("k\\B1", &deleted).IsInvalidArgument());
  for (auto& [name, db] : All()) {
    for (int i = 0; i < kKeys; i++) Expect(name, db, i, true);
  }
}

TEST_F(NamespaceTest, CreateOpenAndTheirErrors) {
  NamespaceOptions o;
  o.memory_quota_bytes = 1 << 20;
  o.ssd_quota_bytes = 8 << 20;
  o.weight = 3;
  std::unique_ptr<DB> h;
  ASSERT_TRUE(db_->CreateNamespace("tenant-1", o, &h).ok());
  std::string name;
  ASSERT_TRUE(h->GetProperty("kvengine.namespace", &name));
  EXPECT_EQ(name, "tenant-1");
  Status s = db_->CreateNamespace("tenant-1", o, &h);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(h, nullptr);
  EXPECT_TRUE(db_->OpenNamespace("nobody", &h).IsNotFound());
  for (const char* bad : {"", "default", "has space", "slash/y", "\xfe"}) {
    EXPECT_TRUE(db_->CreateNamespace(bad, o, &h).IsInvalidArgument()) << bad;
  }
  EXPECT_TRUE(db_->CreateNamespace(std::string(65, 'n'), o, &h).IsInvalidArgument());
  o.weight = 0;
  EXPECT_TRUE(db_->CreateNamespace("w0", o, &h).IsInvalidArgument());
  o.weight = 1001;
  EXPECT_TRUE(db_->CreateNamespace("w1001", o, &h).IsInvalidArgument());
  EXPECT_TRUE(db_->DropNamespace("nobody", nullptr).IsNotFound());
  std::vector<NamespaceInfo> list;
  ASSERT_TRUE(db_->ListNamespaces(&list).ok());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "tenant-1");
  EXPECT_EQ(list[0].id, ns::IdOf("tenant-1"));
  EXPECT_EQ(list[0].options.weight, 3u);
  // Namespaces do not nest.
  ASSERT_TRUE(db_->OpenNamespace("tenant-1", &h).ok());
  std::unique_ptr<DB> inner;
  EXPECT_TRUE(h->CreateNamespace("x", NamespaceOptions(), &inner).IsInvalidArgument());
}

// Two handles of one namespace see the same keys; a closed handle and a handle that
// outlived its DB answer Aborted.
TEST_F(NamespaceTest, HandlesShareTheirNamespaceAndOutliveTheDb) {
  CreateBoth();
  std::unique_ptr<DB> a2;
  ASSERT_TRUE(db_->OpenNamespace("a", &a2).ok());
  ASSERT_TRUE(a_->Put(WriteOptions(), "k", "v").ok());
  std::string v;
  ASSERT_TRUE(a2->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "v");
  ASSERT_TRUE(a2->Close().ok());
  EXPECT_TRUE(a2->Get(ReadOptions(), "k", &v).IsAborted());
  EXPECT_TRUE(a_->Get(ReadOptions(), "k", &v).ok());
  ASSERT_TRUE(db_->Close().ok());
  EXPECT_TRUE(a_->Get(ReadOptions(), "k", &v).IsAborted());
  db_.reset();
  EXPECT_TRUE(a_->Put(WriteOptions(), "k", "v").IsAborted());
  EXPECT_TRUE(db_ == nullptr);
  Open();
}

// Calls racing a drop and the DB's Close through the handle's gate: each call either
// runs whole on a live DB or is refused Aborted, none runs once the drop has begun
// removing the namespace's keys, and the DB is gone only after the last call in flight
// (TSan and ASan builds run this too).
TEST_F(NamespaceTest, CallsRacingADropAndACloseRunWholeOrAreRefused) {
  CreateBoth();
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; t++) {
    DB* handle = t == 2 ? b_.get() : a_.get();
    callers.emplace_back([&, handle, t] {
      std::string v;
      for (int i = 0; !stop.load(); i++) {
        const std::string key = "r" + std::to_string(t) + "-" + std::to_string(i % 64);
        Status s = i % 2 == 0 ? handle->Put(WriteOptions(), key, "value")
                              : handle->Get(ReadOptions(), key, &v);
        if (s.ok() || s.IsNotFound()) {
          ok.fetch_add(1);
        } else if (s.IsAborted()) {
          refused.fetch_add(1);
        } else {
          other.fetch_add(1);
          ADD_FAILURE() << s.ToString();
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  uint64_t deleted = 0;
  ASSERT_TRUE(db_->DropNamespace("a", &deleted).ok());
  std::string v;
  EXPECT_TRUE(a_->Get(ReadOptions(), "r0-0", &v).IsAborted());  // gone, for good
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_TRUE(db_->Close().ok());  // b's caller still running
  EXPECT_TRUE(b_->Get(ReadOptions(), "r2-0", &v).IsAborted());
  stop = true;
  for (auto& t : callers) t.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(other.load(), 0);
  db_.reset();
  Open();
  std::vector<NamespaceInfo> names;
  ASSERT_TRUE(db_->ListNamespaces(&names).ok());
  ASSERT_EQ(names.size(), 1u);  // a's drop finished; b kept what its calls put
  EXPECT_EQ(names[0].name, "b");
}

TEST_F(NamespaceTest, DropRemovesOnlyItsKeysInEveryTierAcrossReopen) {
  CreateBoth();
  Fill();
  ASSERT_TRUE(db_->Flush().ok());  // on SSD too (and in memory: write_through)
  std::vector<Slice> k0 = {Slice("k0")};
  std::vector<int64_t> results;
  ASSERT_TRUE(a_->BatchLocate(k0, &results).ok());
  EXPECT_EQ(results[0], kLocatedMemory);
  uint64_t deleted = 0;
  ASSERT_TRUE(db_->DropNamespace("a", &deleted).ok());
  EXPECT_EQ(deleted, static_cast<uint64_t>(kKeys));
  std::string v;
  Status s = a_->Get(ReadOptions(), Key(0), &v);
  EXPECT_TRUE(s.IsAborted()) << s.ToString();
  EXPECT_NE(s.ToString().find("dropped"), std::string::npos) << s.ToString();
  EXPECT_TRUE(db_->OpenNamespace("a", &a_).IsNotFound());
  Reopen();
  std::vector<NamespaceInfo> list;
  ASSERT_TRUE(db_->ListNamespaces(&list).ok());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "b");
  ASSERT_TRUE(db_->OpenNamespace("b", &b_).ok());
  // A new "a" has the same id: its keys must not come back from SSD.
  ASSERT_TRUE(db_->CreateNamespace("a", NamespaceOptions(), &a_).ok());
  for (int i = 0; i < kKeys; i++) {
    Expect("default", db_.get(), i, true);
    Expect("b", b_.get(), i, true);
    Expect("a", a_.get(), i, false);
  }
  ASSERT_TRUE(a_->BatchLocate(k0, &results).ok());
  EXPECT_EQ(results[0], kLocatedAbsent);
}

// A drop that did not finish leaves the namespace marked dropping: it cannot be opened
// or created, and DropNamespace finishes it.
TEST_F(NamespaceTest, AnUnfinishedDropIsFinishedByTheNextDrop) {
  CreateBoth();
  Fill();
  ASSERT_TRUE(db_->Flush().ok());
  a_.reset();
  b_.reset();
  ASSERT_TRUE(db_->Close().ok());
  db_.reset();
  // The registry as a drop that died before removing the keys leaves it.
  NamespaceRecords records;
  ASSERT_TRUE(LoadNamespaceRegistry(Env::Default(), dir_.path(), &records).ok());
  ASSERT_EQ(records.size(), 2u);
  records[0].info.dropping = true;  // "a"
  ASSERT_TRUE(SaveNamespaceRegistry(Env::Default(), dir_.path(), records).ok());
  Open();
  std::vector<NamespaceInfo> list;
  ASSERT_TRUE(db_->ListNamespaces(&list).ok());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_TRUE(list[0].dropping);
  EXPECT_TRUE(db_->OpenNamespace("a", &a_).IsAborted());
  EXPECT_TRUE(db_->CreateNamespace("a", NamespaceOptions(), &a_).IsAborted());
  uint64_t deleted = 0;
  ASSERT_TRUE(db_->DropNamespace("a", &deleted).ok());
  EXPECT_EQ(deleted, static_cast<uint64_t>(kKeys));
  ASSERT_TRUE(db_->ListNamespaces(&list).ok());
  ASSERT_EQ(list.size(), 1u);
  ASSERT_TRUE(db_->OpenNamespace("b", &b_).ok());
  for (int i = 0; i < kKeys; i++) Expect("b", b_.get(), i, true);
}

TEST_F(NamespaceTest, RegistrySurvivesReopen) {
  NamespaceOptions o;
  o.memory_quota_bytes = 123456789;
  o.ssd_quota_bytes = 987654321012ull;
  o.weight = 7;
  ASSERT_TRUE(db_->CreateNamespace("t.one", o, &a_).ok());
  ASSERT_TRUE(db_->CreateNamespace("t_two", NamespaceOptions(), &b_).ok());
  ASSERT_TRUE(a_->Put(WriteOptions(), "k", "one").ok());
  Reopen();
  std::vector<NamespaceInfo> list;
  ASSERT_TRUE(db_->ListNamespaces(&list).ok());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "t.one");
  EXPECT_EQ(list[0].options.memory_quota_bytes, o.memory_quota_bytes);
  EXPECT_EQ(list[0].options.ssd_quota_bytes, o.ssd_quota_bytes);
  EXPECT_EQ(list[0].options.weight, 7u);
  EXPECT_FALSE(list[0].dropping);
  EXPECT_EQ(list[1].name, "t_two");
  EXPECT_EQ(list[1].options.weight, 1u);
  ASSERT_TRUE(db_->OpenNamespace("t.one", &a_).ok());
  std::string v;
  ASSERT_TRUE(a_->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "one");
  EXPECT_TRUE(db_->Get(ReadOptions(), "k", &v).IsNotFound());
}

TEST_F(NamespaceTest, RegistrySurvivesKill9) {
  a_.reset();
  ASSERT_TRUE(db_->Close().ok());
  db_.reset();
  const int rc = test::KillAfter([&] {
    std::unique_ptr<DB> db, h;
    if (!DB::Open(options_, dir_.path(), &db).ok()) return 3;
    NamespaceOptions o;
    o.weight = 5;
    if (!db->CreateNamespace("crashy", o, &h).ok()) return 4;
    if (!h->Put(WriteOptions(), "k", "survives").ok()) return 5;
    if (!db->Put(WriteOptions(), "k", "default's").ok()) return 6;
    return db->Flush().ok() ? 0 : 7;
  });
  ASSERT_EQ(rc, 0) << "the child failed before its Flush completed";
  Open();
  std::vector<NamespaceInfo> list;
  ASSERT_TRUE(db_->ListNamespaces(&list).ok());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "crashy");
  EXPECT_EQ(list[0].options.weight, 5u);
  ASSERT_TRUE(db_->OpenNamespace("crashy", &a_).ok());
  std::string v;
  ASSERT_TRUE(a_->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "survives");
  ASSERT_TRUE(db_->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "default's");
}

// Every single-byte change and every truncation of a registry is refused as Corruption
// (and parsing it never crashes: run under ASan/UBSan).
TEST(NamespaceRegistryTest, EveryDamageIsCorruption) {
  NamespaceRecords records(3);
  records[0] = {{"alpha", ns::IdOf("alpha"), {1, 2, 3}, false}, 7, false};
  records[1] = {{"beta", ns::IdOf("beta"), {0, 0, 1}, true}, 8, false};
  records[2] = {{"gamma", ns::IdOf("gamma"), {0, 0, 1}, false}, 9, true};
  const std::string good = EncodeNamespaceRegistry(records);
  NamespaceRecords decoded;
  ASSERT_TRUE(DecodeNamespaceRegistry(good, "test", &decoded).ok());
  ASSERT_EQ(decoded.size(), 3u);
  EXPECT_EQ(decoded[0].info.name, "alpha");
  EXPECT_EQ(decoded[0].info.options.ssd_quota_bytes, 2u);
  EXPECT_EQ(decoded[0].stamp, 7u);
  EXPECT_TRUE(decoded[1].info.dropping);
  EXPECT_TRUE(decoded[2].dropped);
  for (size_t pos = 0; pos < good.size(); pos++) {
    for (int bit = 0; bit < 8; bit++) {
      std::string bad = good;
      bad[pos] = static_cast<char>(bad[pos] ^ (1 << bit));
      Status s = DecodeNamespaceRegistry(bad, "test", &decoded);
      ASSERT_TRUE(s.IsCorruption()) << "byte " << pos << " bit " << bit << ": " << s.ToString();
      EXPECT_TRUE(decoded.empty());
    }
  }
  for (size_t len = 0; len < good.size(); len++) {
    ASSERT_TRUE(DecodeNamespaceRegistry(good.substr(0, len), "test", &decoded).IsCorruption())
        << len;
  }
  ASSERT_TRUE(DecodeNamespaceRegistry(good + "x", "test", &decoded).IsCorruption());
}

// A registry written by a build before stamps and tombstones (format 1) is still read:
// its records have stamp 0, and the next change writes format 2.
TEST(NamespaceRegistryTest, AFormatOneRegistryIsRead) {
  std::string v1;
  PutFixed64(&v1, 0x31474552534e564bull);
  PutFixed32(&v1, 1);
  PutFixed32(&v1, 1);
  PutLengthPrefixed(&v1, "old");
  PutFixed64(&v1, ns::IdOf("old"));
  PutFixed64(&v1, 5);  // memory quota
  PutFixed64(&v1, 6);  // SSD quota
  PutFixed32(&v1, 7);  // weight
  v1.push_back(1);     // dropping
  PutFixed64(&v1, Hash64(v1));
  NamespaceRecords decoded;
  Status s = DecodeNamespaceRegistry(v1, "test", &decoded);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(decoded.size(), 1u);
  EXPECT_EQ(decoded[0].info.name, "old");
  EXPECT_EQ(decoded[0].info.options.weight, 7u);
  EXPECT_TRUE(decoded[0].info.dropping);
  EXPECT_EQ(decoded[0].stamp, 0u);
  EXPECT_FALSE(decoded[0].dropped);
  // State 2 (a tombstone) did not exist in format 1.
  std::string bad = v1.substr(0, v1.size() - 9);
  bad.push_back(2);
  PutFixed64(&bad, Hash64(bad));
  EXPECT_TRUE(DecodeNamespaceRegistry(bad, "test", &decoded).IsCorruption());
}

// Merging registries in any order converges: the later stamp wins, and on a tie the
// later state, then the larger options.
TEST(NamespaceRegistryTest, SupersedesOrdersEveryPairOfRecordsOneWay) {
  const NamespaceInfo live{"n", ns::IdOf("n"), {0, 0, 1}, false};
  NamespaceInfo dropping = live;
  dropping.dropping = true;
  const std::vector<NamespaceRecord> records = {{live, 1, false},
                                                {live, 2, false},
                                                {dropping, 2, false},
                                                {live, 2, true},
                                                {{"n", ns::IdOf("n"), {9, 0, 1}, false}, 2, false}};
  for (size_t i = 0; i < records.size(); i++) {
    EXPECT_FALSE(Supersedes(records[i], records[i])) << i;
    for (size_t j = 0; j < records.size(); j++) {
      if (i != j) {
        EXPECT_NE(Supersedes(records[i], records[j]), Supersedes(records[j], records[i]));
      }
    }
  }
  EXPECT_TRUE(Supersedes(records[1], records[0]));  // later stamp
  EXPECT_TRUE(Supersedes(records[3], records[2]));  // a tombstone over a drop of one stamp
  EXPECT_TRUE(Supersedes(records[2], records[1]));  // dropping over live
  EXPECT_TRUE(Supersedes(records[4], records[1]));  // larger options
}

// Records that carry a valid checksum but break the registry's rules are refused too:
// a repeated name or id would merge two namespaces' keys.
TEST(NamespaceRegistryTest, RepeatedNamesAndIdsAreCorruption) {
  NamespaceRecords twice = {{{"same", 1, {}, false}}, {{"same", 2, {}, false}}};
  Status s = DecodeNamespaceRegistry(EncodeNamespaceRegistry(twice), "test", &twice);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  NamespaceRecords ids = {{{"one", 9, {}, false}}, {{"two", 9, {}, false}}};
  s = DecodeNamespaceRegistry(EncodeNamespaceRegistry(ids), "test", &ids);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  NamespaceRecords weight = {{{"w", 9, {0, 0, 0}, false}}};
  s = DecodeNamespaceRegistry(EncodeNamespaceRegistry(weight), "test", &weight);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

TEST_F(NamespaceTest, DamagedRegistryFailsOpen) {
  CreateBoth();
  Fill();
  Reopen();
  a_.reset();
  b_.reset();
  ASSERT_TRUE(db_->Close().ok());
  db_.reset();
  const std::string path = dir_.Sub(kNamespaceRegistryFile);
  std::string data;
  {
    std::ifstream in(path, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(data.size(), 20u);
  data[20] = static_cast<char>(data[20] ^ 0x01);  // inside the first record
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  Status s = DB::Open(options_, dir_.path(), &db_);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find("namespace registry"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("checksum"), std::string::npos) << s.ToString();
  EXPECT_EQ(db_, nullptr);
  // An empty file is damaged too, not "no namespaces".
  std::filesystem::resize_file(path, 0);
  s = DB::Open(options_, dir_.path(), &db_);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  // Without the file the DB opens with no namespaces (the default one's keys intact).
  std::filesystem::remove(path);
  Open();
  std::vector<NamespaceInfo> list;
  ASSERT_TRUE(db_->ListNamespaces(&list).ok());
  EXPECT_TRUE(list.empty());
  Expect("default", db_.get(), 0, true);
}

// Without any namespace, DeleteAll of the default namespace is the engine's own (no
// pattern); once one exists it spares the namespace's keys.
TEST_F(NamespaceTest, DeleteAllBeforeAndAfterTheFirstNamespace) {
  ASSERT_TRUE(db_->Put(WriteOptions(), "k", "v").ok());
  uint64_t deleted = 0;
  ASSERT_TRUE(db_->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, 1u);
  CreateBoth();
  ASSERT_TRUE(a_->Put(WriteOptions(), "k", "a").ok());
  ASSERT_TRUE(db_->Put(WriteOptions(), "k", "v").ok());
  ASSERT_TRUE(db_->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, 1u);
  std::string v;
  ASSERT_TRUE(a_->Get(ReadOptions(), "k", &v).ok());
}

// An attached client's own calls are the owner's default namespace: it cannot name a
// namespace's key on the arena path (put, get) nor through the owner's calls (exists,
// delete), and its DeleteAll spares the namespace's keys.  It reaches a namespace through
// its handle (test/attach_namespace_test.cc covers credentials).
TEST(NamespaceAttachTest, AnAttachedClientIsTheDefaultNamespace) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  const std::string socket = dir.Sub("db") + "/kv.sock";
  Options owner_options = SsdOptions();
  owner_options.ssd_capacity_bytes = 0;
  owner_options.prefault_memory = false;
  owner_options.local_listen = socket;
  std::unique_ptr<DB> owner, a, client;
  Status s = DB::Open(owner_options, dir.Sub("db"), &owner);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(owner->CreateNamespace("a", NamespaceOptions(), &a).ok());
  ASSERT_TRUE(a->Put(WriteOptions(), "k", "a's").ok());
  Options client_options;
  client_options.apply_environment = false;
  client_options.peer_timeout_ms = 2000;
  ASSERT_TRUE(DB::Attach(client_options, socket, &client).ok());
  const std::string internal = ns::Prefix(ns::IdOf("a")) + "k";
  EXPECT_TRUE(client->Put(WriteOptions(), internal, "overwrite").IsInvalidArgument());
  std::string v;
  EXPECT_TRUE(client->Get(ReadOptions(), internal, &v).IsInvalidArgument());
  EXPECT_TRUE(client->Delete(WriteOptions(), internal).IsInvalidArgument());
  std::vector<Slice> keys = {Slice(internal)};
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchExists(keys, &results).ok());
  EXPECT_EQ(results[0], Status::InvalidArgument("").ErrorCode());
  ASSERT_TRUE(client->Put(WriteOptions(), "k", "default's").ok());
  uint64_t deleted = 0;
  ASSERT_TRUE(client->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, 1u);
  ASSERT_TRUE(a->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "a's");
  std::unique_ptr<DB> h;
  ASSERT_TRUE(client->OpenNamespace("a", &h).ok());
  ASSERT_TRUE(h->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "a's");
  ASSERT_TRUE(h->Close().ok());
  ASSERT_TRUE(client->Close().ok());
}

}  // namespace
}  // namespace kvengine
