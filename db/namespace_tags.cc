#include "db/namespace_tags.h"

namespace kvengine {

// Constant-initialized: zero pages in the BSS, touched only where a tag is used.
constinit NamespaceTags NamespaceTags::global_;

uint16_t NamespaceTags::InternSlow(uint64_t id) {
  if (id == 0) return 0;  // 0 marks a free slot
  // The id is a hash already (XXH3 of the namespace's name): its low bits pick the slot.
  size_t index = static_cast<size_t>(id) & (kSlots - 1);
  for (size_t n = 0; n < kMaxProbe; n++, index = (index + 1) & (kSlots - 1)) {
    if (index == 0) continue;  // tag 0 is "no tag"
    uint64_t seen = slots_[index].load(std::memory_order_acquire);
    if (seen == id) return static_cast<uint16_t>(index);
    if (seen != 0) continue;
    // A free slot: slots are never freed, so `id` is in none further along the probe.
    if (used_.load(std::memory_order_relaxed) >= kMaxTags) return 0;
    if (slots_[index].compare_exchange_strong(seen, id, std::memory_order_acq_rel)) {
      used_.fetch_add(1, std::memory_order_relaxed);
      return static_cast<uint16_t>(index);
    }
    if (seen == id) return static_cast<uint16_t>(index);  // claimed by another thread for id
  }
  return 0;
}

}  // namespace kvengine
