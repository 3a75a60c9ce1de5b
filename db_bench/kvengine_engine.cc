// The kvengine adapter: a thin pass-through to kvengine::DB, opened in this process or
// attached to an owner process (--attach).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "db_bench/engine.h"
#include "db_bench/flags.h"
#include "db_bench/stop_signals.h"
#include "kvengine/db.h"
#include "util/ready_child.h"

namespace kvbench {
namespace {

// The owner process --attach starts: kv_bench re-executed (ServeAttached), holding the
// DB until its stdin closes.
Status StartOwner(const EngineConfig& config, const std::string& socket,
                  kvengine::ReadyChild* owner) {
  std::vector<std::string> args{
      "kv_bench",
      "--serve_attached",
      socket,
      config.path,
      "memory_capacity_bytes=" + std::to_string(config.memory_budget),
      std::string("create_if_missing=") + (config.use_existing ? "false" : "true")};
  for (const auto& [name, value] : config.kvengine_options) args.push_back(name + "=" + value);
  // At most 60 s: a large arena is pre-faulted at open.
  return owner->Start(args, 60000);
}

class KvengineEngine : public Engine {
 public:
  ~KvengineEngine() override { Close(); }

  const char* Name() const override { return "kvengine"; }

  Status Open(const EngineConfig& config) override {
    write_options_.sync = config.sync;
    if (!config.attach.empty()) return Attach(config);
    kvengine::Options options;
    Status s = KvengineOptions(config, &options);
    if (!s.ok()) return s;
    s = kvengine::DB::Open(options, config.path, &db_);
    if (s.ok() && !config.namespace_name.empty()) s = OpenNamespace(config.namespace_name);
    if (!s.ok()) return s;
    notes_.push_back("kvengine: memory_capacity_bytes=" + std::to_string(config.memory_budget) +
                     (config.kvengine_options.empty() ? "" : " plus --options") +
                     (config.sync ? ", sync writes" : ""));
    if (config.removal_feed_reader) StartFeedReader();
    return s;
  }

  Status Close() override {
    StopFeedReader();
    ns_.reset();
    calls_ = nullptr;
    if (!db_) return Status::OK();
    Status s = db_->Close();
    db_.reset();
    if (owner_) {
      ForgetOnStop(owner_->pid());  // reaped below: its pid may be another's after
      ForgetRemoval(owner_socket_);
      owner_->Stop();  // after the client's close: the owner closes its DB
    }
    owner_.reset();
    return s;
  }

  Status Put(const Slice& key, const Slice& value) override {
    return Calls()->Put(write_options_, key, value);
  }
  Status GetInto(const Slice& key, MutableSlice buffer, size_t* size) override {
    return Calls()->GetInto(read_options_, key, buffer, size);
  }
  Status Delete(const Slice& key) override { return Calls()->Delete(write_options_, key); }

  Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                  std::vector<int64_t>* results) override {
    return Calls()->BatchPut(write_options_, keys, values, results);
  }
  Status BatchGetInto(std::span<const Slice> keys, std::span<const Destination> destinations,
                      std::vector<int64_t>* results) override {
    return Calls()->BatchGetInto(read_options_, keys, destinations, results);
  }
  Status BatchGetIntoGroups(std::span<const Slice> keys, std::span<const Destination> destinations,
                            std::span<const size_t> group_ends,
                            const std::function<void(size_t)>& on_ready,
                            std::vector<int64_t>* results) override {
    return Calls()->BatchGetIntoGroups(read_options_, keys, destinations, group_ends, on_ready,
                                       results);
  }
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return Calls()->BatchExists(keys, results);
  }
  Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return Calls()->BatchLocate(keys, results);
  }
  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return Calls()->BatchDelete(write_options_, keys, results);
  }
  bool DeleteReportsAbsent() const override { return true; }

  Status Flush() override { return db_->Flush(); }

  Status Compact(uint64_t* reclaimed, uint64_t* rewritten) override {
    *reclaimed = *rewritten = 0;
    const uint64_t rewritten_before = StatValue("ssd.gc_bytes_rewritten");
    // Rounds until one reclaims nothing; each is bounded by gc_max_buckets_per_round.
    for (;;) {
      uint64_t n = 0;
      Status s = db_->CompactBuckets(&n);
      if (!s.ok()) return s;
      if (n == 0) break;
      *reclaimed += n;
    }
    *rewritten = StatValue("ssd.gc_bytes_rewritten") - rewritten_before;
    return Status::OK();
  }

  Status Prefetch(std::span<const Slice> keys, uint64_t* started) override {
    std::vector<int64_t> results;
    Status s = Calls()->Prefetch(keys, &results);
    *started = static_cast<uint64_t>(std::count(results.begin(), results.end(), 1));
    return s;
  }
  Status RegisterBuffer(void* addr, size_t length) override {
    return Calls()->RegisterBuffer(addr, length);
  }
  Status UnregisterBuffer(void* addr) override { return Calls()->UnregisterBuffer(addr); }

  std::string Property(const std::string& name) override {
    std::string value;
    return db_->GetProperty(name, &value) ? value : "";
  }

  // From the stats text (and the peers' when the DB is in a cluster): two property calls,
  // so this is read outside the timed calls.
  std::optional<TierCounts> ReadTierCounts() override {
    std::string text;
    if (!db_->GetProperty("kvengine.stats", &text)) return std::nullopt;
    TierCounts t;
    t.memory = StatLine(text, "memory.hits");
    t.ssd = StatLine(text, "ssd.hits");
    std::string peers;
    if (db_->GetProperty("kvengine.peers", &peers)) t.peer = StatLine("\n" + peers, "remote_hits");
    return t;
  }

  std::string IndexMemoryReport() override {
    // One snapshot of the stats for every figure (each property call renders all of them,
    // and an attached DB asks its owner).
    std::string text;
    if (!db_->GetProperty("kvengine.stats", &text)) text.clear();
    auto stat = [&](const std::string& name) { return StatLine(text, name); };
    // The memory tier's index first (item descriptors and hash slots, not the keys), on
    // a line of its own.
    const uint64_t memory_keys = stat("memory.items");
    const uint64_t memory_bytes = stat("memory.index_bytes");
    char memory_line[160];
    std::snprintf(
        memory_line, sizeof(memory_line),
        "memory index: %" PRIu64 " bytes of RAM for %" PRIu64 " keys in memory (%.1f B/key)\n  ",
        memory_bytes, memory_keys,
        memory_keys == 0 ? 0.0
                         : static_cast<double>(memory_bytes) / static_cast<double>(memory_keys));
    const uint64_t keys = stat("ssd.keys"), bytes = stat("ssd.index_bytes");
    char line[320];
    int n = std::snprintf(
        line, sizeof(line),
        "ssd index: %" PRIu64 " bytes of RAM for %" PRIu64
        " keys on SSD (%.1f B/key); its last open took %.3f s, %" PRIu64
        " keys from the map checkpoint",
        bytes, keys, keys == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(keys),
        static_cast<double>(stat("ssd.open_micros")) / 1e6, stat("ssd.checkpoint_keys"));
    // Disk use beside the values' bytes, once every bucket is a file (an open bucket
    // counts its whole reserved image).
    const uint64_t live = stat("ssd.live_bytes"), used = stat("ssd.used_bytes");
    if (stat("ssd.pending_buckets") == 0 && live > 0 && n > 0 &&
        static_cast<size_t>(n) < sizeof(line)) {
      std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n),
                    "; bucket files take %.3fx the live value bytes",
                    static_cast<double>(used) / static_cast<double>(live));
    }
    return std::string(memory_line) + line;
  }

  std::string StatisticsText() override {
    std::string out, value;
    if (db_->GetProperty("kvengine.perf", &value)) out += value + "\n";
    if (db_->GetProperty("kvengine.stats", &value)) out += value;
    return out;
  }

  // One "name: value" line of the stats text; 0 when absent.
  uint64_t StatValue(const std::string& name) {
    std::string text;
    if (!db_->GetProperty("kvengine.stats", &text)) return 0;
    return StatLine(text, name);
  }

  // The stats text is "name: value" per line; the GC's counter is the first whose name
  // mentions both "reclaimed" and "bytes" (the SSD tier's GC adds it).
  std::optional<uint64_t> ReclaimedBytes() override {
    std::string text;
    if (!db_->GetProperty("kvengine.stats", &text)) return std::nullopt;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string name = line.substr(0, colon);
      if (name.find("reclaimed") == std::string::npos || name.find("bytes") == std::string::npos) {
        continue;
      }
      try {
        return std::stoull(line.substr(colon + 1));
      } catch (...) {
        return std::nullopt;
      }
    }
    return std::nullopt;
  }

  std::vector<std::string> Notes() const override { return notes_; }

 private:
  // Reads the removal feed every 10 ms, as a vLLM worker with KV events does each
  // step (its events are dropped: what is measured is the cost to the data path).
  void StartFeedReader() {
    feed_stop_ = false;
    feed_reader_ = std::thread([this] {
      uint64_t cursor = 0, events = 0, missed = 0;
      kvengine::RemovalBatch batch;
      while (!feed_stop_.load(std::memory_order_relaxed)) {
        if (!db_->ReadRemovals(cursor, 4096, &batch).ok()) break;
        if (!batch.events.empty()) cursor = batch.events.back().sequence;
        events += batch.events.size();
        missed += batch.missed;
        if (batch.events.size() < 4096) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      feed_events_ = events;
      feed_missed_ = missed;
    });
  }
  void StopFeedReader() {
    if (!feed_reader_.joinable()) return;
    feed_stop_ = true;
    feed_reader_.join();
    std::fprintf(stderr,
                 "kvengine+feed: the reader got %" PRIu64 " removal events (%" PRIu64 " missed)\n",
                 feed_events_, feed_missed_);
  }

  Status Attach(const EngineConfig& config) {
    std::string socket = config.attach;
    if (socket == kAttachOwnChild) {
      socket = config.path + ".sock";  // next to the DB: its directory is the owner's
      owner_ = std::make_unique<kvengine::ReadyChild>();
      Status s = StartOwner(config, socket, owner_.get());
      if (!s.ok()) return s;
      KillOnStop(owner_->pid());
      RemoveOnStop(socket);  // the owner, killed, cannot
      owner_socket_ = socket;
    }
    // The client takes --options too: those a client uses (peer_timeout_ms,
    // local_busy_poll_us, perf_level) apply to it, the rest are the owner's.
    kvengine::Options options;
    options.apply_environment = false;
    for (const auto& [name, value] : config.kvengine_options) {
      Status set = options.Set(name, value);
      if (!set.ok()) return set;
    }
    Status s = kvengine::DB::Attach(options, socket, &db_);
    if (s.ok() && !config.namespace_name.empty()) s = OpenNamespace(config.namespace_name);
    if (!s.ok()) return s;
    notes_.push_back("kvengine: attached to " + socket +
                     (owner_
                          ? " (owner: child process " + std::to_string(owner_->pid()) +
                                ", memory_capacity_bytes=" + std::to_string(config.memory_budget) +
                                (config.kvengine_options.empty() ? "" : " plus --options") + ")"
                          : " (the owner's options)"));
    return s;
  }

  std::unique_ptr<kvengine::ReadyChild> owner_;
  std::string owner_socket_;  // the owner child's socket, when owner_
  // The DB the workload's calls go to: db_, or the handle of --compare_namespace's
  // namespace.
  kvengine::DB* Calls() const { return calls_ != nullptr ? calls_ : db_.get(); }
  // Creates (or, in a DB that has it, opens) namespace `name`; its handle takes the calls.
  Status OpenNamespace(const std::string& name) {
    Status s = db_->CreateNamespace(name, kvengine::NamespaceOptions(), &ns_);
    if (s.IsInvalidArgument()) s = db_->OpenNamespace(name, &ns_);
    if (!s.ok()) return s;
    calls_ = ns_.get();
    notes_.push_back("kvengine+ns: every call through the handle of namespace '" + name + "'");
    return s;
  }

  std::unique_ptr<kvengine::DB> db_;
  std::unique_ptr<kvengine::DB> ns_;
  kvengine::DB* calls_ = nullptr;
  std::thread feed_reader_;
  std::atomic<bool> feed_stop_{false};
  uint64_t feed_events_ = 0, feed_missed_ = 0;
  kvengine::WriteOptions write_options_;
  kvengine::ReadOptions read_options_;
  std::vector<std::string> notes_;
};

}  // namespace

std::unique_ptr<Engine> NewKvengineEngine() { return std::make_unique<KvengineEngine>(); }

Status KvengineOptions(const EngineConfig& config, kvengine::Options* options) {
  Status s = options->Set("memory_capacity_bytes", std::to_string(config.memory_budget));
  for (const auto& [name, value] : config.kvengine_options) {
    if (s.ok()) s = options->Set(name, value);
  }
  options->create_if_missing = !config.use_existing;
  return s;
}

uint64_t StatLine(const std::string& stats, const std::string& name) {
  const std::string line = "\n" + name + ": ";
  const size_t at = stats.find(line);
  if (at == std::string::npos) return 0;
  return std::strtoull(stats.c_str() + at + line.size(), nullptr, 10);
}

int ServeAttached(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "kv_bench --serve_attached SOCKET PATH [name=value ...]\n");
    return 2;
  }
  kvengine::Options options;
  Status s;
  for (int i = 4; i < argc && s.ok(); i++) {
    const std::string pair = argv[i];
    const size_t eq = pair.find('=');
    s = eq == std::string::npos ? Status::InvalidArgument("not name=value", pair)
                                : options.Set(pair.substr(0, eq), pair.substr(eq + 1));
  }
  if (s.ok()) s = options.Set("local_listen", argv[2]);
  std::unique_ptr<kvengine::DB> db;
  if (s.ok()) s = kvengine::DB::Open(options, argv[3], &db);
  if (!s.ok()) {
    std::printf("error: %s\n", s.ToString().c_str());
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  kvengine::SayReadyAndWaitForStdinToClose();
  s = db->Close();
  return s.ok() ? 0 : 1;
}

}  // namespace kvbench
