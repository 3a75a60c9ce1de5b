// delete_regex: what one client's DeleteByRegex costs another client's BatchExists
// (issue #45 item 2; docs/benchmarks.md, "Patterns").
//
// A memory-only DB of its own (--memory, --options) holds --num keys of --value_size
// bytes.  A reader thread checks --batch_size random keys per BatchExists call, first
// alone for --duration seconds (at least 1), then while a second thread removes the odd
// keys (half of them) with one DeleteByRegex.  Reported: the reader's P50/P99/P99.9/max
// in both phases and their ratios, the calls that found every key they checked present
// or absent as expected, and how long the delete took and what it removed.  Before the
// change this measures, the memory tier matched a whole shard's keys under its lock.
#include <atomic>
#include <cinttypes>
#include <filesystem>
#include <random>
#include <thread>

#include "db_bench/benchmarks.h"
#include "db_bench/histogram.h"
#include "kvengine/db.h"

namespace kvbench {

namespace {

using Clock = std::chrono::steady_clock;

// Random BatchExists calls until `stop` (or `seconds` when stop is null) into *hist.
// Returns the calls whose answers were not 0/1, or not 1 for an even key.
uint64_t CheckKeys(kvengine::DB* db, const BenchContext& b, uint64_t seed,
                   const std::atomic<bool>* stop, double seconds, Histogram* hist) {
  const KeySpace space = b.Keys();
  const uint64_t batch = std::max<uint64_t>(1, b.config->batch_size);
  std::mt19937_64 rng(seed);
  std::vector<std::string> keys(batch);
  std::vector<kvengine::Slice> slices(batch);
  std::vector<uint64_t> ids(batch);
  std::vector<int64_t> results;
  uint64_t wrong = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (stop != nullptr ? !stop->load(std::memory_order_acquire) : Clock::now() < end) {
    for (uint64_t i = 0; i < batch; i++) {
      ids[i] = rng() % space.num();
      space.Format(ids[i], &keys[i]);
      slices[i] = kvengine::Slice(keys[i]);
    }
    const auto start = Clock::now();
    kvengine::Status s = db->BatchExists(slices, &results);
    hist->Add(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (!s.ok()) {
      wrong++;
      continue;
    }
    for (uint64_t i = 0; i < batch; i++) {
      if (results[i] != 1 && (results[i] != 0 || ids[i] % 2 == 0)) {
        wrong++;
        break;
      }
    }
  }
  return wrong;
}

std::string PhaseJson(const char* name, const Histogram& h) {
  return Printf("\"%s\":{\"calls\":%" PRIu64
                ",\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,"
                "\"max_us\":%.1f}",
                name, h.count(), h.Percentile(50), h.Percentile(99), h.Percentile(99.9), h.max());
}

std::string PhaseText(const char* name, const Histogram& h) {
  return Printf("  %-14s: %" PRIu64
                " BatchExists calls, P50 %.1f P99 %.1f P99.9 %.1f max %.1f "
                "micros\n",
                name, h.count(), h.Percentile(50), h.Percentile(99), h.Percentile(99.9), h.max());
}

}  // namespace

DeleteRegexOutcome RunDeleteRegex(const BenchContext& b) {
  DeleteRegexOutcome out;
  const BenchConfig& c = *b.config;
  const std::string dir = b.raw_dir + "/delete_regex";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  kvengine::Options options;
  options.ssd_capacity_bytes = 0;  // memory only, unless --options gives an SSD tier
  EngineConfig config;
  config.memory_budget = c.memory_budget;
  config.kvengine_options = c.kvengine_options;
  std::unique_ptr<kvengine::DB> db;
  kvengine::Status s = KvengineOptions(config, &options);
  if (s.ok()) s = kvengine::DB::Open(options, dir, &db);
  if (!s.ok()) {
    out.error = "open: " + s.ToString();
    return out;
  }
  const KeySpace space = b.Keys();
  std::string key;
  for (uint64_t k = 0; k < space.num() && s.ok(); k++) {
    space.Format(k, &key);
    s = db->Put(kvengine::WriteOptions(), key, b.pool->For(k));
  }
  if (!s.ok()) {
    out.error = "fill: " + s.ToString();
    return out;
  }
  const double seconds = std::max(1.0, c.duration);
  Histogram alone, beside;
  uint64_t wrong = CheckKeys(db.get(), b, c.seed + b.seed_salt, nullptr, seconds, &alone);

  std::atomic<bool> done{false};
  uint64_t removed = 0;
  double delete_seconds = 0;
  kvengine::Status deleted;
  std::thread deleter([&] {
    const auto start = Clock::now();
    deleted = db->DeleteByRegex("[0-9]*[13579]", &removed);
    delete_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    done.store(true, std::memory_order_release);
  });
  wrong += CheckKeys(db.get(), b, c.seed + b.seed_salt + 1, &done, 0, &beside);
  deleter.join();
  db.reset();
  std::filesystem::remove_all(dir, ec);
  if (!deleted.ok()) {
    out.error = "DeleteByRegex: " + deleted.ToString();
    return out;
  }
  const double p99_ratio = beside.Percentile(99) / std::max(alone.Percentile(99), 0.001);
  const double max_ratio = beside.max() / std::max(alone.max(), 0.001);
  out.p99_ratio = p99_ratio;
  out.text =
      Printf("delete_regex : DeleteByRegex of %" PRIu64 " of %" PRIu64
             " keys took %.3f s; another client's BatchExists of %" PRIu64
             " keys, beside it / alone: P99 %.2fx, max %.2fx; %" PRIu64 " calls answered wrong\n",
             removed, space.num(), delete_seconds, c.batch_size, p99_ratio, max_ratio, wrong) +
      PhaseText("alone", alone) + PhaseText("beside delete", beside);
  out.json =
      Printf("{\"benchmark\":\"delete_regex\",\"keys\":%" PRIu64 ",\"removed\":%" PRIu64
             ",\"delete_seconds\":%.3f,\"p99_ratio\":%.3f,\"max_ratio\":%.3f,\"wrong\":%" PRIu64
             ",",
             space.num(), removed, delete_seconds, p99_ratio, max_ratio, wrong) +
      PhaseJson("alone", alone) + "," + PhaseJson("beside", beside) + "}";
  out.wrong = wrong;
  return out;
}

}  // namespace kvbench
