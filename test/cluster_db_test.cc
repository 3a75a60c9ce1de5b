// ClusterDB over real local DBs, two hosts in this process on loopback: every call walks
// down (cluster -> local DB -> tiers, or cluster -> router -> peer server -> the peer's
// local DB) and no layer is entered twice by one call.
#include "cluster/cluster_db.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/rendezvous.h"
#include "kvengine/db.h"
#include "test/peer_harness.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

// The layers a thread is inside of, innermost last: each Recorder pushes its name for the
// length of a call.
thread_local std::vector<const char*> layers_in;

// A DB that forwards every call to `inner` and records, per call, which layers were
// already on the thread's stack: a layer found there again is a call that climbed back up.
class Recorder final : public DB {
 public:
  Recorder(const char* name, std::unique_ptr<DB> inner) : name_(name), inner_(std::move(inner)) {}

  int calls(const std::string& op) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& c : calls_) n += c == op;
    return n;
  }
  int reentries() {
    std::lock_guard<std::mutex> lock(mu_);
    return reentries_;
  }
  std::vector<std::string> stacks() {
    std::lock_guard<std::mutex> lock(mu_);
    return stacks_;
  }

  Status Close() override { return inner_->Close(); }
  Status Put(const WriteOptions& o, const Slice& k, const Slice& v) override {
    Scope s(this, "Put");
    return inner_->Put(o, k, v);
  }
  Status Get(const ReadOptions& o, const Slice& k, std::string* v) override {
    Scope s(this, "Get");
    return inner_->Get(o, k, v);
  }
  Status GetInto(const ReadOptions& o, const Slice& k, MutableSlice b, size_t* n) override {
    Scope s(this, "GetInto");
    return inner_->GetInto(o, k, b, n);
  }
  Status Delete(const WriteOptions& o, const Slice& k) override {
    Scope s(this, "Delete");
    return inner_->Delete(o, k);
  }
  Status GetValueSize(const Slice& k, uint64_t* n) override {
    Scope s(this, "GetValueSize");
    return inner_->GetValueSize(k, n);
  }
  Status BatchPut(const WriteOptions& o, std::span<const Slice> k, std::span<const ValueParts> v,
                  std::vector<int64_t>* r) override {
    Scope s(this, o.fill_cache ? "BatchPut(fill_cache)" : "BatchPut");
    return inner_->BatchPut(o, k, v, r);
  }
  Status BatchGetInto(const ReadOptions& o, std::span<const Slice> k,
                      std::span<const Destination> d, std::vector<int64_t>* r) override {
    Scope s(this, "BatchGetInto");
    return inner_->BatchGetInto(o, k, d, r);
  }
  Status BatchExists(std::span<const Slice> k, std::vector<int64_t>* r) override {
    Scope s(this, "BatchExists");
    return inner_->BatchExists(k, r);
  }
  Status BatchDelete(const WriteOptions& o, std::span<const Slice> k,
                     std::vector<int64_t>* r) override {
    Scope s(this, "BatchDelete");
    return inner_->BatchDelete(o, k, r);
  }
  Status DeleteByRegex(const std::string& p, uint64_t* n) override {
    Scope s(this, "DeleteByRegex");
    return inner_->DeleteByRegex(p, n);
  }
  Status DeleteAll(uint64_t* n) override {
    Scope s(this, "DeleteAll");
    return inner_->DeleteAll(n);
  }
  Status RegisterBuffer(void* a, size_t n) override { return inner_->RegisterBuffer(a, n); }
  Status UnregisterBuffer(void* a) override { return inner_->UnregisterBuffer(a); }
  Status Flush() override { return inner_->Flush(); }
  Status CompactBuckets(uint64_t* n) override { return inner_->CompactBuckets(n); }
  Status BatchLocate(std::span<const Slice> k, std::vector<int64_t>* r) override {
    Scope s(this, "BatchLocate");
    return inner_->BatchLocate(k, r);
  }
  bool GetProperty(const std::string& n, std::string* v) override {
    return inner_->GetProperty(n, v);
  }

 private:
  class Scope {
   public:
    Scope(Recorder* r, const char* op) {
      std::string stack;
      bool again = false;
      for (const char* layer : layers_in) {
        stack += std::string(layer) + " > ";
        again |= std::string(layer) == r->name_;
      }
      {
        std::lock_guard<std::mutex> lock(r->mu_);
        r->calls_.push_back(op);
        r->stacks_.push_back(stack + r->name_ + "." + op);
        r->reentries_ += again;
      }
      layers_in.push_back(r->name_);
    }
    ~Scope() { layers_in.pop_back(); }
  };

  const char* const name_;
  std::unique_ptr<DB> inner_;
  std::mutex mu_;
  std::vector<std::string> calls_;
  std::vector<std::string> stacks_;
  int reentries_ = 0;
};

Options LocalOptions() {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 64 << 20;
  o.prefault_memory = false;
  o.ssd_capacity_bytes = 0;
  o.log_level = LogLevel::kOff;
  return o;
}

// One host: its local DB under a Recorder ("local"), a ClusterDB over that, and a
// Recorder ("top") over the ClusterDB, as a user's calls reach it.
struct Host {
  Recorder* local = nullptr;
  Recorder* top = nullptr;
  std::unique_ptr<DB> db;
};

Host StartHost(const std::string& dir, uint16_t port, uint16_t peer_port, PeerMode mode) {
  Host h;
  std::filesystem::create_directories(dir);
  std::unique_ptr<DB> engine;
  Status s = DB::Open(LocalOptions(), dir, &engine);
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto local = std::make_unique<Recorder>("local", std::move(engine));
  h.local = local.get();
  Options o = LocalOptions();
  o.listen = "127.0.0.1:" + std::to_string(port);
  o.peers = "127.0.0.1:" + std::to_string(peer_port);
  o.peer_mode = mode;
  o.peer_transport = PeerTransport::kTcp;
  o.peer_timeout_ms = 5000;
  std::unique_ptr<ClusterDB> cluster;
  EXPECT_TRUE(ClusterDB::Create(o, &cluster).ok());
  EXPECT_NE(cluster, nullptr);
  EXPECT_TRUE(cluster->Start(std::move(local), nullptr, nullptr, nullptr, nullptr, nullptr).ok());
  auto top = std::make_unique<Recorder>("top", std::move(cluster));
  h.top = top.get();
  h.db = std::move(top);
  return h;
}

TEST(ClusterDBTest, ShardedBatchGetWalksDownOnEveryHost) {
  test::TempDir dir;
  const uint16_t pa = FreePort(), pb = FreePort();
  Host a = StartHost(dir.Sub("a"), pa, pb, PeerMode::kSharded);
  Host b = StartHost(dir.Sub("b"), pb, pa, PeerMode::kSharded);
  std::vector<std::string> names, values;
  for (int i = 0; i < 64; i++) {
    names.push_back("model@tp0/layer." + std::to_string(i));
    values.push_back(test::MakeValue(i, 1000 + 37 * i));
  }
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<ValueParts> parts;
  for (const std::string& v : values) parts.push_back({Slice(v)});
  std::vector<int64_t> results;
  ASSERT_TRUE(a.db->BatchPut(WriteOptions(), keys, parts, &results).ok());
  for (int64_t r : results) ASSERT_EQ(r, 0);
  // Both hosts own some of the keys: each local DB got one batch of its own keys.
  EXPECT_EQ(a.local->calls("BatchPut"), 1);
  EXPECT_EQ(b.local->calls("BatchPut"), 1);
  EXPECT_EQ(b.top->calls("BatchPut"), 0);  // the peer's ClusterDB is never asked

  std::vector<std::string> out(names.size());
  std::vector<Destination> dests;
  for (size_t i = 0; i < names.size(); i++) {
    out[i].assign(values[i].size(), '\0');
    dests.push_back({MutableSlice(out[i].data(), out[i].size())});
  }
  ASSERT_TRUE(a.db->BatchGetInto(ReadOptions(), keys, dests, &results).ok());
  for (size_t i = 0; i < names.size(); i++) {
    ASSERT_EQ(results[i], static_cast<int64_t>(values[i].size())) << names[i];
    ASSERT_EQ(out[i], values[i]) << names[i];
  }
  EXPECT_EQ(a.local->calls("BatchGetInto"), 1);
  EXPECT_GE(b.local->calls("BatchGetInto"), 1);  // the peer server reads as it sees fit
  EXPECT_EQ(b.top->calls("BatchGetInto"), 0);
  // No layer was entered twice by one call: nothing climbed back up.
  for (Host* h : {&a, &b}) {
    EXPECT_EQ(h->local->reentries(), 0);
    EXPECT_EQ(h->top->reentries(), 0);
  }
  for (const std::string& s : a.local->stacks()) {
    EXPECT_TRUE(s == "top > local.BatchPut" || s == "top > local.BatchGetInto") << s;
  }
  // B's local DB was called by its peer server only, never through a layer above it.
  for (const std::string& s : b.local->stacks()) {
    EXPECT_EQ(s.find('>'), std::string::npos) << s;
  }
  ASSERT_TRUE(a.db->Close().ok());
  ASSERT_TRUE(b.db->Close().ok());
}

TEST(ClusterDBTest, ReadThroughFillsTheLocalCacheWithoutOverwriting) {
  test::TempDir dir;
  const uint16_t pa = FreePort(), pb = FreePort();
  Host a = StartHost(dir.Sub("a"), pa, pb, PeerMode::kReadThrough);
  Host b = StartHost(dir.Sub("b"), pb, pa, PeerMode::kReadThrough);
  ASSERT_TRUE(b.db->Put(WriteOptions(), "only-on-b", "bytes of b").ok());
  ASSERT_TRUE(b.db->Put(WriteOptions(), "on-both", "b's copy").ok());
  ASSERT_TRUE(a.db->Put(WriteOptions(), "on-both", "a's own").ok());

  const std::vector<Slice> keys{"only-on-b", "on-both", "nowhere"};
  std::vector<std::string> out(3, std::string(32, '\0'));
  std::vector<Destination> dests;
  for (std::string& o : out) dests.push_back({MutableSlice(o.data(), o.size())});
  std::vector<int64_t> results;
  ASSERT_TRUE(a.db->BatchGetInto(ReadOptions(), keys, dests, &results).ok());
  EXPECT_EQ(out[0].substr(0, results[0]), "bytes of b");
  EXPECT_EQ(out[1].substr(0, results[1]), "a's own");  // the local value wins
  EXPECT_EQ(results[2], Status::NotFound("").ErrorCode());
  // The peer's value was offered back to the local DB as a cache fill, once.
  EXPECT_EQ(a.local->calls("BatchPut(fill_cache)"), 1);
  std::string value;
  ASSERT_TRUE(a.local->Get(ReadOptions(), "only-on-b", &value).ok());
  EXPECT_EQ(value, "bytes of b");
  EXPECT_EQ(a.local->reentries(), 0);
  EXPECT_EQ(a.top->reentries(), 0);
  ASSERT_TRUE(a.db->Close().ok());
  ASSERT_TRUE(b.db->Close().ok());
}

TEST(ClusterDBTest, BatchLocateNamesThePeerOfAKeyOnlyAPeerHolds) {
  test::TempDir dir;
  const uint16_t pa = FreePort(), pb = FreePort();
  Host a = StartHost(dir.Sub("a"), pa, pb, PeerMode::kReadThrough);
  Host b = StartHost(dir.Sub("b"), pb, pa, PeerMode::kReadThrough);
  ASSERT_TRUE(b.db->Put(WriteOptions(), "only-on-b", "b").ok());
  ASSERT_TRUE(a.db->Put(WriteOptions(), "on-a", "a").ok());
  const std::vector<Slice> keys{"only-on-b", "on-a", "nowhere"};
  std::vector<int64_t> results;
  ASSERT_TRUE(a.db->BatchLocate(keys, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{kLocatedPeer, kLocatedMemory, kLocatedAbsent}));
  EXPECT_EQ(a.local->calls("BatchLocate"), 1);  // this host's tiers, once
  EXPECT_EQ(a.local->reentries(), 0);
  ASSERT_TRUE(a.db->Close().ok());
  ASSERT_TRUE(b.db->Close().ok());
}

TEST(RendezvousTest, AMemberJoiningMovesOnlyTheKeysItWins) {
  const std::vector<std::string> before{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"};
  std::vector<std::string> after = before;
  after.push_back("10.0.0.4:1");
  int moved = 0;
  for (int i = 0; i < 2000; i++) {
    const std::string key = "key." + std::to_string(i);
    const auto old_owners = TopOwners(key, before, 2);
    const auto new_owners = TopOwners(key, after, 2);
    ASSERT_EQ(old_owners.size(), 2u);
    // A key's new owners are its old ones, except where the newcomer outranks one.
    for (const std::string& o : new_owners) {
      if (o != "10.0.0.4:1") {
        EXPECT_NE(std::find(old_owners.begin(), old_owners.end(), o), old_owners.end()) << key;
      }
    }
    moved += new_owners[0] != old_owners[0];
  }
  EXPECT_GT(moved, 2000 / 4 - 150);  // about a quarter of the primaries move to the newcomer
  EXPECT_LT(moved, 2000 / 4 + 150);
  EXPECT_EQ(TopOwners("k", before, 5).size(), 3u);
}

}  // namespace
}  // namespace kvengine
