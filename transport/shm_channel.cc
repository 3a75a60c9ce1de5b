#include "transport/shm_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace kvengine {

namespace {

// What a frame synchronizes: everything its sender did before sending it happens before
// what its reader does after reading it, through the other process too (a put's copy
// into a slot, then a get of that value on another connection).  ThreadSanitizer sees
// only this process, so a frame is also a release and an acquire of one sync object of
// the process -- the way it treats every socket.
#if defined(__SANITIZE_THREAD__)
char frame_sync;
inline void FrameSent() { __tsan_release(&frame_sync); }
inline void FrameRead() { __tsan_acquire(&frame_sync); }
#else
inline void FrameSent() {}
inline void FrameRead() {}
#endif

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long a sleeper sleeps at most before it looks at `stop` and the deadline again.
constexpr int kSleepSliceMs = 100;

}  // namespace

struct ShmChannel::Ring {
  alignas(64) std::atomic<uint64_t> written{0};  // total bytes the producer published
  alignas(64) std::atomic<uint64_t> read{0};     // total bytes the consumer took
  alignas(64) char data[kRingBytes];
};

struct ShmChannel::Region {
  struct alignas(64) Flag {
    std::atomic<uint32_t> asleep{kAwake};  // a Wait while the side sleeps on the socket
  };
  Flag sides[2];  // by Side
  Ring rings[2];  // [kOwner]: owner -> client; [kClient]: client -> owner
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the channel's counters are shared between processes: they must be lock-free");

ShmChannel::ShmChannel(Side side, int socket_fd, uint64_t busy_poll_us, Region* region)
    : side_(side), socket_fd_(socket_fd), region_(region), busy_poll_(busy_poll_us) {}

ShmChannel::~ShmChannel() { munmap(region_, RegionBytes()); }

size_t ShmChannel::RegionBytes() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (sizeof(Region) + page - 1) / page * page;
}

Status ShmChannel::Create(int socket_fd, uint64_t busy_poll_us,
                          std::unique_ptr<ShmChannel>* channel, int* memfd) {
  const size_t size = RegionBytes();
  const int fd = memfd_create("kvengine-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::IOError("memfd_create for a shared channel", std::strerror(errno));
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    const int saved = errno;
    close(fd);
    return Status::IOError("cannot set up a shared channel", std::strerror(saved));
  }
  channel->reset(new ShmChannel(Side::kOwner, socket_fd, busy_poll_us, new (p) Region));
  *memfd = fd;
  return Status::OK();
}

Status ShmChannel::Attach(int memfd, int socket_fd, uint64_t busy_poll_us,
                          std::unique_ptr<ShmChannel>* channel) {
  const size_t size = RegionBytes();
  struct stat st;
  if (fstat(memfd, &st) != 0 || static_cast<size_t>(st.st_size) != size) {
    return Status::Corruption("the owner's shared channel has the wrong size");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) {
    return Status::IOError("cannot map the owner's shared channel", std::strerror(errno));
  }
  channel->reset(new ShmChannel(Side::kClient, socket_fd, busy_poll_us, static_cast<Region*>(p)));
  return Status::OK();
}

ShmChannel::Ring& ShmChannel::out() const { return region_->rings[static_cast<int>(side_)]; }
ShmChannel::Ring& ShmChannel::in() const { return region_->rings[1 - static_cast<int>(side_)]; }

Status ShmChannel::Pending(uint64_t* n) const {
  *n = in().written.load() - read_;
  if (*n > kRingBytes) return Status::IOError("shared channel: the peer broke the ring");
  return Status::OK();
}

void ShmChannel::Take(char* dst, size_t n) {
  const size_t at = read_ % kRingBytes, first = std::min(n, kRingBytes - at);
  std::memcpy(dst, in().data + at, first);
  std::memcpy(dst + first, in().data, n - first);
  read_ += n;
  in().read.store(read_);    // seq_cst: see WakePeer
  WakePeer(Wait::kForRoom);  // it may be waiting for room
}

bool ShmChannel::HasBytes() const { return in().written.load() != read_; }

Status ShmChannel::Room(uint64_t* n) const {
  const uint64_t used = written_ - out().read.load();
  if (used > kRingBytes) return Status::IOError("shared channel: the peer broke the ring");
  *n = kRingBytes - used;
  return Status::OK();
}

void ShmChannel::Put(const char* src, size_t n) {
  const size_t at = written_ % kRingBytes, first = std::min(n, kRingBytes - at);
  std::memcpy(out().data + at, src, first);
  std::memcpy(out().data, src + first, n - first);
  written_ += n;
}

void ShmChannel::Publish() {
  out().written.store(written_);  // seq_cst: see WakePeer
  WakePeer(Wait::kForBytes);
}

void ShmChannel::WakePeer(Wait progress) {
  // Dekker's pattern, in sequentially consistent operations (no fences, which
  // ThreadSanitizer cannot follow): this side stored its counter and now reads the
  // peer's mark; a sleeper stores its mark and then reads the counters.  One of the two
  // sees the other's store.  Taking the mark makes it one wake-up per sleep, however
  // many frames follow.  A peer asleep for the other kind of progress is left asleep:
  // an owner waiting for its client's next request was woken by every frame the client
  // read, and each doorbell cost the client a system call (15 us on the development VM).
  std::atomic<uint32_t>& asleep = region_->sides[1 - static_cast<int>(side_)].asleep;
  uint32_t mark = static_cast<uint32_t>(progress);
  if (asleep.load() == mark && asleep.compare_exchange_strong(mark, kAwake)) {
    const char doorbell = 0;
    // A full socket already holds wake-ups enough.
    (void)send(socket_fd_, &doorbell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    wakeups_sent_++;
  }
}

template <typename Ready>
Status ShmChannel::WaitUntil(Wait wait, Ready&& ready, bool spin, Deadline deadline,
                             const std::atomic<bool>* stop, bool* met) {
  *met = true;
  if (ready()) return Status::OK();
  if (spin) {
    const Deadline until = std::min(deadline, SteadyClock::now() + busy_poll_.budget());
    for (unsigned round = 1; SteadyClock::now() < until; round++) {
      for (int i = 0; i < 64; i++) {
        if (ready()) return Status::OK();
        CpuRelax();
      }
      // Lets a thread that shares this CPU -- possibly the peer -- run now and then.
      if (round % 8 == 0) sched_yield();
    }
  }
  std::atomic<uint32_t>& asleep = region_->sides[static_cast<int>(side_)].asleep;
  for (;;) {
    asleep.store(static_cast<uint32_t>(wait));  // then ready() reads the counters: see WakePeer
    const bool is_ready = ready();
    const bool stopping = !is_ready && stop != nullptr && stop->load();
    const int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                deadline - SteadyClock::now() + std::chrono::microseconds(999))
                                .count();
    pollfd p{socket_fd_, POLLIN, 0};
    int n = 0;
    if (!is_ready && !stopping && left_ms > 0) {
      n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, kSleepSliceMs)));
    }
    asleep.store(kAwake, std::memory_order_relaxed);
    if (is_ready) return Status::OK();
    if (stopping) return Status::Aborted("stopping");
    if (left_ms <= 0) {
      *met = false;
      return Status::OK();
    }
    if (n > 0 && (p.revents & POLLIN)) {
      char drain[256];
      for (;;) {  // the wake-ups so far; none of them carries anything
        const ssize_t got = recv(socket_fd_, drain, sizeof(drain), MSG_DONTWAIT);
        if (got == 0) return Status::IOError("connection closed by peer");
        if (got < 0) break;
      }
    } else if (n > 0) {  // POLLHUP, POLLERR, POLLNVAL
      return Status::IOError("connection closed by peer");
    }
    if (ready()) return Status::OK();
  }
}

Status ShmChannel::SendFrame(uint8_t op, uint16_t flags, uint64_t request_id,
                             const std::string& meta, Deadline deadline) {
  const OutFrame frame{op, flags, request_id, &meta};
  return SendFrames(std::span<const OutFrame>(&frame, 1), deadline);
}

Status ShmChannel::SendFrames(std::span<const OutFrame> frames, Deadline deadline) {
  for (const OutFrame& f : frames) {
    if (f.meta->size() > wire::kMaxMetaLen)
      return Status::InvalidArgument("frame metadata too large");
  }
  FrameSent();
  // Headers and metadata go in as one stream, published when the ring is full and at
  // the end: the peer is not woken for a header alone.
  for (const OutFrame& f : frames) {
    char header[wire::kHeaderSize];
    wire::EncodeFrameHeader(f.op, f.flags, f.request_id, *f.meta, {}, header);
    Status s = PutWaiting(header, sizeof(header), deadline);
    if (s.ok()) s = PutWaiting(f.meta->data(), f.meta->size(), deadline);
    if (!s.ok()) return s;
  }
  Publish();
  return Status::OK();
}

Status ShmChannel::PutWaiting(const char* src, size_t n, Deadline deadline) {
  while (n > 0) {
    uint64_t room = 0;
    Status ring = Room(&room);  // a broken ring ends the wait too
    if (ring.ok() && room == 0) {
      Publish();  // the peer makes room only by reading what it can see
      bool met = false;
      Status s = WaitUntil(
          Wait::kForRoom, [&] { return !(ring = Room(&room)).ok() || room > 0; },
          /*spin=*/true, deadline, nullptr, &met);
      if (!s.ok()) return s;
      if (!met) return Status::IOError("send timed out");
    }
    if (!ring.ok()) return ring;
    const size_t k = std::min<uint64_t>(room, n);
    Put(src, k);
    src += k;
    n -= k;
  }
  return Status::OK();
}

Status ShmChannel::WaitForFrame(uint8_t kind, Deadline deadline, const std::atomic<bool>* stop,
                                bool spin, bool* arrived) {
  const auto began = BusyPollPredictor::Clock::now();
  Status s = WaitUntil(
      Wait::kForBytes, [this] { return HasBytes(); }, spin && busy_poll_.ShouldSpin(kind), deadline,
      stop, arrived);
  if (s.ok() && *arrived) busy_poll_.Done(kind, began);
  return s;
}

Status ShmChannel::ReadExactly(char* dst, size_t n, Deadline deadline) {
  size_t done = 0;
  while (done < n) {
    uint64_t pending = 0;
    bool met = false;
    Status s = WaitUntil(
        Wait::kForBytes, [this] { return HasBytes(); }, /*spin=*/true, deadline, nullptr, &met);
    if (!s.ok()) return s;
    if (!met) return Status::IOError("receive timed out");
    s = Pending(&pending);
    if (!s.ok()) return s;
    const size_t k = std::min<uint64_t>(pending, n - done);
    Take(dst + done, k);
    done += k;
  }
  return Status::OK();
}

Status ShmChannel::ReadFrame(Deadline deadline, wire::FrameHeader* header, std::string* meta) {
  char raw[wire::kHeaderSize];
  Status s = ReadExactly(raw, sizeof(raw), deadline);
  if (!s.ok()) return s;
  s = wire::FrameHeader::DecodeFrom(raw, header);
  if (!s.ok()) return s;
  if (header->body_len != 0) return Status::Corruption("unexpected frame body");
  meta->resize(header->meta_len);
  s = ReadExactly(meta->data(), meta->size(), deadline);
  if (!s.ok()) return s;
  if (wire::FrameChecksum(raw, *meta, {}) != header->checksum) {
    return Status::Corruption("frame checksum mismatch");
  }
  FrameRead();
  return Status::OK();
}

}  // namespace kvengine
