#include "transport/unix_socket.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/hash.h"

namespace kvengine {

namespace {

Status SysError(const std::string& what, int err) {
  return Status::IOError(what, std::strerror(err));
}

// The sockaddr_un of a path.  One longer than sun_path (107 bytes: a DB in a deep
// directory) is reached through its directory, opened O_PATH and named
// /proc/self/fd/N/NAME: bind and connect resolve that like any path, so the socket file
// is the real one, and the path's length stops mattering.
class UnixAddress {
 public:
  UnixAddress() = default;
  UnixAddress(const UnixAddress&) = delete;
  UnixAddress& operator=(const UnixAddress&) = delete;
  ~UnixAddress() {
    if (dir_fd_ >= 0) close(dir_fd_);
  }

  Status Init(const std::string& path) {
    std::memset(&addr_, 0, sizeof(addr_));
    addr_.sun_family = AF_UNIX;
    if (path.empty()) return Status::InvalidArgument("unix socket path is empty");
    std::string name = path;
    if (path.size() >= sizeof(addr_.sun_path)) {
      const size_t slash = path.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
      dir_fd_ = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (dir_fd_ < 0) return SysError("open the directory of unix socket " + path, errno);
      name = "/proc/self/fd/" + std::to_string(dir_fd_) + "/" + path.substr(slash + 1);
    }
    if (name.size() >= sizeof(addr_.sun_path)) {
      return Status::InvalidArgument("unix socket path '" + path +
                                     "': its file name is longer than " +
                                     std::to_string(sizeof(addr_.sun_path) - 30) + " bytes");
    }
    std::memcpy(addr_.sun_path, name.data(), name.size());
    return Status::OK();
  }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&addr_); }
  socklen_t size() const { return sizeof(addr_); }

 private:
  sockaddr_un addr_;
  int dir_fd_ = -1;
};

Status ResolveGroup(const std::string& group, gid_t* gid) {
  char* end = nullptr;
  const unsigned long n = std::strtoul(group.c_str(), &end, 10);
  if (end != group.c_str() && *end == '\0') {
    *gid = static_cast<gid_t>(n);
    return Status::OK();
  }
  std::vector<char> buf(16384);
  struct group entry;
  struct group* found = nullptr;
  if (getgrnam_r(group.c_str(), &entry, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return Status::InvalidArgument("unknown group '" + group + "'");
  }
  *gid = found->gr_gid;
  return Status::OK();
}

Status WaitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return Status::IOError("timed out");
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (n > 0) return Status::OK();
    if (n < 0 && errno != EINTR) return SysError("poll", errno);
  }
}

}  // namespace

Status ListenUnix(const std::string& path, mode_t mode, const std::string& group, int* fd) {
  *fd = -1;
  UnixAddress addr;
  Status s = addr.Init(path);
  if (!s.ok()) return s;
  gid_t gid = 0;
  if (!group.empty()) {
    s = ResolveGroup(group, &gid);
    if (!s.ok()) return s;
  }
  // A socket file nobody listens on is the leftover of a dead owner: replace it.  A
  // listener whose queue is full (EAGAIN) is alive.
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (probe < 0) return SysError("socket", errno);
  const bool served = connect(probe, addr.get(), addr.size()) == 0 || errno == EAGAIN;
  close(probe);
  if (served) return Status::Busy("unix socket " + path, "another process is serving it");
  unlink(path.c_str());
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return SysError("socket", errno);
  // Bound with no permission for anyone, then opened up to `mode`: no window in which
  // another user could connect.
  const mode_t old_umask = umask(0777);
  const int bound = bind(sock, addr.get(), addr.size());
  const int bind_errno = errno;
  umask(old_umask);
  if (bound != 0) {
    close(sock);
    return SysError("bind " + path, bind_errno);
  }
  if ((!group.empty() && chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) ||
      chmod(path.c_str(), mode) != 0 || listen(sock, 128) != 0) {
    const int err = errno;
    close(sock);
    unlink(path.c_str());
    return SysError("setting up unix socket " + path, err);
  }
  *fd = sock;
  return Status::OK();
}

Status ConnectUnix(const std::string& path, Deadline deadline, int* fd) {
  *fd = -1;
  UnixAddress addr;
  Status s = addr.Init(path);
  if (!s.ok()) return s;
  // Blocking while it connects, non-blocking after.  A Unix socket's connect is never
  // "in progress": it is made at once, or -- the listener's queue of connections not
  // yet accepted is full -- fails with EAGAIN and leaves the socket unconnected.  A
  // non-blocking socket polled for POLLOUT after that EAGAIN looks ready, and its
  // first recvmsg fails with EINVAL (issue 30: clients flooding the owner's queue
  // broke other clients' attach).  A blocking connect instead waits in the kernel for
  // room in the queue, for at most the time left (SO_SNDTIMEO bounds it).
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return SysError("socket", errno);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) {
      s = Status::IOError("connect " + path,
                          "timed out: its queue of connections waiting to be accepted stayed full");
      break;
    }
    timeval wait{static_cast<time_t>(left.count() / 1000000),
                 static_cast<suseconds_t>(left.count() % 1000000)};
    if (setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait)) != 0) {
      s = SysError("SO_SNDTIMEO", errno);
      break;
    }
    if (connect(sock, addr.get(), addr.size()) == 0) break;
    if (errno != EAGAIN && errno != EINTR) {  // EAGAIN: the wait ran out; the loop decides
      s = SysError("connect", errno);
      break;
    }
  }
  const timeval forever{0, 0};
  if (s.ok() && (setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &forever, sizeof(forever)) != 0 ||
                 fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) | O_NONBLOCK) != 0)) {
    s = SysError("setting up the connection to " + path, errno);
  }
  if (!s.ok()) {
    close(sock);
    return s;
  }
  *fd = sock;
  return Status::OK();
}

Status PeerCredentials(int fd, uid_t* uid, pid_t* pid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return SysError("SO_PEERCRED", errno);
  }
  *uid = cred.uid;
  *pid = cred.pid;
  return Status::OK();
}

Status SendDescriptor(int fd, int fd_to_send, Deadline deadline) {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd_to_send >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd_to_send, sizeof(int));
  }
  for (;;) {
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n == 1) return Status::OK();
    if (n < 0 && errno != EAGAIN && errno != EINTR) return SysError("sendmsg", errno);
    Status s = WaitFor(fd, POLLOUT, deadline);
    if (!s.ok()) return s;
  }
}

Status ReceiveDescriptor(int fd, Deadline deadline, int* received) {
  *received = -1;
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  for (;;) {
    const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n == 1) break;
    if (n == 0) return Status::IOError("connection closed by peer");
    if (errno != EAGAIN && errno != EINTR) return SysError("recvmsg", errno);
    Status s = WaitFor(fd, POLLIN, deadline);
    if (!s.ok()) return s;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(received, CMSG_DATA(c), sizeof(int));
    }
  }
  return Status::OK();
}

Status ReadFrame(int fd, Deadline deadline, wire::FrameHeader* header, std::string* meta,
                 const std::atomic<bool>* stop) {
  char raw[wire::kHeaderSize];
  std::vector<iovec> iov{{raw, sizeof(raw)}};
  Status s = ReadFully(fd, &iov, deadline, nullptr, stop);
  if (!s.ok()) return s;
  s = wire::FrameHeader::DecodeFrom(raw, header);
  if (!s.ok()) return s;
  if (header->body_len != 0) return Status::Corruption("unexpected frame body");
  meta->assign(header->meta_len, '\0');
  Hasher64 hasher;
  hasher.Update(raw, 32);
  if (header->meta_len > 0) {
    iov.assign(1, iovec{meta->data(), meta->size()});
    s = ReadFully(fd, &iov, deadline, &hasher);
    if (!s.ok()) return s;
  }
  if (hasher.Digest() != header->checksum) return Status::Corruption("frame checksum mismatch");
  return Status::OK();
}

}  // namespace kvengine
