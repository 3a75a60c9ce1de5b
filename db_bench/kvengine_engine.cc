// The kvengine adapter: a thin pass-through to kvengine::DB.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "db_bench/engine.h"
#include "kvengine/db.h"

namespace kvbench {
namespace {

class KvengineEngine : public Engine {
 public:
  ~KvengineEngine() override { Close(); }

  const char* Name() const override { return "kvengine"; }

  Status Open(const EngineConfig& config) override {
    kvengine::Options options;
    Status s = options.Set("memory_capacity_bytes", std::to_string(config.memory_budget));
    for (const auto& [name, value] : config.kvengine_options) {
      if (s.ok()) s = options.Set(name, value);
    }
    if (!s.ok()) return s;
    options.create_if_missing = !config.use_existing;
    write_options_.sync = config.sync;
    s = kvengine::DB::Open(options, config.path, &db_);
    if (!s.ok()) return s;
    notes_.push_back("kvengine: memory_capacity_bytes=" + std::to_string(config.memory_budget) +
                     (config.kvengine_options.empty() ? "" : " plus --options") +
                     (config.sync ? ", sync writes" : ""));
    return s;
  }

  Status Close() override {
    if (!db_) return Status::OK();
    Status s = db_->Close();
    db_.reset();
    return s;
  }

  Status Put(const Slice& key, const Slice& value) override {
    return db_->Put(write_options_, key, value);
  }
  Status GetInto(const Slice& key, MutableSlice buffer, size_t* size) override {
    return db_->GetInto(read_options_, key, buffer, size);
  }
  Status Delete(const Slice& key) override { return db_->Delete(write_options_, key); }

  Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                  std::vector<int64_t>* results) override {
    return db_->BatchPut(write_options_, keys, values, results);
  }
  Status BatchGetInto(std::span<const Slice> keys, std::span<const Destination> destinations,
                      std::vector<int64_t>* results) override {
    return db_->BatchGetInto(read_options_, keys, destinations, results);
  }
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return db_->BatchExists(keys, results);
  }
  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return db_->BatchDelete(write_options_, keys, results);
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

  std::string IndexMemoryReport() override {
    const uint64_t keys = StatValue("ssd.keys"), bytes = StatValue("ssd.index_bytes");
    char line[240];
    std::snprintf(
        line, sizeof(line),
        "ssd index: %" PRIu64 " bytes of RAM for %" PRIu64
        " keys on SSD (%.1f B/key); its last open took %.3f s, %" PRIu64
        " keys from the map checkpoint",
        bytes, keys, keys == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(keys),
        static_cast<double>(StatValue("ssd.open_micros")) / 1e6, StatValue("ssd.checkpoint_keys"));
    return line;
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
    const size_t at = text.find("\n" + name + ": ");
    if (at == std::string::npos) return 0;
    return std::strtoull(text.c_str() + at + name.size() + 3, nullptr, 10);
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
  std::unique_ptr<kvengine::DB> db_;
  kvengine::WriteOptions write_options_;
  kvengine::ReadOptions read_options_;
  std::vector<std::string> notes_;
};

}  // namespace

std::unique_ptr<Engine> NewKvengineEngine() { return std::make_unique<KvengineEngine>(); }

}  // namespace kvbench
