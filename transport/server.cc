#include "transport/server.h"

#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "transport/socket_util.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {

namespace {

struct Conn {
  int fd = -1;
  std::string peer;  // "ip:port" for messages
  std::string nonce;
  bool authed = false;
  // The last request body's memory, kept for the next one: a fresh multi-MiB buffer per
  // put costs a page fault per page on its first write.
  std::unique_ptr<char[]> body;
  uint64_t body_capacity = 0;
};

// Bodies up to this size keep their buffer for the connection's next request.
constexpr uint64_t kKeptBodyBytes = 64ull << 20;

std::string PeerName(int fd) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

class TcpServer final : public TransportServer {
 public:
  TcpServer(const ServerOptions& options, PeerService* service)
      : options_(options),
        service_(service),
        leases_(std::chrono::milliseconds(options.lease_ttl_ms)) {}
  ~TcpServer() override { Stop(); }

  Status Listen(const Endpoint& at) {
    Status s = ListenTcp(at, &listen_fd_, &port_);
    if (!s.ok()) return s;
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) return Status::IOError("epoll/eventfd failed");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    ev.data.ptr = &wake_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    poller_ = std::thread([this] { PollLoop(); });
    for (int i = 0; i < std::max(1, options_.workers); i++) {
      workers_.emplace_back([this] { WorkLoop(); });
    }
    return Status::OK();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stopping_.store(true);
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    }
    if (poller_.joinable()) poller_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_closed_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();  // each finishes the request it is serving
    workers_.clear();
    for (Conn* c : conns_) {
      close(c->fd);
      delete c;
    }
    conns_.clear();
    leases_.Clear();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    listen_fd_ = epoll_fd_ = wake_fd_ = -1;
  }

  uint16_t port() const override { return port_; }
  uint64_t requests() const override { return requests_.load(); }
  uint64_t rejected_frames() const override { return rejected_.load(); }
  uint64_t refused_auth() const override { return refused_auth_.load(); }

 private:
  void Log(LogLevel level, const std::string& line) {
    if (options_.log) {
      options_.log(level, line);
    } else if (level >= LogLevel::kWarn) {
      std::fprintf(stderr, "[kvengine transport] %s\n", line.c_str());
    }
  }

  void PollLoop() {
    epoll_event events[64];
    while (!stopping_.load()) {
      int n = epoll_wait(epoll_fd_, events, 64, 500);
      for (int i = 0; i < n; i++) {
        void* tag = events[i].data.ptr;
        if (tag == &wake_fd_) continue;
        if (tag == &listen_fd_) {
          Accept();
          continue;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          ready_.push_back(static_cast<Conn*>(tag));
        }
        cv_.notify_one();
      }
    }
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  }

  void Accept() {
    for (;;) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      TuneSocket(fd);
      auto* c = new Conn;
      c->fd = fd;
      c->peer = PeerName(fd);
      c->nonce.resize(wire::kNonceSize);
      {
        std::random_device rd;
        for (size_t i = 0; i < wire::kNonceSize; i += 4) {
          const uint32_t r = rd();
          std::memcpy(&c->nonce[i], &r, 4);
        }
      }
      // The challenge: nonce and whether a token is required.
      std::string meta = c->nonce;
      meta.push_back(options_.auth_token.empty() ? 0 : 1);
      if (!SendFrame(fd, wire::kChallenge, wire::kFlagResponse, 0, meta, {},
                     DeadlineIn(options_.io_timeout_ms))
               .ok()) {
        close(fd);
        delete c;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        conns_.insert(c);
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLONESHOT | EPOLLRDHUP;
      ev.data.ptr = c;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
  }

  void WorkLoop() {
    for (;;) {
      Conn* c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return queue_closed_ || !ready_.empty(); });
        if (ready_.empty()) return;
        c = ready_.front();
        ready_.pop_front();
      }
      bool keep = true;
      // Serve every frame already waiting (pipelined requests), then re-arm.
      do {
        keep = ServeOneFrame(c);
      } while (keep && !stopping_.load() && HasInput(c->fd));
      if (keep && !stopping_.load()) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLONESHOT | EPOLLRDHUP;
        ev.data.ptr = c;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev);
      } else if (!keep) {
        CloseConn(c);
      }
    }
  }

  static bool HasInput(int fd) {
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }

  void CloseConn(Conn* c) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns_.erase(c);
    }
    close(c->fd);
    delete c;
  }

  bool Reject(Conn* c, const std::string& why) {
    rejected_.fetch_add(1);
    Log(LogLevel::kWarn, "closing connection from " + c->peer + ": " + why);
    return false;
  }

  // Reads one frame and answers it.  False: close the connection.
  bool ServeOneFrame(Conn* c) {
    const Deadline deadline = DeadlineIn(options_.io_timeout_ms);
    char header[wire::kHeaderSize];
    std::vector<iovec> iov{{header, sizeof(header)}};
    Status s = ReadFully(c->fd, &iov, deadline, nullptr, &stopping_);
    if (!s.ok()) {
      if (!s.IsAborted() && s.message() != "connection closed by peer") {
        Log(LogLevel::kInfo, "connection from " + c->peer + ": " + s.ToString());
      }
      return false;
    }
    wire::FrameHeader h;
    s = wire::FrameHeader::DecodeFrom(header, &h);
    if (!s.ok()) return Reject(c, s.ToString());
    if (h.flags & wire::kFlagResponse) return Reject(c, "a response frame sent to the server");
    if (!c->authed && h.op != wire::kAuth) return Reject(c, "request before authentication");
    if (h.op == wire::kPut ? h.body_len > wire::kMaxBodyLen : h.body_len != 0) {
      return Reject(c, "unexpected body of " + std::to_string(h.body_len) + " bytes");
    }
    std::string meta(h.meta_len, '\0');
    if (h.body_len > c->body_capacity) {
      c->body.reset();
      c->body_capacity = 0;
      if (h.body_len > 0) {
        c->body.reset(new (std::nothrow) char[h.body_len]);
        if (c->body == nullptr) return Reject(c, "no memory for the body");
        c->body_capacity = h.body_len;
      }
    }
    char* body = c->body.get();
    Hasher64 hasher;
    hasher.Update(header, 32);
    iov.clear();
    if (h.meta_len > 0) iov.push_back({meta.data(), meta.size()});
    if (h.body_len > 0) iov.push_back({body, h.body_len});
    s = ReadFully(c->fd, &iov, deadline, &hasher);
    if (!s.ok()) return Reject(c, "truncated frame: " + s.ToString());
    if (hasher.Digest() != h.checksum) return Reject(c, "frame checksum mismatch");
    requests_.fetch_add(1);
    const bool keep_serving = Dispatch(c, h, meta, body, deadline);
    if (c->body_capacity > kKeptBodyBytes) {  // a rare huge put does not pin its memory
      c->body.reset();
      c->body_capacity = 0;
    }
    return keep_serving;
  }

  bool Answer(Conn* c, uint8_t op, uint64_t id, const std::string& meta,
              std::span<const Slice> body = {}) {
    Status s = SendFrame(c->fd, op, wire::kFlagResponse, id, meta, body,
                         DeadlineIn(options_.io_timeout_ms));
    if (!s.ok()) Log(LogLevel::kInfo, "answering " + c->peer + ": " + s.ToString());
    return s.ok();
  }

  bool AnswerResults(Conn* c, const wire::FrameHeader& h, const Status& s,
                     const std::vector<int64_t>& results) {
    std::string out;
    wire::PutBatchStatus(&out, s);
    wire::PutResults(&out, s.ok() ? results : std::vector<int64_t>());
    return Answer(c, h.op, h.request_id, out);
  }

  bool Dispatch(Conn* c, const wire::FrameHeader& h, const std::string& meta_bytes,
                const char* body, Deadline) {
    std::string_view meta(meta_bytes);
    std::vector<std::string_view> key_views;
    std::vector<uint64_t> extra;
    std::vector<Slice> keys;
    auto get_keys = [&](bool with_extra) {
      if (!wire::GetKeys(&meta, &key_views, with_extra ? &extra : nullptr) || !meta.empty()) {
        return false;
      }
      keys.assign(key_views.begin(), key_views.end());
      return true;
    };
    std::vector<int64_t> results;
    switch (h.op) {
      case wire::kAuth: {
        uint64_t proof = 0;
        const bool has_proof = meta.size() == 8 && GetFixed64(&meta, &proof);
        std::string out;
        if (!options_.auth_token.empty() &&
            (!has_proof || proof != wire::AuthProof(c->nonce, options_.auth_token))) {
          refused_auth_.fetch_add(1);
          Log(LogLevel::kWarn, "refused peer " + c->peer + ": " +
                                   (has_proof ? "wrong auth token" : "no auth token"));
          wire::PutBatchStatus(
              &out, Status::InvalidArgument("authentication refused",
                                            has_proof ? "wrong token" : "a token is required"));
          Answer(c, h.op, h.request_id, out);
          return false;
        }
        c->authed = true;
        wire::PutBatchStatus(&out, Status::OK());
        return Answer(c, h.op, h.request_id, out);
      }
      case wire::kGet:
        if (!get_keys(true)) return Reject(c, "undecodable get request");
        return ServeGet(c, h, keys, extra);
      case wire::kPut: {
        if (!get_keys(true)) return Reject(c, "undecodable put request");
        uint64_t total = 0;
        for (uint64_t n : extra) {
          if (n > h.body_len - total) return Reject(c, "put sizes exceed the body");
          total += n;
        }
        if (total != h.body_len) return Reject(c, "put sizes do not add up to the body");
        std::vector<ValueParts> values(keys.size());
        uint64_t off = 0;
        for (size_t i = 0; i < keys.size(); i++) {
          values[i].emplace_back(body + off, extra[i]);
          off += extra[i];
        }
        Status s = service_->BatchPut(keys, values, &results);
        return AnswerResults(c, h, s, results);
      }
      case wire::kExists: {
        if (!get_keys(false)) return Reject(c, "undecodable exists request");
        Status s = service_->BatchExists(keys, &results);
        return AnswerResults(c, h, s, results);
      }
      case wire::kDelete: {
        if (!get_keys(false)) return Reject(c, "undecodable delete request");
        Status s = service_->BatchDelete(keys, &results);
        return AnswerResults(c, h, s, results);
      }
      case wire::kLookup: {
        if (!get_keys(false)) return Reject(c, "undecodable lookup request");
        std::vector<RemoteLocation> locs(keys.size());
        results.assign(keys.size(), 0);
        const char* base = service_->ArenaBase();
        for (size_t i = 0; i < keys.size(); i++) {
          PinnedValue v;
          if (base != nullptr && service_->Pin(keys[i], &v)) {
            locs[i] = {static_cast<uint64_t>(v.data - base), v.size, v.version,
                       leases_.Grant(std::move(v.pin))};
            results[i] = kLookupPinned;
          } else {
            uint64_t size;
            Status s = service_->GetValueSize(keys[i], &size);
            results[i] = s.ok() ? kLookupNotPinned : s.ErrorCode();
          }
        }
        std::string out;
        wire::PutBatchStatus(&out, Status::OK());
        EncodeLocations(&out, results, locs);
        return Answer(c, h.op, h.request_id, out);
      }
      case wire::kRelease: {
        uint32_t n;
        if (!GetFixed32(&meta, &n) || meta.size() != 8ull * n) {
          return Reject(c, "undecodable release request");
        }
        results.resize(n);
        for (uint32_t i = 0; i < n; i++) {
          uint64_t lease = 0;
          GetFixed64(&meta, &lease);
          results[i] = leases_.Release(lease) ? 1 : 0;
        }
        return AnswerResults(c, h, Status::OK(), results);
      }
      case wire::kProperty: {
        std::string_view name;
        if (!GetLengthPrefixed(&meta, &name) || !meta.empty()) {
          return Reject(c, "undecodable property request");
        }
        std::string value, out;
        const bool known = service_->GetProperty(std::string(name), &value);
        wire::PutBatchStatus(&out,
                             known ? Status::OK() : Status::NotFound("unknown property", name));
        PutLengthPrefixed(&out, known ? value : "");
        return Answer(c, h.op, h.request_id, out);
      }
      case wire::kRdmaConnect: {
        std::string theirs, out;
        Status s = options_.rdma_connect ? options_.rdma_connect(meta, &theirs)
                                         : Status::NotSupported("this server does not serve RDMA");
        wire::PutBatchStatus(&out, s);
        PutLengthPrefixed(&out, theirs);
        return Answer(c, h.op, h.request_id, out);
      }
      case wire::kValueSize: {
        if (!get_keys(false)) return Reject(c, "undecodable value-size request");
        results.resize(keys.size());
        for (size_t i = 0; i < keys.size(); i++) {
          uint64_t size = 0;
          Status s = service_->GetValueSize(keys[i], &size);
          results[i] = s.ok() ? static_cast<int64_t>(size) : s.ErrorCode();
        }
        return AnswerResults(c, h, Status::OK(), results);
      }
      case wire::kDeleteMatching:
        return ServeDeleteMatching(c, h, meta);
      case wire::kChallenge:
        return Reject(c, "a challenge sent to the server");
      default: {
        // A newer client's op.  The frame was whole and its checksum held, so the stream
        // is in step: refuse this request only.
        std::string out;
        wire::PutBatchStatus(
            &out, Status::NotSupported("this server does not know op " + std::to_string(h.op)));
        return Answer(c, h.op, h.request_id, out);
      }
    }
  }

  // Runs DeleteByRegex or DeleteAll on the service (its local tiers).  A malformed
  // message closes the connection; a well-formed one with a bad pattern (too long, not a
  // regex) is answered InvalidArgument.
  bool ServeDeleteMatching(Conn* c, const wire::FrameHeader& h, std::string_view meta) {
    wire::MatchMode mode;
    std::string_view pattern;
    if (!wire::GetDeleteMatching(&meta, &mode, &pattern)) {
      return Reject(c, "undecodable delete-matching request");
    }
    uint64_t deleted = 0;
    Status s;
    if (pattern.size() > wire::kMaxPatternLen) {
      s = Status::InvalidArgument("pattern of " + std::to_string(pattern.size()) +
                                  " bytes exceeds the limit of " +
                                  std::to_string(wire::kMaxPatternLen));
    } else if (mode == wire::kMatchAll) {
      s = service_->DeleteAll(&deleted);
    } else {
      s = service_->DeleteByRegex(std::string(pattern), &deleted);
    }
    std::string out;
    wire::PutBatchStatus(&out, s);
    PutFixed64(&out, s.ok() ? deleted : 0);
    return Answer(c, h.op, h.request_id, out);
  }

  // Values held in memory go out straight from the arena (pinned while they are sent);
  // the others are read through the DB into a buffer first.
  bool ServeGet(Conn* c, const wire::FrameHeader& h, const std::vector<Slice>& keys,
                const std::vector<uint64_t>& capacity) {
    std::vector<int64_t> results(keys.size());
    std::vector<PinnedValue> pinned(keys.size());
    std::vector<std::unique_ptr<char[]>> owned;
    std::vector<Slice> body;
    for (size_t i = 0; i < keys.size(); i++) {
      if (service_->Pin(keys[i], &pinned[i])) {
        if (pinned[i].size > capacity[i]) {
          results[i] = Status::BufferTooSmall("").ErrorCode();
        } else {
          results[i] = static_cast<int64_t>(pinned[i].size);
          body.emplace_back(pinned[i].data, pinned[i].size);
        }
        continue;
      }
      int64_t r = Status::NotFound("").ErrorCode();
      for (int attempt = 0; attempt < 4; attempt++) {
        uint64_t size = 0;
        Status s = service_->GetValueSize(keys[i], &size);
        if (!s.ok()) {
          r = s.ErrorCode();
          break;
        }
        if (size > capacity[i]) {
          r = Status::BufferTooSmall("").ErrorCode();
          break;
        }
        std::unique_ptr<char[]> buf(new char[size > 0 ? size : 1]);
        std::vector<Destination> dest(1);
        dest[0].emplace_back(buf.get(), size);
        std::vector<int64_t> one;
        s = service_->BatchGetInto(std::span<const Slice>(&keys[i], 1), dest, &one);
        r = s.ok() ? one[0] : s.ErrorCode();
        if (r >= 0) {
          body.emplace_back(buf.get(), static_cast<size_t>(r));
          owned.push_back(std::move(buf));
        }
        if (r != Status::BufferTooSmall("").ErrorCode()) break;  // else it grew: again
      }
      results[i] = r;
    }
    std::string out;
    wire::PutBatchStatus(&out, Status::OK());
    wire::PutResults(&out, results);
    return Answer(c, h.op, h.request_id, out, body);
  }

  const ServerOptions options_;
  PeerService* const service_;
  LeaseTable leases_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread poller_;
  std::vector<std::thread> workers_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Conn*> ready_;          // guarded by mu_
  std::unordered_set<Conn*> conns_;  // guarded by mu_
  bool queue_closed_ = false;        // guarded by mu_
  bool stopped_ = false;             // guarded by mu_

  std::atomic<uint64_t> requests_{0}, rejected_{0}, refused_auth_{0};
};

}  // namespace

Status TransportServer::Start(const Endpoint& at, const ServerOptions& options,
                              PeerService* service, std::unique_ptr<TransportServer>* result) {
  auto server = std::make_unique<TcpServer>(options, service);
  Status s = server->Listen(at);
  if (!s.ok()) return s;
  *result = std::move(server);
  return Status::OK();
}

}  // namespace kvengine
