// The RocksDB adapter, configured fairly for large values:
//   * integrated BlobDB: values of min_blob_size bytes or more go to blob files of
//     blob_file_size bytes, with blob garbage collection on;
//   * no compression anywhere (memtable flushes, every level, blobs);
//   * the same memory budget as kvengine: half for a shared LRU cache that serves both
//     the block cache and the blob cache, half for the memtables (two of budget/4);
//   * the same sync policy: WriteOptions::sync follows --sync.  kvengine has no
//     write-ahead log, so RocksDB runs with the WAL off unless --sync (which needs it)
//     or --rocksdb_wal.
// The batch calls map to one WriteBatch (BatchPut, BatchDelete) and to one MultiGet
// (BatchGetInto, BatchExists).  RocksDB cannot read into the caller's buffers: MultiGet
// pins each value and the adapter copies it into the key's buffers, one memcpy per
// buffer -- a copy kvengine does not make.  RocksDB has no existence-only lookup either,
// so BatchExists is a MultiGet that reads the values and drops them.
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>

#include "db_bench/engine.h"

namespace kvbench {
namespace {

rocksdb::Slice ToRocks(const Slice& s) { return rocksdb::Slice(s.data(), s.size()); }

Status FromRocks(const rocksdb::Status& s) {
  if (s.ok()) return Status::OK();
  if (s.IsNotFound()) return Status::NotFound(s.ToString());
  if (s.IsInvalidArgument()) return Status::InvalidArgument(s.ToString());
  if (s.IsCorruption()) return Status::Corruption(s.ToString());
  if (s.IsBusy()) return Status::Busy(s.ToString());
  if (s.IsNotSupported()) return Status::NotSupported(s.ToString());
  if (s.IsNoSpace()) return Status::NoSpace(s.ToString());
  return Status::IOError(s.ToString());
}

// Copies `value` into the buffers of `dest`, in order; the bytes copied, or
// BufferTooSmall's code when they do not fit.
int64_t CopyOut(const rocksdb::Slice& value, const Destination& dest) {
  size_t room = 0;
  for (const auto& part : dest) room += part.size();
  if (room < value.size()) return Status::BufferTooSmall("").ErrorCode();
  size_t done = 0;
  for (const auto& part : dest) {
    if (done == value.size()) break;
    const size_t n = std::min(part.size(), value.size() - done);
    std::memcpy(part.data(), value.data() + done, n);
    done += n;
  }
  return static_cast<int64_t>(value.size());
}

class RocksDBEngine : public Engine {
 public:
  ~RocksDBEngine() override { Close(); }

  const char* Name() const override { return "rocksdb"; }

  Status Open(const EngineConfig& config) override {
    rocksdb::Options o;
    o.create_if_missing = !config.use_existing;
    o.compression = rocksdb::kNoCompression;
    o.bottommost_compression = rocksdb::kDisableCompressionOption;
    o.compression_per_level.clear();
    o.enable_blob_files = true;
    o.min_blob_size = config.rocksdb_min_blob_size;
    o.blob_file_size = config.rocksdb_blob_file_size;
    o.blob_compression_type = rocksdb::kNoCompression;
    o.enable_blob_garbage_collection = true;
    const uint64_t budget = std::max<uint64_t>(config.memory_budget, 4ull << 20);
    auto cache = rocksdb::NewLRUCache(budget / 2);
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = cache;
    o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    o.blob_cache = cache;
    o.write_buffer_size = budget / 4;
    o.max_write_buffer_number = 2;
    o.db_write_buffer_size = budget / 2;
    if (config.statistics) o.statistics = rocksdb::CreateDBStatistics();
    if (!config.rocksdb_options.empty()) {
      rocksdb::ConfigOptions parse;
      parse.ignore_unknown_options = false;
      rocksdb::Options tuned;
      rocksdb::Status s = rocksdb::GetOptionsFromString(parse, o, config.rocksdb_options, &tuned);
      if (!s.ok()) return Status::InvalidArgument("--rocksdb_options", s.ToString());
      o = tuned;
    }
    write_options_.sync = config.sync;
    write_options_.disableWAL = !config.sync && !config.rocksdb_wal;
    statistics_ = o.statistics;
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(o, config.path, &db);
    if (!s.ok()) return FromRocks(s);
    db_.reset(db);
    notes_.push_back("rocksdb " + std::to_string(ROCKSDB_MAJOR) + "." +
                     std::to_string(ROCKSDB_MINOR) + "." + std::to_string(ROCKSDB_PATCH) +
                     ": BlobDB min_blob_size=" + std::to_string(o.min_blob_size) +
                     " blob_file_size=" + std::to_string(o.blob_file_size) +
                     ", no compression, cache=" + std::to_string(budget / 2) +
                     " (block+blob), write_buffer_size=" + std::to_string(o.write_buffer_size) +
                     " x" + std::to_string(o.max_write_buffer_number) +
                     (write_options_.disableWAL ? ", WAL off" : ", WAL on") +
                     (config.sync ? ", sync writes" : ""));
    notes_.push_back(
        "rocksdb: batch gets copy each value out of MultiGet into the caller's buffers "
        "(one memcpy per buffer); exists is a MultiGet");
    return Status::OK();
  }

  Status Close() override {
    if (!db_) return Status::OK();
    rocksdb::Status s = db_->Close();
    db_.reset();
    return FromRocks(s);
  }

  Status Put(const Slice& key, const Slice& value) override {
    return FromRocks(db_->Put(write_options_, ToRocks(key), ToRocks(value)));
  }

  Status GetInto(const Slice& key, MutableSlice buffer, size_t* size) override {
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(read_options_, db_->DefaultColumnFamily(), ToRocks(key), &value);
    if (!s.ok()) return FromRocks(s);
    *size = value.size();
    if (value.size() > buffer.size()) return Status::BufferTooSmall("value does not fit");
    std::memcpy(buffer.data(), value.data(), value.size());
    return Status::OK();
  }

  Status Delete(const Slice& key) override {
    return FromRocks(db_->Delete(write_options_, ToRocks(key)));
  }

  Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                  std::vector<int64_t>* results) override {
    results->clear();
    if (keys.size() != values.size()) return Status::InvalidArgument("keys and values differ");
    // One batch per thread, cleared and reused: Clear keeps its capacity, so a large
    // request does not allocate (and fault in) a fresh buffer of its whole size each time.
    thread_local rocksdb::WriteBatch batch;
    thread_local std::vector<rocksdb::Slice> parts;
    batch.Clear();
    for (size_t i = 0; i < keys.size(); i++) {
      rocksdb::Status s;
      if (values[i].size() == 1) {
        s = batch.Put(ToRocks(keys[i]), ToRocks(values[i][0]));
      } else {
        parts.clear();
        for (const auto& p : values[i]) parts.push_back(ToRocks(p));
        rocksdb::Slice key = ToRocks(keys[i]);
        s = batch.Put(rocksdb::SliceParts(&key, 1),
                      rocksdb::SliceParts(parts.data(), static_cast<int>(parts.size())));
      }
      if (!s.ok()) return FromRocks(s);
    }
    rocksdb::Status s = db_->Write(write_options_, &batch);
    if (!s.ok()) return FromRocks(s);
    batch.Clear();
    results->assign(keys.size(), 0);
    return Status::OK();
  }

  Status BatchGetInto(std::span<const Slice> keys, std::span<const Destination> destinations,
                      std::vector<int64_t>* results) override {
    results->clear();
    if (keys.size() != destinations.size()) {
      return Status::InvalidArgument("keys and destinations differ");
    }
    thread_local Scratch scratch;
    scratch.Get(db_.get(), read_options_, keys);
    results->resize(keys.size());
    for (size_t i = 0; i < keys.size(); i++) {
      const rocksdb::Status& s = scratch.statuses[i];
      (*results)[i] = s.ok() ? CopyOut(scratch.values[i], destinations[i])
                             : static_cast<int64_t>(FromRocks(s).ErrorCode());
    }
    scratch.Release();
    return Status::OK();
  }

  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    results->clear();
    thread_local Scratch scratch;
    scratch.Get(db_.get(), read_options_, keys);
    results->resize(keys.size());
    for (size_t i = 0; i < keys.size(); i++) {
      const rocksdb::Status& s = scratch.statuses[i];
      (*results)[i] = s.ok() ? 1 : s.IsNotFound() ? 0 : FromRocks(s).ErrorCode();
    }
    scratch.Release();
    return Status::OK();
  }

  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    results->clear();
    rocksdb::WriteBatch batch;
    for (const auto& k : keys) {
      rocksdb::Status s = batch.Delete(ToRocks(k));
      if (!s.ok()) return FromRocks(s);
    }
    rocksdb::Status s = db_->Write(write_options_, &batch);
    if (!s.ok()) return FromRocks(s);
    results->assign(keys.size(), 0);
    return Status::OK();
  }
  bool DeleteReportsAbsent() const override { return false; }

  Status Flush() override {
    rocksdb::FlushOptions f;
    f.wait = true;
    return FromRocks(db_->Flush(f));
  }

  // A full compaction with forced blob GC: every SST and every blob file with a live
  // value is rewritten, so what remains afterwards is what was rewritten.
  Status Compact(uint64_t* reclaimed, uint64_t* rewritten) override {
    const uint64_t before = FileBytes();
    rocksdb::CompactRangeOptions o;
    o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    o.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
    o.blob_garbage_collection_age_cutoff = 1.0;
    Status s = FromRocks(db_->CompactRange(o, nullptr, nullptr));
    const uint64_t after = FileBytes();
    *reclaimed = before > after ? before - after : 0;
    *rewritten = after;
    return s;
  }

  std::string StatisticsText() override {
    std::string out, value;
    if (statistics_) out += statistics_->ToString() + "\n";
    if (db_->GetProperty("rocksdb.stats", &value)) out += value;
    return out;
  }

  // RocksDB's blob GC relocates live blobs during compaction; it has no counter of the
  // bytes it frees.
  std::optional<uint64_t> ReclaimedBytes() override { return std::nullopt; }

  std::vector<std::string> Notes() const override { return notes_; }

 private:
  // Bytes of SST and blob files.
  uint64_t FileBytes() {
    uint64_t sst = 0, blob = 0;
    db_->GetIntProperty(rocksdb::DB::Properties::kTotalSstFilesSize, &sst);
    db_->GetIntProperty(rocksdb::DB::Properties::kTotalBlobFileSize, &blob);
    return sst + blob;
  }

  // Per-thread MultiGet arrays, reused from call to call.
  struct Scratch {
    std::vector<rocksdb::Slice> keys;
    std::vector<rocksdb::PinnableSlice> values;
    std::vector<rocksdb::Status> statuses;

    void Get(rocksdb::DB* db, const rocksdb::ReadOptions& options, std::span<const Slice> k) {
      keys.clear();
      for (const auto& key : k) keys.push_back(ToRocks(key));
      if (values.size() < keys.size()) values.resize(keys.size());
      statuses.assign(keys.size(), rocksdb::Status());
      db->MultiGet(options, db->DefaultColumnFamily(), keys.size(), keys.data(), values.data(),
                   statuses.data());
    }
    void Release() {
      for (auto& v : values) v.Reset();
    }
  };

  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_options_;
  rocksdb::ReadOptions read_options_;
  std::shared_ptr<rocksdb::Statistics> statistics_;
  std::vector<std::string> notes_;
};

}  // namespace

std::unique_ptr<Engine> NewRocksDBEngine() { return std::make_unique<RocksDBEngine>(); }
bool HaveRocksDB() { return true; }

}  // namespace kvbench
