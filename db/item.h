// Item: the descriptor of one value held in the memory tier.
//
// Items live in arrays owned by their slab (see SlabAllocator), so storing a value costs
// no per-value allocation of its bytes.  The arrays come from pools of huge-page-advised
// memory (util/huge_block_pool.h), and so do the bytes of keys over 16 bytes
// (db/key_arena.h): at millions of keys each of a lookup's reads in 4 KiB-paged heap
// memory cost a TLB miss and a page walk besides the cache miss.  An item is reference counted: the
// index holds one reference while the key maps to it, and every reader pins it while copying out,
// so an overwrite or delete never frees bytes that a reader is still copying.
//
// An item is one cache line (64 bytes, line-aligned), and a key's first 16 bytes live in
// it: a lookup's dependent reads are its index slot, then its item, where the key of
// up to 16 bytes is compared (a longer key's rest is one more read, in the allocator's
// KeyArena).  With the key elsewhere, a lookup read slot, item, then key: one dependent
// cache miss more, the largest part of what a lookup cost beyond a plain table's at
// millions of keys (docs/benchmarks.md), and a 48-byte item straddled two lines one time
// in two.  The RAM is what the 48-byte item and its key's arena block took: the 16
// bytes of key room replace a 16-byte key's block, or the first 16 bytes of a longer
// key's.  Every slot of every slab in use has an item: with the index's 16-byte slots
// between 35% and 70% full (db/key_index.h), a key costs 48 B (the item beyond its key
// room) plus 23-46 B of slots beside its own bytes and its value, within issue #16's
// 96 B (the unused slots of a slab not yet full add their items).  So it holds only
// what cannot be derived:
//   - the key: its head in the item, its rest (keys over 16 bytes) pointed to, not a
//     std::string (32 B); a namespace's key without its 9-byte prefix (below);
//   - no hash: the index slot keeps it, and the rare unindexing that has no lookup at
//     hand (an eviction) hashes the key again;
//   - no value pointer or slot number: SlabAllocator::DataOf computes the value's address
//     from the slab, the item's position in the slab's array and the class size;
//   - no "indexed" flag: the index itself is asked (KeyIndex::Contains), under the same
//     shard lock that guarded the flag;
//   - no "in LRU" flag: lru_prev is null exactly when the item is not linked;
//   - sizes as bit-fields, within the limits Options::Validate enforces.
// Fields written under different locks are never packed into one memory location (a
// bit-field's word is one), so each lock guards what it guarded before.
//
// Namespaces.  A key of a namespace is 0xFE | its 8-byte id | the user's key
// (util/namespace_key.h).  Stored whole, a 16-byte user key's 25 bytes would overflow
// the 16 bytes of key room: a key-arena block per key (8 or 16 more bytes of RAM,
// allocated under the allocator's mutex on each put) and one more dependent read on
// each compare; 100-byte puts of 16-byte keys cost 0.69-0.75x per CPU second in a
// namespace (docs/benchmarks.md).  So an item stores such a key's user part exactly as
// it stores a default-namespace key, and the namespace as a 16-bit tag (NamespaceTags,
// db/namespace_tags.h) in the top 16 bits of the key-rest pointer's word, which user
// pointers below 2^48 leave free.  RAM per key is then the default namespace's for every
// key size, and KeyString() and KeySize() give the whole internal key, prefix included,
// so that everything above the item sees the bytes it saw before.  An id that gets no
// tag (the table full) leaves its keys stored whole, untagged, as before.
#ifndef KVENGINE_DB_ITEM_H_
#define KVENGINE_DB_ITEM_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "db/namespace_tags.h"
#include "util/namespace_key.h"

namespace kvengine {

struct alignas(64) Item {
  // Bit-field limits, above Options::Validate's: max_value_size <= 1 TiB, max_key_size
  // <= 1 MiB, at most 16M slabs, fewer than 256 size classes.
  static constexpr uint64_t kMaxSize = (uint64_t{1} << 43) - 1;
  static constexpr uint64_t kMaxKeySize = (uint64_t{1} << 21) - 1;
  static constexpr uint32_t kMaxSlabs = uint32_t{1} << 24;
  static constexpr uint32_t kMaxClasses = 256;
  // Key bytes held in the item itself.
  static constexpr size_t kKeyHead = 16;

  // Written by the putting thread before the item is published (the key through
  // SlabAllocator::SetKey); read-only afterwards until the item is freed
  // (SlabAllocator::Free drops the key).  The stored key is the whole key, or for a key
  // of a tagged namespace its user part (the key less its ns::kPrefixSize prefix).
  char key_head[kKeyHead] = {};  // the stored key's first min(stored_key_size, 16) bytes
  // The stored key's other stored_key_size - 16 bytes (null for a short one) in the low
  // kTagShift bits, the namespace's tag (NamespaceTags; 0: none) in the bits above.
  uintptr_t key_rest_word = 0;
  uint64_t version = 0;
  uint64_t size : 43 = 0;  // value bytes
  uint64_t stored_key_size : 21 = 0;

  // LRU links.  Written under the allocator's mutex; atomic (always relaxed) so that a
  // reader may prefetch an item's neighbours before Touch relinks it, and Touch may see
  // without the mutex that the item needs no relinking (SlabAllocator::Touch): what
  // such a reader sees is a hint, nothing more.  lru_prev is null exactly when the item
  // is not in the LRU; while it is, lru_prev's low 6 bits (items are 64-byte aligned)
  // hold the LRU epoch of its last relink, the rest the previous item (LruPrev()).
  std::atomic<Item*> lru_prev{nullptr};
  std::atomic<Item*> lru_next{nullptr};

  // Placement, set by the allocator before it hands the item out.
  uint32_t slab : 24 = 0;  // slab holding the value (the first one for a run)
  uint32_t size_class : 8 = 0;

  // 1 per index reference + 1 per pin.  The item is freed when it drops to 0.
  std::atomic<uint32_t> refs{0};

  // Bits of key_rest_word below the tag: x86-64 and aarch64 Linux user pointers are
  // under 2^48 (SlabAllocator::SetKey checks each one and stores a key untagged if not).
  static constexpr int kTagShift = 48;
  static constexpr uintptr_t kRestMask = (uintptr_t{1} << kTagShift) - 1;
  static bool Taggable(const char* rest) {
    return (reinterpret_cast<uintptr_t>(rest) & ~kRestMask) == 0;
  }

  // Bytes of a stored key beyond the item (in the KeyArena): 0 for one of up to 16 bytes.
  static uint64_t RestSize(uint64_t stored_key_size) {
    return stored_key_size > kKeyHead ? stored_key_size - kKeyHead : 0;
  }
  char* KeyRest() const { return reinterpret_cast<char*>(key_rest_word & kRestMask); }
  // The tag of the item's namespace; 0 for the default namespace and untagged ones.
  uint16_t NamespaceTag() const { return static_cast<uint16_t>(key_rest_word >> kTagShift); }
  // The size of the key the item stores (see key_head) and of the key it is (with the
  // namespace's prefix).
  uint64_t StoredKeySize() const { return stored_key_size; }
  uint64_t KeySize() const { return stored_key_size + (NamespaceTag() != 0 ? ns::kPrefixSize : 0); }

  // Whether the item's key is `key` (the whole internal key): compared in the item, and
  // at KeyRest() only for a stored key over 16 bytes whose head matched.  An untagged
  // item (every key of the default namespace) takes one branch more than the plain
  // compare; a tagged one compares the prefix against its tag's id first.
  bool KeyEquals(std::string_view key) const {
    if (__builtin_expect(key_rest_word > kRestMask, 0)) return TaggedKeyEquals(key);
    return StoredKeyEquals(key, reinterpret_cast<const char*>(key_rest_word));
  }
  // A copy of the whole key (its prefix and two pieces joined), for the few callers
  // that need it whole.
  std::string KeyString() const {
    const uint16_t tag = NamespaceTag();
    std::string key(KeySize(), '\0');
    if (tag != 0) ns::EncodePrefix(NamespaceTags::Global().IdOf(tag), key.data());
    char* stored = key.data() + (key.size() - stored_key_size);
    std::memcpy(stored, key_head, std::min<size_t>(stored_key_size, kKeyHead));
    if (stored_key_size > kKeyHead) {
      std::memcpy(stored + kKeyHead, KeyRest(), stored_key_size - kKeyHead);
    }
    return key;
  }
  // Stores `stored` (the whole key, or with a tag the user part) in the item, its rest
  // at `rest` (RestSize(stored.size()) bytes; unused for a short key).
  // REQUIRES: the item has no key; Taggable(rest) if tag != 0.
  void SetKeyBytes(std::string_view stored, char* rest, uint16_t tag = 0) {
    stored_key_size = stored.size();
    const size_t head = std::min<size_t>(stored.size(), kKeyHead);
    if (head != 0) std::memcpy(key_head, stored.data(), head);
    if (stored.size() <= kKeyHead) rest = nullptr;
    if (rest != nullptr) std::memcpy(rest, stored.data() + kKeyHead, stored.size() - kKeyHead);
    key_rest_word = reinterpret_cast<uintptr_t>(rest) | uintptr_t{tag} << kTagShift;
  }
  void ClearKey() {
    key_rest_word = 0;
    stored_key_size = 0;
  }
  bool in_lru() const { return lru_prev.load(std::memory_order_relaxed) != nullptr; }
  static constexpr uintptr_t kEpochMask = 63;
  Item* LruPrev() const {
    const uintptr_t raw = reinterpret_cast<uintptr_t>(lru_prev.load(std::memory_order_relaxed));
    return reinterpret_cast<Item*>(raw & ~kEpochMask);
  }
  uint32_t lru_epoch() const {
    const uintptr_t raw = reinterpret_cast<uintptr_t>(lru_prev.load(std::memory_order_relaxed));
    return static_cast<uint32_t>(raw & kEpochMask);
  }

 private:
  // Whether the stored key, with its rest at `rest`, is `stored`.
  bool StoredKeyEquals(std::string_view stored, const char* rest) const {
    if (stored.size() != stored_key_size) return false;
    const size_t head = std::min<size_t>(stored.size(), kKeyHead);
    if (head != 0 && std::memcmp(key_head, stored.data(), head) != 0) return false;
    return stored.size() <= kKeyHead ||
           std::memcmp(rest, stored.data() + kKeyHead, stored.size() - kKeyHead) == 0;
  }
  // KeyEquals of a tagged item: `key` is its tag's id's prefix, then the stored bytes.
  bool TaggedKeyEquals(std::string_view key) const {
    if (key.size() != stored_key_size + ns::kPrefixSize || !ns::IsNamespaced(key)) return false;
    if (ns::IdOfKey(key) != NamespaceTags::Global().IdOf(NamespaceTag())) return false;
    return StoredKeyEquals(key.substr(ns::kPrefixSize), KeyRest());
  }
};

// Item beyond its key room + its share of the index slots must stay within 96 B a key
// (see above); a field added here has to pay for itself elsewhere.
static_assert(sizeof(Item) == 64, "Item grew: the memory tier's RAM per key is bounded by it");
// What an item costs beyond the key bytes it holds: memory.index_bytes counts this much
// per item (the key room is counted with the keys, SlabAllocator::key_arena_bytes).
constexpr uint64_t kItemIndexBytes = sizeof(Item) - Item::kKeyHead;

}  // namespace kvengine

#endif  // KVENGINE_DB_ITEM_H_
