#include "cluster/cluster_db.h"

#include <utility>

#include "util/input_check.h"
#include "util/key_pattern.h"
#include "util/perf_point.h"

namespace kvengine {

Status ClusterDB::Create(const Options& options, std::unique_ptr<ClusterDB>* result) {
  result->reset();
  std::unique_ptr<ClusterDB> db(new ClusterDB(options));
  Status s = db->logger_.Configure(options);
  if (!s.ok()) return s;
  s = PeerRouter::Open(options, &db->logger_, &db->router_);
  if (!s.ok() || db->router_ == nullptr) return s;
  *result = std::move(db);
  return Status::OK();
}

ClusterDB::ClusterDB(const Options& options) : StackableDB(nullptr), options_(options) {}

ClusterDB::~ClusterDB() { Close(); }

std::shared_ptr<MemoryRegistrar> ClusterDB::Registrar(std::shared_ptr<MemoryRegistrar> next) {
  return router_->Registrar(std::move(next));
}

Status ClusterDB::Start(std::unique_ptr<DB> local, SharedArena* arena, PeerRouter::PinFn pin,
                        PeerRouter::ServedFn served, const char* arena_base,
                        TierCounters* peer_tier) {
  base_ = std::move(local);
  SetArenaBelow(arena);
  router_->SetTierCounters(peer_tier);
  router_->ServeOneSidedPuts(arena);
  return router_->StartServing(base_.get(), std::move(pin), std::move(served), arena_base);
}

Status ClusterDB::Close() {
  // Peers first: their requests run on the local DB until the server has drained them.
  if (router_ != nullptr) router_->Close();
  return base_ != nullptr ? base_->Close() : Status::OK();
}

bool ClusterDB::Routable(const Slice& key) const {
  return input::CheckKey(key, options_.max_key_size).ok();
}

PeerRouter::PromoteFn ClusterDB::Promoter() {
  return [this](const Slice& key, std::span<const Slice> parts, uint64_t) {
    WriteOptions fill;
    fill.fill_cache = true;
    const ValueParts value(parts.begin(), parts.end());
    std::vector<int64_t> results;
    base_->BatchPut(fill, std::span<const Slice>(&key, 1), std::span<const ValueParts>(&value, 1),
                    &results);
  };
}

// ---------------------------------------------------------------- single keys

Status ClusterDB::Put(const WriteOptions& options, const Slice& key, const Slice& value) {
  Endpoint owner;
  if (Routable(key) && router_->Replicated()) {
    PerfPoint perf(PerfKey::db_put);
    return CallLog(&logger_, "put", &errors_)
        .FinishKey(router_->PutReplicated(base_.get(), key, value), key,
                   static_cast<int64_t>(value.size()), "replicas");
  }
  if (Routable(key) && router_->RemoteOwner(key, &owner)) {
    PerfPoint perf(PerfKey::db_put);
    return CallLog(&logger_, "put", &errors_)
        .FinishKey(router_->Put(owner, key, value), key, static_cast<int64_t>(value.size()),
                   "peer");
  }
  return base_->Put(options, key, value);
}

Status ClusterDB::Get(const ReadOptions& options, const Slice& key, std::string* value) {
  Endpoint owner;
  if (value != nullptr && Routable(key) && router_->Replicated()) {
    PerfPoint perf(PerfKey::db_get);
    return CallLog(&logger_, "get", &errors_)
        .FinishKey(router_->GetReplicated(base_.get(), key, value), key, -1, "replicas");
  }
  if (value != nullptr && Routable(key) && router_->RemoteOwner(key, &owner)) {
    PerfPoint perf(PerfKey::db_get);
    return CallLog(&logger_, "get", &errors_)
        .FinishKey(router_->Get(owner, key, value), key, -1, "peer");
  }
  Status s = base_->Get(options, key, value);
  if (s.IsNotFound() && router_->ReadThrough()) {
    Status remote = router_->ReadThroughGetString(key, value, Promoter());
    if (remote.ok()) return remote;
  }
  return s;
}

Status ClusterDB::GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                          size_t* value_size) {
  Endpoint owner;
  if (Routable(key) && router_->Replicated()) {
    PerfPoint perf(PerfKey::db_get_into);
    return CallLog(&logger_, "get_into", &errors_)
        .FinishKey(router_->GetIntoReplicated(base_.get(), key, buffer, value_size), key, -1,
                   "replicas");
  }
  if (Routable(key) && router_->RemoteOwner(key, &owner)) {
    PerfPoint perf(PerfKey::db_get_into);
    return CallLog(&logger_, "get_into", &errors_)
        .FinishKey(router_->GetInto(owner, key, buffer, value_size), key, -1, "peer");
  }
  Status s = base_->GetInto(options, key, buffer, value_size);
  if (!s.IsNotFound() || !router_->ReadThrough() || OnDevice({&buffer, 1})) return s;
  // A miss here may be a hit on a peer, read straight into the caller's buffer.
  std::vector<int64_t> result{s.ErrorCode()};
  const Destination dest{buffer};
  router_->ReadThroughGet(std::span<const Slice>(&key, 1), std::span<const Destination>(&dest, 1),
                          &result, Promoter());
  if (result[0] == s.ErrorCode()) return s;
  if (result[0] >= 0) {
    if (value_size != nullptr) *value_size = static_cast<size_t>(result[0]);
    return Status::OK();
  }
  return Status::FromErrorCode(static_cast<int>(result[0]), "key read from a peer");
}

Status ClusterDB::Delete(const WriteOptions& options, const Slice& key) {
  Endpoint owner;
  if (Routable(key) && router_->Replicated()) {
    PerfPoint perf(PerfKey::db_delete);
    return CallLog(&logger_, "delete", &errors_)
        .FinishKey(router_->DeleteReplicated(base_.get(), key), key, -1, "replicas");
  }
  if (Routable(key) && router_->RemoteOwner(key, &owner)) {
    // Through the owners' path, which records the delete when the owner is down.
    PerfPoint perf(PerfKey::db_delete);
    return CallLog(&logger_, "delete", &errors_)
        .FinishKey(router_->DeleteReplicated(base_.get(), key), key, -1, "peer");
  }
  return base_->Delete(options, key);
}

Status ClusterDB::GetValueSize(const Slice& key, uint64_t* size) {
  Endpoint owner;
  if (size != nullptr && Routable(key) && router_->Replicated()) {
    return router_->GetValueSizeReplicated(base_.get(), key, size);
  }
  if (size != nullptr && Routable(key) && router_->RemoteOwner(key, &owner)) {
    return router_->GetValueSize(owner, key, size);
  }
  Status s = base_->GetValueSize(key, size);
  // Read-through: a GetInto of this key would find it on a peer, so its size must too
  // (the Python get sizes its bytes object this way).
  if (s.IsNotFound() && router_->ReadThrough() && router_->ReadThroughValueSize(key, size).ok()) {
    return Status::OK();
  }
  return s;
}

// ---------------------------------------------------------------- batches

void ClusterDB::ReadThroughHostMisses(std::span<const Slice> keys,
                                      std::span<const Destination> destinations,
                                      std::vector<int64_t>* results) {
  const int64_t kNotFound = Status::NotFound("").ErrorCode();
  std::vector<size_t> misses;
  for (size_t i = 0; i < keys.size(); i++) {
    if ((*results)[i] == kNotFound && !OnDevice(destinations[i])) misses.push_back(i);
  }
  if (misses.empty()) return;
  std::vector<Slice> ask;
  std::vector<Destination> into;
  for (size_t i : misses) {
    ask.push_back(keys[i]);
    into.push_back(destinations[i]);
  }
  std::vector<int64_t> answers(misses.size(), kNotFound);
  router_->ReadThroughGet(ask, into, &answers, Promoter());
  for (size_t j = 0; j < misses.size(); j++) (*results)[misses[j]] = answers[j];
}

Status ClusterDB::BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                           std::span<const ValueParts> values, std::vector<int64_t>* results) {
  if (!router_->Routing()) return base_->BatchPut(options, keys, values, results);
  PerfPoint perf(PerfKey::db_batch_put);
  CallLog log(&logger_, "batch_put", &errors_);
  log.Add("num_keys", keys.size());
  return log.Finish(router_->BatchPut(base_.get(), options, keys, values, results));
}

Status ClusterDB::BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                               std::span<const Destination> destinations,
                               std::vector<int64_t>* results) {
  if (router_->Routing()) {
    PerfPoint perf(PerfKey::db_batch_get_into);
    CallLog log(&logger_, "batch_get_into", &errors_);
    log.Add("num_keys", keys.size());
    return log.Finish(router_->BatchGetInto(base_.get(), options, keys, destinations, results));
  }
  Status s = base_->BatchGetInto(options, keys, destinations, results);
  if (s.ok() && router_->ReadThrough()) ReadThroughHostMisses(keys, destinations, results);
  return s;
}

Status ClusterDB::BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                                     std::span<const Destination> destinations,
                                     std::span<const size_t> group_ends,
                                     const GroupReadyFn& on_ready, std::vector<int64_t>* results) {
  if (!router_->Routing()) {
    return DB::BatchGetIntoGroups(options, keys, destinations, group_ends, on_ready, results);
  }
  PerfPoint perf(PerfKey::db_batch_get_into);
  CallLog log(&logger_, "batch_get_into_groups", &errors_);
  log.Add("num_keys", keys.size());
  log.Add("num_groups", group_ends.size());
  return log.Finish(router_->BatchGetIntoGroups(base_.get(), options, keys, destinations,
                                                group_ends, on_ready, results));
}

Status ClusterDB::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  if (router_->Routing()) {
    PerfPoint perf(PerfKey::db_batch_exists);
    CallLog log(&logger_, "batch_exists", &errors_);
    log.Add("num_keys", keys.size());
    return log.Finish(router_->BatchExists(base_.get(), keys, results));
  }
  Status s = base_->BatchExists(keys, results);
  if (s.ok() && router_->ReadThrough()) router_->ReadThroughExists(keys, results);
  return s;
}

Status ClusterDB::BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) {
  Status s = base_->BatchLocate(keys, results);
  if (!s.ok() || (!router_->Routing() && !router_->ReadThrough())) return s;
  // A key this host lacks may be a peer's: asked as BatchExists would ask it.
  std::vector<Slice> absent;
  std::vector<size_t> where;
  for (size_t i = 0; i < keys.size(); i++) {
    if ((*results)[i] == kLocatedAbsent) {
      absent.push_back(keys[i]);
      where.push_back(i);
    }
  }
  if (absent.empty()) return s;
  std::vector<int64_t> remote;
  if (!BatchExists(absent, &remote).ok()) return s;  // the local answer stands
  for (size_t j = 0; j < where.size(); j++) {
    if (remote[j] == 1) (*results)[where[j]] = kLocatedPeer;
  }
  return s;
}

Status ClusterDB::BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                              std::vector<int64_t>* results) {
  if (!router_->Routing()) return base_->BatchDelete(options, keys, results);
  PerfPoint perf(PerfKey::db_batch_delete);
  CallLog log(&logger_, "batch_delete", &errors_);
  log.Add("num_keys", keys.size());
  return log.Finish(router_->BatchDelete(base_.get(), options, keys, results));
}

Status ClusterDB::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
  if (!router_->Routing()) return base_->DeleteByRegex(pattern, deleted);
  PerfPoint perf(PerfKey::db_delete_by_regex);
  CallLog log(&logger_, "delete_by_regex", &errors_);
  // Checked before anything is sent to a peer: a bad pattern removes nothing anywhere.
  KeyPattern re;
  Status s = re.Compile(pattern);
  if (!s.ok()) return log.Finish(std::move(s));
  uint64_t n = 0;  // on failure: what the members that succeeded removed
  s = router_->DeleteByRegex(base_.get(), pattern, &n);
  if (deleted != nullptr) *deleted = n;
  log.Add("deleted", n);
  return log.Finish(std::move(s));
}

Status ClusterDB::DeleteAll(uint64_t* deleted) {
  if (!router_->Routing()) return base_->DeleteAll(deleted);
  PerfPoint perf(PerfKey::db_delete_all);
  CallLog log(&logger_, "delete_all", &errors_);
  uint64_t n = 0;
  Status s = router_->DeleteAll(base_.get(), &n);
  if (deleted != nullptr) *deleted = n;
  log.Add("deleted", n);
  return log.Finish(std::move(s));
}

void ClusterDB::Commit(std::span<const Slice> keys, std::span<MemoryTier::Reservation* const> slots,
                       std::vector<int64_t>* results) {
  SharedArena* const engine = arena_below();
  if (!router_->Routing()) return engine->Commit(keys, slots, results);
  PerfPoint perf(PerfKey::db_batch_put);
  CallLog log(&logger_, "commit", &errors_);
  log.Add("num_keys", keys.size());
  // Keys the engine would refuse stay there, for its error.
  std::vector<size_t> routed, kept;
  for (size_t i = 0; i < keys.size(); i++) (Routable(keys[i]) ? routed : kept).push_back(i);
  results->assign(keys.size(), 0);
  auto commit_locally = [&](const std::vector<size_t>& idx, std::vector<int64_t>* r) {
    std::vector<Slice> k;
    std::vector<MemoryTier::Reservation*> v;
    for (size_t i : idx) {
      k.push_back(keys[i]);
      v.push_back(slots[i]);
    }
    engine->Commit(k, v, r);
    return Status::OK();
  };
  if (!kept.empty()) {
    std::vector<int64_t> r;
    commit_locally(kept, &r);
    for (size_t j = 0; j < kept.size(); j++) (*results)[kept[j]] = r[j];
  }
  if (routed.empty()) {
    log.Finish(Status::OK());
    return;
  }
  std::vector<Slice> k;
  std::vector<ValueParts> values;
  for (size_t i : routed) {
    k.push_back(keys[i]);
    values.push_back({Slice(slots[i]->data(), slots[i]->size())});
  }
  std::vector<int64_t> r;
  Status s = router_->BatchPutLocalLast(
      k, values,
      [&](const std::vector<size_t>& idx, std::vector<int64_t>* out) {
        std::vector<size_t> mine;
        for (size_t j : idx) mine.push_back(routed[j]);
        return commit_locally(mine, out);
      },
      &r);
  for (size_t j = 0; j < routed.size(); j++) {
    const size_t i = routed[j];
    (*results)[i] = s.ok() && j < r.size() ? r[j] : s.ErrorCode();
    log.Key(i, (*results)[i], static_cast<int64_t>(values[j][0].size()), "replicas");
  }
  log.Finish(std::move(s), keys);
}

bool ClusterDB::GetProperty(const std::string& name, std::string* value) {
  if (name == "kvengine.metrics" && value != nullptr) {
    if (!base_->GetProperty(name, value)) return false;
    router_->AppendPrometheus(value);
    return true;
  }
  if (name == "kvengine.readiness" && value != nullptr) {
    if (!base_->GetProperty(name, value)) return false;
    *value += router_->Readiness();
    return true;
  }
  if (name != "kvengine.peers" || value == nullptr) return base_->GetProperty(name, value);
  // Answered while the DB is open, as every property.
  std::string probe;
  if (!base_->GetProperty("kvengine.options", &probe)) {
    *value = probe;
    return false;
  }
  *value = router_->StatsText();
  return true;
}

}  // namespace kvengine
