#include "namespaces/namespace_keys.h"

#include <algorithm>
#include <cstring>

#include "db/removal_feed.h"
#include "util/input_check.h"
#include "util/namespace_key.h"
#include "util/printable.h"

namespace kvengine {

NamespaceKeys::NamespaceKeys(uint64_t id, uint64_t max_key_size)
    : prefix_(ns::Prefix(id)), id_(id), max_key_size_(max_key_size) {
  const uint64_t limit = max_key_size > ns::kPrefixSize ? max_key_size - ns::kPrefixSize : 0;
  short_key_limit_ = std::min<uint64_t>(limit, PrefixedKey::kInlineKey);
  quoted_prefix_ = Printable(prefix_);
  quoted_prefix_.pop_back();  // the closing quote: a key follows
}

void PrefixedKey::Assign(const char* prefix, const Slice& key) {
  char* out = inline_;
  if (ns::kPrefixSize + key.size() > sizeof(inline_)) {
    heap_ = std::make_unique_for_overwrite<char[]>(ns::kPrefixSize + key.size());
    out = heap_.get();
  }
  slice_ = Slice(out, WritePrefixed(out, prefix, key));
}

Status NamespaceKeys::Check(const Slice& key) const {
  return is_default() ? input::CheckDefaultNamespaceKey(key)
                      : input::CheckNamespacedKey(key, max_key_size_);
}

Status NamespaceKeys::ToInternalSlow(const Slice& key, PrefixedKey* internal) const {
  Status s = Check(key);
  if (s.ok()) internal->Assign(prefix_.data(), key);
  return s;
}

Status NamespaceKeys::NameUserKey(Status s, const Slice& key, const std::string& name) const {
  if (s.ok() || is_default()) return s;
  const std::string& message = s.message();
  // The engine's miss of a namespaced key comes bare (DBImpl::Missing): named here once.
  if (s.IsNotFound() && message.empty()) return KeyNotFound(key, name);
  // Any other error naming the key (a buffer too small, a peer's answer): this finds the
  // internal key by its quoted prefix and its closing quote (Printable escapes every
  // quote inside), checks that what lies between shows this key, and keeps those bytes
  // as the user's key is shown: no key printed again, one string built.
  const size_t at = message.find(quoted_prefix_);
  if (at == std::string::npos) return s;
  const size_t rest = at + quoted_prefix_.size();
  const size_t end = message.find('\'', rest);
  if (end == std::string::npos) return s;
  constexpr std::string_view kBefore = " (namespace ";
  std::string named;
  named.reserve(message.size() + kBefore.size() + name.size() + 2);
  if (prefix_.size() + key.size() <= kPrintableKeyBytes) {
    const std::string_view shown(message.data() + rest, end - rest);
    if (!ShowsWholeKey(shown, key)) return s;
    named.append(message, 0, at).append("'").append(shown).append("'");
  } else {  // the prefix pushed some of the key past the bytes Printable shows
    // Shown with its length and hash, past the closing quote: the user's key's instead.
    const std::string stored = Printable(Slice(prefix_ + key.ToString()));
    if (message.compare(at, stored.size(), stored) != 0) return s;
    named.append(message, 0, at).append(Printable(key));
    named.append(kBefore).append(name).append(")").append(message, at + stored.size());
    return Status::FromErrorCode(s.ErrorCode(), named);
  }
  named.append(kBefore).append(name).append(")").append(message, end + 1);
  return Status::FromErrorCode(s.ErrorCode(), named);
}

bool NamespaceKeys::FromInternal(const std::string& internal, std::string* key) const {
  if (is_default()) {
    if (ns::IsNamespaced(internal)) return false;
    *key = internal;
    return true;
  }
  if (!internal.starts_with(prefix_)) return false;
  key->assign(internal, prefix_.size());
  return true;
}

Status NamespaceKeys::Pattern(const std::string& user_pattern, std::string* pattern) const {
  if (!is_default()) return ns::PatternInNamespace(id_, user_pattern, pattern);
  *pattern = ns::PatternInDefault(user_pattern);
  return Status::OK();
}

MappedBatch::MappedBatch(const NamespaceKeys& rule, std::span<const Slice> keys) : original_(keys) {
  if (rule.is_default() && std::none_of(keys.begin(), keys.end(), [](const Slice& k) {
        return k.data() != nullptr && ns::IsNamespaced(std::string_view(k.data(), k.size()));
      })) {
    passthrough_ = true;  // the common case: nothing to map, nothing refused
    return;
  }
  if (!rule.is_default() && MapShort(rule, keys)) return;
  kept_.reserve(keys.size());
  index_.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    Status s = rule.Check(keys[i]);
    if (!s.ok()) {
      if (refused_.empty()) refused_.assign(keys.size(), 0);
      refused_[i] = s.ErrorCode();
      complete_ = false;
      continue;
    }
    index_.push_back(i);
  }
  if (rule.is_default()) {
    for (size_t i : index_) kept_.push_back(keys[i]);
    return;
  }
  size_t total = 0;
  for (size_t i : index_) total += ns::kPrefixSize + keys[i].size();
  storage_.reset(new char[total]);
  char* at = storage_.get();
  for (size_t i : index_) {
    kept_.emplace_back(at, WritePrefixed(at, rule.prefix().data(), keys[i]));
    at += kept_.back().size();
  }
}

bool MappedBatch::MapShort(const NamespaceKeys& rule, std::span<const Slice> keys) {
  // A vLLM request's 32 keys pass here: one pass to size the buffer, one to fill it,
  // and no call per key.
  size_t total = 0;
  for (const Slice& key : keys) {
    if (!rule.IsShort(key)) return false;
    total += ns::kPrefixSize + key.size();
  }
  storage_.reset(new char[total]);
  kept_.reserve(keys.size());
  char* at = storage_.get();
  for (const Slice& key : keys) {
    kept_.emplace_back(at, WritePrefixed(at, rule.prefix().data(), key));
    at += kept_.back().size();
  }
  return true;  // every key kept, in order: index_ is not needed
}

void MappedBatch::Merge(const std::vector<int64_t>& sub, std::vector<int64_t>* results) const {
  results->assign(refused_.begin(), refused_.end());
  for (size_t j = 0; j < index_.size() && j < sub.size(); j++) (*results)[index_[j]] = sub[j];
}

void FilterRemovals(const NamespaceKeys& rule, RemovalBatch* batch) {
  std::vector<RemovalEvent> kept;
  kept.reserve(batch->events.size());
  for (RemovalEvent& e : batch->events) {
    std::string key;
    if (!rule.FromInternal(e.key, &key)) continue;
    e.key = std::move(key);
    kept.push_back(std::move(e));
  }
  batch->events = std::move(kept);
}

Status ReadNamespaceResident(const NamespaceKeys& rule, uint64_t id, NamespaceRemovals* removals,
                             DB* base, const std::string& internal_prefix, size_t max_batch,
                             const DB::ResidentFn& batch, ResidentSnapshot* snapshot) {
  if (snapshot == nullptr || !batch) {
    return Status::InvalidArgument("ReadResident: snapshot or batch is null");
  }
  RemovalBatch newest;
  const bool feed = removals->ReadNamespaceRemovals(id, 0, 0, &newest).ok();
  uint64_t reported = 0;
  std::vector<ResidentKey> mine;
  Status s = base->ReadResident(
      internal_prefix, max_batch,
      [&](std::span<const ResidentKey> keys) {
        mine.clear();
        for (const ResidentKey& k : keys) {
          ResidentKey user{std::string(), k.tier};
          if (rule.FromInternal(k.key, &user.key)) mine.push_back(std::move(user));
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

}  // namespace kvengine
