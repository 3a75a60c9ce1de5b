// NamespaceKeys: the rule that turns the keys a namespace's user gives into the keys the
// DB below stores (util/namespace_key.h), and RunBatch, which runs a batch call on the
// keys the rule accepts and answers the refused ones with their error.
//
// Both the default namespace (NamespaceDB: keys pass as they are, once checked) and a
// namespace's handle (NamespaceView: keys gain the namespace's prefix) go through it, so
// a refused key fails that key only, as db.h promises, in either.
//
// Thread-safety: immutable after construction.
#ifndef KVENGINE_NAMESPACES_NAMESPACE_KEYS_H_
#define KVENGINE_NAMESPACES_NAMESPACE_KEYS_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/input_check.h"
#include "util/namespace_key.h"

namespace kvengine {

class NamespaceRemovals;

// Writes a namespace's `prefix` (ns::kPrefixSize bytes) and then `key` at `out`: a
// key's internal form.  Two copies, one of a size known here.  Returns the bytes
// written.  REQUIRES: key is not null (a checked key).
inline size_t WritePrefixed(char* out, const char* prefix, const Slice& key) {
  std::memcpy(out, prefix, ns::kPrefixSize);
  std::memcpy(out + ns::kPrefixSize, key.data(), key.size());
  return ns::kPrefixSize + key.size();
}

// A key with its namespace's prefix: in the object itself when short (the usual case: no
// allocation per call), on the heap otherwise.
class PrefixedKey {
 public:
  PrefixedKey() = default;
  PrefixedKey(const PrefixedKey&) = delete;
  PrefixedKey& operator=(const PrefixedKey&) = delete;
  // REQUIRES: as WritePrefixed.
  void Assign(const char* prefix, const Slice& key);
  // The same for a key known to fit inline (kInlineKey), on the path of every call of a
  // namespace's handle.
  void AssignShort(const char* prefix, const Slice& key) {
    slice_ = Slice(inline_, WritePrefixed(inline_, prefix, key));
  }
  static constexpr size_t kInlineKey = 128 - ns::kPrefixSize;  // the key AssignShort takes
  Slice slice() const { return slice_; }

 private:
  char inline_[128];
  std::unique_ptr<char[]> heap_;  // null unless the key did not fit inline_
  Slice slice_;
};

class NamespaceKeys {
 public:
  // The default namespace's rule: a key passes as it is unless it is namespaced.
  NamespaceKeys() = default;
  // Namespace `id`'s rule: a key gains its prefix, and may be max_key_size less it long.
  NamespaceKeys(uint64_t id, uint64_t max_key_size);

  bool is_default() const { return prefix_.empty(); }
  const std::string& prefix() const { return prefix_; }

  // Checks `key` as a key given to this namespace.
  Status Check(const Slice& key) const;
  // Checks `key` and stores its internal form in *internal.
  Status ToInternal(const Slice& key, PrefixedKey* internal) const {
    // The usual key takes the inline path; every other goes through Check, which says
    // what is wrong with it.
    if (IsShort(key)) {
      internal->AssignShort(prefix_.data(), key);
      return Status::OK();
    }
    return ToInternalSlow(key, internal);
  }
  // Whether `key` is a usual one of a namespace -- not empty, not null, within the limit
  // and short (PrefixedKey::kInlineKey) -- which needs no other check.  Never for the
  // default namespace.
  bool IsShort(const Slice& key) const {
    return key.size() - 1 < short_key_limit_ && key.data() != nullptr;
  }
  // Whether an internal key belongs here; stores the key as this namespace's user sees it.
  bool FromInternal(const std::string& internal, std::string* key) const;
  // Stores in *pattern the DeleteByRegex pattern for a user's pattern (InvalidArgument
  // for the few a namespace cannot carry: util/namespace_key.h).  REQUIRES: it compiled
  // on its own.
  Status Pattern(const std::string& user_pattern, std::string* pattern) const;
  // The layers below name a key as they store it (Printable: quoted, prefix and all): a
  // status of a call on `key` that names its internal form comes back naming `key` as
  // the namespace's user gave it, and the namespace `name`; any other status as it is.
  Status NameUserKey(Status s, const Slice& key, const std::string& name) const;

 private:
  Status ToInternalSlow(const Slice& key, PrefixedKey* internal) const;

  std::string prefix_;
  // A namespace's keys of 1 to short_key_limit_ bytes pass ToInternal's inline path: the
  // smaller of its limit and PrefixedKey::kInlineKey (0 for the default namespace, whose
  // keys never come here).
  uint64_t short_key_limit_ = 0;
  std::string quoted_prefix_;  // how Printable begins an internal key of this namespace
  uint64_t id_ = 0;
  uint64_t max_key_size_ = 0;
};

// A batch's keys as the DB below sees them, those the rule refuses left out.
class MappedBatch {
 public:
  MappedBatch(const NamespaceKeys& rule, std::span<const Slice> keys);
  MappedBatch(const MappedBatch&) = delete;  // kept() points into storage_
  MappedBatch& operator=(const MappedBatch&) = delete;
  // Whether every key was accepted (then kept()[i] is keys[i]'s internal form).
  bool complete() const { return complete_; }
  // The keys for the DB below: the batch's own when the rule is the default namespace's
  // and every key passed (no copy on that path).
  std::span<const Slice> kept() const { return passthrough_ ? original_ : kept_; }
  // The entries of `all` (one per key of the batch) of the keys kept, in order.
  template <class T>
  std::vector<T> Select(std::span<const T> all) const {
    std::vector<T> out;
    if (all.empty()) return out;
    out.reserve(index_.size());
    for (size_t i : index_) out.push_back(all[i]);
    return out;
  }
  // The whole batch's results: the kept keys' (`sub`, in order) and the refused keys' codes.
  void Merge(const std::vector<int64_t>& sub, std::vector<int64_t>* results) const;

 private:
  const std::span<const Slice> original_;
  bool passthrough_ = false;
  bool complete_ = true;
  // Maps a batch of short keys (NamespaceKeys::IsShort) of a namespace; false, with
  // nothing done, when one is not.
  bool MapShort(const NamespaceKeys& rule, std::span<const Slice> keys);

  std::unique_ptr<char[]> storage_;  // the internal forms, one after another (a namespace's)
  std::vector<Slice> kept_;
  std::vector<size_t> index_;     // index_[j]: the batch position of kept_[j] (when !complete_)
  std::vector<int64_t> refused_;  // per batch position: 0 or the key's error code
};

// Runs `call(keys, others, results)` (a batch call of the DB below) on the keys `rule`
// accepts, with their entries of `others` (values, destinations; empty for calls without),
// and stores in *results the whole batch's: the refused keys fail with their error.
// The batch's own checks (lists of equal size, results not null) come first; a batch that
// fails them goes down as it is, to be refused there.
template <class T, class Call>
Status RunBatch(const char* name, const NamespaceKeys& rule, std::span<const Slice> keys,
                std::span<const T> others, bool has_others, std::vector<int64_t>* results,
                Call call) {
  Status s = input::CheckBatch(name, results, keys.size(), has_others ? others.size() : keys.size(),
                               has_others ? "values or destinations" : "keys", 0);
  if (!s.ok()) {
    // Malformed as a whole: the DB below refuses it too (db.h: nothing changes), and
    // counts and logs the refusal as it does every other.
    Status below = call(keys, others, results);
    return below.ok() ? s : below;
  }
  MappedBatch mapped(rule, keys);
  if (mapped.complete()) return call(mapped.kept(), others, results);
  const std::vector<T> picked = mapped.Select(others);
  std::vector<int64_t> sub;
  if (!mapped.kept().empty()) {
    s = call(mapped.kept(), std::span<const T>(picked), &sub);
    if (!s.ok()) {
      results->clear();
      return s;
    }
  }
  mapped.Merge(sub, results);
  return Status::OK();
}

// The events of `batch` that belong to `rule`'s namespace, their keys as its user sees
// them (the removal feed is the whole DB's: each namespace reads its own part of it).
void FilterRemovals(const NamespaceKeys& rule, RemovalBatch* batch);

// DB::ReadResident of namespace `id` (0: the default one), whose rule is `rule` and
// whose events `removals` numbers: the walk of `base` (the DB below the namespaces) over
// the keys starting with `internal_prefix`, the namespace's passed to `batch` as its user
// names them, and the removal sequence in the namespace's own numbering, read before the
// walk begins (so that the snapshot and the namespace's feed after it are exact).
Status ReadNamespaceResident(const NamespaceKeys& rule, uint64_t id, NamespaceRemovals* removals,
                             DB* base, const std::string& internal_prefix, size_t max_batch,
                             const DB::ResidentFn& batch, ResidentSnapshot* snapshot);

}  // namespace kvengine

#endif  // KVENGINE_NAMESPACES_NAMESPACE_KEYS_H_
