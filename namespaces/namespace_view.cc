#include "namespaces/namespace_view.h"

#include <algorithm>

#include "util/input_check.h"
#include "util/key_pattern.h"
#include "util/printable.h"

namespace kvengine {

namespace {
// For the batch calls without a list beside the keys.
const std::span<const int> kNoOthers;
}  // namespace

Status NamespaceView::Refusal() const {
  if (closed_.load(std::memory_order_acquire)) {
    return Status::Aborted("the handle of namespace '" + state_->name + "' is closed");
  }
  return Status::Aborted(state_->Gone());
}

template <class Fn>
Status NamespaceView::WithBase(Fn fn) {
  CallGateEntry inside(&state_->calls);
  if (!inside.entered() || closed_.load(std::memory_order_acquire)) return Refusal();
  return fn(state_->base);
}

template <class Fn>
Status NamespaceView::WithKey(const Slice& key, Fn fn) {
  // WithBase written out: this is every single-key call's path, where one level of
  // call fewer shows (docs/benchmarks.md, "What a namespace costs a put and a get").
  PrefixedKey internal;
  if (Status bad = state_->keys.ToInternal(key, &internal); !bad.ok()) return bad;
  CallGateEntry inside(&state_->calls);
  if (!inside.entered() || closed_.load(std::memory_order_acquire)) return Refusal();
  Status s = fn(state_->base, internal.slice());
  if (s.ok()) return s;
  return state_->keys.NameUserKey(std::move(s), key, state_->name);
}

template <class T, class Call>
Status NamespaceView::Batch(const char* name, std::span<const Slice> keys,
                            std::span<const T> others, bool has_others,
                            std::vector<int64_t>* results, Call call) {
  return WithBase([&](DB* base) {
    return RunBatch(name, state_->keys, keys, others, has_others, results,
                    [&](std::span<const Slice> k, std::span<const T> o, std::vector<int64_t>* r) {
                      return call(base, k, o, r);
                    });
  });
}

Status NamespaceView::Close() {
  closed_.store(true, std::memory_order_release);
  return Status::OK();
}

Status NamespaceView::Put(const WriteOptions& options, const Slice& key, const Slice& value) {
  return WithKey(key, [&](DB* base, const Slice& k) { return base->Put(options, k, value); });
}

Status NamespaceView::Get(const ReadOptions& options, const Slice& key, std::string* value) {
  return WithKey(key, [&](DB* base, const Slice& k) { return base->Get(options, k, value); });
}

Status NamespaceView::GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                              size_t* value_size) {
  return WithKey(
      key, [&](DB* base, const Slice& k) { return base->GetInto(options, k, buffer, value_size); });
}

Status NamespaceView::Delete(const WriteOptions& options, const Slice& key) {
  return WithKey(key, [&](DB* base, const Slice& k) { return base->Delete(options, k); });
}

Status NamespaceView::GetValueSize(const Slice& key, uint64_t* size) {
  return WithKey(key, [&](DB* base, const Slice& k) { return base->GetValueSize(k, size); });
}

Status NamespaceView::BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                               std::span<const ValueParts> values, std::vector<int64_t>* results) {
  // A batch that names a key twice is refused whole, the key named as the user gave it.
  // The DB below checks its keys (before it writes any) and names them with their
  // prefix: its refusal is worded again here, so a usual batch is checked once.  Keys
  // refused here never go down (nor, when all are, does the call), so a batch with any
  // key that is not a usual one is checked here first.
  const NamespaceKeys& rule = state_->keys;
  if (!std::all_of(keys.begin(), keys.end(), [&](const Slice& k) { return rule.IsShort(k); })) {
    Status s = input::CheckUniqueKeys(keys);
    if (!s.ok()) return s;
  }
  return Batch("BatchPut", keys, values, true, results, [&](DB* base, auto k, auto v, auto r) {
    Status s = base->BatchPut(options, k, v, r);
    if (s.IsInvalidArgument()) {
      Status named = input::CheckUniqueKeys(keys);
      if (!named.ok()) return named;
    }
    return s;
  });
}

Status NamespaceView::BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                                   std::span<const Destination> destinations,
                                   std::vector<int64_t>* results) {
  return Batch(
      "BatchGetInto", keys, destinations, true, results,
      [&](DB* base, auto k, auto d, auto r) { return base->BatchGetInto(options, k, d, r); });
}

Status NamespaceView::BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                                         std::span<const Destination> destinations,
                                         std::span<const size_t> group_ends,
                                         const GroupReadyFn& on_ready,
                                         std::vector<int64_t>* results) {
  // As NamespaceDB's: the layer below loads the groups when every key maps; else group
  // by group through BatchGetInto (outside the call gate, which BatchGetInto enters).
  bool forwarded = false;
  Status s = WithBase([&](DB* base) {
    MappedBatch mapped(state_->keys, keys);
    if (!mapped.complete()) return Status::OK();
    forwarded = true;
    return base->BatchGetIntoGroups(options, mapped.kept(), destinations, group_ends, on_ready,
                                    results);
  });
  if (forwarded || !s.ok()) return s;
  return DB::BatchGetIntoGroups(options, keys, destinations, group_ends, on_ready, results);
}

Status NamespaceView::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return Batch("BatchExists", keys, kNoOthers, false, results,
               [](DB* base, auto k, auto, auto r) { return base->BatchExists(k, r); });
}

Status NamespaceView::BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                                  std::vector<int64_t>* results) {
  return Batch("BatchDelete", keys, kNoOthers, false, results,
               [&](DB* base, auto k, auto, auto r) { return base->BatchDelete(options, k, r); });
}

Status NamespaceView::BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return Batch("BatchLocate", keys, kNoOthers, false, results,
               [](DB* base, auto k, auto, auto r) { return base->BatchLocate(k, r); });
}

Status NamespaceView::Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return Batch("Prefetch", keys, kNoOthers, false, results,
               [](DB* base, auto k, auto, auto r) { return base->Prefetch(k, r); });
}

Status NamespaceView::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
  // Checked on its own first: a pattern that does not compile (say, one that closes a
  // group it did not open) could otherwise escape the namespace's group.
  Status s = KeyPattern::Check(pattern);
  if (!s.ok()) return s;
  std::string inside;
  s = state_->keys.Pattern(pattern, &inside);
  if (!s.ok()) return s;
  return WithBase([&](DB* base) { return base->DeleteByRegex(inside, deleted); });
}

Status NamespaceView::DeleteAll(uint64_t* deleted) {
  return DeleteByRegex("[\\x00-\\xff]*", deleted);
}

Status NamespaceView::ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) {
  // The engine's feed numbers the namespace's events among its own (db/removal_feed.h).
  return WithBase([&](DB* /*base*/) {
    Status s = state_->removals->ReadNamespaceRemovals(state_->id, after, max_events, batch);
    if (s.ok()) FilterRemovals(state_->keys, batch);
    return s;
  });
}

Status NamespaceView::ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                                   ResidentSnapshot* snapshot) {
  return WithBase([&](DB* base) {
    return ReadNamespaceResident(state_->keys, state_->id, state_->removals, base,
                                 state_->keys.prefix() + prefix.ToString(), max_batch, batch,
                                 snapshot);
  });
}

Status NamespaceView::RegisterBuffer(void* addr, size_t length) {
  return WithBase([&](DB* base) { return base->RegisterBuffer(addr, length); });
}

Status NamespaceView::UnregisterBuffer(void* addr) {
  return WithBase([&](DB* base) { return base->UnregisterBuffer(addr); });
}

Status NamespaceView::Flush() {
  return WithBase([](DB* base) { return base->Flush(); });
}

Status NamespaceView::CompactBuckets(uint64_t* reclaimed_bytes) {
  return WithBase([&](DB* base) { return base->CompactBuckets(reclaimed_bytes); });
}

bool NamespaceView::GetProperty(const std::string& name, std::string* value) {
  if (name == "kvengine.namespace") {
    *value = state_->name;
    return true;
  }
  bool found = false;
  WithBase([&](DB* base) {
    found = base->GetProperty(name, value);
    return Status::OK();
  });
  return found;
}

Status NamespaceView::Guarded(const std::function<Status(const NamespaceKeys&)>& fn) {
  return WithBase([&](DB*) { return fn(state_->keys); });
}

Status NamespaceView::CreateNamespace(const std::string&, const NamespaceOptions&,
                                      std::unique_ptr<DB>* handle) {
  handle->reset();
  return Status::InvalidArgument("namespaces do not nest: create namespaces on the DB");
}

Status NamespaceView::OpenNamespace(const std::string&, std::unique_ptr<DB>* handle) {
  handle->reset();
  return Status::InvalidArgument("namespaces do not nest: open namespaces on the DB");
}

Status NamespaceView::DropNamespace(const std::string&, uint64_t*) {
  return Status::InvalidArgument("namespaces do not nest: drop namespaces on the DB");
}

Status NamespaceView::ListNamespaces(std::vector<NamespaceInfo>*) {
  return Status::InvalidArgument("namespaces do not nest: list namespaces on the DB");
}

}  // namespace kvengine
