#include "env/fault_injection_env.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace kvengine {

namespace {

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  Status Append(const Slice& data) override {
    Status s = env_->MaybeFail(FaultInjectionEnv::Op::kWrite, "write " + path_);
    if (s.ok()) s = env_->ChargeSpace(data.size());
    if (s.ok()) s = base_->Append(data);
    return s;
  }
  Status Sync() override {
    Status s = env_->MaybeFail(FaultInjectionEnv::Op::kSync, "sync " + path_);
    if (s.ok()) s = base_->Sync();
    if (s.ok()) env_->RecordSynced(path_, base_->Size());
    return s;
  }
  Status Close() override { return base_->Close(); }
  uint64_t Size() const override { return base_->Size(); }
  bool IsDirect() const override { return base_->IsDirect(); }
  // Deliberately no descriptor: every write must pass through Append above.

 private:
  FaultInjectionEnv* const env_;
  const std::string path_;
  std::unique_ptr<WritableFile> base_;
};

class FaultRandomAccessFile final : public RandomAccessFile {
 public:
  FaultRandomAccessFile(FaultInjectionEnv* env, std::string path,
                        std::unique_ptr<RandomAccessFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  Status Read(uint64_t offset, size_t n, char* scratch, size_t* bytes_read) const override {
    Status s = env_->MaybeFail(FaultInjectionEnv::Op::kRead, "read " + path_);
    if (!s.ok()) {
      *bytes_read = 0;
      return s;
    }
    return base_->Read(offset, n, scratch, bytes_read);
  }
  bool IsDirect() const override { return base_->IsDirect(); }
  uint64_t DirectIOAlignment() const override { return base_->DirectIOAlignment(); }
  uint64_t Size() const override { return base_->Size(); }
  // Reads no data, so never a fault: the base file's holes are this file's.
  Status NextDataOffset(uint64_t offset, uint64_t* data) const override {
    return base_->NextDataOffset(offset, data);
  }

 private:
  FaultInjectionEnv* const env_;
  const std::string path_;
  std::unique_ptr<RandomAccessFile> base_;
};

}  // namespace

void FaultInjectionEnv::FailAfter(Op op, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  countdown_[static_cast<int>(op)] = n;
}

Status FaultInjectionEnv::MaybeFail(Op op, const std::string& what) {
  if (!active_ && op != Op::kRead) return Status::IOError("filesystem inactive", what);
  if (const int64_t delay = write_delay_us_.load(); delay > 0 && op != Op::kRead) {
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
  }
  std::lock_guard<std::mutex> lock(mu_);
  int& c = countdown_[static_cast<int>(op)];
  if (c > 0 && --c == 0) {
    injected_failures_++;
    return Status::IOError("injected fault", what);
  }
  return Status::OK();
}

Status FaultInjectionEnv::ChargeSpace(uint64_t bytes) {
  uint64_t before = bytes_written_.fetch_add(bytes);
  if (before + bytes > space_limit_.load()) {
    bytes_written_.fetch_sub(bytes);
    injected_failures_++;
    return Status::NoSpace("injected full disk");
  }
  return Status::OK();
}

void FaultInjectionEnv::RecordSynced(const std::string& path, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  FileState& f = files_[path];
  f.synced = size;
  f.ever_synced = true;
}

Status FaultInjectionEnv::NewRandomAccessFile(const std::string& path, const FileOptions& options,
                                              std::unique_ptr<RandomAccessFile>* result) {
  std::unique_ptr<RandomAccessFile> base;
  Status s = base_->NewRandomAccessFile(path, options, &base);
  if (s.ok()) *result = std::make_unique<FaultRandomAccessFile>(this, path, std::move(base));
  return s;
}

Status FaultInjectionEnv::NewWritableFile(const std::string& path, const FileOptions& options,
                                          std::unique_ptr<WritableFile>* result) {
  if (!active_) return Status::IOError("filesystem inactive", "create " + path);
  std::unique_ptr<WritableFile> base;
  Status s = base_->NewWritableFile(path, options, &base);
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    files_[path] = FileState();
  }
  *result = std::make_unique<FaultWritableFile>(this, path, std::move(base));
  return s;
}

Status FaultInjectionEnv::NewAppendableFile(const std::string& path,
                                            std::unique_ptr<WritableFile>* result) {
  std::unique_ptr<WritableFile> base;
  Status s = base_->NewAppendableFile(path, &base);
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (files_.count(path) == 0) files_[path] = FileState{base->Size(), true};
  }
  *result = std::make_unique<FaultWritableFile>(this, path, std::move(base));
  return s;
}

Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  if (!active_) return Status::IOError("filesystem inactive", "remove " + path);
  {
    std::lock_guard<std::mutex> lock(mu_);
    files_.erase(path);
  }
  return base_->RemoveFile(path);
}

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  if (!active_) return Status::IOError("filesystem inactive", "rename " + from);
  Status s = base_->RenameFile(from, to);
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(from);
    if (it != files_.end()) {
      files_[to] = it->second;
      files_.erase(it);
    } else {
      files_.erase(to);
    }
  }
  return s;
}

Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  Status s = MaybeFail(Op::kSync, "sync directory " + dir);
  if (!s.ok()) return s;
  return base_->SyncDir(dir);
}

Status FaultInjectionEnv::PunchHole(const std::string& path, uint64_t offset, uint64_t length) {
  if (!active_) return Status::IOError("filesystem inactive", "punch " + path);
  Status s = MaybeFail(Op::kWrite, "punch " + path);
  if (!s.ok()) return s;
  return base_->PunchHole(path, offset, length);
}

Status FaultInjectionEnv::DropUnsyncedData() {
  std::lock_guard<std::mutex> lock(mu_);
  Status first;
  for (auto it = files_.begin(); it != files_.end();) {
    const std::string& path = it->first;
    Status s;
    if (!it->second.ever_synced) {
      s = base_->RemoveFile(path);
      if (s.IsNotFound()) s = Status::OK();
      it = files_.erase(it);
    } else {
      if (::truncate(path.c_str(), static_cast<off_t>(it->second.synced)) != 0 && errno != ENOENT) {
        s = Status::IOError("truncate " + path, std::strerror(errno));
      }
      ++it;
    }
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace kvengine
