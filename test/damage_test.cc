// Damage to a closed DB's files never brings back a deleted key, nor an older version of
// an overwritten one: a damaged DB may lose values (or fail to open), never serve what
// the application replaced or deleted.  Each case damages a copy of one DB built with
// overwrites and deletes over several syncs, opens it, checks every key against an
// oracle, and checks again after a reopen (the drops must be durable).
//
// RandomDamage runs KV_DAMAGE_ROUNDS rounds (default 40) of 1-3 random damages: set
// KV_DAMAGE_ROUNDS=2000 for the long mode (docs/reliability.md).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"
#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

// What was written: every version of every key, in order, and which keys are deleted.
struct Oracle {
  std::map<std::string, std::vector<std::string>> versions;
  std::set<std::string> deleted;
};

// What reading every key found.
struct Verdict {
  int served = 0, absent = 0, errors = 0;
  int resurrected = 0, older = 0, wrong = 0;
  std::string first_problem;
};

Verdict CheckAgainst(DB* db, const Oracle& oracle) {
  Verdict v;
  for (const auto& [key, versions] : oracle.versions) {
    std::string got;
    Status s = db->Get(ReadOptions(), key, &got);
    if (s.IsNotFound()) {
      v.absent++;
      continue;
    }
    if (!s.ok()) {  // a damaged value fails its read: not served
      v.errors++;
      continue;
    }
    std::string problem;
    if (oracle.deleted.count(key) != 0) {
      v.resurrected++;
      problem = key + ": deleted, read back";
    } else if (got == versions.back()) {
      v.served++;
    } else if (std::find(versions.begin(), versions.end(), got) != versions.end()) {
      v.older++;
      problem = key + ": an older version served";
    } else {
      v.wrong++;
      problem = key + ": bytes never written under it";
    }
    if (!problem.empty() && v.first_problem.empty()) v.first_problem = problem;
  }
  return v;
}

class DamageTest : public ::testing::Test {
 protected:
  static constexpr int kKeys = 24;

  DamageTest() {
    options_.apply_environment = false;
    options_.memory_capacity_bytes = 1 << 20;
    options_.memory_slab_size = 64 << 10;
    options_.bucket_keys_limit = 4;
    options_.bucket_size_limit = 1 << 20;
    options_.gc_interval_ms = 0;
    options_.promote_on_read = false;
    options_.offload_policy = OffloadPolicy::kWriteThrough;
    options_.tombstone_sync_interval_ms = 0;  // synced by each Flush only
  }

  std::string Key(int i) { return "k." + std::to_string(i); }
  void Put(DB* db, const std::string& key) {
    const uint64_t seed = seed_++;
    const std::string value = test::MakeValue(seed, 4096 + (seed * 7919) % (40 << 10));
    ASSERT_TRUE(db->Put(WriteOptions(), key, value).ok());
    oracle_.versions[key].push_back(value);
    oracle_.deleted.erase(key);
  }
  void Delete(DB* db, const std::string& key) {
    ASSERT_TRUE(db->Delete(WriteOptions(), key).ok());
    oracle_.deleted.insert(key);
  }

  // The DB every case damages a copy of: all keys put, then four rounds of overwrites,
  // deletes and puts of deleted keys, each ended by a Flush (a guarded sync of the log);
  // the log after each round is kept (older copies).
  void SetUp() override {
    std::unique_ptr<DB> db;
    ASSERT_TRUE(DB::Open(options_, pristine_.path(), &db).ok());
    for (int i = 0; i < kKeys; i++) Put(db.get(), Key(i));
    ASSERT_TRUE(db->Flush().ok());
    older_logs_.push_back(ReadFile(pristine_.Sub("TOMBSTONES")));
    std::mt19937_64 rng(7);
    for (int round = 0; round < 4; round++) {
      for (int n = 0; n < 5; n++) Put(db.get(), Key(rng() % kKeys));
      for (int n = 0; n < 3; n++) {
        const std::string key = Key(rng() % kKeys);
        if (oracle_.deleted.count(key) == 0) Delete(db.get(), key);
      }
      Put(db.get(), Key(rng() % kKeys));
      ASSERT_TRUE(db->Flush().ok());
      older_logs_.push_back(ReadFile(pristine_.Sub("TOMBSTONES")));
    }
    ASSERT_TRUE(db->Close().ok());
    ASSERT_GE(oracle_.deleted.size(), 4u);
    older_logs_.pop_back();  // the last is the log itself (Close adds nothing)
  }

  // A fresh copy of the pristine DB in work_ (the map checkpoint removed unless `keep`).
  void Restore(bool keep_checkpoint = true) {
    fs::remove_all(work_.path());
    fs::copy(pristine_.path(), work_.path(), fs::copy_options::recursive);
    fs::remove(work_.Sub("LOCK"));
    if (!keep_checkpoint) fs::remove(work_.Sub("SSDMAP"));
  }

  // Opens the damaged copy and checks it; then reopens and checks again.  Open may fail.
  // Returns the first open's verdict.
  Verdict OpenAndCheck(const std::string& what) {
    SCOPED_TRACE(what);
    Verdict first;
    for (int open = 0; open < 2; open++) {
      std::unique_ptr<DB> db;
      Status s = DB::Open(options_, work_.path(), &db);
      if (!s.ok()) {
        EXPECT_EQ(open, 0) << "opened once, then not: " << s.ToString();
        opens_failed_++;
        return first;
      }
      Verdict v = CheckAgainst(db.get(), oracle_);
      EXPECT_EQ(v.resurrected + v.older + v.wrong, 0)
          << what << " (open " << open + 1 << "): " << v.resurrected << " resurrected, " << v.older
          << " older, " << v.wrong << " wrong; " << v.first_problem;
      if (open == 0) first = v;
      lost_logs_ += test::StatOf(db.get(), "ssd.lost_tombstone_logs");
      EXPECT_TRUE(db->Close().ok());
    }
    return first;
  }

  // Record boundaries of the (format 2) tombstone log: header end, each record's end.
  static std::vector<size_t> RecordEnds(const std::string& log) {
    std::vector<size_t> ends = {24};
    size_t pos = 24;
    while (pos + 4 <= log.size()) {
      pos += 4 + DecodeFixed32(log.data() + pos) + 8;
      if (pos > log.size()) break;
      ends.push_back(pos);
    }
    return ends;
  }
  std::vector<std::string> BucketFiles() {
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(work_.path())) {
      const std::string name = e.path().filename();
      if (name.starts_with("bucket-") && name.ends_with(".kvb")) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  Options options_;
  test::TempDir pristine_, work_;
  Oracle oracle_;
  uint64_t seed_ = 1;
  std::vector<std::string> older_logs_;
  int opens_failed_ = 0;
  uint64_t lost_logs_ = 0;
};

TEST_F(DamageTest, UndamagedCopyServesEveryLatestValue) {
  Restore();
  Verdict v = OpenAndCheck("no damage");
  EXPECT_EQ(v.served, kKeys - static_cast<int>(oracle_.deleted.size()));
  EXPECT_EQ(v.absent, static_cast<int>(oracle_.deleted.size()));
  EXPECT_EQ(lost_logs_, 0u);
}

TEST_F(DamageTest, LogTruncatedAtEveryRecordBoundaryAndBetween) {
  Restore();
  const std::string log = ReadFile(work_.Sub("TOMBSTONES"));
  std::vector<size_t> cuts = RecordEnds(log);
  ASSERT_EQ(cuts.back(), log.size());
  ASSERT_GE(cuts.size(), 6u);
  cuts.pop_back();  // the whole log: no damage
  for (size_t i = 0, n = cuts.size(); i < n; i += 3) cuts.push_back(cuts[i] + 5);  // mid-record
  cuts.push_back(0);
  cuts.push_back(10);
  for (size_t cut : cuts) {
    Restore();
    fs::resize_file(work_.Sub("TOMBSTONES"), cut);
    Verdict v = OpenAndCheck("log truncated to " + std::to_string(cut));
    EXPECT_EQ(v.served + v.absent + v.errors, kKeys);
  }
  EXPECT_EQ(opens_failed_, 0);
  EXPECT_EQ(lost_logs_, cuts.size());  // every one was found and counted
}

TEST_F(DamageTest, BitFlippedInEveryRecord) {
  Restore();
  const std::string log = ReadFile(work_.Sub("TOMBSTONES"));
  const std::vector<size_t> ends = RecordEnds(log);
  std::vector<size_t> offsets = {17};             // the generation in the header
  for (size_t i = 0; i + 1 < ends.size(); i++) {  // the length, the payload, the checksum
    offsets.push_back(i % 3 == 0   ? ends[i] + 1
                      : i % 3 == 1 ? (ends[i] + ends[i + 1]) / 2
                                   : ends[i + 1] - 1);
  }
  for (size_t off : offsets) {
    Restore();
    std::string d = log;
    d[off] ^= 0x10;
    WriteFile(work_.Sub("TOMBSTONES"), d);
    OpenAndCheck("bit flipped at " + std::to_string(off));
  }
  EXPECT_EQ(opens_failed_, 0);
  EXPECT_EQ(lost_logs_, offsets.size());
}

TEST_F(DamageTest, LogOrGuardRemovedOrDamaged) {
  const std::map<std::string, std::function<void()>> damages = {
      {"log removed", [&] { fs::remove(work_.Sub("TOMBSTONES")); }},
      {"log and guard removed",
       [&] {
         fs::remove(work_.Sub("TOMBSTONES"));
         fs::remove(work_.Sub("TOMBSTONES.guard"));
       }},
      {"guard removed", [&] { fs::remove(work_.Sub("TOMBSTONES.guard")); }},
      {"guard's last record flipped",
       [&] {
         std::string g = ReadFile(work_.Sub("TOMBSTONES.guard"));
         g[g.size() - 30] ^= 1;
         WriteFile(work_.Sub("TOMBSTONES.guard"), g);
       }},
      {"guard truncated to its header",
       [&] { fs::resize_file(work_.Sub("TOMBSTONES.guard"), 16); }},
      {"log emptied", [&] { fs::resize_file(work_.Sub("TOMBSTONES"), 0); }},
  };
  for (const auto& [what, damage] : damages) {
    Restore();
    damage();
    Verdict v = OpenAndCheck(what);
    EXPECT_GT(v.absent, static_cast<int>(oracle_.deleted.size())) << what << ": nothing dropped";
  }
  EXPECT_EQ(opens_failed_, 0);
  EXPECT_EQ(lost_logs_, damages.size());
}

TEST_F(DamageTest, LogReplacedByAnOlderCopy) {
  ASSERT_GE(older_logs_.size(), 3u);
  for (size_t i = 0; i < older_logs_.size(); i++) {
    Restore();
    WriteFile(work_.Sub("TOMBSTONES"), older_logs_[i]);
    OpenAndCheck("log replaced by the copy after round " + std::to_string(i));
  }
  EXPECT_EQ(opens_failed_, 0);
  EXPECT_EQ(lost_logs_, older_logs_.size());
}

TEST_F(DamageTest, SwappedBucketFiles) {
  Restore();
  const std::vector<std::string> buckets = BucketFiles();
  ASSERT_GE(buckets.size(), 6u);
  for (bool checkpoint : {true, false}) {
    for (size_t i = 0; i + 1 < buckets.size(); i += 2) {
      Restore(checkpoint);
      const std::string a = work_.Sub(buckets[i]),
                        b = work_.Sub(buckets.back() == buckets[i] ? buckets[0] : buckets.back());
      fs::rename(a, a + ".x");
      fs::rename(b, a);
      fs::rename(a + ".x", b);
      OpenAndCheck("swapped " + buckets[i] + " and the newest bucket" +
                   (checkpoint ? "" : ", no checkpoint"));
    }
  }
  EXPECT_EQ(opens_failed_, 0);
}

// The index entry of a key's newest version damaged in its size field: once as a flip
// (the index checksum fails, the bucket is quarantined), once with the index checksum
// made good again (the entry is believed; its value fails its checksum).  The key's
// older versions, in older buckets, must not come back either way.
TEST_F(DamageTest, DamagedNewestEntryServesNoOlderVersion) {
  std::vector<std::string> overwritten;
  for (const auto& [key, versions] : oracle_.versions) {
    if (versions.size() > 1 && oracle_.deleted.count(key) == 0) overwritten.push_back(key);
  }
  ASSERT_GE(overwritten.size(), 2u);
  int damaged = 0;
  for (const std::string& key : overwritten) {
    for (bool fix_checksum : {false, true}) {
      Restore(/*keep_checkpoint=*/false);
      // The newest bucket whose index holds the key.
      std::vector<std::string> buckets = BucketFiles();
      for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
        std::string file = ReadFile(work_.Sub(*it));
        const char* footer = file.data() + file.size() - 64;
        const uint64_t index = DecodeFixed64(footer), index_size = DecodeFixed64(footer + 8);
        const std::string needle = std::string(1, static_cast<char>(key.size())) + key;
        const size_t at = file.find(needle, index);
        if (at == std::string::npos || at >= index + index_size) continue;
        size_t p = at + needle.size();
        while (static_cast<unsigned char>(file[p]) & 0x80) p++;  // the offset varint
        file[p + 1] ^= 0x01;                                     // the size varint's first byte
        if (fix_checksum) {
          EncodeFixed64(file.data() + index + index_size - 8,
                        Hash64(file.data() + index, index_size - 8));
        }
        WriteFile(work_.Sub(*it), file);
        damaged++;
        break;
      }
      OpenAndCheck("size of " + key + "'s newest entry damaged" +
                   (fix_checksum ? ", index checksum recomputed" : ""));
    }
  }
  EXPECT_EQ(damaged, static_cast<int>(2 * overwritten.size()));
  EXPECT_EQ(opens_failed_, 0);
}

// 1-3 random damages a round to a copy of the DB's files: bit flips, truncation, zeroed
// blocks, removed files, swapped buckets, an older copy of the log.
TEST_F(DamageTest, RandomDamage) {
  const char* env = std::getenv("KV_DAMAGE_ROUNDS");
  const int rounds = env != nullptr ? std::atoi(env) : 40;
  std::mt19937_64 rng(env != nullptr ? std::random_device()() : 30);
  int served = 0;
  for (int round = 0; round < rounds; round++) {
    Restore(rng() % 2 == 0);
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(work_.path())) {
      if (e.is_regular_file()) files.push_back(e.path().filename());
    }
    std::sort(files.begin(), files.end());
    std::string what;
    const int damages = 1 + rng() % 3;
    for (int d = 0; d < damages; d++) {
      // Half the damage on the log and its guard: the files that decide what is dead.
      const std::string name = rng() % 2 == 0 ? (rng() % 3 == 0 ? "TOMBSTONES.guard" : "TOMBSTONES")
                                              : files[rng() % files.size()];
      const std::string path = work_.Sub(name);
      if (!fs::exists(path)) continue;
      std::string data = ReadFile(path);
      switch (rng() % 6) {
        case 0:
          if (!data.empty()) data[rng() % data.size()] ^= static_cast<char>(1 << (rng() % 8));
          WriteFile(path, data);
          what += "flip " + name + "; ";
          break;
        case 1:
          data.resize(data.empty() ? 0 : rng() % data.size());
          WriteFile(path, data);
          what += "truncate " + name + " to " + std::to_string(data.size()) + "; ";
          break;
        case 2: {
          const size_t at = data.empty() ? 0 : (rng() % data.size()) & ~size_t{511};
          for (size_t i = at; i < std::min(data.size(), at + 4096); i++) data[i] = 0;
          WriteFile(path, data);
          what += "zero a block of " + name + "; ";
          break;
        }
        case 3:
          fs::remove(path);
          what += "remove " + name + "; ";
          break;
        case 4: {
          std::vector<std::string> buckets = BucketFiles();
          if (buckets.size() < 2) break;
          const std::string a = work_.Sub(buckets[rng() % buckets.size()]);
          const std::string b = work_.Sub(buckets[rng() % buckets.size()]);
          if (a == b) break;
          fs::rename(a, a + ".x");
          fs::rename(b, a);
          fs::rename(a + ".x", b);
          what += "swap two buckets; ";
          break;
        }
        case 5:
          WriteFile(work_.Sub("TOMBSTONES"), older_logs_[rng() % older_logs_.size()]);
          what += "older log; ";
          break;
      }
    }
    served += OpenAndCheck("round " + std::to_string(round) + ": " + what).served;
    if (HasFailure()) break;
  }
  EXPECT_GT(served, 0) << "every round lost every value: the test checks nothing";
  std::printf("%d rounds, %d opens failed, %llu lost logs found, %d values served\n", rounds,
              opens_failed_, static_cast<unsigned long long>(lost_logs_), served);
}

}  // namespace
}  // namespace kvengine
