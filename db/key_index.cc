#include "db/key_index.h"

#include <cassert>

namespace kvengine {

namespace {
constexpr int kInitialLog2 = 4;  // 16 slots: a shard of a small DB stays small
}  // namespace

KeyIndex::KeyIndex()
    : slots_(NewZeroedHugeArray<Slot>(size_t{1} << kInitialLog2)),
      mask_((size_t{1} << kInitialLog2) - 1),
      shift_(64 - kInitialLog2) {
  PublishHint();
}

void KeyIndex::PublishHint() {
  const uintptr_t base = reinterpret_cast<uintptr_t>(&slots_[0]);
  prefetch_hint_.store((base & kHintBaseMask) | uintptr_t(shift_) << kHintShiftBit,
                       std::memory_order_relaxed);
}

void KeyIndex::Insert(uint64_t hash, Item* item) {
  // At most 70% full: linear probing's runs stay short (a miss reads ~6 slots, two
  // cache lines, at the worst), and an empty slot always ends a probe.
  if ((size_ + 1) * 10 > (mask_ + 1) * 7) Grow();
  size_t i = Home(hash);
  while (slots_[i].item != nullptr) i = (i + 1) & mask_;
  slots_[i] = {hash, item};
  size_++;
}

void KeyIndex::Erase(uint64_t hash, const Item* item) {
  size_t i = Home(hash);
  while (slots_[i].item != item) {
    assert(slots_[i].item != nullptr);
    i = (i + 1) & mask_;
  }
  // Backward-shift deletion: move later members of the run into the hole when their
  // home is not after it, so every probe still finds its item without tombstones.
  size_t hole = i;
  for (size_t j = (i + 1) & mask_; slots_[j].item != nullptr; j = (j + 1) & mask_) {
    const size_t home = Home(slots_[j].hash);
    // Whether home lies cyclically in (hole, j]: then the slot must stay.
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!stays) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = {0, nullptr};
  size_--;
}

void KeyIndex::Grow() {
  const size_t old_capacity = mask_ + 1;
  HugeArray<Slot> old = std::move(slots_);
  slots_ = NewZeroedHugeArray<Slot>(old_capacity * 2);
  mask_ = old_capacity * 2 - 1;
  shift_--;
  PublishHint();
  for (size_t i = 0; i < old_capacity; i++) {
    if (old[i].item == nullptr) continue;
    size_t j = Home(old[i].hash);
    while (slots_[j].item != nullptr) j = (j + 1) & mask_;
    slots_[j] = old[i];
  }
}

}  // namespace kvengine
