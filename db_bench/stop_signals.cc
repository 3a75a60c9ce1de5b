#include "db_bench/stop_signals.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

namespace kvbench {

namespace {

std::mutex mu;
std::vector<std::string> to_remove;  // guarded by mu
std::vector<pid_t> to_kill;          // guarded by mu

// The stop signals this process does not ignore: one ignored when kv_bench started (a
// background job's SIGINT, nohup's SIGHUP) stays ignored, as in any program.
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction now;
    if (sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;
    sigaddset(&set, sig);
  }
  return set;
}

// Removes `dir` while the engine's threads may still write into it: renamed away first
// (atomically: a file the engine creates after that finds no directory), then removed,
// again if a file still being written made a pass fail.
void RemoveWhileWritten(const std::string& dir, std::error_code* ec) {
  namespace fs = std::filesystem;
  fs::path doomed = dir + ".removing";
  fs::rename(dir, doomed, *ec);
  if (*ec) doomed = dir;  // not renamed: removed where it is
  for (int pass = 0; pass < 20; pass++) {
    ec->clear();
    fs::remove_all(doomed, *ec);
    if (!*ec && !fs::exists(doomed)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void WaitForStop(sigset_t set) {
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  std::lock_guard<std::mutex> lock(mu);
  for (pid_t pid : to_kill) {  // it would write on into the directory, and outlive us
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  for (const std::string& path : to_remove) {
    std::error_code ec;
    RemoveWhileWritten(path, &ec);
    std::fprintf(stderr, "kv_bench: stopped by signal %d; removed the temporary %s%s\n", sig,
                 path.c_str(), ec ? (": " + ec.message()).c_str() : "");
  }
  std::fflush(stdout);
  _exit(128 + sig);
}

}  // namespace

void BlockStopSignals() {
  const sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(WaitForStop, set).detach();
}

void KillOnStop(pid_t pid) {
  std::lock_guard<std::mutex> lock(mu);
  to_kill.push_back(pid);
}

void ForgetOnStop(pid_t pid) {
  std::lock_guard<std::mutex> lock(mu);
  std::erase(to_kill, pid);
}

void RemoveOnStop(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu);
  to_remove.push_back(path);
}

void ForgetRemoval(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu);
  std::erase(to_remove, path);
}

}  // namespace kvbench
