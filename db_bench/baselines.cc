// The physical baselines every run carries: memcpy of the same bytes in the engine's write
// and read patterns, O_DIRECT sequential I/O of the same bytes to a file in the DB
// directory, plain loopback TCP moving the same bytes (in a peer get's round trips,
// and as one stream), and lookups of the same keys in a plain hash table.
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "db_bench/benchmarks.h"
#include "kvengine/options.h"
#include "util/hash.h"
#include "util/huge_array.h"
#include "util/numa_arena.h"

#ifdef KV_WITH_URING
#include <liburing.h>
#endif

namespace kvbench {

namespace {

constexpr uint64_t kIoAlignment = 4096;

uint64_t IoSize(uint64_t value_size) {
  return (value_size + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
}

std::string RawPath(const std::string& dir, uint64_t tid) {
  return dir + "/kv_bench_raw." + std::to_string(tid);
}

// A file opened with O_DIRECT when the file system allows it, buffered otherwise.
class RawFile {
 public:
  RawFile(const std::string& path, bool write) : path_(path), write_(write) {
    Open(true);
    if (fd_ < 0 && errno == EINVAL) Open(false);
  }
  ~RawFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  bool direct() const { return direct_; }
  int fd() const { return fd_; }

  // pwrite/pread of the whole buffer; falls back to buffered I/O the first time O_DIRECT
  // is refused (EINVAL).
  bool Io(char* buf, uint64_t size, uint64_t offset) {
    for (int attempt = 0; attempt < 2; attempt++) {
      const ssize_t n = write_ ? ::pwrite(fd_, buf, size, static_cast<off_t>(offset))
                               : ::pread(fd_, buf, size, static_cast<off_t>(offset));
      if (n == static_cast<ssize_t>(size)) return true;
      if (n < 0 && errno == EINVAL && direct_) {
        ::close(fd_);
        Open(false);
        if (fd_ < 0) return false;
        continue;
      }
      return false;
    }
    return false;
  }

 private:
  void Open(bool direct) {
    const int flags = (write_ ? O_WRONLY | O_CREAT : O_RDONLY) | (direct ? O_DIRECT : 0);
    fd_ = ::open(path_.c_str(), flags | O_CLOEXEC, 0644);
    direct_ = direct && fd_ >= 0;
    // Buffered reads must not be served by the page cache the write left behind.
    if (fd_ >= 0 && !direct && !write_) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  }

  std::string path_;
  bool write_;
  int fd_ = -1;
  bool direct_ = false;
};

std::string IoNote(bool all_direct) {
  return all_direct ? "O_DIRECT"
                    : "buffered: O_DIRECT refused by the file system; the page cache was "
                      "dropped before reading";
}

// One loopback TCP connection with a thread serving its far end until Stop.  Both ends
// are set up as the TCP transport sets up its connections (no Nagle, 4 MiB socket
// buffers).
class LoopbackPair {
 public:
  // `serve` runs on its own thread with the far end's descriptor; it returns when a
  // send or receive fails (Stop shuts the socket down).
  explicit LoopbackPair(std::function<void(int far_fd)> serve) {
    if (Connect()) server_ = std::thread([this, serve = std::move(serve)] { serve(far_fd_); });
  }
  ~LoopbackPair() { Stop(); }
  LoopbackPair(const LoopbackPair&) = delete;
  LoopbackPair& operator=(const LoopbackPair&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  int near_fd() const { return near_fd_; }

  // Ends the server, which may be blocked in send on a full socket or in recv, and joins
  // it: shutting down its socket wakes it.
  void Stop() {
    if (far_fd_ >= 0) ::shutdown(far_fd_, SHUT_RDWR);
    if (server_.joinable()) server_.join();
    for (int* fd : {&near_fd_, &far_fd_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

  // Moves exactly n bytes (false on a failed or closed socket).
  static bool RecvAll(int fd, char* buf, uint64_t n) {
    for (uint64_t got = 0; got < n;) {
      const ssize_t k = ::recv(fd, buf + got, n - got, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      got += static_cast<uint64_t>(k);
    }
    return true;
  }
  static bool SendAll(int fd, const char* buf, uint64_t n) {
    for (uint64_t sent = 0; sent < n;) {
      const ssize_t k = ::send(fd, buf + sent, n - sent, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      sent += static_cast<uint64_t>(k);
    }
    return true;
  }

 private:
  static void Tune(int fd) {
    int one = 1, bytes = 4 << 20;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }

  bool Fail(const char* what) {
    error_ = std::string(what) + ": " + std::strerror(errno);
    return false;
  }

  // Listens on 127.0.0.1 (any free port), connects to it and accepts.
  bool Connect() {
    const int listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0) return Fail("socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bool ok = ::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ||
              Fail("bind 127.0.0.1:0");
    ok = ok && (::listen(listen_fd, 1) == 0 || Fail("listen"));
    ok = ok && (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 ||
                Fail("getsockname"));
    near_fd_ = ok ? ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    ok = ok && (near_fd_ >= 0 || Fail("socket"));
    if (ok) Tune(near_fd_);
    ok = ok && (::connect(near_fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 ||
                Fail("connect to 127.0.0.1"));
    far_fd_ = ok ? ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    ok = ok && (far_fd_ >= 0 || Fail("accept"));
    if (ok) Tune(far_fd_);
    ::close(listen_fd);
    return ok;
  }

  int near_fd_ = -1;
  int far_fd_ = -1;
  std::thread server_;
  std::string error_;
};

// rawstream's far end: streams the pool's values, one value_size chunk after another, as
// fast as the socket takes them -- what the transport could reach with no protocol at
// all: no request, no header, no checksum, no round trip.
void StreamValues(const ValuePool* pool, uint64_t chunk, int fd) {
  for (uint64_t k = 0;; k++) {
    if (!LoopbackPair::SendAll(fd, pool->For(k).data(), chunk)) return;  // stopped
  }
}

// rawsocket's values: one slot per key of the data set, filled from the pool, as a
// peer's arena holds them, so that a batch's bytes come from memory as large as the data
// set (not from a pool that stays in cache).  Shared read-only by every thread's server.
class RawRegion {
 public:
  RawRegion(const ValuePool* pool, uint64_t num) : vs_(pool->value_size()), num_(num) {
    void* p =
        ::mmap(nullptr, num * vs_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<char*>(p);
    for (uint64_t k = 0; k < num; k++) std::memcpy(base_ + k * vs_, pool->For(k).data(), vs_);
  }
  ~RawRegion() {
    if (base_ != nullptr) ::munmap(base_, num_ * vs_);
  }
  bool ok() const { return base_ != nullptr; }
  uint64_t num() const { return num_; }
  const char* Slot(uint64_t k) const { return base_ + k * vs_; }

 private:
  const uint64_t vs_, num_;
  char* base_ = nullptr;
};

// rawsocket's far end: per request (u64 n, then n u64 slots), sends the n values back to
// back with one writev -- a peer get's shape without its protocol.
void ServeBatches(const RawRegion* region, uint64_t vs, uint64_t max_batch, int fd) {
  std::vector<uint64_t> request(1 + max_batch);
  std::vector<iovec> iov(max_batch);
  for (;;) {
    if (!LoopbackPair::RecvAll(fd, reinterpret_cast<char*>(request.data()), 8)) return;
    const uint64_t n = request[0];
    if (n == 0 || n > max_batch) return;
    if (!LoopbackPair::RecvAll(fd, reinterpret_cast<char*>(&request[1]), 8 * n)) return;
    for (uint64_t i = 0; i < n; i++) {
      iov[i] = {const_cast<char*>(region->Slot(request[1 + i] % region->num())), vs};
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n;
    for (uint64_t left = n * vs; left > 0;) {
      const ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return;
      left -= static_cast<uint64_t>(k);
      // Skip what was sent.
      for (size_t done = static_cast<size_t>(k); done > 0;) {
        const size_t step = std::min(done, msg.msg_iov->iov_len);
        msg.msg_iov->iov_base = static_cast<char*>(msg.msg_iov->iov_base) + step;
        msg.msg_iov->iov_len -= step;
        done -= step;
        if (msg.msg_iov->iov_len == 0) {
          msg.msg_iov++;
          msg.msg_iovlen--;
        }
      }
    }
  }
}

}  // namespace

std::vector<std::string> RawFiles(const std::string& dir, uint64_t threads) {
  std::vector<std::string> files;
  for (uint64_t t = 0; t < threads; t++) files.push_back(RawPath(dir, t));
  return files;
}

std::vector<Result> RunMemcpy(const BenchContext& b, const std::string& which) {
  auto wanted = [&which](const char* name) { return which == "memcpy" || which == name; };
  const uint64_t vs = b.config->value_size;
  const uint64_t num = b.config->num;
  const size_t region_size = num * vs;
  // The same kind of memory as the memory tier's arena (Options' defaults: huge pages,
  // NUMA-local, prefaulted), so that the baseline and the engine pay the same TLB and
  // page costs: with 4 KiB pages the baseline ran up to 1.3x slower than a put of the
  // same bytes into the engine's huge-page arena.
  std::unique_ptr<kvengine::NumaArena> arena;
  kvengine::NumaArena::Params params;
  params.size = region_size;
  params.huge_pages = kvengine::Options().use_huge_pages;
  if (!kvengine::NumaArena::Create(params, nullptr, &arena).ok()) {
    Result r;
    r.errors = 1;
    r.first_error = "memcpy: cannot map " + std::to_string(region_size) + " bytes";
    return {r};
  }
  char* region = arena->base();
  // Write every page once before timing: on some virtual machines MAP_POPULATE maps pages
  // the host has not backed yet, and the first real write to each still faults.
  std::memset(region, 0, region_size);
  std::vector<Result> results;
  // The write pattern: each value from the (shared, read-only) value pool into its slot
  // of a region as large as the data set, as a put copies it into the memory tier.
  if (wanted("memcpy")) {
    results.push_back(RunParallel(b.Spec(num), [&](ThreadContext& ctx) -> OpFn {
      const uint64_t begin = ctx.SliceBegin(num), span = ctx.SliceEnd(num) - begin;
      return [&, begin, span](ThreadContext& c) {
        const uint64_t k = begin + c.ops_done() % span;
        const Slice src = b.pool->For(k);
        const auto start = Clock::now();
        std::memcpy(region + k * vs, src.data(), vs);
        c.Record(start, 1, 1, vs);
      };
    }));
    results.back().benchmark = "memcpy";
  }
  // The read pattern: each slot into the thread's own destination buffer.
  if (wanted("memcpy_read")) {
    results.push_back(RunParallel(b.Spec(num), [&](ThreadContext& ctx) -> OpFn {
      const uint64_t begin = ctx.SliceBegin(num), span = ctx.SliceEnd(num) - begin;
      auto dst = std::make_shared<AlignedBuffer>(vs);
      return [&, begin, span, dst](ThreadContext& c) {
        const uint64_t k = begin + c.ops_done() % span;
        const auto start = Clock::now();
        std::memcpy(dst->data(), region + k * vs, vs);
        c.Record(start, 1, 1, vs);
      };
    }));
    results.back().benchmark = "memcpy_read";
  }
  // The vLLM shapes: a request's layers come from (vllm_write) or go to (vllm_get)
  // --num_layers distinct buffers of the thread, one per layer, each value_size bytes,
  // which together rarely stay in cache as the single buffers above do.  Value k comes
  // from (goes to) layer buffer k % num_layers.
  const uint64_t layers = std::max<uint64_t>(1, b.config->num_layers);
  for (const bool write : {true, false}) {
    if (!wanted(write ? "memcpy_layers" : "memcpy_layers_read")) continue;
    results.push_back(RunParallel(b.Spec(num), [&, write](ThreadContext& ctx) -> OpFn {
      const uint64_t begin = ctx.SliceBegin(num), span = ctx.SliceEnd(num) - begin;
      auto buffers = std::make_shared<std::vector<AlignedBuffer>>();
      const uint64_t offset = b.config->buffer_offset;  // as the vllm_* buffers
      for (uint64_t l = 0; l < layers; l++) {
        buffers->emplace_back(offset + vs);
        std::memcpy(buffers->back().data() + offset, b.pool->For(l).data(), vs);
      }
      return [&, begin, span, buffers, write, offset](ThreadContext& c) {
        const uint64_t k = begin + c.ops_done() % span;
        char* layer = (*buffers)[c.ops_done() % layers].data() + offset;
        const auto start = Clock::now();
        if (write) {
          std::memcpy(region + k * vs, layer, vs);
        } else {
          std::memcpy(layer, region + k * vs, vs);
        }
        c.Record(start, 1, 1, vs);
      };
    }));
    results.back().benchmark = write ? "memcpy_layers" : "memcpy_layers_read";
  }
  return results;
}

Result RunRawWrite(const BenchContext& b) {
  const uint64_t io = IoSize(b.config->value_size);
  auto all_direct = std::make_shared<std::atomic<bool>>(true);
  Result r = RunParallel(b.Spec(b.config->num), [&, io, all_direct](ThreadContext& ctx) -> OpFn {
    const uint64_t slots = ctx.SliceEnd(b.config->num) - ctx.SliceBegin(b.config->num);
    auto file = std::make_shared<RawFile>(RawPath(b.raw_dir, ctx.tid()), true);
    auto buf = std::make_shared<AlignedBuffer>(io);
    std::memcpy(buf->data(), b.pool->For(ctx.tid()).data(), b.config->value_size);
    if (!file->ok()) ctx.Error("rawwrite: cannot open " + RawPath(b.raw_dir, ctx.tid()));
    // The data must reach the device: the final fsync belongs to the timed span.
    ctx.on_finish = [file, all_direct](ThreadContext& c) {
      const auto start = Clock::now();
      if (file->ok() && ::fsync(file->fd()) != 0) c.Error("rawwrite: fsync failed");
      c.AddBusy(start);
      if (!file->direct()) *all_direct = false;
    };
    return [file, buf, io, slots](ThreadContext& c) {
      const uint64_t slot = c.ops_done() % slots;
      const auto start = Clock::now();
      const bool ok = file->ok() && file->Io(buf->data(), io, slot * io);
      c.Record(start, 1, 1, io);
      if (!ok) c.Error(std::string("rawwrite: write failed: ") + std::strerror(errno));
    };
  });
  r.note = IoNote(*all_direct);
  return r;
}

namespace {

// The file rawwrite leaves (slots values of io bytes): written here first, outside the
// timed span, when a read baseline runs without it.
void EnsureRawFile(const BenchContext& b, ThreadContext& ctx, uint64_t slots, uint64_t io,
                   AlignedBuffer* buf) {
  const std::string path = RawPath(b.raw_dir, ctx.tid());
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= slots * io) return;
  RawFile w(path, true);
  std::memcpy(buf->data(), b.pool->For(ctx.tid()).data(), b.config->value_size);
  for (uint64_t s = 0; w.ok() && s < slots; s++) {
    if (!w.Io(buf->data(), io, s * io)) break;
  }
  if (w.ok()) ::fsync(w.fd());
}

#ifdef KV_WITH_URING
// A ring of its own per thread, for rawrandread.
struct RawRing {
  io_uring ring;
  bool ok = false;
  explicit RawRing(unsigned depth) { ok = io_uring_queue_init(depth, &ring, 0) == 0; }
  ~RawRing() {
    if (ok) io_uring_queue_exit(&ring);
  }
};
#endif

}  // namespace

Result RunRawRead(const BenchContext& b) {
  const uint64_t io = IoSize(b.config->value_size);
  auto all_direct = std::make_shared<std::atomic<bool>>(true);
  Result r = RunParallel(b.Spec(b.config->num), [&, io, all_direct](ThreadContext& ctx) -> OpFn {
    const uint64_t slots = ctx.SliceEnd(b.config->num) - ctx.SliceBegin(b.config->num);
    auto buf = std::make_shared<AlignedBuffer>(io);
    EnsureRawFile(b, ctx, slots, io, buf.get());
    const std::string path = RawPath(b.raw_dir, ctx.tid());
    auto file = std::make_shared<RawFile>(path, false);
    if (!file->ok()) ctx.Error("rawread: cannot open " + path);
    ctx.on_finish = [file, all_direct](ThreadContext&) {
      if (!file->direct()) *all_direct = false;
    };
    return [file, buf, io, slots](ThreadContext& c) {
      const uint64_t slot = c.ops_done() % slots;
      const auto start = Clock::now();
      const bool ok = file->ok() && file->Io(buf->data(), io, slot * io);
      c.Record(start, 1, 1, io);
      if (!ok) c.Error(std::string("rawread: read failed: ") + std::strerror(errno));
    };
  });
  r.note = IoNote(*all_direct);
  return r;
}

Result RunRawRandRead(const BenchContext& b) {
  const uint64_t io = IoSize(b.config->value_size);
  const uint64_t depth = b.config->batch_size;
  auto all_direct = std::make_shared<std::atomic<bool>>(true);
  Result r =
      RunParallel(b.Spec(b.config->num), [&, io, depth, all_direct](ThreadContext& ctx) -> OpFn {
        const uint64_t slots = ctx.SliceEnd(b.config->num) - ctx.SliceBegin(b.config->num);
        auto bufs = std::make_shared<std::vector<AlignedBuffer>>();
        for (uint64_t i = 0; i < depth; i++) bufs->emplace_back(io);
        EnsureRawFile(b, ctx, slots, io, &(*bufs)[0]);
        const std::string path = RawPath(b.raw_dir, ctx.tid());
        auto file = std::make_shared<RawFile>(path, false);
        if (!file->ok()) ctx.Error("rawrandread: cannot open " + path);
        ctx.on_finish = [file, all_direct](ThreadContext&) {
          if (!file->direct()) *all_direct = false;
        };
        auto ids = std::make_shared<std::vector<uint64_t>>();
#ifdef KV_WITH_URING
        auto ring = std::make_shared<RawRing>(static_cast<unsigned>(depth));
        if (!ring->ok) ctx.Error("rawrandread: io_uring_queue_init failed");
        return [file, bufs, ids, ring, io, slots, depth](ThreadContext& c) {
          const uint64_t n = std::min(depth, std::min(slots, c.Remaining()));
          DistinctRandom(&c.rng(), slots, n, ids.get());
          const auto start = Clock::now();
          bool ok = file->ok() && ring->ok;
          for (uint64_t i = 0; ok && i < n; i++) {
            io_uring_sqe* sqe = io_uring_get_sqe(&ring->ring);
            io_uring_prep_read(sqe, file->fd(), (*bufs)[i].data(), static_cast<unsigned>(io),
                               (*ids)[i] * io);
          }
          ok = ok && io_uring_submit_and_wait(&ring->ring, static_cast<unsigned>(n)) >= 0;
          uint64_t reaped = 0;
          while (ok && reaped < n) {
            io_uring_cqe* cqe;
            if (io_uring_wait_cqe(&ring->ring, &cqe) != 0) {
              ok = false;
              break;
            }
            ok = cqe->res == static_cast<int>(io);
            io_uring_cqe_seen(&ring->ring, cqe);
            reaped++;
          }
          c.Record(start, n, n, n * io);
          if (!ok) c.Error("rawrandread: a read failed or came back short");
        };
#else
    return [file, bufs, ids, io, slots, depth](ThreadContext& c) {
      const uint64_t n = std::min(depth, std::min(slots, c.Remaining()));
      DistinctRandom(&c.rng(), slots, n, ids.get());
      const auto start = Clock::now();
      bool ok = file->ok();
      for (uint64_t i = 0; ok && i < n; i++) ok = file->Io((*bufs)[i].data(), io, (*ids)[i] * io);
      c.Record(start, n, n, n * io);
      if (!ok) c.Error(std::string("rawrandread: read failed: ") + std::strerror(errno));
    };
#endif
      });
#ifdef KV_WITH_URING
  r.note = IoNote(*all_direct) + ", " + std::to_string(depth) + " in flight";
#else
  r.note = IoNote(*all_direct) + ", one at a time (built without liburing)";
#endif
  return r;
}

Result RunRawStream(const BenchContext& b) {
  const uint64_t vs = b.config->value_size;
  return RunParallel(b.Spec(b.config->num), [&b, vs](ThreadContext& ctx) -> OpFn {
    const ValuePool* pool = b.pool;
    auto pair = std::make_shared<LoopbackPair>([pool, vs](int fd) { StreamValues(pool, vs, fd); });
    auto buf = std::make_shared<AlignedBuffer>(vs);
    if (!pair->ok()) ctx.Error("rawstream: " + pair->error());
    // The sender streams until told to stop; stopping is no part of the timed span.
    ctx.on_finish = [pair](ThreadContext&) { pair->Stop(); };
    return [pair, buf, vs](ThreadContext& c) {
      const auto start = Clock::now();
      const bool ok = pair->ok() && LoopbackPair::RecvAll(pair->near_fd(), buf->data(), vs);
      c.Record(start, 1, 1, ok ? vs : 0);
      if (!ok)
        c.Error(pair->ok() ? "rawstream: the stream broke off" : "rawstream: " + pair->error());
    };
  });
}

Result RunRawSocket(const BenchContext& b) {
  const uint64_t vs = b.config->value_size;
  const uint64_t batch = std::max<uint64_t>(1, b.config->batch_size);
  auto region = std::make_shared<RawRegion>(b.pool, b.config->num);
  if (!region->ok()) {
    Result r;
    r.errors = 1;
    r.first_error = "rawsocket: cannot map " + std::to_string(b.config->num * vs) + " bytes";
    return r;
  }
  Result r =
      RunParallel(b.Spec(b.config->num), [&b, region, vs, batch](ThreadContext& ctx) -> OpFn {
        const RawRegion* values = region.get();
        auto pair = std::make_shared<LoopbackPair>(
            [values, vs, batch](int fd) { ServeBatches(values, vs, batch, fd); });
        if (!pair->ok()) ctx.Error("rawsocket: " + pair->error());
        ctx.on_finish = [pair](ThreadContext&) { pair->Stop(); };
        auto bufs = std::make_shared<std::vector<AlignedBuffer>>();
        for (uint64_t i = 0; i < batch; i++) bufs->emplace_back(vs);
        auto request = std::make_shared<std::vector<uint64_t>>();
        auto ids = std::make_shared<std::vector<uint64_t>>();
        const uint64_t num = b.config->num;
        return [pair, bufs, request, ids, vs, batch, num](ThreadContext& c) {
          const uint64_t n = std::min(batch, c.Remaining());
          DistinctRandom(&c.rng(), num, n, ids.get());
          request->assign(1, n);
          request->insert(request->end(), ids->begin(), ids->end());
          const auto start = Clock::now();
          const int fd = pair->near_fd();
          bool ok = pair->ok() &&
                    LoopbackPair::SendAll(fd, reinterpret_cast<const char*>(request->data()),
                                          8 * request->size());
          for (uint64_t i = 0; ok && i < n; i++)
            ok = LoopbackPair::RecvAll(fd, (*bufs)[i].data(), vs);
          c.Record(start, n, n, ok ? n * vs : 0);
          if (!ok)
            c.Error(pair->ok() ? "rawsocket: the connection broke off"
                               : "rawsocket: " + pair->error());
        };
      });
  r.note = std::to_string(batch) + " values per round trip";
  return r;
}

namespace {

// rawexist's and rawlookup's index: the key space in a plain open-addressing table
// (linear probing, 35-70% full like the memory tier's KeyIndex), each slot holding the
// key's hash, its value's number and the key's bytes inline.  A lookup thus costs the one
// cache miss of its home slot, where the key is compared -- the least any index that
// must compare the key's bytes can cost -- and, for rawlookup, the value's own.  Its
// growth from 100k to 10M keys is the cache and TLB misses no engine can avoid.
class RawKeyTable {
 public:
  RawKeyTable(const KeySpace& space) {
    std::string key;
    space.Format(space.num() == 0 ? 0 : space.num() - 1, &key);  // the widest key
    key_width_ = key.size();
    stride_ = sizeof(Header) + (key_width_ + 7) / 8 * 8;
    uint64_t capacity = 16;
    while (capacity * 7 / 10 < space.num()) capacity *= 2;
    mask_ = capacity - 1;
    // Huge-page-advised like the engine's index slots (util/huge_array.h).
    slots_ = kvengine::NewZeroedHugeArray<char>(capacity * stride_);
    for (uint64_t k = 0; k < space.num(); k++) {
      space.Format(k, &key);
      const uint64_t hash = kvengine::Hash64(key);
      uint64_t i = Home(hash);
      while (HeaderAt(i)->id_plus_1 != 0) i = (i + 1) & mask_;
      Header* h = HeaderAt(i);
      h->hash = hash;
      h->id_plus_1 = static_cast<uint32_t>(k + 1);
      h->key_size = static_cast<uint32_t>(key.size());
      std::memcpy(h + 1, key.data(), key.size());
    }
  }

  void PrefetchHome(uint64_t hash) const { __builtin_prefetch(HeaderAt(Home(hash))); }
  // The value number of key (whose Hash64 is hash), or -1 when absent.
  int64_t Find(std::string_view key, uint64_t hash) const {
    for (uint64_t i = Home(hash);; i = (i + 1) & mask_) {
      const Header* h = HeaderAt(i);
      if (h->id_plus_1 == 0) return -1;
      if (h->hash == hash && h->key_size == key.size() &&
          std::memcmp(h + 1, key.data(), key.size()) == 0) {
        return static_cast<int64_t>(h->id_plus_1) - 1;
      }
    }
  }
  uint64_t bytes() const { return (mask_ + 1) * stride_; }

 private:
  struct Header {
    uint64_t hash;
    uint32_t id_plus_1;  // 0: empty
    uint32_t key_size;
  };  // then the key's bytes, padded to 8

  // The hash's high bits, as KeyIndex uses them.
  uint64_t Home(uint64_t hash) const { return (hash >> 32) & mask_; }
  Header* HeaderAt(uint64_t i) const {
    return reinterpret_cast<Header*>(slots_.get() + i * stride_);
  }

  uint64_t key_width_ = 0;
  uint64_t stride_ = 0;
  uint64_t mask_ = 0;
  kvengine::HugeArray<char> slots_;
};

}  // namespace

Result RunRawLookup(const BenchContext& b, bool copy_values) {
  const char* name = copy_values ? "rawlookup" : "rawexist";
  const uint64_t num = b.config->num, vs = b.config->value_size;
  if (num > UINT32_MAX) {
    Result r;
    r.errors = 1;
    r.first_error = std::string(name) + ": at most 2^32 - 1 keys";
    return r;
  }
  const KeySpace space = b.Keys();
  const RawKeyTable table(space);
  // The values, for rawlookup: one slot per key in the same kind of memory as the
  // memory tier's arena, as RunMemcpy's region (huge pages, NUMA-local, prefaulted).
  std::unique_ptr<kvengine::NumaArena> arena;
  if (copy_values) {
    kvengine::NumaArena::Params params;
    params.size = num * vs;
    params.huge_pages = kvengine::Options().use_huge_pages;
    if (!kvengine::NumaArena::Create(params, nullptr, &arena).ok()) {
      Result r;
      r.errors = 1;
      r.first_error = std::string(name) + ": cannot map " + std::to_string(num * vs) + " bytes";
      return r;
    }
    for (uint64_t k = 0; k < num; k++)
      std::memcpy(arena->base() + k * vs, b.pool->For(k).data(), vs);
  }
  const char* values = copy_values ? arena->base() : nullptr;
  Result r = RunParallel(b.Spec(num), [&](ThreadContext&) -> OpFn {
    const uint64_t batch = b.config->batch_size;
    auto keys = std::make_shared<std::vector<std::string>>(batch);
    auto ids = std::make_shared<std::vector<uint64_t>>();
    auto hashes = std::make_shared<std::vector<uint64_t>>(batch);
    auto found = std::make_shared<std::vector<int64_t>>(batch);
    auto bufs = std::make_shared<std::vector<AlignedBuffer>>();
    for (uint64_t i = 0; copy_values && i < batch; i++) bufs->emplace_back(vs);
    return [&, keys, ids, hashes, found, bufs, batch](ThreadContext& c) {
      const uint64_t n = std::min(batch, c.Remaining());
      DistinctRandom(&c.rng(), num, n, ids.get());
      uint64_t key_bytes = 0;
      for (uint64_t i = 0; i < n; i++) {
        space.Format((*ids)[i], &(*keys)[i]);
        key_bytes += (*keys)[i].size();
      }
      // In stages, as the engine's batches: every key's home slot is asked for before
      // any is read, every value before any is copied, so that the misses overlap.
      const auto start = Clock::now();
      for (uint64_t i = 0; i < n; i++) {
        (*hashes)[i] = kvengine::Hash64((*keys)[i]);
        table.PrefetchHome((*hashes)[i]);
      }
      for (uint64_t i = 0; i < n; i++) {
        (*found)[i] = table.Find((*keys)[i], (*hashes)[i]);
        if (copy_values && (*found)[i] >= 0) {
          const char* v = values + static_cast<uint64_t>((*found)[i]) * vs;
          for (uint64_t off = 0; off < std::min<uint64_t>(vs, 512); off += 64)
            __builtin_prefetch(v + off);
        }
      }
      uint64_t hits = 0;
      for (uint64_t i = 0; i < n; i++) {
        if ((*found)[i] < 0) continue;
        hits++;
        if (copy_values) {
          std::memcpy((*bufs)[i].data(), values + static_cast<uint64_t>((*found)[i]) * vs, vs);
        }
      }
      c.Record(start, n, n, key_bytes + (copy_values ? hits * vs : 0));
      c.CountLookups(n, hits);
      for (uint64_t i = 0; i < n; i++) {
        if ((*found)[i] != static_cast<int64_t>((*ids)[i])) {
          c.Error(std::string(name) + ": key '" + (*keys)[i] + "' not found as itself");
        } else if (copy_values && b.config->verify) {
          if (std::memcmp((*bufs)[i].data(), b.pool->For((*ids)[i]).data(), vs) != 0) {
            c.Error(std::string(name) + ": key '" + (*keys)[i] + "': wrong bytes copied");
          } else {
            c.CountVerified(1);
          }
        }
      }
    };
  });
  r.counts_found = true;
  char note[96];
  std::snprintf(note, sizeof(note), "plain table of %.1f MiB",
                static_cast<double>(table.bytes()) / 1048576.0);
  r.note = note;
  return r;
}

}  // namespace kvbench
