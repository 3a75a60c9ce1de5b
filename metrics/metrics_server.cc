#include "metrics/metrics_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvengine/transport.h"
#include "transport/socket_util.h"
#include "util/mutex.h"

namespace kvengine {

namespace {

using Clock = std::chrono::steady_clock;

const char* StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

// The bytes of one answer: status line, headers, and the body unless `head_only`.
std::string RenderAnswer(int status, const std::string& body, const char* type, bool head_only,
                         bool keep_alive, bool http11) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + StatusText(status) + "\r\n";
  out += "Content-Type: ";
  out += type;
  out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  if (status == 405) out += "Allow: GET, HEAD\r\n";
  if (!keep_alive) {
    out += "Connection: close\r\n";
  } else if (!http11) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  if (!head_only) out += body;
  return out;
}

constexpr const char* kText = "text/plain; charset=utf-8";

bool Routed(const std::string& path) {
  return path == "/metrics" || path == "/stats.json" || path == "/health" || path == "/ready";
}

// The answer to a GET or HEAD of a routed path, from the Source (a renderer thread).
std::string Handle(MetricsServer::Source* source, const HttpRequestHead& head) {
  const bool head_only = head.method == "HEAD";
  auto answer = [&](int status, const std::string& body, const char* type = kText) {
    return RenderAnswer(status, body, type, head_only, head.keep_alive, head.http11);
  };
  std::string text;
  if (head.path == "/metrics") {
    if (!source->Metrics(&text)) return answer(503, source->Health().ToString() + "\n");
    return answer(200, text, "text/plain; version=0.0.4; charset=utf-8");
  }
  if (head.path == "/stats.json") {
    if (!source->StatsJson(&text)) return answer(503, source->Health().ToString() + "\n");
    return answer(200, text, "application/json");
  }
  if (head.path == "/health") {
    const Status health = source->Health();
    if (!health.ok()) return answer(503, health.ToString() + "\n");
    const uint64_t epoch = source->Epoch();
    return answer(200, epoch != 0 ? "ok\nepoch: " + std::to_string(epoch) + "\n" : "ok\n");
  }
  const Status ready = source->Ready(&text);  // "/ready"
  return answer(ready.ok() ? 200 : 503, text);
}

}  // namespace

// The event loop and the renderer threads of one MetricsServer.  Everything but the
// job and answer queues belongs to the loop thread alone.
class MetricsServer::Loop {
 public:
  Loop(int listen_fd, Source* source, const Limits& limits)
      : listen_fd_(listen_fd), source_(source), limits_(limits) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    Watch(listen_fd_, kListenId, EPOLLIN, EPOLL_CTL_ADD);
    Watch(wake_fd_, kWakeId, EPOLLIN, EPOLL_CTL_ADD);
    for (size_t i = 0; i < std::max<size_t>(1, limits_.threads); i++) {
      renderers_.emplace_back([this] { Render(); });
    }
    loop_thread_ = std::thread([this] { Run(); });
  }
  ~Loop() { Stop(); }

  void Stop() {
    if (!loop_thread_.joinable()) return;
    stop_.store(true);
    Wake();
    loop_thread_.join();
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    jobs_cv_.NotifyAll();
    for (std::thread& t : renderers_) t.join();
    close(listen_fd_);
    close(wake_fd_);
    close(epoll_fd_);
  }

  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint64_t kListenId = 0;
  static constexpr uint64_t kWakeId = 1;

  enum class State {
    kReading,    // waiting for (the rest of) a request head
    kWaiting,    // a complete request waiting for an answer slot
    kRendering,  // a renderer thread is making its answer
    kWriting,    // its answer is being written
    kDraining,   // refused: answer written, input read and discarded until EOF, then closed
  };

  struct Connection {
    int fd = -1;
    State state = State::kReading;
    std::string in;   // request bytes not yet consumed, at most max_head_bytes + a read
    std::string out;  // the answer being written
    size_t out_pos = 0;
    Clock::time_point since;   // when this state (or, reading, the request's first byte) began
    bool begun = false;        // reading: some byte of the request has arrived
    bool holds_slot = false;   // rendering or writing an answer that counts toward max_answers
    bool close_after = false;  // close (drain) once the answer is written
    HttpRequestHead head;
  };

  struct Job {
    uint64_t id;
    HttpRequestHead head;
  };
  struct Done {
    uint64_t id;
    std::string answer;
  };

  void Watch(int fd, uint64_t id, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd_, op, fd, &ev);
  }
  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }

  void Run() {
    std::vector<epoll_event> events(64);
    Clock::time_point last_sweep = Clock::now();
    while (!stop_.load()) {
      const int timeout = conns_.empty() ? -1 : 50;
      const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
      for (int i = 0; i < n; i++) {
        const uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          Accept();
        } else if (id == kWakeId) {
          uint64_t count;
          [[maybe_unused]] ssize_t r = read(wake_fd_, &count, sizeof(count));
          TakeAnswers();
        } else {
          OnEvent(id, events[i].events);
        }
      }
      const Clock::time_point now = Clock::now();
      if (now - last_sweep >= std::chrono::milliseconds(50)) {
        Sweep(now);
        last_sweep = now;
      }
    }
    for (auto& [id, c] : conns_) close(c.fd);
    conns_.clear();
  }

  void Accept() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && EvictOldestReader()) continue;
        return;  // EAGAIN, or out of descriptors with none to give back
      }
      if (conns_.size() >= limits_.max_connections && !EvictOldestReader()) {
        close(fd);  // every connection is being answered: no room for one more
        dropped_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const uint64_t id = next_id_++;
      Connection& c = conns_[id];
      c.fd = fd;
      c.since = Clock::now();
      Watch(fd, id, EPOLLIN, EPOLL_CTL_ADD);
    }
  }

  // Closes the connection that has waited longest for its request to complete (or
  // begin): a slow or idle client gives way to a new one.  False when none is reading.
  bool EvictOldestReader() {
    auto oldest = conns_.end();
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      if (it->second.state != State::kReading && it->second.state != State::kDraining) continue;
      if (oldest == conns_.end() || it->second.since < oldest->second.since) oldest = it;
    }
    if (oldest == conns_.end()) return false;
    Drop(oldest->first);
    return true;
  }

  void OnEvent(uint64_t id, uint32_t events) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Connection& c = it->second;
    if (events & (EPOLLERR | EPOLLHUP)) {  // reported whatever was asked: gone
      if (c.state == State::kDraining) {
        Close(id);
      } else {
        Drop(id);  // a renderer's answer for it is then dropped (TakeAnswers)
      }
    } else if (c.state == State::kWriting) {
      Write(id, c);
    } else if (c.state == State::kReading) {
      Read(id, c);
    } else if (c.state == State::kDraining) {
      Drain(id, c);
    }
  }

  void Read(uint64_t id, Connection& c) {
    // Never more than the head's limit (and one read past it, to prove it passed).
    char buf[4096];
    const size_t room =
        limits_.head.max_head_bytes + 1 - std::min(c.in.size(), limits_.head.max_head_bytes);
    const ssize_t n = recv(c.fd, buf, std::min(sizeof(buf), room), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      if (c.begun) dropped_.fetch_add(1, std::memory_order_relaxed);
      Close(id);
      return;
    }
    if (n < 0) return;
    if (!c.begun) {
      c.begun = true;
      c.since = Clock::now();  // the request's deadline runs from its first byte
    }
    c.in.append(buf, static_cast<size_t>(n));
    Parse(id, c);
  }

  // Acts on the request bytes held: waits for more, refuses, answers or dispatches.
  void Parse(uint64_t id, Connection& c) {
    size_t consumed = 0;
    c.head = HttpRequestHead();
    switch (c.head.Parse(c.in, limits_.head, &consumed)) {
      case HttpRequestHead::Result::kIncomplete:
        return;
      case HttpRequestHead::Result::kRefused:
        dropped_.fetch_add(1, std::memory_order_relaxed);
        Answer(id, c, c.head.status, c.head.reason + "\n", /*close=*/true);
        return;
      case HttpRequestHead::Result::kComplete:
        break;
    }
    c.in.erase(0, consumed);
    const HttpRequestHead& h = c.head;
    if (h.method != "GET" && h.method != "HEAD") {
      Answer(id, c, 405, "only GET and HEAD\n", /*close=*/h.has_body || !h.keep_alive);
    } else if (h.has_body) {
      Answer(id, c, 413, "a request body is not read here\n", /*close=*/true);
    } else if (!Routed(h.path)) {
      Answer(id, c, 404, "not found: try /metrics, /health, /ready or /stats.json\n",
             !h.keep_alive);
    } else {
      c.state = State::kWaiting;
      Watch(c.fd, id, 0, EPOLL_CTL_MOD);  // read nothing more until answered
      waiting_.push_back(id);
      Dispatch();
    }
  }

  // Answers on the loop thread, without the Source: small fixed texts.
  void Answer(uint64_t id, Connection& c, int status, const std::string& body, bool close) {
    const bool head_only = c.head.method == "HEAD";
    c.close_after = close;
    c.out = RenderAnswer(status, body, kText, head_only, !close, c.head.http11);
    StartWriting(id, c);
  }

  // Hands waiting requests to the renderers while answer slots are free.
  void Dispatch() {
    while (!waiting_.empty() && answers_ < limits_.max_answers) {
      const uint64_t id = waiting_.front();
      waiting_.pop_front();
      auto it = conns_.find(id);
      if (it == conns_.end() || it->second.state != State::kWaiting) continue;
      Connection& c = it->second;
      c.state = State::kRendering;
      c.holds_slot = true;
      c.close_after = !c.head.keep_alive;
      answers_++;
      {
        MutexLock lock(&mu_);
        jobs_.push_back(Job{id, c.head});
      }
      jobs_cv_.NotifyOne();
    }
  }

  void TakeAnswers() {
    std::deque<Done> done;
    {
      MutexLock lock(&mu_);
      done.swap(done_);
    }
    for (Done& d : done) {
      auto it = conns_.find(d.id);
      if (it == conns_.end()) continue;
      it->second.out = std::move(d.answer);
      StartWriting(d.id, it->second);
    }
  }

  void StartWriting(uint64_t id, Connection& c) {
    c.state = State::kWriting;
    c.out_pos = 0;
    c.since = Clock::now();
    Watch(c.fd, id, EPOLLOUT, EPOLL_CTL_MOD);
    Write(id, c);
  }

  void Write(uint64_t id, Connection& c) {
    while (c.out_pos < c.out.size()) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // EPOLLOUT resumes
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        Drop(id);
        return;
      }
      c.out_pos += static_cast<size_t>(n);
    }
    std::string().swap(c.out);
    ReleaseSlot(c);
    if (c.close_after) {
      // Lingering close: stop sending, discard what the client still sends until it
      // closes (or the deadline), so the answer is not lost to a reset.
      shutdown(c.fd, SHUT_WR);
      std::string().swap(c.in);
      c.state = State::kDraining;
      c.since = Clock::now();
      Watch(c.fd, id, EPOLLIN, EPOLL_CTL_MOD);
      return;
    }
    c.state = State::kReading;
    c.since = Clock::now();
    c.begun = !c.in.empty();
    Watch(c.fd, id, EPOLLIN, EPOLL_CTL_MOD);
    if (c.begun) Parse(id, c);  // a pipelined request already here
  }

  void Drain(uint64_t id, Connection& c) {
    char buf[16384];
    for (int i = 0; i < 16; i++) {  // a bounded share of the loop per wakeup
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (n <= 0) {
        Close(id);
        return;
      }
    }
  }

  void ReleaseSlot(Connection& c) {
    if (!c.holds_slot) return;
    c.holds_slot = false;
    answers_--;
    Dispatch();
  }

  // Closes every connection past its deadline.
  void Sweep(Clock::time_point now) {
    std::vector<uint64_t> expired;
    const auto request = std::chrono::milliseconds(limits_.request_timeout_ms);
    const auto idle = std::chrono::milliseconds(limits_.idle_timeout_ms);
    for (const auto& [id, c] : conns_) {
      // Draining costs no memory: it may take as long as an idle connection may wait.
      const bool idle_bound =
          c.state == State::kDraining || (c.state == State::kReading && !c.begun);
      const bool past =
          c.state != State::kRendering && now - c.since > (idle_bound ? idle : request);
      if (past) expired.push_back(id);
    }
    for (uint64_t id : expired) {
      const State state = conns_[id].state;
      if (state == State::kDraining || (state == State::kReading && !conns_[id].begun)) {
        Close(id);
      } else {
        Drop(id);
      }
    }
  }

  // Closes a connection whose request or answer did not complete.
  void Drop(uint64_t id) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    Close(id);
  }

  void Close(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    close(it->second.fd);  // also leaves the epoll set
    const bool slot = it->second.holds_slot;
    conns_.erase(it);
    if (slot) {
      answers_--;
      Dispatch();
    }
  }

  // A renderer thread: answers jobs until Stop.
  void Render() {
    for (;;) {
      Job job;
      {
        MutexLock lock(&mu_);
        while (!stopping_ && jobs_.empty()) jobs_cv_.Wait(&mu_);
        if (stopping_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::string answer = Handle(source_, job.head);
      {
        MutexLock lock(&mu_);
        done_.push_back(Done{job.id, std::move(answer)});
      }
      Wake();
    }
  }

  const int listen_fd_;
  Source* const source_;
  const Limits limits_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};

  // The loop thread's alone.
  std::unordered_map<uint64_t, Connection> conns_;
  uint64_t next_id_ = 2;
  std::deque<uint64_t> waiting_;  // kWaiting connections, oldest first
  size_t answers_ = 0;            // connections holding an answer slot

  Mutex mu_;
  CondVar jobs_cv_;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  std::deque<Done> done_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;

  std::thread loop_thread_;
  std::vector<std::thread> renderers_;
};

Status MetricsServer::Start(const std::string& listen, Source* source, const Limits& limits,
                            std::unique_ptr<MetricsServer>* result) {
  result->reset();
  Endpoint where;
  const bool port_only =
      !listen.empty() && listen.find_first_not_of("0123456789") == std::string::npos;
  Status s = Endpoint::Parse(port_only ? "127.0.0.1:" + listen : listen, &where);
  if (!s.ok()) return Status::InvalidArgument("metrics_listen", s.message());
  int fd = -1;
  uint16_t port = 0;
  s = ListenTcp(where, &fd, &port, limits.backlog);
  if (!s.ok()) {
    return Status::IOError("metrics_listen: cannot listen on " + where.ToString(), s.message());
  }
  where.port = port;
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->address_ = where.ToString();
  server->loop_ = std::make_unique<Loop>(fd, source, limits);
  *result = std::move(server);
  return Status::OK();
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (loop_ != nullptr) loop_->Stop();
}

uint64_t MetricsServer::dropped_connections() const {
  return loop_ != nullptr ? loop_->dropped() : 0;
}

}  // namespace kvengine
