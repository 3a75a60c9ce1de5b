#include "util/ready_child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace kvengine {

Status ReadyChild::Start(const std::vector<std::string>& args, int timeout_ms) {
  Stop();
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) return Status::IOError("pipe");
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return Status::IOError("pipe");
  }
  std::vector<std::string> copies = args;
  std::vector<char*> argv;
  for (auto& a : copies) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    // The child starts with no signal blocked, whatever the parent blocks (kv_bench
    // blocks its stop signals to wait for them in a thread of its own).
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  stdin_ = to_child[1];
  if (pid_ < 0) {
    close(from_child[0]);
    return Status::IOError("fork");
  }
  std::string said;
  char buf[256];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (said.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{from_child[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = read(from_child[0], buf, sizeof(buf));
    if (n <= 0) break;
    said.append(buf, static_cast<size_t>(n));
  }
  close(from_child[0]);
  if (said.rfind("ready", 0) != 0) {
    Stop();
    return Status::IOError("the " + args[0] + " child process did not start", said);
  }
  return Status::OK();
}

void SayReadyAndWaitForStdinToClose() {
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
}

void ReadyChild::Stop() {
  if (stdin_ >= 0) close(stdin_);
  stdin_ = -1;
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace kvengine
