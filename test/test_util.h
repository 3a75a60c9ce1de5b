// Helpers shared by the tests: scratch directories and self-checking values.
#ifndef KVENGINE_TEST_TEST_UTIL_H_
#define KVENGINE_TEST_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/db.h"

namespace kvengine::test {

// Runs `work` in a forked child and kills it with SIGKILL once work returned 0: the
// state a crash leaves right after it.  work returns 0, or an exit code that says which
// step failed.  Returns the child's failing exit code (the child was not killed then),
// or 0 when it was killed as planned.
inline int KillAfter(const std::function<int()>& work) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fds[0]);
    const int rc = work();
    if (rc != 0) _exit(rc);
    char ack = 1;
    if (write(fds[1], &ack, 1) != 1) _exit(100);
    pause();  // killed here, never closed
    _exit(101);
  }
  close(fds[1]);
  char ack = 0;
  const bool reported = read(fds[0], &ack, 1) == 1;
  close(fds[0]);
  if (reported) kill(pid, SIGKILL);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (reported) return WIFSIGNALED(wstatus) ? 0 : -1;
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
}

// A loopback TCP port free a moment ago, for a server a test starts.  Drawn at random
// below the kernel's ephemeral range (ip_local_port_range), so the outgoing connections
// of tests running in parallel -- which take ephemeral ports -- never land on it between
// this check and the server's bind; a kernel-chosen port could be taken that way.
inline uint16_t FreePort() {
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int hi = 0;
    if (std::fscanf(f, "%d %d", &low, &hi) != 2) low = 32768;
    std::fclose(f);
  }
  // Binds a socket to `port` on loopback (0: the kernel picks); the port bound, or 0.
  auto bind_port = [](uint16_t port) -> uint16_t {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    socklen_t len = sizeof(a);
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                       getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    close(fd);
    return bound ? ntohs(a.sin_port) : 0;
  };
  static std::mt19937 rng(static_cast<uint32_t>(getpid()) * 2654435761u ^
                          static_cast<uint32_t>(time(nullptr)));
  const int first = 10000;
  for (int attempt = 0; low > first + 1000 && attempt < 200; attempt++) {
    const uint16_t port = bind_port(static_cast<uint16_t>(first + rng() % (low - first)));
    if (port != 0) return port;
  }
  return bind_port(0);  // no room below the range: the kernel's pick
}

// An owner for the attach tests: a 64 MiB memory tier, no SSD tier, serving `socket`.
inline Options AttachOwnerOptions(const std::string& socket) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 64ull << 20;
  o.memory_slab_size = 1ull << 20;
  o.prefault_memory = false;
  o.ssd_capacity_bytes = 0;
  o.local_listen = socket;
  return o;
}

// An attached client for the attach tests: every call bounded by 2 s.
inline Options AttachClientOptions() {
  Options o;
  o.apply_environment = false;
  o.peer_timeout_ms = 2000;
  return o;
}

// This binary's path, for tests whose children are this binary re-executed.
inline std::string SelfExe() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "/proc/self/exe";
}

// Forks and re-executes this binary with `args`, which its main dispatches on.
inline pid_t SpawnSelf(const std::vector<std::string>& args) {
  const std::string exe = SelfExe();
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(exe.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for the child `pid`: its exit code, or 128 + the signal that ended it.
inline int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The figure `name` of db's "kvengine.stats" (0 when it has none).
inline uint64_t StatOf(DB* db, const std::string& name) {
  std::string text;
  EXPECT_TRUE(db->GetProperty("kvengine.stats", &text));
  const size_t pos = text.find(name + ": ");
  if (pos == std::string::npos) return 0;
  return std::stoull(text.substr(pos + name.size() + 2));
}

// A fresh directory for one test, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("KV_TEST_TMPDIR");
    std::filesystem::path root = base != nullptr ? base : std::filesystem::temp_directory_path();
    std::filesystem::create_directories(root);
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info != nullptr ? std::string(info->test_suite_name()) + "." + info->name()
                                       : std::string("kvtest");
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = root / (name + "." + std::to_string(::getpid()) + "." + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  std::string Sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// A value of `size` bytes determined by (seed, size); CheckValue recognises it.
inline std::string MakeValue(uint64_t seed, size_t size) {
  std::string v(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + size + 1;
  for (size_t i = 0; i < size; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<char>(x);
  }
  return v;
}

// A value that carries its own checksum in its first 8 bytes: any torn or mixed read
// fails SelfCheck.  REQUIRES: size >= 16.
inline std::string MakeSelfCheckingValue(std::mt19937_64& rng, size_t size) {
  std::string v = MakeValue(rng(), size);
  uint64_t sum = 1469598103934665603ull;
  for (size_t i = 8; i < size; i++)
    sum = (sum ^ static_cast<unsigned char>(v[i])) * 1099511628211ull;
  std::memcpy(v.data(), &sum, 8);
  return v;
}

inline bool SelfCheck(const char* data, size_t size) {
  if (size < 16) return false;
  uint64_t sum = 1469598103934665603ull, stored;
  for (size_t i = 8; i < size; i++)
    sum = (sum ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  std::memcpy(&stored, data, 8);
  return sum == stored;
}

}  // namespace kvengine::test

#endif  // KVENGINE_TEST_TEST_UTIL_H_
