// SharedMapping: this process's mapping of memory another process shares with it by a
// file descriptor -- an owner's arena memfd, which attached clients map
// (docs/attach.md, "The arena in shared memory").  Unmapped when it goes.
//
// Thread-safety: immutable once made; the memory itself is the users' to synchronize.
#ifndef KVENGINE_ENV_SHARED_MAPPING_H_
#define KVENGINE_ENV_SHARED_MAPPING_H_

#include <cstdint>
#include <memory>

#include "kvengine/status.h"

namespace kvengine {

class SharedMapping {
 public:
  // Which file a descriptor refers to: descriptors of one file (one memfd passed
  // twice) have the same FileId, a new file (a restarted owner's arena) another.
  struct FileId {
    uint64_t device = 0;
    uint64_t inode = 0;
    bool operator==(const FileId&) const = default;
  };
  // Stores the identity of the file `fd` refers to in *id; IOError when it cannot.
  static Status Identify(int fd, FileId* id);

  // Maps `size` bytes of the file `fd` shared and read-write, at a 2 MiB-aligned
  // address so that the file's huge pages, when it has them, map as such, and advises
  // MADV_HUGEPAGE.  With `prefault`, populates this process's page tables of it
  // (MADV_POPULATE_WRITE, Linux 5.14; best effort, writes nothing): without, every first
  // touch of a page faults.  `fd` may be closed afterwards; the mapping keeps the
  // memory.  On failure stores nullptr and returns IOError naming the error.
  static Status Map(int fd, uint64_t size, bool prefault, std::unique_ptr<SharedMapping>* result);

  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  char* base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  SharedMapping(char* base, uint64_t size) : base_(base), size_(size) {}

  char* const base_;
  const uint64_t size_;
};

}  // namespace kvengine

#endif  // KVENGINE_ENV_SHARED_MAPPING_H_
