// The harness of the peer tests: kv_server child processes on 127.0.0.1 and
// hand-driven connections to them (test/peer_test.cc, test/server_hardening_test.cc).
// KV_SERVER_PATH names the kv_server binary of the build tree.
#ifndef KVENGINE_TEST_PEER_HARNESS_H_
#define KVENGINE_TEST_PEER_HARNESS_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvengine/transport.h"
#include "test/test_util.h"
#include "transport/socket_util.h"
#include "transport/wire.h"
#include "util/coding.h"

namespace kvengine {

// ThreadSanitizer slows sockets and threads ~10x: smaller loads keep its run short.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

using test::FreePort;

// The transport the peer suites run over: KV_TEST_PEER_TRANSPORT, "tcp" when unset, or
// "ucx/TLS" -- UCX with UCX_TLS=TLS set in this process (and so in the kv_server
// children) before any UCX context is made: CTest runs the suites once per form.
inline const std::string& TransportUnderTest() {
  static const std::string kind = [] {
    const char* e = std::getenv("KV_TEST_PEER_TRANSPORT");
    std::string v = e != nullptr && *e != '\0' ? e : "tcp";
    const size_t slash = v.find('/');
    if (slash != std::string::npos) {
      setenv("UCX_TLS", v.substr(slash + 1).c_str(), 1);
      v.resize(slash);
    }
    return v;
  }();
  return kind;
}

// The directories TempDir made, removed when the test process exits.  A run killed
// before its exit cannot remove its own, so each process also removes, on its first
// TempDir, those of earlier runs whose process is gone: their names end in that
// process's pid.  Every peer test's servers write their DBs there, up to 100s of MiB.
namespace peer_dirs {
inline std::string Base() {
  const char* base = std::getenv("KV_TEST_TMPDIR");
  return base != nullptr ? base : "/tmp";
}
inline std::vector<std::string>& Made() {
  static std::vector<std::string> dirs;
  return dirs;
}
inline void RemoveMade() {
  static const pid_t owner = getpid();
  if (getpid() != owner) return;  // a forked child's exit: the dirs are its parent's
  std::error_code ec;
  for (const std::string& d : Made()) std::filesystem::remove_all(d, ec);
}
inline void RemoveThoseOfDeadRuns() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(Base(), ec)) {
    const std::string name = e.path().filename().string();
    const size_t us = name.rfind('_');
    if (name.rfind("peer_test_", 0) != 0 || us == std::string::npos) continue;
    const std::string pid = name.substr(us + 1);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    std::filesystem::remove_all(e.path(), ec);
  }
}
}  // namespace peer_dirs

inline std::string TempDir(const std::string& name) {
  static const bool swept = [] {
    peer_dirs::RemoveMade();  // fixes RemoveMade's owner to this process
    peer_dirs::RemoveThoseOfDeadRuns();
    std::atexit(peer_dirs::RemoveMade);
    return true;
  }();
  (void)swept;
  std::string dir = peer_dirs::Base() + "/peer_test_" + name + "_" + std::to_string(getpid());
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  auto& made = peer_dirs::Made();
  if (std::find(made.begin(), made.end(), dir) == made.end()) made.push_back(dir);
  return dir;
}

// A kv_server child process.
class Server {
 public:
  Server(std::string db, uint16_t port, std::vector<std::string> extra = {})
      : db_(std::move(db)), port_(port), extra_(std::move(extra)) {}
  ~Server() { Kill(SIGKILL); }

  // Starts it and waits for its "serving" line.  False when it exited instead.
  bool Start() {
    int out[2];
    if (pipe(out) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      if (fd_limit_ > 0) {
        const rlimit limit{fd_limit_, fd_limit_};
        setrlimit(RLIMIT_NOFILE, &limit);
      }
      std::vector<std::string> args = {KV_SERVER_PATH, "--db=" + db_,
                                       "--listen=127.0.0.1:" + std::to_string(port_),
                                       "--transport=" + TransportUnderTest(),
                                       "--options=memory_capacity_bytes=64MiB,"
                                       "prefault_memory=false,log_level=error" +
                                           options_};
      for (const auto& e : extra_) args.push_back(e);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    if (line.find("serving") == std::string::npos) {
      Wait(nullptr);
      return false;
    }
    return true;
  }
  void Kill(int sig) {
    if (pid_ > 0) {
      kill(pid_, sig);
      if (sig == SIGKILL || sig == SIGTERM) Wait(nullptr);
    }
  }
  // Waits for exit; stores the exit status.  Returns false if it is still running after 15 s.
  bool Wait(int* status) {
    if (pid_ <= 0) return true;
    for (int i = 0; i < 1500; i++) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        if (status != nullptr) *status = st;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  bool Alive() { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  pid_t pid() const { return pid_; }
  Endpoint endpoint() const { return Endpoint{"127.0.0.1", port_}; }
  std::string address() const { return endpoint().ToString(); }
  void set_options(const std::string& o) { options_ = o; }
  // RLIMIT_NOFILE of the child (0: inherited).
  void set_fd_limit(rlim_t n) { fd_limit_ = n; }

 private:
  const std::string db_;
  const uint16_t port_;
  const std::vector<std::string> extra_;
  std::string options_ = ",ssd_capacity_bytes=0";
  rlim_t fd_limit_ = 0;
  pid_t pid_ = -1;
};

// The options of a DB in this process that calls the servers `peers` (none: a DB of its
// own, memory only) over TCP.
inline Options ClientOptions(const std::string& peers, PeerMode mode) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 64 << 20;
  o.prefault_memory = false;
  o.ssd_capacity_bytes = 0;
  o.log_level = LogLevel::kOff;
  o.peers = peers;
  o.peer_mode = mode;
  o.peer_timeout_ms = 1000;
  EXPECT_TRUE(o.Set("peer_transport", TransportUnderTest()).ok());
  return o;
}

inline std::unique_ptr<Transport> NewClient(const std::string& token = "",
                                            uint64_t timeout_ms = 3000,
                                            const std::string& tenant = "") {
  TransportOptions o;
  o.auth_token = token;
  o.auth_tenant = tenant;
  o.timeout_ms = timeout_ms;
  o.log = [](LogLevel, const std::string&) {};
  std::unique_ptr<Transport> t;
  EXPECT_TRUE(Transport::Create(TransportUnderTest(), o, &t).ok());
  return t;
}

inline std::string RandomValue(std::mt19937_64* rng, size_t size) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t r = (*rng)();
    std::memcpy(&v[i], &r, std::min<size_t>(8, size - i));
  }
  return v;
}

// A hand-driven connection to a server: authenticates (with `token` of `tenant` when
// given, else none), then sends frames the test builds, valid checksums included, so
// they reach the request decoders.  ok() is false when the server refused it.
class RawConn {
 public:
  explicit RawConn(const Endpoint& ep, uint64_t timeout_ms = 3000, const std::string& token = "",
                   const std::string& tenant = "")
      : timeout_ms_(timeout_ms) {
    ok_ = ConnectTcp(ep, DeadlineIn(timeout_ms_), &fd_).ok();
    wire::FrameHeader h;
    std::string meta;
    ok_ = ok_ && Read(&h, &meta) && h.op == wire::kChallenge && meta.size() > wire::kNonceSize;
    std::string auth;
    if (ok_ && !token.empty()) {
      wire::PutAuth(&auth, wire::AuthProof(meta.substr(0, wire::kNonceSize), token), tenant);
    }
    ok_ = ok_ && Send(wire::kAuth, auth) && Read(&h, &meta) && h.op == wire::kAuth;
    // The verdict, then the features the server offers (none from older servers).
    std::string_view in(meta);
    Status verdict;
    ok_ = ok_ && wire::GetBatchStatus(&in, &verdict) && verdict.ok();
    if (ok_ && in.size() == 4) features_ = DecodeFixed32(in.data());
  }
  ~RawConn() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ok_; }
  int fd() const { return fd_; }
  // What the server offered after its AUTH verdict (wire::kFeature*).
  uint32_t features() const { return features_; }
  // The request id of the last frame sent.
  uint64_t last_id() const { return id_; }
  bool Send(uint8_t op, const std::string& meta, uint16_t flags = 0,
            std::span<const Slice> body = {}) {
    return SendFrame(fd_, op, flags, ++id_, meta, body, DeadlineIn(timeout_ms_)).ok();
  }
  // Reads one frame; its body, if any, is read and dropped (its length in *body_len).
  // False when the server closed the connection, sent garbage, or took too long.
  bool Read(wire::FrameHeader* h, std::string* meta, uint64_t* body_len = nullptr) {
    const Deadline deadline = DeadlineIn(timeout_ms_);
    char header[wire::kHeaderSize];
    std::vector<iovec> iov{{header, sizeof(header)}};
    if (!ReadFully(fd_, &iov, deadline, nullptr).ok()) return false;
    if (!wire::FrameHeader::DecodeFrom(header, h).ok()) return false;
    if (h->body_len != 0 && body_len == nullptr) return false;
    meta->assign(h->meta_len, '\0');
    iov = {{meta->data(), meta->size()}};
    if (h->meta_len != 0 && !ReadFully(fd_, &iov, deadline, nullptr).ok()) return false;
    if (body_len != nullptr) *body_len = h->body_len;
    std::vector<char> scratch(std::min<uint64_t>(h->body_len, 1 << 20));
    for (uint64_t left = h->body_len; left > 0;) {
      iov = {{scratch.data(), static_cast<size_t>(std::min<uint64_t>(left, scratch.size()))}};
      left -= iov[0].iov_len;
      if (!ReadFully(fd_, &iov, deadline, nullptr).ok()) return false;
    }
    return true;
  }
  // Sends a request and reads its answer's batch status (the rest of the answer's
  // metadata in *rest, when given).  False when the connection was closed instead.
  bool Ask(uint8_t op, const std::string& meta, Status* status, std::string* rest = nullptr,
           uint64_t* body_len = nullptr) {
    wire::FrameHeader h;
    std::string answer;
    if (!Send(op, meta) || !Read(&h, &answer, body_len)) return false;
    std::string_view in(answer);
    if (h.request_id != id_ || !wire::GetBatchStatus(&in, status)) return false;
    if (rest != nullptr) rest->assign(in);
    return true;
  }

 private:
  const uint64_t timeout_ms_;
  int fd_ = -1;
  uint64_t id_ = 0;
  bool ok_ = false;
  uint32_t features_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_TEST_PEER_HARNESS_H_
