// NumaArena: one large page-aligned region of memory on the calling thread's NUMA node,
// optionally backed by huge pages and pre-faulted.  The memory tier carves its slabs out
// of it and transports register it once (RDMA memory region).
#ifndef KVENGINE_UTIL_NUMA_ARENA_H_
#define KVENGINE_UTIL_NUMA_ARENA_H_

#include <cstddef>
#include <memory>
#include <string>

#include "kvengine/status.h"

namespace kvengine {

class Logger;

class NumaArena {
 public:
  struct Params {
    size_t size = 0;
    bool huge_pages = false;
    bool prefault = true;
  };

  // Maps params.size bytes (rounded up to 2 MiB).  With huge_pages, tries explicit huge
  // pages first and falls back, with a logged message, to transparent huge pages.
  // NoSpace when the system cannot provide the memory.
  static Status Create(const Params& params, Logger* logger, std::unique_ptr<NumaArena>* result);

  ~NumaArena();
  NumaArena(const NumaArena&) = delete;
  NumaArena& operator=(const NumaArena&) = delete;

  char* base() const { return base_; }
  size_t size() const { return size_; }
  // How the memory is backed, for stats: "hugetlb", "thp", "4k".
  const char* backing() const { return backing_; }
  // The NUMA node the arena was bound to, or -1 without NUMA support.
  int numa_node() const { return numa_node_; }

 private:
  NumaArena(char* base, size_t size, const char* backing, int node)
      : base_(base), size_(size), backing_(backing), numa_node_(node) {}

  char* const base_;
  const size_t size_;
  const char* const backing_;
  const int numa_node_;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_NUMA_ARENA_H_
