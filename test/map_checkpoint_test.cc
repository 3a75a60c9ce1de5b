// MapCheckpoint's file on its own (db/map_checkpoint.*): what Write stores Read returns;
// bucket records whose namespace tallies count more than the bucket holds are refused,
// however large the tallies, and so are a table listing a bucket twice and a record
// whose counts contradict each other.  (ssd_tier_test's
// MapCheckpointTest covers the checkpoint as the SSD tier uses it;
// test/fuzz/map_checkpoint_fuzzer.cc the rest.)
#include "db/map_checkpoint.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

class MapCheckpointFileTest : public ::testing::Test {
 protected:
  MapCheckpointFileTest() {
    Env::Default()->CreateDirIfMissing(dir_.path());
    for (uint64_t i = 0; i < 20; i++) {
      map_.Put(KeyFingerprint::Of("key" + std::to_string(i)),
               SsdLocation{1 + i % 2, 4096 + i * 512, 100, 7 + i, 0x1234 + i});
    }
    contents_.next_bucket_id = 3;
    contents_.max_version = 26;
    for (uint64_t id = 1; id <= 2; id++) {
      MapCheckpoint::Bucket b;
      b.id = id;
      b.file_size = 16384;
      b.created_micros = 1700000000000000 + id;
      b.format_version = 2;
      b.keys = 11;
      b.live_keys = 10;
      b.total_bytes = 1100;
      b.deleted_bytes = 100;
      b.dead_extents = {{4096, 512, 100}};
      b.namespaces = {{0, 600, 6}, {42, 400, 4}};
      contents_.buckets.push_back(b);
    }
  }

  Status WriteThenRead(MapCheckpoint::Contents* contents, SsdIndex* map) {
    Status s = MapCheckpoint::Write(Env::Default(), dir_.path(), contents_, map_);
    if (!s.ok()) return s;
    return MapCheckpoint::Read(Env::Default(), dir_.path(), 2, contents, map);
  }

  // Write and Read with bucket 2's tallies replaced by `tallies`: Read must refuse it.
  void ExpectRefused(std::vector<MapCheckpoint::NamespaceTally> tallies) {
    contents_.buckets[1].namespaces = std::move(tallies);
    MapCheckpoint::Contents contents;
    SsdIndex map;
    const Status s = WriteThenRead(&contents, &map);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.ToString().find("bucket 2's namespace tally exceeds its counts"), std::string::npos)
        << s.ToString();
    EXPECT_EQ(map.size(), 0u);
  }

  test::TempDir dir_;
  MapCheckpoint::Contents contents_;
  SsdIndex map_;
};

TEST_F(MapCheckpointFileTest, ReadsBackWhatWasWritten) {
  MapCheckpoint::Contents contents;
  SsdIndex map;
  ASSERT_TRUE(WriteThenRead(&contents, &map).ok());
  EXPECT_EQ(contents.next_bucket_id, 3u);
  EXPECT_EQ(contents.max_version, 26u);
  ASSERT_EQ(contents.buckets.size(), 2u);
  const MapCheckpoint::Bucket& b = contents.buckets[1];
  EXPECT_EQ(b.id, 2u);
  ASSERT_EQ(b.dead_extents.size(), 1u);
  EXPECT_EQ(b.dead_extents[0].value_size, 100u);
  ASSERT_EQ(b.namespaces.size(), 2u);
  EXPECT_EQ(b.namespaces[1].id, 42u);
  EXPECT_EQ(b.namespaces[1].bytes, 400u);
  EXPECT_EQ(b.namespaces[1].items, 4u);
  ASSERT_EQ(map.size(), 20u);
  map_.ForEach([&](const KeyFingerprint& key, const SsdLocation& l) {
    SsdLocation got;
    ASSERT_TRUE(map.Find(key, &got));
    EXPECT_EQ(got.offset, l.offset);
    EXPECT_EQ(got.version, l.version);
  });
}

TEST_F(MapCheckpointFileTest, TalliesOverTheBucketsCountsAreRefused) {
  ExpectRefused({{0, 600, 6}, {42, 501, 4}});  // 1101 bytes of 1100
  ExpectRefused({{0, 600, 6}, {42, 400, 6}});  // 12 values of 11
}

// Regression: the tallies were summed in 64 bits, so two of 2^63 added up to 0 and a
// record counting 2^64 bytes in a bucket of 1100 was accepted.
TEST_F(MapCheckpointFileTest, TalliesWhoseSumWrapsPast2To64AreRefused) {
  const uint64_t half = uint64_t{1} << 63;
  ExpectRefused({{0, half, 5}, {42, half, 5}});
  ExpectRefused({{0, 500, half}, {42, 500, half + 1}});
}

// Regression: a table listing one bucket twice was accepted, and the SSD tier loaded it
// twice (its namespace tallies added to the namespaces' figures twice).
TEST_F(MapCheckpointFileTest, ABucketListedTwiceIsRefused) {
  contents_.buckets.push_back(contents_.buckets[0]);
  MapCheckpoint::Contents contents;
  SsdIndex map;
  const Status s = WriteThenRead(&contents, &map);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find("bucket 1 listed twice"), std::string::npos) << s.ToString();
  EXPECT_EQ(map.size(), 0u);
}

// A record whose counts contradict each other (checksummed, yet written wrong) is
// refused: the SSD tier subtracts them (live bytes, dead values) and would wrap.
TEST_F(MapCheckpointFileTest, ABucketsContradictoryCountsAreRefused) {
  const MapCheckpoint::Bucket good = contents_.buckets[1];
  for (int which = 0; which < 3; which++) {
    MapCheckpoint::Bucket& b = contents_.buckets[1];
    b = good;
    if (which == 0) b.live_keys = b.keys + 1;
    if (which == 1) b.deleted_bytes = b.total_bytes + 1;
    if (which == 2) b.punched_bytes = b.file_size + 4096;
    MapCheckpoint::Contents contents;
    SsdIndex map;
    const Status s = WriteThenRead(&contents, &map);
    EXPECT_TRUE(s.IsCorruption()) << which << ": " << s.ToString();
    EXPECT_NE(s.ToString().find("bucket 2's counts contradict each other"), std::string::npos)
        << s.ToString();
    EXPECT_EQ(map.size(), 0u);
  }
  contents_.buckets[1] = good;  // and at their limits, accepted
  contents_.buckets[1].live_keys = good.keys;
  contents_.buckets[1].deleted_bytes = good.total_bytes;
  contents_.buckets[1].punched_bytes = good.file_size;
  MapCheckpoint::Contents contents;
  SsdIndex map;
  EXPECT_TRUE(WriteThenRead(&contents, &map).ok());
}

}  // namespace
}  // namespace kvengine
