#include "util/numa_arena.h"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/config_parse.h"
#include "util/logging.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvengine {

namespace {
constexpr size_t kHugePageSize = 2u << 20;
}

Status NumaArena::Create(const Params& params, Logger* logger, std::unique_ptr<NumaArena>* result) {
  result->reset();
  if (params.size == 0) return Status::InvalidArgument("arena size is zero");
  const size_t size = (params.size + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  const char* backing = "4k";
  void* p = MAP_FAILED;
  if (params.huge_pages) {
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1,
               0);
    if (p != MAP_FAILED) {
      backing = "hugetlb";
    } else if (logger != nullptr) {
      logger->Logf(LogLevel::kInfo,
                   "use_huge_pages: no explicit huge pages for %s (%s); using transparent huge "
                   "pages",
                   FormatSize(size).c_str(), std::strerror(errno));
    }
  }
  if (p == MAP_FAILED) {
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
    if (p == MAP_FAILED) {
      return Status::NoSpace("cannot map a memory arena of " + FormatSize(size),
                             std::strerror(errno));
    }
    if (params.huge_pages && ::madvise(p, size, MADV_HUGEPAGE) == 0) backing = "thp";
  }
  char* base = static_cast<char*>(p);

  int node = -1;
  if (numa_available() >= 0) {
    // Bind to the node of the thread opening the DB: that is where the server's I/O
    // threads run.  Must precede the first touch of the pages.
    int cpu = sched_getcpu();
    node = cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
    if (node >= 0) numa_tonode_memory(base, size, node);
  }

  if (params.prefault) {
    if (::madvise(base, size, MADV_POPULATE_WRITE) != 0) {
      if (errno == ENOMEM || errno == EFAULT) {
        ::munmap(base, size);
        return Status::NoSpace("cannot populate a memory arena of " + FormatSize(size),
                               "not enough free memory (set prefault_memory=false to defer)");
      }
      // Kernels before 5.14: touch one byte per page ourselves.
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      for (size_t off = 0; off < size; off += page) base[off] = 0;
    }
  }
  result->reset(new NumaArena(base, size, backing, node));
  return Status::OK();
}

NumaArena::~NumaArena() { ::munmap(base_, size_); }

}  // namespace kvengine
