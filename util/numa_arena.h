// NumaArena: one large page-aligned region of memory on the calling thread's NUMA node,
// optionally backed by huge pages and pre-faulted.  The memory tier carves its slabs out
// of it and transports register it once (RDMA memory region).
//
// A shared arena (Params::shared) is a memfd mapped MAP_SHARED instead of anonymous
// memory, so that attached client processes can map the same pages (docs/attach.md):
// the owner passes fd() over a Unix socket and each client maps it once.
//
// A shared arena may be cut into parts (Params::parts), each a memfd of its own mapped
// at its place in the one range (docs/attach.md, "An arena per trust boundary"): the
// owner sees one contiguous arena, while a client receives only the parts it may map.
#ifndef KVENGINE_UTIL_NUMA_ARENA_H_
#define KVENGINE_UTIL_NUMA_ARENA_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/status.h"

namespace kvengine {

class Logger;

// Maps `size` bytes read-write at an address aligned to `alignment` (a power of two, a
// multiple of the page size): of the file `fd` shared, or, with fd -1, fresh anonymous
// memory.  MAP_FAILED with errno on failure.
void* MapAligned(int fd, size_t size, size_t alignment);
// MapAligned at 2 MiB, so that the file's huge pages, when it has them, map as such.
inline void* MapSharedAligned(int fd, size_t size) { return MapAligned(fd, size, 2u << 20); }

class NumaArena {
 public:
  struct Params {
    size_t size = 0;
    bool huge_pages = false;
    bool prefault = true;
    // Back the arena with a memfd that other processes can map (see fd()).
    bool shared = false;
    // The sizes of its parts, in order, each a multiple of 2 MiB, adding up to size;
    // empty: one part.  A shared arena's parts are memfds of their own.
    std::vector<size_t> parts;
  };

  // Maps params.size bytes (rounded up to 2 MiB).  With huge_pages, tries explicit huge
  // pages first and falls back, with a logged message, to transparent huge pages (for a
  // shared arena: a hugetlb memfd first, then an ordinary memfd advised MADV_HUGEPAGE,
  // which the kernel honours when shmem_enabled allows it).
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
  // The memfd behind a shared arena's first part (owned by the arena), or -1.
  int fd() const { return fds_.empty() ? -1 : fds_[0]; }
  // The memfd behind part `i` of a shared arena (owned by the arena), or -1.
  int part_fd(size_t i) const { return i < fds_.size() ? fds_[i] : -1; }

 private:
  NumaArena(char* base, size_t size, const char* backing, int node, std::vector<int> fds)
      : base_(base), size_(size), backing_(backing), numa_node_(node), fds_(std::move(fds)) {}

  char* const base_;
  const size_t size_;
  const char* const backing_;
  const int numa_node_;
  const std::vector<int> fds_;  // a shared arena's, one per part
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_NUMA_ARENA_H_
