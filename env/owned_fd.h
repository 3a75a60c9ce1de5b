// OwnedFd: a file descriptor this process owns -- a socket it opened, or a memfd another
// process passed it -- closed when the OwnedFd goes.  Move-only.
#ifndef KVENGINE_ENV_OWNED_FD_H_
#define KVENGINE_ENV_OWNED_FD_H_

#include <unistd.h>

namespace kvengine {

class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd() { Reset(); }
  OwnedFd(OwnedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      Reset(other.fd_);
      other.fd_ = -1;
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;

  // The descriptor, or -1 when none is held.
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor held, if any, and holds `fd` instead.
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace kvengine

#endif  // KVENGINE_ENV_OWNED_FD_H_
