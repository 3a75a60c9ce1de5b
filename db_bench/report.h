// Results of one benchmark on one engine, and how they are printed: db_bench's result line
// (or one JSON object with --json), the histogram, and the ratio lines of --engine=both.
#ifndef KVENGINE_DB_BENCH_REPORT_H_
#define KVENGINE_DB_BENCH_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "db_bench/histogram.h"

namespace kvbench {

// The trace benchmark's figures that two of its runs are compared by (--compare_planner).
struct TraceFigures {
  double prefill_saved_s = 0;
  double prefill_all_s = 0;
  uint64_t faster = 0;  // requests loaded faster than recompute
  uint64_t slower = 0;  // ... and slower
  double slower_lost_s = 0;
  uint64_t slower_from_memory = 0;    // ... of the slower, loads from memory alone
  uint64_t slower_moved_in_load = 0;  // ... loads of a key moved off memory during them
  double ttft_saved_p50_us = 0;
  double ttft_saved_p99_us = 0;
  uint64_t bytes_loaded = 0;
  uint64_t refused_blocks = 0;  // hit blocks the load planner left to recompute
  bool planner = false;
};

struct Result {
  std::string benchmark;  // "fillrandom"
  std::string engine;     // "kvengine", "rocksdb", or "" for a baseline
  std::string label;      // the name printed in the line ("vllm_get[rocksdb]" with both)
  uint64_t ops = 0;       // operations (keys, or requests for vllm_*)
  uint64_t keys = 0;      // keys touched
  uint64_t bytes = 0;     // bytes moved (keys and values)
  double seconds = 0;     // time inside the timed calls (the slowest thread's)
  double wall_seconds = 0;
  // The CPU time of the benchmark's threads over their operations (all threads together;
  // 0 when not measured): unlike `seconds`, not stretched by waits for a core on a loaded
  // machine.  It counts kv_bench's own work per operation too (key formatting, checking
  // the bytes), the same for every engine, and none of the engine's background threads.
  double cpu_seconds = 0;
  uint64_t threads = 1;
  // Lookups: how many keys were expected and how many were found (when counted).
  bool counts_found = false;
  uint64_t lookups = 0;
  uint64_t found = 0;
  uint64_t verified = 0;  // values whose bytes were checked and matched
  uint64_t errors = 0;    // failed calls and mismatched bytes
  std::string first_error;
  std::optional<uint64_t> reclaimed_bytes;  // gc_churn
  bool reports_reclaimed = false;           // gc_churn: print the reclaimed field
  bool reports_latency = false;             // peer_*: P50/P99 per call, also in JSON
  std::string note;                         // appended in parentheses, e.g. "O_DIRECT"
  double baseline_ratio = 0;                // MB/s over baseline_name's, 0: none
  std::string baseline_name;
  std::string statistics;    // --statistics text
  std::string index_report;  // the engine's index RAM after a fill, when it reports it
  // A benchmark's own figures (trace): indented lines printed under the result line, and
  // JSON members (without braces) added to its JSON object.
  std::string detail_text;
  std::string detail_json;
  std::optional<TraceFigures> trace;  // the trace benchmark's
  Histogram hist;
  Histogram kind_hist[3];  // gc_churn: reads, writes, deletes

  double MicrosPerOp() const { return ops ? seconds * 1e6 / static_cast<double>(ops) : 0; }
  double OpsPerSec() const { return seconds > 0 ? static_cast<double>(ops) / seconds : 0; }
  double OpsPerCpuSecond() const {
    return cpu_seconds > 0 ? static_cast<double>(ops) / cpu_seconds : 0;
  }
  double MBPerSec() const {
    return seconds > 0 ? static_cast<double>(bytes) / 1048576.0 / seconds : 0;
  }
};

// "fillrandom   :    4392.180 micros/op 227 ops/sec 8.784 seconds 2000 operations;  227.7 MB/s
// (2000 of 2000 found)"
std::string FormatLine(const Result& r);
// The same as one JSON object on one line (histogram percentiles included when recorded).
std::string FormatJson(const Result& r, bool with_histogram);
// a's ops/sec over b's (0 when b has none): the engines of one benchmark.
double EngineRatio(const Result& a, const Result& b);
// The same per CPU second of the benchmark's threads (0 when either was not measured).
double EngineCpuRatio(const Result& a, const Result& b);
// "vllm_get     : kvengine/rocksdb 12.34x ops/sec (812 vs 65.8)", named by the engines.
std::string FormatRatioLine(const Result& a, const Result& b);
// {"benchmark":..,"engine":"both","ratio_A_over_B":..,"A_ops_per_sec":..,"B_ops_per_sec":..}
std::string FormatRatioJson(const Result& a, const Result& b);

std::string JsonEscape(const std::string& s);
// printf into a string, of any length.
std::string Printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_REPORT_H_
