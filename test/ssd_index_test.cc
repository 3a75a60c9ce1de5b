// SsdIndex, the SSD tier's compact object map: agreement with a reference map under
// random puts, replaces and erases, RAM per key, and memory given back by deletes.
#include "db/ssd_index.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>

#include "gtest/gtest.h"

namespace kvengine {
namespace {

SsdLocation LocationFor(uint64_t i, uint64_t version) {
  return SsdLocation{i % 100000 + 1, (i % 5000) * 4096 + 4096, i * 7 % 1000000, version,
                     i * 0x9e3779b97f4a7c15ull};
}

TEST(SsdIndexTest, AgreesWithAReferenceMap) {
  SsdIndex index;
  std::unordered_map<std::string, SsdLocation> reference;
  std::mt19937_64 rng(7);
  for (uint64_t op = 0; op < 300000; op++) {
    const uint64_t k = rng() % 50000;
    const std::string key = "key" + std::to_string(k);
    const KeyFingerprint fp = KeyFingerprint::Of(key);
    if (rng() % 3 == 0) {
      EXPECT_EQ(index.Erase(fp), reference.erase(key) == 1);
    } else {
      const SsdLocation loc = LocationFor(k, op);
      EXPECT_EQ(index.Put(fp, loc), reference.count(key) == 0);
      reference[key] = loc;
    }
  }
  ASSERT_EQ(index.size(), reference.size());
  for (uint64_t k = 0; k < 50000; k++) {
    const std::string key = "key" + std::to_string(k);
    SsdLocation got;
    auto it = reference.find(key);
    ASSERT_EQ(index.Find(KeyFingerprint::Of(key), &got), it != reference.end()) << key;
    if (it == reference.end()) continue;
    EXPECT_EQ(got.bucket, it->second.bucket);
    EXPECT_EQ(got.offset, it->second.offset);
    EXPECT_EQ(got.size, it->second.size);
    EXPECT_EQ(got.version, it->second.version);
    EXPECT_EQ(got.checksum, it->second.checksum & SsdIndex::kChecksumMask);
  }
  uint64_t seen = 0;
  index.ForEach([&](const KeyFingerprint&, const SsdLocation&) { seen++; });
  EXPECT_EQ(seen, reference.size());
  EXPECT_EQ(index.EraseIf([](const SsdLocation& l) { return l.bucket % 2 == 0; }),
            static_cast<uint64_t>(std::count_if(reference.begin(), reference.end(),
                                                [](auto& e) { return e.second.bucket % 2 == 0; })));
}

TEST(SsdIndexTest, AtMost48BytesPerKeyAndDeletesGiveMemoryBack) {
  SsdIndex index;
  constexpr uint64_t kKeys = 200000;
  uint64_t worst = 0;
  for (uint64_t i = 0; i < kKeys; i++) {
    // A long key costs what a short one does: only its fingerprint is kept.
    index.Put(KeyFingerprint::Of(std::string(200, 'k') + std::to_string(i)), LocationFor(i, i));
    if (i >= 10000 && i % 1000 == 0) worst = std::max(worst, index.MemoryBytes() / index.size());
  }
  EXPECT_LE(worst, 48u);
  const uint64_t full = index.MemoryBytes();
  for (uint64_t i = 0; i < kKeys - 1000; i++) {
    ASSERT_TRUE(index.Erase(KeyFingerprint::Of(std::string(200, 'k') + std::to_string(i))));
  }
  EXPECT_LE(index.MemoryBytes(), full / 50);
  for (uint64_t i = kKeys - 1000; i < kKeys; i++) {
    SsdLocation loc;
    ASSERT_TRUE(index.Find(KeyFingerprint::Of(std::string(200, 'k') + std::to_string(i)), &loc));
    EXPECT_EQ(loc.version, i);
  }
}

TEST(SsdIndexTest, LocationsThatDoNotFitAreRefused) {
  // Offsets count 512-byte units (bucket format v3 packs small values on them).
  EXPECT_TRUE(SsdIndex::Fits(SsdLocation{UINT32_MAX, 512ull * UINT32_MAX, UINT32_MAX, 1, 1}));
  EXPECT_TRUE(SsdIndex::Fits(SsdLocation{1, 4096 + 512, 1, 1, 1}));
  EXPECT_FALSE(SsdIndex::Fits(SsdLocation{1, 512ull * UINT32_MAX + 512, 1, 1, 1}));
  EXPECT_FALSE(SsdIndex::Fits(SsdLocation{1, 4096, uint64_t{1} << 32, 1, 1}));
  EXPECT_FALSE(SsdIndex::Fits(SsdLocation{uint64_t{1} << 32, 4096, 1, 1, 1}));
  EXPECT_FALSE(SsdIndex::Fits(SsdLocation{1, 4097, 1, 1, 1}));
  EXPECT_FALSE(SsdIndex::Fits(SsdLocation{1, 4096 + 256, 1, 1, 1}));
}

// Shard images as MapCheckpoint stores them, changed the way a damaged (or made-up) file
// that passed its checksums could hold them, and adopted by a fresh index.
class AdoptShardTest : public ::testing::Test {
 protected:
  static constexpr size_t kShard = 5;
  AdoptShardTest() {
    for (uint64_t i = 0; i < 2000; i++) {
      index_.Put(KeyFingerprint::Of("key" + std::to_string(i)), LocationFor(i, i));
    }
    const SsdIndex::ShardImage image = index_.GetShardImage(kShard);
    capacity_ = image.capacity;
    slots_.assign(image.slots, image.capacity * SsdIndex::kSlotBytes);
  }
  char* Slot(uint64_t pos) { return slots_.data() + pos * SsdIndex::kSlotBytes; }
  bool Empty(uint64_t pos) {
    return std::all_of(Slot(pos), Slot(pos) + 16, [](char c) { return c == 0; });
  }
  uint64_t Home(uint64_t pos) {
    uint64_t high;
    std::memcpy(&high, Slot(pos) + 8, 8);
    return static_cast<uint64_t>((static_cast<unsigned __int128>(high) * capacity_) >> 64);
  }
  // A full slot whose next one is empty (no wrap), or capacity_.
  uint64_t FullBeforeEmpty() {
    for (uint64_t pos = 0; pos + 1 < capacity_; pos++) {
      if (!Empty(pos) && Empty(pos + 1)) return pos;
    }
    return capacity_;
  }
  bool Adopt() {
    SsdIndex fresh;
    std::memcpy(fresh.ResetShard(kShard, capacity_), slots_.data(), slots_.size());
    const uint64_t count = index_.GetShardImage(kShard).count;
    const bool adopted = fresh.AdoptShard(kShard, count + duplicates_);
    if (adopted) {  // what was adopted must be usable: every key found where it lies
      fresh.RecountSize();
      fresh.ForEach([&](const KeyFingerprint& key, const SsdLocation& l) {
        SsdLocation got;
        EXPECT_TRUE(fresh.Find(key, &got));
        EXPECT_EQ(got.offset, l.offset);
      });
    }
    return adopted;
  }

  SsdIndex index_;
  uint64_t capacity_ = 0;
  std::string slots_;
  uint64_t duplicates_ = 0;
};

TEST_F(AdoptShardTest, TheShardAsWrittenIsAdopted) { EXPECT_TRUE(Adopt()); }

// Regression: AdoptShard checked only the key count and the shard of each key, so a key
// lying past its probe sequence was adopted and never found again (nor erased).
TEST_F(AdoptShardTest, AKeyMovedPastAnEmptySlotIsRefused) {
  const uint64_t pos = FullBeforeEmpty();
  ASSERT_LT(pos, capacity_);
  std::memcpy(Slot(pos + 1), Slot(pos), SsdIndex::kSlotBytes);
  std::memset(Slot(pos), 0, SsdIndex::kSlotBytes);
  EXPECT_FALSE(Adopt());
}

TEST_F(AdoptShardTest, AKeyHeldTwiceIsRefused) {
  const uint64_t pos = FullBeforeEmpty();
  ASSERT_LT(pos, capacity_);
  std::memcpy(Slot(pos + 1), Slot(pos), SsdIndex::kSlotBytes);
  duplicates_ = 1;
  EXPECT_FALSE(Adopt());
}

TEST_F(AdoptShardTest, KeysOutOfHomeOrderAreRefused) {
  uint64_t pos = 0;
  while (pos + 1 < capacity_ && (Empty(pos) || Empty(pos + 1) || Home(pos) == Home(pos + 1))) {
    pos++;
  }
  ASSERT_LT(pos + 1, capacity_);
  std::string first(Slot(pos), SsdIndex::kSlotBytes);
  std::memcpy(Slot(pos), Slot(pos + 1), SsdIndex::kSlotBytes);
  std::memcpy(Slot(pos + 1), first.data(), SsdIndex::kSlotBytes);
  EXPECT_FALSE(Adopt());
}

}  // namespace
}  // namespace kvengine
