#include "db/slab_allocator.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <memory>
#include <type_traits>

#include "db/namespace_tags.h"
#include "util/namespace_key.h"

namespace kvengine {

namespace {
constexpr uint64_t kSmallestClass = 256;
constexpr uint64_t kPageSize = 4096;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// The LRU lists' links (db/item.h: why atomic, and the epoch in lru_prev's low bits).
Item* Prev(const Item* item) { return item->LruPrev(); }
Item* Next(const Item* item) { return item->lru_next.load(std::memory_order_relaxed); }
// Sets item's previous item, with `epoch` in the link's low bits.
void SetPrev(Item* item, Item* prev, uint32_t epoch) {
  item->lru_prev.store(reinterpret_cast<Item*>(reinterpret_cast<uintptr_t>(prev) | epoch),
                       std::memory_order_relaxed);
}
// Makes `next` follow `prev`; next keeps its epoch.
void Link(Item* prev, Item* next) {
  prev->lru_next.store(next, std::memory_order_relaxed);
  SetPrev(next, prev, next->lru_epoch());
}
// An empty circular list: the sentinel points at itself.
void InitList(Item* head) { Link(head, head); }
}  // namespace

struct SlabAllocator::SizeClass {
  uint64_t size = 0;
  uint32_t slots_per_slab = 0;
  std::vector<uint32_t> partial;  // slabs of this class with a free slot, not draining
  Item lru;                       // sentinel: lru.lru_next is the hottest
  // The LRU's epoch (SlabAllocator::Touch), 6 bits; read by Touch without mu_.  It
  // advances once `relinks` reaches `lru_size`, the items in the list.
  std::atomic<uint32_t> epoch{0};
  uint64_t relinks = 0;
  uint64_t lru_size = 0;
  // The item arrays of its slabs, slots_per_slab items each (db/item.h: why huge pages).
  std::unique_ptr<HugeBlockPool> item_arrays;
};

struct SlabAllocator::Slab {
  int cls = kFreeSlab;      // size class, kFreeSlab, kRunSlab, or the run class for a run head
  uint32_t run_head = 0;    // for kRunSlab: the run's first slab
  uint64_t run_length = 0;  // for a run head: slabs in the run
  uint32_t live = 0;        // slots handed out
  uint32_t carved = 0;      // slots handed out at least once since the slab was assigned
  std::vector<uint32_t> free_slots;
  // Written under mu_ only while the slab holds no value, so DataOf may read it without
  // mu_ for an item it holds.  From its class's item_arrays.
  Item* items = nullptr;
  uint32_t item_count = 0;   // length of items
  int64_t partial_pos = -1;  // index in its class's `partial`, or -1
  bool draining = false;     // being emptied: no new values go in
  uint64_t last_touch = 0;   // touch_clock_ at the last allocation or read
};

SlabAllocator::SlabAllocator(char* base, uint64_t capacity, uint64_t slab_size, uint32_t first_slab)
    : base_(base),
      slab_size_(slab_size),
      num_slabs_(capacity / slab_size),
      first_slab_(first_slab) {
  assert(first_slab_ + num_slabs_ <= Item::kMaxSlabs);  // Options::Validate: at most 16M slabs
  // Geometric classes (x1.25) for a bounded waste, plus every power of two because
  // KV-cache blocks usually are one.
  std::vector<uint64_t> sizes;
  for (uint64_t s = kSmallestClass; s < slab_size;) {
    sizes.push_back(s);
    uint64_t next = s + s / 4;
    next = next < kPageSize ? RoundUp(next, 64) : RoundUp(next, kPageSize);
    s = next;
  }
  for (uint64_t p = kSmallestClass; p < slab_size; p *= 2) sizes.push_back(p);
  sizes.push_back(slab_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  class_sizes_ = sizes;
  // 83 classes with 1 GiB slabs, the largest Options::Validate allows; +1: runs.
  assert(class_sizes_.size() + 1 <= Item::kMaxClasses);

  classes_.reset(new SizeClass[class_sizes_.size() + 1]);  // the last: the class of runs
  for (size_t i = 0; i <= class_sizes_.size(); i++) {
    SizeClass& c = classes_[i];
    InitList(&c.lru);
    c.slots_per_slab = 1;  // a run: one item for its slabs
    if (i < class_sizes_.size()) {
      c.size = class_sizes_[i];
      c.slots_per_slab = static_cast<uint32_t>(slab_size / class_sizes_[i]);
    }
    c.item_arrays = std::make_unique<HugeBlockPool>(c.slots_per_slab * sizeof(Item));
  }
  slabs_.resize(num_slabs_);
  free_slabs_ = slabs_.size();
}

static_assert(std::is_trivially_destructible_v<Item>, "pools unmap item arrays as they are");

SlabAllocator::~SlabAllocator() {
  // The pools unmap their chunks whole; only a key too long for them, on the heap, is
  // freed by itself (a free list push per pooled key would be a cache miss each).
  for (Slab& slab : slabs_) {
    for (uint32_t i = 0; i < slab.item_count; i++) {
      const Item& item = slab.items[i];
      const size_t rest = Item::RestSize(item.StoredKeySize());
      if (rest > KeyArena::kMaxPooledKey) keys_.Free(item.KeyRest(), rest);
    }
  }
}

int SlabAllocator::ClassFor(uint64_t size) const {
  auto it = std::lower_bound(class_sizes_.begin(), class_sizes_.end(), std::max<uint64_t>(size, 1));
  return static_cast<int>(it - class_sizes_.begin());
}

uint64_t SlabAllocator::AllocationSize(uint64_t size) const {
  if (size > slab_size_) return RoundUp(size, slab_size_);
  return class_sizes_[ClassFor(size)];
}

uint64_t SlabAllocator::allocated_bytes() const {
  MutexLock lock(&mu_);
  return allocated_bytes_;
}

uint64_t SlabAllocator::item_array_bytes() const {
  MutexLock lock(&mu_);
  return item_array_bytes_ / sizeof(Item) * kItemIndexBytes;
}

uint64_t SlabAllocator::key_arena_bytes() const {
  MutexLock lock(&mu_);
  return keys_.mapped_bytes() + item_array_bytes_ / sizeof(Item) * Item::kKeyHead;
}

uint64_t SlabAllocator::free_slab_count() const {
  MutexLock lock(&mu_);
  return free_slabs_;
}

Item* SlabAllocator::Allocate(uint64_t size) {
  MutexLock lock(&mu_);
  if (size > slab_size_) return AllocateRun((size + slab_size_ - 1) / slab_size_);
  return AllocateInClass(ClassFor(size));
}

int64_t SlabAllocator::TakeFreeSlab() {
  if (free_slabs_ == 0) return -1;
  const uint64_t n = slabs_.size();
  for (uint64_t i = 0; i < n; i++) {
    uint64_t index = (scan_hint_ + i) % n;
    if (slabs_[index].cls == kFreeSlab) {
      scan_hint_ = index + 1;
      free_slabs_--;
      return static_cast<int64_t>(index);
    }
  }
  return -1;
}

Item* SlabAllocator::AllocateInClass(int cls) {
  SizeClass& c = classes_[cls];
  if (c.partial.empty()) {
    int64_t index = TakeFreeSlab();
    if (index < 0) return nullptr;
    Slab& fresh = slabs_[index];
    fresh.cls = cls;
    NewItems(cls, &fresh);
    fresh.live = fresh.carved = 0;
    fresh.draining = false;
    fresh.partial_pos = static_cast<int64_t>(c.partial.size());
    c.partial.push_back(static_cast<uint32_t>(index));
  }
  const uint32_t slab_index = c.partial.back();
  Slab& slab = slabs_[slab_index];
  uint32_t slot;
  if (!slab.free_slots.empty()) {
    slot = slab.free_slots.back();
    slab.free_slots.pop_back();
  } else {
    slot = slab.carved++;
  }
  slab.live++;
  if (slab.live == c.slots_per_slab) {  // full: no longer partial
    c.partial.pop_back();
    slab.partial_pos = -1;
  }
  slab.last_touch = ++touch_clock_;
  allocated_bytes_ += c.size;

  Item* item = &slab.items[slot];
  item->slab = first_slab_ + slab_index;
  item->size_class = static_cast<uint32_t>(cls);
  item->refs.store(0, std::memory_order_relaxed);
  return item;
}

Item* SlabAllocator::AllocateRun(uint64_t slab_count) {
  if (slab_count > free_slabs_) return nullptr;
  const uint64_t n = slabs_.size();
  uint64_t run_start = 0, run_length = 0;
  for (uint64_t i = 0; i < n && run_length < slab_count; i++) {
    if (slabs_[i].cls == kFreeSlab) {
      if (run_length == 0) run_start = i;
      run_length++;
    } else {
      run_length = 0;
    }
  }
  if (run_length < slab_count) return nullptr;
  const int run_class = static_cast<int>(class_sizes_.size());
  Slab& head = slabs_[run_start];
  head.cls = run_class;
  head.run_length = slab_count;
  NewItems(run_class, &head);
  head.live = 1;
  head.draining = false;
  head.last_touch = ++touch_clock_;
  for (uint64_t i = 1; i < slab_count; i++) {
    slabs_[run_start + i].cls = kRunSlab;
    slabs_[run_start + i].run_head = static_cast<uint32_t>(run_start);
  }
  free_slabs_ -= slab_count;
  allocated_bytes_ += slab_count * slab_size_;

  Item* item = &head.items[0];
  item->slab = first_slab_ + static_cast<uint32_t>(run_start);
  item->size_class = static_cast<uint32_t>(run_class);
  item->refs.store(0, std::memory_order_relaxed);
  return item;
}

void SlabAllocator::NewItems(int cls, Slab* slab) {
  SizeClass& c = classes_[cls];
  slab->items = static_cast<Item*>(c.item_arrays->Allocate());
  assert(reinterpret_cast<uintptr_t>(slab->items) % alignof(Item) == 0);  // line-aligned
  std::uninitialized_default_construct_n(slab->items, c.slots_per_slab);
  slab->item_count = c.slots_per_slab;
  item_array_bytes_ += uint64_t{c.slots_per_slab} * sizeof(Item);
}

void SlabAllocator::ReleaseSlab(uint32_t index) {
  Slab& slab = slabs_[index];
  if (slab.items != nullptr) {  // the run's other slabs have none
    std::destroy_n(slab.items, slab.item_count);
    classes_[slab.cls].item_arrays->Free(slab.items);
    item_array_bytes_ -= uint64_t{slab.item_count} * sizeof(Item);
  }
  slab.cls = kFreeSlab;
  slab.items = nullptr;
  slab.item_count = 0;
  slab.free_slots.clear();
  slab.free_slots.shrink_to_fit();
  slab.live = slab.carved = 0;
  slab.run_length = 0;
  slab.partial_pos = -1;
  slab.draining = false;
  free_slabs_++;
}

char* SlabAllocator::DataOf(const Item* item) const {
  const uint32_t index = item->slab - first_slab_;
  char* slab_base = base_ + static_cast<uint64_t>(index) * slab_size_;
  if (item->size_class == class_sizes_.size()) return slab_base;  // a run: slot 0
  const uint64_t slot = static_cast<uint64_t>(item - slabs_[index].items);
  return slab_base + slot * class_sizes_[item->size_class];
}

void SlabAllocator::Unlink(Item* item) {
  if (!item->in_lru()) return;
  classes_[item->size_class].lru_size--;
  Link(Prev(item), Next(item));
  item->lru_prev.store(nullptr, std::memory_order_relaxed);
  item->lru_next.store(nullptr, std::memory_order_relaxed);
}

void SlabAllocator::SetKey(Item* item, std::string_view key) {
  // A key of a namespace with a tag is stored without its prefix (db/item.h).
  std::string_view stored = key;
  uint16_t tag = 0;
  if (__builtin_expect(ns::IsNamespaced(key) && key.size() >= ns::kPrefixSize, 0)) {
    tag = NamespaceTags::Global().Intern(ns::IdOfKey(key));
    if (tag != 0) stored = key.substr(ns::kPrefixSize);
  }
  // A stored key of up to 16 bytes needs no block (and no call).
  char* rest = Item::RestSize(stored.size()) != 0 ? AllocateKeyRest(stored.size()) : nullptr;
  if (__builtin_expect(tag != 0 && !Item::Taggable(rest), 0)) {
    FreeKeyRest(rest, stored.size());  // no room for the tag beside this pointer: whole
    tag = 0;
    stored = key;
    rest = AllocateKeyRest(key.size());
  }
  item->SetKeyBytes(stored, rest, tag);
}

char* SlabAllocator::AllocateKeyRest(size_t stored_key_size) {
  const size_t n = Item::RestSize(stored_key_size);
  if (n == 0) return nullptr;
  MutexLock lock(&mu_);
  return keys_.Allocate(n);
}

void SlabAllocator::FreeKeyRest(char* rest, size_t stored_key_size) {
  MutexLock lock(&mu_);
  keys_.Free(rest, Item::RestSize(stored_key_size));
}

void SlabAllocator::Free(Item* item) {
  MutexLock lock(&mu_);
  assert(item->refs.load() == 0);
  Unlink(item);
  keys_.Free(item->KeyRest(), Item::RestSize(item->StoredKeySize()));
  item->ClearKey();
  const uint32_t index = item->slab - first_slab_;
  Slab& slab = slabs_[index];
  if (slab.cls == static_cast<int>(class_sizes_.size())) {  // a run
    const uint64_t length = slab.run_length;
    allocated_bytes_ -= length * slab_size_;
    for (uint64_t i = 0; i < length; i++) ReleaseSlab(static_cast<uint32_t>(index + i));
    return;
  }
  SizeClass& c = classes_[slab.cls];
  allocated_bytes_ -= c.size;
  slab.live--;
  slab.free_slots.push_back(static_cast<uint32_t>(item - slab.items));
  if (slab.live == 0) {
    if (slab.partial_pos >= 0) {  // swap-remove from the partial list
      const uint32_t moved = c.partial.back();
      c.partial[slab.partial_pos] = moved;
      slabs_[moved].partial_pos = slab.partial_pos;
      c.partial.pop_back();
    }
    ReleaseSlab(index);
  } else if (slab.partial_pos < 0 && !slab.draining) {
    slab.partial_pos = static_cast<int64_t>(c.partial.size());
    c.partial.push_back(index);
  }
}

bool SlabAllocator::WillRelink(const Item* item) const {
  return !item->in_lru() ||
         item->lru_epoch() != classes_[item->size_class].epoch.load(std::memory_order_relaxed);
}

void SlabAllocator::Touch(Item* item) {
  // An item relinked in the list's current epoch -- among the last lru_size relinks --
  // stays where it is (as CacheLib's "LRU refresh time", in relinks rather than
  // seconds): a read of a warm item then costs no mutex and no write to its neighbours,
  // two more cache misses at millions of keys.  Such an item is in the list's hotter
  // part, or the epoch would have moved on; an epoch is 6 bits, so one relinked 64
  // epochs ago looks current and is not moved this once.  Read without mu_, both may
  // be stale: the cost is a relink more or fewer.
  if (!WillRelink(item)) return;
  MutexLock lock(&mu_);
  RelinkHot(item);
}

void SlabAllocator::RelinkHot(Item* item) {
  SizeClass& c = classes_[item->size_class];
  Item* head = &c.lru;
  Unlink(item);
  Link(item, Next(head));
  Link(head, item);
  c.lru_size++;
  const uint32_t epoch = c.epoch.load(std::memory_order_relaxed);
  SetPrev(item, head, epoch);
  if (++c.relinks >= c.lru_size) {
    c.relinks = 0;
    c.epoch.store((epoch + 1) & Item::kEpochMask, std::memory_order_relaxed);
  }
  slabs_[item->slab - first_slab_].last_touch = ++touch_clock_;
}

void SlabAllocator::PinAndCollect(Item* item, std::vector<Item*>* victims) {
  // An item whose count already fell to zero is being freed by its last holder; it is
  // not ours to evict.
  uint32_t refs = item->refs.load(std::memory_order_acquire);
  while (refs != 0) {
    if (item->refs.compare_exchange_weak(refs, refs + 1, std::memory_order_acq_rel)) {
      Unlink(item);
      victims->push_back(item);
      return;
    }
  }
}

bool SlabAllocator::PickVictims(uint64_t size, std::vector<Item*>* victims) {
  MutexLock lock(&mu_);
  const size_t before = victims->size();
  if (size <= slab_size_) {
    // The coldest value of the same class frees exactly the room needed.
    Item* head = &classes_[ClassFor(size)].lru;
    for (Item* it = Prev(head); it != head; it = Prev(it)) {
      Item* candidate = it;
      PinAndCollect(candidate, victims);
      if (victims->size() > before) return true;
    }
  }
  const uint64_t needed = size <= slab_size_ ? 1 : (size + slab_size_ - 1) / slab_size_;
  return ReclaimWindow(needed, victims) || victims->size() > before;
}

bool SlabAllocator::PickRankedVictims(uint64_t size, const VictimRank& rank, int enough,
                                      std::vector<Item*>* victims) {
  if (size <= slab_size_) {
    MutexLock lock(&mu_);
    const size_t before = victims->size();
    Item* head = &classes_[ClassFor(size)].lru;
    Item* best = nullptr;
    int best_rank = 0;
    size_t seen = 0;
    for (Item *it = Prev(head), *prev; it != head && seen < kRankScan; it = prev, seen++) {
      prev = Prev(it);
      if (it->refs.load(std::memory_order_relaxed) == 0) continue;  // being freed
      const int r = rank(*it);
      if (r == 0) {
        // Protected: moved to the hot end, out of the way of the next search, or the cold
        // end would fill with protected values and hide the others from it.
        RelinkHot(it);
      } else if (r > best_rank) {
        best = it;
        best_rank = r;
        if (r >= enough) break;
      }
    }
    if (best != nullptr) {
      PinAndCollect(best, victims);
      if (victims->size() > before) return true;
    }
  }
  {
    MutexLock lock(&mu_);
    const uint64_t needed = size <= slab_size_ ? 1 : (size + slab_size_ - 1) / slab_size_;
    if (ReclaimWindow(needed, victims, &rank)) return true;
  }
  return PickVictimWhere(
      size, [&rank](const Item& item) { return rank(item) > 0; }, victims);
}

bool SlabAllocator::AllRanked(const Slab& slab, const VictimRank& rank) const {
  const uint32_t slots = slab.cls < static_cast<int>(class_sizes_.size()) ? slab.carved : 1;
  for (uint32_t slot = 0; slot < slots; slot++) {
    const Item& item = slab.items[slot];
    if (item.in_lru() && item.refs.load(std::memory_order_relaxed) != 0 && rank(item) == 0) {
      return false;
    }
  }
  return true;
}

bool SlabAllocator::PickVictimWhere(uint64_t size, const std::function<bool(const Item&)>& wanted,
                                    std::vector<Item*>* victims) {
  MutexLock lock(&mu_);
  const size_t before = victims->size();
  const int classes = static_cast<int>(class_sizes_.size()) + 1;  // the last: runs
  const int first = size <= slab_size_ ? ClassFor(size) : classes - 1;
  for (int n = 0; n < classes; n++) {
    Item* head = &classes_[(first + n) % classes].lru;
    size_t seen = 0;
    for (Item *it = Prev(head), *prev; it != head && seen < kRankScan; it = prev, seen++) {
      prev = Prev(it);
      if (it->refs.load(std::memory_order_relaxed) == 0) continue;  // being freed
      if (!wanted(*it)) {
        RelinkHot(it);  // as in PickRankedVictims: out of the next search's way
        continue;
      }
      PinAndCollect(it, victims);
      if (victims->size() > before) return true;
    }
  }
  return false;
}

bool SlabAllocator::ClaimVictim(Item* item, std::vector<Item*>* victims) {
  MutexLock lock(&mu_);
  if (!item->in_lru()) return false;
  const size_t before = victims->size();
  PinAndCollect(item, victims);
  return victims->size() > before;
}

bool SlabAllocator::ReclaimWindow(uint64_t slab_count, std::vector<Item*>* victims,
                                  const VictimRank* rank) {
  const uint64_t n = slabs_.size();
  if (slab_count > n) return false;
  // The window whose most recent touch is oldest: its values are all cold.
  uint64_t best_start = n, best_touch = UINT64_MAX;
  for (uint64_t start = 0; start + slab_count <= n; start++) {
    uint64_t newest = 0;
    bool any_draining = false;
    for (uint64_t i = start; i < start + slab_count; i++) {
      const Slab& s = slabs_[i];
      const Slab& owner = s.cls == kRunSlab ? slabs_[s.run_head] : s;
      if (s.cls != kFreeSlab) newest = std::max(newest, owner.last_touch);
      any_draining |= owner.draining && s.cls != kFreeSlab;
    }
    if (rank != nullptr && !any_draining && newest < best_touch) {
      for (uint64_t i = start; i < start + slab_count && !any_draining; i++) {
        const Slab& s = slabs_[i];
        if (s.cls == kFreeSlab) continue;
        // A window holding a value of rank 0 is passed over (counted as draining).
        any_draining = !AllRanked(s.cls == kRunSlab ? slabs_[s.run_head] : s, *rank);
      }
    }
    if (!any_draining && newest < best_touch) {
      best_touch = newest;
      best_start = start;
    }
  }
  if (best_start == n) return false;
  for (uint64_t i = best_start; i < best_start + slab_count; i++) {
    Slab& s = slabs_[i];
    if (s.cls == kFreeSlab) continue;
    const uint32_t owner_index = s.cls == kRunSlab ? s.run_head : static_cast<uint32_t>(i);
    Slab& owner = slabs_[owner_index];
    if (owner.draining) continue;
    owner.draining = true;
    if (owner.cls < static_cast<int>(class_sizes_.size()) && owner.partial_pos >= 0) {
      SizeClass& c = classes_[owner.cls];
      const uint32_t moved = c.partial.back();
      c.partial[owner.partial_pos] = moved;
      slabs_[moved].partial_pos = owner.partial_pos;
      c.partial.pop_back();
      owner.partial_pos = -1;
    }
    const uint32_t slots = owner.cls < static_cast<int>(class_sizes_.size()) ? owner.carved : 1;
    for (uint32_t slot = 0; slot < slots; slot++) {
      Item* item = &owner.items[slot];
      if (item->in_lru()) PinAndCollect(item, victims);
    }
  }
  return true;
}

}  // namespace kvengine
