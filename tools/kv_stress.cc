// kv_stress: a randomized stress test of a kvengine DB with an oracle, in the manner of
// RocksDB's db_stress (docs/kv_stress.md).
//
//   kv_stress --db=DIR [--state=FILE] [--threads=N] [--keys=N] [--duration_s=S] ...
//   kv_stress --db=DIR --role=owner --socket=SOCK ...    serves attach clients too
//   kv_stress --role=client --socket=SOCK --state=FILE --worker_base=W ...
//   kv_stress --state=FILE --report                     prints the totals
//
// Threads of mixed operations (tools/stress/stress_worker.h) run against the DB and
// check every read against an expected-state file (tools/stress/expected_state.h) that
// survives the process's SIGKILL.  When the state file exists at start, the DB is first
// read back key by key and judged against it (what a crash may have lost, and what it
// may not), then the run goes on.  scripts/kv_crashtest.py kills and restarts it.
//
// It prints "kv_stress: ready" once its workers run and, at the end of a timed run,
// the summary line of the state file's counters.  Exit codes: 0 no failure seen by
// this process (--report: in the whole state file), 1 failures, 2 usage or setup error.
#include <gflags/gflags.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "kvengine/db.h"
#include "tools/option_list.h"
#include "tools/stress/expected_state.h"
#include "tools/stress/key_space.h"
#include "tools/stress/keyspaces.h"
#include "tools/stress/stress_worker.h"

DEFINE_string(db, "", "DB directory (owner and solo roles)");
DEFINE_string(state, "", "expected-state file (default: DB directory + \".state\")");
DEFINE_string(role, "solo",
              "solo (opens the DB), owner (opens it and serves --socket), "
              "client (attaches to --socket)");
DEFINE_string(socket, "", "the owner's local socket (owner and client roles)");
DEFINE_uint32(keys, 4000, "keys in the key space (a new state file only)");
DEFINE_uint32(workers, 0,
              "workers of all processes together (a new state file only; "
              "default --threads)");
DEFINE_uint32(threads, 4, "worker threads of this process");
DEFINE_uint32(worker_base, 0, "the first worker id of this process's threads");
DEFINE_double(duration_s, 0, "run this long, then stop cleanly; 0: until killed");
DEFINE_uint64(seed, 0, "random seed (0: from the clock)");
DEFINE_bool(verify_only, false, "verify the DB against the state (after a crash), close, exit");
DEFINE_bool(report, false, "print the state file's totals and exit (1 when any failure)");
DEFINE_string(weights, "",
              "operation weights, e.g. put=25,batch_put=10,get=25,batch_get=15,"
              "exists=8,delete=10,delete_matching=1,flush=1");
DEFINE_bool(zipf, false, "draw keys from a Zipfian distribution (default uniform)");
DEFINE_uint64(value_min, 512, "smallest value in bytes (at least 24)");
DEFINE_uint64(value_max, 4 << 20, "largest value in bytes");
DEFINE_uint32(batch_max, 4, "most keys in a batch call (2 or more)");
DEFINE_string(policy, "write_back", "offload_policy: write_back or write_through");
DEFINE_uint64(memory_bytes, 32 << 20, "memory_capacity_bytes (small: eviction runs)");
DEFINE_uint64(ssd_bytes, 1ull << 30, "ssd_capacity_bytes (small: SSD pressure and GC)");
DEFINE_string(ssd_eviction, "none",
              "ssd_eviction: none, lru or fifo (lru/fifo: absence of "
              "any key is allowed and counted as dropped)");
DEFINE_string(options, "", "more DB options, name=value,... (applied last)");
DEFINE_string(peer, "",
              "HOST:PORT of a kv_server: sharded mode between it and this DB "
              "(then --listen is required, the same at every restart)");
DEFINE_string(listen, "", "this DB's listen address in peer mode");
DEFINE_uint32(namespaces, 0,
              "spread the workers' keys over the default namespace and this many "
              "namespaces, stress-1..stress-N (worker w: keyspace w % (N+1)), and probe "
              "that no keyspace sees another's keys; the same at every restart");

namespace {

using kvengine::DB;
using kvengine::Options;
using kvengine::Status;
using namespace kvengine::stress;

// A restarted client's keys (workers [worker_base, worker_base + threads)) whose last
// operation was in doubt when its predecessor was killed (lo < hi), with their ten-key
// groups: see WorkloadConfig::left_alone.
void LeaveInDoubtKeysAlone(const ExpectedState& state, const KeySpace& space,
                           uint32_t worker_base, uint32_t threads, WorkloadConfig* config) {
  config->left_alone.assign(state.keys(), false);
  uint64_t groups = 0;
  for (uint32_t w = worker_base; w < worker_base + threads; w++) {
    for (uint32_t group = space.Begin(w); group < space.End(w); group += 10) {
      const uint32_t end = std::min(group + 10, space.End(w));
      bool in_doubt = false;
      for (uint32_t k = group; k < end; k++) in_doubt = in_doubt || state.Lo(k) < state.Hi(k);
      if (!in_doubt) continue;
      groups++;
      for (uint32_t k = group; k < end; k++) config->left_alone[k] = true;
    }
  }
  if (groups > 0) {
    std::fprintf(stderr, "kv_stress: %" PRIu64 " ten-key groups in doubt are left alone\n",
                 groups);
  }
}

constexpr int kExitOk = 0, kExitFailures = 1, kExitUsage = 2;

Status ParseWeights(const std::string& text, WorkloadConfig* config) {
  static const char* const kNames[] = {"put",    "batch_put",       "get",  "batch_get", "exists",
                                       "delete", "delete_matching", "flush"};
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = item.find('=');
    int which = -1;
    for (int i = 0; i < static_cast<int>(OpKind::kCount); i++) {
      if (eq != std::string::npos && item.compare(0, eq, kNames[i]) == 0 &&
          std::strlen(kNames[i]) == eq) {
        which = i;
      }
    }
    char* end = nullptr;
    const unsigned long w =
        eq == std::string::npos ? 0 : std::strtoul(item.c_str() + eq + 1, &end, 10);
    if (which < 0 || end == nullptr || *end != '\0' || end == item.c_str() + eq + 1 ||
        w > 1000000) {
      return Status::InvalidArgument("--weights item '" + item + "'",
                                     "want NAME=N with NAME one of put, batch_put, get, "
                                     "batch_get, exists, delete, delete_matching, flush");
    }
    config->weights[which] = static_cast<uint32_t>(w);
  }
  return Status::OK();
}

Status BuildOptions(Options* o) {
  o->apply_environment = false;
  o->log_level = kvengine::LogLevel::kError;
  o->memory_capacity_bytes = FLAGS_memory_bytes;
  o->memory_slab_size = 1 << 20;
  o->ssd_capacity_bytes = FLAGS_ssd_bytes;
  o->bucket_keys_limit = 32;
  o->bucket_size_limit = 8 << 20;
  o->bucket_flush_timeout_ms = 50;
  o->gc_interval_ms = 50;
  o->gc_deleted_ratio = 0.3;
  o->tombstone_sync_interval_ms = 200;
  o->max_value_size = std::max<uint64_t>(FLAGS_value_max, 1);
  o->use_huge_pages = false;
  o->prefault_memory = false;
  Status s = o->Set("offload_policy", FLAGS_policy);
  if (s.ok()) s = o->Set("ssd_eviction", FLAGS_ssd_eviction);
  if (s.ok() && FLAGS_role == "owner") s = o->Set("local_listen", FLAGS_socket);
  if (s.ok() && !FLAGS_peer.empty()) {
    if (FLAGS_listen.empty()) return Status::InvalidArgument("--peer needs --listen");
    s = o->Set("peers", FLAGS_peer);
    if (s.ok()) s = o->Set("listen", FLAGS_listen);
    if (s.ok()) s = o->Set("peer_mode", "sharded");
    if (s.ok()) s = o->Set("peer_transport", "tcp");
    // A loaded test machine must not turn into errors: a slow peer is not a wrong one.
    if (s.ok()) s = o->Set("peer_timeout_ms", "10000");
  }
  if (s.ok()) s = kvengine::SetOptionList(FLAGS_options, o);
  return s.ok() ? o->Validate() : s;
}

Status OpenState(bool allow_create, std::unique_ptr<ExpectedState>* state, bool* created) {
  *created = false;
  struct stat st;
  if (stat(FLAGS_state.c_str(), &st) == 0 || !allow_create) {
    return ExpectedState::Open(FLAGS_state, state);
  }
  *created = true;
  const uint32_t workers = FLAGS_workers != 0 ? FLAGS_workers : FLAGS_threads;
  if (FLAGS_keys < 10 * workers) {
    return Status::InvalidArgument("--keys must be at least 10 per worker");
  }
  return ExpectedState::Create(FLAGS_state, FLAGS_keys, workers, state);
}

// Opens the DB (or attaches), retrying an attach while the owner starts.
Status OpenDb(const Options& options, std::unique_ptr<DB>* db) {
  if (FLAGS_role != "client") return DB::Open(options, FLAGS_db, db);
  Options client;
  client.peer_timeout_ms = 10000;
  Status s;
  for (int i = 0; i < 100; i++) {
    s = DB::Attach(client, FLAGS_socket, db);
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return s;
}

// After a reopen: the namespaces' SSD figures (per-bucket tallies, restored from the
// map checkpoint or the buckets' indexes) add up to the SSD tier's own key and byte
// counts.  Empty when they do, or when there is nothing to compare (no SSD tier, no
// namespace).
std::string NamespaceFiguresDisagree(DB* db) {
  std::string text;
  if (!db->GetProperty("kvengine.stats", &text)) return "";
  int64_t keys = -1, live = -1, items = 0, bytes = 0;
  bool any = false;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const size_t colon = line.find(": ");
    if (colon == std::string::npos) continue;
    const std::string name = line.substr(0, colon);
    const int64_t value = std::strtoll(line.c_str() + colon + 2, nullptr, 10);
    auto ends_with = [&](const char* suffix) {
      const size_t n = std::strlen(suffix);
      return name.size() > n && name.compare(name.size() - n, n, suffix) == 0;
    };
    if (name == "ssd.keys") keys = value;
    if (name == "ssd.live_bytes") live = value;
    if (name.rfind("namespace.", 0) == 0 && ends_with(".ssd_items")) {
      items += value;
      any = true;
    }
    if (name.rfind("namespace.", 0) == 0 && ends_with(".ssd_bytes")) bytes += value;
  }
  if (!any || keys < 0 || (items == keys && bytes == live)) return "";
  return "the namespaces hold " + std::to_string(items) + " values (" + std::to_string(bytes) +
         " bytes) on SSD, the tier " + std::to_string(keys) + " (" + std::to_string(live) + ")";
}

uint64_t Failures(const ExpectedState& state) {
  return state.Get(Counter::kLost) + state.Get(Counter::kWrong) + state.Get(Counter::kResurrected) +
         state.Get(Counter::kErrors);
}

// Runs this process's workers until the duration passes (forever when 0).
Status RunWorkers(const Keyspaces& keyspaces, ExpectedState* state, const KeySpace& space,
                  FailureLog* log, const WorkloadConfig& config) {
  std::vector<std::unique_ptr<StressWorker>> workers;
  const uint64_t seed =
      FLAGS_seed != 0
          ? FLAGS_seed
          : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (uint32_t t = 0; t < FLAGS_threads; t++) {
    workers.push_back(std::make_unique<StressWorker>(&keyspaces, state, &space, log,
                                                     FLAGS_worker_base + t, config,
                                                     seed * 1000003 + t));
    Status s = workers.back()->Prepare();
    if (!s.ok()) return s;
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&w, &stop] { w->Run(&stop); });
  std::printf("kv_stress: ready\n");
  std::fflush(stdout);
  if (FLAGS_duration_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_duration_s));
  } else {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  stop = true;
  for (auto& t : threads) t.join();
  return Status::OK();
}

int Main() {
  if (FLAGS_state.empty() && !FLAGS_db.empty()) FLAGS_state = FLAGS_db + ".state";
  if (FLAGS_state.empty()) {
    std::fprintf(stderr, "kv_stress: --state (or --db) is required\n");
    return kExitUsage;
  }
  std::unique_ptr<ExpectedState> state;
  bool created = false;
  const bool is_client = FLAGS_role == "client";
  Status s;
  if (FLAGS_role != "solo" && FLAGS_role != "owner" && !is_client) {
    s = Status::InvalidArgument("--role must be solo, owner or client");
  } else if ((is_client || FLAGS_role == "owner") && FLAGS_socket.empty()) {
    s = Status::InvalidArgument("--role=" + FLAGS_role + " needs --socket");
  } else if (!is_client && FLAGS_db.empty() && !FLAGS_report) {
    s = Status::InvalidArgument("--db is required");
  } else if (FLAGS_value_min < 24 || FLAGS_value_min > FLAGS_value_max || FLAGS_batch_max < 2) {
    s = Status::InvalidArgument("want 24 <= --value_min <= --value_max and --batch_max >= 2");
  }
  if (s.ok()) s = OpenState(!is_client && !FLAGS_report && !FLAGS_verify_only, &state, &created);
  if (s.ok() && FLAGS_report) {
    std::printf("kv_stress: %s\n", state->Summary().c_str());
    return Failures(*state) == 0 ? kExitOk : kExitFailures;
  }
  WorkloadConfig config;
  config.zipf = FLAGS_zipf;
  config.value_min = FLAGS_value_min;
  config.value_max = FLAGS_value_max;
  config.batch_max = FLAGS_batch_max;
  config.may_drop = FLAGS_ssd_eviction != "none";
  if (s.ok()) s = ParseWeights(FLAGS_weights, &config);
  if (s.ok() && !FLAGS_verify_only && FLAGS_worker_base + FLAGS_threads > state->workers()) {
    s = Status::InvalidArgument("workers " + std::to_string(FLAGS_worker_base) + ".." +
                                std::to_string(FLAGS_worker_base + FLAGS_threads - 1) +
                                " are past the state file's " + std::to_string(state->workers()));
  }
  Options options;
  if (s.ok()) s = BuildOptions(&options);
  if (!s.ok()) {
    std::fprintf(stderr, "kv_stress: %s\n", s.ToString().c_str());
    return kExitUsage;
  }
  const uint64_t failures_before = Failures(*state);
  const KeySpace space(state->keys(), state->workers());
  FailureLog log(state.get(), &space, 50);
  std::unique_ptr<DB> db;
  s = OpenDb(options, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "kv_stress: cannot open the DB: %s\n", s.ToString().c_str());
    return kExitFailures;
  }
  std::unique_ptr<Keyspaces> keyspaces;
  s = Keyspaces::Open(db.get(), &space, FLAGS_namespaces, /*create=*/!is_client, &keyspaces);
  if (!s.ok()) {
    std::fprintf(stderr, "kv_stress: cannot open the keyspaces: %s\n", s.ToString().c_str());
    return kExitFailures;
  }
  if (is_client) {
    // Beside a live owner: this process's keys as the killed client left them.  Those
    // whose last operation was in doubt (and their ten-key groups) are left alone.
    LeaveInDoubtKeysAlone(*state, space, FLAGS_worker_base, FLAGS_threads, &config);
    VerifyAndResolve(*keyspaces, state.get(), space, &log, space.Begin(FLAGS_worker_base),
                     space.End(FLAGS_worker_base + FLAGS_threads - 1), false, config.may_drop,
                     config.value_max);
  } else if (!created) {
    if (const std::string why = NamespaceFiguresDisagree(db.get()); !why.empty()) {
      log.Error(Status::Corruption("namespace figures after the reopen", why), "reopen");
    }
    VerifyAndResolve(*keyspaces, state.get(), space, &log, 0, space.keys(), true,
                     config.may_drop, config.value_max);
    state->Add(Counter::kRounds);
    // What was read back is the state from here on: make it durable.
    const std::vector<uint32_t> snapshot = state->SnapshotLo();
    s = db->Flush();
    if (s.ok()) {
      state->CommitFlush(snapshot);
      state->Add(Counter::kFlushes);
    }
  }
  if (s.ok() && !FLAGS_verify_only) s = RunWorkers(*keyspaces, state.get(), space, &log, config);
  keyspaces.reset();
  const Status closed = db->Close();
  if (s.ok()) s = closed;
  if (!s.ok()) {
    std::fprintf(stderr, "kv_stress: %s\n", s.ToString().c_str());
    return kExitFailures;
  }
  std::printf("kv_stress: %s\n", state->Summary().c_str());
  return Failures(*state) == failures_before ? kExitOk : kExitFailures;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "a randomized stress test of a kvengine DB with an expected-state oracle "
      "(docs/kv_stress.md)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "kv_stress: unexpected argument %s\n", argv[1]);
    return kExitUsage;
  }
  return Main();
}
