// Non-blocking socket I/O with deadlines, shared by the TCP client and server.
#ifndef KVENGINE_TRANSPORT_SOCKET_UTIL_H_
#define KVENGINE_TRANSPORT_SOCKET_UTIL_H_

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "kvengine/transport.h"
#include "transport/wire.h"

namespace kvengine {

class Hasher64;

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

inline Deadline DeadlineIn(uint64_t ms) {
  return SteadyClock::now() + std::chrono::milliseconds(ms);
}

// Every IPv4/IPv6 address `ep`'s host resolves to (an empty host: 127.0.0.1), in
// getaddrinfo's order.  IOError naming the endpoint when there is none.
Status ResolveAll(const Endpoint& ep, std::vector<sockaddr_storage>* out);
// True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104.
bool IsLoopbackAddress(const sockaddr_storage& addr);
// True when connected socket fd's peer address is a loopback one.
bool PeerIsLoopback(int fd);

// Connects a non-blocking TCP socket (TCP_NODELAY, large buffers) to `peer` by `deadline`.
Status ConnectTcp(const Endpoint& peer, Deadline deadline, int* fd);
// Binds and listens (non-blocking, SO_REUSEADDR) with a queue of `backlog` connections
// not yet accepted (the kernel caps it at net.core.somaxconn); port 0 picks one, stored
// in *port.
Status ListenTcp(const Endpoint& at, int* fd, uint16_t* port, int backlog = 512);

// Writes every byte of iov by `deadline`.  `iov` is consumed.  IOError on a closed
// socket or the deadline.
Status WriteFully(int fd, std::vector<iovec>* iov, Deadline deadline);
// Writes one frame (wire.h): a header with `op`, `flags` and `request_id` and the frame's
// checksum, then `meta`, then the body parts, in one gathered write.
Status SendFrame(int fd, uint8_t op, uint16_t flags, uint64_t request_id, const std::string& meta,
                 std::span<const Slice> body, Deadline deadline);

// One frame on its way out, encoded once and written in as many pieces as the socket
// takes, never waiting: a server queues its answers as OutFrames and writes more of them
// whenever the socket has room (transport/server.h).  The body's bytes are not copied:
// they must stay valid until the frame is written or dropped.
class OutFrame {
 public:
  OutFrame(uint8_t op, uint16_t flags, uint64_t request_id, std::string meta,
           std::span<const Slice> body);
  OutFrame(const OutFrame&) = delete;
  OutFrame& operator=(const OutFrame&) = delete;

  // Writes what the socket takes without waiting.  IOError on a closed socket.
  Status WriteAvailable(int fd);
  // As WriteAvailable for `frames`, in order, in as few system calls as their pieces
  // allow (a server's answers queued together go in one sendmsg, not one each).
  static Status WriteAvailable(int fd, std::span<OutFrame* const> frames);
  bool done() const { return first_ >= iov_.size(); }
  // Bytes not written yet.
  uint64_t left() const { return left_; }

 private:
  char header_[wire::kHeaderSize];
  const std::string meta_;
  std::vector<iovec> iov_;
  size_t first_ = 0;  // iov_[first_] is the next to write
  uint64_t left_ = 0;
};
// Reads exactly the bytes of iov by `deadline`, feeding them to `hasher` (may be null).
// `stop`, when set and true while no byte has been read yet, gives up with Aborted.
// IOError naming "closed" when the peer closed the connection.
Status ReadFully(int fd, std::vector<iovec>* iov, Deadline deadline, Hasher64* hasher,
                 const std::atomic<bool>* stop = nullptr);
// Waits until fd is readable (or hung up) by deadline: OK, or IOError on timeout.
Status WaitReadable(int fd, Deadline deadline);

// Reads a connection's incoming frames in as few system calls as their bytes allow:
// each read offers, after the bytes asked for, a small buffer for whatever follows, so
// that a frame's header, its metadata and the start of its body (or a whole small
// frame) come in one read, and what was read ahead is handed out first next time.  The
// bytes asked for still land straight in their place.  A read waiting for much more
// (64 KiB or over) asks the kernel to wake it only once up to 1 MiB of it is in
// (SO_RCVLOWAT), not on every few segments, and leaves the socket waking on the first
// byte again when it returns.  One reader at a time.
class ReadAhead {
 public:
  explicit ReadAhead(int fd) : fd_(fd) {}
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Bytes read from the socket and not handed out yet.
  size_t buffered() const { return end_ - begin_; }
  // Reads exactly the bytes of iov by `deadline`, feeding them to `hasher` (may be
  // null), as ReadFully does.  `iov` is consumed.
  Status Read(std::vector<iovec>* iov, Deadline deadline, Hasher64* hasher);

 private:
  // Hands out buffered bytes into iov[*first...].
  void TakeBuffered(std::vector<iovec>* iov, size_t* first, Hasher64* hasher);
  // Asks the kernel to wake a wait on fd_ only once `bytes` are queued (SO_RCVLOWAT),
  // unless already asked.
  void SetLowWater(size_t bytes);
  // Read's work; may leave a raised low-water mark behind.
  Status ReadWaking(std::vector<iovec>* iov, Deadline deadline, Hasher64* hasher);

  static constexpr size_t kBytes = 4096;
  const int fd_;
  size_t low_water_ = 1;        // fd_'s SO_RCVLOWAT as last set (the kernel's default: 1)
  size_t begin_ = 0, end_ = 0;  // buf_[begin_, end_) is read ahead
  std::vector<iovec> batch_;    // one readv's vector, kept between reads
  char buf_[kBytes];
};

// Makes a socket's buffers large enough for multi-MiB values.
void TuneSocket(int fd);

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_SOCKET_UTIL_H_
