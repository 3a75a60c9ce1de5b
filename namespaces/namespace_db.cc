#include "namespaces/namespace_db.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "util/input_check.h"
#include "util/key_pattern.h"
#include "util/namespace_key.h"

namespace kvengine {

namespace {
// Every key of the default namespace: any key whose first byte is not the namespaces'.
constexpr char kEveryDefaultKey[] = "[^\\xfe][\\x00-\\xff]*";
}  // namespace

Status NamespaceDB::Wrap(const Options& options, const std::string& path, bool foreign_keys,
                         NamespaceUsage* usage, NamespaceRemovals* removals, DB* local,
                         const NamespacePeers* peers, Logger* log, std::unique_ptr<DB>* top) {
  Env* const env = options.env != nullptr ? options.env : Env::Default();
  NamespaceRecords records;
  Status s = LoadNamespaceRegistry(env, path, &records);
  if (!s.ok()) return s;
  DB* const below = top->get();
  auto db = std::unique_ptr<NamespaceDB>(
      new NamespaceDB(std::move(*top), env, path, options.max_key_size, foreign_keys, usage,
                      removals, local != nullptr ? local : below, log, std::move(records)));
  if (peers != nullptr) {
    NamespaceFleet::Registry* registry = db.get();
    db->fleet_ = std::make_unique<NamespaceFleet>(*peers, registry, log);
    db->fleet_->Start();
  }
  *top = std::move(db);
  return Status::OK();
}

NamespaceDB::NamespaceDB(std::unique_ptr<DB> base, Env* env, std::string dir, uint64_t max_key_size,
                         bool foreign_keys, NamespaceUsage* usage, NamespaceRemovals* removals,
                         DB* local, Logger* log, NamespaceRecords records)
    : StackableDB(std::move(base)),
      env_(env),
      dir_(std::move(dir)),
      max_key_size_(max_key_size),
      foreign_keys_(foreign_keys),
      usage_(usage),
      removals_(removals),
      local_(local),
      log_(log),
      records_(std::move(records)),
      namespaced_keys_possible_(foreign_keys_ || !records_.empty()) {
  for (const NamespaceRecord& record : records_) {
    if (!record.dropped) SetLimits(record.info);
  }
}

void NamespaceDB::SetLimits(const NamespaceInfo& record) {
  if (usage_ == nullptr) return;
  usage_->SetLimits(record.id, record.name, record.options.memory_quota_bytes,
                    record.options.ssd_quota_bytes, record.options.weight);
}

NamespaceDB::~NamespaceDB() {
  if (fleet_ != nullptr) fleet_->Stop();
  DetachAll();
}

void NamespaceDB::DetachAll() {
  std::map<std::string, std::shared_ptr<NamespaceState>> states;
  {
    MutexLock l(&mu_);
    closed_ = true;
    states.swap(states_);
  }
  for (auto& [name, state] : states) state->Detach("DB is closed");
}

Status NamespaceDB::Close() {
  if (fleet_ != nullptr) fleet_->Stop();
  DetachAll();
  return StackableDB::Close();
}

// ---------------------------------------------------------------- the default namespace

Status NamespaceDB::Put(const WriteOptions& options, const Slice& key, const Slice& value) {
  Status s = input::CheckDefaultNamespaceKey(key);
  return s.ok() ? base_->Put(options, key, value) : s;
}

Status NamespaceDB::Get(const ReadOptions& options, const Slice& key, std::string* value) {
  Status s = input::CheckDefaultNamespaceKey(key);
  return s.ok() ? base_->Get(options, key, value) : s;
}

Status NamespaceDB::GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                            size_t* value_size) {
  Status s = input::CheckDefaultNamespaceKey(key);
  return s.ok() ? base_->GetInto(options, key, buffer, value_size) : s;
}

Status NamespaceDB::Delete(const WriteOptions& options, const Slice& key) {
  Status s = input::CheckDefaultNamespaceKey(key);
  return s.ok() ? base_->Delete(options, key) : s;
}

Status NamespaceDB::GetValueSize(const Slice& key, uint64_t* size) {
  Status s = input::CheckDefaultNamespaceKey(key);
  return s.ok() ? base_->GetValueSize(key, size) : s;
}

namespace {
const std::span<const int> kNoOthers;
}  // namespace

Status NamespaceDB::BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                             std::span<const ValueParts> values, std::vector<int64_t>* results) {
  return RunBatch("BatchPut", default_keys_, keys, values, true, results,
                  [&](auto k, auto v, auto r) { return base_->BatchPut(options, k, v, r); });
}

Status NamespaceDB::BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                                 std::span<const Destination> destinations,
                                 std::vector<int64_t>* results) {
  return RunBatch("BatchGetInto", default_keys_, keys, destinations, true, results,
                  [&](auto k, auto d, auto r) { return base_->BatchGetInto(options, k, d, r); });
}

Status NamespaceDB::BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                                       std::span<const Destination> destinations,
                                       std::span<const size_t> group_ends,
                                       const GroupReadyFn& on_ready,
                                       std::vector<int64_t>* results) {
  // Every key accepted (the usual case): the layer below loads the groups as it can
  // (ClusterDB pipelines them); else group by group through BatchGetInto, which answers
  // the refused keys.
  MappedBatch mapped(default_keys_, keys);
  if (mapped.complete()) {
    return base_->BatchGetIntoGroups(options, mapped.kept(), destinations, group_ends, on_ready,
                                     results);
  }
  return DB::BatchGetIntoGroups(options, keys, destinations, group_ends, on_ready, results);
}

Status NamespaceDB::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return RunBatch("BatchExists", default_keys_, keys, kNoOthers, false, results,
                  [&](auto k, auto, auto r) { return base_->BatchExists(k, r); });
}

Status NamespaceDB::BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                                std::vector<int64_t>* results) {
  return RunBatch("BatchDelete", default_keys_, keys, kNoOthers, false, results,
                  [&](auto k, auto, auto r) { return base_->BatchDelete(options, k, r); });
}

Status NamespaceDB::BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return RunBatch("BatchLocate", default_keys_, keys, kNoOthers, false, results,
                  [&](auto k, auto, auto r) { return base_->BatchLocate(k, r); });
}

Status NamespaceDB::Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return RunBatch("Prefetch", default_keys_, keys, kNoOthers, false, results,
                  [&](auto k, auto, auto r) { return base_->Prefetch(k, r); });
}

Status NamespaceDB::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
  Status s = KeyPattern::Check(pattern);  // on its own first: see NamespaceView::DeleteByRegex
  if (!s.ok()) return s;
  std::string in_default;
  s = default_keys_.Pattern(pattern, &in_default);
  return s.ok() ? base_->DeleteByRegex(in_default, deleted) : s;
}

Status NamespaceDB::DeleteAll(uint64_t* deleted) {
  ReaderLock l(&delete_all_mu_);
  if (!namespaced_keys_possible_) return base_->DeleteAll(deleted);
  return base_->DeleteByRegex(kEveryDefaultKey, deleted);
}

Status NamespaceDB::ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) {
  Status s = removals_->ReadNamespaceRemovals(0, after, max_events, batch);
  if (s.ok()) FilterRemovals(default_keys_, batch);
  return s;
}

Status NamespaceDB::ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                                 ResidentSnapshot* snapshot) {
  if (ns::IsNamespaced(prefix.view())) {
    return Status::InvalidArgument(
        "ReadResident: a prefix of the default namespace cannot "
        "start with byte 0xFE");
  }
  return ReadNamespaceResident(default_keys_, 0, removals_, base_.get(), prefix.ToString(),
                               max_batch, batch, snapshot);
}

// ---------------------------------------------------------------- namespaces

const NamespaceRecord* NamespaceDB::FindAny(const std::string& name) const {
  for (const NamespaceRecord& r : records_) {
    if (r.info.name == name) return &r;
  }
  return nullptr;
}

const NamespaceRecord* NamespaceDB::Find(const std::string& name) const {
  const NamespaceRecord* r = FindAny(name);
  return r != nullptr && !r->dropped ? r : nullptr;
}

std::vector<NamespaceInfo> NamespaceDB::Registered() const {
  std::vector<NamespaceInfo> out;
  for (const NamespaceRecord& r : records_) {
    if (!r.dropped) out.push_back(r.info);
  }
  return out;
}

uint64_t NamespaceDB::NextStamp() const {
  uint64_t stamp = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  for (const NamespaceRecord& r : records_) stamp = std::max(stamp, r.stamp + 1);
  return stamp;
}

Status NamespaceDB::Replace(const NamespaceRecord& record) {
  NamespaceRecords next;
  next.reserve(records_.size() + 1);
  for (const NamespaceRecord& r : records_) {
    if (r.info.name != record.info.name) next.push_back(r);
  }
  next.insert(std::upper_bound(next.begin(), next.end(), record,
                               [](const NamespaceRecord& a, const NamespaceRecord& b) {
                                 return a.info.name < b.info.name;
                               }),
              record);
  // Past the tombstones a registry keeps, the oldest go: a member down since such a drop
  // would bring that namespace back.
  std::vector<uint64_t> stamps;
  for (const NamespaceRecord& r : next) {
    if (r.dropped) stamps.push_back(r.stamp);
  }
  if (stamps.size() > kMaxNamespaceTombstones) {
    std::nth_element(stamps.begin(), stamps.end() - kMaxNamespaceTombstones, stamps.end());
    const uint64_t oldest_kept = *(stamps.end() - kMaxNamespaceTombstones);
    std::erase_if(next,
                  [&](const NamespaceRecord& r) { return r.dropped && r.stamp < oldest_kept; });
  }
  return Commit(std::move(next));
}

Status NamespaceDB::Commit(NamespaceRecords records) {
  Status s = SaveNamespaceRegistry(env_, dir_, records);
  if (s.ok()) records_ = std::move(records);
  return s;
}

std::unique_ptr<DB> NamespaceDB::NewHandle(const NamespaceInfo& record) {
  std::shared_ptr<NamespaceState>& state = states_[record.name];
  if (state == nullptr) {
    state = std::make_shared<NamespaceState>(record.name, record.id, max_key_size_, base_.get(),
                                             removals_);
  }
  return std::make_unique<NamespaceView>(state);
}

void NamespaceDB::DetachHandles(const std::string& name, const std::string& why) {
  std::shared_ptr<NamespaceState> state;
  {
    MutexLock l(&mu_);
    if (auto it = states_.find(name); it != states_.end()) {
      state = std::move(it->second);
      states_.erase(it);
    }
  }
  // Outside mu_: waits for the handles' calls in flight.
  if (state != nullptr) state->Detach(why);
}

Status NamespaceDB::PullFromFleet() { return fleet_ != nullptr ? fleet_->PullAll() : Status::OK(); }

Status NamespaceDB::PushToFleet() { return fleet_ != nullptr ? fleet_->PushAll() : Status::OK(); }

Status NamespaceDB::CreateNamespace(const std::string& name, const NamespaceOptions& options,
                                    std::unique_ptr<DB>* handle) {
  handle->reset();
  Status s = input::CheckNamespaceName(name);
  if (s.ok()) s = CheckNamespaceOptions(options);
  // A member may know the name already (created through another member while this DB
  // was away), and may refuse this DB's token the right to create.
  if (s.ok()) s = PullFromFleet();
  if (s.ok()) s = CreateHere(name, options, handle);
  // Members that cannot be reached now learn it on their next pull.
  if (s.ok()) PushToFleet();
  return s;
}

Status NamespaceDB::CreateHere(const std::string& name, const NamespaceOptions& options,
                               std::unique_ptr<DB>* handle) {
  MutexLock admin(&admin_mu_);
  {
    // From here on a namespace may hold keys below: DeleteAll must spare them.
    WriterLock w(&delete_all_mu_);
    namespaced_keys_possible_ = true;
  }
  MutexLock l(&mu_);
  if (closed_) return Status::Aborted("DB is closed");
  if (const NamespaceRecord* r = Find(name); r != nullptr) {
    return r->info.dropping ? Status::Aborted("namespace '" + name +
                                              "' is being dropped: DropNamespace again to finish")
                            : Status::InvalidArgument("namespace '" + name +
                                                      "' exists already (OpenNamespace opens it)");
  }
  const std::vector<NamespaceInfo> registered = Registered();
  if (registered.size() >= kMaxNamespaces) {
    return Status::InvalidArgument("a DB has at most " + std::to_string(kMaxNamespaces) +
                                   " namespaces");
  }
  NamespaceRecord record{{name, ns::IdOf(name), options, false}, NextStamp(), false};
  if (record.info.id == 0) {  // the engine's accounting keeps 0 for "no namespace"
    return Status::InvalidArgument("namespace name '" + name +
                                   "' hashes to id 0: choose another name");
  }
  for (const NamespaceInfo& r : registered) {
    if (r.id == record.info.id) {
      return Status::InvalidArgument("namespace name '" + name + "' hashes to the id of '" +
                                     r.name + "': choose another name");
    }
  }
  Status s = Replace(record);
  if (!s.ok()) return s;
  SetLimits(record.info);
  *handle = NewHandle(record.info);
  return Status::OK();
}

Status NamespaceDB::OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) {
  handle->reset();
  Status s = input::CheckNamespaceName(name);
  if (!s.ok()) return s;
  for (bool pulled = fleet_ == nullptr;; pulled = true) {
    {
      MutexLock l(&mu_);
      if (closed_) return Status::Aborted("DB is closed");
      const NamespaceRecord* r = Find(name);
      if (r != nullptr && r->info.dropping) {
        return Status::Aborted("namespace '" + name +
                               "' is being dropped: DropNamespace again to finish");
      }
      if (r != nullptr) {
        *handle = NewHandle(r->info);
        return Status::OK();
      }
      if (pulled) return Status::NotFound("no namespace '" + name + "'");
    }
    // Not here yet: created through another member or client moments ago.
    PullFromFleet();
  }
}

Status NamespaceDB::MarkDropping(const std::string& name, uint64_t* id) {
  {
    MutexLock l(&mu_);
    if (closed_) return Status::Aborted("DB is closed");
    const NamespaceRecord* r = Find(name);
    if (r == nullptr) return Status::NotFound("no namespace '" + name + "'");
    *id = r->info.id;
    NamespaceRecord dropping = *r;
    dropping.info.dropping = true;
    dropping.stamp = NextStamp();
    Status s = Replace(dropping);
    if (!s.ok()) return s;
  }
  DetachHandles(name, "namespace '" + name + "' was dropped");
  return Status::OK();
}

Status NamespaceDB::Unregister(const std::string& name) {
  MutexLock l(&mu_);
  const NamespaceRecord* r = Find(name);
  if (r == nullptr || !r->info.dropping) {  // re-created (through a member) meanwhile
    return Status::Aborted("namespace '" + name + "' changed while it was being dropped");
  }
  NamespaceRecord tombstone = *r;
  tombstone.info.dropping = false;
  tombstone.dropped = true;
  tombstone.stamp = NextStamp();
  return Replace(tombstone);
}

Status NamespaceDB::DropNamespace(const std::string& name, uint64_t* deleted) {
  if (deleted != nullptr) *deleted = 0;
  Status s = input::CheckNamespaceName(name);
  if (s.ok()) s = PullFromFleet();
  if (s.ok()) s = DropHere(name, deleted);
  // The tombstone, to every member (one that misses it learns it on its next pull).
  if (s.ok()) PushToFleet();
  return s;
}

Status NamespaceDB::DropHere(const std::string& name, uint64_t* deleted) {
  uint64_t id = 0;
  {
    MutexLock admin(&admin_mu_);
    Status s = MarkDropping(name, &id);
    if (!s.ok()) return s;
  }
  // Every member marks it dropping (its handles fail from now on) before its keys go.
  PushToFleet();
  MutexLock admin(&admin_mu_);
  // Removed everywhere, and durably, before the registration goes: a crash in between
  // leaves the namespace marked dropping, never keys that a new namespace of the same
  // name (the same id) would find.
  Status s = base_->DeleteByRegex(ns::AllKeysOfNamespace(id), deleted);
  if (s.IsIOError() && fleet_ != nullptr) {
    // A member could not be reached: it removes its keys when it learns of the drop (its
    // first pull once it is back, NamespaceDB::Merge; before that, the delete hint the
    // cluster recorded for it).  This host's own must be gone now.
    uint64_t here = 0;
    s = local_->DeleteByRegex(ns::AllKeysOfNamespace(id), &here);
    if (deleted != nullptr) *deleted += here;
  }
  if (s.ok()) s = base_->Flush();
  if (!s.ok()) {
    return Status::FromErrorCode(
        static_cast<int>(s.ErrorCode()),
        "DropNamespace '" + name + "' did not finish (" + s.ToString() +
            "); it stays registered as dropping: DropNamespace again finishes it");
  }
  s = Unregister(name);
  if (s.ok() && usage_ != nullptr) usage_->Forget(id);
  return s;
}

Status NamespaceDB::ListNamespaces(std::vector<NamespaceInfo>* namespaces) {
  if (namespaces == nullptr) return Status::InvalidArgument("ListNamespaces: result is null");
  PullFromFleet();  // the fleet's, as of now: a member that cannot be asked is skipped
  MutexLock l(&mu_);
  *namespaces = Registered();
  return Status::OK();
}

// ---------------------------------------------------------------- the fleet

NamespaceRecords NamespaceDB::Snapshot() {
  MutexLock l(&mu_);
  return records_;
}

Status NamespaceDB::RemoveLocalKeys(uint64_t id) {
  uint64_t removed = 0;
  Status s = local_->DeleteByRegex(ns::AllKeysOfNamespace(id), &removed);
  return s.ok() ? local_->Flush() : s;
}

Status NamespaceDB::Merge(const NamespaceRecords& remote, const std::string& from) {
  MutexLock admin(&admin_mu_);
  // The records of `remote` that supersede this registry's, and what this registry held
  // of the namespace (live or being dropped) before.
  struct Winner {
    NamespaceRecord record;
    bool had = false;
    bool had_legacy = false;  // of a format 1 registry (stamp 0)
  };
  std::vector<Winner> winners;
  {
    MutexLock l(&mu_);
    if (closed_) return Status::Aborted("DB is closed");
    for (const NamespaceRecord& r : remote) {
      const NamespaceRecord* mine = FindAny(r.info.name);
      if (r.info.id != ns::IdOf(r.info.name)) continue;  // not a registry of this engine's
      if (mine != nullptr && !Supersedes(r, *mine)) continue;
      const bool had = mine != nullptr && !mine->dropped;
      winners.push_back({r, had, had && mine->stamp == 0});
    }
  }
  if (winners.empty()) return Status::OK();
  {
    WriterLock w(&delete_all_mu_);
    namespaced_keys_possible_ = true;
  }
  Status result;
  for (const Winner& w : winners) {
    const NamespaceRecord& record = w.record;
    const std::string& name = record.info.name;
    // A drop this host missed, or one followed by a new namespace of the same name (the
    // same id): the old handles fail, and the old keys this host holds go first.  Not for
    // the namespaces hosts created each on its own before registries were stamped: they
    // only agree on the options.
    const bool recreated = w.had && !record.dropped && !w.had_legacy;
    if (record.dropped || record.info.dropping || recreated) {
      DetachHandles(name, "namespace '" + name + "' was dropped (through " + from + ")");
    }
    if (w.had && !record.info.dropping && (record.dropped || recreated)) {
      Status s = RemoveLocalKeys(record.info.id);
      if (!s.ok()) {  // the next pull tries again
        result = s;
        continue;
      }
    }
    MutexLock l(&mu_);
    if (!record.dropped && !record.info.dropping) {
      bool taken = false;
      for (const NamespaceInfo& r : Registered()) taken |= r.id == record.info.id && r.name != name;
      if (taken) continue;  // two names of one id: keep this registry's
    }
    Status s = Replace(record);
    if (!s.ok()) {
      result = s;
      continue;
    }
    if (record.dropped) {
      if (usage_ != nullptr) usage_->Forget(record.info.id);
    } else {
      SetLimits(record.info);
    }
    if (log_ != nullptr && log_->Enabled(LogLevel::kInfo)) {
      const char* what = record.dropped         ? "dropped (its keys removed from this host)"
                         : record.info.dropping ? "being dropped"
                         : w.had                ? "created again (the old keys removed here)"
                                                : "created";
      log_->Write(LogLevel::kInfo, "namespace '" + name + "' " + what + ", as learnt from " + from);
    }
  }
  return result;
}

}  // namespace kvengine
