// DB::BatchGetIntoGroups's default: one BatchGetInto per group, in group order.  A DB
// whose groups' reads can be in flight together (ClusterDB over the peers) overrides it.
#include "kvengine/db.h"
#include "util/input_check.h"

namespace kvengine {

Status DB::BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                              std::span<const Destination> destinations,
                              std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                              std::vector<int64_t>* results) {
  Status s = input::CheckGroupedBatch(results, keys.size(), destinations.size(), group_ends);
  if (!s.ok()) return s;
  results->assign(keys.size(), 0);
  std::vector<int64_t> r;
  size_t begin = 0;
  for (size_t g = 0; g < group_ends.size(); g++) {
    const size_t n = group_ends[g] - begin;
    if (n > 0) {
      s = BatchGetInto(options, keys.subspan(begin, n), destinations.subspan(begin, n), &r);
      if (!s.ok()) return s;  // the DB closed meanwhile: the groups reported stay so
      std::copy(r.begin(), r.end(), results->begin() + static_cast<ptrdiff_t>(begin));
    }
    if (on_ready) on_ready(g);
    begin = group_ends[g];
  }
  return Status::OK();
}

}  // namespace kvengine
