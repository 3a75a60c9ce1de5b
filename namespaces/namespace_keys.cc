#include "namespaces/namespace_keys.h"

#include <algorithm>

#include "util/input_check.h"
#include "util/namespace_key.h"

namespace kvengine {

NamespaceKeys::NamespaceKeys(uint64_t id, uint64_t max_key_size)
    : prefix_(ns::Prefix(id)), id_(id), max_key_size_(max_key_size) {}

Status NamespaceKeys::ToInternal(const Slice& key, std::string* internal) const {
  if (is_default()) return input::CheckDefaultNamespaceKey(key);
  Status s = input::CheckNamespacedKey(key, max_key_size_);
  if (!s.ok()) return s;
  internal->reserve(prefix_.size() + key.size());
  internal->assign(prefix_);
  internal->append(key.data(), key.size());
  return Status::OK();
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
  kept_.reserve(keys.size());
  if (!rule.is_default()) storage_.resize(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    std::string* internal = rule.is_default() ? nullptr : &storage_[i];
    Status s = rule.ToInternal(keys[i], internal);
    if (!s.ok()) {
      if (refused_.empty()) refused_.assign(keys.size(), 0);
      refused_[i] = s.ErrorCode();
      complete_ = false;
      continue;
    }
    kept_.push_back(rule.is_default() ? keys[i] : Slice(*internal));
    index_.push_back(i);
  }
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

}  // namespace kvengine
