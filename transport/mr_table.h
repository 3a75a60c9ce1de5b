// Registered memory regions, looked up by address range: the UCX transport's mappings
// (ucp_mem_h) of the regions a DB registers.
#ifndef KVENGINE_TRANSPORT_MR_TABLE_H_
#define KVENGINE_TRANSPORT_MR_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "kvengine/status.h"
#include "util/mutex.h"

namespace kvengine {

// Thread-safe.
class MrTable {
 public:
  struct Region {
    uintptr_t start = 0;
    size_t length = 0;
    void* handle = nullptr;  // the registration (a ucp_mem_h), owned by whoever made it
  };
  // InvalidArgument when it is empty or overlaps a region.
  Status Add(const Region& region);
  // Removes the region starting at addr; stores it in *removed.  False when none.
  bool Remove(const void* addr, Region* removed);
  // The region holding all of [addr, addr+length); false when none does.
  bool Find(const void* addr, size_t length, Region* out) const;
  size_t size() const;
  std::vector<Region> All() const;

 private:
  mutable Mutex mu_;
  std::map<uintptr_t, Region> regions_ GUARDED_BY(mu_);
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_MR_TABLE_H_
