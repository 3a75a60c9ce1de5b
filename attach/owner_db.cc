#include "attach/owner_db.h"

#include <filesystem>

#include "attach/local_server.h"
#include "attach/local_socket_record.h"

namespace kvengine {

std::string OwnerDB::AbsoluteSocketPath(const std::string& path) {
  std::error_code ec;
  return std::filesystem::absolute(path, ec).string();
}

Status OwnerDB::Wrap(const Options& options, const std::string& path, SharedArena* arena,
                     Logger* logger, std::unique_ptr<DB>* db) {
  Env* env = options.env != nullptr ? options.env : Env::Default();
  std::unique_ptr<OwnerDB> owner(new OwnerDB(std::move(*db), env, path));
  // The server serves the OwnerDB itself, the top of the stack: a client's property
  // reports the local counters too, as the owner's own does.
  Status s =
      LocalServer::Start(options, owner.get(), arena, logger, &owner->counters_, &owner->server_);
  if (s.ok()) s = WriteLocalSocketRecord(env, path, options.local_listen);
  if (!s.ok()) {
    if (owner->server_ != nullptr) {
      owner->server_->Stop();
      owner->server_.reset();
      RemoveLocalSocketRecord(env, path);
    }
    *db = std::move(owner->served_);
    return s;
  }
  *db = std::move(owner);
  return Status::OK();
}

OwnerDB::OwnerDB(std::unique_ptr<DB> served, Env* env, std::string path)
    : served_(std::move(served)), env_(env), path_(std::move(path)) {}

OwnerDB::~OwnerDB() { Close(); }

Status OwnerDB::Close() {
  std::lock_guard<std::mutex> closing(close_mu_);
  // Attached clients go first: their sessions hold reservations and pins in the arena,
  // and call the DB served.
  if (server_ != nullptr) {
    server_->Stop();
    server_.reset();
    RemoveLocalSocketRecord(env_, path_);
  }
  return served_ != nullptr ? served_->Close() : Status::OK();
}

bool OwnerDB::GetProperty(const std::string& name, std::string* value) {
  if (!served_->GetProperty(name, value)) return false;
  if (name == "kvengine.stats") {
    counters_.AppendText(value);
  } else if (name == "kvengine.stats.json") {
    counters_.AddToJson(value);
  } else if (name == "kvengine.stats.prometheus" || name == "kvengine.prometheus") {
    counters_.AppendPrometheus(value);
  }
  return true;
}

// ---------------------------------------------------------------- forwarded unchanged

Status OwnerDB::Put(const WriteOptions& options, const Slice& key, const Slice& value) {
  return served_->Put(options, key, value);
}

Status OwnerDB::Get(const ReadOptions& options, const Slice& key, std::string* value) {
  return served_->Get(options, key, value);
}

Status OwnerDB::GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                        size_t* value_size) {
  return served_->GetInto(options, key, buffer, value_size);
}

Status OwnerDB::Delete(const WriteOptions& options, const Slice& key) {
  return served_->Delete(options, key);
}

Status OwnerDB::GetValueSize(const Slice& key, uint64_t* size) {
  return served_->GetValueSize(key, size);
}

Status OwnerDB::BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                         std::span<const ValueParts> values, std::vector<int64_t>* results) {
  return served_->BatchPut(options, keys, values, results);
}

Status OwnerDB::BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                             std::span<const Destination> destinations,
                             std::vector<int64_t>* results) {
  return served_->BatchGetInto(options, keys, destinations, results);
}

Status OwnerDB::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return served_->BatchExists(keys, results);
}

Status OwnerDB::BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                            std::vector<int64_t>* results) {
  return served_->BatchDelete(options, keys, results);
}

Status OwnerDB::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
  return served_->DeleteByRegex(pattern, deleted);
}

Status OwnerDB::DeleteAll(uint64_t* deleted) { return served_->DeleteAll(deleted); }

Status OwnerDB::RegisterBuffer(void* addr, size_t length) {
  return served_->RegisterBuffer(addr, length);
}

Status OwnerDB::UnregisterBuffer(void* addr) { return served_->UnregisterBuffer(addr); }

Status OwnerDB::Flush() { return served_->Flush(); }

Status OwnerDB::CompactBuckets(uint64_t* reclaimed_bytes) {
  return served_->CompactBuckets(reclaimed_bytes);
}

void OwnerDB::ResetPerf() { served_->ResetPerf(); }

}  // namespace kvengine
