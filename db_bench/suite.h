// Suite: one kv_bench run.  Prepares the DB directories, opens the engines (and the peer
// when a peer benchmark runs), runs the benchmarks in order (each on every engine with
// --engine=both; the baselines and the peer benchmarks once), prints the results and
// cleans up.
#ifndef KVENGINE_DB_BENCH_SUITE_H_
#define KVENGINE_DB_BENCH_SUITE_H_

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "db_bench/benchmarks.h"
#include "db_bench/engine.h"
#include "db_bench/flags.h"
#include "db_bench/report.h"
#include "db_bench/trace.h"
#include "db_bench/trace_replay.h"
#include "db_bench/workload.h"

namespace kvbench {

class Suite {
 public:
  explicit Suite(BenchConfig config);
  ~Suite();
  Suite(const Suite&) = delete;
  Suite& operator=(const Suite&) = delete;

  // Runs everything; returns the process exit code (0, or 1 on any error).
  int Run();

 private:
  struct Slot {
    std::string name;
    std::string path;
    std::unique_ptr<Engine> engine;
    bool keys_filled = false;
    bool vllm_written = false;
  };

  bool PrepareDirectories(std::string* error);
  // A temporary DB's SSD tier at most half its disk's free space (shared by the run's
  // DBs): lowered, with a note in the header, when --options (or the default) ask more.
  bool FitSsdToDisk(std::string* error);
  // The trace benchmark's trace: read from --trace, or generated and written there (or
  // into the DB directory); and the ideal caches' figures on it.
  bool PrepareTrace(std::string* error);
  bool OpenEngines(std::string* error);
  bool OpenPeer(std::string* error);
  // Opens slot->engine (made, not opened) with the run's settings; on failure resets it.
  // With reopen, the data the slot already holds is kept (the reopen benchmark).
  bool OpenSlot(Slot* slot, std::string* error, bool reopen = false);
  // The reopen benchmark: closes slot's engine and opens it again on the same data.
  Result RunReopen(Slot* slot);
  void PrintHeader();
  Result RunOne(const std::string& name, Slot* slot, uint64_t salt);
  // --compare_planner --trace_interleave: both replays at once, step by step; the
  // results in slots_'s order.
  void RunTraceInterleaved(std::vector<Result>* per_engine);
  void Prefill(const std::string& name, Slot* slot);
  void Emit(Result* r);
  // One pass over --benchmarks; *salt_counter numbers the benchmarks across rounds.
  // Even rounds (counted from 1) run the engines in the opposite order.
  void RunRound(uint64_t round, uint64_t* salt_counter);
  // ns_hotcold, once per round whatever the engines (its own in-process kvengine DBs);
  // skipped with a note when --engine names no kvengine.  Even rounds run its
  // configurations in the opposite order.
  // The benchmarks that open kvengine DBs of their own: false, after a "skipped" line,
  // when kvengine is not among --engine; else *b set for `name`.
  bool OwnKvengineDb(const std::string& name, const std::string& what, uint64_t salt,
                     BenchContext* b);
  void RunNsHotColdRound(uint64_t round, uint64_t salt);
  // delete_regex (kvengine only): its outcome, and its ratio among the alternating figures.
  void RunDeleteRegexRound(uint64_t round, uint64_t salt);
  // Records round `round`'s ratio of two engines run in alternating order (samples_).
  void AddAlternating(const std::string& figure, uint64_t round, double ratio);
  // --repeat: each figure's median over the rounds.
  void PrintMedians();
  void Cleanup();
  // The engines' slots, then the peer's.
  std::vector<Slot*> AllSlots();

  BenchConfig c_;
  FILE* info_;  // the header, notes: stdout, or stderr with --json
  std::string root_;
  bool remove_root_ = false;
  std::string ssd_note_;  // FitSsdToDisk's note, when it lowered the capacity
  std::vector<Slot> slots_;
  Slot peer_;  // the peer of peer_put/peer_get; its engine is open only when they run
  std::unique_ptr<ValuePool> pool_;
  std::vector<TraceRequest> trace_;
  IdealCacheReport ideal_;
  std::map<std::string, double> baseline_mbps_;
  // Every figure of every round, by name ("vllm_get[attached] / memcpy_layers_read").
  std::map<std::string, std::vector<double>> samples_;
  // The samples_ that compare two engines run in an order that alternates round by
  // round, by round: PrintMedians also reports them order-balanced (see there).
  std::map<std::string, std::map<uint64_t, double>> alternating_;
  uint64_t errors_ = 0;
  bool cleaned_ = false;
};

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_SUITE_H_
