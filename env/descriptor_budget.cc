#include "env/descriptor_budget.h"

#include <algorithm>

namespace kvengine {

DescriptorBudget DescriptorBudget::Plan(Env* env, uint64_t max_open_files) {
  DescriptorBudget b;
  b.bucket_files = max_open_files;
  b.rings = kMaxRings;
  b.connections = kMaxConnections;
  if (!env->GetDescriptorUse(&b.limit, &b.in_use).ok() || b.limit == UINT64_MAX) {
    b.engine = UINT64_MAX;
    return b;
  }
  b.known = true;
  const uint64_t free = b.limit > b.in_use ? b.limit - b.in_use : 0;
  b.headroom = std::min(free, std::max(kMinHeadroom, free / 4));
  b.engine = free - b.headroom;
  // Rings take what is left after the fixed share, up to kMaxRings, and no more than a
  // quarter of it: bucket files serve reads even without a ring.
  const uint64_t after_fixed = b.engine > kFixed ? b.engine - kFixed : 0;
  b.rings = std::min(kMaxRings, after_fixed / 4);
  // Connections take a quarter too: a refused connection is a clear answer its client
  // can act on, a bucket file not cached only a reopen.
  b.connections = std::min(kMaxConnections, after_fixed / 4);
  b.bucket_files = std::max(kMinBucketFiles, after_fixed - b.rings - b.connections);
  if (b.bucket_files < max_open_files) {
    b.clamped = true;
  } else {
    b.bucket_files = max_open_files;
  }
  return b;
}

uint64_t DescriptorBudget::ConnectionCap(uint64_t wanted, uint64_t per_connection, bool shared,
                                         bool* clamped) const {
  *clamped = false;
  if (!known) return wanted != 0 ? wanted : kMaxConnections;
  const uint64_t share = shared ? connections / 2 : connections;
  const uint64_t most = std::max<uint64_t>(1, (share > 1 ? share - 1 : 0) / per_connection);
  if (wanted == 0) return most;
  *clamped = wanted > most;
  return std::min(wanted, most);
}

}  // namespace kvengine
