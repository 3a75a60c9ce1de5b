// ShmChannel: the frames of one attached connection carried through shared memory
// instead of its Unix socket (docs/attach.md, "The shared channel").
//
// Why: on the development VM every system call costs microseconds, and a request over
// the socket costs four of them plus the waits (sendmsg, poll, recvmsg on each side):
// about 12 us a round trip even with both sides busy polling, which at 64 KiB values
// was a fifth of an attached put.  Through shared memory a waiting side sees the other's
// frame by reading a counter, and no system call is made while both sides are busy.
//
// The region (a sealed memfd the owner creates and passes over the socket) holds two
// one-way byte rings -- client -> owner (requests) and owner -> client (answers) -- each
// a single-producer single-consumer stream of frames encoded exactly as on the socket
// (wire.h, checksums included), so frames of any size stream through.  The socket stays
// open beside it for two things only: wake-ups and death.  A side that has nothing to
// do spins for a while (BusyPollPredictor), then marks itself asleep in the region --
// waiting for bytes, or for room -- and sleeps in poll() on the socket; the other side,
// after writing ring bytes (or freeing room), sends one byte on the socket when it finds
// the mark of a sleeper waiting for bytes (for room).  (Dekker's pattern: each side
// stores its own word, then loads the other's (all sequentially consistent), so either the sleeper
// sees the progress or the waker sees the mark.)  A peer that dies closes the socket, which wakes
// the sleeper with a hangup: a waiter never outlives its peer by more than the end of its spin.
//
// Trust: both processes run as the same user (the socket checks it), yet the owner
// treats the region as input: counters that do not add up close the connection, every
// frame is copied out of the ring before it is checked and used, and the memfd is
// sealed against resizing, so a client cannot make the owner fault on its mapping.
//
// Thread-safety: one thread at a time per side (a connection is used by one call at a
// time on each side).
#ifndef KVENGINE_TRANSPORT_SHM_CHANNEL_H_
#define KVENGINE_TRANSPORT_SHM_CHANNEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvengine/status.h"
#include "transport/busy_poll.h"
#include "transport/socket_util.h"
#include "transport/wire.h"

namespace kvengine {

class ShmChannel {
 public:
  enum class Side : uint8_t { kOwner = 0, kClient = 1 };
  // Bytes of each ring: a batch of a few thousand keys fits whole; larger frames stream.
  static constexpr size_t kRingBytes = 256u << 10;

  // Owner: creates a region, returns its channel and the memfd to pass to the client
  // (the caller closes *memfd once it is sent).
  static Status Create(int socket_fd, uint64_t busy_poll_us, std::unique_ptr<ShmChannel>* channel,
                       int* memfd);
  // Client: maps the region the owner passed (checked: size and seals).  Does not take
  // memfd.
  static Status Attach(int memfd, int socket_fd, uint64_t busy_poll_us,
                       std::unique_ptr<ShmChannel>* channel);
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // Writes one frame without a body to the peer by `deadline` (waiting for ring room as
  // the peer reads).  IOError when the peer is gone, TimedOut at the deadline.
  Status SendFrame(uint8_t op, uint16_t flags, uint64_t request_id, const std::string& meta,
                   Deadline deadline);
  // One frame of SendFrames.
  struct OutFrame {
    uint8_t op = 0;
    uint16_t flags = 0;
    uint64_t request_id = 0;
    const std::string* meta = nullptr;
  };
  // Writes frames in order as SendFrame does, but lets the peer see them all at once:
  // one wake-up for the lot.  Sent one by one to a peer that reads faster than this
  // side writes, each frame found the peer asleep again after the one before, and paid
  // a wake-up.  InvalidArgument, before anything is written, for metadata too large.
  Status SendFrames(std::span<const OutFrame> frames, Deadline deadline);
  // Waits until the peer's next frame has begun to arrive: spinning first (when `spin`
  // and the waits after `kind`, the op last sent or answered, have been short), then
  // asleep.  OK with *arrived true when it has, false at `deadline`; Aborted when `stop`
  // turned true; IOError when the peer is gone ("connection closed by peer").
  Status WaitForFrame(uint8_t kind, Deadline deadline, const std::atomic<bool>* stop, bool spin,
                      bool* arrived);
  // Reads one whole frame without a body and checks it as ReadFrame (unix_socket.h)
  // does; a frame begun must end by `deadline`.
  Status ReadFrame(Deadline deadline, wire::FrameHeader* header, std::string* meta);

  // Doorbells this side has rung (each a system call here and a wake-up there).
  uint64_t wakeups_sent() const { return wakeups_sent_; }

 private:
  struct Region;
  struct Ring;

  ShmChannel(Side side, int socket_fd, uint64_t busy_poll_us, Region* region);
  static size_t RegionBytes();
  Ring& in() const;
  Ring& out() const;
  // Whether in() holds bytes this side has not read.
  bool HasBytes() const;
  // Bytes the peer has written to in() and this side not read yet / bytes out() has
  // room for; IOError when the peer's counters do not add up.
  Status Pending(uint64_t* n) const;
  Status Room(uint64_t* n) const;
  // Copies n bytes out of in() (all must be pending; the room is given back at once).
  void Take(char* dst, size_t n);
  // Copies n bytes into out() (all must fit), for the peer to see at the next Publish.
  void Put(const char* src, size_t n);
  void Publish();
  // Copies n bytes into out(), publishing and waiting for room (by `deadline`) as the
  // ring fills; what fits last stays unpublished.
  Status PutWaiting(const char* src, size_t n, Deadline deadline);
  // Reads exactly n bytes from in(), waiting for them by `deadline`.
  Status ReadExactly(char* dst, size_t n, Deadline deadline);
  // What a sleeping side waits for: the mark it leaves in the region.
  enum class Wait : uint32_t { kForBytes = 1, kForRoom = 2 };
  static constexpr uint32_t kAwake = 0;
  // Waits until `ready()` (re-evaluated after every wake-up) by `deadline` (then OK with
  // *met false): spins when `spin`, then sleeps on the socket, marked as waiting for
  // `wait`.
  template <typename Ready>
  Status WaitUntil(Wait wait, Ready&& ready, bool spin, Deadline deadline,
                   const std::atomic<bool>* stop, bool* met);
  // Wakes the peer if it sleeps waiting for `progress`, which this side just made.
  void WakePeer(Wait progress);

  const Side side_;
  const int socket_fd_;
  Region* const region_;
  BusyPollPredictor busy_poll_;
  uint64_t read_ = 0;     // bytes this side consumed from in() (mirrors the ring's)
  uint64_t written_ = 0;  // bytes this side wrote to out() (mirrors the ring's)
  uint64_t wakeups_sent_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_SHM_CHANNEL_H_
