// kv_bench's flags (gflags) and their validation into one BenchConfig.
#ifndef KVENGINE_DB_BENCH_FLAGS_H_
#define KVENGINE_DB_BENCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "db_bench/trace_config.h"

namespace kvbench {

// Every benchmark kv_bench knows, in the order --help lists them.
const std::vector<std::string>& KnownBenchmarks();
// True for the baselines, which run once per run whatever --engine says.
bool IsBaseline(const std::string& name);
// True for the benchmarks that run once, against the peer (--peer), whatever --engine says.
bool IsPeerBenchmark(const std::string& name);

// The flags, checked and resolved (sizes parsed, --num defaulted).
struct BenchConfig {
  std::vector<std::string> benchmarks;
  // "kvengine", "rocksdb", or both in that order; "kvengine" then "attached" with
  // --attach --compare_in_process.
  std::vector<std::string> engines;
  uint64_t num = 0;  // keys in the key space
  uint64_t value_size = 0;
  uint64_t key_size = 0;
  uint64_t batch_size = 0;
  uint64_t threads = 0;
  double duration = 0;  // seconds; 0: run --num operations
  std::string db;       // "" : a fresh temporary directory
  bool use_existing_db = false;
  bool histogram = false;
  bool statistics = false;
  bool json = false;
  bool verify = true;
  bool sync = false;
  uint64_t seed = 0;
  uint64_t num_layers = 0;
  uint64_t buffer_offset = 0;  // where the vLLM layer buffers start past a page boundary
  uint64_t requests = 0;       // vLLM requests: num / num_layers, at least 1
  uint64_t memory_budget = 0;  // bytes, per engine
  std::vector<std::pair<std::string, std::string>> kvengine_options;
  std::string rocksdb_options;
  uint64_t rocksdb_min_blob_size = 0;
  uint64_t rocksdb_blob_file_size = 0;
  bool rocksdb_wal = false;
  double gc_delete_fraction = 0;
  double compact_delete_fraction = 0;
  double gc_write_fraction = 0;
  double progress_interval = 0;
  std::string peer;  // HOST:PORT, checked; "" : serve one in this process
  std::string peer_transport;
  std::string rawucx_memory = "ucx";  // "ucx" or "user" (--rawucx_memory)
  bool peer_register_values = true;   // --peer_register_values
  std::string auth_token_file;        // readable and not empty when set
  // kvengine attached to an owner: its socket, or kAttachOwnChild to start one.
  std::string attach;
  bool compare_in_process = false;  // --attach: an in-process kvengine beside the attached one
  bool compare_namespace = false;   // a kvengine used through a namespace, beside one
  bool compare_arenas = false;  // --attach: a namespace in its own arena, beside one in the shared
  bool compare_removal_feed = false;  // a kvengine whose removal feed is read, beside one
  bool compare_planner = false;       // trace: a kvengine without the load planner, beside one
  uint64_t repeat = 1;                // rounds of the whole benchmark list
  std::string failover_member;        // cluster_failover: HOST:PORT of the member to kill
  int64_t failover_pid = 0;           // cluster_failover: its process id
  std::string join_command;           // cluster_join: the shell command that starts a member
  TraceConfig trace;                  // the trace benchmark
  // ns_hotcold (checked when it runs): the cold working set in values (0: a quarter of
  // the memory budget's worth), hot puts per cold read, whether a cold miss puts the value
  // back, and the quotas run's memory quotas in bytes (0: half the budget for cold, the
  // rest for hot).
  uint64_t ns_cold_keys = 0;
  uint64_t ns_cold_read_every = 16;
  bool ns_cold_refill = true;
  uint64_t ns_cold_quota = 0;
  uint64_t ns_hot_quota = 0;
  // ns_hotcold on the SSD tier: its capacity in bytes (0: the memory tier alone).  The
  // working set, the quotas (SSD quotas then) and the shares are of it.
  uint64_t ns_ssd = 0;
  // The tier ns_hotcold's tenants share: ns_ssd when set, else the memory budget.
  uint64_t NsTier() const { return ns_ssd != 0 ? ns_ssd : memory_budget; }
};

// --attach given alone: kv_bench starts the owner itself.
inline constexpr char kAttachOwnChild[] = "child";

// Checks every flag and fills *config.  On a bad flag returns false and stores a message
// that names the flag, the value and what is accepted in *error.
bool ValidateFlags(BenchConfig* config, std::string* error);

// Splits "a=1,b=x,y,c=2" into {a,1} {b,"x,y"} {c,2}: a comma starts a new pair only when
// the text after it has an '=' before the next comma, so list values keep their commas.
bool ParseOptionList(const std::string& text, std::vector<std::pair<std::string, std::string>>* out,
                     std::string* error);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_FLAGS_H_
