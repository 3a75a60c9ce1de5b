// kv_bench: the db_bench-style benchmark of kvengine, with RocksDB in the same run.
//
// Every run carries its own physical baselines (memcpy of the same bytes; O_DIRECT I/O of
// the same bytes), so results read as ratios against figures measured on the same
// machine at the same time:
//
//   kv_bench --benchmarks=memcpy,vllm_write,vllm_get --engine=both --value_size=1048576
//
// and the same for a remote peer against a plain loopback socket stream:
//
//   kv_bench --benchmarks=rawsocket,peer_put,peer_get [--peer=HOST:PORT]
//
// The pieces: flags.cc (flags and their validation), engine.h with kvengine_engine.cc and
// rocksdb_engine.cc (the engines behind one interface) and peer_engine.cc (a peer reached
// through kvengine::Transport, behind the same interface), runner.cc (threads, timing,
// progress), benchmarks.cc and baselines.cc (the workloads), report.cc and histogram.cc
// (db_bench's output), suite.cc (one run from directories to cleanup), and for the trace
// benchmark trace.cc (the trace format), trace_generator.cc (synthetic traces),
// prefix_cache_model.cc (the ideal caches) and trace_replay.cc (the replay and its report).
#include <gflags/gflags.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "db_bench/engine.h"
#include "db_bench/flags.h"
#include "db_bench/rawucx.h"
#include "db_bench/stop_signals.h"
#include "db_bench/suite.h"

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "the db_bench-style benchmark of kvengine (and RocksDB).\n"
      "  kv_bench [--benchmarks=a,b,c] [--engine=kvengine|rocksdb|both] [flags]\n"
      "  kv_bench --benchmarks=rawsocket,peer_put,peer_get [--peer=HOST:PORT] [flags]\n"
      "Output: one db_bench line per benchmark,\n"
      "  fillrandom   :    4392.180 micros/op 227 ops/sec 8.784 seconds 2000 operations;  "
      "227.7 MB/s\n"
      "where seconds is the time spent in the timed calls (by the slowest thread).");
  // gflags' own --help lists every flag linked in, RocksDB's tools' hundreds included:
  // kv_bench's are the ones a user needs.
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-help") == 0) {
      gflags::ShowUsageWithFlagsRestrict(argv[0], "db_bench/");
      return 0;
    }
  }
  if (argc >= 2 && std::strcmp(argv[1], "--serve_attached") == 0) {
    return kvbench::ServeAttached(argc, argv);
  }
  if (argc >= 2 && std::strcmp(argv[1], "--rawucx_far_end") == 0) {
    return kvbench::RawUcxFarEnd(argc, argv);
  }
  // --attach alone (a string flag wants a value): kv_bench starts the owner itself.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> rewritten;
  for (auto& a : args) {
    if (a == "--attach" || a == "-attach") a = std::string("--attach=") + kvbench::kAttachOwnChild;
    rewritten.push_back(a.data());
  }
  rewritten.push_back(nullptr);
  argv = rewritten.data();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "kv_bench: unexpected argument '%s' (flags look like --name=value)\n",
                 argv[1]);
    return 1;
  }
  kvbench::BenchConfig config;
  std::string error;
  if (!kvbench::ValidateFlags(&config, &error)) {
    std::fprintf(stderr, "kv_bench: %s\nRun kv_bench --help for every flag.\n", error.c_str());
    return 1;
  }
  kvbench::BlockStopSignals();  // before the suite starts any thread
  kvbench::Suite suite(std::move(config));
  return suite.Run();
}
