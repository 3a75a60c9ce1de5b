#include "db_bench/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

namespace kvbench {

namespace {

std::mutex dir_mu;
std::string dir_to_remove;  // guarded by dir_mu

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

void WaitForStop(sigset_t set) {
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  std::lock_guard<std::mutex> lock(dir_mu);
  if (!dir_to_remove.empty()) {
    // An attached owner (a child kv_bench) may still be writing its buckets as it sees
    // its stdin close: removed again once it had time to stop.
    std::error_code ec;
    std::filesystem::remove_all(dir_to_remove, ec);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::filesystem::remove_all(dir_to_remove, ec);
    std::fprintf(stderr, "kv_bench: stopped by signal %d; removed the temporary DB %s%s\n", sig,
                 dir_to_remove.c_str(), ec ? (": " + ec.message()).c_str() : "");
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

void RemoveOnStop(const std::string& dir) {
  std::lock_guard<std::mutex> lock(dir_mu);
  dir_to_remove = dir;
}

}  // namespace kvbench
