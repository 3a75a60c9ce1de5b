// RegionMap: non-overlapping memory regions [addr, addr+length), as RegisterBuffer keeps
// them (db.h: a region may not overlap a registered one).  DBImpl, AttachedDB and the
// transports each keep one.
//
// Thread-safety: all methods are thread-safe.
#ifndef KVENGINE_UTIL_REGION_MAP_H_
#define KVENGINE_UTIL_REGION_MAP_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "kvengine/status.h"
#include "util/mutex.h"

namespace kvengine {

class RegionMap {
 public:
  // Adds the region; InvalidArgument (`what` names the caller in the message) when it is
  // null, empty, wraps around, or overlaps a region already added.
  Status Add(void* addr, size_t length, const char* what);
  // Removes the region that starts at addr; returns its length (0 when none starts there).
  size_t Remove(void* addr);
  // Removes every region and returns them (start, length).
  std::vector<std::pair<void*, size_t>> TakeAll();
  size_t size() const;

 private:
  mutable Mutex mu_;
  std::map<uintptr_t, size_t> regions_ GUARDED_BY(mu_);  // start -> length
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_REGION_MAP_H_
