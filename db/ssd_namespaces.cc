// SsdTier's namespaces (issue #29): what each bucket holds per namespace, the namespace
// figures those tallies add up to, SSD quotas, and fair shares when buckets are evicted.
// See docs/design.md, "Namespaces: quotas and fair shares".
//
// The map keeps fingerprints, not keys, so the tier cannot ask it whose a value is.
// Each bucket keeps instead a tally of its live values per namespace
// (SsdBucket::namespaces), changed wherever a value becomes live or dies in it -- with
// the key at hand: a commit, a delete or overwrite, a compaction's move, a replay at
// Open -- and saved in the map checkpoint's bucket table.  A namespace's ssd_bytes and
// ssd_items are always the sum of its tallies: every change goes through TallyLocked,
// and a bucket that leaves the table (evicted, compacted) takes its tally with it
// (DropTallyLocked), whatever its index on disk still says.
#include <algorithm>
#include <map>

#include "db/evicted_keys.h"
#include "db/namespace_usage.h"
#include "db/removal_feed.h"
#include "db/ssd_bucket.h"
#include "db/ssd_tier.h"
#include "util/config_parse.h"
#include "util/hash.h"
#include "util/logging.h"
#include "util/namespace_key.h"

namespace kvengine {

namespace {

// The namespace id a stored key names: 0 for the default namespace's keys.
uint64_t NamespaceIdOfKey(std::string_view key) {
  return ns::IsNamespaced(key) && key.size() >= ns::kPrefixSize ? ns::IdOfKey(key) : 0;
}

// Subtracts at most what `from` holds; returns what was subtracted.
uint64_t SubtractClamped(uint64_t* from, uint64_t n) {
  const uint64_t taken = std::min(*from, n);
  *from -= taken;
  return taken;
}

// A namespace over its quota gives back this much of the quota more than the put needs
// (reading a bucket's index for one value at a time would cost a read per put).
constexpr uint64_t kQuotaSlackDivisor = 16;
}  // namespace

NamespaceUsage::Slot* SsdTier::NamespaceSlot(uint64_t id) {
  return id == 0 ? usage_->default_slot() : usage_->OfId(id);
}

void SsdTier::TallyLocked(SsdBucket* b, std::string_view key, uint64_t size, bool add) {
  const uint64_t id = NamespaceIdOfKey(key);
  auto& tallies = b->namespaces;
  auto t = std::find_if(tallies.begin(), tallies.end(),
                        [id](const SsdBucket::NamespaceTally& n) { return n.id == id; });
  NamespaceUsage::Slot* slot = NamespaceSlot(id);
  if (add) {
    if (t == tallies.end()) t = tallies.insert(tallies.end(), SsdBucket::NamespaceTally{id, 0, 0});
    t->bytes += size;
    t->items++;
    slot->ssd_bytes.fetch_add(size, std::memory_order_relaxed);
    slot->ssd_items.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  uint64_t bytes = size, items = 1;
  if (t != tallies.end()) {
    bytes -= SubtractClamped(&t->bytes, bytes);
    items -= SubtractClamped(&t->items, items);
    slot->ssd_bytes.fetch_sub(size - bytes, std::memory_order_relaxed);
    slot->ssd_items.fetch_sub(1 - items, std::memory_order_relaxed);
  }
  // Only a tally restored approximately (a partial checkpoint's) can come short: the
  // rest is taken from the bucket's other namespaces, so that the tallies keep adding
  // up to what the bucket holds.
  for (auto& other : tallies) {
    if (bytes == 0 && items == 0) break;
    const uint64_t b = SubtractClamped(&other.bytes, bytes);
    const uint64_t n = SubtractClamped(&other.items, items);
    bytes -= b;
    items -= n;
    NamespaceUsage::Slot* other_slot = NamespaceSlot(other.id);
    other_slot->ssd_bytes.fetch_sub(b, std::memory_order_relaxed);
    other_slot->ssd_items.fetch_sub(n, std::memory_order_relaxed);
  }
  std::erase_if(tallies,
                [](const SsdBucket::NamespaceTally& n) { return n.items == 0 && n.bytes == 0; });
}

void SsdTier::DropTallyLocked(SsdBucket* b) {
  for (const SsdBucket::NamespaceTally& t : b->namespaces) {
    NamespaceUsage::Slot* slot = NamespaceSlot(t.id);
    slot->ssd_bytes.fetch_sub(t.bytes, std::memory_order_relaxed);
    slot->ssd_items.fetch_sub(t.items, std::memory_order_relaxed);
  }
  b->namespaces.clear();
}

void SsdTier::AddTallyToUsageLocked(const SsdBucket& b) {
  for (const SsdBucket::NamespaceTally& t : b.namespaces) {
    NamespaceUsage::Slot* slot = NamespaceSlot(t.id);
    slot->ssd_bytes.fetch_add(t.bytes, std::memory_order_relaxed);
    slot->ssd_items.fetch_add(t.items, std::memory_order_relaxed);
  }
}

void SsdBucket::FitNamespacesTo(uint64_t live_bytes) {
  SsdBucket* b = this;
  uint64_t bytes = 0, items = 0;
  for (const SsdBucket::NamespaceTally& t : b->namespaces) {
    bytes += t.bytes;
    items += t.items;
  }
  if (bytes == live_bytes && items == b->live_keys) return;
  if (bytes == 0 || items == 0 || live_bytes == 0 || b->live_keys == 0) {
    b->namespaces.clear();
    if (live_bytes != 0 && b->live_keys != 0) {
      // Nothing to scale (none was counted): whose they are is unknown, the default's.
      b->namespaces.push_back({0, live_bytes, b->live_keys});
    }
    return;
  }
  // Scaled in proportion; the rounding's remainder goes to the largest share.
  uint64_t bytes_left = live_bytes, items_left = b->live_keys;
  for (SsdBucket::NamespaceTally& t : b->namespaces) {
    t.bytes = static_cast<uint64_t>(static_cast<long double>(t.bytes) * live_bytes / bytes);
    t.items = static_cast<uint64_t>(static_cast<long double>(t.items) * b->live_keys / items);
    t.bytes = std::min(t.bytes, bytes_left);
    t.items = std::min(t.items, items_left);
    bytes_left -= t.bytes;
    items_left -= t.items;
  }
  auto largest = std::max_element(b->namespaces.begin(), b->namespaces.end(),
                                  [](const auto& x, const auto& y) { return x.bytes < y.bytes; });
  largest->bytes += bytes_left;
  largest->items += items_left;
  // A share left with bytes but no value rounded away: its bytes go to the largest too.
  const uint64_t largest_id = largest->id;
  for (const auto& t : b->namespaces) {
    if (t.items == 0 && t.id != largest_id) largest->bytes += t.bytes;
  }
  std::erase_if(b->namespaces, [](const auto& t) { return t.items == 0; });
}

std::vector<std::shared_ptr<SsdBucket>> SsdTier::EvictionOrderLocked() const {
  std::vector<std::shared_ptr<SsdBucket>> order;
  for (const auto& [id, b] : buckets_) order.push_back(b);
  const bool lru = options_.ssd_eviction == SsdEviction::kLru;
  std::sort(order.begin(), order.end(), [lru](const auto& x, const auto& y) {
    return lru ? x->last_access < y->last_access : x->id < y->id;
  });
  return order;
}

bool SsdTier::OverNamespaceQuota(const Slice& key, uint64_t size) {
  const NamespaceUsage::Slot* slot = NamespaceSlot(NamespaceIdOfKey(key.view()));
  const uint64_t quota = slot->ssd_quota.load(std::memory_order_relaxed);
  return quota != 0 && slot->ssd_bytes.load(std::memory_order_relaxed) + size > quota;
}

Status SsdTier::MakeNamespaceRoomLocked(std::string_view key, uint64_t size) {
  const uint64_t id = NamespaceIdOfKey(key);
  NamespaceUsage::Slot* slot = NamespaceSlot(id);
  const uint64_t quota = slot->ssd_quota.load(std::memory_order_relaxed);
  auto held = [slot] { return slot->ssd_bytes.load(std::memory_order_relaxed); };
  if (quota == 0 || held() + size <= quota) return Status::OK();
  auto refuse = [&](const std::string& why) {
    slot->Count(slot->quota_rejections);
    return Status::NoSpace("namespace " + usage_->NameOf(slot) + " is at its SSD quota (" +
                           FormatSize(held()) + " of " + FormatSize(quota) + "): " + why);
  };
  if (size > quota) return refuse("a value of " + FormatSize(size) + " can never fit it");
  const uint64_t slack = quota / kQuotaSlackDivisor;
  const uint64_t target = quota - size > slack ? quota - size - slack : quota - size;
  for (const auto& b : EvictionOrderLocked()) {
    if (held() <= target) break;
    const bool holds = std::any_of(b->namespaces.begin(), b->namespaces.end(),
                                   [id](const auto& t) { return t.id == id && t.items != 0; });
    if (!holds) continue;
    std::vector<BucketEntry> entries;
    if (b->state == SsdBucket::State::kOnDisk) {
      // Read under mu_ like an eviction's: one bucket's index, bucket_keys_limit entries
      // at most, and only while the namespace is over its quota.
      Status s = ReadBucketIndex(*b, &entries);
      if (!s.ok()) {
        logger_->Logf(LogLevel::kWarn, "SSD quota of namespace %s: bucket %llu: %s",
                      usage_->NameOf(slot).c_str(), static_cast<unsigned long long>(b->id),
                      s.ToString().c_str());
        continue;
      }
    } else {
      entries = b->staged;  // a pending bucket's entries are in RAM
    }
    for (const BucketEntry& e : entries) {
      if (held() <= target) break;
      if (NamespaceIdOfKey(e.key) != id) continue;
      const KeyFingerprint fp = KeyFingerprint::Of(e.key);
      SsdLocation loc;
      if (!map_.Find(fp, &loc) || loc.bucket != b->id || loc.version != e.version) continue;
      // The bucket stays: the value needs its tombstone, or a restart would bring it back.
      RemoveLocked(e.key, fp, loc, /*tombstone=*/true);
      if (removal_feed_ != nullptr) {
        removal_feed_->Record(e.key, RemovalEvent::kSsd, RemovalEvent::kCapacity);
      }
      if (evicted_keys_ != nullptr) evicted_keys_->Note(Hash64(e.key));
      slot->Count(slot->quota_evictions);
    }
  }
  if (held() + size > quota) {
    return refuse("none of its values can be evicted for one of " + FormatSize(size));
  }
  return Status::OK();
}

std::vector<std::shared_ptr<SsdBucket>> SsdTier::PickEvictionVictimsLocked(uint64_t bytes) {
  std::vector<std::shared_ptr<SsdBucket>> candidates;
  for (const auto& b : EvictionOrderLocked()) {
    if (b->state != SsdBucket::State::kOnDisk || b->compacting) continue;
    // A bucket with reads in flight is not evicted: retiring it would wait for them,
    // and the thread asking for room may be the reader (a promotion while the rest of
    // its batch is still being read).
    if (b->readers.load(std::memory_order_acquire) != 0) continue;
    candidates.push_back(b);
  }
  // What each namespace holds, for the shares; kept up to date as victims are picked.
  std::map<uint64_t, uint64_t> held;
  for (const auto& [bid, b] : buckets_) {
    for (const auto& t : b->namespaces) held[t.id] += t.bytes;
  }
  std::vector<std::shared_ptr<SsdBucket>> victims;
  uint64_t freed = 0;
  while (used_bytes_ + bytes > options_.ssd_capacity_bytes + freed && !candidates.empty()) {
    // The namespaces over their fair share (the capacity split by weight among the
    // namespaces holding something here); none unless two or more hold something.
    const bool shared =
        std::count_if(held.begin(), held.end(), [](const auto& h) { return h.second != 0; }) > 1;
    std::vector<uint64_t> over;
    if (shared) {
      uint64_t total_weight = 0;
      for (const auto& [nid, n] : held) {
        if (n != 0) total_weight += NamespaceSlot(nid)->weight.load(std::memory_order_relaxed);
      }
      for (const auto& [nid, n] : held) {
        if (n == 0 || total_weight == 0) continue;
        const double share = static_cast<double>(options_.ssd_capacity_bytes) *
                             NamespaceSlot(nid)->weight.load(std::memory_order_relaxed) /
                             static_cast<double>(total_weight);
        if (static_cast<double>(n) > share) over.push_back(nid);
      }
    }
    // The coldest bucket; but while namespaces share the tier, the one whose eviction
    // costs the namespaces within their share least for the room it gives -- holding
    // mostly values of namespaces over theirs, or dead values (a quota's evictions leave
    // them) -- the colder on a tie.  All of them are looked at (one pass per bucket
    // evicted, over a few entries each): a cold namespace's buckets are the oldest, and a
    // window of the coldest would see nothing else.
    size_t pick = 0;
    if (shared) {
      double least = 0;
      for (size_t i = 0; i < candidates.size(); i++) {
        uint64_t within = 0;  // live bytes of namespaces within their share
        for (const auto& t : candidates[i]->namespaces) {
          if (std::find(over.begin(), over.end(), t.id) == over.end()) within += t.bytes;
        }
        const double cost = static_cast<double>(within) / static_cast<double>(std::max<uint64_t>(
                                                              candidates[i]->allocated_bytes(), 1));
        if (i == 0 || cost < least) {
          least = cost;
          pick = i;
        }
      }
    }
    std::shared_ptr<SsdBucket> victim = candidates[pick];
    candidates.erase(candidates.begin() + static_cast<ptrdiff_t>(pick));
    for (const auto& t : victim->namespaces) held[t.id] -= std::min(held[t.id], t.bytes);
    freed += victim->allocated_bytes();
    victims.push_back(std::move(victim));
  }
  return victims;
}

void SsdTier::CountBucketEvictionsLocked(const SsdBucket& b) {
  for (const SsdBucket::NamespaceTally& t : b.namespaces) {
    NamespaceUsage::Slot* slot = NamespaceSlot(t.id);
    slot->ssd_evictions.fetch_add(t.items, std::memory_order_relaxed);
  }
}

}  // namespace kvengine
