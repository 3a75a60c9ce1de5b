#include "db/ssd_index.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "table/bucket_format.h"
#include "util/hash.h"
#include "util/huge_array.h"

namespace kvengine {

namespace {
constexpr uint64_t kUnit = kValueUnit;  // value offsets are multiples of this
// A shard grows past this load and is resized to about kTargetLoad.
constexpr double kMaxLoad = 0.92;
constexpr double kGrowth = 1.1;
// A shard shrinks under this load (deletes give memory back).
constexpr double kMinLoad = 0.5;
constexpr uint64_t kMinCapacity = 4;
}  // namespace

KeyFingerprint KeyFingerprint::Of(std::string_view key) {
  const Hash128Value h = Hash128(key.data(), key.size());
  KeyFingerprint f{h.low, h.high};
  if (f.low == 0 && f.high == 0) f.low = 1;
  return f;
}

struct SsdIndex::Slot {
  KeyFingerprint key;  // all-zero: empty
  uint64_t version;
  uint32_t bucket;
  uint32_t offset_units;
  uint32_t size;
  uint32_t checksum;

  bool empty() const { return key.low == 0 && key.high == 0; }
};

struct SsdIndex::Shard {
  static_assert(sizeof(Slot) == kSlotBytes);
  HugeArray<Slot> slots;
  uint64_t capacity = 0;
  uint64_t count = 0;

  // The slot a key would take in an empty table.  The shard was chosen by the top bits
  // of `low`; `high` places the key within it.
  uint64_t Home(const KeyFingerprint& key) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(key.high) * capacity) >> 64);
  }
  uint64_t Distance(uint64_t pos) const {
    const uint64_t home = Home(slots[pos].key);
    return pos >= home ? pos - home : pos + capacity - home;
  }
  uint64_t Next(uint64_t pos) const { return pos + 1 == capacity ? 0 : pos + 1; }

  // The position holding key, or capacity when absent.
  uint64_t FindPos(const KeyFingerprint& key) const {
    if (capacity == 0) return capacity;
    uint64_t pos = Home(key);
    for (uint64_t dist = 0;; dist++) {
      const Slot& s = slots[pos];
      if (s.empty()) return capacity;
      if (s.key == key) return pos;
      // Robin Hood: every key between its home and here is at least as far from home as
      // the sought one would be; a nearer one means it is not in the table.
      if (Distance(pos) < dist) return capacity;
      pos = Next(pos);
    }
  }

  // REQUIRES: key absent and a free slot.
  void InsertNew(Slot slot) {
    uint64_t pos = Home(slot.key);
    for (uint64_t dist = 0;; dist++) {
      Slot& s = slots[pos];
      if (s.empty()) {
        s = slot;
        count++;
        return;
      }
      const uint64_t d = Distance(pos);
      if (d < dist) {  // take the place of the key nearer its home, carry it on
        std::swap(s, slot);
        dist = d;
      }
      pos = Next(pos);
    }
  }

  void EraseAt(uint64_t pos) {
    // Backward shift: pull the following keys one step nearer their home.
    for (uint64_t next = Next(pos);; next = Next(next)) {
      if (slots[next].empty() || Distance(next) == 0) break;
      slots[pos] = slots[next];
      pos = next;
    }
    slots[pos] = Slot{};
    count--;
  }

  // Whether the slots (filled from a file) hold `expected` keys, each of shard `index`
  // and lying where InsertNew and EraseAt keep keys, so that FindPos finds it: along a
  // run of full slots the homes never decrease (a key is at most one step farther from
  // its home than the key before it, and at its home after an empty slot), and no key
  // is there twice (the same key has the same home, so an earlier copy would be among
  // the keys sharing that home just before it).  Refused too, though Put never leaves
  // them: a shard with no empty slot (it grows first), and more than kMaxSameHome keys
  // sharing a home (at these loads a chance under 1e-90 a home; the limit keeps this
  // check linear whatever a file holds).  One pass, from an empty slot.
  static constexpr uint64_t kMaxSameHome = 64;
  bool HoldsAsInserted(size_t index, uint64_t expected) const {
    if (capacity == 0) return expected == 0;
    uint64_t pos = 0;
    while (!slots[pos].empty()) {
      if (++pos == capacity) return false;
    }
    // The distance of the key before pos, plus one; 0 after an empty slot.  (No branches
    // on what the keys hold: they would be mispredicted half the time.)
    uint64_t prev_plus_one = 0;
    uint64_t run = 0;  // the keys before pos sharing its home
    uint64_t found = 0;
    bool wrong = false;
    for (uint64_t i = 0; i < capacity; i++, pos = Next(pos)) {
      const Slot& slot = slots[pos];
      if (slot.empty()) {
        prev_plus_one = 0;
        continue;
      }
      found++;
      wrong |= (slot.key.low >> (64 - kShardBits)) != index;
      const uint64_t distance = Distance(pos);
      wrong |= distance > prev_plus_one;
      run = distance != 0 && distance == prev_plus_one ? run + 1 : 0;
      if (run > kMaxSameHome) return false;
      for (uint64_t back = 0, q = pos; back < run; back++) {
        q = q == 0 ? capacity - 1 : q - 1;
        wrong |= slots[q].key == slot.key;
      }
      prev_plus_one = distance + 1;
    }
    return !wrong && found == expected;
  }

  void Resize(uint64_t new_capacity) {
    HugeArray<Slot> old = std::move(slots);
    const uint64_t old_capacity = capacity;
    capacity = new_capacity;
    count = 0;
    if (capacity == 0) return;                   // everything dropped
    slots = NewZeroedHugeArray<Slot>(capacity);  // zeroed: empty
    for (uint64_t i = 0; i < old_capacity; i++) {
      if (!old[i].empty()) InsertNew(old[i]);
    }
  }

  void ReserveFor(uint64_t n) {
    if (static_cast<double>(n) <= kMaxLoad * static_cast<double>(capacity)) return;
    uint64_t target = std::max<uint64_t>(
        kMinCapacity, static_cast<uint64_t>(static_cast<double>(n) * kGrowth / kMaxLoad) + 1);
    // Growing by at least kGrowth keeps the work of repeated growth linear.
    target = std::max<uint64_t>(target, static_cast<uint64_t>(capacity * kGrowth) + 1);
    Resize(target);
  }

  void MaybeShrink() {
    if (count == 0 && capacity > 0) {  // an empty shard holds nothing
      Resize(0);
      return;
    }
    if (capacity <= kMinCapacity ||
        static_cast<double>(count) >= kMinLoad * static_cast<double>(capacity)) {
      return;
    }
    const uint64_t target =
        count == 0 ? 0 : std::max<uint64_t>(kMinCapacity, static_cast<uint64_t>(count / 0.85) + 1);
    Resize(target);
  }
};

SsdIndex::SsdIndex() : shards_(std::make_unique<Shard[]>(kShards)) {}
SsdIndex::~SsdIndex() = default;

SsdIndex::Shard& SsdIndex::ShardOf(const KeyFingerprint& key) {
  return shards_[key.low >> (64 - kShardBits)];
}
const SsdIndex::Shard& SsdIndex::ShardOf(const KeyFingerprint& key) const {
  return shards_[key.low >> (64 - kShardBits)];
}

bool SsdIndex::Fits(const SsdLocation& l) {
  return l.bucket <= UINT32_MAX && l.offset % kUnit == 0 && l.offset / kUnit <= UINT32_MAX &&
         l.size <= UINT32_MAX;
}

bool SsdIndex::Find(const KeyFingerprint& key, SsdLocation* location) const {
  const Shard& shard = ShardOf(key);
  const uint64_t pos = shard.FindPos(key);
  if (pos == shard.capacity) return false;
  const Slot& s = shard.slots[pos];
  location->bucket = s.bucket;
  location->offset = uint64_t{s.offset_units} * kUnit;
  location->size = s.size;
  location->version = s.version;
  location->checksum = s.checksum;
  return true;
}

bool SsdIndex::Put(const KeyFingerprint& key, const SsdLocation& l) {
  Slot slot{};
  slot.key = key;
  slot.version = l.version;
  slot.bucket = static_cast<uint32_t>(l.bucket);
  slot.offset_units = static_cast<uint32_t>(l.offset / kUnit);
  slot.size = static_cast<uint32_t>(l.size);
  slot.checksum = static_cast<uint32_t>(l.checksum & kChecksumMask);
  Shard& shard = ShardOf(key);
  const uint64_t pos = shard.FindPos(key);
  if (pos != shard.capacity) {
    shard.slots[pos] = slot;
    return false;
  }
  shard.ReserveFor(shard.count + 1);
  shard.InsertNew(slot);
  size_++;
  return true;
}

bool SsdIndex::Erase(const KeyFingerprint& key) {
  Shard& shard = ShardOf(key);
  const uint64_t pos = shard.FindPos(key);
  if (pos == shard.capacity) return false;
  shard.EraseAt(pos);
  size_--;
  shard.MaybeShrink();
  return true;
}

uint64_t SsdIndex::EraseIf(const std::function<bool(const SsdLocation&)>& pred) {
  std::vector<KeyFingerprint> doomed;
  ForEach([&](const KeyFingerprint& key, const SsdLocation& l) {
    if (pred(l)) doomed.push_back(key);
  });
  for (const KeyFingerprint& key : doomed) Erase(key);
  return doomed.size();
}

void SsdIndex::ForEach(
    const std::function<void(const KeyFingerprint&, const SsdLocation&)>& fn) const {
  for (size_t i = 0; i < kShards; i++) {
    const Shard& shard = shards_[i];
    for (uint64_t pos = 0; pos < shard.capacity; pos++) {
      const Slot& s = shard.slots[pos];
      if (s.empty()) continue;
      fn(s.key,
         SsdLocation{s.bucket, uint64_t{s.offset_units} * kUnit, s.size, s.version, s.checksum});
    }
  }
}

void SsdIndex::Clear() {
  for (size_t i = 0; i < kShards; i++) shards_[i].Resize(0);
  size_ = 0;
}

SsdIndex::ShardImage SsdIndex::GetShardImage(size_t shard) const {
  const Shard& s = shards_[shard];
  return ShardImage{s.capacity, s.count, reinterpret_cast<const char*>(s.slots.get())};
}

char* SsdIndex::ResetShard(size_t shard, uint64_t capacity) {
  Shard& s = shards_[shard];
  s.Resize(0);
  s.capacity = capacity;
  s.slots = capacity == 0 ? nullptr : NewZeroedHugeArray<Slot>(capacity);
  return reinterpret_cast<char*>(s.slots.get());
}

bool SsdIndex::AdoptShard(size_t shard, uint64_t count) {
  Shard& s = shards_[shard];
  if (!s.HoldsAsInserted(shard, count)) {
    s.capacity = 0;
    s.slots.reset();
    s.count = 0;
    return false;
  }
  s.count = count;
  return true;
}

void SsdIndex::RecountSize() {
  size_ = 0;
  for (size_t i = 0; i < kShards; i++) size_ += shards_[i].count;
}

uint64_t SsdIndex::MemoryBytes() const {
  uint64_t bytes = kShards * sizeof(Shard);
  for (size_t i = 0; i < kShards; i++) bytes += shards_[i].capacity * sizeof(Slot);
  return bytes;
}

}  // namespace kvengine
