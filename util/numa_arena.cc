#include "util/numa_arena.h"

#include <fcntl.h>
#include <numa.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
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
// Gives the 2 MiB-aligned chunks of a fresh shmem mapping huge pages, one chunk per
// call: one byte of the chunk is touched (MADV_COLLAPSE refuses a chunk with no page) and
// the chunk collapsed, so the kernel copies one 4 KiB page and clears the rest, about
// what prefaulting the chunk would cost.  Returns the bytes that got them; stops at the
// first refusal (kernels before 6.1, or memory too fragmented).
size_t CollapseToHugePages(char* base, size_t size) {
  size_t done = 0;
  for (size_t off = 0; off + kHugePageSize <= size; off += kHugePageSize) {
    base[off] = 0;
    if (::madvise(base + off, kHugePageSize, MADV_COLLAPSE) != 0) break;
    done += kHugePageSize;
  }
  return done;
}
}  // namespace

void* MapAligned(int fd, size_t size, size_t alignment) {
  // Reserve room for an aligned start, map over it, give the rest back.
  const size_t room_size = size + alignment;
  void* room =
      ::mmap(nullptr, room_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (room == MAP_FAILED) return MAP_FAILED;
  const uintptr_t start = reinterpret_cast<uintptr_t>(room);
  const uintptr_t aligned = (start + alignment - 1) & ~uintptr_t{alignment - 1};
  const int flags = fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS;
  void* p = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ | PROT_WRITE,
                   flags | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int saved = errno;
    ::munmap(room, room_size);
    errno = saved;
    return MAP_FAILED;
  }
  if (aligned > start) ::munmap(room, aligned - start);
  const uintptr_t end = aligned + size, room_end = start + room_size;
  if (room_end > end) ::munmap(reinterpret_cast<void*>(end), room_end - end);
  return p;
}

Status NumaArena::Create(const Params& params, Logger* logger, std::unique_ptr<NumaArena>* result) {
  result->reset();
  if (params.size == 0) return Status::InvalidArgument("arena size is zero");
  const size_t size = (params.size + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  const char* backing = "4k";
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
    // A memfd gets transparent huge pages at fault time only when the host's
    // transparent_hugepage/shmem_enabled allows them; MADV_COLLAPSE gives them
    // regardless (unless it is "deny").  With 4 KiB pages, copies into and out of the
    // arena ran at 0.6-0.8x of an anonymous arena's speed (docs/attach.md).  Collapsing
    // each chunk before it is populated costs what populating it would; collapsing
    // populated memory later copied every page and, while clients ran, took their page
    // table entries away chunk by chunk for many seconds.
    size_t collapsed = 0;
    if (params.shared && params.huge_pages && std::strcmp(backing, "hugetlb") != 0) {
      collapsed = CollapseToHugePages(base, size);
      backing = collapsed == size ? "thp" : "4k";
      if (collapsed != size && logger != nullptr) {
        logger->Logf(LogLevel::kInfo,
                     "use_huge_pages: %s of the shared arena's %s got huge pages (MADV_COLLAPSE: "
                     "%s); the rest is 4 KiB pages",
                     FormatSize(collapsed).c_str(), FormatSize(size).c_str(), std::strerror(errno));
      }
    }
    char* rest = base + collapsed;
    const size_t rest_size = size - collapsed;
    if (rest_size > 0 && ::madvise(rest, rest_size, MADV_POPULATE_WRITE) != 0) {
      if (errno == ENOMEM || errno == EFAULT) {
        ::munmap(base, size);
        if (fd >= 0) ::close(fd);
        return Status::NoSpace("cannot populate a memory arena of " + FormatSize(size),
                               "not enough free memory (set prefault_memory=false to defer)");
      }
      // Kernels before 5.14: touch one byte per page ourselves.
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      for (size_t off = 0; off < rest_size; off += page) rest[off] = 0;
    }
  }
  result->reset(new NumaArena(base, size, backing, node, fd));
  return Status::OK();
}

NumaArena::~NumaArena() {
  ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kvengine
