// READ_RESIDENT (wire::kReadResident, attach/resident_wire.h): an attached client's
// DB::ReadResident is its owner's, streamed a batch at a time, scoped to the client's
// namespace as its other reads are, with the owner's epoch and the removal sequence of
// the feed the client reads (READ_REMOVALS).  The tenant test runs this binary again
// under another uid (as attach_namespace_test), and skips when not run as root.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attach/resident_wire.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/raw_attach_client.h"
#include "test/test_util.h"
#include "transport/wire.h"
#include "util/coding.h"

namespace kvengine {
namespace {

using KeySet = std::set<std::pair<std::string, int64_t>>;  // (key, tier)

// Reads db's resident set whole, max_batch at a time; every batch's size in *sizes.
Status ReadAll(DB* db, const std::string& prefix, size_t max_batch, KeySet* keys,
               ResidentSnapshot* snapshot, std::vector<size_t>* sizes = nullptr) {
  keys->clear();
  return db->ReadResident(
      prefix, max_batch,
      [&](std::span<const ResidentKey> batch) {
        if (sizes != nullptr) sizes->push_back(batch.size());
        for (const ResidentKey& k : batch) keys->insert({k.key, k.tier});
        return true;
      },
      snapshot);
}

std::string Key(int i) { return "key-" + std::to_string(i); }

uint64_t NewestRemoval(DB* db) {
  RemovalBatch batch;
  EXPECT_TRUE(db->ReadRemovals(0, 0, &batch).ok());
  return batch.last_sequence;
}

class AttachResidentTest : public ::testing::Test {
 protected:
  void Open(uint64_t ssd_bytes) {
    Options o = test::AttachOwnerOptions(socket_);
    o.ssd_capacity_bytes = ssd_bytes;
    Status s = DB::Open(o, dir_.path(), &owner_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = DB::Attach(test::AttachClientOptions(), socket_, &client_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    if (client_ != nullptr) client_->Close();
    if (owner_ != nullptr) {
      EXPECT_TRUE(owner_->Close().ok());
    }
  }

  test::TempDir dir_;
  const std::string socket_ = dir_.Sub("kv.sock");
  std::unique_ptr<DB> owner_, client_;
};

// The client reads exactly the owner's resident set, both tiers, in batches of at most
// max_batch, with the owner's epoch and the removal sequence of the feed it reads; a
// prefix narrows it as the owner's own call does.
TEST_F(AttachResidentTest, StreamsTheOwnersSetInBoundedBatches) {
  ASSERT_NO_FATAL_FAILURE(Open(64ull << 20));
  for (int i = 0; i < 300; i++) ASSERT_TRUE(owner_->Put(WriteOptions(), Key(i), "v").ok());
  ASSERT_TRUE(owner_->Flush().ok());  // on SSD as well
  for (int i = 300; i < 1000; i++) ASSERT_TRUE(owner_->Put(WriteOptions(), Key(i), "v").ok());
  NewestRemoval(client_.get());  // the feed records from here on
  for (int i = 0; i < 10; i++) ASSERT_TRUE(owner_->Delete(WriteOptions(), Key(i * 7)).ok());

  KeySet mine, theirs;
  ResidentSnapshot got, want;
  std::vector<size_t> sizes;
  Status s = ReadAll(client_.get(), "", 64, &mine, &got, &sizes);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(ReadAll(owner_.get(), "", 1000, &theirs, &want).ok());
  EXPECT_EQ(mine, theirs);
  EXPECT_EQ(mine.size(), 990u + 290u);  // 290 of them on SSD too
  EXPECT_EQ(got.keys, mine.size());
  EXPECT_GE(sizes.size(), (mine.size() + 63) / 64);
  for (size_t n : sizes) EXPECT_LE(n, 64u);
  std::string epoch;
  ASSERT_TRUE(owner_->GetProperty("kvengine.epoch", &epoch));
  EXPECT_EQ(got.epoch, std::stoull(epoch));
  EXPECT_EQ(got.removal_sequence, NewestRemoval(client_.get()));
  EXPECT_GE(got.removal_sequence, 10u);

  ASSERT_TRUE(ReadAll(client_.get(), "key-99", 1000, &mine, &got).ok());
  EXPECT_EQ(mine, (KeySet{{"key-99", kLocatedMemory},
                          {"key-99", kLocatedSsd},
                          {"key-990", kLocatedMemory},
                          {"key-991", kLocatedMemory},
                          {"key-992", kLocatedMemory},
                          {"key-993", kLocatedMemory},
                          {"key-994", kLocatedMemory},
                          {"key-995", kLocatedMemory},
                          {"key-996", kLocatedMemory},
                          {"key-997", kLocatedMemory},
                          {"key-998", kLocatedMemory},
                          {"key-999", kLocatedMemory}}));
  // The owner's limits are the owner's errors.
  EXPECT_TRUE(ReadAll(client_.get(), "", 0, &mine, &got).IsInvalidArgument());
  EXPECT_TRUE(ReadAll(client_.get(), "", 1u << 20, &mine, &got).IsInvalidArgument());
  EXPECT_TRUE(client_->ReadResident("", 8, nullptr, &got).IsInvalidArgument());
  // The connection is still in step after each of them.
  ASSERT_TRUE(ReadAll(client_.get(), "", 512, &mine, &got).ok());
  EXPECT_EQ(mine, theirs);
}

// A batch of many long keys comes in several frames, none larger than
// kResidentFrameBytes of keys, each a batch of its own for the client.
TEST_F(AttachResidentTest, LongKeysComeInFramesOfBoundedBytes) {
  ASSERT_NO_FATAL_FAILURE(Open(0));
  const int n = 2500;  // 2500 keys of ~4000 bytes: ~10 MB in one batch of the owner
  for (int i = 0; i < n; i++) {
    ASSERT_TRUE(owner_->Put(WriteOptions(), Key(i) + std::string(3990, 'x'), "v").ok());
  }
  KeySet mine;
  ResidentSnapshot got;
  std::vector<size_t> sizes;
  ASSERT_TRUE(ReadAll(client_.get(), "", static_cast<size_t>(n), &mine, &got, &sizes).ok());
  EXPECT_EQ(mine.size(), static_cast<size_t>(n));
  EXPECT_GE(sizes.size(), 3u);
  for (size_t k : sizes) EXPECT_LE(k * 4000, wire::kResidentFrameBytes);
}

// A ResidentFn that returns false ends the owner's walk: no further batch comes, and
// the connection serves the next call in step.
TEST_F(AttachResidentTest, AnEarlyStopStopsTheOwner) {
  ASSERT_NO_FATAL_FAILURE(Open(0));
  for (int i = 0; i < 500; i++) ASSERT_TRUE(owner_->Put(WriteOptions(), Key(i), "v").ok());
  for (int round = 0; round < 3; round++) {
    int calls = 0;
    ResidentSnapshot got;
    Status s = client_->ReadResident(
        "", 10,
        [&](std::span<const ResidentKey> batch) {
          calls++;
          EXPECT_EQ(batch.size(), 10u);
          return false;
        },
        &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(got.keys, 10u);
    std::string v;
    ASSERT_TRUE(client_->Get(ReadOptions(), Key(round), &v).ok());
  }
  KeySet mine;
  ResidentSnapshot got;
  ASSERT_TRUE(ReadAll(client_.get(), "", 100, &mine, &got).ok());
  EXPECT_EQ(mine.size(), 500u);
}

// Frame by frame: the owner waits for each NEXT, ends at STOP with the snapshot's END,
// answers a NEXT outside a stream InvalidArgument, and drops a client that does not
// ask for the next batch within peer_timeout_ms (still serving the others).
TEST_F(AttachResidentTest, TheOwnerAnswersOnlyWhatIsAskedFor) {
  ASSERT_NO_FATAL_FAILURE(Open(0));
  for (int i = 0; i < 50; i++) ASSERT_TRUE(owner_->Put(WriteOptions(), Key(i), "v").ok());
  test::RawClient raw;
  ASSERT_TRUE(raw.Connect(socket_).ok());
  auto answer = [&](const std::string& meta, Status* status, bool* end,
                    std::vector<ResidentKey>* keys, ResidentSnapshot* snapshot) {
    std::string out;
    Status s = raw.Call(wire::kReadResident, meta, &out);
    if (!s.ok()) return s;
    std::string_view in(out);
    if (!wire::GetBatchStatus(&in, status)) return Status::Corruption("status");
    if (status->ok() && !wire::GetResidentAnswer(&in, end, keys, snapshot)) {
      return Status::Corruption("answer");
    }
    return Status::OK();
  };
  std::string next, stop, start;
  wire::PutResidentStep(&next, wire::kResidentNext);
  wire::PutResidentStep(&stop, wire::kResidentStop);
  wire::PutResidentStart(&start, "", 20);
  Status status;
  bool end = false;
  std::vector<ResidentKey> keys;
  ResidentSnapshot snapshot;
  ASSERT_TRUE(answer(next, &status, &end, &keys, &snapshot).ok());
  EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
  ASSERT_TRUE(answer(start, &status, &end, &keys, &snapshot).ok());
  ASSERT_TRUE(status.ok() && !end);
  EXPECT_EQ(keys.size(), 20u);
  ASSERT_TRUE(answer(next, &status, &end, &keys, &snapshot).ok());
  ASSERT_TRUE(status.ok() && !end);
  ASSERT_TRUE(answer(stop, &status, &end, &keys, &snapshot).ok());
  ASSERT_TRUE(status.ok() && end);
  EXPECT_EQ(snapshot.keys, 40u);
  // Asked once, then silent past the owner's peer_timeout_ms (2 s by default).
  ASSERT_TRUE(answer(start, &status, &end, &keys, &snapshot).ok());
  ASSERT_TRUE(status.ok() && !end);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_FALSE(answer(next, &status, &end, &keys, &snapshot).ok());
  KeySet mine;
  ASSERT_TRUE(ReadAll(client_.get(), "", 7, &mine, &snapshot).ok());
  EXPECT_EQ(mine.size(), 50u);
}

// In-process: a namespace's handle lists its own keys, as its user names them, with the
// removal sequence of its own feed; the default namespace's lists none of a namespace's.
TEST(NamespaceResidentTest, AHandleListsItsOwnKeysOnly) {
  test::TempDir dir;
  Options o = test::AttachOwnerOptions("");
  o.local_listen.clear();
  std::unique_ptr<DB> db, a, b;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  ASSERT_TRUE(db->CreateNamespace("a", NamespaceOptions(), &a).ok());
  ASSERT_TRUE(db->CreateNamespace("b", NamespaceOptions(), &b).ok());
  for (DB* h : {db.get(), a.get(), b.get()}) {
    for (const char* k : {"k1", "k2", "x1"}) ASSERT_TRUE(h->Put(WriteOptions(), k, "v").ok());
  }
  ASSERT_TRUE(b->Put(WriteOptions(), "k3", "v").ok());
  NewestRemoval(db.get());
  ASSERT_TRUE(b->Delete(WriteOptions(), "k1").ok());
  ASSERT_TRUE(db->Delete(WriteOptions(), "x1").ok());
  KeySet keys;
  ResidentSnapshot snapshot;
  ASSERT_TRUE(ReadAll(b.get(), "k", 1, &keys, &snapshot).ok());
  EXPECT_EQ(keys, (KeySet{{"k2", kLocatedMemory}, {"k3", kLocatedMemory}}));
  EXPECT_EQ(snapshot.keys, 2u);
  EXPECT_EQ(snapshot.removal_sequence, 1u);  // b's own numbering: its one removal
  EXPECT_EQ(snapshot.removal_sequence, NewestRemoval(b.get()));
  ASSERT_TRUE(ReadAll(a.get(), "", 100, &keys, &snapshot).ok());
  EXPECT_EQ(keys, (KeySet{{"k1", kLocatedMemory}, {"k2", kLocatedMemory}, {"x1", kLocatedMemory}}));
  EXPECT_EQ(snapshot.removal_sequence, 0u);
  ASSERT_TRUE(ReadAll(db.get(), "", 100, &keys, &snapshot).ok());
  EXPECT_EQ(keys, (KeySet{{"k1", kLocatedMemory}, {"k2", kLocatedMemory}}));
  ASSERT_TRUE(db->DropNamespace("a", nullptr).ok());
  EXPECT_TRUE(ReadAll(a.get(), "", 100, &keys, &snapshot).IsAborted());
  ASSERT_TRUE(db->Close().ok());
}

// ------------------------------------------------------------------ a tenant of another uid

// uid 1001 may use tenantA only: its handle lists tenantA's keys without their prefix,
// never tenantB's or the default namespace's, with tenantA's removal sequence; its
// default handle is refused.  Writes "ok" or the failure to `out`.
int TenantMain(const std::string& socket, const std::string& epoch, const std::string& out) {
  std::string failure;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok && failure.empty()) failure = what;
  };
  if (setgroups(0, nullptr) != 0 || setgid(1001) != 0 || setuid(1001) != 0) return 3;
  std::unique_ptr<DB> db, h;
  Status s = DB::Attach(test::AttachClientOptions(), socket, &db);
  if (!s.ok()) return 2;
  s = db->OpenNamespace("tenantA", &h);
  expect(s.ok(), "OpenNamespace: " + s.ToString());
  if (h != nullptr) {
    KeySet keys;
    ResidentSnapshot snapshot;
    s = ReadAll(h.get(), "", 2, &keys, &snapshot);
    expect(s.ok(), "ReadResident of tenantA: " + s.ToString());
    expect(keys == KeySet{{"a1", kLocatedMemory}, {"shared", kLocatedMemory}},
           "tenantA listed " + std::to_string(keys.size()) + " keys, not its 2");
    RemovalBatch feed;
    s = h->ReadRemovals(0, 10, &feed);
    expect(
        s.ok() && snapshot.removal_sequence == feed.last_sequence && snapshot.removal_sequence == 1,
        "tenantA's removal sequence " + std::to_string(snapshot.removal_sequence) +
            ", its feed's " + std::to_string(feed.last_sequence));
    std::string told;
    expect(h->GetProperty("kvengine.epoch", &told) && told == epoch,
           "kvengine.epoch of the tenant's handle: " + told + ", the owner's " + epoch);
    s = ReadAll(h.get(), "sh", 2, &keys, &snapshot);
    expect(s.ok() && keys == KeySet{{"shared", kLocatedMemory}}, "a prefix in tenantA");
  }
  KeySet keys;
  ResidentSnapshot snapshot;
  s = ReadAll(db.get(), "", 10, &keys, &snapshot);
  expect(s.IsPermissionDenied() && keys.empty(),
         "ReadResident of the default namespace: " + s.ToString());
  std::ofstream(out) << (failure.empty() ? "ok" : failure) << "\n";
  return failure.empty() ? 0 : 1;
}

TEST(AttachResidentTenantTest, ATenantListsOnlyItsNamespaceAsItNamesIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  test::TempDir dir;
  std::filesystem::create_directories(dir.Sub("db"));
  chmod(dir.path().c_str(), 0755);
  chmod(dir.Sub("db").c_str(), 0755);
  const std::string socket = dir.Sub("db") + "/kv.sock";
  Options o = test::AttachOwnerOptions(socket);
  o.local_allowed_uids = "uid:1001=tenantA";
  o.local_listen_mode = "0666";
  std::unique_ptr<DB> db, a, b;
  ASSERT_TRUE(DB::Open(o, dir.Sub("db"), &db).ok());
  ASSERT_TRUE(db->CreateNamespace("tenantA", NamespaceOptions(), &a).ok());
  ASSERT_TRUE(db->CreateNamespace("tenantB", NamespaceOptions(), &b).ok());
  for (const char* k : {"a1", "shared", "gone"}) ASSERT_TRUE(a->Put(WriteOptions(), k, "v").ok());
  for (const char* k : {"b1", "shared"}) ASSERT_TRUE(b->Put(WriteOptions(), k, "v").ok());
  ASSERT_TRUE(db->Put(WriteOptions(), "d1", "v").ok());
  std::string epoch;
  ASSERT_TRUE(db->GetProperty("kvengine.epoch", &epoch));
  NewestRemoval(db.get());  // the feed records from here on
  ASSERT_TRUE(b->Delete(WriteOptions(), "b1").ok());
  ASSERT_TRUE(a->Delete(WriteOptions(), "gone").ok());
  const std::string report = dir.Sub("report");
  std::ofstream(report).close();
  chmod(report.c_str(), 0666);
  EXPECT_EQ(test::WaitExit(test::SpawnSelf({"--tenant", socket, epoch, report})), 0);
  std::string line;
  std::getline(std::ifstream(report), line);
  EXPECT_EQ(line, "ok");
  a.reset();
  b.reset();
  EXPECT_TRUE(db->Close().ok());
}

}  // namespace
}  // namespace kvengine

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--tenant") {
    return kvengine::TenantMain(argv[2], argv[3], argv[4]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
