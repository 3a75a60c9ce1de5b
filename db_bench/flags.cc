#include "db_bench/flags.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <span>
#include <sstream>

#include "db_bench/engine.h"
#include "kvengine/options.h"
#include "kvengine/transport.h"
#include "util/config_parse.h"

DEFINE_string(benchmarks, "memcpy,rawwrite,rawread,vllm_write,vllm_exist,vllm_get,vllm_all",
              "Comma-separated benchmarks, run in order on one DB per engine.\n"
              "  fillseq      write --num keys in key order\n"
              "  fillrandom   write --num keys at random (with repeats)\n"
              "  overwrite    write --num random keys of an existing key space\n"
              "  readrandom   read random keys (verifies the bytes)\n"
              "  readseq      read every key in key order (Get per key: kvengine has no "
              "iterator, RocksDB does the same Gets)\n"
              "  readmissing  read keys that do not exist\n"
              "  deleterandom delete random keys\n"
              "  existrandom  BatchExists of --batch_size random keys per call\n"
              "  vllm_write   per request: one BatchPut of --num_layers keys from --num_layers "
              "separate buffers\n"
              "  vllm_exist   per request: one BatchExists of its --num_layers keys\n"
              "  vllm_get     per request: one BatchGetInto into --num_layers separate buffers, "
              "bytes verified\n"
              "  vllm_all     per request: BatchPut, BatchExists, BatchGetInto, verify\n"
              "  vllm_load    per request: a layer-wise load (DB::BatchGetIntoGroups, one group "
              "per layer: every layer's reads issued at once), bytes verified; reports the time "
              "to the first layer ready beside the whole load (against peer_get when this run "
              "measured it)\n"
              "  vllm_load_serial  vllm_load made one BatchGetInto per layer in turn (the "
              "connector's load before BatchGetIntoGroups)\n"
              "  gc_churn     random deletes, writes and reads at once (see --gc_*_fraction); "
              "reports foreground latency and the bytes the engine's GC reclaimed\n"
              "  compact      delete --compact_delete_fraction of the keys (untimed), then time "
              "the engine's GC run to completion; MB/s of bytes reclaimed, against rawwrite "
              "(kvengine's GC thread may reclaim during the deletes: "
              "--options=gc_interval_ms=0 times all of it)\n"
              "  reopen       close the DB and open it again on the same data; reports the close "
              "and open times (kvengine: its map checkpoint; RocksDB: its MANIFEST and WAL)\n"
              "  memcpy       baseline: memcpy of the same bytes (write pattern, then read "
              "pattern as memcpy_read; then memcpy_layers and memcpy_layers_read, the same "
              "from and into --num_layers distinct buffers, the shape of vllm_write and "
              "vllm_get; each of the four also runs alone by its name)\n"
              "  rawwrite     baseline: O_DIRECT sequential write of the same bytes to a file "
              "in the DB directory\n"
              "  rawread      baseline: O_DIRECT sequential read of that file\n"
              "  rawrandread  baseline: O_DIRECT random reads of that file, --batch_size in "
              "flight at once (readrandom's pattern without an engine)\n"
              "  rawexist     baseline: existrandom without an engine: per call --batch_size "
              "random keys of the key space, each hashed (XXH3) and found in a plain "
              "open-addressing table that holds the keys' bytes (compared); the cache and "
              "TLB misses any index pays at --num keys\n"
              "  rawlookup    baseline: readrandom without an engine: rawexist's lookups, then "
              "each value copied into the caller's buffer from an arena of --num values in "
              "the memory tier's kind of memory\n"
              "  peer_put     write the key space to the peer (--peer) in key order with "
              "Transport::BatchPut, --batch_size keys per call\n"
              "  peer_get     read random keys from the peer with Transport::BatchGet into "
              "per-thread buffers (verifies the bytes; writes the key space first, untimed, "
              "when this run has not)\n"
              "  rawsocket    baseline: plain loopback TCP in a peer get's shape (per call a "
              "small request for --batch_size random values, answered with their bytes from a "
              "region as large as the data set; one connection per thread), the yardstick of "
              "peer_put and peer_get\n"
              "  rawucx       baseline: UCX's own one-sided gets in a peer get's shape: per "
              "call --batch_size ucp_get_nbx of --value_size bytes in flight at once, from "
              "random slots of a region as large as the data set in a child process into "
              "mapped buffers, over whatever UCX_TLS allows; the yardstick of peer_get over "
              "--peer_transport=ucx (what ucx_perftest -t ucp_get measures)\n"
              "  rawucx_put   baseline: the same with ucp_put_nbx, flushed per call; the "
              "yardstick of peer_put over UCX\n"
              "  rawstream    baseline: one loopback TCP stream of --value_size chunks per "
              "thread (no requests, no round trips): the ceiling\n"
              "  trace        replay a request trace (--trace=FILE in Mooncake's JSON-lines "
              "format, or --trace_generate=KIND) the way a KV connector uses the engine: per "
              "request one BatchExists over its blocks, a load of the leading hits into a "
              "registered buffer, a save of the rest; reports prefix hit ratios per tier "
              "beside an ideal block-LRU and an infinite cache, bytes and bandwidth, load "
              "latency per request and the prefill the hits saved (--prefill_tokens_per_s); "
              "one thread, the whole trace, whatever --threads and --duration say; see "
              "docs/benchmarks.md\n"
              "  ns_hotcold   two tenants on one memory tier, or the SSD tier with "
              "--ns_hotcold_ssd (kvengine only; one thread): cold "
              "writes --ns_cold_keys values, then hot puts --num new keys while cold reads one "
              "of its keys at random every --ns_cold_read_every hot puts (putting it back "
              "after a miss, --ns_cold_refill); run three times on fresh in-process DBs of "
              "--memory (memory only unless --options gives an SSD tier): tenants told apart "
              "by a key prefix in the default namespace (plain recency), namespaces with fair "
              "shares, namespaces with memory quotas (--ns_cold_quota, --ns_hot_quota); "
              "reports cold's memory hit ratio, hot's put throughput, the per-namespace "
              "evictions, and the ratios shares/prefix and quotas/prefix\n"
              "  delete_regex one client's DeleteByRegex of half of --num keys beside another's "
              "BatchExists of --batch_size random keys (kvengine only; an in-process DB of "
              "its own): the reader's P50/P99/P99.9/max beside the delete and alone for "
              "--duration seconds before it, and their ratios\n"
              "  load_plan    the load planner's own cost (kvengine::LoadPlanner::Plan, no "
              "engine, one thread): --num plans of 64-block requests of the trace "
              "benchmark's model shape (--model_layers, --trace_keys, --block_tokens); "
              "micros per plan, and ns per block in the note\n"
              "  cluster_failover  with --cluster and 2+ replicas: SIGKILL --failover_pid (the "
              "member --failover_member), then read every key it held; reports the time from "
              "the kill to the first successful read and each read's latency\n"
              "  cluster_join  with --cluster: run --join_command (start one more member), wait "
              "until the client routes over it, then read every key of --num (batches of "
              "--batch_size); reports the hit ratio after the join and the keys moved to "
              "their new owner\n"
              "Key-level benchmarks count one operation per key (a batch call of --batch_size "
              "keys when --batch_size > 1); vllm_* count one operation per request. The "
              "peer_* benchmarks print their per-call latency P50/P99 in the result line.");
DEFINE_string(engine, "kvengine",
              "kvengine, rocksdb, or both (each benchmark runs on kvengine then RocksDB, "
              "followed by the ratio kvengine/rocksdb)");
DEFINE_uint64(num, 0,
              "Keys in the key space, and operations per benchmark when --duration=0 "
              "(0: as many values as fill half of --memory). vLLM requests: num/num_layers");
DEFINE_uint64(value_size, 1 << 20, "Bytes per value (1 to 1 GiB)");
DEFINE_uint64(key_size, 16,
              "Bytes per key of the key-level benchmarks (zero-padded numbers; vLLM keys "
              "look like 'kvbench-model@tp0/layer.7/<hash>')");
DEFINE_uint64(batch_size, 1,
              "Keys per call in the key-level benchmarks: 1 uses Put/GetInto/Delete, more "
              "uses BatchPut/BatchGetInto/BatchDelete; existrandom always uses BatchExists");
DEFINE_uint64(threads, 1,
              "Threads running each benchmark at once; each has its own buffers and its own "
              "share of the keys (sequential benchmarks) or its own random stream");
DEFINE_double(duration, 0,
              "Seconds each benchmark runs, wrapping around the key space (0: run --num "
              "operations, split among the threads)");
DEFINE_string(db, "",
              "DB directory (default: a fresh temporary directory, removed after). With "
              "--engine=both the engines use DB/kvengine and DB/rocksdb. A directory left by "
              "an earlier run (it holds a LOCK file) is wiped first unless --use_existing_db");
DEFINE_bool(use_existing_db, false,
            "Open the DB in --db as it is (no wipe; reads assume it was filled)");
DEFINE_bool(histogram, false,
            "Print latency percentiles P50/P75/P90/P99/P99.9/P99.99 per operation (per call "
            "for batch calls, per request for vllm_*), db_bench style");
DEFINE_bool(statistics, false,
            "After each benchmark print the engine's statistics (kvengine: the "
            "kvengine.perf property when the engine has it, and kvengine.stats; RocksDB: its "
            "Statistics and rocksdb.stats)");
DEFINE_bool(json, false,
            "Print one JSON object per result line on stdout instead of text (the header, "
            "notes and progress go to stderr)");
DEFINE_uint64(seed, 301, "Seed of the key and value generators");
DEFINE_uint64(num_layers, 32, "Keys (layers) per vLLM request, each from its own buffer");
DEFINE_uint64(buffer_offset, 0,
              "Bytes past a page boundary where each vLLM layer buffer starts (vllm_* and "
              "memcpy_layers*): 16 is where numpy's np.empty puts its data; in [0, 4095]");
DEFINE_string(memory, "1GiB",
              "Memory budget per engine: kvengine's memory_capacity_bytes; RocksDB gets half "
              "as block+blob cache and half as memtables. Sizes as in kvengine options "
              "(4096, 64KiB, 2GiB)");
DEFINE_string(options, "",
              "kvengine options as name=value,name=value (any option of kvengine::Options::Set, "
              "e.g. memory_eviction=none); applied after --memory, so they win");
DEFINE_string(rocksdb_options, "",
              "RocksDB options string applied last (rocksdb::GetOptionsFromString syntax, "
              "e.g. 'max_background_jobs=4;blob_file_size=128m')");
DEFINE_uint64(rocksdb_min_blob_size, 4096, "RocksDB min_blob_size (values this large go to blobs)");
DEFINE_uint64(rocksdb_blob_file_size, 256ull << 20, "RocksDB blob_file_size");
DEFINE_bool(rocksdb_wal, false,
            "Keep RocksDB's WAL on without --sync (kvengine has no WAL, so it is off by "
            "default; --sync always turns it on, as RocksDB requires)");
DEFINE_bool(sync, false, "Sync every write (WriteOptions::sync on both engines)");
DEFINE_bool(verify, true,
            "Check the bytes of every value read (outside the timed calls); mismatches are "
            "errors and make kv_bench exit non-zero");
DEFINE_double(compact_delete_fraction, 0.5,
              "compact: fraction of the keys deleted before the timed garbage collection");
DEFINE_double(gc_delete_fraction, 0.2, "gc_churn: fraction of operations that delete");
DEFINE_double(gc_write_fraction, 0.3,
              "gc_churn: fraction of operations that write (the rest read)");
DEFINE_string(peer, "",
              "The peer that peer_put and peer_get run against, as HOST:PORT: a kv_server "
              "(kv_server --db=DIR --listen=HOST:PORT) or any DB opened with the listen "
              "option. Empty: kv_bench serves a fresh memory-only kvengine DB on 127.0.0.1 "
              "(any free port) in this process, in DB/peer, sized to hold the data set "
              "(--options apply to it)");
DEFINE_string(peer_transport, "tcp",
              "How peer_put and peer_get reach the peer: tcp, ucx (one-sided UCP gets; "
              "UCX_TLS picks shared memory or TCP), rdma (UCX over its RDMA transports "
              "alone), or auto (UCX when this build has it, else TCP). rawsocket is always "
              "loopback TCP");
DEFINE_string(rawucx_memory, "ucx",
              "Whose memory rawucx and rawucx_put reach in the far process: ucx (allocated by "
              "ucp_mem_map, as ucx_perftest's: UCX's shared-memory transports read and write "
              "it directly) or user (allocated by the process and mapped, as kvengine's arena "
              "is: UCX 1.13 emulates gets and puts of it with messages the far process "
              "answers, over shared memory as over TCP)");
DEFINE_bool(peer_register_values, true,
            "Register the value pool peer_put writes from with the transport, once, as "
            "vLLM's and SGLang's clients register their KV caches: over UCX a put then "
            "goes from it directly (ucx_direct_ops in --statistics); false sends it "
            "through UCX's bounce buffer (ucx_bounce_ops), a copy more, for comparison");
DEFINE_string(auth_token_file, "",
              "File holding the shared secret the peer requires (kv_server requires one when "
              "it listens on an address other than loopback; see docs/transport.md)");
DEFINE_string(attach, "",
              "Run the kvengine benchmarks from this process attached (DB::Attach, "
              "docs/attach.md) to a DB another process owns: --attach=SOCKET attaches to an "
              "owner serving SOCKET (kv_server --local_listen=SOCKET; its options are the "
              "DB's), --attach alone starts a child process that owns a fresh DB in the "
              "kvengine directory (with --memory and --options) and serves this one");
DEFINE_bool(compare_in_process, false,
            "With --attach: run every kvengine benchmark also on an in-process kvengine (its "
            "own DB, same --memory and --options) and print the ratio attached/kvengine per "
            "benchmark, both measured in this run");
DEFINE_bool(compare_removal_feed, false,
            "Run every kvengine benchmark on two in-process kvengine DBs (same --memory and "
            "--options), the second with a thread reading its removal feed "
            "(DB::ReadRemovals) every 10 ms -- recording on, as under the vLLM "
            "connector with KV events -- and print the ratio kvengine+feed/kvengine per "
            "benchmark, both measured in this run");
DEFINE_bool(compare_namespace, false,
            "Run every kvengine benchmark on two in-process kvengine DBs (same --memory and "
            "--options), the second used through the handle of a namespace "
            "(DB::CreateNamespace: every key carries its 9-byte prefix), and print the ratio "
            "kvengine+ns/kvengine per benchmark, both measured in this run");
DEFINE_bool(compare_arenas, false,
            "With --attach (its own owner child): run every kvengine benchmark on two "
            "attached DBs, each used through namespace 'bench', the first's values in the one "
            "shared arena, the second's in an arena of their own (namespace_arenas=bench=--memory, "
            "the owner's tier 16 MiB larger for the default arena: docs/attach.md, \"An arena "
            "per trust boundary\"), and print the ratio attached+arena/attached+ns per "
            "benchmark, both measured in this run");
DEFINE_uint64(repeat, 1,
              "Run the whole --benchmarks list this many times, one round after another, then "
              "print each figure's median over the rounds (ops/sec, the ratio to its baseline, "
              "and the ratio between engines): shared machines are noisy.  Even rounds run "
              "the engines in the opposite order, so an even count cancels any edge of going "
              "first; each ratio between engines is also given order-balanced: the median "
              "over pairs of rounds of each pair's geometric mean");
DEFINE_string(cluster, "",
              "Run the kvengine engine as a client of a cluster: "
              "etcd://HOST:PORT[,HOST:PORT...]/PREFIX (docs/cluster.md). Its DB serves no one "
              "and routes every key to the cluster's live members (peer_mode=sharded unless "
              "--options names another; cluster_replicas from --options)");
DEFINE_string(failover_member, "",
              "cluster_failover: the member (HOST:PORT) whose keys are read after its SIGKILL");
DEFINE_int64(failover_pid, 0, "cluster_failover: the process id of --failover_member");
DEFINE_string(join_command, "",
              "cluster_join: a shell command that starts one more member of the cluster and "
              "returns (scripts/cluster_bench.sh sets it when KV_JOIN=1)");
DEFINE_string(trace, "",
              "trace: the request trace (JSON lines: timestamp ms, input_length, output_length, "
              "hash_ids of --block_tokens-token blocks; Mooncake's published format). With "
              "--trace_generate, where the generated trace is written (default: in the DB "
              "directory)");
DEFINE_string(trace_generate, "",
              "trace: generate the trace instead of reading one: conversation (multi-turn "
              "chats over shared system prompts), agent (long shared tool prompts, many short "
              "turns) or synthetic (Zipf-chosen shared documents plus a question each); "
              "written to --trace, then replayed");
DEFINE_uint64(trace_requests, 1000, "trace_generate: requests in the trace");
DEFINE_uint64(trace_seed, 1, "trace_generate: seed (the same seed, the same trace)");
DEFINE_double(trace_rate, 4, "trace_generate: mean arrivals per second (Poisson)");
DEFINE_uint64(trace_prefixes, 8, "trace_generate: shared system prompts, tool sets or documents");
DEFINE_double(trace_zipf, 1.0,
              "trace_generate: Zipf exponent of the choice of a shared prefix and of the "
              "session a turn continues (0: uniform)");
DEFINE_double(trace_speed, 0,
              "trace: 0 replays as fast as possible (each request when the last is done), 1 at "
              "the trace's timestamps (real time), N N times faster");
DEFINE_uint64(trace_lookahead_us, 0,
              "trace: microseconds from a request's lookup (the scheduler's BatchExists) to "
              "its load (the worker's BatchGetInto); later requests' lookups run meanwhile");
DEFINE_bool(trace_prefetch, false,
            "trace: after each lookup, ask the engine to bring the request's hits up from SSD "
            "(kvengine's DB::Prefetch) ahead of the load --trace_lookahead_us later, as the "
            "vLLM connector's scheduler does; other engines ignore it");
DEFINE_uint64(trace_depth, 1,
              "trace: requests the scheduler may have looked up and not yet loaded (1: each "
              "request is looked up --trace_lookahead_us before its load, after the previous "
              "one's save; more: lookups of later arrivals run during that wait)");
DEFINE_string(trace_keys, "layer",
              "trace: layer (one key per block and layer, as the vLLM connector stores a "
              "block) or block (one key per block)");
DEFINE_string(trace_buffer, "256MiB",
              "trace: the registered buffer loads and saves go through (at least one block; "
              "a request with more blocks takes several calls)");
DEFINE_uint64(model_layers, 24,
              "trace: the model's layers (default: Qwen2.5-0.5B's shape, 24 layers, 2 KV "
              "heads of 64, bf16: 12 KiB of KV per token)");
DEFINE_uint64(kv_heads, 2, "trace: the model's key/value heads");
DEFINE_uint64(head_dim, 64, "trace: the model's head dimension");
DEFINE_uint64(dtype_bytes, 2, "trace: bytes per KV element (2: bf16/fp16, 1: fp8)");
DEFINE_uint64(block_tokens, 512,
              "trace: tokens per hash id (Mooncake's traces: 512); bytes per block = 2 * "
              "layers * kv_heads * head_dim * dtype_bytes * block_tokens");
DEFINE_double(prefill_tokens_per_s, 250000,
              "trace: the prefill rate the hits are priced at (default: Qwen2.5-0.5B on one "
              "H100 SXM, estimated as 25% of its 989 TFLOPS dense BF16 over 2 * 0.49e9 FLOPs "
              "per token; give your own measured rate)");
DEFINE_string(planner, "on",
              "trace: on -- the load planner (kvengine::LoadPlanner) decides how many of each "
              "request's hit blocks to load, so that loading them is no slower than computing "
              "them at --prefill_tokens_per_s (from where each key is, BatchLocate, and the "
              "tiers' speeds measured on the loads made); off -- every hit is loaded");
DEFINE_double(planner_ssd_bytes_per_s, 0,
              "trace: the SSD read bandwidth in bytes per second measured on this host, "
              "which the load planner trusts from its first plan (as measured: "
              "LoadPlanner::kTrustedLoads samples) and then follows to the SSD reads it "
              "measures -- as a deployment states its SSD's (load_planner_options: "
              "ssd_bytes_per_s with ssd_samples). 0: the planner's nominal 2e9, which it "
              "prices cautiously until SSD loads have measured it. Default: 0");
DEFINE_bool(trace_print_off_memory_loads, false,
            "trace: print to stderr one line per load that read a key off memory (SSD, a "
            "peer): its keys per tier, its measured time against its compute, and with the "
            "planner the plan's estimate of it and the SSD estimate it planned with (how "
            "many loads had measured it) -- to see which planned loads were slower than "
            "recompute, and why");
DEFINE_string(trace_dump_requests, "",
              "trace: write one tab-separated line per request to PREFIX.on.tsv (with the "
              "planner) or PREFIX.off.tsv (without): the blocks found, planned, re-checked "
              "and loaded, the keys read per tier, the load's and the re-check's time, its "
              "compute and what it saved -- to pair the two replays of --compare_planner "
              "request by request (scripts/compare_trace_dumps.py). Empty: none");
DEFINE_bool(trace_interleave, false,
            "trace, with --compare_planner: replay the trace on both DBs at once, one request "
            "(its lookup, load and save) of each in turn, so that both replays see the "
            "same moments of a noisy host; not with --trace_speed, --trace_lookahead_us or "
            "--trace_prefetch");
DEFINE_bool(compare_planner, false,
            "trace: replay on two in-process kvengine DBs (same --memory and --options), "
            "kvengine+planner_off with --planner=off and kvengine with the planner, and print "
            "one line comparing them: prefill saved, requests loaded slower than recompute, "
            "TTFT saved, bytes loaded");
DEFINE_uint64(ns_cold_keys, 0,
              "ns_hotcold: the cold tenant's working set, in values of --value_size (0: as "
              "many as fill a quarter of --memory). Default: 0");
DEFINE_uint64(ns_cold_read_every, 16,
              "ns_hotcold: hot puts per cold read (the cold tenant's read rate). Default: 16");
DEFINE_bool(ns_cold_refill, true,
            "ns_hotcold: a cold read that misses puts its value back, as a cache's client "
            "does after recomputing it. Default: true");
DEFINE_string(ns_cold_quota, "",
              "ns_hotcold: the cold namespace's memory quota in its quotas run (a size such as "
              "64MiB; empty: half of --memory). Default: empty");
DEFINE_string(ns_hot_quota, "",
              "ns_hotcold: the hot namespace's memory quota in its quotas run (empty: --memory "
              "less the cold quota). Default: empty");
DEFINE_string(ns_hotcold_ssd, "",
              "ns_hotcold on the SSD tier: its capacity (a size such as 512MiB). The cold "
              "working set, the quotas (SSD quotas then: --ns_cold_quota, --ns_hot_quota) and "
              "the fair shares are of the SSD tier, which takes the memory tier's evictions "
              "(write_back); keep --memory small, so that the SSD tier serves cold's reads: "
              "the cold hit ratio then counts the reads found in any tier. Empty: the memory "
              "tier alone. Default: empty");
DEFINE_double(progress_interval, 5,
              "Seconds between progress lines on stderr during a benchmark (0: none)");

namespace kvbench {

const std::vector<std::string>& KnownBenchmarks() {
  static const std::vector<std::string> names = {
      "fillseq",          "fillrandom",   "overwrite",    "readrandom",       "readseq",
      "readmissing",      "deleterandom", "existrandom",  "vllm_write",       "vllm_exist",
      "vllm_get",         "vllm_all",     "gc_churn",     "compact",          "peer_put",
      "peer_get",         "memcpy",       "memcpy_read",  "memcpy_layers",    "memcpy_layers_read",
      "rawwrite",         "rawread",      "rawrandread",  "rawsocket",        "rawstream",
      "rawexist",         "rawlookup",    "reopen",       "cluster_failover", "trace",
      "ns_hotcold",       "delete_regex", "cluster_join", "load_plan",        "vllm_load",
      "vllm_load_serial", "rawucx",       "rawucx_put"};
  return names;
}

bool IsBaseline(const std::string& name) {
  return name == "memcpy" || name == "memcpy_read" || name == "memcpy_layers" ||
         name == "memcpy_layers_read" || name == "rawwrite" || name == "rawread" ||
         name == "rawrandread" || name == "rawsocket" || name == "rawstream" ||
         name == "rawexist" || name == "rawlookup" || name == "rawucx" || name == "rawucx_put";
}

bool IsPeerBenchmark(const std::string& name) { return name == "peer_put" || name == "peer_get"; }

bool ParseOptionList(const std::string& text, std::vector<std::pair<std::string, std::string>>* out,
                     std::string* error) {
  std::vector<std::string> pieces;
  std::stringstream in(text);
  for (std::string piece; std::getline(in, piece, ',');) {
    if (!pieces.empty() && piece.find('=') == std::string::npos) {
      pieces.back() += "," + piece;  // part of the previous value
    } else {
      pieces.push_back(piece);
    }
  }
  for (const auto& p : pieces) {
    const size_t eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      *error = "'" + p + "' is not name=value";
      return false;
    }
    out->emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  return true;
}

namespace {

template <typename T>
std::string Str(T v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool Fail(std::string* error, const std::string& flag, const std::string& value,
          const std::string& why) {
  *error = "--" + flag + "=" + value + ": " + why;
  return false;
}

// What the rules read beside the flags: what ValidateFlags has resolved before them.
struct Resolved {
  BenchConfig* config = nullptr;  // the benchmarks, the key space (num, requests)
  kvengine::Options kvengine;     // --memory and --options, as kvengine reads them
};

// A rule's message: fixed text, or text that names what ValidateFlags resolved.
class RuleMessage {
 public:
  RuleMessage(const char* text) : text_(text) {}  // NOLINT(google-explicit-constructor)
  template <typename Explain>
  RuleMessage(Explain explain) : explain_(explain) {}  // NOLINT(google-explicit-constructor)

  std::string For(const Resolved& r) const { return explain_ != nullptr ? explain_(r) : text_; }

 private:
  const char* text_ = "";
  std::string (*explain_)(const Resolved&) = nullptr;
};

// One check of one flag: when `holds` is false, ValidateFlags fails with
// "--<flag>=<value>: <message>".
struct FlagRule {
  const char* flag;  // its name, as DEFINE_* gave it
  bool (*holds)(const Resolved&);
  RuleMessage message;
};

// A flag's value as the messages show it: gflags' text, but a double as a stream prints
// it (0.6, not gflags' 0.59999999999999998).
std::string ShownValue(const char* flag) {
  gflags::CommandLineFlagInfo info;
  if (!gflags::GetCommandLineFlagInfo(flag, &info)) return "?";  // a rule naming no flag
  if (info.type == "double") return Str(std::strtod(info.current_value.c_str(), nullptr));
  return info.current_value;
}

template <typename T>
bool InRange(T v, T lo, T hi) {
  return v >= lo && v <= hi;  // false for NaN
}

bool Fraction(double v) { return InRange(v, 0.0, 1.0); }

bool HasBenchmarkPrefix(const BenchConfig& c, const char* prefix) {
  return std::any_of(c.benchmarks.begin(), c.benchmarks.end(),
                     [&](const std::string& b) { return b.rfind(prefix, 0) == 0; });
}

// Digits of the largest key number: the shortest --key_size that tells num keys apart.
uint64_t KeyDigits(uint64_t num) { return Str(num - 1).size(); }

// "" when --peer is empty or names a server; else what is wrong with it.
std::string PeerProblem() {
  if (FLAGS_peer.empty()) return "";
  kvengine::Endpoint ep;
  kvengine::Status s = kvengine::Endpoint::Parse(FLAGS_peer, &ep);
  if (!s.ok()) return s.ToString();
  return ep.port == 0 ? "port 0 names no server" : "";
}

// "" when --auth_token_file is empty or holds a token; else why it does not.
std::string AuthTokenProblem() {
  if (FLAGS_auth_token_file.empty()) return "";
  std::string token;
  kvengine::Status s = kvengine::ReadAuthTokenFile(FLAGS_auth_token_file, &token);
  return s.ok() ? "" : s.ToString();
}

// --trace_buffer in bytes; 0 when it does not parse.
uint64_t TraceBufferBytes() {
  uint64_t bytes = 0;
  return kvengine::ParseSize(FLAGS_trace_buffer, &bytes).ok() ? bytes : 0;
}

// Bytes of one key's value in the trace benchmark (a layer of a block, or a block).
uint64_t TraceKeyBytes() {
  const uint64_t per_layer =
      2 * FLAGS_kv_heads * FLAGS_head_dim * FLAGS_dtype_bytes * FLAGS_block_tokens;
  return FLAGS_trace_keys == "block" ? per_layer * FLAGS_model_layers : per_layer;
}

// The rules are checked table by table, row by row, in the order written: with several
// bad flags, the first row that fails names the one reported.

// Rules of the flags alone.
const FlagRule kFlagRules[] = {
    {"engine",
     [](const Resolved&) {
       return FLAGS_engine == "kvengine" || FLAGS_engine == "rocksdb" || FLAGS_engine == "both";
     },
     "must be kvengine, rocksdb or both"},
    {"engine", [](const Resolved&) { return FLAGS_engine == "kvengine" || HaveRocksDB(); },
     "this kv_bench was built without RocksDB (librocksdb-dev not found)"},
    {"value_size",
     [](const Resolved&) { return InRange<uint64_t>(FLAGS_value_size, 1, 1ull << 30); },
     "must be in [1, 1073741824]"},
    {"key_size", [](const Resolved&) { return InRange<uint64_t>(FLAGS_key_size, 1, 4096); },
     "must be in [1, 4096]"},
    {"batch_size", [](const Resolved&) { return InRange<uint64_t>(FLAGS_batch_size, 1, 65536); },
     "must be in [1, 65536]"},
    {"num_layers", [](const Resolved&) { return InRange<uint64_t>(FLAGS_num_layers, 1, 65536); },
     "must be in [1, 65536]"},
    {"buffer_offset", [](const Resolved&) { return FLAGS_buffer_offset <= 4095; },
     "must be in [0, 4095]"},
    {"threads", [](const Resolved&) { return InRange<uint64_t>(FLAGS_threads, 1, 1024); },
     "must be in [1, 1024]"},
    {"duration", [](const Resolved&) { return InRange(FLAGS_duration, 0.0, 86400.0 * 7); },
     "must be in [0, 604800] seconds"},
    {"progress_interval", [](const Resolved&) { return FLAGS_progress_interval >= 0; },
     "must be >= 0"},
    {"rocksdb_min_blob_size",
     [](const Resolved&) { return FLAGS_rocksdb_min_blob_size <= (1ull << 30); },
     "must be at most 1 GiB"},
    {"rocksdb_blob_file_size",
     [](const Resolved&) { return FLAGS_rocksdb_blob_file_size >= (1ull << 20); },
     "must be at least 1 MiB"},
    {"gc_delete_fraction", [](const Resolved&) { return Fraction(FLAGS_gc_delete_fraction); },
     "must be in [0, 1]"},
    {"gc_write_fraction", [](const Resolved&) { return Fraction(FLAGS_gc_write_fraction); },
     "must be in [0, 1]"},
    {"compact_delete_fraction",
     [](const Resolved&) { return Fraction(FLAGS_compact_delete_fraction); }, "must be in [0, 1]"},
    {"gc_write_fraction",
     [](const Resolved&) { return FLAGS_gc_delete_fraction + FLAGS_gc_write_fraction <= 1; },
     "--gc_delete_fraction + --gc_write_fraction must be at most 1"},
};

// Rules of the trace benchmark's flags (checked only when it runs).
const FlagRule kTraceRules[] = {
    {"trace_generate",
     [](const Resolved&) {
       TraceKind kind;
       return FLAGS_trace_generate.empty() || ParseTraceKind(FLAGS_trace_generate, &kind).ok();
     },
     "must be conversation, agent or synthetic"},
    {"trace", [](const Resolved&) { return !FLAGS_trace.empty() || !FLAGS_trace_generate.empty(); },
     "the trace benchmark needs --trace=FILE or --trace_generate=conversation|agent|synthetic"},
    {"trace_requests",
     [](const Resolved&) { return InRange<uint64_t>(FLAGS_trace_requests, 1, 10'000'000); },
     "must be in [1, 10000000]"},
    {"trace_rate", [](const Resolved&) { return InRange(FLAGS_trace_rate, 1e-6, 1e6); },
     "must be in [0.000001, 1000000] requests per second"},
    {"trace_prefixes",
     [](const Resolved&) { return InRange<uint64_t>(FLAGS_trace_prefixes, 1, 1'000'000); },
     "must be in [1, 1000000]"},
    {"trace_zipf", [](const Resolved&) { return InRange(FLAGS_trace_zipf, 0.0, 10.0); },
     "must be in [0, 10]"},
    {"trace_speed", [](const Resolved&) { return InRange(FLAGS_trace_speed, 0.0, 1e6); },
     "must be 0 (as fast as possible) or a speed-up in (0, 1000000]"},
    {"trace_lookahead_us", [](const Resolved&) { return FLAGS_trace_lookahead_us <= 60'000'000; },
     "must be at most 60000000 (a minute)"},
    {"trace_depth",
     [](const Resolved&) { return InRange<uint64_t>(FLAGS_trace_depth, 1, 1 << 20); },
     "must be in [1, 1048576]"},
    {"trace_keys",
     [](const Resolved&) { return FLAGS_trace_keys == "layer" || FLAGS_trace_keys == "block"; },
     "must be layer or block"},
    {"trace_buffer", [](const Resolved&) { return TraceBufferBytes() > 0; },
     "must be a size such as 256MiB, at least 1 byte"},
    {"model_layers", [](const Resolved&) { return InRange<uint64_t>(FLAGS_model_layers, 1, 4096); },
     "must be in [1, 4096]"},
    {"kv_heads", [](const Resolved&) { return InRange<uint64_t>(FLAGS_kv_heads, 1, 4096); },
     "must be in [1, 4096]"},
    {"head_dim", [](const Resolved&) { return InRange<uint64_t>(FLAGS_head_dim, 1, 65536); },
     "must be in [1, 65536]"},
    {"dtype_bytes", [](const Resolved&) { return InRange<uint64_t>(FLAGS_dtype_bytes, 1, 8); },
     "must be in [1, 8]"},
    {"block_tokens",
     [](const Resolved&) { return InRange<uint64_t>(FLAGS_block_tokens, 1, 1u << 20); },
     "must be in [1, 1048576]"},
    {"prefill_tokens_per_s",
     [](const Resolved&) { return InRange(FLAGS_prefill_tokens_per_s, 1.0, 1e9); },
     "must be in [1, 1e9] tokens per second"},
    {"planner", [](const Resolved&) { return FLAGS_planner == "on" || FLAGS_planner == "off"; },
     "must be on or off"},
    {"planner_ssd_bytes_per_s",
     [](const Resolved&) {
       return FLAGS_planner_ssd_bytes_per_s == 0 ||
              InRange(FLAGS_planner_ssd_bytes_per_s, 1e3, 1e13);
     },
     "must be 0 (the planner's default) or in [1e3, 1e13] bytes per second"},
    {"model_layers", [](const Resolved& r) { return TraceKeyBytes() <= r.kvengine.max_value_size; },
     [](const Resolved& r) {
       return "a key of the trace would hold " + Str(TraceKeyBytes()) +
              " bytes, more than kvengine's max_value_size " + Str(r.kvengine.max_value_size);
     }},
};

// --ns_cold_quota or --ns_hot_quota in bytes: 0 when empty, UINT64_MAX when it does not
// parse or is 0.
uint64_t QuotaBytes(const std::string& text) {
  if (text.empty()) return 0;
  uint64_t bytes = 0;
  return kvengine::ParseSize(text, &bytes).ok() && bytes > 0 ? bytes : UINT64_MAX;
}

// --ns_hotcold_ssd in bytes: 0 when empty, UINT64_MAX when it does not parse or is 0.
uint64_t NsSsdBytes() { return QuotaBytes(FLAGS_ns_hotcold_ssd); }

// The tier ns_hotcold's tenants share: --ns_hotcold_ssd's SSD tier, or --memory.
uint64_t NsTier(const Resolved& r) {
  const uint64_t ssd = NsSsdBytes();
  return ssd != 0 && ssd != UINT64_MAX ? ssd : r.config->memory_budget;
}

// The cold tenant's working set in values (--ns_cold_keys, or a quarter of the tier).
uint64_t ColdKeys(const Resolved& r) {
  return FLAGS_ns_cold_keys > 0 ? FLAGS_ns_cold_keys
                                : std::max<uint64_t>(NsTier(r) / 4 / FLAGS_value_size, 1);
}

// Rules of ns_hotcold's flags (checked only when it runs, once --num is resolved).
const FlagRule kNsHotColdRules[] = {
    {"ns_cold_read_every",
     [](const Resolved&) { return InRange<uint64_t>(FLAGS_ns_cold_read_every, 1, 1'000'000'000); },
     "must be in [1, 1000000000]"},
    {"ns_cold_quota", [](const Resolved&) { return QuotaBytes(FLAGS_ns_cold_quota) != UINT64_MAX; },
     "must be a size such as 64MiB, at least 1 byte"},
    {"ns_hot_quota", [](const Resolved&) { return QuotaBytes(FLAGS_ns_hot_quota) != UINT64_MAX; },
     "must be a size such as 64MiB, at least 1 byte"},
    {"ns_hotcold_ssd", [](const Resolved&) { return NsSsdBytes() != UINT64_MAX; },
     "must be a size such as 512MiB, at least 1 byte"},
    {"ns_cold_quota", [](const Resolved& r) { return QuotaBytes(FLAGS_ns_cold_quota) < NsTier(r); },
     "must be less than the tier's size, --memory or --ns_hotcold_ssd (a quota the tier "
     "cannot fill limits nothing)"},
    {"ns_cold_keys", [](const Resolved& r) { return ColdKeys(r) * FLAGS_value_size <= NsTier(r); },
     [](const Resolved& r) {
       return "the cold working set (" + Str(ColdKeys(r)) + " values of " + Str(FLAGS_value_size) +
              " bytes) does not fit the tier (--memory, or --ns_hotcold_ssd)";
     }},
    {"key_size", [](const Resolved& r) { return KeyDigits(ColdKeys(r)) <= FLAGS_key_size; },
     [](const Resolved& r) {
       return "too short for the cold tenant's " + Str(ColdKeys(r)) + " keys (needs " +
              Str(KeyDigits(ColdKeys(r))) + ")";
     }},
};

// Rules against kvengine's limits, once its options are resolved.
const FlagRule kLimitRules[] = {
    {"value_size", [](const Resolved& r) { return FLAGS_value_size <= r.kvengine.max_value_size; },
     [](const Resolved& r) {
       return "larger than kvengine's max_value_size " + Str(r.kvengine.max_value_size);
     }},
    {"key_size", [](const Resolved& r) { return FLAGS_key_size <= r.kvengine.max_key_size; },
     [](const Resolved& r) {
       return "larger than kvengine's max_key_size " + Str(r.kvengine.max_key_size);
     }},
    {"batch_size",
     [](const Resolved& r) {
       return FLAGS_batch_size <= r.kvengine.max_batch_size &&
              FLAGS_num_layers <= r.kvengine.max_batch_size;
     },
     [](const Resolved& r) {
       return "--batch_size and --num_layers must be at most kvengine's max_batch_size " +
              Str(r.kvengine.max_batch_size);
     }},
};

// Rules against the key space, once --num is resolved.
const FlagRule kKeySpaceRules[] = {
    {"key_size", [](const Resolved& r) { return KeyDigits(r.config->num) <= FLAGS_key_size; },
     [](const Resolved& r) {
       return "too short for " + Str(r.config->num) + " distinct keys (needs " +
              Str(KeyDigits(r.config->num)) + ")";
     }},
    {"batch_size", [](const Resolved& r) { return FLAGS_batch_size <= r.config->num; },
     [](const Resolved& r) {
       return "larger than the key space (--num=" + Str(r.config->num) + ")";
     }},
    {"threads",
     [](const Resolved& r) {
       return !HasBenchmarkPrefix(*r.config, "vllm_") || FLAGS_threads <= r.config->requests;
     },
     [](const Resolved& r) {
       return "more threads than vLLM requests (" + Str(r.config->requests) +
              " = --num / --num_layers); raise --num or lower --threads";
     }},
    {"threads", [](const Resolved& r) { return FLAGS_threads <= r.config->num; },
     [](const Resolved& r) { return "more threads than keys (--num=" + Str(r.config->num) + ")"; }},
};

// Rules of the peer, the DB directory and the run's shape (the flags alone, checked last).
const FlagRule kSetupRules[] = {
    {"peer", [](const Resolved&) { return PeerProblem().empty(); },
     [](const Resolved&) { return PeerProblem(); }},
    {"peer_transport",
     [](const Resolved&) {
       return FLAGS_peer_transport == "tcp" || FLAGS_peer_transport == "rdma" ||
              FLAGS_peer_transport == "ucx" || FLAGS_peer_transport == "auto";
     },
     "must be tcp, ucx, rdma or auto"},
    {"rawucx_memory",
     [](const Resolved&) { return FLAGS_rawucx_memory == "ucx" || FLAGS_rawucx_memory == "user"; },
     "must be ucx or user"},
    {"auth_token_file", [](const Resolved&) { return AuthTokenProblem().empty(); },
     [](const Resolved&) { return AuthTokenProblem(); }},
    {"use_existing_db", [](const Resolved&) { return !FLAGS_use_existing_db || !FLAGS_db.empty(); },
     "needs --db (the default DB is a fresh one)"},
    {"attach", [](const Resolved&) { return FLAGS_attach.empty() || FLAGS_engine == "kvengine"; },
     "only with --engine=kvengine"},
    {"compare_in_process",
     [](const Resolved&) { return !FLAGS_compare_in_process || !FLAGS_attach.empty(); },
     "only with --attach"},
    {"compare_namespace",
     [](const Resolved&) {
       return !FLAGS_compare_namespace ||
              (FLAGS_attach.empty() && !FLAGS_compare_removal_feed && FLAGS_engine == "kvengine");
     },
     "only with --engine=kvengine, and not with --attach or --compare_removal_feed"},
    {"compare_arenas",
     [](const Resolved&) {
       return !FLAGS_compare_arenas || (FLAGS_attach == kAttachOwnChild &&
                                        !FLAGS_compare_in_process && !FLAGS_compare_namespace);
     },
     "only with --attach alone (an owner child kv_bench starts), and not with "
     "--compare_in_process or --compare_namespace"},
    {"trace_interleave",
     [](const Resolved&) {
       return !FLAGS_trace_interleave || (FLAGS_compare_planner && FLAGS_trace_speed == 0 &&
                                          FLAGS_trace_lookahead_us == 0 && !FLAGS_trace_prefetch);
     },
     "only with --compare_planner, and not with --trace_speed, --trace_lookahead_us or "
     "--trace_prefetch"},
    {"compare_planner",
     [](const Resolved&) {
       return !FLAGS_compare_planner ||
              (FLAGS_attach.empty() && !FLAGS_compare_removal_feed && !FLAGS_compare_namespace &&
               FLAGS_engine == "kvengine" && FLAGS_planner == "on");
     },
     "only with --engine=kvengine and --planner=on, and not with --attach, "
     "--compare_removal_feed or --compare_namespace"},
    {"repeat", [](const Resolved&) { return InRange<uint64_t>(FLAGS_repeat, 1, 1000); },
     "must be in [1, 1000]"},
};

bool CheckRules(std::span<const FlagRule> rules, const Resolved& r, std::string* error) {
  for (const FlagRule& rule : rules) {
    if (!rule.holds(r)) return Fail(error, rule.flag, ShownValue(rule.flag), rule.message.For(r));
  }
  return true;
}

// --benchmarks into config->benchmarks: every name known, at least one.
bool ResolveBenchmarks(BenchConfig* c, std::string* error) {
  const auto& known = KnownBenchmarks();
  std::stringstream list(FLAGS_benchmarks);
  for (std::string name; std::getline(list, name, ',');) {
    if (name.empty()) continue;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string all;
      for (const auto& k : known) all += (all.empty() ? "" : ",") + k;
      return Fail(error, "benchmarks", FLAGS_benchmarks,
                  "unknown benchmark '" + name + "' (known: " + all + ")");
    }
    c->benchmarks.push_back(name);
  }
  if (c->benchmarks.empty()) return Fail(error, "benchmarks", FLAGS_benchmarks, "no benchmark");
  return true;
}

// --memory, --cluster and --options, checked by kvengine itself, into r->kvengine,
// config->kvengine_options and config->memory_budget.
bool ResolveKvengineOptions(Resolved* r, std::string* error) {
  BenchConfig* c = r->config;
  kvengine::Status s = r->kvengine.Set("memory_capacity_bytes", FLAGS_memory);
  if (!s.ok()) return Fail(error, "memory", FLAGS_memory, s.ToString());
  if (!FLAGS_options.empty()) {
    std::string why;
    if (!ParseOptionList(FLAGS_options, &c->kvengine_options, &why)) {
      return Fail(error, "options", FLAGS_options, why);
    }
  }
  if (!FLAGS_cluster.empty()) {
    // First, so that --options can still choose another peer mode.
    c->kvengine_options.insert(c->kvengine_options.begin(),
                               {{"cluster", FLAGS_cluster}, {"peer_mode", "sharded"}});
  }
  for (const auto& [name, value] : c->kvengine_options) {
    s = r->kvengine.Set(name, value);
    if (!s.ok()) return Fail(error, "options", FLAGS_options, s.ToString());
  }
  s = r->kvengine.Validate();
  if (!s.ok()) return Fail(error, "options", FLAGS_options, s.ToString());
  c->memory_budget = r->kvengine.memory_capacity_bytes;
  return true;
}

// config->num (--num, or as many values as fill half the memory budget) and the vLLM
// requests it makes.
void ResolveKeySpace(BenchConfig* c) {
  c->num = FLAGS_num;
  if (c->num == 0) {
    c->num = std::max<uint64_t>({c->memory_budget / 2 / FLAGS_value_size, FLAGS_num_layers,
                                 FLAGS_batch_size, FLAGS_threads});
  }
  c->requests = std::max<uint64_t>(c->num / FLAGS_num_layers, 1);
}

// The checked flags that BenchConfig carries as they are, and the engines they run.
void CopyCheckedFlags(BenchConfig* c) {
  if (FLAGS_engine == "both") {
    c->engines = {"kvengine", "rocksdb"};
  } else {
    c->engines = {FLAGS_engine};
  }
  c->value_size = FLAGS_value_size;
  c->key_size = FLAGS_key_size;
  c->batch_size = FLAGS_batch_size;
  c->threads = FLAGS_threads;
  c->duration = FLAGS_duration;
  c->db = FLAGS_db;
  c->use_existing_db = FLAGS_use_existing_db;
  c->histogram = FLAGS_histogram;
  c->statistics = FLAGS_statistics;
  c->json = FLAGS_json;
  c->verify = FLAGS_verify;
  c->sync = FLAGS_sync;
  c->seed = FLAGS_seed;
  c->num_layers = FLAGS_num_layers;
  c->buffer_offset = FLAGS_buffer_offset;
  c->rocksdb_options = FLAGS_rocksdb_options;
  c->rocksdb_min_blob_size = FLAGS_rocksdb_min_blob_size;
  c->rocksdb_blob_file_size = FLAGS_rocksdb_blob_file_size;
  c->rocksdb_wal = FLAGS_rocksdb_wal;
  c->gc_delete_fraction = FLAGS_gc_delete_fraction;
  c->compact_delete_fraction = FLAGS_compact_delete_fraction;
  c->gc_write_fraction = FLAGS_gc_write_fraction;
  c->progress_interval = FLAGS_progress_interval;
  c->peer = FLAGS_peer;
  c->failover_member = FLAGS_failover_member;
  c->failover_pid = FLAGS_failover_pid;
  c->join_command = FLAGS_join_command;
  c->peer_transport = FLAGS_peer_transport;
  c->rawucx_memory = FLAGS_rawucx_memory;
  c->peer_register_values = FLAGS_peer_register_values;
  c->attach = FLAGS_attach;
  c->compare_in_process = FLAGS_compare_in_process;
  if (c->compare_in_process) c->engines = {"kvengine", "attached"};
  c->compare_removal_feed = FLAGS_compare_removal_feed;
  if (c->compare_removal_feed) c->engines = {"kvengine", "kvengine+feed"};
  c->compare_namespace = FLAGS_compare_namespace;
  if (c->compare_namespace) c->engines = {"kvengine", "kvengine+ns"};
  c->compare_arenas = FLAGS_compare_arenas;
  if (c->compare_arenas) c->engines = {"attached+ns", "attached+arena"};
  c->compare_planner = FLAGS_compare_planner;
  if (c->compare_planner) c->engines = {"kvengine", "kvengine+planner_off"};
  c->repeat = FLAGS_repeat;
  c->auth_token_file = FLAGS_auth_token_file;
  c->ns_cold_keys = FLAGS_ns_cold_keys;
  c->ns_cold_read_every = FLAGS_ns_cold_read_every;
  c->ns_cold_refill = FLAGS_ns_cold_refill;
  c->ns_cold_quota = QuotaBytes(FLAGS_ns_cold_quota);
  c->ns_hot_quota = QuotaBytes(FLAGS_ns_hot_quota);
  c->ns_ssd = NsSsdBytes() == UINT64_MAX ? 0 : NsSsdBytes();
}

// The trace benchmark's flags, checked, into config->trace.
void CopyTraceFlags(const Resolved& r, BenchConfig* c) {
  TraceConfig& t = c->trace;
  t.file = FLAGS_trace;
  t.generate = !FLAGS_trace_generate.empty();
  if (t.generate) ParseTraceKind(FLAGS_trace_generate, &t.generator.kind);
  t.generator.requests = FLAGS_trace_requests;
  t.generator.seed = FLAGS_trace_seed;
  t.generator.rate_per_s = FLAGS_trace_rate;
  t.generator.shared_prefixes = FLAGS_trace_prefixes;
  t.generator.zipf = FLAGS_trace_zipf;
  t.generator.block_tokens = FLAGS_block_tokens;
  t.model_layers = FLAGS_model_layers;
  t.kv_heads = FLAGS_kv_heads;
  t.head_dim = FLAGS_head_dim;
  t.dtype_bytes = FLAGS_dtype_bytes;
  t.block_tokens = FLAGS_block_tokens;
  t.key_per_layer = FLAGS_trace_keys == "layer";
  t.speed = FLAGS_trace_speed;
  t.lookahead_us = FLAGS_trace_lookahead_us;
  t.depth = FLAGS_trace_depth;
  t.prefetch = FLAGS_trace_prefetch;
  t.prefill_tokens_per_s = FLAGS_prefill_tokens_per_s;
  t.planner = FLAGS_planner == "on";
  t.planner_ssd_bytes_per_s = FLAGS_planner_ssd_bytes_per_s;
  t.print_off_memory_loads = FLAGS_trace_print_off_memory_loads;
  t.dump_requests = FLAGS_trace_dump_requests;
  t.interleave = FLAGS_trace_interleave;
  t.buffer_bytes = TraceBufferBytes();
  t.memory_capacity = r.kvengine.memory_capacity_bytes;
  t.ssd_capacity = r.kvengine.ssd_capacity_bytes;
}

}  // namespace

bool ValidateFlags(BenchConfig* c, std::string* error) {
  Resolved r;
  r.config = c;
  if (!ResolveBenchmarks(c, error) || !CheckRules(kFlagRules, r, error)) return false;
  if (!ResolveKvengineOptions(&r, error) || !CheckRules(kLimitRules, r, error)) return false;
  ResolveKeySpace(c);
  if (!CheckRules(kKeySpaceRules, r, error) || !CheckRules(kSetupRules, r, error)) return false;
  const bool trace =
      std::find(c->benchmarks.begin(), c->benchmarks.end(), "trace") != c->benchmarks.end();
  if (trace && !CheckRules(kTraceRules, r, error)) return false;
  const bool hotcold =
      std::find(c->benchmarks.begin(), c->benchmarks.end(), "ns_hotcold") != c->benchmarks.end();
  if (hotcold && !CheckRules(kNsHotColdRules, r, error)) return false;
  CopyCheckedFlags(c);
  CopyTraceFlags(r, c);
  return true;
}

}  // namespace kvbench
