// Engine: the few calls kv_bench makes, so the same workload runs against kvengine and
// against RocksDB.  The shape is kvengine's public API (include/kvengine/db.h): batch
// calls return a Status for the batch and one result per key, with the same meaning
// (BatchPut 0 or negative; BatchGetInto bytes or negative; BatchExists 1/0/negative;
// BatchDelete 0, -1 absent, or negative).
//
// Thread-safety: every call may be made from any number of threads at once, as with the
// engines themselves; Open and Close are called by one thread with no other call running.
#ifndef KVENGINE_DB_BENCH_ENGINE_H_
#define KVENGINE_DB_BENCH_ENGINE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvengine/db.h"

namespace kvbench {

using kvengine::Destination;
using kvengine::MutableSlice;
using kvengine::Slice;
using kvengine::Status;
using kvengine::ValueParts;

// What an engine is opened with, taken from the flags.
struct EngineConfig {
  std::string path;            // the DB directory
  bool use_existing = false;   // open what is there (fail when there is no DB)
  uint64_t memory_budget = 0;  // bytes of memory the engine may use for data
  bool sync = false;           // every write durable before it returns
  bool statistics = false;     // collect the engine's own statistics
  // kvengine: "name=value" pairs for kvengine::Options::Set, applied in order after the
  // memory budget.
  std::vector<std::pair<std::string, std::string>> kvengine_options;
  // RocksDB: an options string for rocksdb::GetOptionsFromString, applied last.
  std::string rocksdb_options;
  uint64_t rocksdb_min_blob_size = 4096;
  uint64_t rocksdb_blob_file_size = 256ull << 20;
  bool rocksdb_wal = false;  // keep the WAL on even without --sync
  // The peer engine: the server at `peer` (HOST:PORT), or, when empty, a fresh kvengine
  // DB served in this process on 127.0.0.1 from `path` and sized to hold
  // `data_set_bytes`; reached over `peer_transport` ("tcp", "ucx", "rdma" or "auto") with the
  // token in `auth_token_file` (none when empty).
  std::string peer;
  std::string peer_transport = "tcp";
  std::string auth_token_file;
  uint64_t data_set_bytes = 0;
  // kvengine: attach to the owner serving this socket instead of opening `path`; "child":
  // start a child process that owns a fresh DB at `path` and serves it.
  std::string attach;
  // kvengine: a thread reads the DB's removal feed every 10 ms while it is open.
  bool removal_feed_reader = false;
  // kvengine: every call goes through the handle of this namespace (created when the DB
  // lacks it; DB::CreateNamespace) instead of the DB itself.  Empty: the DB.
  std::string namespace_name;
};

// Keys served by each tier, as an engine counts them (counters that only grow).
struct TierCounts {
  uint64_t memory = 0;  // kvengine: "memory.hits" of kvengine.stats
  uint64_t ssd = 0;     // kvengine: "ssd.hits"
  uint64_t peer = 0;    // kvengine in a cluster: "remote_hits" of kvengine.peers

  TierCounts operator-(const TierCounts& o) const {
    return {memory - o.memory, ssd - o.ssd, peer - o.peer};
  }
  TierCounts& operator+=(const TierCounts& o) {
    memory += o.memory;
    ssd += o.ssd;
    peer += o.peer;
    return *this;
  }
};

class Engine {
 public:
  virtual ~Engine() = default;

  // "kvengine", "rocksdb" or "peer".
  virtual const char* Name() const = 0;

  virtual Status Open(const EngineConfig& config) = 0;
  // Idempotent.
  virtual Status Close() = 0;

  virtual Status Put(const Slice& key, const Slice& value) = 0;
  // Stores the value's size in *size; NotFound when absent; BufferTooSmall as in kvengine.
  virtual Status GetInto(const Slice& key, MutableSlice buffer, size_t* size) = 0;
  virtual Status Delete(const Slice& key) = 0;

  virtual Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                          std::vector<int64_t>* results) = 0;
  virtual Status BatchGetInto(std::span<const Slice> keys,
                              std::span<const Destination> destinations,
                              std::vector<int64_t>* results) = 0;
  // A layer-wise load (kvengine::DB::BatchGetIntoGroups): group g is the keys up to
  // group_ends[g], and on_ready(g) is called, in group order, once its keys are in.  The
  // default -- and vllm_load_serial's, whatever the engine -- is one BatchGetInto per
  // group, in turn.
  virtual Status BatchGetIntoGroups(std::span<const Slice> keys,
                                    std::span<const Destination> destinations,
                                    std::span<const size_t> group_ends,
                                    const std::function<void(size_t)>& on_ready,
                                    std::vector<int64_t>* results) {
    results->assign(keys.size(), 0);
    std::vector<int64_t> r;
    size_t begin = 0;
    for (size_t g = 0; g < group_ends.size(); g++) {
      const size_t n = group_ends[g] - begin;
      Status s = BatchGetInto(keys.subspan(begin, n), destinations.subspan(begin, n), &r);
      if (!s.ok()) return s;
      std::copy(r.begin(), r.end(), results->begin() + static_cast<ptrdiff_t>(begin));
      on_ready(g);
      begin = group_ends[g];
    }
    return Status::OK();
  }
  virtual Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) = 0;
  // results[i] is 0 when keys[i] was deleted, -1 when it was absent; an engine that cannot
  // tell (RocksDB: a delete is a blind write) reports 0 and says so in DeleteReportsAbsent.
  virtual Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) = 0;
  virtual bool DeleteReportsAbsent() const = 0;

  // Makes everything written so far durable (where the engine has a durable tier).
  virtual Status Flush() = 0;
  // Runs the engine's garbage collection now, until it finds nothing more to reclaim
  // (kvengine: CompactBuckets rounds; RocksDB: a full CompactRange with forced blob
  // GC).  Stores the bytes of files it freed, net of what it rewrote, in *reclaimed and
  // the bytes it rewrote in *rewritten.
  virtual Status Compact(uint64_t* reclaimed, uint64_t* rewritten) = 0;

  // The engine's statistics text for --statistics (empty when it has none).
  virtual std::string StatisticsText() = 0;
  // Bytes the engine's garbage collection has reclaimed so far, when it reports them.
  virtual std::optional<uint64_t> ReclaimedBytes() = 0;
  // Notes printed once, under the header, on how the engine was set up for the run.
  virtual std::vector<std::string> Notes() const = 0;
  // The buffers loads and saves use again and again (kvengine::DB::RegisterBuffer); an
  // engine with nothing to register accepts them.
  virtual Status RegisterBuffer(void* /*addr*/, size_t /*length*/) { return Status::OK(); }
  virtual Status UnregisterBuffer(void* /*addr*/) { return Status::OK(); }
  // Starts bringing keys up from a slower tier ahead of their read (kvengine's
  // DB::Prefetch) and stores in *started how many it started; an engine without tiers to
  // promote between starts none.
  virtual Status Prefetch(std::span<const Slice> /*keys*/, uint64_t* started) {
    *started = 0;
    return Status::OK();
  }
  // The keys each tier has served so far; nullopt when the engine does not tell.
  virtual std::optional<TierCounts> ReadTierCounts() { return std::nullopt; }
  // Where each key is (kvengine's DB::BatchLocate: a kvengine::LocatedTier per key, 0
  // absent, negative an error); NotSupported by an engine without tiers.
  virtual Status BatchLocate(std::span<const Slice> /*keys*/, std::vector<int64_t>* /*results*/) {
    return Status::NotSupported("BatchLocate");
  }
  // A property of the engine (kvengine: DB::GetProperty, e.g. "kvengine.peers"); empty
  // when the engine has no such property.
  virtual std::string Property(const std::string& /*name*/) { return ""; }
  // One line on the RAM its index takes (printed after fill benchmarks); empty when the
  // engine does not report it.
  virtual std::string IndexMemoryReport() { return ""; }
};

std::unique_ptr<Engine> NewKvengineEngine();
// kvengine's options for `config`: memory_capacity_bytes from memory_budget, then
// kvengine_options in order, over what *options holds already.
Status KvengineOptions(const EngineConfig& config, kvengine::Options* options);
// The value of line "name: value" of a "kvengine.stats" text; 0 when absent.
uint64_t StatLine(const std::string& stats, const std::string& name);
// The owner child of --attach (argv: "--serve_attached", SOCKET, PATH, name=value...):
// opens the DB at PATH with those options and local_listen=SOCKET, prints "ready" on
// stdout, and serves until its stdin closes (kv_bench exited).  The exit status.
int ServeAttached(int argc, char** argv);
// A kvengine peer reached through kvengine::Transport (peer_engine.cc).  Open fails with
// a Status naming the peer when it cannot be reached.
std::unique_ptr<Engine> NewPeerEngine();
// nullptr when kv_bench was built without RocksDB.
std::unique_ptr<Engine> NewRocksDBEngine();
bool HaveRocksDB();

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_ENGINE_H_
