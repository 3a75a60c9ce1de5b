#include "db_bench/suite.h"

#include <stdlib.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "db_bench/rawucx.h"
#include "db_bench/stop_signals.h"
#include "kvengine/transport.h"

namespace kvbench {

namespace fs = std::filesystem;

namespace {

// Benchmarks that read what a fill wrote; run on an engine nothing was written to, they
// write the keys first (untimed) so that they measure what their name says.
const std::set<std::string> kNeedsKeys = {"readrandom", "readseq", "existrandom", "deleterandom",
                                          "gc_churn",   "compact", "peer_get"};
const std::set<std::string> kNeedsRequests = {"vllm_exist", "vllm_get", "vllm_load",
                                              "vllm_load_serial"};
// The baselines whose MB/s each benchmark's is compared with, the first one this run
// measured before it: the same work without an engine (lookups in a plain table for
// existrandom and readrandom), memcpy of the same bytes in the same pattern, the raw
// disk write for the GC, or plain loopback TCP round trips of the same bytes for the
// peer.  rawexist and rawlookup count the bytes existrandom and readrandom count (keys,
// and the values found), so the ratio is also one of operations per second.
const std::map<std::string, std::vector<std::string>> kBaselineOf = {
    {"fillseq", {"memcpy"}},
    {"fillrandom", {"memcpy"}},
    {"overwrite", {"memcpy"}},
    {"vllm_write", {"memcpy_layers"}},
    {"readrandom", {"rawlookup", "memcpy_read"}},
    {"readseq", {"memcpy_read"}},
    {"existrandom", {"rawexist"}},
    {"vllm_get", {"memcpy_layers_read", "peer_get"}},
    // A load through a cluster against a peer_get of the same bytes from one member.
    {"vllm_load", {"peer_get", "memcpy_layers_read"}},
    {"vllm_load_serial", {"peer_get", "memcpy_layers_read"}},
    {"compact", {"rawwrite"}},
    {"peer_put", {"rawucx_put", "rawsocket"}},
    {"peer_get", {"rawucx", "rawsocket"}}};

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

std::string Mib(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

}  // namespace

Suite::Suite(BenchConfig config) : c_(std::move(config)), info_(c_.json ? stderr : stdout) {}

Suite::~Suite() { Cleanup(); }

std::vector<Suite::Slot*> Suite::AllSlots() {
  std::vector<Slot*> all;
  for (auto& slot : slots_) all.push_back(&slot);
  all.push_back(&peer_);
  return all;
}

bool Suite::PrepareDirectories(std::string* error) {
  std::error_code ec;
  if (c_.db.empty()) {
    const char* tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kv_bench.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      *error = "cannot create a temporary directory from " + tmpl;
      return false;
    }
    root_ = tmpl;
    remove_root_ = true;
    RemoveOnStop(root_);
  } else {
    root_ = c_.db;
    fs::create_directories(root_, ec);
    if (ec) {
      *error = "cannot create --db=" + root_ + ": " + ec.message();
      return false;
    }
  }
  if (!c_.use_existing_db && fs::exists(root_) && !fs::is_empty(root_, ec)) {
    // A DB left by an earlier run (of either engine, or of both) is wiped, as db_bench
    // destroys its DB; anything else is the user's and is left alone.
    const bool old_db = fs::exists(root_ + "/LOCK") || fs::exists(root_ + "/kvengine/LOCK") ||
                        fs::exists(root_ + "/rocksdb/LOCK") || fs::exists(root_ + "/peer/LOCK");
    if (!old_db) {
      *error = "--db: " + root_ +
               " is not empty and holds no DB; give an empty or new directory, or "
               "--use_existing_db";
      return false;
    }
    fs::remove_all(root_, ec);
    if (!ec) fs::create_directories(root_, ec);
    if (ec) {
      *error = "cannot wipe the old DB in " + root_ + ": " + ec.message();
      return false;
    }
  }
  for (const auto& name : c_.engines) {
    Slot slot;
    slot.name = name;
    slot.path = c_.engines.size() == 1 ? root_ : root_ + "/" + name;
    slot.keys_filled = slot.vllm_written = c_.use_existing_db;
    slots_.push_back(std::move(slot));
  }
  peer_.name = "peer";
  peer_.path = c_.peer.empty() ? root_ + "/peer" : "";  // where the in-process peer lives
  // A peer named by --peer holds what an earlier run wrote when the user says so; the
  // in-process one is always fresh.
  peer_.keys_filled = c_.use_existing_db && !c_.peer.empty();
  return true;
}

bool Suite::PrepareTrace(std::string* error) {
  if (std::find(c_.benchmarks.begin(), c_.benchmarks.end(), "trace") == c_.benchmarks.end()) {
    return true;
  }
  TraceConfig& t = c_.trace;
  Status s;
  if (t.generate) {
    if (t.file.empty()) {
      t.file = root_ + "/trace-" + TraceKindName(t.generator.kind) + "-" +
               std::to_string(t.generator.seed) + ".jsonl";
    }
    std::error_code ec;
    if (fs::exists(t.file, ec)) {
      // Never over someone's trace: a generated one goes to a new file.
      *error = "--trace=" + t.file + " exists; --trace_generate writes a new file (remove it " +
               "or give another path)";
      return false;
    }
    s = GenerateTrace(t.generator, &trace_);
    if (s.ok()) s = WriteTrace(t.file, trace_);
  } else {
    s = ReadTrace(t.file, &trace_);
  }
  if (!s.ok()) {
    *error = "trace: " + s.ToString();
    return false;
  }
  ideal_ = ComputeIdealCaches(t, trace_);
  return true;
}

bool Suite::FitSsdToDisk(std::string* error) {
  if (!remove_root_) return true;  // --db=DIR: the user's directory, the user's sizes
  EngineConfig config;
  config.memory_budget = c_.memory_budget;
  config.kvengine_options = c_.kvengine_options;
  kvengine::Options options;
  Status s = KvengineOptions(config, &options);
  if (!s.ok()) {
    *error = "--options: " + s.ToString();
    return false;
  }
  struct statvfs fs_stats;
  if (::statvfs(root_.c_str(), &fs_stats) != 0) return true;  // not known: left as it is
  const uint64_t free_bytes = static_cast<uint64_t>(fs_stats.f_bavail) * fs_stats.f_frsize;
  // Half the free space, shared by every kvengine DB of the run, and RocksDB's beside.
  const uint64_t dbs = std::max<uint64_t>(1, slots_.size());
  const uint64_t limit = free_bytes / 2 / dbs;
  if (options.ssd_capacity_bytes <= limit) return true;
  ssd_note_ = "ssd_capacity_bytes lowered from " + Mib(options.ssd_capacity_bytes) + " to " +
              Mib(limit) + ", half the free space of " + root_ + " (" + Mib(free_bytes) +
              ") shared by " + std::to_string(dbs) +
              " DB(s): a temporary DB must not fill its disk (--db=DIR keeps your sizes)";
  c_.kvengine_options.emplace_back("ssd_capacity_bytes", std::to_string(limit));
  c_.trace.ssd_capacity = std::min(c_.trace.ssd_capacity, limit);
  return true;
}

bool Suite::OpenEngines(std::string* error) {
  // ns_hotcold opens DBs of its own.
  const bool any_engine =
      std::any_of(c_.benchmarks.begin(), c_.benchmarks.end(), [](const std::string& b) {
        return !IsBaseline(b) && !IsPeerBenchmark(b) && b != "ns_hotcold" && b != "delete_regex";
      });
  if (!any_engine) return true;
  for (auto& slot : slots_) {
    slot.engine = slot.name == "rocksdb" ? NewRocksDBEngine() : NewKvengineEngine();
    if (!OpenSlot(&slot, error)) return false;
  }
  return true;
}

bool Suite::OpenPeer(std::string* error) {
  if (std::none_of(c_.benchmarks.begin(), c_.benchmarks.end(), IsPeerBenchmark)) return true;
  if (c_.peer.empty()) {
    // Memory only, so nothing of an earlier run's in-process peer is worth keeping.
    std::error_code ec;
    fs::remove_all(peer_.path, ec);
  }
  peer_.engine = NewPeerEngine();
  return OpenSlot(&peer_, error);
}

bool Suite::OpenSlot(Slot* slot, std::string* error, bool reopen) {
  EngineConfig ec;
  ec.path = slot->path;
  ec.use_existing = c_.use_existing_db || reopen;
  ec.memory_budget = c_.memory_budget;
  ec.sync = c_.sync;
  ec.statistics = c_.statistics;
  ec.kvengine_options = c_.kvengine_options;
  ec.rocksdb_options = c_.rocksdb_options;
  ec.rocksdb_min_blob_size = c_.rocksdb_min_blob_size;
  ec.rocksdb_blob_file_size = c_.rocksdb_blob_file_size;
  ec.rocksdb_wal = c_.rocksdb_wal;
  ec.peer = c_.peer;
  ec.peer_transport = c_.peer_transport;
  ec.auth_token_file = c_.auth_token_file;
  ec.data_set_bytes = c_.num * c_.value_size;
  if (slot->name == (c_.compare_in_process ? "attached" : "kvengine")) ec.attach = c_.attach;
  ec.removal_feed_reader = slot->name == "kvengine+feed";
  if (slot->name == "kvengine+ns") ec.namespace_name = "bench";
  if (c_.compare_arenas) {  // both attached, through namespace "bench"
    ec.attach = c_.attach;
    ec.namespace_name = "bench";
    if (slot->name == "attached+arena") {
      // The namespace's arena as large as the other's whole tier; the default arena
      // beside it.
      ec.kvengine_options.emplace_back("namespace_arenas",
                                       "bench=" + std::to_string(ec.memory_budget));
      ec.memory_budget += 16ull << 20;
    }
  }
  Status s = slot->engine->Open(ec);
  if (!s.ok()) {
    *error = "cannot open " + slot->name + (slot->path.empty() ? "" : " in " + slot->path) + ": " +
             s.ToString();
    slot->engine.reset();
    return false;
  }
  return true;
}

void Suite::PrintHeader() {
  std::string engines;
  for (const auto& e : c_.engines) engines += (engines.empty() ? "" : " vs ") + e;
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%a %b %e %H:%M:%S %Y", std::localtime(&now));
  std::fprintf(info_, "kv_bench:   %s\n", engines.c_str());
  std::fprintf(info_, "Date:       %s\n", date);
  std::fprintf(info_, "CPU:        %u * %s\n", std::thread::hardware_concurrency(),
               CpuModel().c_str());
  std::fprintf(info_, "Keys:       %" PRIu64 " bytes each (vLLM keys: %zu bytes)\n", c_.key_size,
               VllmKey(c_.seed, 0, 0).size());
  std::fprintf(info_, "Values:     %" PRIu64 " bytes each\n", c_.value_size);
  std::fprintf(info_,
               "Entries:    %" PRIu64 " (%s); vLLM: %" PRIu64 " requests x %" PRIu64 " layers\n",
               c_.num, Mib(c_.num * c_.value_size).c_str(), c_.requests, c_.num_layers);
  std::fprintf(info_, "Batch:      %" PRIu64 " key(s) per call in key-level benchmarks\n",
               c_.batch_size);
  std::fprintf(info_, "Threads:    %" PRIu64 "\n", c_.threads);
  if (c_.duration > 0) {
    std::fprintf(info_, "Duration:   %.1f s per benchmark\n", c_.duration);
  } else {
    std::fprintf(info_, "Duration:   --num operations per benchmark\n");
  }
  std::fprintf(info_, "Memory:     %s per engine\n", Mib(c_.memory_budget).c_str());
  if (!trace_.empty()) {
    const TraceConfig& t = c_.trace;
    std::fprintf(info_,
                 "Trace:      %s: %zu requests%s; %s of KV per %" PRIu64 "-token block, %" PRIu64
                 " key(s) per block\n",
                 t.file.c_str(), trace_.size(),
                 t.generate ? (std::string(", generated (") + TraceKindName(t.generator.kind) +
                               ", seed " + std::to_string(t.generator.seed) + ")")
                                  .c_str()
                            : "",
                 Mib(t.BytesPerBlock()).c_str(), t.block_tokens, t.KeysPerBlock());
  }
  std::fprintf(info_, "DB:         %s%s\n", root_.c_str(),
               remove_root_ ? " (temporary, removed after, or when stopped by a signal)" : "");
  if (!ssd_note_.empty()) std::fprintf(info_, "Note:       %s\n", ssd_note_.c_str());
  bool local_engine = false;
  for (const Slot* slot : AllSlots()) {
    if (!slot->engine) continue;
    local_engine |= slot != &peer_;
    for (const auto& note : slot->engine->Notes())
      std::fprintf(info_, "Note:       %s\n", note.c_str());
  }
  const bool rawsocket =
      std::find(c_.benchmarks.begin(), c_.benchmarks.end(), "rawsocket") != c_.benchmarks.end();
  kvengine::Endpoint peer;
  if (rawsocket && peer_.engine && kvengine::Endpoint::Parse(c_.peer, &peer).ok() &&
      !peer.IsLoopback()) {
    std::fprintf(info_,
                 "Note:       rawsocket runs over loopback, not to %s: its ratios include "
                 "the network between the hosts\n",
                 c_.peer.c_str());
  }
  // The trace benchmark's data set is its trace's, not --num values; ns_hotcold's hot
  // tenant overflows the memory tier on purpose.
  const bool key_space =
      std::any_of(c_.benchmarks.begin(), c_.benchmarks.end(),
                  [](const std::string& b) { return b != "trace" && b != "ns_hotcold"; });
  if (local_engine && key_space && c_.num * c_.value_size > c_.memory_budget) {
    std::fprintf(info_,
                 "WARNING:    the data set (%s) exceeds the memory budget; kvengine without an "
                 "SSD tier evicts, and reads miss\n",
                 Mib(c_.num * c_.value_size).c_str());
  }
  std::fprintf(info_, "------------------------------------------------\n");
  std::fflush(info_);
}

void Suite::Prefill(const std::string& name, Slot* slot) {
  const bool vllm = kNeedsRequests.count(name) > 0;
  if (vllm ? slot->vllm_written : (slot->keys_filled || !kNeedsKeys.count(name))) return;
  BenchConfig quick = c_;
  quick.duration = 0;
  quick.batch_size = std::min<uint64_t>(c_.num, 16);
  BenchContext b;
  b.config = &quick;
  b.engine = slot->engine.get();
  b.pool = pool_.get();
  b.label = "prefill[" + slot->name + "]";
  std::fprintf(stderr, "kv_bench: %s on %s: nothing written yet; writing %s first (untimed)\n",
               name.c_str(), slot->name.c_str(),
               vllm ? "the vLLM requests" : "the key space (fillseq)");
  Result r = vllm ? RunVllm(b, VllmKind::kWrite) : RunFill(b, true);
  if (r.errors > 0) {
    std::fprintf(stderr, "kv_bench: prefill on %s: %" PRIu64 " errors, first: %s\n",
                 slot->name.c_str(), r.errors, r.first_error.c_str());
  }
  (vllm ? slot->vllm_written : slot->keys_filled) = true;
}

Result Suite::RunOne(const std::string& name, Slot* slot, uint64_t salt) {
  BenchContext b;
  b.config = &c_;
  b.engine = slot ? slot->engine.get() : nullptr;
  b.pool = pool_.get();
  b.label = slot && slot != &peer_ && slots_.size() > 1 ? name + "[" + slot->name + "]" : name;
  b.raw_dir = root_;
  b.seed_salt = salt;
  if (slot) Prefill(name, slot);
  Result r;
  if (name == "fillseq") {
    r = RunFill(b, true);
  } else if (name == "fillrandom" || name == "overwrite") {
    r = RunFill(b, false);
  } else if (name == "readrandom") {
    r = RunRead(b, ReadKind::kRandom);
  } else if (name == "readseq") {
    r = RunRead(b, ReadKind::kSequential);
  } else if (name == "readmissing") {
    r = RunRead(b, ReadKind::kMissing);
  } else if (name == "deleterandom") {
    r = RunDeleteRandom(b);
  } else if (name == "existrandom") {
    r = RunExistRandom(b);
  } else if (name == "vllm_write") {
    r = RunVllm(b, VllmKind::kWrite);
  } else if (name == "vllm_exist") {
    r = RunVllm(b, VllmKind::kExist);
  } else if (name == "vllm_get") {
    r = RunVllm(b, VllmKind::kGet);
  } else if (name == "vllm_all") {
    r = RunVllm(b, VllmKind::kAll);
  } else if (name == "vllm_load") {
    r = RunVllm(b, VllmKind::kLoad);
  } else if (name == "vllm_load_serial") {
    r = RunVllm(b, VllmKind::kLoadSerial);
  } else if (name == "gc_churn") {
    r = RunGcChurn(b);
  } else if (name == "compact") {
    r = RunCompact(b);
  } else if (name == "reopen") {
    r = RunReopen(slot);
  } else if (name == "rawwrite") {
    r = RunRawWrite(b);
  } else if (name == "rawrandread") {
    r = RunRawRandRead(b);
  } else if (name == "rawread") {
    r = RunRawRead(b);
  } else if (name == "rawsocket") {
    r = RunRawSocket(b);
    r.reports_latency = true;  // per round trip, as peer_get's per call
  } else if (name == "rawstream") {
    r = RunRawStream(b);
  } else if (name == "rawucx" || name == "rawucx_put") {
    r = RunRawUcx(b, name == "rawucx_put");
    r.reports_latency = true;  // per batch, as peer_get's per call
  } else if (name == "rawexist" || name == "rawlookup") {
    r = RunRawLookup(b, name == "rawlookup");
  } else if (name == "peer_put") {
    r = RunFill(b, true);
    r.reports_latency = true;
  } else if (name == "cluster_failover") {
    r = RunClusterFailover(b);
  } else if (name == "cluster_join") {
    r = RunClusterJoin(b);
  } else if (name == "trace") {
    LookupHook prefetch;
    if (c_.trace.prefetch) {
      prefetch = [engine = b.engine](const LookupPlan&, std::span<const Slice> hit_keys) {
        uint64_t started = 0;
        engine->Prefetch(hit_keys, &started);
        return started;
      };
    }
    TraceConfig trace = c_.trace;
    if (slot != nullptr && slot->name == "kvengine+planner_off") trace.planner = false;
    r = RunTraceReplay(trace, trace_, b.engine, c_.verify, c_.progress_interval, prefetch);
    r.detail_text += ideal_.text;
    r.detail_json += "," + ideal_.json;
  } else if (name == "peer_get") {
    r = RunRead(b, ReadKind::kRandom);
    r.reports_latency = true;
  }
  r.benchmark = name;
  r.engine = slot ? slot->name : "";
  r.label = b.label;
  if (slot) {
    // A write benchmark cut short by --duration leaves part of the key space unwritten;
    // the next read benchmark then completes it (untimed) first.  fillrandom and
    // overwrite never cover every key, as in db_bench.
    if (name == "fillseq" || name == "peer_put") slot->keys_filled |= r.ops >= c_.num;
    if (name == "fillrandom" || name == "overwrite") slot->keys_filled = true;
    if (name == "vllm_write" || name == "vllm_all") slot->vllm_written |= r.ops >= c_.requests;
    if (name == "compact") slot->keys_filled = false;  // it deleted some
    if (c_.statistics) r.statistics = slot->engine->StatisticsText();
    if (name == "fillseq" || name == "fillrandom" || name == "overwrite") {
      r.index_report = slot->engine->IndexMemoryReport();
    }
  }
  return r;
}

void Suite::RunTraceInterleaved(std::vector<Result>* per_engine) {
  // --compare_planner's two slots: kvengine (the planner) and kvengine+planner_off.
  const size_t off = slots_[0].name == "kvengine+planner_off" ? 0 : 1;
  const size_t on = 1 - off;
  TraceConfig off_config = c_.trace;
  off_config.planner = false;
  auto [a, b] =
      RunTraceReplayInterleaved(c_.trace, off_config, trace_, slots_[on].engine.get(),
                                slots_[off].engine.get(), c_.verify, c_.progress_interval);
  (*per_engine)[on] = std::move(a);
  (*per_engine)[off] = std::move(b);
  for (size_t i : {on, off}) {
    Result& r = (*per_engine)[i];
    r.detail_text += ideal_.text;
    r.detail_json += "," + ideal_.json;
    r.benchmark = "trace";
    r.engine = slots_[i].name;
    r.label = "trace[" + slots_[i].name + "]";
    if (c_.statistics) r.statistics = slots_[i].engine->StatisticsText();
  }
}

Result Suite::RunReopen(Slot* slot) {
  Result r;
  if (slot == nullptr || slot->engine == nullptr) return r;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Status s = slot->engine->Close();
  const auto closed = Clock::now();
  std::string error;
  const bool opened = s.ok() && OpenSlot(slot, &error, /*reopen=*/true);
  const auto end = Clock::now();
  const double close_s = std::chrono::duration<double>(closed - start).count();
  const double open_s = std::chrono::duration<double>(end - closed).count();
  r.ops = 1;
  r.seconds = open_s;
  r.wall_seconds = close_s + open_s;
  if (!s.ok() || !opened) {
    r.errors = 1;
    r.first_error = s.ok() ? error : s.ToString();
    return r;
  }
  char line[160];
  std::snprintf(line, sizeof(line), "close %.3f s, open %.3f s", close_s, open_s);
  r.note = line;
  r.index_report = slot->engine->IndexMemoryReport();
  return r;
}

void Suite::Emit(Result* r) {
  const auto base = kBaselineOf.find(r->benchmark);
  for (size_t i = 0; base != kBaselineOf.end() && i < base->second.size(); i++) {
    const std::string& name = base->second[i];
    if (baseline_mbps_[name] > 0 && r->bytes > 0) {
      r->baseline_ratio = r->MBPerSec() / baseline_mbps_[name];
      r->baseline_name = name;
      break;
    }
  }
  // Baselines run on no engine; peer_get (one member's transport, on the peer slot) is
  // vllm_load's yardstick too.
  if (r->engine.empty() || r->benchmark == "peer_get") baseline_mbps_[r->benchmark] = r->MBPerSec();
  const std::string who = r->engine.empty() ? r->benchmark : r->benchmark + "[" + r->engine + "]";
  samples_[who + " ops/sec"].push_back(r->OpsPerSec());
  if (r->baseline_ratio > 0) samples_[who + " / " + r->baseline_name].push_back(r->baseline_ratio);
  if (c_.json) {
    std::printf("%s\n", FormatJson(*r, c_.histogram).c_str());
  } else {
    std::printf("%s\n", FormatLine(*r).c_str());
    if (r->benchmark == "gc_churn") {
      static const char* kKinds[3] = {"read", "write", "delete"};
      for (int i = 0; i < 3; i++) {
        const Histogram& h = r->kind_hist[i];
        std::printf("  foreground %-6s : %" PRIu64
                    " calls, P50 %.1f P90 %.1f P99 %.1f "
                    "P99.9 %.1f micros\n",
                    kKinds[i], h.count(), h.Percentile(50), h.Percentile(90), h.Percentile(99),
                    h.Percentile(99.9));
      }
    }
    if (c_.histogram) {
      std::printf("Microseconds per %s:\n%s\n",
                  r->benchmark.rfind("vllm_", 0) == 0 ? "request" : "call",
                  r->hist.ToString().c_str());
    }
    if (!r->detail_text.empty()) std::printf("%s", r->detail_text.c_str());
    if (!r->index_report.empty()) std::printf("  %s\n", r->index_report.c_str());
    if (!r->statistics.empty()) std::printf("%s\n", r->statistics.c_str());
  }
  std::fflush(stdout);
  if (r->errors > 0) {
    errors_ += r->errors;
    std::fprintf(stderr, "kv_bench: %s: %" PRIu64 " errors; first: %s\n", r->label.c_str(),
                 r->errors, r->first_error.c_str());
  }
}

int Suite::Run() {
  std::string error;
  if (!PrepareDirectories(&error) || !FitSsdToDisk(&error) || !PrepareTrace(&error) ||
      !OpenEngines(&error) || !OpenPeer(&error)) {
    std::fprintf(stderr, "kv_bench: %s\n", error.c_str());
    return 1;
  }
  pool_ = std::make_unique<ValuePool>(c_.value_size, c_.seed);
  PrintHeader();
  uint64_t salt = 0;
  for (uint64_t round = 1; round <= c_.repeat; round++) {
    if (c_.repeat > 1 && !c_.json)
      std::printf("-- round %" PRIu64 " of %" PRIu64 "\n", round, c_.repeat);
    RunRound(round, &salt);
  }
  if (c_.repeat > 1) PrintMedians();
  Cleanup();
  if (errors_ > 0) {
    std::fprintf(stderr, "kv_bench: FAILED: %" PRIu64 " errors (see above)\n", errors_);
    return 1;
  }
  return 0;
}

void Suite::RunRound(uint64_t round, uint64_t* salt_counter) {
  for (const auto& name : c_.benchmarks) {
    const uint64_t salt = ++*salt_counter;
    if (IsBaseline(name)) {
      if (name.starts_with("memcpy")) {
        BenchContext b;
        b.config = &c_;
        b.pool = pool_.get();
        b.label = name;
        b.seed_salt = salt;
        for (Result& r : RunMemcpy(b, name)) {
          r.label = r.benchmark;
          Emit(&r);
        }
      } else {
        Result r = RunOne(name, nullptr, salt);
        Emit(&r);
      }
      continue;
    }
    if (IsPeerBenchmark(name)) {
      Result r = RunOne(name, &peer_, salt);
      Emit(&r);
      continue;
    }
    if (name == "ns_hotcold") {
      RunNsHotColdRound(round, salt);
      continue;
    }
    if (name == "delete_regex") {
      RunDeleteRegexRound(round, salt);
      continue;
    }
    if (name == "load_plan") {
      Result r = RunLoadPlan(c_);
      r.benchmark = r.label = name;
      Emit(&r);
      continue;
    }
    // Every other round runs the engines in the opposite order: on the development VM
    // whichever ran second was 10-15% slower, attached or in-process alike
    // (docs/benchmarks.md, "Sixth pass"), so a fixed order biases the ratio.
    std::vector<Result> per_engine(slots_.size());
    if (name == "trace" && c_.compare_planner && c_.trace.interleave) {
      RunTraceInterleaved(&per_engine);
      for (Result& r : per_engine) Emit(&r);
    } else {
      for (size_t k = 0; k < slots_.size(); k++) {
        const size_t i = round % 2 == 0 ? slots_.size() - 1 - k : k;
        per_engine[i] = RunOne(name, &slots_[i], salt);
        Emit(&per_engine[i]);
      }
    }
    if (per_engine.size() == 2) {
      // The attached engine over the in-process one, the one whose removal feed is read
      // (or that is used through a namespace) over the other; kvengine over RocksDB.
      const bool attached = c_.compare_in_process || c_.compare_removal_feed ||
                            c_.compare_namespace || c_.compare_arenas;
      const Result& a = per_engine[attached ? 1 : 0];
      const Result& b = per_engine[attached ? 0 : 1];
      if (c_.json) {
        std::printf("%s\n", FormatRatioJson(a, b).c_str());
      } else {
        std::printf("%s\n", FormatRatioLine(a, b).c_str());
      }
      if (name == "trace" && c_.compare_planner) {
        const std::string line = FormatPlannerComparison(a, b, c_.json);
        if (!line.empty()) std::printf("%s\n", line.c_str());
      }
      std::fflush(stdout);
      const std::string ratio = name + " " + a.engine + "/" + b.engine;
      AddAlternating(ratio, round, EngineRatio(a, b));
      if (EngineCpuRatio(a, b) > 0) {
        AddAlternating(ratio + " per CPU second", round, EngineCpuRatio(a, b));
      }
    }
  }
}

bool Suite::OwnKvengineDb(const std::string& name, const std::string& what, uint64_t salt,
                          BenchContext* b) {
  if (std::find(c_.engines.begin(), c_.engines.end(), "kvengine") == c_.engines.end()) {
    const std::string why = what + " kvengine's (--engine=" + c_.engines.front() + ")";
    if (c_.json) {
      std::printf("{\"benchmark\":\"%s\",\"skipped\":\"%s\"}\n", name.c_str(),
                  JsonEscape(why).c_str());
    } else {
      std::printf("%-12s : skipped: %s\n", name.c_str(), why.c_str());
    }
    return false;
  }
  b->config = &c_;
  b->pool = pool_.get();
  b->label = name;
  b->raw_dir = root_;
  b->seed_salt = salt;
  return true;
}

void Suite::RunNsHotColdRound(uint64_t round, uint64_t salt) {
  BenchContext b;
  if (!OwnKvengineDb("ns_hotcold", "namespaces are", salt, &b)) return;
  NsHotColdOutcome out = RunNsHotCold(b, round % 2 == 0);  // as the engines alternate
  for (Result& r : out.results) Emit(&r);
  std::printf("%s\n", c_.json ? out.json.c_str() : out.text.c_str());
  std::fflush(stdout);
  if (out.baseline_hits) {
    AddAlternating("ns_hotcold cold hit ratio shares/prefix", round, out.cold_hit_ratio_shares);
    AddAlternating("ns_hotcold cold hit ratio quotas/prefix", round, out.cold_hit_ratio_quotas);
  }
  AddAlternating("ns_hotcold hot puts shares/prefix", round, out.hot_puts_shares);
  AddAlternating("ns_hotcold hot puts quotas/prefix", round, out.hot_puts_quotas);
  AddAlternating("ns_hotcold hot puts shares/prefix per CPU second", round,
                 out.hot_puts_cpu_shares);
  AddAlternating("ns_hotcold hot puts quotas/prefix per CPU second", round,
                 out.hot_puts_cpu_quotas);
}

void Suite::RunDeleteRegexRound(uint64_t round, uint64_t salt) {
  BenchContext b;
  if (!OwnKvengineDb("delete_regex", "DeleteByRegex is", salt, &b)) return;
  const DeleteRegexOutcome out = RunDeleteRegex(b);
  if (!out.error.empty()) {
    errors_++;
    std::fprintf(stderr, "kv_bench: delete_regex: %s\n", out.error.c_str());
    return;
  }
  if (out.wrong > 0) errors_ += out.wrong;
  std::printf("%s%s", c_.json ? out.json.c_str() : out.text.c_str(), c_.json ? "\n" : "");
  std::fflush(stdout);
  AddAlternating("delete_regex BatchExists P99 beside/alone", round, out.p99_ratio);
}

void Suite::AddAlternating(const std::string& figure, uint64_t round, double ratio) {
  samples_[figure].push_back(ratio);
  alternating_[figure][round] = ratio;
}

// The geometric mean of each pair of rounds 2k-1 and 2k (rounds count from 1: the
// engines in both orders) of an alternating ratio, by round; a round without its
// partner (a figure some round did not give) is left out.
static std::vector<double> OrderBalanced(const std::map<uint64_t, double>& by_round) {
  std::vector<double> pairs;
  for (const auto& [round, ratio] : by_round) {
    if (round % 2 == 0) continue;
    const auto partner = by_round.find(round + 1);
    if (partner != by_round.end()) pairs.push_back(std::sqrt(ratio * partner->second));
  }
  return pairs;
}

void Suite::PrintMedians() {
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  auto print = [&](const std::string& what, const std::vector<double>& values, const char* of) {
    if (c_.json) {
      std::printf("{\"median_of\":%zu,\"of\":\"%s\",\"figure\":\"%s\",\"value\":%.4g}\n",
                  values.size(), of, JsonEscape(what).c_str(), median(values));
    } else {
      std::printf("%-40s : %.3f (of %zu %s, from %.3f to %.3f)\n", what.c_str(), median(values),
                  values.size(), of, *std::min_element(values.begin(), values.end()),
                  *std::max_element(values.begin(), values.end()));
    }
  };
  if (!c_.json) std::printf("-- medians of %" PRIu64 " rounds\n", c_.repeat);
  for (const auto& [what, values] : samples_) {
    print(what, values, "rounds");
    // A ratio of two engines whose order alternates, one pair of rounds at a time: on
    // this VM whichever engine ran second lost 10-15%, so the rounds' ratios fall in two
    // clusters and their median lands anywhere between.  Each pair's geometric mean
    // cancels the order.
    const auto by_round = alternating_.find(what);
    if (by_round != alternating_.end()) {
      const std::vector<double> pairs = OrderBalanced(by_round->second);
      if (!pairs.empty()) print(what + ", order-balanced", pairs, "pairs of rounds");
    }
  }
  std::fflush(stdout);
}

void Suite::Cleanup() {
  if (cleaned_) return;
  cleaned_ = true;
  for (Slot* slot : AllSlots()) {
    if (!slot->engine) continue;
    Status s = slot->engine->Close();
    if (!s.ok()) {
      std::fprintf(stderr, "kv_bench: closing %s: %s\n", slot->name.c_str(), s.ToString().c_str());
      errors_++;
    }
    slot->engine.reset();
  }
  std::error_code ec;
  if (!root_.empty()) {
    for (const auto& f : RawFiles(root_, c_.threads)) fs::remove(f, ec);
  }
  if (remove_root_) {
    ForgetRemoval(root_);
    fs::remove_all(root_, ec);
  }
}

}  // namespace kvbench
