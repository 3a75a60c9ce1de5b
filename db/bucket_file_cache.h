// BucketFileCache: the open bucket files of the SSD tier, at most `capacity` of them,
// least recently used closed first (RocksDB's TableCache does this job for SSTs).
//
// Without it every bucket kept a descriptor for its whole life, so a tier of more
// buckets than the process may open descriptors failed its writes ("Too many open
// files").  A file handed out by Get() is pinned while its handle lives: an in-flight
// read never loses its descriptor, and the cache closes only files nobody holds (when
// every file is pinned it runs over capacity rather than fail a read).  A bucket's file
// is reopened on its next read.
//
// Thread-safety: all methods are thread-safe.  Files are opened outside the cache's lock.
#ifndef KVENGINE_DB_BUCKET_FILE_CACHE_H_
#define KVENGINE_DB_BUCKET_FILE_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "kvengine/env.h"
#include "util/mutex.h"

namespace kvengine {

class BucketFileCache {
 public:
  using Handle = std::shared_ptr<const RandomAccessFile>;

  BucketFileCache(Env* env, const FileOptions& options, uint64_t capacity)
      : env_(env), options_(options), capacity_(capacity) {}
  BucketFileCache(const BucketFileCache&) = delete;
  BucketFileCache& operator=(const BucketFileCache&) = delete;

  // Stores in *file bucket `id`'s open file (`path`), opening it if it is not cached.
  // When the process is out of descriptors, closes every unpinned file and tries once
  // more; still failing, the Status names EMFILE and max_open_files.
  Status Get(uint64_t id, const std::string& path, Handle* file);

  // Caches a file of bucket `id` opened elsewhere (just written and verified), so that
  // its first reads do not open it again.
  void Insert(uint64_t id, std::unique_ptr<RandomAccessFile> file);

  // Forgets bucket `id` (retired).  Returns the cache's reference, so that the caller
  // decides on which thread the file is closed: closing a deleted file frees its blocks,
  // which takes a while.  Readers still holding it keep it open until they finish.
  Handle Erase(uint64_t id);

  // Closes every file no read holds: for when the process runs out of descriptors.
  void CloseUnused();

  // Files held open by the cache now, and how many opens it has made since it started.
  uint64_t open_files() const;
  uint64_t opens() const;

 private:
  struct Entry {
    Handle file;
    std::list<uint64_t>::iterator lru;  // position in lru_
  };
  // Adds (or keeps the already cached) file for `id`, marks it most recently used,
  // closes unpinned files past capacity; *file: the cached one.
  void InsertLocked(uint64_t id, Handle fresh, Handle* file) REQUIRES(mu_);
  // Closes least recently used unpinned files until at most `keep` remain (or only
  // pinned ones).  The closed handles go to *closed, to be released once mu_ is let go.
  void ShrinkLocked(uint64_t keep, std::vector<Handle>* closed) REQUIRES(mu_);

  Env* const env_;
  const FileOptions options_;
  const uint64_t capacity_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Entry> files_;
  std::list<uint64_t> lru_;  // most recently used first
  uint64_t opens_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_BUCKET_FILE_CACHE_H_
