#include "namespaces/namespace_db.h"

#include <algorithm>
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
                         NamespaceUsage* usage, NamespaceRemovals* removals,
                         std::unique_ptr<DB>* top) {
  Env* const env = options.env != nullptr ? options.env : Env::Default();
  NamespaceRecords records;
  Status s = LoadNamespaceRegistry(env, path, &records);
  if (!s.ok()) return s;
  top->reset(new NamespaceDB(std::move(*top), env, path, options.max_key_size, foreign_keys, usage,
                             removals, std::move(records)));
  return Status::OK();
}

NamespaceDB::NamespaceDB(std::unique_ptr<DB> base, Env* env, std::string dir, uint64_t max_key_size,
                         bool foreign_keys, NamespaceUsage* usage, NamespaceRemovals* removals,
                         NamespaceRecords records)
    : StackableDB(std::move(base)),
      env_(env),
      dir_(std::move(dir)),
      max_key_size_(max_key_size),
      foreign_keys_(foreign_keys),
      usage_(usage),
      removals_(removals),
      records_(std::move(records)),
      namespaced_keys_possible_(foreign_keys_ || !records_.empty()) {
  for (const NamespaceInfo& record : records_) SetLimits(record);
}

void NamespaceDB::SetLimits(const NamespaceInfo& record) {
  if (usage_ == nullptr) return;
  usage_->SetLimits(record.id, record.name, record.options.memory_quota_bytes,
                    record.options.ssd_quota_bytes, record.options.weight);
}

NamespaceDB::~NamespaceDB() { DetachAll(); }

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
  // The default namespace's newest removal first, in the numbering its readers use.
  RemovalBatch newest;
  const bool feed = removals_->ReadNamespaceRemovals(0, 0, 0, &newest).ok();
  uint64_t reported = 0;
  std::vector<ResidentKey> mine;
  Status s = base_->ReadResident(
      prefix, max_batch,
      [&](std::span<const ResidentKey> keys) {
        mine.clear();
        for (const ResidentKey& k : keys) {
          if (!ns::IsNamespaced(k.key)) mine.push_back(k);
        }
        reported += mine.size();
        return mine.empty() || batch(mine);
      },
      snapshot);
  if (s.ok()) {
    snapshot->removal_sequence = feed ? newest.last_sequence : 0;
    snapshot->keys = reported;
  }
  return s;
}

// ---------------------------------------------------------------- namespaces

const NamespaceInfo* NamespaceDB::Find(const std::string& name) const {
  for (const NamespaceInfo& r : records_) {
    if (r.name == name) return &r;
  }
  return nullptr;
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

Status NamespaceDB::CreateNamespace(const std::string& name, const NamespaceOptions& options,
                                    std::unique_ptr<DB>* handle) {
  handle->reset();
  Status s = input::CheckNamespaceName(name);
  if (s.ok()) s = CheckNamespaceOptions(options);
  if (!s.ok()) return s;
  MutexLock admin(&admin_mu_);
  {
    // From here on a namespace may hold keys below: DeleteAll must spare them.
    WriterLock w(&delete_all_mu_);
    namespaced_keys_possible_ = true;
  }
  MutexLock l(&mu_);
  if (closed_) return Status::Aborted("DB is closed");
  if (const NamespaceInfo* r = Find(name); r != nullptr) {
    return r->dropping ? Status::Aborted("namespace '" + name +
                                         "' is being dropped: DropNamespace again to finish")
                       : Status::InvalidArgument("namespace '" + name +
                                                 "' exists already (OpenNamespace opens it)");
  }
  if (records_.size() >= kMaxNamespaces) {
    return Status::InvalidArgument("a DB has at most " + std::to_string(kMaxNamespaces) +
                                   " namespaces");
  }
  NamespaceInfo record{name, ns::IdOf(name), options, false};
  if (record.id == 0) {  // the engine's accounting keeps 0 for "no namespace"
    return Status::InvalidArgument("namespace name '" + name +
                                   "' hashes to id 0: choose another name");
  }
  for (const NamespaceInfo& r : records_) {
    if (r.id == record.id) {
      return Status::InvalidArgument("namespace name '" + name + "' hashes to the id of '" +
                                     r.name + "': choose another name");
    }
  }
  NamespaceRecords next = records_;
  next.insert(std::upper_bound(
                  next.begin(), next.end(), record,
                  [](const NamespaceInfo& a, const NamespaceInfo& b) { return a.name < b.name; }),
              record);
  s = Commit(std::move(next));
  if (!s.ok()) return s;
  SetLimits(record);
  *handle = NewHandle(record);
  return Status::OK();
}

Status NamespaceDB::OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) {
  handle->reset();
  Status s = input::CheckNamespaceName(name);
  if (!s.ok()) return s;
  MutexLock l(&mu_);
  if (closed_) return Status::Aborted("DB is closed");
  const NamespaceInfo* r = Find(name);
  if (r == nullptr) return Status::NotFound("no namespace '" + name + "'");
  if (r->dropping) {
    return Status::Aborted("namespace '" + name +
                           "' is being dropped: DropNamespace again to finish");
  }
  *handle = NewHandle(*r);
  return Status::OK();
}

Status NamespaceDB::MarkDropping(const std::string& name, uint64_t* id) {
  std::shared_ptr<NamespaceState> state;
  {
    MutexLock l(&mu_);
    if (closed_) return Status::Aborted("DB is closed");
    const NamespaceInfo* r = Find(name);
    if (r == nullptr) return Status::NotFound("no namespace '" + name + "'");
    *id = r->id;
    if (!r->dropping) {
      NamespaceRecords next = records_;
      for (NamespaceInfo& n : next) n.dropping |= n.name == name;
      Status s = Commit(std::move(next));
      if (!s.ok()) return s;
    }
    if (auto it = states_.find(name); it != states_.end()) {
      state = std::move(it->second);
      states_.erase(it);
    }
  }
  // Outside mu_: waits for the handles' calls in flight.
  if (state != nullptr) state->Detach("namespace '" + name + "' was dropped");
  return Status::OK();
}

Status NamespaceDB::Unregister(const std::string& name) {
  MutexLock l(&mu_);
  NamespaceRecords next;
  for (const NamespaceInfo& r : records_) {
    if (r.name != name) next.push_back(r);
  }
  return Commit(std::move(next));
}

Status NamespaceDB::DropNamespace(const std::string& name, uint64_t* deleted) {
  if (deleted != nullptr) *deleted = 0;
  Status s = input::CheckNamespaceName(name);
  if (!s.ok()) return s;
  MutexLock admin(&admin_mu_);
  uint64_t id = 0;
  s = MarkDropping(name, &id);
  if (!s.ok()) return s;
  // Removed everywhere, and durably, before the registration goes: a crash in between
  // leaves the namespace marked dropping, never keys that a new namespace of the same
  // name (the same id) would find.
  s = base_->DeleteByRegex(ns::AllKeysOfNamespace(id), deleted);
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
  MutexLock l(&mu_);
  *namespaces = records_;
  return Status::OK();
}

}  // namespace kvengine
