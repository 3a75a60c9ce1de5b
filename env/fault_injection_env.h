// FaultInjectionEnv: an Env wrapper for tests that fails chosen operations and simulates
// a crash, in the manner of LevelDB's fault-injection test Env.
//
//   * FailAfter(kind, n): the n-th next operation of that kind (write, sync, read)
//     fails with IOError, once.
//   * SetSpaceLimit(bytes): appends that would take the bytes written through this Env
//     past the limit fail with NoSpace.
//   * SetFilesystemActive(false): from now on nothing reaches the disk: writes, syncs,
//     renames, removals and punched holes fail with IOError (the moment of a power cut; the DB can
//     then be closed without its shutdown writes landing).
//   * SetWriteDelay(d): every write and sync first waits d (a slow or busy disk).
//   * DropUnsyncedData(): what a power cut does: every file written through this Env
//     loses what was appended after its last Sync, and files never synced disappear.
//
// Thread-safety: thread-safe.
#ifndef KVENGINE_ENV_FAULT_INJECTION_ENV_H_
#define KVENGINE_ENV_FAULT_INJECTION_ENV_H_

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "kvengine/env.h"

namespace kvengine {

class FaultInjectionEnv : public Env {
 public:
  enum class Op { kWrite, kSync, kRead };

  explicit FaultInjectionEnv(Env* base) : base_(base) {}

  void FailAfter(Op op, int n);
  void SetSpaceLimit(uint64_t bytes) { space_limit_ = bytes; }
  void SetFilesystemActive(bool active) { active_ = active; }
  void SetWriteDelay(std::chrono::microseconds delay) { write_delay_us_ = delay.count(); }
  Status DropUnsyncedData();
  uint64_t bytes_written() const { return bytes_written_; }
  int injected_failures() const { return injected_failures_; }

  // Used by the wrapped files.
  Status MaybeFail(Op op, const std::string& what);
  Status ChargeSpace(uint64_t bytes);
  void RecordSynced(const std::string& path, uint64_t size);

  Status NewRandomAccessFile(const std::string& path, const FileOptions& options,
                             std::unique_ptr<RandomAccessFile>* result) override;
  Status NewWritableFile(const std::string& path, const FileOptions& options,
                         std::unique_ptr<WritableFile>* result) override;
  Status NewAppendableFile(const std::string& path, std::unique_ptr<WritableFile>* result) override;
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  Status GetChildren(const std::string& dir, std::vector<std::string>* names) override {
    return base_->GetChildren(dir, names);
  }
  Status RemoveFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status CreateDirIfMissing(const std::string& dir) override {
    return base_->CreateDirIfMissing(dir);
  }
  Status RemoveDir(const std::string& dir) override { return base_->RemoveDir(dir); }
  Status GetFileSize(const std::string& path, uint64_t* size) override {
    return base_->GetFileSize(path, size);
  }
  Status SyncDir(const std::string& dir) override;
  // Counts as a write.
  Status PunchHole(const std::string& path, uint64_t offset, uint64_t length) override;
  Status LockFile(const std::string& path, std::unique_ptr<FileLock>* lock) override {
    return base_->LockFile(path, lock);
  }
  Status UnlockFile(std::unique_ptr<FileLock> lock) override {
    return base_->UnlockFile(std::move(lock));
  }
  uint64_t NowMicros() override { return base_->NowMicros(); }
  Status GetDescriptorUse(uint64_t* limit, uint64_t* in_use) override {
    return base_->GetDescriptorUse(limit, in_use);
  }

 private:
  struct FileState {
    uint64_t synced = 0;       // bytes known durable
    bool ever_synced = false;  // a file never synced vanishes in a crash
  };

  Env* const base_;
  std::mutex mu_;
  std::map<std::string, FileState> files_;  // written through this Env, by current path
  int countdown_[3] = {0, 0, 0};            // 0: no failure armed
  std::atomic<uint64_t> space_limit_{UINT64_MAX};
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<int> injected_failures_{0};
  std::atomic<bool> active_{true};
  std::atomic<int64_t> write_delay_us_{0};
};

}  // namespace kvengine

#endif  // KVENGINE_ENV_FAULT_INJECTION_ENV_H_
