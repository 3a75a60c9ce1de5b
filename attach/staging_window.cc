#include "attach/staging_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvengine {

Status StagingWindow::Create(std::unique_ptr<StagingWindow>* window, int* memfd) {
  const int fd = memfd_create("kvengine-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::IOError("memfd_create for a staging window", std::strerror(errno));
  void* p = MAP_FAILED;
  // Sealed: the client cannot shrink it under the owner's writes (SIGBUS).
  if (ftruncate(fd, static_cast<off_t>(kBytes)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    const int saved = errno;
    close(fd);
    return Status::IOError("cannot set up a staging window", std::strerror(saved));
  }
  window->reset(new StagingWindow(static_cast<char*>(p)));
  *memfd = fd;
  return Status::OK();
}

StagingWindow::~StagingWindow() { munmap(base_, kBytes); }

bool StagingWindow::Take(uint64_t n, uint64_t* offset) {
  if (n > kBytes - used_) return false;
  *offset = used_;
  used_ += n;
  held_++;
  touched_ = true;
  return true;
}

void StagingWindow::Release() {
  if (held_ == 0 || --held_ > 0) return;
  used_ = 0;
  emptied_ = Clock::now();
}

void StagingWindow::ReleaseIfIdle() {
  if (!touched_ || held_ > 0 || Clock::now() - emptied_ < kIdleRelease) return;
  // The memfd's pages go; the mappings stay, and read zeros until written again.
  madvise(base_, kBytes, MADV_REMOVE);
  touched_ = false;
}

}  // namespace kvengine
