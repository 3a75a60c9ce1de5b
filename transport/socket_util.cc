#include "transport/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "transport/wire.h"
#include "util/hash.h"

namespace kvengine {

namespace {

int MillisLeft(Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

Status Errno(const std::string& what, int err) {
  return Status::IOError(what + ": " + std::strerror(err));
}

// Advances iov past n bytes.
void Consume(std::vector<iovec>* iov, size_t* first, size_t n) {
  while (n > 0 && *first < iov->size()) {
    iovec& v = (*iov)[*first];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      v.iov_len = 0;
      (*first)++;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
  while (*first < iov->size() && (*iov)[*first].iov_len == 0) (*first)++;
}

Status Resolve(const Endpoint& ep, sockaddr_storage* addr, socklen_t* len) {
  std::vector<sockaddr_storage> all;
  Status s = ResolveAll(ep, &all);
  if (!s.ok()) return s;
  *addr = all[0];
  *len = all[0].ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  return Status::OK();
}

}  // namespace

Status ResolveAll(const Endpoint& ep, std::vector<sockaddr_storage>* out) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(ep.port);
  const std::string host = ep.host.empty() ? "127.0.0.1" : ep.host;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::IOError("cannot resolve " + ep.ToString() + ": " + gai_strerror(rc));
  }
  out->clear();
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    sockaddr_storage addr;
    std::memset(&addr, 0, sizeof(addr));
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    out->push_back(addr);
  }
  freeaddrinfo(res);
  if (out->empty()) return Status::IOError("cannot resolve " + ep.ToString() + ": no address");
  return Status::OK();
}

bool IsLoopbackAddress(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

bool PeerIsLoopback(int fd) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && IsLoopbackAddress(addr);
}

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int bytes = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

Status ConnectTcp(const Endpoint& peer, Deadline deadline, int* fd) {
  *fd = -1;
  sockaddr_storage addr;
  socklen_t len = 0;
  Status s = Resolve(peer, &addr, &len);
  if (!s.ok()) return s;
  int sock = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return Errno("socket", errno);
  TuneSocket(sock);
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno != EINPROGRESS) {
      const int err = errno;
      close(sock);
      return Errno("connect to " + peer.ToString(), err);
    }
    pollfd p{sock, POLLOUT, 0};
    int rc;
    do {
      rc = poll(&p, 1, MillisLeft(deadline));
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      close(sock);
      return Status::IOError("connect to " + peer.ToString() + ": timed out");
    }
    int err = 0;
    socklen_t elen = sizeof(err);
    getsockopt(sock, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (rc < 0 || err != 0) {
      close(sock);
      return Errno("connect to " + peer.ToString(), rc < 0 ? errno : err);
    }
  }
  *fd = sock;
  return Status::OK();
}

Status ListenTcp(const Endpoint& at, int* fd, uint16_t* port, int backlog) {
  sockaddr_storage addr;
  socklen_t len = 0;
  Status s = Resolve(at, &addr, &len);
  if (!s.ok()) return s;
  int sock = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return Errno("socket", errno);
  int one = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(sock, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(sock, backlog) != 0) {
    const int err = errno;
    close(sock);
    return Errno("listen on " + at.ToString(), err);
  }
  sockaddr_storage bound;
  socklen_t blen = sizeof(bound);
  getsockname(sock, reinterpret_cast<sockaddr*>(&bound), &blen);
  *port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  *fd = sock;
  return Status::OK();
}

Status WaitReadable(int fd, Deadline deadline) {
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = poll(&p, 1, MillisLeft(deadline));
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return Errno("poll", errno);
  if (rc == 0) return Status::IOError("timed out");
  return Status::OK();
}

namespace {

// Encodes a frame's header, checksum included, into `header` and gathers the header,
// `meta` and the body parts into *iov.
void GatherFrame(uint8_t op, uint16_t flags, uint64_t request_id, std::string_view meta,
                 std::span<const Slice> body, char* header, std::vector<iovec>* iov) {
  wire::EncodeFrameHeader(op, flags, request_id, meta, body, header);
  iov->reserve(2 + body.size());
  iov->push_back({header, wire::kHeaderSize});
  if (!meta.empty()) iov->push_back({const_cast<char*>(meta.data()), meta.size()});
  for (const Slice& b : body) {
    if (b.size() > 0) iov->push_back({const_cast<char*>(b.data()), b.size()});
  }
}

// Writes what the socket takes of (*iov)[*first...] without waiting (MSG_DONTWAIT: never
// blocks, whatever the descriptor's mode), advancing *first and the iovecs.  OK when
// everything went or the socket is full.
// *sent (when given) grows by the bytes written.
Status WriteSome(int fd, std::vector<iovec>* iov, size_t* first, uint64_t* sent = nullptr) {
  while (*first < iov->size()) {
    const int count = static_cast<int>(std::min<size_t>(iov->size() - *first, IOV_MAX));
    msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov->data() + *first;
    msg.msg_iovlen = count;
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      Consume(iov, first, static_cast<size_t>(n));
      if (sent != nullptr) *sent += static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::OK();
    return Errno("send", n < 0 ? errno : EPIPE);
  }
  return Status::OK();
}

// WriteSome until everything went, waiting for room until `deadline`.
Status WriteBy(int fd, std::vector<iovec>* iov, size_t* first, Deadline deadline) {
  for (;;) {
    Status s = WriteSome(fd, iov, first);
    if (!s.ok() || *first >= iov->size()) return s;
    pollfd p{fd, POLLOUT, 0};
    const int rc = poll(&p, 1, MillisLeft(deadline));
    if (rc == 0) return Status::IOError("send timed out");
    if (rc < 0 && errno != EINTR) return Errno("poll", errno);
  }
}

}  // namespace

Status SendFrame(int fd, uint8_t op, uint16_t flags, uint64_t request_id, const std::string& meta,
                 std::span<const Slice> body, Deadline deadline) {
  char header[wire::kHeaderSize];
  std::vector<iovec> iov;
  GatherFrame(op, flags, request_id, meta, body, header, &iov);
  return WriteFully(fd, &iov, deadline);
}

Status WriteFully(int fd, std::vector<iovec>* iov, Deadline deadline) {
  size_t first = 0;
  Consume(iov, &first, 0);
  return WriteBy(fd, iov, &first, deadline);
}

OutFrame::OutFrame(uint8_t op, uint16_t flags, uint64_t request_id, std::string meta,
                   std::span<const Slice> body)
    : meta_(std::move(meta)) {
  GatherFrame(op, flags, request_id, meta_, body, header_, &iov_);
  for (const iovec& v : iov_) left_ += v.iov_len;
}

Status OutFrame::WriteAvailable(int fd) {
  uint64_t sent = 0;
  Status s = WriteSome(fd, &iov_, &first_, &sent);
  left_ -= sent;
  return s;
}

Status OutFrame::WriteAvailable(int fd, std::span<OutFrame* const> frames) {
  std::vector<iovec> iov;
  for (;;) {
    iov.clear();
    size_t want = 0;
    for (const OutFrame* f : frames) {
      for (size_t i = f->first_; i < f->iov_.size() && iov.size() < IOV_MAX; i++) {
        iov.push_back(f->iov_[i]);
        want += f->iov_[i].iov_len;
      }
    }
    if (iov.empty()) return Status::OK();
    msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov.data();
    msg.msg_iovlen = iov.size();
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::OK();
    if (n <= 0) return Errno("send", n < 0 ? errno : EPIPE);
    // Hands the bytes written back to the frames they came from, in order.
    uint64_t sent = static_cast<uint64_t>(n);
    for (size_t i = 0; i < frames.size() && sent > 0; i++) {
      OutFrame* f = frames[i];
      const uint64_t k = std::min<uint64_t>(sent, f->left_);
      Consume(&f->iov_, &f->first_, static_cast<size_t>(k));
      f->left_ -= k;
      sent -= k;
    }
    if (static_cast<size_t>(n) < want) return Status::OK();  // the socket is full
  }
}

namespace {

// Feeds the first n bytes of iov[first...] to hasher.
void HashRead(const std::vector<iovec>& iov, size_t first, size_t n, Hasher64* hasher) {
  if (hasher == nullptr) return;
  for (size_t i = first; n > 0; i++) {
    const size_t k = std::min(n, iov[i].iov_len);
    hasher->Update(iov[i].iov_base, k);
    n -= k;
  }
}

}  // namespace

Status ReadFully(int fd, std::vector<iovec>* iov, Deadline deadline, Hasher64* hasher,
                 const std::atomic<bool>* stop) {
  size_t first = 0;
  Consume(iov, &first, 0);
  bool any = false;
  while (first < iov->size()) {
    const int count = static_cast<int>(std::min<size_t>(iov->size() - first, IOV_MAX));
    ssize_t n = readv(fd, iov->data() + first, count);
    if (n > 0) {
      any = true;
      HashRead(*iov, first, static_cast<size_t>(n), hasher);
      Consume(iov, &first, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return Status::IOError("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("recv", errno);
    // Nothing to read yet: wait in slices so a stopping server notices.
    for (;;) {
      if (!any && stop != nullptr && stop->load()) return Status::Aborted("stopping");
      Deadline slice = SteadyClock::now() + std::chrono::milliseconds(100);
      if (slice > deadline) slice = deadline;
      Status s = WaitReadable(fd, slice);
      if (s.ok()) break;
      if (SteadyClock::now() >= deadline) return Status::IOError("receive timed out");
    }
  }
  return Status::OK();
}

namespace {

// A read that must wait for at least kLowWaterMin more bytes asks to be woken only once
// that many, up to kLowWaterMax, are in (SO_RCVLOWAT).  Without it the reader of a
// 4 MiB answer over loopback woke about 14 times, once per few skbs, each wake-up
// costing more (tens of microseconds on a VM) than copying what it brought; with it,
// about 4.  Not all of the rest at once: the reader copies while the sender still sends.
constexpr size_t kLowWaterMin = 64 << 10;
constexpr size_t kLowWaterMax = 1 << 20;

}  // namespace

void ReadAhead::TakeBuffered(std::vector<iovec>* iov, size_t* first, Hasher64* hasher) {
  while (*first < iov->size() && begin_ < end_) {
    const size_t k = std::min((*iov)[*first].iov_len, end_ - begin_);
    std::memcpy((*iov)[*first].iov_base, buf_ + begin_, k);
    if (hasher != nullptr) hasher->Update(buf_ + begin_, k);
    begin_ += k;
    Consume(iov, first, k);
  }
  if (begin_ == end_) begin_ = end_ = 0;
}

void ReadAhead::SetLowWater(size_t bytes) {
  if (bytes == low_water_) return;
  const int v = static_cast<int>(bytes);
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0) low_water_ = bytes;
}

Status ReadAhead::Read(std::vector<iovec>* iov, Deadline deadline, Hasher64* hasher) {
  Status s = ReadWaking(iov, deadline, hasher);
  // The next wait may be for a small frame: wake on its first byte again.
  SetLowWater(1);
  return s;
}

Status ReadAhead::ReadWaking(std::vector<iovec>* iov, Deadline deadline, Hasher64* hasher) {
  size_t first = 0;
  Consume(iov, &first, 0);
  TakeBuffered(iov, &first, hasher);
  while (first < iov->size()) {
    // The buffer is empty here (TakeBuffered drained it, or iov would be done).  It
    // goes after the last of iov's vectors, when they all fit one readv.
    const size_t count = std::min<size_t>(iov->size() - first, IOV_MAX - 1);
    const bool ahead = first + count == iov->size();
    batch_.assign(iov->begin() + static_cast<ptrdiff_t>(first),
                  iov->begin() + static_cast<ptrdiff_t>(first + count));
    size_t want = 0;
    for (const iovec& v : batch_) want += v.iov_len;
    if (ahead) batch_.push_back({buf_, kBytes});
    const ssize_t n = readv(fd_, batch_.data(), static_cast<int>(batch_.size()));
    if (n > 0) {
      const size_t got = std::min(static_cast<size_t>(n), want);
      HashRead(*iov, first, got, hasher);
      Consume(iov, &first, got);
      end_ = static_cast<size_t>(n) - got;  // read ahead: the next bytes of the stream
      continue;
    }
    if (n == 0) return Status::IOError("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("recv", errno);
    // Never more than what is still due (the sender may send nothing after it); the
    // kernel wakes the reader anyway when the peer closes, the receive window is nearly
    // shut or memory runs short (tcp_epollin_ready), so a large mark cannot stall it.
    SetLowWater(want >= kLowWaterMin ? std::min(want, kLowWaterMax) : 1);
    Status s = WaitReadable(fd_, deadline);
    if (!s.ok()) return Status::IOError("receive " + s.message());  // "receive timed out"
  }
  return Status::OK();
}

}  // namespace kvengine
