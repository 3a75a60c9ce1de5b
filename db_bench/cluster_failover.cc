// cluster_failover: the time from a cluster member's SIGKILL to the first read that the
// cluster serves from another replica (docs/cluster.md).
//
// Asks the victim (--failover_member) which of the filled keys it holds, SIGKILLs it
// (--failover_pid), waits until its port refuses connections (the process is gone),
// then reads those keys through the engine, in order.  Reported: the time from the kill
// to the first successful read, and the latency of every read of the victim's keys.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "db_bench/benchmarks.h"
#include "kvengine/transport.h"

namespace kvbench {

using kvengine::Endpoint;
using kvengine::Slice;
using kvengine::Status;

namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace

Result RunClusterFailover(const BenchContext& b) {
  Result r;
  auto fail = [&r](const std::string& what) {
    if (r.errors++ == 0) r.first_error = what;
    return r;
  };
  Endpoint victim;
  Status s = Endpoint::Parse(b.config->failover_member, &victim);
  if (!s.ok() || b.config->failover_pid <= 0) {
    return fail("cluster_failover needs --failover_member=HOST:PORT and --failover_pid");
  }
  kvengine::TransportOptions to;
  to.timeout_ms = 2000;
  std::unique_ptr<kvengine::Transport> transport;
  s = kvengine::Transport::Create("tcp", to, &transport);
  if (!s.ok()) return fail(s.ToString());

  // The keys the victim holds.
  const KeySpace space = b.Keys();
  std::vector<std::string> held;
  for (uint64_t first = 0; first < b.config->num; first += 256) {
    std::vector<std::string> names;
    for (uint64_t k = first; k < std::min<uint64_t>(first + 256, b.config->num); k++) {
      names.emplace_back();
      space.Format(k, &names.back());
    }
    std::vector<Slice> keys(names.begin(), names.end());
    std::vector<int64_t> exists;
    s = transport->BatchExists(victim, keys, &exists);
    if (!s.ok()) return fail("asking the victim: " + s.ToString());
    for (size_t j = 0; j < exists.size(); j++) {
      if (exists[j] == 1) held.push_back(names[j]);
    }
  }
  if (held.empty()) return fail("the victim holds none of the keys");

  const Clock::time_point killed = Clock::now();
  if (kill(static_cast<pid_t>(b.config->failover_pid), SIGKILL) != 0) {
    return fail("kill " + std::to_string(b.config->failover_pid) + ": " + std::strerror(errno));
  }
  // Gone when its port refuses a connection.
  for (;;) {
    std::vector<int64_t> ignored;
    const Slice probe(held[0]);
    std::unique_ptr<kvengine::Transport> fresh;
    if (!kvengine::Transport::Create("tcp", to, &fresh).ok()) break;
    if (!fresh->BatchExists(victim, std::span<const Slice>(&probe, 1), &ignored).ok()) break;
    if (MicrosSince(killed) > 10e6) return fail("the victim still answers 10 s after SIGKILL");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  const double dead_us = MicrosSince(killed);

  std::vector<char> buffer(b.config->value_size);
  double first_us = -1;
  const Clock::time_point start = Clock::now();
  for (const std::string& key : held) {
    const Clock::time_point t0 = Clock::now();
    size_t size = 0;
    s = b.engine->GetInto(key, kvengine::MutableSlice(buffer.data(), buffer.size()), &size);
    r.hist.Add(MicrosSince(t0));
    r.lookups++;
    if (s.ok()) {
      r.found++;
      r.bytes += size + key.size();
      if (first_us < 0) first_us = MicrosSince(killed);
    } else if (!s.IsNotFound()) {
      fail("GetInto " + key + ": " + s.ToString());
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.ops = r.keys = held.size();
  r.counts_found = true;
  r.reports_latency = true;
  char note[160];
  std::snprintf(note, sizeof(note),
                "victim gone %.1f ms after SIGKILL; first fallback read %.2f ms after SIGKILL",
                dead_us / 1000, first_us / 1000);
  r.note = note;
  return r;
}

}  // namespace kvbench
