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

void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) ::close(fd);
  fds->clear();
}

// Maps new memfds of the sizes `parts`, one after the other, shared, in one range
// aligned to 2 MiB; stores their fds in *fds.  MAP_FAILED (and *fds empty) when the
// kernel refuses, errno set.
void* MapSharedMemfds(size_t size, const std::vector<size_t>& parts, bool huge,
                      std::vector<int>* fds) {
  fds->clear();
  // The range first (anonymous, replaced part by part), so the parts are contiguous.
  void* p = parts.size() > 1 ? MapAligned(-1, size, kHugePageSize) : nullptr;
  if (p == MAP_FAILED) return MAP_FAILED;
  size_t offset = 0;
  for (size_t part : parts) {
    int fd =
        ::memfd_create("kvengine-arena", MFD_CLOEXEC | (huge ? MFD_HUGETLB | MFD_HUGE_2MB : 0));
    void* mapped = MAP_FAILED;
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(part)) == 0) {
      mapped = p == nullptr ? MapSharedAligned(fd, part)
                            : ::mmap(static_cast<char*>(p) + offset, part, PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_FIXED, fd, 0);
    }
    if (mapped == MAP_FAILED) {
      const int saved = errno;
      if (fd >= 0) ::close(fd);
      CloseAll(fds);
      if (p != nullptr) ::munmap(p, size);
      errno = saved;
      return MAP_FAILED;
    }
    if (p == nullptr) p = mapped;  // one part: its own aligned mapping
    fds->push_back(fd);
    offset += part;
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
  std::vector<size_t> parts = params.parts;
  if (parts.empty()) parts.push_back(size);
  size_t parts_total = 0;
  for (size_t part : parts) {
    if (part == 0 || part % kHugePageSize != 0) {
      return Status::InvalidArgument("arena part of " + FormatSize(part) +
                                     " is not a whole number of 2 MiB chunks");
    }
    parts_total += part;
  }
  if (parts_total != size) {
    return Status::InvalidArgument("arena parts add up to " + FormatSize(parts_total) +
                                   ", not the arena's " + FormatSize(size));
  }
  const char* backing = "4k";
  void* p = MAP_FAILED;
  std::vector<int> fds;
  if (params.huge_pages) {
    p = params.shared ? MapSharedMemfds(size, parts, /*huge=*/true, &fds)
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
    p = params.shared ? MapSharedMemfds(size, parts, /*huge=*/false, &fds)
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
        CloseAll(&fds);
        return Status::NoSpace("cannot populate a memory arena of " + FormatSize(size),
                               "not enough free memory (set prefault_memory=false to defer)");
      }
      // Kernels before 5.14: touch one byte per page ourselves.
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      for (size_t off = 0; off < rest_size; off += page) rest[off] = 0;
    }
  }
  result->reset(new NumaArena(base, size, backing, node, std::move(fds)));
  return Status::OK();
}

NumaArena::~NumaArena() {
  ::munmap(base_, size_);
  for (int fd : fds_) ::close(fd);
}

}  // namespace kvengine
