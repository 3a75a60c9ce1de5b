// Suite: one kv_bench run.  Prepares the DB directories, opens the engines, runs the
// benchmarks in order (each on every engine with --engine=both, the baselines once),
// prints the results and cleans up.
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
  bool OpenEngines(std::string* error);
  void PrintHeader();
  Result RunOne(const std::string& name, Slot* slot, uint64_t salt);
  void Prefill(const std::string& name, Slot* slot);
  void Emit(Result* r);
  void Cleanup();

  BenchConfig c_;
  FILE* info_;  // the header, notes: stdout, or stderr with --json
  std::string root_;
  bool remove_root_ = false;
  std::vector<Slot> slots_;
  std::unique_ptr<ValuePool> pool_;
  std::map<std::string, double> baseline_mbps_;
  uint64_t errors_ = 0;
  bool cleaned_ = false;
};

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_SUITE_H_
