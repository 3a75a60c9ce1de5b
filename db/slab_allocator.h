// SlabAllocator: places values inside the memory tier's arena.
//
// The arena is cut into slabs of Options::memory_slab_size.  A slab is handed to one size
// class at a time and cut into equal slots (class sizes grow by ~1.25x, 4 KiB-aligned
// from 4 KiB up, so values start O_DIRECT-aligned).  A value larger than a slab takes a
// run of contiguous slabs of its own.  A slab whose slots are all free goes back to the
// pool, so a change of value sizes does not strand memory in a class.
//
// The allocator also keeps the LRU order, one list per size class: when an allocation
// fails, the coldest value of the same class is the natural victim, because freeing it
// makes exactly the room needed (as in memcached).  When the class holds nothing to evict,
// or a value needs several contiguous slabs, whole slabs are reclaimed instead: the
// window of slabs touched least recently is drained of its values.
//
// Thread-safety: all methods are thread-safe (one mutex; the hash index has its own).
#ifndef KVENGINE_DB_SLAB_ALLOCATOR_H_
#define KVENGINE_DB_SLAB_ALLOCATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "db/item.h"
#include "db/key_arena.h"
#include "util/huge_block_pool.h"
#include "util/mutex.h"

namespace kvengine {

class SlabAllocator {
 public:
  // Manages [base, base + capacity), capacity rounded down to whole slabs, numbering its
  // slabs (Item::slab) from `first_slab`: the memory tier cuts its arena into parts of
  // an allocator each (db/arena_layout.h), and tells an item's part from its slab.
  // REQUIRES: slab_size is a power of two >= 64 KiB, base is page-aligned and
  // capacity >= slab_size.
  SlabAllocator(char* base, uint64_t capacity, uint64_t slab_size, uint32_t first_slab = 0);
  ~SlabAllocator();
  SlabAllocator(const SlabAllocator&) = delete;
  SlabAllocator& operator=(const SlabAllocator&) = delete;

  // Returns an item with room for `size` bytes (->size_class and ->slab set; refs 0; not
  // in the LRU; DataOf() its room), or nullptr when there is no free room.
  Item* Allocate(uint64_t size);
  // Where the item's value lives.  Lock-free: it reads only what is fixed while the
  // item is allocated (its slab's item array, the class sizes).
  // REQUIRES: the caller holds a reference to the item, or its reservation.
  char* DataOf(const Item* item) const;
  // Gives the item a copy of key: for a key of a namespace that NamespaceTags tags, its
  // user part and the tag (db/item.h), else the whole key.  REQUIRES: the item is
  // allocated, not published and has no key; key.size() <= Item::kMaxKeySize.
  void SetKey(Item* item, std::string_view key);
  // Returns the item's room and drops its key.  REQUIRES: refs == 0 and no one else
  // references the item.
  void Free(Item* item);

  // Puts the item at the hot end of its class's LRU, linking it if it is not there --
  // unless it was relinked in the list's current epoch, among its last relinks as many
  // as the list has items: then it stays, and the call takes no lock.
  void Touch(Item* item);
  // Whether Touch(item) would relink it now (a hint: read without the mutex).
  // REQUIRES: the caller holds a reference to the item.
  bool WillRelink(const Item* item) const;

  // Chooses values to evict so that Allocate(size) can succeed, pins each one (refs+1)
  // and removes it from the LRU, appending it to *victims.  Returns false when nothing
  // can be evicted.  The caller removes the victims from the index and unpins them; room
  // appears when their last reference drops.
  bool PickVictims(uint64_t size, std::vector<Item*>* victims);
  // How much a value should go before others (higher: sooner; 0: by recency alone).
  using VictimRank = std::function<int(const Item& item)>;
  // PickVictims, but only values ranked above 0: of the coldest kRankScan values of the
  // class the one ranked highest goes first (the first of rank >= `enough` ends the
  // search).  When the class holds none, the coldest window of slabs holding no value of
  // rank 0 is reclaimed, else one value ranked above 0 of another class goes (its slab
  // comes back once it is empty); false when there is none -- never one of rank 0.  The
  // values of rank 0 it passes are moved to the hot end (a second chance, as CLOCK
  // gives), so that the next search sees others.
  bool PickRankedVictims(uint64_t size, const VictimRank& rank, int enough,
                         std::vector<Item*>* victims);
  // Pins and unlinks, as PickVictims does, the coldest value for which `wanted` holds,
  // looking kRankScan values deep into the class of `size` and then into every other
  // class; the values it passes are moved to the hot end, as PickRankedVictims' are.
  // False when none is found there.
  bool PickVictimWhere(uint64_t size, const std::function<bool(const Item&)>& wanted,
                       std::vector<Item*>* victims);
  // Pins and unlinks `item` as a victim, as PickVictims does.  False when it is not in
  // the LRU (being evicted or freed already).  REQUIRES: the item is indexed, under its
  // shard's lock (so it cannot be freed meanwhile).
  bool ClaimVictim(Item* item, std::vector<Item*>* victims);
  // How deep PickRankedVictims and PickVictimWhere look into a class's cold end.
  static constexpr size_t kRankScan = 512;

  uint64_t slab_size() const { return slab_size_; }
  char* base() const { return base_; }
  uint64_t capacity() const { return num_slabs_ * slab_size_; }
  // The room a value of `size` takes (its class size, or its run of slabs).
  uint64_t AllocationSize(uint64_t size) const;
  // Room handed out to values and room in slabs not owned by any class.
  uint64_t allocated_bytes() const;
  uint64_t free_slab_count() const;
  // RAM of the item arrays of the slabs in use, beyond the items' key room
  // (kItemIndexBytes an item): a slab's array has one Item per slot whether or not the
  // slot holds a value, and goes when the slab is empty.
  uint64_t item_array_bytes() const;
  // RAM for the keys' bytes: the items' key room (Item::kKeyHead bytes each) and what
  // the KeyArena mapped for the rest of longer keys.
  uint64_t key_arena_bytes() const;

 private:
  static constexpr int kFreeSlab = -1;
  static constexpr int kRunSlab = -2;  // part of a multi-slab run (head holds the item)

  struct Slab;
  struct SizeClass;

  int ClassFor(uint64_t size) const;
  Item* AllocateInClass(int cls) REQUIRES(mu_);
  Item* AllocateRun(uint64_t slab_count);
  int64_t TakeFreeSlab();
  // Gives *slab a fresh item array of class cls.
  void NewItems(int cls, Slab* slab);
  void ReleaseSlab(uint32_t index);
  void Unlink(Item* item);
  // Moves a linked item to the hot end of its class's LRU.
  void RelinkHot(Item* item) REQUIRES(mu_);
  void PinAndCollect(Item* item, std::vector<Item*>* victims);
  // The KeyArena block for the rest of a stored key (nullptr for one of up to 16 bytes).
  char* AllocateKeyRest(size_t stored_key_size) EXCLUDES(mu_);
  void FreeKeyRest(char* rest, size_t stored_key_size) EXCLUDES(mu_);
  // Drains the window of `slab_count` slabs touched least recently; with `rank`, only a
  // window none of whose values ranks 0 (each slab's values are looked at: paid only by
  // PickRankedVictims when the class has none ranked).
  bool ReclaimWindow(uint64_t slab_count, std::vector<Item*>* victims,
                     const VictimRank* rank = nullptr) REQUIRES(mu_);
  // Whether every value in the slab (a class slab or a run's head) ranks above 0.
  bool AllRanked(const Slab& slab, const VictimRank& rank) const REQUIRES(mu_);

  char* const base_;
  const uint64_t slab_size_;
  const uint64_t num_slabs_;
  const uint32_t first_slab_;  // Item::slab of the first slab
  std::vector<uint64_t> class_sizes_;

  mutable Mutex mu_;
  std::vector<Slab> slabs_;
  // Never resized: each class's LRU sentinel must keep its address.
  std::unique_ptr<SizeClass[]> classes_;
  uint64_t free_slabs_ = 0;
  uint64_t allocated_bytes_ = 0;
  uint64_t item_array_bytes_ = 0;
  uint64_t touch_clock_ = 0;
  uint64_t scan_hint_ = 0;
  KeyArena keys_;  // the items' keys
};

}  // namespace kvengine

#endif  // KVENGINE_DB_SLAB_ALLOCATOR_H_
