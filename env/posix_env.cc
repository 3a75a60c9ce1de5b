// PosixEnv: files through pread/pwrite, optionally O_DIRECT.
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "env/multi_read.h"
#include "kvengine/env.h"
#include "util/perf_point.h"

namespace kvengine {

namespace {

Status PosixError(const std::string& context, int err) {
  std::string msg = context + ": " + std::strerror(err);
  if (err == ENOENT) return Status::NotFound(msg);
  if (err == ENOSPC || err == EDQUOT) return Status::NoSpace(msg);
  if (err == EMFILE) return Status::IOError(msg + " (EMFILE: the process's descriptor limit)");
  if (err == ENFILE) return Status::IOError(msg + " (ENFILE: the system's descriptor limit)");
  return Status::IOError(msg);
}

Status PunchError(const std::string& path, int err) {
  if (err == EOPNOTSUPP || err == ENOSYS) {
    return Status::NotSupported("punching holes", path + ": " + std::strerror(err));
  }
  return PosixError("punch a hole in " + path, err);
}

// The alignment O_DIRECT reads of fd need: statx's STATX_DIOALIGN (Linux 6.1+, on file
// systems that report it), else the page size, which every O_DIRECT file accepts.
uint64_t DirectIOAlignmentOf(int fd) {
  constexpr uint64_t kSafe = kDirectIoAlignment;
  struct statx stx;
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0 ||
      (stx.stx_mask & STATX_DIOALIGN) == 0 || stx.stx_dio_offset_align == 0 ||
      stx.stx_dio_mem_align == 0) {
    return kSafe;
  }
  const uint64_t align = std::max<uint64_t>(stx.stx_dio_offset_align, stx.stx_dio_mem_align);
  // A power of two of at least 512 is what the readers plan with; anything else is odd
  // enough to distrust.
  if (align < 512 || (align & (align - 1)) != 0) return kSafe;
  return align;
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, bool direct, uint64_t size)
      : path_(std::move(path)),
        fd_(fd),
        direct_(direct),
        size_(size),
        direct_alignment_(direct ? DirectIOAlignmentOf(fd) : kDirectIoAlignment) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Status Read(uint64_t offset, size_t n, char* scratch, size_t* bytes_read) const override {
    PerfPoint perf(PerfKey::env_file_read);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, scratch + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        *bytes_read = done;
        return PosixError("read " + path_ + " at " + std::to_string(offset + done), errno);
      }
      if (r == 0) break;  // end of file
      done += static_cast<size_t>(r);
    }
    *bytes_read = done;
    return Status::OK();
  }
  bool IsDirect() const override { return direct_; }
  uint64_t DirectIOAlignment() const override { return direct_alignment_; }
  uint64_t Size() const override { return size_; }
  int FileDescriptor() const override { return fd_; }
  Status NextDataOffset(uint64_t offset, uint64_t* data) const override {
    // lseek moves the descriptor's position, which no read uses: they are pread's.
    const off_t found = ::lseek(fd_, static_cast<off_t>(offset), SEEK_DATA);
    if (found >= 0) {
      // A filesystem without hole support reports the offset itself.
      *data = static_cast<uint64_t>(found);
      return Status::OK();
    }
    const int err = errno;
    if (err == ENXIO) {  // only holes up to the end of the file, or past it
      *data = kNoData;
      return Status::OK();
    }
    *data = offset;
    return PosixError("seek data in " + path_ + " from " + std::to_string(offset), err);
  }

 private:
  const std::string path_;
  const int fd_;
  const bool direct_;
  const uint64_t size_;
  const uint64_t direct_alignment_;
};

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, bool direct, uint64_t size)
      : path_(std::move(path)), fd_(fd), direct_(direct), size_(size) {}
  ~PosixWritableFile() override { Close(); }

  Status Append(const Slice& data) override {
    if (fd_ < 0) return Status::IOError("append to closed file " + path_);
    PerfPoint perf(PerfKey::env_file_write);
    size_t done = 0;
    while (done < data.size()) {
      ssize_t r =
          ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(size_ + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return PosixError("write " + path_, errno);
      }
      done += static_cast<size_t>(r);
    }
    size_ += done;
    return Status::OK();
  }
  Status Sync() override {
    if (fd_ < 0) return Status::IOError("sync of closed file " + path_);
    PerfPoint perf(PerfKey::env_file_sync);
    if (::fdatasync(fd_) != 0) return PosixError("sync " + path_, errno);
    return Status::OK();
  }
  Status Close() override {
    if (fd_ < 0) return Status::OK();
    int r = ::close(fd_);
    fd_ = -1;
    if (r != 0) return PosixError("close " + path_, errno);
    return Status::OK();
  }
  uint64_t Size() const override { return size_; }
  bool IsDirect() const override { return direct_; }
  int FileDescriptor() const override { return fd_; }

 private:
  const std::string path_;
  int fd_;
  const bool direct_;
  uint64_t size_;
};

class PosixFileLock final : public FileLock {
 public:
  PosixFileLock(int fd, std::string path) : fd(fd), path(std::move(path)) {}
  int fd;
  std::string path;
};

// fcntl locks do not exclude other opens within one process, so this set does.
std::mutex locked_paths_mu;
std::set<std::string> locked_paths;

class PosixEnv final : public Env {
 public:
  Status NewRandomAccessFile(const std::string& path, const FileOptions& options,
                             std::unique_ptr<RandomAccessFile>* result) override {
    result->reset();
    bool direct = options.use_direct_io;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0 && direct && errno == EINVAL) {  // file system without O_DIRECT
      direct = false;
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) return PosixError("open " + path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return PosixError("stat " + path, err);
    }
    if (!S_ISREG(st.st_mode)) {  // a directory opens, then fails every read
      ::close(fd);
      return Status::InvalidArgument(path, "not a regular file");
    }
    *result = std::make_unique<PosixRandomAccessFile>(path, fd, direct,
                                                      static_cast<uint64_t>(st.st_size));
    return Status::OK();
  }

  Status NewWritableFile(const std::string& path, const FileOptions& options,
                         std::unique_ptr<WritableFile>* result) override {
    result->reset();
    bool direct = options.use_direct_io;
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    int fd = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
      direct = false;
      fd = ::open(path.c_str(), flags, 0644);
    }
    if (fd < 0) return PosixError("create " + path, errno);
    *result = std::make_unique<PosixWritableFile>(path, fd, direct, 0);
    return Status::OK();
  }

  Status NewAppendableFile(const std::string& path,
                           std::unique_ptr<WritableFile>* result) override {
    result->reset();
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("open " + path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return PosixError("stat " + path, err);
    }
    *result =
        std::make_unique<PosixWritableFile>(path, fd, false, static_cast<uint64_t>(st.st_size));
    return Status::OK();
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  Status GetChildren(const std::string& dir, std::vector<std::string>* names) override {
    names->clear();
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("list " + dir, errno);
    while (struct dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names->emplace_back(e->d_name);
    }
    ::closedir(d);
    return Status::OK();
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("remove " + path, errno);
    return Status::OK();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError("rename " + from + " to " + to, errno);
    }
    return Status::OK();
  }

  Status CreateDirIfMissing(const std::string& dir) override {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return PosixError("create directory " + dir, errno);
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return PosixError("stat " + dir, errno);
    if (!S_ISDIR(st.st_mode))
      return Status::InvalidArgument(dir + " exists and is not a directory");
    return Status::OK();
  }

  Status RemoveDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return PosixError("remove directory " + dir, errno);
    return Status::OK();
  }

  Status GetFileSize(const std::string& path, uint64_t* size) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      *size = 0;
      return PosixError("stat " + path, errno);
    }
    *size = static_cast<uint64_t>(st.st_size);
    return Status::OK();
  }

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError("open directory " + dir, errno);
    PerfPoint perf(PerfKey::env_file_sync);
    int r = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (r != 0) return PosixError("sync directory " + dir, err);
    return Status::OK();
  }

  Status PunchHole(const std::string& path, uint64_t offset, uint64_t length) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open " + path, errno);
    int r = ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                        static_cast<off_t>(length));
    int err = errno;
    ::close(fd);
    if (r == 0) return Status::OK();
    return PunchError(path, err);
  }

  Status PunchHoles(const std::string& path, const FileRange* ranges, size_t count,
                    size_t* punched) override {
    *punched = 0;
    if (count == 0) return Status::OK();
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open " + path, errno);
    Status s;
    for (; *punched < count; ++*punched) {
      const FileRange& r = ranges[*punched];
      if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.offset),
                      static_cast<off_t>(r.length)) != 0) {
        s = PunchError(path, errno);
        break;
      }
    }
    ::close(fd);
    return s;
  }

  Status LockFile(const std::string& path, std::unique_ptr<FileLock>* lock) override {
    lock->reset();
    std::lock_guard<std::mutex> guard(locked_paths_mu);
    if (locked_paths.count(path) != 0) {
      return Status::Busy("lock " + path + ": already held by this process");
    }
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("open lock file " + path, errno);
    struct flock fl;
    std::memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (::fcntl(fd, F_SETLK, &fl) != 0) {
      int err = errno;
      ::close(fd);
      if (err == EACCES || err == EAGAIN) {
        return Status::Busy("lock " + path + ": held by another process");
      }
      return PosixError("lock " + path, err);
    }
    locked_paths.insert(path);
    *lock = std::make_unique<PosixFileLock>(fd, path);
    return Status::OK();
  }

  Status UnlockFile(std::unique_ptr<FileLock> lock) override {
    auto* posix_lock = static_cast<PosixFileLock*>(lock.get());
    if (posix_lock == nullptr) return Status::InvalidArgument("UnlockFile of a null lock");
    std::lock_guard<std::mutex> guard(locked_paths_mu);
    locked_paths.erase(posix_lock->path);
    ::close(posix_lock->fd);  // closing drops the fcntl lock
    return Status::OK();
  }

  uint64_t NowMicros() override {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
  }

  Status GetDescriptorUse(uint64_t* limit, uint64_t* in_use) override {
    *limit = *in_use = 0;
    struct rlimit rl;
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return PosixError("getrlimit(RLIMIT_NOFILE)", errno);
    *limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur);
    // The entries of /proc/self/fd, less the one listing them.
    DIR* d = ::opendir("/proc/self/fd");
    if (d == nullptr) return PosixError("opendir /proc/self/fd", errno);
    uint64_t n = 0;
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') n++;
    }
    ::closedir(d);
    *in_use = n > 0 ? n - 1 : 0;
    return Status::OK();
  }
};

}  // namespace

Status RandomAccessFile::MultiRead(ReadRequest* requests, size_t count) const {
  Status first;
  for (size_t i = 0; i < count; i++) {
    ReadRequest& r = requests[i];
    r.status = Read(r.offset, r.length, r.scratch, &r.bytes_read);
    if (!r.status.ok() && first.ok()) first = r.status;
  }
  return first;
}

void ReadOne(ReadRequest* r) {
  r->status = r->file != nullptr ? r->file->Read(r->offset, r->length, r->scratch, &r->bytes_read)
                                 : Status::InvalidArgument("MultiRead request without a file");
}

Status FirstError(const ReadRequest* requests, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (!requests[i].status.ok()) return requests[i].status;
  }
  return Status::OK();
}

Status Env::MultiRead(ReadRequest* requests, size_t count, const ReadDone& on_done) {
  for (size_t i = 0; i < count; i++) {
    ReadOne(&requests[i]);
    if (on_done) on_done(i);
  }
  return FirstError(requests, count);
}

Status Env::PunchHoles(const std::string& path, const FileRange* ranges, size_t count,
                       size_t* punched) {
  for (*punched = 0; *punched < count; ++*punched) {
    Status s = PunchHole(path, ranges[*punched].offset, ranges[*punched].length);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

bool IsTooManyOpenFiles(const Status& s) {
  if (!s.IsIOError()) return false;
  const std::string text = s.ToString();
  return text.find("(EMFILE") != std::string::npos || text.find("(ENFILE") != std::string::npos;
}

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv;
  return env;
}

}  // namespace kvengine
