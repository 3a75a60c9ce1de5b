#include "transport/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "transport/wire.h"
#include "util/coding.h"
#include "util/hash.h"
#include "util/input_check.h"
#include "util/mutex.h"
#include "util/printable.h"

namespace kvengine {

// ---------------------------------------------------------------- Endpoint
Status Endpoint::Parse(std::string_view text, Endpoint* out) {
  const std::string bad = "malformed endpoint '" + std::string(text) + "' (want host:port)";
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status::InvalidArgument(bad);
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return Status::InvalidArgument(bad);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5) return Status::InvalidArgument(bad);
  // Peers are named by ToString (sharded routing parses the names back): a host that
  // could not survive that (a bracket, a list's comma, a blank) is refused here.
  for (char ch : host) {
    if (ch == '[' || ch == ']' || ch == ',' || std::isspace(static_cast<unsigned char>(ch))) {
      return Status::InvalidArgument(bad);
    }
  }
  uint32_t p = 0;
  for (char ch : port) {
    if (ch < '0' || ch > '9') return Status::InvalidArgument(bad);
    p = p * 10 + static_cast<uint32_t>(ch - '0');
  }
  if (p > 65535) return Status::InvalidArgument(bad);
  out->host = std::string(host);
  out->port = static_cast<uint16_t>(p);
  return Status::OK();
}

Status Endpoint::ParseList(std::string_view text, std::vector<Endpoint>* out) {
  std::vector<Endpoint> list;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) {
      Endpoint ep;
      Status s = Parse(item, &ep);
      if (!s.ok()) return s;
      list.push_back(ep);
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  *out = std::move(list);
  return Status::OK();
}

std::string Endpoint::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool Endpoint::IsLoopback() const {
  // Decided on the addresses, not the text: "127.example.com" may resolve anywhere.
  std::vector<sockaddr_storage> addrs;
  if (!ResolveAll(*this, &addrs).ok()) return false;
  for (const sockaddr_storage& a : addrs) {
    if (!IsLoopbackAddress(a)) return false;
  }
  return true;
}

// ---------------------------------------------------------------- sinks and helpers
Status MetaSink::OnMeta(std::string_view m, uint64_t body_len, std::vector<iovec>*) {
  if (body_len != 0) return Status::Corruption("unexpected body in a response");
  meta.assign(m);
  return Status::OK();
}

Status FailAll(const Status& s, size_t n, std::vector<int64_t>* results) {
  results->assign(n, s.ErrorCode());
  return s;
}


namespace {

class Registrar final : public MemoryRegistrar {
 public:
  explicit Registrar(Transport* t) : t_(t) {}
  Status Register(void* addr, size_t length, const char* what) override {
    return t_->RegisterMemory(addr, length, what);
  }
  void Unregister(void* addr, size_t length) override { t_->UnregisterMemory(addr, length); }

 private:
  Transport* const t_;
};

// Reads and drops n bytes (keeping the stream in step), hashing them.
Status Discard(ReadAhead* reader, uint64_t n, Deadline deadline, Hasher64* hasher) {
  char scratch[64 << 10];
  while (n > 0) {
    std::vector<iovec> iov{{scratch, static_cast<size_t>(std::min<uint64_t>(n, sizeof(scratch)))}};
    const uint64_t k = iov[0].iov_len;
    Status s = reader->Read(&iov, deadline, hasher);
    if (!s.ok()) return s;
    n -= k;
  }
  return Status::OK();
}

}  // namespace

// ---------------------------------------------------------------- TcpConnection
// One connection to a peer, shared by concurrent callers.  Requests are written whole
// under write_mu_; answers come back in any order, told apart by request id.  Whoever
// waits and finds no reader becomes the reader ("leader/follower"): it reads the next
// frame and delivers it to its caller -- straight into that caller's buffers -- then
// wakes the others, so no thread is dedicated to a connection.
class TcpConnection {
 public:
  // want_unhashed: leave bodies out of the checksums when the server offers it (set
  // only for loopback connections).
  TcpConnection(int fd, uint64_t timeout_ms, bool want_unhashed)
      : fd_(fd), timeout_ms_(timeout_ms), want_unhashed_(want_unhashed), reader_(fd) {}
  ~TcpConnection() { close(fd_); }

  // Reads the challenge, proves the token, reads the verdict.
  Status Handshake(const std::string& token, const std::string& tenant, Deadline deadline) {
    char header[wire::kHeaderSize];
    wire::FrameHeader h;
    std::string meta;
    for (int step = 0; step < 2; step++) {
      std::vector<iovec> iov{{header, sizeof(header)}};
      Status s = reader_.Read(&iov, deadline, nullptr);
      if (s.ok()) s = wire::FrameHeader::DecodeFrom(header, &h);
      if (!s.ok()) return s;
      const uint8_t want = step == 0 ? wire::kChallenge : wire::kAuth;
      if (h.op != want || h.body_len != 0 || h.meta_len > 4096) {
        return Status::Corruption("unexpected frame during the handshake");
      }
      meta.assign(h.meta_len, '\0');
      iov = {{meta.data(), meta.size()}};
      Hasher64 hasher;
      hasher.Update(header, 32);
      s = reader_.Read(&iov, deadline, &hasher);
      if (!s.ok()) return s;
      if (hasher.Digest() != h.checksum) return Status::Corruption("handshake checksum mismatch");
      if (step == 0) {
        if (meta.size() != wire::kNonceSize + 1) return Status::Corruption("malformed challenge");
        // Servers built before tenants send 1 for "required".
        const uint8_t bits = static_cast<uint8_t>(meta.back());
        if ((bits & wire::kChallengeTokenRequired) != 0 && token.empty()) {
          return Status::InvalidArgument("peer requires an auth token and none is configured");
        }
        std::string auth;
        if (!token.empty()) {
          // The tenant's name only to servers that read it (others refuse the request).
          const bool named = (bits & wire::kChallengeTakesTenant) != 0;
          wire::PutAuth(&auth,
                        wire::AuthProof(std::string_view(meta).substr(0, wire::kNonceSize), token),
                        named ? tenant : std::string());
        }
        s = SendFrame(fd_, wire::kAuth, 0, 0, auth, {}, deadline);
        if (!s.ok()) return s;
      } else {
        std::string_view in(meta);
        Status verdict;
        if (!wire::GetBatchStatus(&in, &verdict)) return Status::Corruption("malformed verdict");
        // A server at its cap of connections (its descriptor budget) says so with Busy.
        if (verdict.IsBusy()) return verdict;
        if (!verdict.ok()) {
          return Status::InvalidArgument("peer refused authentication: " + verdict.message());
        }
        // Servers built before features were offered send none.
        uint32_t features = 0;
        if (!in.empty() && !GetFixed32(&in, &features)) {
          return Status::Corruption("malformed feature list");
        }
        unhashed_ = want_unhashed_ && (features & wire::kFeatureLoopbackUnhashed) != 0;
        get_groups_ = (features & wire::kFeatureGetGroups) != 0;
      }
    }
    return Status::OK();
  }

  // False when the connection failed, or -- idle, with no call waiting for an answer
  // -- has something to read: the peer closed it (a restart) or broke the protocol.
  // A connection that brought an answer within the last kTrustedFor is not asked: no
  // peer restarts that fast, and back-to-back calls are spared a system call each.
  // True when no call waits for an answer on this connection (a broken one has none).
  bool Idle() {
    MutexLock lock(&mu_);
    return calls_.empty();
  }
  // Whether the peer closed this connection (its process exited or was killed: the
  // kernel closes its sockets at once) or it failed, seen without reading it.  For a
  // connection no call is waiting on: anything to read on it then means closed.
  bool ClosedByPeer() {
    MutexLock lock(&mu_);
    if (broken_) return true;
    if (!calls_.empty()) return false;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (reader_.buffered() == 0 && poll(&p, 1, 0) == 0) return false;
    BreakLocked(Status::IOError("connection closed by peer"));
    return true;
  }
  int fd() const { return fd_; }

  bool Healthy() {
    MutexLock lock(&mu_);
    if (broken_) return false;
    if (!calls_.empty()) return true;  // and so the reader, if any, is one of them
    if (reader_.buffered() > 0) {
      BreakLocked(Status::Corruption("peer sent bytes no call waits for"));
      return false;
    }
    if (SteadyClock::now() - last_answer_ < kTrustedFor) return true;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) > 0) {
      BreakLocked(Status::IOError("connection closed by peer"));
      return false;
    }
    return true;
  }

  // One call: its request's id, where its answer goes, and how it went.
  struct Pending {
    ResponseSink* sink = nullptr;
    bool registered = false;  // in calls_, awaiting its answer
    bool done = false;
    bool filling = false;  // a reader is writing into the sink's memory
    Status status;
    uint64_t id = 0;
    Deadline deadline{};
  };

  Status Call(uint8_t op, const std::string& meta, std::span<const Slice> body,
              ResponseSink* sink) {
    Pending p;
    p.sink = sink;
    Begin(op, meta, body, &p);
    return Finish(&p);
  }

  // Writes the request of *p (whose sink is set) and returns without waiting for the
  // answer: Finish(p) waits.  Requests begun one after another are pipelined: each is
  // answered by id, whoever reads.  *p must stay valid until Finish returns.
  void Begin(uint8_t op, const std::string& meta, std::span<const Slice> body, Pending* p) {
    BeginMany(op, meta, body, std::span<Pending* const>(&p, 1));
  }

  // True when the server answers GET_GROUPS (set by Handshake, then fixed).
  bool serves_get_groups() const { return get_groups_; }

  // As Begin, for a request answered by one frame per call of `calls` (GET_GROUPS):
  // they take consecutive ids, the request carrying the first, so that each answer
  // frame is delivered to its own call as any answer is.
  void BeginMany(uint8_t op, const std::string& meta, std::span<const Slice> body,
                 std::span<Pending* const> calls) {
    const Deadline deadline = DeadlineIn(timeout_ms_);
    uint64_t first = 0;
    {
      MutexLock lock(&mu_);
      for (Pending* p : calls) {
        p->deadline = deadline;
        if (broken_) {
          p->done = true;
          p->status = broken_status_;
        }
      }
      if (broken_) return;
      first = next_id_;
      next_id_ += calls.size();
      for (size_t i = 0; i < calls.size(); i++) {
        calls[i]->id = first + i;
        calls[i]->registered = true;
        calls_[first + i] = calls[i];
      }
    }
    Status s;
    {
      MutexLock lock(&write_mu_);
      s = SendFrame(fd_, op, unhashed_ ? wire::kFlagBodyUnhashed : 0, first, meta, body, deadline);
    }
    if (!s.ok()) {
      MutexLock lock(&mu_);
      BreakLocked(s);
    }
  }

  // Reads the frames that have arrived, without waiting for one to begin, while no
  // other caller is reading; true when *p's answer is in (or the call failed): Finish
  // would return at once.
  bool Progress(Pending* p) {
    MutexLock lock(&mu_);
    while (!p->done && !reader_active_) {
      reader_active_ = true;
      lock.Unlock();
      Status rs = ReadOneFrame(SteadyClock::now());
      lock.Lock();
      reader_active_ = false;
      cv_.NotifyAll();
      if (rs.IsBusy()) break;  // nothing more has arrived
      if (!rs.ok()) BreakLocked(rs);
    }
    return p->done;
  }

  // Waits for the answer of a call begun with Begin, reading frames (its own and other
  // calls') while no other caller is; returns the call's status.
  Status Finish(Pending* p) {
    MutexLock lock(&mu_);
    if (!p->registered) return p->status;
    while (!p->done) {
      if (!reader_active_) {
        reader_active_ = true;
        lock.Unlock();
        Status rs = ReadOneFrame(p->deadline);
        lock.Lock();
        reader_active_ = false;
        cv_.NotifyAll();
        if (rs.IsBusy()) {  // nothing arrived by our deadline
          if (!p->done)
            BreakLocked(Status::IOError("timed out after " + std::to_string(timeout_ms_) + " ms"));
        } else if (!rs.ok()) {
          BreakLocked(rs);
        }
        continue;
      }
      if (!cv_.WaitUntil(&mu_, p->deadline) && !p->done) {
        // Someone else is reading; if it is filling our buffers let it finish.
        while (p->filling) cv_.Wait(&mu_);
        if (!p->done) {
          BreakLocked(Status::IOError("timed out after " + std::to_string(timeout_ms_) + " ms"));
        }
      }
    }
    calls_.erase(p->id);
    p->registered = false;
    return p->status;
  }

 private:
  // Fails every call not being filled; the reader filling one finishes it (its read
  // fails on the shut socket).
  void BreakLocked(const Status& s) REQUIRES(mu_) {
    if (!broken_) {
      broken_ = true;
      broken_status_ = s;
      shutdown(fd_, SHUT_RDWR);
    }
    for (auto& [id, p] : calls_) {
      if (!p->filling && !p->done) {
        p->done = true;
        p->status = broken_status_;
      }
    }
    cv_.NotifyAll();
  }

  // Reads one frame and delivers it.  Busy: nothing arrived by deadline (the stream is
  // still in step).  Another error: the connection must be dropped.
  Status ReadOneFrame(Deadline deadline) {
    // An answer is seldom in right after its request went: wait first, then read, unless
    // the last read brought the frame's first bytes already.
    if (reader_.buffered() == 0 && !WaitReadable(fd_, deadline).ok()) {
      return Status::Busy("idle");
    }
    // A frame that started is read to its end even past the caller's deadline.
    const Deadline frame_deadline = std::max(deadline, DeadlineIn(timeout_ms_));
    char header[wire::kHeaderSize];
    std::vector<iovec> iov{{header, sizeof(header)}};
    Status s = reader_.Read(&iov, frame_deadline, nullptr);
    wire::FrameHeader h;
    if (s.ok()) s = wire::FrameHeader::DecodeFrom(header, &h);
    if (!s.ok()) return s;
    if (!(h.flags & wire::kFlagResponse)) return Status::Corruption("peer sent a request");
    const bool unhashed = (h.flags & wire::kFlagBodyUnhashed) != 0;
    if (unhashed && !unhashed_) {
      return Status::Corruption("peer sent an unhashed body on a connection that hashes them");
    }
    Pending* p = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = calls_.find(h.request_id);
      if (it != calls_.end() && !it->second->done) {
        p = it->second;
        p->filling = true;
      }
    }
    Hasher64 hasher;
    hasher.Update(header, 32);
    std::string meta(h.meta_len, '\0');
    iov = {{meta.data(), meta.size()}};
    s = reader_.Read(&iov, frame_deadline, &hasher);
    // An unhashed body's frame is checked now, before its metadata says where the body
    // goes; a hashed one once the body is in.
    if (s.ok() && unhashed && hasher.Digest() != h.checksum) {
      s = Status::Corruption("response checksum mismatch");
    }
    Status call_status;
    if (s.ok()) {
      iov.clear();
      call_status =
          p != nullptr ? p->sink->OnMeta(meta, h.body_len, &iov) : Status::Aborted("no caller");
      uint64_t total = 0;
      for (const iovec& v : iov) total += v.iov_len;
      if (call_status.ok() && total != h.body_len) {
        call_status = Status::Corruption("response body does not match its metadata");
      }
      Hasher64* body_hasher = unhashed ? nullptr : &hasher;
      s = call_status.ok() ? reader_.Read(&iov, frame_deadline, body_hasher)
                           : Discard(&reader_, h.body_len, frame_deadline, body_hasher);
    }
    if (s.ok() && !unhashed && hasher.Digest() != h.checksum) {
      s = Status::Corruption("response checksum mismatch");
    }
    MutexLock lock(&mu_);
    if (p != nullptr) {
      p->filling = false;
      p->done = true;
      p->status = !s.ok() ? s : call_status;
    }
    if (s.ok()) last_answer_ = SteadyClock::now();
    cv_.NotifyAll();
    return s;
  }

  static constexpr auto kTrustedFor = std::chrono::milliseconds(1);

  const int fd_;
  const uint64_t timeout_ms_;
  const bool want_unhashed_;
  // Every read of fd_ goes through it: the handshake's, then the reader's of the moment.
  ReadAhead reader_;
  bool unhashed_ = false;  // bodies left out of checksums; set by Handshake, then fixed
  bool get_groups_ = false;  // the server answers GET_GROUPS; set by Handshake, then fixed
  Mutex write_mu_;    // one frame written at a time
  Mutex mu_;
  CondVar cv_;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Pending*> calls_ GUARDED_BY(mu_);
  bool reader_active_ GUARDED_BY(mu_) = false;
  bool broken_ GUARDED_BY(mu_) = false;
  Status broken_status_ GUARDED_BY(mu_);
  Deadline last_answer_ GUARDED_BY(mu_) {};
};

// ---------------------------------------------------------------- the pool
struct TcpTransport::Peer {
  explicit Peer(size_t connections) : slots(connections) {}

  // Which slot the next call uses: the first connection with no call in flight; else
  // the first slot not connected yet; else (every connection busy) the next in turn, to
  // pipeline on.  A caller that waits for each answer before its next call therefore
  // always uses the same connection, whose socket, buffers and TCP state stay warm,
  // instead of taking each one in turn; callers in parallel still spread over the
  // connections.
  size_t ChooseSlot() REQUIRES(mu) {
    size_t empty = slots.size();
    for (size_t i = 0; i < slots.size(); i++) {
      if (slots[i] == nullptr) {
        empty = std::min(empty, i);
      } else if (slots[i]->Idle()) {
        return i;
      }
    }
    if (empty < slots.size()) return empty;
    return next++ % slots.size();
  }

  Mutex mu;
  std::vector<std::shared_ptr<TcpConnection>> slots GUARDED_BY(mu);
  size_t next GUARDED_BY(mu) = 0;
  uint64_t backoff_ms GUARDED_BY(mu) = 0;
  Deadline retry_after GUARDED_BY(mu) {};
  Status last_error GUARDED_BY(mu);
};

TcpTransport::TcpTransport(const TransportOptions& options) : options_(options) {
  registrar_ = std::make_shared<Registrar>(this);
}

TcpTransport::~TcpTransport() = default;

void TcpTransport::Log(LogLevel level, const std::string& line) const {
  if (options_.log) {
    options_.log(level, line);
  } else if (level >= LogLevel::kWarn) {
    std::fprintf(stderr, "[kvengine transport] %s\n", line.c_str());
  }
}

Status TcpTransport::RegisterMemory(void* addr, size_t length, const char* what) {
  return regions_.Add(addr, length, (std::string("registering ") + what).c_str());
}

void TcpTransport::UnregisterMemory(void* addr, size_t) { regions_.Remove(addr); }

std::shared_ptr<MemoryRegistrar> TcpTransport::registrar() { return registrar_; }

TcpTransport::Peer* TcpTransport::PeerFor(const Endpoint& peer) {
  MutexLock lock(&peers_mu_);
  auto& p = peers_[peer.ToString()];
  if (p == nullptr) {
    p = std::make_unique<Peer>(std::max<uint32_t>(1, options_.connections_per_peer));
  }
  return p.get();
}

Status TcpTransport::Connection(const Endpoint& peer, std::shared_ptr<TcpConnection>* conn) {
  Peer* p = PeerFor(peer);
  MutexLock lock(&p->mu);
  const size_t slot = p->ChooseSlot();
  if (p->slots[slot] != nullptr && p->slots[slot]->Healthy()) {
    *conn = p->slots[slot];
    return Status::OK();
  }
  p->slots[slot].reset();
  const Deadline now = SteadyClock::now();
  if (now < p->retry_after) {
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(p->retry_after - now).count();
    return Status::IOError("unavailable (" + p->last_error.message() + "); retrying in " +
                           std::to_string(wait) + " ms");
  }
  std::shared_ptr<TcpConnection> c;
  Status s = Connect(peer, &c);
  if (!s.ok()) {
    p->backoff_ms = p->backoff_ms == 0
                        ? options_.reconnect_backoff_min_ms
                        : std::min(p->backoff_ms * 2, options_.reconnect_backoff_max_ms);
    p->retry_after = SteadyClock::now() + std::chrono::milliseconds(p->backoff_ms);
    p->last_error = s;
    Log(LogLevel::kWarn, "peer " + peer.ToString() + ": " + s.ToString() + "; next try in " +
                             std::to_string(p->backoff_ms) + " ms");
    return s;
  }
  if (p->backoff_ms != 0) Log(LogLevel::kInfo, "peer " + peer.ToString() + ": reconnected");
  p->backoff_ms = 0;
  p->slots[slot] = c;
  *conn = std::move(c);
  return Status::OK();
}

namespace {

// A call's failure, naming the peer; connection-level failures are IOErrors (a refused
// token stays InvalidArgument, a server at its cap of connections Busy, a closed
// server's answer keeps its code, and so does a refusal of the connection's tenant).
Status NamePeer(const Endpoint& peer, const Status& s) {
  if (s.ok()) return s;
  const std::string what = "peer " + peer.ToString() + ": " + s.message();
  if (s.IsInvalidArgument() || s.IsAborted() || s.IsNotSupported() || s.IsNotFound() ||
      s.IsBusy() || s.IsPermissionDenied()) {
    return Status::FromErrorCode(s.ErrorCode(), what);
  }
  if (s.IsCorruption()) return Status::Corruption(what);
  return Status::IOError(what);
}

}  // namespace

Status TcpTransport::Connect(const Endpoint& peer, std::shared_ptr<TcpConnection>* conn) {
  const Deadline deadline = DeadlineIn(options_.timeout_ms);
  int fd = -1;
  Status s = ConnectTcp(peer, deadline, &fd);
  if (!s.ok()) return s;
  auto c = std::make_shared<TcpConnection>(fd, options_.timeout_ms,
                                           !options_.hash_loopback_bodies && PeerIsLoopback(fd));
  s = c->Handshake(options_.auth_token, options_.auth_tenant, deadline);
  if (s.ok()) *conn = std::move(c);
  return s;
}

Status TcpTransport::OwnConnection(const Endpoint& peer, std::shared_ptr<TcpConnection>* conn) {
  return NamePeer(peer, Connect(peer, conn));
}

Status TcpTransport::CallOn(TcpConnection* conn, const Endpoint& peer, uint8_t op,
                            const std::string& meta, std::span<const Slice> body,
                            ResponseSink* sink) {
  return NamePeer(peer, conn->Call(op, meta, body, sink));
}

bool TcpTransport::ClosedByPeer(TcpConnection* conn) { return conn->ClosedByPeer(); }

int TcpTransport::FdOf(const TcpConnection& conn) { return conn.fd(); }

Status TcpTransport::Call(const Endpoint& peer, uint8_t op, const std::string& meta,
                          std::span<const Slice> body, ResponseSink* sink) {
  std::shared_ptr<TcpConnection> conn;
  Status s = Connection(peer, &conn);
  if (s.ok()) s = conn->Call(op, meta, body, sink);
  return NamePeer(peer, s);
}

namespace {

// Decodes batch status + results for n keys.
Status DecodeResults(std::string_view meta, size_t n, std::vector<int64_t>* results) {
  Status batch;
  if (!wire::GetBatchStatus(&meta, &batch)) return Status::Corruption("malformed answer");
  if (!batch.ok()) return batch;
  if (!wire::GetResults(&meta, results) || results->size() != n || !meta.empty()) {
    return Status::Corruption("answer has the wrong number of results");
  }
  return Status::OK();
}

// Get answers: results, then the found values back to back, scattered into dests.
class GetSink final : public ResponseSink {
 public:
  GetSink(std::span<const Destination> dests, std::vector<std::string>* owned,
          std::vector<int64_t>* results)
      : dests_(dests), owned_(owned), results_(results) {}

  Status OnMeta(std::string_view meta, uint64_t body_len, std::vector<iovec>* iov) override {
    const size_t n = owned_ != nullptr ? owned_->size() : dests_.size();
    Status s = DecodeResults(meta, n, results_);
    if (!s.ok()) return s;
    for (size_t i = 0; i < n; i++) {
      const int64_t r = (*results_)[i];
      if (r < 0) continue;
      uint64_t left = static_cast<uint64_t>(r);
      if (left > body_len) return Status::Corruption("value sizes exceed the body");
      if (owned_ != nullptr) {
        (*owned_)[i].resize(left);
        if (left > 0) iov->push_back({(*owned_)[i].data(), left});
        continue;
      }
      for (const MutableSlice& d : dests_[i]) {
        if (left == 0) break;
        const uint64_t k = std::min<uint64_t>(left, d.size());
        if (k > 0) iov->push_back({d.data(), k});
        left -= k;
      }
      if (left != 0) return Status::Corruption("peer sent a value larger than its buffers");
    }
    return Status::OK();
  }

 private:
  std::span<const Destination> dests_;
  std::vector<std::string>* owned_;
  std::vector<int64_t>* results_;
};

// A GET begun on a connection (TcpTransport::StartBatchGet), finished by Wait.
class TcpPendingGet final : public PendingGet {
 public:
  TcpPendingGet(const Endpoint& peer, std::span<const Destination> dests,
                std::vector<int64_t>* results)
      : peer_(peer), n_(dests.size()), results_(results), sink_(dests, nullptr, results) {
    call_.sink = &sink_;
  }
  ~TcpPendingGet() override { Wait(); }

  // Begins the GET on `conn`, or records why there is no connection to begin it on.
  void Begin(Status connected, std::shared_ptr<TcpConnection> conn, const std::string& meta) {
    if (!connected.ok()) {
      status_ = connected;
      return;
    }
    conn_ = std::move(conn);
    conn_->Begin(wire::kGet, meta, {}, &call_);
  }

  // The call's entry on its connection, for a request that answers several calls
  // (TcpConnection::BeginMany), and the connection it was begun on.
  TcpConnection::Pending* call() { return &call_; }
  void BegunOn(std::shared_ptr<TcpConnection> conn) { conn_ = std::move(conn); }

  // Takes in the answers that have arrived on the connection (this one's or others').
  bool Ready() override { return waited_ || conn_ == nullptr || conn_->Progress(&call_); }

  Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    if (conn_ != nullptr) status_ = conn_->Finish(&call_);
    if (!status_.ok()) {
      status_ = NamePeer(peer_, status_);
      FailAll(status_, n_, results_);
    }
    return status_;
  }

 private:
  const Endpoint peer_;
  const size_t n_;
  std::vector<int64_t>* const results_;
  GetSink sink_;
  TcpConnection::Pending call_;
  std::shared_ptr<TcpConnection> conn_;
  bool waited_ = false;
  Status status_;
};

}  // namespace

Status TcpTransport::ResultsCall(const Endpoint& peer, uint8_t op, std::span<const Slice> keys,
                                 const uint64_t* extra, std::span<const Slice> body,
                                 std::vector<int64_t>* results) {
  std::string meta;
  wire::PutKeys(&meta, keys, extra);
  MetaSink sink;
  Status s = Call(peer, op, meta, body, &sink);
  if (s.ok()) {
    s = DecodeResults(sink.meta, keys.size(), results);
    if (!s.ok()) {
      s = Status::FromErrorCode(s.ErrorCode(), "peer " + peer.ToString() + ": " + s.message());
    }
  }
  if (!s.ok()) return FailAll(s, keys.size(), results);
  return s;
}

Status TcpTransport::BatchGet(const Endpoint& peer, std::span<const Slice> keys,
                              std::span<const Destination> destinations,
                              std::vector<int64_t>* results) {
  Status checked = input::CheckBatch("BatchGet", results, keys.size(), destinations.size(),
                                     "destinations", 0);
  if (!checked.ok()) return checked;
  std::vector<uint64_t> capacity(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    for (const MutableSlice& d : destinations[i]) capacity[i] += d.size();
  }
  std::string meta;
  wire::PutKeys(&meta, keys, capacity.data());
  GetSink sink(destinations, nullptr, results);
  Status s = Call(peer, wire::kGet, meta, {}, &sink);
  if (!s.ok()) return FailAll(s, keys.size(), results);
  return s;
}

std::unique_ptr<PendingGet> TcpTransport::StartBatchGet(const Endpoint& peer,
                                                        std::span<const Slice> keys,
                                                        std::span<const Destination> destinations,
                                                        std::vector<int64_t>* results) {
  Status checked =
      input::CheckBatch("BatchGet", results, keys.size(), destinations.size(), "destinations", 0);
  if (!checked.ok()) return Transport::StartBatchGet(peer, keys, destinations, results);
  std::vector<uint64_t> capacity(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    for (const MutableSlice& d : destinations[i]) capacity[i] += d.size();
  }
  std::string meta;
  wire::PutKeys(&meta, keys, capacity.data());
  auto call = std::make_unique<TcpPendingGet>(peer, destinations, results);
  std::shared_ptr<TcpConnection> conn;
  Status s = Connection(peer, &conn);
  call->Begin(s, std::move(conn), meta);
  return call;
}

// The bytes one GET_GROUPS request asks for at most: the server queues a request's answers
// at once, and more than its max_queued_bytes not yet taken would close the connection.
constexpr uint64_t kMaxGroupedBytes = 64ull << 20;

void TcpTransport::StartBatchGetGroups(const Endpoint& peer, std::span<const GetGroup> groups,
                                       std::vector<std::unique_ptr<PendingGet>>* calls) {
  calls->clear();
  std::shared_ptr<TcpConnection> conn;
  bool grouped = groups.size() > 1 && Connection(peer, &conn).ok() && conn->serves_get_groups();
  // Each group's capacity per key; an empty group, or one StartBatchGet would refuse, goes
  // as StartBatchGet takes it.
  std::vector<std::vector<uint64_t>> capacity(groups.size());
  for (size_t g = 0; g < groups.size() && grouped; g++) {
    const GetGroup& group = groups[g];
    grouped = !group.keys.empty() && group.keys.size() <= wire::kMaxKeysPerRequest &&
              input::CheckBatch("BatchGet", group.results, group.keys.size(),
                                group.destinations.size(), "destinations", 0)
                  .ok();
    for (size_t i = 0; i < group.keys.size() && grouped; i++) {
      capacity[g].push_back(0);
      for (const MutableSlice& d : group.destinations[i]) capacity[g].back() += d.size();
    }
  }
  if (!grouped) {
    // A server built before GET_GROUPS, or nothing to gain: a GET per group.
    return Transport::StartBatchGetGroups(peer, groups, calls);
  }
  // Groups [first, end) in one request: within kMaxGroupedBytes and the keys a request
  // may name (at least one group).
  for (size_t first = 0; first < groups.size();) {
    std::vector<uint32_t> counts;
    std::vector<Slice> keys;
    std::vector<uint64_t> caps;
    uint64_t bytes = 0;
    size_t end = first;
    for (; end < groups.size(); end++) {
      uint64_t b = 0;
      for (uint64_t c : capacity[end]) b += c;
      if (end > first && (bytes + b > kMaxGroupedBytes ||
                          keys.size() + groups[end].keys.size() > wire::kMaxKeysPerRequest)) {
        break;
      }
      bytes += b;
      counts.push_back(static_cast<uint32_t>(groups[end].keys.size()));
      keys.insert(keys.end(), groups[end].keys.begin(), groups[end].keys.end());
      caps.insert(caps.end(), capacity[end].begin(), capacity[end].end());
    }
    std::string meta;
    wire::PutGetGroups(&meta, counts, keys, caps.data());
    std::vector<TcpConnection::Pending*> pending;
    for (size_t g = first; g < end; g++) {
      auto call = std::make_unique<TcpPendingGet>(peer, groups[g].destinations, groups[g].results);
      pending.push_back(call->call());
      call->BegunOn(conn);
      calls->push_back(std::move(call));
    }
    conn->BeginMany(wire::kGetGroups, meta, {}, pending);
    first = end;
  }
}

Status TcpTransport::BatchGetOwned(const Endpoint& peer, std::span<const Slice> keys,
                                   std::vector<std::string>* values,
                                   std::vector<int64_t>* results) {
  values->assign(keys.size(), std::string());
  std::vector<uint64_t> capacity(keys.size(), std::numeric_limits<uint64_t>::max());
  std::string meta;
  wire::PutKeys(&meta, keys, capacity.data());
  GetSink sink({}, values, results);
  Status s = Call(peer, wire::kGet, meta, {}, &sink);
  if (!s.ok()) return FailAll(s, keys.size(), results);
  return s;
}

Status TcpTransport::BatchPut(const Endpoint& peer, std::span<const Slice> keys,
                              std::span<const ValueParts> values, std::vector<int64_t>* results) {
  Status checked =
      input::CheckBatch("BatchPut", results, keys.size(), values.size(), "values", 0);
  if (!checked.ok()) return checked;
  std::vector<uint64_t> sizes(keys.size());
  std::vector<Slice> body;
  for (size_t i = 0; i < keys.size(); i++) {
    checked = CheckNoNullBuffer(keys[i], values[i], "value");
    if (!checked.ok()) return checked;
    for (const Slice& part : values[i]) {
      sizes[i] += part.size();
      body.push_back(part);
    }
  }
  return ResultsCall(peer, wire::kPut, keys, sizes.data(), body, results);
}

Status TcpTransport::BatchExists(const Endpoint& peer, std::span<const Slice> keys,
                                 std::vector<int64_t>* results) {
  return ResultsCall(peer, wire::kExists, keys, nullptr, {}, results);
}

Status TcpTransport::BatchDelete(const Endpoint& peer, std::span<const Slice> keys,
                                 std::vector<int64_t>* results) {
  return ResultsCall(peer, wire::kDelete, keys, nullptr, {}, results);
}

namespace {

// A server built before ops 11 and 12 existed takes them for a malformed frame and
// closes the connection (the client sees an end of stream, or a reset when the request
// was left unread); say so, rather than leave a bare "connection closed".
Status ExplainNewOp(const Status& s, uint8_t op) {
  const std::string& m = s.message();
  const bool dropped = m.find("closed by peer") != std::string::npos ||
                       m.find("reset by peer") != std::string::npos ||
                       m.find("Broken pipe") != std::string::npos;
  if (!s.IsIOError() || !dropped) return s;
  return Status::IOError(m, "dropped on request op " + std::to_string(op) +
                                " (a server older than that op closes the connection on "
                                "it: upgrade the peer)");
}

}  // namespace

Status TcpTransport::BatchValueSize(const Endpoint& peer, std::span<const Slice> keys,
                                    std::vector<int64_t>* results) {
  Status s = ResultsCall(peer, wire::kValueSize, keys, nullptr, {}, results);
  if (!s.ok()) return FailAll(ExplainNewOp(s, wire::kValueSize), keys.size(), results);
  return s;
}

Status TcpTransport::DeleteByRegex(const Endpoint& peer, const std::string& pattern,
                                   uint64_t* deleted) {
  return DeleteMatching(peer, wire::kMatchRegex, pattern, deleted);
}

Status TcpTransport::DeleteAll(const Endpoint& peer, uint64_t* deleted) {
  return DeleteMatching(peer, wire::kMatchAll, "", deleted);
}

Status TcpTransport::DeleteMatching(const Endpoint& peer, uint8_t mode, std::string_view pattern,
                                    uint64_t* deleted) {
  const std::string who = "peer " + peer.ToString();
  if (pattern.size() > wire::kMaxPatternLen) {
    return Status::InvalidArgument(who, "pattern of " + std::to_string(pattern.size()) +
                                            " bytes exceeds the limit of " +
                                            std::to_string(wire::kMaxPatternLen));
  }
  std::string meta;
  wire::PutDeleteMatching(&meta, static_cast<wire::MatchMode>(mode), pattern);
  MetaSink sink;
  Status s = Call(peer, wire::kDeleteMatching, meta, {}, &sink);
  if (!s.ok()) return ExplainNewOp(s, wire::kDeleteMatching);
  std::string_view in(sink.meta);
  Status batch;
  uint64_t n = 0;
  if (!wire::GetBatchStatus(&in, &batch)) return Status::Corruption(who, "malformed answer");
  if (!batch.ok()) return Status::FromErrorCode(batch.ErrorCode(), who + ": " + batch.message());
  if (!GetFixed64(&in, &n) || !in.empty()) return Status::Corruption(who, "malformed count");
  if (deleted != nullptr) *deleted = n;
  return Status::OK();
}

Status TcpTransport::SyncNamespaces(const Endpoint& peer, const std::string& request,
                                    std::string* answer) {
  MetaSink sink;
  Status s = Call(peer, wire::kSyncNamespaces, request, {}, &sink);
  if (!s.ok()) return ExplainNewOp(s, wire::kSyncNamespaces);
  std::string_view in(sink.meta);
  Status batch;
  std::string_view v;
  if (!wire::GetBatchStatus(&in, &batch) || !GetLengthPrefixed(&in, &v) || !in.empty()) {
    return Status::Corruption("peer " + peer.ToString() + ": malformed namespace answer");
  }
  if (!batch.ok()) {
    return Status::FromErrorCode(batch.ErrorCode(),
                                 "peer " + peer.ToString() + ": " + batch.message());
  }
  answer->assign(v);
  return Status::OK();
}

Status TcpTransport::GetProperty(const Endpoint& peer, const std::string& name,
                                 std::string* value) {
  std::string meta;
  PutLengthPrefixed(&meta, name);
  MetaSink sink;
  Status s = Call(peer, wire::kProperty, meta, {}, &sink);
  if (!s.ok()) return s;
  std::string_view in(sink.meta);
  Status batch;
  std::string_view v;
  if (!wire::GetBatchStatus(&in, &batch) || !GetLengthPrefixed(&in, &v)) {
    return Status::Corruption("peer " + peer.ToString() + ": malformed property answer");
  }
  if (!batch.ok()) return batch;
  value->assign(v);
  return Status::OK();
}

}  // namespace kvengine
