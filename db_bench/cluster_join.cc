// cluster_join: how many keys a cluster still serves after one more member joins
// (docs/cluster.md, "Joins and departures").
//
// Counts the members the engine routes over ("peers: N" of kvengine.peers), runs
// --join_command (which starts one more member and returns), waits until the engine
// routes over N + 1, then reads every key of --num through the engine, in batches of
// --batch_size (64 when unset), checking the bytes.  Reported: the hit ratio (keys found
// over keys read), and how many keys the reads moved to the member that joined.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "db_bench/benchmarks.h"

namespace kvbench {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t PeersLine(Engine* engine, const char* name) {
  return StatLine("\n" + engine->Property("kvengine.peers"), name);
}

}  // namespace

Result RunClusterJoin(const BenchContext& b) {
  Result r;
  auto fail = [&r](const std::string& what) {
    if (r.errors++ == 0) r.first_error = what;
    return r;
  };
  if (b.config->join_command.empty()) return fail("cluster_join needs --join_command");
  const std::string peers = b.engine->Property("kvengine.peers");
  if (peers.find("\nmode: sharded\n") == std::string::npos) {
    return fail("cluster_join needs a sharded cluster (--cluster)");
  }
  const uint64_t before = PeersLine(b.engine, "peers");
  const uint64_t moved_before = PeersLine(b.engine, "moved_on_read");
  if (std::system(b.config->join_command.c_str()) != 0) {
    return fail("--join_command failed: " + b.config->join_command);
  }
  const Clock::time_point started = Clock::now();
  while (PeersLine(b.engine, "peers") != before + 1) {
    if (Clock::now() - started > std::chrono::seconds(30)) {
      return fail("the client never routed over the new member (" + std::to_string(before) +
                  " members before it)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double seen_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();

  const KeySpace space = b.Keys();
  const uint64_t batch = b.config->batch_size > 0 ? b.config->batch_size : 64;
  const uint64_t value_size = b.config->value_size;
  std::vector<std::vector<char>> buffers(batch, std::vector<char>(value_size));
  const Clock::time_point start = Clock::now();
  for (uint64_t first = 0; first < b.config->num; first += batch) {
    const uint64_t n = std::min<uint64_t>(batch, b.config->num - first);
    std::vector<std::string> names(n);
    std::vector<Slice> keys;
    std::vector<Destination> dests;
    for (uint64_t j = 0; j < n; j++) {
      space.Format(first + j, &names[j]);
      keys.emplace_back(names[j]);
      dests.push_back({MutableSlice(buffers[j].data(), value_size)});
    }
    std::vector<int64_t> results;
    const Clock::time_point t0 = Clock::now();
    Status s = b.engine->BatchGetInto(keys, dests, &results);
    r.hist.Add(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    r.lookups += n;
    if (!s.ok()) {
      fail("BatchGetInto: " + s.ToString());
      continue;
    }
    for (uint64_t j = 0; j < n; j++) {
      if (results[j] < 0) continue;
      r.found++;
      r.bytes += static_cast<uint64_t>(results[j]) + names[j].size();
      if (!b.config->verify) continue;
      const Slice want = b.pool->For(first + j);
      if (static_cast<uint64_t>(results[j]) != want.size() ||
          std::memcmp(buffers[j].data(), want.data(), want.size()) != 0) {
        fail("key '" + names[j] + "': the bytes read differ from the bytes written");
      } else {
        r.verified++;
      }
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.ops = r.keys = r.lookups;
  r.counts_found = true;
  r.reports_latency = true;
  const double ratio = r.lookups > 0 ? static_cast<double>(r.found) / r.lookups : 0;
  char note[200];
  std::snprintf(
      note, sizeof(note),
      "hit ratio %.4f after a join (%llu -> %llu members, seen in %.0f ms); %llu keys "
      "moved to their new owner",
      ratio, static_cast<unsigned long long>(before), static_cast<unsigned long long>(before + 1),
      seen_ms,
      static_cast<unsigned long long>(PeersLine(b.engine, "moved_on_read") - moved_before));
  r.note = note;
  return r;
}

}  // namespace kvbench
