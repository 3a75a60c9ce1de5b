// kv_bench: the db_bench-style benchmark of kvengine.
//
// Every run carries its own physical baseline (memcpy of the same bytes), so results are
// read as ratios against a figure measured on the same machine at the same time.
//
//   kv_bench --benchmarks=memcpy,batchput,batchget,batchexists --value_size=1048576
#include <gflags/gflags.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvengine/db.h"

DEFINE_string(benchmarks, "memcpy,batchput,batchget,batchexists",
              "Comma-separated list of benchmarks to run, in order: memcpy (baseline: copy the "
              "same bytes between two buffers), batchput (BatchPut of --batch_size values), "
              "batchget (BatchGetInto of the values batchput wrote), batchexists (BatchExists "
              "of --exists_keys present keys)");
DEFINE_uint64(value_size, 1 << 20, "Bytes per value");
DEFINE_uint64(batch_size, 16, "Keys per batch call");
DEFINE_uint64(num, 0, "Distinct keys written and read (0: as many as fill half the memory tier)");
DEFINE_uint64(key_size, 32, "Bytes per key (keys are zero-padded numbers)");
DEFINE_double(duration, 2.0, "Seconds each benchmark runs (at least one pass over --num keys)");
DEFINE_uint64(exists_keys, 1024, "Keys per BatchExists call in batchexists");
DEFINE_string(db, "", "DB directory (default: a fresh temporary directory, removed after)");
DEFINE_string(memory, "1GiB", "Memory tier capacity (memory_capacity_bytes)");
DEFINE_uint64(seed, 301, "Seed of the value generator");

namespace kvengine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Result {
  std::string name;
  uint64_t ops = 0;    // batch calls
  uint64_t bytes = 0;  // value bytes moved
  double seconds = 0;
};

void Report(const Result& r, double baseline_mbps, const char* baseline_name) {
  const double micros_per_op = r.ops ? r.seconds * 1e6 / static_cast<double>(r.ops) : 0;
  const double mbps = r.seconds > 0 ? static_cast<double>(r.bytes) / 1048576.0 / r.seconds : 0;
  std::printf("%-12s : %11.3f micros/op %lu ops/sec %.3f seconds %lu operations;", r.name.c_str(),
              micros_per_op, static_cast<unsigned long>(r.seconds > 0 ? r.ops / r.seconds : 0),
              r.seconds, static_cast<unsigned long>(r.ops));
  if (r.bytes > 0) std::printf(" %8.1f MB/s", mbps);
  if (r.bytes > 0 && baseline_mbps > 0) {
    std::printf(" (%.2fx %s)", mbps / baseline_mbps, baseline_name);
  }
  std::printf("\n");
  std::fflush(stdout);
}

std::string MakeKey(uint64_t i) {
  std::string digits = std::to_string(i);
  if (digits.size() >= FLAGS_key_size) return digits;
  return std::string(FLAGS_key_size - digits.size(), '0') + digits;
}

class Benchmark {
 public:
  Status Open() {
    if (FLAGS_db.empty()) {
      char tmpl[] = "/tmp/kv_bench.XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) return Status::IOError("mkdtemp failed");
      path_ = tmpl;
      remove_after_ = true;
    } else {
      path_ = FLAGS_db;
    }
    Options options;
    Status s = options.Set("memory_capacity_bytes", FLAGS_memory);
    if (!s.ok()) return s;
    s = DB::Open(options, path_, &db_);
    if (!s.ok()) return s;
    uint64_t capacity = options.memory_capacity_bytes;
    num_ = FLAGS_num != 0 ? FLAGS_num
                          : std::max<uint64_t>(FLAGS_batch_size, capacity / 2 / FLAGS_value_size);
    num_ = std::max<uint64_t>(num_ / FLAGS_batch_size, 1) * FLAGS_batch_size;
    for (uint64_t i = 0; i < num_; i++) keys_.push_back(MakeKey(i));
    // Sources: one buffer per slot of a batch, filled with non-trivial bytes and faulted in.
    std::mt19937_64 rng(FLAGS_seed);
    src_.resize(FLAGS_batch_size);
    for (auto& buf : src_) {
      buf.resize(FLAGS_value_size);
      for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
        uint64_t x = rng();
        std::memcpy(&buf[i], &x, 8);
      }
    }
    dst_.assign(FLAGS_batch_size, std::vector<char>(FLAGS_value_size, 1));
    std::printf("kvengine kv_bench: values %lu bytes, batch %lu, %lu keys (%.1f MiB), db %s\n",
                static_cast<unsigned long>(FLAGS_value_size),
                static_cast<unsigned long>(FLAGS_batch_size), static_cast<unsigned long>(num_),
                static_cast<double>(num_ * FLAGS_value_size) / 1048576.0, path_.c_str());
    return Status::OK();
  }

  ~Benchmark() {
    if (db_) db_->Close();
    if (remove_after_) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }

  // Runs `batch(first_key_index)` over the key space, in order, until --duration has
  // passed and every key was visited once.
  template <typename Fn>
  Result Loop(const std::string& name, uint64_t bytes_per_batch, Fn batch) {
    Result r;
    r.name = name;
    const auto start = Clock::now();
    uint64_t next = 0;
    while (true) {
      batch(next);
      r.ops++;
      r.bytes += bytes_per_batch;
      next += FLAGS_batch_size;
      if (next >= num_) {
        next = 0;
        if (Seconds(start) >= FLAGS_duration) break;
      }
    }
    r.seconds = Seconds(start);
    return r;
  }

  // The physical baselines: memcpy of the same bytes in the same pattern as the engine
  // moves them.  "memcpy" copies the batch's source buffers into a region as large as
  // the working set (what batchput does); "memcpy_read" copies from that region into the
  // batch's destination buffers (what batchget does).  Neither side gains from the cache
  // unless the engine does too.
  std::vector<Result> Memcpy() {
    const size_t region = num_ * FLAGS_value_size;
    char* big = static_cast<char*>(::mmap(nullptr, region, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
    if (big == MAP_FAILED) {
      std::fprintf(stderr, "memcpy: cannot map %zu bytes\n", region);
      return {};
    }
    const uint64_t batch_bytes = FLAGS_batch_size * FLAGS_value_size;
    std::vector<Result> results;
    results.push_back(Loop("memcpy", batch_bytes, [&](uint64_t first) {
      for (uint64_t j = 0; j < FLAGS_batch_size; j++) {
        std::memcpy(big + (first + j) * FLAGS_value_size, src_[j].data(), FLAGS_value_size);
      }
    }));
    results.push_back(Loop("memcpy_read", batch_bytes, [&](uint64_t first) {
      for (uint64_t j = 0; j < FLAGS_batch_size; j++) {
        std::memcpy(dst_[j].data(), big + (first + j) * FLAGS_value_size, FLAGS_value_size);
      }
    }));
    ::munmap(big, region);
    return results;
  }

  Result BatchPut() {
    std::vector<Slice> keys(FLAGS_batch_size);
    std::vector<ValueParts> values(FLAGS_batch_size);
    for (uint64_t j = 0; j < FLAGS_batch_size; j++)
      values[j] = {Slice(src_[j].data(), src_[j].size())};
    std::vector<int64_t> results;
    uint64_t failures = 0;
    Result r = Loop("batchput", FLAGS_batch_size * FLAGS_value_size, [&](uint64_t first) {
      for (uint64_t j = 0; j < FLAGS_batch_size; j++) keys[j] = keys_[first + j];
      Status s = db_->BatchPut(WriteOptions(), keys, values, &results);
      if (!s.ok()) failures += FLAGS_batch_size;
      for (int64_t x : results) failures += x != 0;
    });
    if (failures)
      std::fprintf(stderr, "batchput: %lu keys failed\n", static_cast<unsigned long>(failures));
    written_ = true;
    return r;
  }

  Result BatchGet() {
    if (!written_) BatchPut();
    std::vector<Slice> keys(FLAGS_batch_size);
    std::vector<Destination> dests(FLAGS_batch_size);
    for (uint64_t j = 0; j < FLAGS_batch_size; j++)
      dests[j] = {MutableSlice(dst_[j].data(), dst_[j].size())};
    std::vector<int64_t> results;
    uint64_t failures = 0;
    Result r = Loop("batchget", FLAGS_batch_size * FLAGS_value_size, [&](uint64_t first) {
      for (uint64_t j = 0; j < FLAGS_batch_size; j++) keys[j] = keys_[first + j];
      Status s = db_->BatchGetInto(ReadOptions(), keys, dests, &results);
      if (!s.ok()) failures += FLAGS_batch_size;
      for (int64_t x : results) failures += x != static_cast<int64_t>(FLAGS_value_size);
    });
    // The bytes must come back exactly.
    for (uint64_t j = 0; j < FLAGS_batch_size; j++) {
      if (std::memcmp(dst_[j].data(), src_[j].data(), FLAGS_value_size) != 0) failures++;
    }
    if (failures)
      std::fprintf(stderr, "batchget: %lu keys failed or differed\n",
                   static_cast<unsigned long>(failures));
    return r;
  }

  Result BatchExists() {
    if (!written_) BatchPut();
    std::vector<Slice> keys;
    for (uint64_t i = 0; i < FLAGS_exists_keys; i++) keys.emplace_back(keys_[i % num_]);
    std::vector<int64_t> results;
    Result r;
    r.name = "batchexists";
    const auto start = Clock::now();
    uint64_t absent = 0;
    while (Seconds(start) < FLAGS_duration) {
      db_->BatchExists(keys, &results);
      for (int64_t x : results) absent += x != 1;
      r.ops++;
    }
    r.seconds = Seconds(start);
    if (absent)
      std::fprintf(stderr, "batchexists: %lu lookups missed\n", static_cast<unsigned long>(absent));
    return r;
  }

  int Run() {
    // Each benchmark yields one or more results; `baseline` names the memcpy pattern
    // its throughput is compared with.
    struct Entry {
      std::function<std::vector<Result>()> run;
      const char* baseline;
    };
    auto one = [](auto fn) { return [fn] { return std::vector<Result>{fn()}; }; };
    std::map<std::string, Entry> table = {
        {"memcpy", {[this] { return Memcpy(); }, ""}},
        {"batchput", {one([this] { return BatchPut(); }), "memcpy"}},
        {"batchget", {one([this] { return BatchGet(); }), "memcpy_read"}},
        {"batchexists", {one([this] { return BatchExists(); }), ""}},
    };
    std::vector<std::string> names;
    std::stringstream list(FLAGS_benchmarks);
    for (std::string name; std::getline(list, name, ',');) {
      if (name.empty()) continue;
      if (table.count(name) == 0) {
        std::fprintf(stderr, "kv_bench: unknown benchmark '%s'\n", name.c_str());
        return 1;
      }
      names.push_back(name);
    }
    std::map<std::string, double> baseline_mbps;
    for (const auto& name : names) {
      const Entry& entry = table[name];
      for (const Result& r : entry.run()) {
        const double mbps =
            r.seconds > 0 ? static_cast<double>(r.bytes) / 1048576.0 / r.seconds : 0;
        if (name == "memcpy") baseline_mbps[r.name] = mbps;
        Report(r, baseline_mbps.count(entry.baseline) ? baseline_mbps[entry.baseline] : 0,
               entry.baseline);
      }
    }
    return 0;
  }

 private:
  std::string path_;
  bool remove_after_ = false;
  std::unique_ptr<DB> db_;
  uint64_t num_ = 0;
  std::vector<std::string> keys_;
  std::vector<std::vector<char>> src_, dst_;
  bool written_ = false;
};

}  // namespace
}  // namespace kvengine

int main(int argc, char** argv) {
  gflags::SetUsageMessage("kv_bench --benchmarks=memcpy,batchput,batchget,batchexists [flags]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "kv_bench: unexpected argument '%s'\n", argv[1]);
    return 1;
  }
  if (FLAGS_value_size == 0 || FLAGS_batch_size == 0 || FLAGS_key_size == 0) {
    std::fprintf(stderr, "kv_bench: --value_size, --batch_size and --key_size must be positive\n");
    return 1;
  }
  kvengine::Benchmark bench;
  kvengine::Status s = bench.Open();
  if (!s.ok()) {
    std::fprintf(stderr, "kv_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return bench.Run();
}
