// PlanHoles and SplitAtBlocks: which whole blocks a GC round may give back when small
// values share blocks, and that every dead value byte is credited exactly once.
#include "db/hole_plan.h"

#include <numeric>

#include "gtest/gtest.h"

namespace kvengine {
namespace {

constexpr uint64_t kBlock = 4096;

uint64_t Credits(const std::vector<SsdBucket::Extent>& extents) {
  uint64_t sum = 0;
  for (const auto& e : extents) sum += e.value_size;
  return sum;
}

TEST(HolePlanTest, WholeBlocksOfARunArePunchedItsSharedEndsWait) {
  // Eight 512-byte dead values fill block [4096, 8192); two more spill into the next
  // block, which a live value shares.
  std::vector<SsdBucket::Extent> dead;
  for (uint64_t i = 0; i < 10; i++) dead.push_back({4096 + 512 * (9 - i), 512, 500});
  const HolePlan plan = PlanHoles(dead, kBlock);
  ASSERT_EQ(plan.holes.size(), 1u);
  EXPECT_EQ(plan.holes[0].range.offset, 4096u);
  EXPECT_EQ(plan.holes[0].range.length, 4096u);
  ASSERT_EQ(plan.holes[0].leftovers.size(), 1u);
  EXPECT_EQ(plan.holes[0].leftovers[0].offset, 8192u);
  EXPECT_EQ(plan.holes[0].leftovers[0].length, 1024u);
  EXPECT_EQ(plan.holes[0].value_bytes + Credits(plan.holes[0].leftovers), 5000u);
  EXPECT_EQ(plan.holes[0].extents.size(), 10u);
  EXPECT_TRUE(plan.unpunchable.empty());
}

TEST(HolePlanTest, RunsWithinOneBlockStayQueuedAsTheyAre) {
  const HolePlan plan = PlanHoles({{4096 + 512, 512, 512}, {4096 + 2048, 1024, 1000}}, kBlock);
  EXPECT_TRUE(plan.holes.empty());
  ASSERT_EQ(plan.unpunchable.size(), 2u);
  EXPECT_EQ(Credits(plan.unpunchable), 1512u);
}

TEST(HolePlanTest, LeftoversJoinLaterNeighboursAndCreditEveryByteOnce) {
  // A block of eight values dies one value at a time; its bytes are punched when the last
  // one dies, and the credits of all rounds add up to the values' sizes.
  std::vector<SsdBucket::Extent> queued;
  uint64_t punched = 0, credited = 0;
  for (uint64_t i = 0; i < 8; i++) {
    queued.push_back({8192 + 512 * ((i * 3) % 8), 512, 511});
    HolePlan plan = PlanHoles(queued, kBlock);
    queued = plan.unpunchable;
    for (const auto& h : plan.holes) {
      punched += h.range.length;
      credited += h.value_bytes;
      queued.insert(queued.end(), h.leftovers.begin(), h.leftovers.end());
    }
    if (i < 7) {
      EXPECT_EQ(punched, 0u) << i;
    }
  }
  EXPECT_EQ(punched, kBlock);
  EXPECT_EQ(credited + Credits(queued), 8 * 511u);
  EXPECT_TRUE(queued.empty());
}

TEST(HolePlanTest, PageAlignedValuesArePunchedWhole) {
  const HolePlan plan = PlanHoles({{4096, 69632, 65541}, {4096 + 69632, 8192, 8000}}, kBlock);
  ASSERT_EQ(plan.holes.size(), 1u);  // neighbours: one hole
  EXPECT_EQ(plan.holes[0].range.length, 69632u + 8192u);
  EXPECT_EQ(plan.holes[0].value_bytes, 65541u + 8000u);
  EXPECT_TRUE(plan.holes[0].leftovers.empty());
}

TEST(SplitAtBlocksTest, CutsWhereSharedBlocksBeginAndEnd) {
  auto parts = SplitAtBlocks({3584, 5120, 5000}, kBlock);  // [3584, 8704)
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].offset, 3584u);
  EXPECT_EQ(parts[0].length, 512u);
  EXPECT_EQ(parts[1].offset, 4096u);
  EXPECT_EQ(parts[1].length, 4096u);
  EXPECT_EQ(parts[2].offset, 8192u);
  EXPECT_EQ(parts[2].length, 512u);
  EXPECT_EQ(Credits(parts), 5000u);
  EXPECT_EQ(SplitAtBlocks({8192, 8192, 8000}, kBlock).size(), 1u);  // whole pages: one part
  EXPECT_EQ(SplitAtBlocks({8704, 512, 500}, kBlock).size(), 1u);    // inside one block
  EXPECT_EQ(SplitAtBlocks({3584, 1024, 1000}, kBlock).size(), 2u);  // across a boundary
}

}  // namespace
}  // namespace kvengine
