#include "env/shared_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "util/numa_arena.h"

namespace kvengine {

namespace {

constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE, Linux 5.14; older: ignored

}  // namespace

Status SharedMapping::Identify(int fd, FileId* id) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IOError("fstat", std::strerror(errno));
  id->device = static_cast<uint64_t>(st.st_dev);
  id->inode = static_cast<uint64_t>(st.st_ino);
  return Status::OK();
}

Status SharedMapping::Map(int fd, uint64_t size, bool prefault,
                          std::unique_ptr<SharedMapping>* result) {
  result->reset();
  void* p = MapSharedAligned(fd, size);
  if (p == MAP_FAILED) {
    return Status::IOError("mmap of " + std::to_string(size) + " shared bytes",
                           std::strerror(errno));
  }
  ::madvise(p, size, MADV_HUGEPAGE);
  if (prefault) ::madvise(p, size, kMadvPopulateWrite);  // best effort
  result->reset(new SharedMapping(static_cast<char*>(p), size));
  return Status::OK();
}

SharedMapping::~SharedMapping() { ::munmap(base_, size_); }

}  // namespace kvengine
