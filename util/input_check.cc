#include "util/input_check.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/config_parse.h"
#include "util/hash.h"
#include "util/namespace_key.h"
#include "util/printable.h"

namespace kvengine::input {

Status CheckKey(const Slice& key, uint64_t max_key_size) {
  if (key.size() == 0) return Status::InvalidArgument("key is empty");
  if (key.data() == nullptr) return Status::InvalidArgument("key is a null pointer");
  if (key.size() > max_key_size) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes exceeds max_key_size (" + std::to_string(max_key_size) +
                                   "): " + Printable(key));
  }
  return Status::OK();
}

Status CheckDefaultNamespaceKey(const Slice& key) {
  // (A null key is CheckKey's to refuse.)
  if (key.data() == nullptr || !ns::IsNamespaced(std::string_view(key.data(), key.size()))) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      "key " + Printable(key) +
      " starts with byte 0xfe, which the default namespace refuses: keys of that byte belong to "
      "namespaces (DB::CreateNamespace; docs/namespace_format.md)");
}

Status CheckNamespacedKey(const Slice& key, uint64_t max_key_size) {
  const uint64_t limit = max_key_size > ns::kPrefixSize ? max_key_size - ns::kPrefixSize : 0;
  if (key.size() > limit) {
    return Status::InvalidArgument(
        "key of " + std::to_string(key.size()) + " bytes exceeds a namespace's limit of " +
        std::to_string(limit) + " (max_key_size less the " + std::to_string(ns::kPrefixSize) +
        "-byte namespace prefix): " + Printable(key));
  }
  return CheckKey(key, limit);
}

namespace {
// The rule of namespace and tenant names: 1 to 64 bytes of letters, digits, '.', '_', '-'.
Status CheckName(const char* what, std::string_view name) {
  const auto allowed = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  };
  if (name.empty() || name.size() > kMaxNameBytes) {
    return Status::InvalidArgument(std::string(what) + " name of " + std::to_string(name.size()) +
                                   " bytes: a name is 1 to 64 bytes");
  }
  for (char c : name) {
    if (!allowed(c)) {
      return Status::InvalidArgument(std::string(what) + " name " +
                                     Printable(Slice(name.data(), name.size())) +
                                     ": only letters, digits, '.', '_' and '-' are allowed");
    }
  }
  return Status::OK();
}
}  // namespace

Status CheckNamespaceName(std::string_view name) {
  Status s = CheckName("namespace", name);
  if (!s.ok()) return s;
  if (name == "default") {
    return Status::InvalidArgument(
        "namespace name 'default' is reserved: it names the namespace of the calls without one");
  }
  return Status::OK();
}

Status CheckTenantName(std::string_view name) { return CheckName("tenant", name); }

Status CheckValueSize(const Slice& key, uint64_t size, uint64_t max_value_size) {
  if (size > max_value_size) {
    return Status::InvalidArgument("value of key " + Printable(key) + " exceeds max_value_size (" +
                                   FormatSize(max_value_size) + ")");
  }
  return Status::OK();
}

Status CheckBatch(const char* call, const void* results, size_t keys, size_t others,
                  const char* what, uint64_t max_batch_size) {
  if (results == nullptr)
    return Status::InvalidArgument(std::string(call) + ": results pointer is null");
  if (keys != others) {
    return Status::InvalidArgument("batch has " + std::to_string(keys) + " keys but " +
                                   std::to_string(others) + " " + what);
  }
  if (max_batch_size != 0 && keys > max_batch_size) {
    return Status::InvalidArgument("batch of " + std::to_string(keys) +
                                   " keys exceeds max_batch_size (" +
                                   std::to_string(max_batch_size) + ")");
  }
  return Status::OK();
}

namespace {

Status CheckGroupEnds(std::span<const size_t> group_ends, size_t keys) {
  if (group_ends.empty()) {
    if (keys == 0) return Status::OK();
    return Status::InvalidArgument("BatchGetIntoGroups: " + std::to_string(keys) +
                                   " keys but no groups");
  }
  size_t last = 0;
  for (size_t g = 0; g < group_ends.size(); g++) {
    if (group_ends[g] < last || group_ends[g] > keys) {
      return Status::InvalidArgument("BatchGetIntoGroups: group " + std::to_string(g) +
                                     " ends at " + std::to_string(group_ends[g]) +
                                     ", before the group ahead of it or past the " +
                                     std::to_string(keys) + " keys");
    }
    last = group_ends[g];
  }
  if (last != keys) {
    return Status::InvalidArgument("BatchGetIntoGroups: the last group ends at " +
                                   std::to_string(last) + ", not at the " + std::to_string(keys) +
                                   " keys");
  }
  return Status::OK();
}

}  // namespace

Status CheckGroupedBatch(std::vector<int64_t>* results, size_t keys, size_t destinations,
                         std::span<const size_t> group_ends) {
  Status s = CheckBatch("BatchGetIntoGroups", results, keys, destinations, "destinations", 0);
  if (s.ok()) s = CheckGroupEnds(group_ends, keys);
  if (!s.ok() && results != nullptr) results->clear();
  return s;
}

Status CheckUniqueKeys(std::span<const Slice> keys) {
  if (keys.size() < 2) return Status::OK();
  // An open-addressed table of the keys' positions, at most half full, on the stack for
  // batches of up to 128 keys (a vLLM request's layers): every BatchPut pays this check
  // (a namespace's once: its handle leaves it to the DB below unless it refused a key
  // itself), and a node-based set's allocation per key cost a 32-key put of 16 KiB
  // values about 6% of its CPU time.
  constexpr size_t kStackSlots = 256;
  size_t slots = 4;
  while (slots < keys.size() * 2) slots <<= 1;
  uint32_t stack[kStackSlots];
  std::vector<uint32_t> heap;
  uint32_t* table = stack;
  if (slots > kStackSlots) {
    heap.resize(slots);
    table = heap.data();
  }
  constexpr uint32_t kEmpty = UINT32_MAX;  // a batch has fewer keys than this (16 B each)
  std::fill_n(table, slots, kEmpty);
  for (size_t i = 0; i < keys.size(); i++) {
    const std::string_view key = keys[i].view();
    for (size_t at = Hash64(key) & (slots - 1);; at = (at + 1) & (slots - 1)) {
      if (table[at] == kEmpty) {
        table[at] = static_cast<uint32_t>(i);
        break;
      }
      if (keys[table[at]].view() == key) {
        return Status::InvalidArgument("BatchPut names key " + Printable(keys[i]) +
                                       " more than once; nothing was written");
      }
    }
  }
  return Status::OK();
}

Status CheckRegion(const void* addr, size_t length) {
  if (addr == nullptr) return Status::InvalidArgument("address is null");
  if (length == 0) return Status::InvalidArgument("length is zero");
  const auto start = reinterpret_cast<uintptr_t>(addr);
  if (start + length < start) return Status::InvalidArgument("range wraps around");
  return Status::OK();
}

}  // namespace kvengine::input
