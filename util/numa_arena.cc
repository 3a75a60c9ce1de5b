#include "util/numa_arena.h"

#include <fcntl.h>
#include <numa.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "util/config_parse.h"
#include "util/logging.h"

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26)  // log2(2 MiB) << MFD_HUGE_SHIFT (linux/memfd.h)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

namespace kvengine {

namespace {
constexpr size_t kHugePageSize = 2u << 20;

// Maps `size` bytes of a new memfd shared; stores the fd in *fd.  MAP_FAILED (and *fd
// -1) when the kernel refuses, errno set.
void* MapSharedMemfd(size_t size, bool huge, int* fd) {
  *fd = ::memfd_create("kvengine-arena", MFD_CLOEXEC | (huge ? MFD_HUGETLB | MFD_HUGE_2MB : 0));
  if (*fd < 0) return MAP_FAILED;
  void* p = MAP_FAILED;
  if (::ftruncate(*fd, static_cast<off_t>(size)) == 0) p = MapSharedAligned(*fd, size);
  if (p == MAP_FAILED) {
    const int saved = errno;
    ::close(*fd);
    *fd = -1;
    errno = saved;
  }
  return p;
}
// Gives the 2 MiB-aligned chunks of a prefaulted shmem mapping huge pages, one chunk
// per call (the kernel copies each, ~1 ms on a quiet machine), until `stop`.  Returns
// the bytes that got them; stops at the first refusal (kernels before 6.1, or memory
// too fragmented).
size_t CollapseToHugePages(char* base, size_t size, const std::atomic<bool>& stop) {
  size_t done = 0;
  for (size_t off = 0; off + kHugePageSize <= size && !stop.load(std::memory_order_relaxed);
       off += kHugePageSize) {
    if (::madvise(base + off, kHugePageSize, MADV_COLLAPSE) != 0) break;
    done += kHugePageSize;
  }
  return done;
}
}  // namespace

void* MapSharedAligned(int fd, size_t size) {
  // Reserve room for an aligned start, map the file over it, give the rest back.
  void* room = ::mmap(nullptr, size + kHugePageSize, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (room == MAP_FAILED) return MAP_FAILED;
  const uintptr_t start = reinterpret_cast<uintptr_t>(room);
  const uintptr_t aligned = (start + kHugePageSize - 1) & ~uintptr_t{kHugePageSize - 1};
  void* p = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int saved = errno;
    ::munmap(room, size + kHugePageSize);
    errno = saved;
    return MAP_FAILED;
  }
  if (aligned > start) ::munmap(room, aligned - start);
  const uintptr_t end = aligned + size, room_end = start + size + kHugePageSize;
  if (room_end > end) ::munmap(reinterpret_cast<void*>(end), room_end - end);
  return p;
}

Status NumaArena::Create(const Params& params, Logger* logger, std::unique_ptr<NumaArena>* result) {
  result->reset();
  if (params.size == 0) return Status::InvalidArgument("arena size is zero");
  const size_t size = (params.size + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  const char* backing = "4k";
  bool collapse = false;  // give a shared arena huge pages after Open (below)
  void* p = MAP_FAILED;
  int fd = -1;
  if (params.huge_pages) {
    p = params.shared ? MapSharedMemfd(size, /*huge=*/true, &fd)
                      : ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
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
    p = params.shared ? MapSharedMemfd(size, /*huge=*/false, &fd)
                      : ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
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
        if (fd >= 0) ::close(fd);
        return Status::NoSpace("cannot populate a memory arena of " + FormatSize(size),
                               "not enough free memory (set prefault_memory=false to defer)");
      }
      // Kernels before 5.14: touch one byte per page ourselves.
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      for (size_t off = 0; off < size; off += page) base[off] = 0;
    }
    // A memfd gets transparent huge pages at fault time only when the host's
    // transparent_hugepage/shmem_enabled allows them; MADV_COLLAPSE gives them
    // regardless (unless it is "deny").  With 4 KiB pages, copies into and out of the
    // arena ran at 0.6-0.8x of an anonymous arena's speed (docs/attach.md).  The kernel
    // copies every chunk (0.35 s to seconds per GiB), so a thread does it after Open
    // returns, while the arena is in use: a collapse is transparent to its users.
    collapse = params.shared && params.huge_pages && std::strcmp(backing, "hugetlb") != 0;
    if (collapse) backing = "4k";
  }
  result->reset(new NumaArena(base, size, backing, node, fd));
  if (collapse) (*result)->StartCollapse(logger);
  return Status::OK();
}

void NumaArena::StartCollapse(Logger* logger) {
  collapser_ = std::thread([this, logger] {
    const auto start = std::chrono::steady_clock::now();
    const size_t collapsed = CollapseToHugePages(base_, size_, stop_collapse_);
    const int err = errno;
    if (stop_collapse_.load()) return;
    if (collapsed == size_) backing_.store("thp");
    if (logger == nullptr) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (collapsed == size_) {
      logger->Logf(LogLevel::kInfo,
                   "use_huge_pages: the shared arena (%s) got huge pages in %.1f s",
                   FormatSize(size_).c_str(), seconds);
    } else {
      logger->Logf(LogLevel::kInfo,
                   "use_huge_pages: %s of the shared arena's %s got huge pages (MADV_COLLAPSE: "
                   "%s); the rest is 4 KiB pages",
                   FormatSize(collapsed).c_str(), FormatSize(size_).c_str(), std::strerror(err));
    }
  });
}

NumaArena::~NumaArena() {
  stop_collapse_ = true;
  if (collapser_.joinable()) collapser_.join();
  ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kvengine
