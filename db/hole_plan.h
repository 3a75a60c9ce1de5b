// Which blocks of a bucket file the GC may give back for a set of dead values.
//
// A hole can only free whole filesystem blocks, and a bucket of format version 3 packs
// small values several to a block.  So the dead extents of one bucket are sorted and
// joined into runs of neighbours, and each run yields the whole blocks inside it: freed
// now.  The run's ends that share a block with a live value (or a value not yet known
// dead) stay queued as extents of their own, and join a run again when that neighbour
// dies; until then only a compaction reclaims them.  A run's value bytes are credited
// in proportion to the bytes each part covers, so the credits of a value add up to its
// size once all its parts are punched.
#ifndef KVENGINE_DB_HOLE_PLAN_H_
#define KVENGINE_DB_HOLE_PLAN_H_

#include <cstdint>
#include <vector>

#include "db/ssd_bucket.h"
#include "kvengine/env.h"

namespace kvengine {

struct HolePlan {
  struct Hole {
    FileRange range;           // whole blocks, never empty
    uint64_t value_bytes = 0;  // credited to punched_value_bytes once punched
    // The parts of the run left queued once the hole is punched.
    std::vector<SsdBucket::Extent> leftovers;
    // The run's extents as given: queued again whole if the hole is not punched.
    std::vector<SsdBucket::Extent> extents;
  };
  std::vector<Hole> holes;  // by offset
  // Runs holding no whole block: they stay queued as they are.
  std::vector<SsdBucket::Extent> unpunchable;
};

// REQUIRES: the extents do not overlap; block is a power of two.
HolePlan PlanHoles(std::vector<SsdBucket::Extent> extents, uint64_t block);

// Cuts an extent where its first block and its last block end and begin, when those
// blocks hold more than the extent: at most three parts (a head sharing its block with
// what comes before, the whole blocks, a tail sharing its block with what comes after),
// each with its proportional share of the value bytes.  An extent within one or two
// blocks may give no whole part at all.
std::vector<SsdBucket::Extent> SplitAtBlocks(const SsdBucket::Extent& extent, uint64_t block);

}  // namespace kvengine

#endif  // KVENGINE_DB_HOLE_PLAN_H_
