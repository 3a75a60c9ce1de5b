#include "db/hole_plan.h"

#include <algorithm>

#include "util/aligned_buffer.h"

namespace kvengine {

namespace {

// Cuts [offset, offset + length), carrying `value_bytes`, at `cuts` (ascending, inside
// it); the last part takes what the rounding of the shares left over.
std::vector<SsdBucket::Extent> Cut(uint64_t offset, uint64_t length, uint64_t value_bytes,
                                   const std::vector<uint64_t>& cuts) {
  std::vector<SsdBucket::Extent> parts;
  uint64_t from = offset, credited = 0;
  const uint64_t end = offset + length;
  auto add = [&](uint64_t to, bool last) {
    if (to <= from) return;
    const uint64_t share = last
                               ? value_bytes - credited
                               : static_cast<uint64_t>(static_cast<unsigned __int128>(value_bytes) *
                                                       (to - from) / length);
    parts.push_back({from, to - from, share});
    credited += share;
    from = to;
  };
  for (uint64_t c : cuts) add(c, false);
  add(end, true);
  return parts;
}

}  // namespace

std::vector<SsdBucket::Extent> SplitAtBlocks(const SsdBucket::Extent& e, uint64_t block) {
  const uint64_t end = e.offset + e.length;
  std::vector<uint64_t> cuts;
  // After the head that shares its block with what lies before the extent...
  const uint64_t head_end = RoundUpTo(e.offset, block);
  if (head_end > e.offset && head_end < end) cuts.push_back(head_end);
  // ...and before the tail that shares its block with what lies after it.
  const uint64_t tail_begin = RoundDownTo(end, block);
  if (tail_begin < end && tail_begin > e.offset && (cuts.empty() || tail_begin > cuts.back())) {
    cuts.push_back(tail_begin);
  }
  return Cut(e.offset, e.length, e.value_size, cuts);
}

HolePlan PlanHoles(std::vector<SsdBucket::Extent> extents, uint64_t block) {
  std::sort(
      extents.begin(), extents.end(),
      [](const SsdBucket::Extent& a, const SsdBucket::Extent& b) { return a.offset < b.offset; });
  HolePlan plan;
  for (size_t begin = 0; begin < extents.size();) {
    size_t end = begin + 1;
    uint64_t run_end = extents[begin].offset + extents[begin].length;
    uint64_t values = extents[begin].value_size;
    while (end < extents.size() && extents[end].offset == run_end) {
      run_end += extents[end].length;
      values += extents[end].value_size;
      end++;
    }
    const uint64_t run_begin = extents[begin].offset;
    const std::vector<SsdBucket::Extent> parts =
        SplitAtBlocks({run_begin, run_end - run_begin, values}, block);
    HolePlan::Hole hole;
    for (const SsdBucket::Extent& p : parts) {
      if (p.offset % block == 0 && p.length % block == 0) {
        hole.range = {p.offset, p.length};
        hole.value_bytes = p.value_size;
      } else {
        hole.leftovers.push_back(p);
      }
    }
    if (hole.range.length == 0) {
      plan.unpunchable.insert(plan.unpunchable.end(), extents.begin() + begin,
                              extents.begin() + end);
    } else {
      hole.extents.assign(extents.begin() + begin, extents.begin() + end);
      plan.holes.push_back(std::move(hole));
    }
    begin = end;
  }
  return plan;
}

}  // namespace kvengine
