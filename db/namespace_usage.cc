#include "db/namespace_usage.h"

#include <chrono>
#include <cstdio>

#include "db/item.h"
#include "db/namespace_tags.h"
#include "util/namespace_key.h"

namespace kvengine {

namespace {
// A probe gives up after this many taken slots and counts the namespace as "other".
constexpr size_t kMaxProbe = 64;
// Pressures are recomputed at most this often per tier (an eviction round asks each time).
constexpr int64_t kRefreshNanos = 200 * 1000;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string IdName(uint64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "id:%016llx", static_cast<unsigned long long>(id));
  return buf;
}
}  // namespace

NamespaceUsage::NamespaceUsage(uint64_t memory_capacity, const ArenaLayout* layout)
    : capacity_(memory_capacity),
      layout_(layout != nullptr ? *layout : ArenaLayout::Single(memory_capacity)),
      slots_(new Slot[kSlots]),
      claimed_(new std::atomic<Slot*>[kSlots + 1]) {
  for (size_t i = 0; i <= kSlots; i++) claimed_[i].store(nullptr, std::memory_order_relaxed);
}

NamespaceUsage::Slot* NamespaceUsage::OfItem(const Item& item) {
  // A tagged item stores its key without the prefix (db/item.h); an untagged one of a
  // namespace still starts with it.
  if (const uint16_t tag = item.NamespaceTag()) return OfId(NamespaceTags::Global().IdOf(tag));
  if (item.StoredKeySize() < ns::kPrefixSize ||
      static_cast<unsigned char>(item.key_head[0]) != ns::kMarker) {
    return &default_;
  }
  static_assert(Item::kKeyHead >= ns::kPrefixSize, "the prefix is in the item");
  return OfId(ns::IdOfKey(std::string_view(item.key_head, ns::kPrefixSize)));
}

NamespaceUsage::Slot* NamespaceUsage::OfIdSlow(uint64_t id) {
  if (id == 0) return &other_;  // never registered; keeps 0 meaning "free"
  return Probe(id);
}

NamespaceUsage::Slot* NamespaceUsage::Probe(uint64_t id) {
  // The id is a hash already (XXH3 of the name): its low bits pick the slot.
  size_t index = static_cast<size_t>(id) & (kSlots - 1);
  for (size_t n = 0; n < kMaxProbe; n++, index = (index + 1) & (kSlots - 1)) {
    Slot& slot = slots_[index];
    uint64_t seen = slot.id.load(std::memory_order_acquire);
    if (seen == id) return &slot;
    if (seen == 0 && slot.id.compare_exchange_strong(seen, id, std::memory_order_acq_rel)) {
      claimed_[used_.fetch_add(1, std::memory_order_acq_rel)].store(&slot,
                                                                    std::memory_order_release);
      return &slot;
    }
    if (seen == id) return &slot;  // another thread claimed it for the same id
  }
  return &other_;
}

template <typename Fn>
void NamespaceUsage::ForEachUsed(Fn&& fn) const {
  const size_t used = used_.load(std::memory_order_acquire);
  for (size_t i = 0; i < used && i < kSlots; i++) {
    const Slot* slot = claimed_[i].load(std::memory_order_acquire);
    if (slot != nullptr) fn(*slot);
  }
}

void NamespaceUsage::SetLimits(uint64_t id, const std::string& name, uint64_t memory_quota_bytes,
                               uint64_t ssd_quota_bytes, uint32_t weight) {
  Slot* slot = OfId(id);
  if (slot == &other_) return;  // the table is full: counted, not limited
  if (memory_quota_bytes != 0) memory_quotas_.store(true, std::memory_order_relaxed);
  slot->quota.store(memory_quota_bytes, std::memory_order_relaxed);
  slot->ssd_quota.store(ssd_quota_bytes, std::memory_order_relaxed);
  slot->weight.store(weight == 0 ? 1 : weight, std::memory_order_relaxed);
  MutexLock l(&names_mu_);
  names_[id] = name;
}

void NamespaceUsage::Forget(uint64_t id) {
  Slot* slot = OfId(id);
  if (slot == &other_) return;
  slot->quota.store(0, std::memory_order_relaxed);
  slot->ssd_quota.store(0, std::memory_order_relaxed);
  slot->weight.store(1, std::memory_order_relaxed);
  MutexLock l(&names_mu_);
  names_.erase(id);
}

void NamespaceUsage::Refresh(bool force) {
  const int64_t now = NowNanos();
  if (!force) {
    if (now - last_refresh_nanos_.load(std::memory_order_relaxed) < kRefreshNanos) return;
    if (!refresh_mu_.TryLock()) return;
  } else {
    refresh_mu_.Lock();
  }
  MutexLock l(&refresh_mu_, std::adopt_lock);
  last_refresh_nanos_.store(now, std::memory_order_relaxed);
  // The fair share of a namespace holding something -- values or reservations -- its
  // arena split by weight among those of the arena that do (the whole tier, when it is
  // one arena).
  constexpr size_t kParts = ArenaLayout::kMaxNamedParts + 1;
  uint64_t total_weight[kParts] = {};
  uint32_t active[kParts] = {};
  auto visit = [&](auto&& fn) {
    fn(default_, 0u);
    fn(other_, 0u);
    ForEachUsed([&](const Slot& slot) { fn(const_cast<Slot&>(slot), PartOf(&slot)); });
  };
  visit([&](Slot& slot, uint32_t part) {
    if (slot.Held() == 0) return;
    total_weight[part] += slot.weight.load(std::memory_order_relaxed);
    active[part]++;
  });
  Slot* most[kParts] = {};
  uint32_t most_pressure[kParts];  // only a namespace over its share is "most over"
  for (size_t p = 0; p < kParts; p++) most_pressure[p] = 1000;
  visit([&](Slot& slot, uint32_t part) {
    const uint64_t bytes = slot.Held();
    const uint64_t capacity = layout_.single() ? capacity_ : layout_.part(part).size;
    uint32_t pressure = 0;
    if (bytes != 0 && total_weight[part] != 0 && capacity != 0) {
      const double share = static_cast<double>(capacity) *
                           slot.weight.load(std::memory_order_relaxed) / total_weight[part];
      const double p = 1000.0 * static_cast<double>(bytes) / share;
      pressure = p > 4e9 ? 4000000000u : static_cast<uint32_t>(p);
    }
    slot.pressure.store(pressure, std::memory_order_relaxed);
    if (pressure > most_pressure[part]) {
      most_pressure[part] = pressure;
      most[part] = &slot;
    }
  });
  for (size_t p = 0; p < kParts; p++) {
    active_[p].store(active[p], std::memory_order_relaxed);
    most_over_[p].store(most[p], std::memory_order_relaxed);
  }
}

NamespaceUsage::Report NamespaceUsage::ReportOf(const Slot& slot, std::string name) const {
  Report r;
  r.name = std::move(name);
  r.memory_quota_bytes = slot.quota.load(std::memory_order_relaxed);
  r.ssd_quota_bytes = slot.ssd_quota.load(std::memory_order_relaxed);
  r.weight = slot.weight.load(std::memory_order_relaxed);
  r.memory_bytes = slot.bytes.load(std::memory_order_relaxed);
  r.memory_items = slot.items.load(std::memory_order_relaxed);
  r.ssd_bytes = slot.ssd_bytes.load(std::memory_order_relaxed);
  r.ssd_items = slot.ssd_items.load(std::memory_order_relaxed);
  r.memory_reserved_bytes = slot.reserved.load(std::memory_order_relaxed);
#define KV_NS_COPY(field, help) r.field = slot.field.load(std::memory_order_relaxed);
#define KV_NS_SKIP(field, help)
  KV_NAMESPACE_FIGURES(KV_NS_SKIP, KV_NS_COPY)
#undef KV_NS_COPY
#undef KV_NS_SKIP
  return r;
}

std::string NamespaceUsage::NameOf(const Slot* slot) const {
  if (slot == &default_) return "default";
  if (slot == &other_) return "other";
  const uint64_t id = slot->id.load(std::memory_order_relaxed);
  MutexLock l(&names_mu_);
  auto it = names_.find(id);
  return it != names_.end() ? it->second : IdName(id);
}

std::vector<NamespaceUsage::Report> NamespaceUsage::Reports() const {
  std::vector<Report> out;
  std::map<uint64_t, std::string> names;
  {
    MutexLock l(&names_mu_);
    names = names_;
  }
  if (names.empty() && used_.load(std::memory_order_acquire) == 0) return out;
  out.push_back(ReportOf(default_, "default"));
  ForEachUsed([&](const Slot& slot) {
    const uint64_t id = slot.id.load(std::memory_order_relaxed);
    auto it = names.find(id);
    if (it != names.end()) {
      out.push_back(ReportOf(slot, it->second));
    } else if (slot.items.load(std::memory_order_relaxed) != 0 ||
               slot.ssd_items.load(std::memory_order_relaxed) != 0) {
      // Not registered here (a peer's keys) but holding values; a dropped namespace
      // that holds nothing more is not reported.
      out.push_back(ReportOf(slot, IdName(id)));
    }
  });
  const Report other = ReportOf(other_, "other");
  if (other.memory_items != 0 || other.ssd_items != 0 || other.hits != 0 || other.misses != 0) {
    out.push_back(other);
  }
  return out;
}

}  // namespace kvengine
