// Env: kvengine's only way to the outside world (files, clocks), as in LevelDB/RocksDB.
//
// The engine never calls the operating system directly; it asks its Env.  Env::Default()
// is a PosixEnv (pread/pwrite, optional O_DIRECT).  Tests wrap an Env to inject faults.
//
// Thread-safety: an Env and the files it returns may be used from several threads at
// once unless a method says otherwise.  A WritableFile is used by one thread at a time.
#ifndef KVENGINE_ENV_H_
#define KVENGINE_ENV_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine {

struct FileOptions {
  // Open with O_DIRECT: offsets, lengths and buffers must then be aligned to
  // kDirectIoAlignment.  Where the file system refuses O_DIRECT the file is opened
  // buffered and IsDirect() reports false.
  bool use_direct_io = false;
};

// Alignment that O_DIRECT requires of offsets, lengths and buffer addresses.
inline constexpr size_t kDirectIoAlignment = 4096;

class RandomAccessFile;

// One read of a batch: fill `scratch[0, length)` from `offset` of `file`.  The Env sets
// `status` and `bytes_read`.
struct ReadRequest {
  const RandomAccessFile* file = nullptr;  // used by Env::MultiRead; ignored by the file's
  uint64_t offset = 0;
  size_t length = 0;
  char* scratch = nullptr;
  Status status;          // out
  size_t bytes_read = 0;  // out; less than length only at end of file
};

// A byte range of a file.
struct FileRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// True when `s` is a failure to open a file because the process (EMFILE) or the system
// (ENFILE) has no descriptor left.  Such a Status names the errno in its message.
bool IsTooManyOpenFiles(const Status& s);

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to n bytes at offset into scratch; *bytes_read < n only at end of file.
  virtual Status Read(uint64_t offset, size_t n, char* scratch, size_t* bytes_read) const = 0;
  // Reads every request; each gets its own status.  Returns the first error, if any.
  // The default issues the reads one by one; the io_uring Env submits them at once.
  virtual Status MultiRead(ReadRequest* requests, size_t count) const;
  virtual bool IsDirect() const { return false; }
  // With IsDirect(): the alignment a read's file offset, length and buffer address all
  // need (the larger of the file system's offset and memory alignments for O_DIRECT,
  // 512 on most devices).  4096 unless the file knows better: always safe.
  virtual uint64_t DirectIOAlignment() const { return kDirectIoAlignment; }
  virtual uint64_t Size() const = 0;
  // The operating system's descriptor of the file, or -1 when it has none (test Envs).
  virtual int FileDescriptor() const { return -1; }

  // What NextDataOffset stores when no data follows.
  static constexpr uint64_t kNoData = ~uint64_t{0};
  // Where data resumes at or after `offset`, for a caller that asks whether a range is
  // a hole (punched by Env::PunchHole) already: stores in *data the offset of the first
  // byte at or after `offset` that is not in a hole, or kNoData when only holes lie
  // between `offset` and the end of the file (or `offset` is past it).  May be called
  // while reads are in flight; it does not disturb them.
  //
  // A file that cannot tell (no hole support, no descriptor: the default) stores
  // `offset` itself: every byte counts as data, which is always safe -- the caller then
  // punches again what may be a hole already.  On an I/O error returns non-OK and
  // stores `offset`.
  virtual Status NextDataOffset(uint64_t offset, uint64_t* data) const {
    *data = offset;
    return Status::OK();
  }
};

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends data at the end.  With O_DIRECT the data size must be aligned except for
  // the last append before Close.
  virtual Status Append(const Slice& data) = 0;
  virtual Status Sync() = 0;
  // Closes the file; further calls fail.  Idempotent.
  virtual Status Close() = 0;
  virtual uint64_t Size() const = 0;
  virtual bool IsDirect() const { return false; }
  // The operating system's descriptor of the file, or -1 when it has none (test Envs).
  virtual int FileDescriptor() const { return -1; }
};

// A held lock on a file (the DB's LOCK).  Released by Env::UnlockFile.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide PosixEnv.  Never deleted.
  static Env* Default();

  virtual Status NewRandomAccessFile(const std::string& path, const FileOptions& options,
                                     std::unique_ptr<RandomAccessFile>* result) = 0;
  // Creates or truncates the file.
  virtual Status NewWritableFile(const std::string& path, const FileOptions& options,
                                 std::unique_ptr<WritableFile>* result) = 0;
  // Opens for appending, creating it if missing.
  virtual Status NewAppendableFile(const std::string& path,
                                   std::unique_ptr<WritableFile>* result) = 0;

  virtual bool FileExists(const std::string& path) = 0;
  // Names (not paths) of the entries of dir, without "." and "..".
  virtual Status GetChildren(const std::string& dir, std::vector<std::string>* names) = 0;
  virtual Status RemoveFile(const std::string& path) = 0;
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status CreateDirIfMissing(const std::string& dir) = 0;
  virtual Status RemoveDir(const std::string& dir) = 0;
  virtual Status GetFileSize(const std::string& path, uint64_t* size) = 0;
  // fsyncs a directory so that renames and creations in it are durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  // Gives the blocks of [offset, offset + length) of a file back to the filesystem; the
  // range then reads as zeros and the file keeps its size.  NotSupported where the
  // filesystem cannot (the default).
  virtual Status PunchHole(const std::string& path, uint64_t offset, uint64_t length) {
    (void)offset;
    (void)length;
    return Status::NotSupported("punching holes", path);
  }
  // Punches `count` ranges of one file as PunchHole does, opening it once for all of
  // them (the GC punches many small extents per bucket).  Stops at the first failure;
  // *punched: how many ranges, from the first, are holes now.  The default punches them
  // one by one.
  virtual Status PunchHoles(const std::string& path, const FileRange* ranges, size_t count,
                            size_t* punched);

  // Takes an exclusive advisory lock on path (creating it).  Busy if another process or
  // another DB in this process holds it.
  virtual Status LockFile(const std::string& path, std::unique_ptr<FileLock>* lock) = 0;
  virtual Status UnlockFile(std::unique_ptr<FileLock> lock) = 0;

  virtual uint64_t NowMicros() = 0;

  // The most descriptors this process may hold (RLIMIT_NOFILE's soft limit; UINT64_MAX
  // when unlimited) in *limit, and how many it holds now in *in_use.  The DB sizes its
  // own descriptor use from them at Open (env/descriptor_budget.h).  NotSupported where
  // the Env cannot tell (the default): the DB then uses its options as given.
  virtual Status GetDescriptorUse(uint64_t* limit, uint64_t* in_use) {
    *limit = *in_use = 0;
    return Status::NotSupported("descriptor limit");
  }

  // Called by MultiRead, on the calling thread, as each request completes (its status
  // and bytes_read final), in completion order.
  using ReadDone = std::function<void(size_t index)>;

  // Reads every request, each from its own file (possibly different files), and sets
  // each request's status.  Returns the first error, if any.  The default reads them one
  // by one; the io_uring Env submits the whole batch at once.  `on_done`, when set, is
  // called once per request as it completes, so that work on the values already read
  // (checksums, copies) overlaps the reads still in flight.
  Status MultiRead(ReadRequest* requests, size_t count) {
    return MultiRead(requests, count, nullptr);
  }
  virtual Status MultiRead(ReadRequest* requests, size_t count, const ReadDone& on_done);

  // An Env that does what `base` does but reads batches with io_uring and writes large
  // appends as parallel chunks.  Where the kernel refuses io_uring (or the build lacks
  // liburing) it returns nullptr and stores the reason in *why; the caller then keeps
  // `base`.  The result does not own `base`.
  static std::unique_ptr<Env> NewIoUringEnv(Env* base, std::string* why);
};

// Reads the whole file at `path` into *data (LevelDB's ReadFileToString): small files
// such as a directory's records.  NotFound when it does not exist.
Status ReadFileToString(Env* env, const std::string& path, std::string* data);

// Replaces dir/name with `data` so that a crash leaves the old file or the new one, never
// a mixture: written to dir/name.tmp, synced, renamed over dir/name, the directory
// synced.  On failure the temporary file is removed and the old file stays.
Status ReplaceFileAtomically(Env* env, const std::string& dir, const std::string& name,
                             const Slice& data);

// Told about memory that peers may need to reach directly (the RDMA transport registers
// each region with the NIC).  Implementations must be thread-safe.
class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;
  // `what` names the region for messages ("arena", "user buffer").  A failure makes the
  // DB::Open or RegisterBuffer that asked fail with the returned status.
  virtual Status Register(void* addr, size_t length, const char* what) = 0;
  virtual void Unregister(void* addr, size_t length) = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_ENV_H_
