#include "transport/get_answer.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "transport/wire.h"

namespace kvengine {

namespace {

// Up to this many keys, first mentions are found by comparing with each earlier key:
// cheaper than building a hash map for the handful of keys a typical GET names.
constexpr size_t kLinearDedupKeys = 16;

// first[i]: the index of key i's first mention.
void FirstMentions(std::span<const Slice> keys, std::vector<size_t>* first) {
  first->resize(keys.size());
  if (keys.size() <= kLinearDedupKeys) {
    for (size_t i = 0; i < keys.size(); i++) {
      size_t j = 0;
      while (keys[j] != keys[i]) j++;
      (*first)[i] = j;
    }
    return;
  }
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    (*first)[i] = seen.emplace(keys[i].view(), i).first->second;
  }
}

// A mention's result: its value's size when it fits the mention's capacity.
int64_t Fitted(int64_t size, uint64_t capacity) {
  if (size >= 0 && static_cast<uint64_t>(size) > capacity) {
    return Status::BufferTooSmall("").ErrorCode();
  }
  return size;
}

}  // namespace

bool GetAnswer::FromMemory(std::span<const Slice> keys, std::span<const uint64_t> capacity) {
  if (!Locate(keys, /*memory_only=*/true)) {
    pinned_.clear();  // unpinned now, not when the answer is dropped
    return false;
  }
  // Served from these pins whatever follows: counted once, as a worker counts its Pins.
  uint64_t values = 0, bytes = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    if (first_[i] != i) continue;
    values++;
    bytes += pinned_[i].size;
  }
  service_->ServedFromMemory(values, bytes);
  if (FitsOneFrame(capacity)) Assemble(capacity);
  return true;
}

void GetAnswer::Build(std::span<const Slice> keys, std::span<const uint64_t> capacity) {
  Locate(keys, /*memory_only=*/false);
  if (!FitsOneFrame(capacity)) return;
  ReadUnpinned(keys, capacity);
  if (FitsOneFrame(capacity)) Assemble(capacity);
}

bool GetAnswer::Locate(std::span<const Slice> keys, bool memory_only) {
  FirstMentions(keys, &first_);
  pinned_.assign(keys.size(), PinnedValue());
  size_.assign(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); i++) {
    if (first_[i] != i) continue;
    if (memory_only ? service_->TryPin(keys[i], &pinned_[i])
                    : service_->Pin(keys[i], &pinned_[i])) {
      size_[i] = static_cast<int64_t>(pinned_[i].size);
    } else if (memory_only) {
      return false;
    } else {
      uint64_t n = 0;
      Status s = service_->GetValueSize(keys[i], &n);
      size_[i] = s.ok() ? static_cast<int64_t>(n) : s.ErrorCode();
    }
  }
  return true;
}

void GetAnswer::ReadUnpinned(std::span<const Slice> keys, std::span<const uint64_t> capacity) {
  std::vector<uint64_t> room(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); i++) {
    room[first_[i]] = std::max(room[first_[i]], capacity[i]);
  }
  owned_.resize(keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    if (first_[i] != i || pinned_[i].pin != nullptr || size_[i] < 0) continue;
    size_[i] = ReadValue(keys[i], room[i], &owned_[i]);
  }
}

bool GetAnswer::FitsOneFrame(std::span<const uint64_t> capacity) {
  uint64_t answer = 0;
  for (size_t i = 0; i < first_.size(); i++) {
    const int64_t r = Fitted(size_[first_[i]], capacity[i]);
    if (r > 0) answer += static_cast<uint64_t>(r);
  }
  if (answer <= wire::kMaxBodyLen) return true;
  meta_.clear();
  wire::PutBatchStatus(&meta_, Status::InvalidArgument("get answer of " + std::to_string(answer) +
                                                       " bytes exceeds the frame limit of " +
                                                       std::to_string(wire::kMaxBodyLen) +
                                                       " bytes: split the batch"));
  wire::PutResults(&meta_, std::vector<int64_t>());
  body_.clear();
  return false;
}

void GetAnswer::Assemble(std::span<const uint64_t> capacity) {
  std::vector<int64_t> results(first_.size());
  body_.clear();
  for (size_t i = 0; i < first_.size(); i++) {
    const size_t f = first_[i];
    results[i] = Fitted(size_[f], capacity[i]);
    if (results[i] < 0) continue;
    const char* data = pinned_[f].pin != nullptr ? pinned_[f].data : owned_[f].get();
    body_.emplace_back(data, static_cast<size_t>(results[i]));
  }
  meta_.clear();
  wire::PutBatchStatus(&meta_, Status::OK());
  wire::PutResults(&meta_, results);
}

// Reads key's value (from a tier other than memory) into *buf when it fits `room`;
// returns its size or a negative code.  Retried when it grows under us.
int64_t GetAnswer::ReadValue(const Slice& key, uint64_t room, std::unique_ptr<char[]>* buf) {
  int64_t r = Status::NotFound("").ErrorCode();
  for (int attempt = 0; attempt < 4; attempt++) {
    uint64_t size = 0;
    Status s = service_->GetValueSize(key, &size);
    if (!s.ok()) return s.ErrorCode();
    if (size > room) return Status::BufferTooSmall("").ErrorCode();
    buf->reset(new char[size > 0 ? size : 1]);
    std::vector<Destination> dest(1);
    dest[0].emplace_back(buf->get(), size);
    std::vector<int64_t> one;
    s = service_->BatchGetInto(std::span<const Slice>(&key, 1), dest, &one);
    r = s.ok() ? one[0] : s.ErrorCode();
    if (r != Status::BufferTooSmall("").ErrorCode()) break;  // else it grew: again
  }
  if (r < 0) buf->reset();
  return r;
}

}  // namespace kvengine
