// StackableDB: a DB that wraps another DB and forwards every call to it (RocksDB's
// StackableDB shape).
//
// A layer over a DB -- the cluster router over the local engine, the owner's layer that
// serves attached processes -- derives from it and overrides only the calls it changes;
// the rest reach the DB below unchanged.  A call on a layer goes down to the layers
// below it and never back up.
//
// Thread-safety: as the DB wrapped.
#ifndef KVENGINE_STACKABLE_DB_H_
#define KVENGINE_STACKABLE_DB_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvengine/db.h"

namespace kvengine {

class StackableDB : public DB {
 public:
  // Takes ownership of `base` (may be null until a subclass sets base_ itself, before
  // any call is made).
  explicit StackableDB(std::unique_ptr<DB> base) : base_(std::move(base)) {}

  // The DB below this one.
  DB* GetBaseDB() const { return base_.get(); }

  Status Close() override { return base_ != nullptr ? base_->Close() : Status::OK(); }
  Status Put(const WriteOptions& options, const Slice& key, const Slice& value) override {
    return base_->Put(options, key, value);
  }
  Status Get(const ReadOptions& options, const Slice& key, std::string* value) override {
    return base_->Get(options, key, value);
  }
  Status GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                 size_t* value_size) override {
    return base_->GetInto(options, key, buffer, value_size);
  }
  Status Delete(const WriteOptions& options, const Slice& key) override {
    return base_->Delete(options, key);
  }
  Status GetValueSize(const Slice& key, uint64_t* size) override {
    return base_->GetValueSize(key, size);
  }
  Status BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                  std::span<const ValueParts> values, std::vector<int64_t>* results) override {
    return base_->BatchPut(options, keys, values, results);
  }
  Status BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                      std::span<const Destination> destinations,
                      std::vector<int64_t>* results) override {
    return base_->BatchGetInto(options, keys, destinations, results);
  }
  Status BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                            std::vector<int64_t>* results) override {
    return base_->BatchGetIntoGroups(options, keys, destinations, group_ends, on_ready, results);
  }
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return base_->BatchExists(keys, results);
  }
  Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return base_->Prefetch(keys, results);
  }
  Status BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override {
    return base_->BatchDelete(options, keys, results);
  }
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override {
    return base_->DeleteByRegex(pattern, deleted);
  }
  Status DeleteAll(uint64_t* deleted) override { return base_->DeleteAll(deleted); }
  Status RegisterBuffer(void* addr, size_t length) override {
    return base_->RegisterBuffer(addr, length);
  }
  Status UnregisterBuffer(void* addr) override { return base_->UnregisterBuffer(addr); }
  Status Flush() override { return base_->Flush(); }
  Status CompactBuckets(uint64_t* reclaimed_bytes) override {
    return base_->CompactBuckets(reclaimed_bytes);
  }
  Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return base_->BatchLocate(keys, results);
  }
  Status ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) override {
    return base_->ReadRemovals(after, max_events, batch);
  }
  Status ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                      ResidentSnapshot* snapshot) override {
    return base_->ReadResident(prefix, max_batch, batch, snapshot);
  }
  Status CreateNamespace(const std::string& name, const NamespaceOptions& options,
                         std::unique_ptr<DB>* handle) override {
    return base_->CreateNamespace(name, options, handle);
  }
  Status OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) override {
    return base_->OpenNamespace(name, handle);
  }
  Status DropNamespace(const std::string& name, uint64_t* deleted) override {
    return base_->DropNamespace(name, deleted);
  }
  Status ListNamespaces(std::vector<NamespaceInfo>* namespaces) override {
    return base_->ListNamespaces(namespaces);
  }
  bool GetProperty(const std::string& name, std::string* value) override {
    return base_->GetProperty(name, value);
  }
  void ResetPerf() override { base_->ResetPerf(); }

 protected:
  std::unique_ptr<DB> base_;
};

}  // namespace kvengine

#endif  // KVENGINE_STACKABLE_DB_H_
