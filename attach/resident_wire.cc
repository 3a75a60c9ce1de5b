#include "attach/resident_wire.h"

#include "util/coding.h"

namespace kvengine {
namespace wire {

namespace {
constexpr uint8_t kAnswerEnd = 0;
constexpr uint8_t kAnswerKeys = 1;
}  // namespace

void PutResidentStart(std::string* dst, std::string_view prefix, uint64_t max_batch) {
  dst->push_back(static_cast<char>(kResidentStart));
  PutLengthPrefixed(dst, prefix);
  PutFixed64(dst, max_batch);
}

void PutResidentStep(std::string* dst, ResidentStep step) {
  dst->push_back(static_cast<char>(step));
}

bool GetResidentRequest(std::string_view* in, ResidentStep* step, std::string_view* prefix,
                        uint64_t* max_batch) {
  if (in->empty()) return false;
  const uint8_t first = static_cast<uint8_t>(in->front());
  in->remove_prefix(1);
  switch (first) {
    case kResidentStart:
      *step = kResidentStart;
      return GetLengthPrefixed(in, prefix) && GetFixed64(in, max_batch) && in->empty();
    case kResidentNext:
    case kResidentStop:
      *step = static_cast<ResidentStep>(first);
      return in->empty();
    default:
      return false;
  }
}

uint64_t ResidentKeyBytes(const ResidentKey& key) { return 1 + 10 + key.key.size(); }

void PutResidentKeys(std::string* dst, std::span<const ResidentKey> keys) {
  dst->push_back(static_cast<char>(kAnswerKeys));
  PutFixed32(dst, static_cast<uint32_t>(keys.size()));
  for (const ResidentKey& k : keys) {
    dst->push_back(static_cast<char>(k.tier));
    PutLengthPrefixed(dst, k.key);
  }
}

void PutResidentEnd(std::string* dst, const ResidentSnapshot& snapshot) {
  dst->push_back(static_cast<char>(kAnswerEnd));
  PutFixed64(dst, snapshot.epoch);
  PutFixed64(dst, snapshot.removal_sequence);
  PutFixed64(dst, snapshot.keys);
}

bool GetResidentAnswer(std::string_view* in, bool* end, std::vector<ResidentKey>* keys,
                       ResidentSnapshot* snapshot) {
  if (in->empty()) return false;
  const uint8_t kind = static_cast<uint8_t>(in->front());
  in->remove_prefix(1);
  keys->clear();
  if (kind == kAnswerEnd) {
    *end = true;
    return GetFixed64(in, &snapshot->epoch) && GetFixed64(in, &snapshot->removal_sequence) &&
           GetFixed64(in, &snapshot->keys) && in->empty();
  }
  if (kind != kAnswerKeys) return false;
  *end = false;
  uint32_t count = 0;
  // Each key takes at least two bytes: a count past what the bytes can hold is malformed
  // (and reserves nothing).
  if (!GetFixed32(in, &count) || count > in->size() / 2) return false;
  keys->reserve(count);
  for (uint32_t i = 0; i < count; i++) {
    if (in->empty()) return false;
    const uint8_t tier = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    std::string_view key;
    if ((tier != kLocatedMemory && tier != kLocatedSsd) || !GetLengthPrefixed(in, &key)) {
      return false;
    }
    keys->push_back(ResidentKey{std::string(key), static_cast<LocatedTier>(tier)});
  }
  return in->empty();
}

}  // namespace wire
}  // namespace kvengine
