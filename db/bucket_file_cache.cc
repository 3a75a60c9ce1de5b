#include "db/bucket_file_cache.h"

#include <vector>

namespace kvengine {

Status BucketFileCache::Get(uint64_t id, const std::string& path, Handle* file) {
  std::vector<Handle> closed;  // released after mu_: closing is a system call
  {
    MutexLock lock(&mu_);
    auto it = files_.find(id);
    if (it != files_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      *file = it->second.file;
      return Status::OK();
    }
  }
  std::unique_ptr<RandomAccessFile> opened;
  Status s = env_->NewRandomAccessFile(path, options_, &opened);
  if (IsTooManyOpenFiles(s)) {
    // Other code of this process took the descriptors: give back every one we may.
    CloseUnused();
    s = env_->NewRandomAccessFile(path, options_, &opened);
    if (IsTooManyOpenFiles(s)) {
      return Status::IOError(s.ToString(),
                             "even with every unused bucket file closed (" +
                                 std::to_string(open_files()) +
                                 " in use; max_open_files=" + std::to_string(capacity_) + ")");
    }
  }
  if (!s.ok()) return s;
  MutexLock lock(&mu_);
  opens_++;
  InsertLocked(id, Handle(std::move(opened)), file);
  ShrinkLocked(capacity_, &closed);
  return Status::OK();
}

void BucketFileCache::Insert(uint64_t id, std::unique_ptr<RandomAccessFile> file) {
  std::vector<Handle> closed;
  MutexLock lock(&mu_);
  Handle kept;
  InsertLocked(id, Handle(std::move(file)), &kept);
  kept.reset();  // not pinned by this call
  ShrinkLocked(capacity_, &closed);
}

BucketFileCache::Handle BucketFileCache::Erase(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = files_.find(id);
  if (it == files_.end()) return nullptr;
  Handle file = std::move(it->second.file);
  lru_.erase(it->second.lru);
  files_.erase(it);
  return file;
}

void BucketFileCache::CloseUnused() {
  std::vector<Handle> closed;
  MutexLock lock(&mu_);
  ShrinkLocked(0, &closed);
}

uint64_t BucketFileCache::open_files() const {
  MutexLock lock(&mu_);
  return files_.size();
}

uint64_t BucketFileCache::opens() const {
  MutexLock lock(&mu_);
  return opens_;
}

void BucketFileCache::InsertLocked(uint64_t id, Handle fresh, Handle* file) {
  auto it = files_.find(id);
  if (it == files_.end()) {
    lru_.push_front(id);
    it = files_.emplace(id, Entry{std::move(fresh), lru_.begin()}).first;
  } else {
    // Another thread opened it meanwhile: keep one descriptor, drop ours.
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  *file = it->second.file;
}

void BucketFileCache::ShrinkLocked(uint64_t keep, std::vector<Handle>* closed) {
  auto pos = lru_.end();
  while (files_.size() > keep && pos != lru_.begin()) {
    --pos;
    auto it = files_.find(*pos);
    // The cache's own reference is the only one: no read holds it, and none can take it
    // while mu_ is held.
    if (it->second.file.use_count() != 1) continue;
    closed->push_back(std::move(it->second.file));
    files_.erase(it);
    pos = lru_.erase(pos);
  }
}

}  // namespace kvengine
