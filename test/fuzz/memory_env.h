// MemoryEnv: an Env whose files are strings in memory, for the fuzz targets.
//
// A fuzz target runs thousands of inputs a second; going through the file system would
// make it slow and leave files behind.  MemoryEnv keeps one flat namespace of paths (a
// directory is any prefix; SyncDir and CreateDirIfMissing succeed and do nothing) and
// implements what the readers and writers under fuzz use: random-access reads, writes,
// appends, renames.  Locks are not supported.
//
// A file can be marked direct: it then reports IsDirect() and aborts on a read whose
// offset, length or buffer breaks O_DIRECT's alignment, so that a reader that claims to
// honour it is checked on every input.
//
// Thread-safety: none; a fuzz target is single-threaded.
#ifndef KVENGINE_TEST_FUZZ_MEMORY_ENV_H_
#define KVENGINE_TEST_FUZZ_MEMORY_ENV_H_

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/env.h"

namespace kvengine::fuzz {

class MemoryEnv final : public Env {
 public:
  // Replaces (or creates) the file at `path`.
  void SetFile(const std::string& path, std::string contents, bool direct = false) {
    files_[path] = File{std::make_shared<std::string>(std::move(contents)), direct};
  }
  // The contents of the file at `path`; nullptr when there is none.
  const std::string* GetFile(const std::string& path) const {
    auto it = files_.find(path);
    return it == files_.end() ? nullptr : it->second.data.get();
  }
  void Clear() { files_.clear(); }

  Status NewRandomAccessFile(const std::string& path, const FileOptions&,
                             std::unique_ptr<RandomAccessFile>* result) override {
    auto it = files_.find(path);
    if (it == files_.end()) return Status::NotFound(path);
    *result = std::make_unique<ReadableFile>(it->second);
    return Status::OK();
  }
  Status NewWritableFile(const std::string& path, const FileOptions&,
                         std::unique_ptr<WritableFile>* result) override {
    SetFile(path, "");
    *result = std::make_unique<AppendingFile>(files_[path].data);
    return Status::OK();
  }
  Status NewAppendableFile(const std::string& path,
                           std::unique_ptr<WritableFile>* result) override {
    if (files_.find(path) == files_.end()) SetFile(path, "");
    *result = std::make_unique<AppendingFile>(files_[path].data);
    return Status::OK();
  }
  bool FileExists(const std::string& path) override { return files_.count(path) != 0; }
  Status GetChildren(const std::string& dir, std::vector<std::string>* names) override {
    names->clear();
    const std::string prefix = dir + "/";
    for (const auto& [path, file] : files_) {
      if (path.compare(0, prefix.size(), prefix) == 0) names->push_back(path.substr(prefix.size()));
    }
    return Status::OK();
  }
  Status RemoveFile(const std::string& path) override {
    return files_.erase(path) != 0 ? Status::OK() : Status::NotFound(path);
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    auto it = files_.find(from);
    if (it == files_.end()) return Status::NotFound(from);
    File f = it->second;
    files_.erase(it);
    files_[to] = f;
    return Status::OK();
  }
  Status CreateDirIfMissing(const std::string&) override { return Status::OK(); }
  Status RemoveDir(const std::string&) override { return Status::OK(); }
  Status GetFileSize(const std::string& path, uint64_t* size) override {
    const std::string* data = GetFile(path);
    if (data == nullptr) return Status::NotFound(path);
    *size = data->size();
    return Status::OK();
  }
  Status SyncDir(const std::string&) override { return Status::OK(); }
  Status LockFile(const std::string& path, std::unique_ptr<FileLock>*) override {
    return Status::NotSupported("MemoryEnv locks", path);
  }
  Status UnlockFile(std::unique_ptr<FileLock>) override { return Status::OK(); }
  uint64_t NowMicros() override { return 0; }

 private:
  struct File {
    std::shared_ptr<std::string> data;
    bool direct = false;
  };

  class ReadableFile final : public RandomAccessFile {
   public:
    explicit ReadableFile(File file) : file_(std::move(file)) {}
    Status Read(uint64_t offset, size_t n, char* scratch, size_t* bytes_read) const override {
      if (file_.direct && (offset % kDirectIoAlignment != 0 || n % kDirectIoAlignment != 0 ||
                           reinterpret_cast<uintptr_t>(scratch) % kDirectIoAlignment != 0)) {
        std::fprintf(stderr,
                     "MemoryEnv: unaligned read of a direct file (offset %llu, %zu bytes)\n",
                     static_cast<unsigned long long>(offset), n);
        std::abort();
      }
      const std::string& data = *file_.data;
      *bytes_read = 0;
      if (offset < data.size()) {
        *bytes_read = std::min<uint64_t>(n, data.size() - offset);
        std::memcpy(scratch, data.data() + offset, *bytes_read);
      }
      return Status::OK();
    }
    bool IsDirect() const override { return file_.direct; }
    uint64_t Size() const override { return file_.data->size(); }
    // A string has no holes: every byte up to the end is data.
    Status NextDataOffset(uint64_t offset, uint64_t* data) const override {
      *data = offset < file_.data->size() ? offset : kNoData;
      return Status::OK();
    }

   private:
    const File file_;
  };

  class AppendingFile final : public WritableFile {
   public:
    explicit AppendingFile(std::shared_ptr<std::string> data) : data_(std::move(data)) {}
    Status Append(const Slice& data) override {
      if (closed_) return Status::IOError("append to a closed file");
      data_->append(data.data(), data.size());
      return Status::OK();
    }
    Status Sync() override { return Status::OK(); }
    Status Close() override {
      closed_ = true;
      return Status::OK();
    }
    uint64_t Size() const override { return data_->size(); }

   private:
    std::shared_ptr<std::string> data_;
    bool closed_ = false;
  };

  std::map<std::string, File> files_;
};

}  // namespace kvengine::fuzz

#endif  // KVENGINE_TEST_FUZZ_MEMORY_ENV_H_
