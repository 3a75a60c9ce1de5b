// NamespaceTags: the memory tier's short names for namespace ids (db/item.h).
//
// A namespace's keys are stored as 0xFE | 8-byte id | user key (util/namespace_key.h).
// An Item keeps the first 16 bytes of its key in itself and the rest in the key arena,
// so those 9 prefix bytes would push a 16-byte user key into the arena: an arena
// allocation under the allocator's mutex on every put and one more dependent cache miss
// on every compare.  Instead an item of a namespace stores only the user key and a
// 16-bit tag for the id, in bits its key-rest pointer does not use.  This table gives
// each id its tag: slot t holds the id whose tag is t.
//
// The table is process-wide (an Item reads it without a pointer to it), append-only and
// never persisted: items are process memory, and an id keeps its tag for the life of
// the process (ids are hashes of names; a dropped namespace's tag stays taken, which
// costs 8 bytes).  Tag 0 means "no tag": id 0, or a table past half full (so that
// probes stay short), and the item then stores the whole prefixed key as any key.
//
// Thread-safety: lock-free; any thread may call anything at any time.  A slot goes from
// 0 to an id once (compare-and-swap) and never changes again, so a tag read anywhere
// names the same id forever.
#ifndef KVENGINE_DB_NAMESPACE_TAGS_H_
#define KVENGINE_DB_NAMESPACE_TAGS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kvengine {

class NamespaceTags {
 public:
  static constexpr size_t kSlots = size_t{1} << 16;  // every uint16_t is a slot
  // Tags handed out at most: a table at most half full keeps probes short.
  static constexpr size_t kMaxTags = kSlots / 2;
  // A tag is looked for (and claimed) within this many slots of its id's home.
  static constexpr size_t kMaxProbe = 64;

  constexpr NamespaceTags() = default;
  NamespaceTags(const NamespaceTags&) = delete;
  NamespaceTags& operator=(const NamespaceTags&) = delete;

  // The table the memory tier's items use.
  static NamespaceTags& Global() { return global_; }

  // The tag of `id`: the one it has, else a new one; 0 when id is 0 or no tag is left
  // within its probe (the caller stores the key untagged).
  uint16_t Intern(uint64_t id) {
    // The usual case, inline (every put of a namespace's key asks): the id is in its
    // home slot.  Slot 0 is never a tag, so id 0 (home 0) goes the long way too.
    const size_t home = static_cast<size_t>(id) & (kSlots - 1);
    if (home != 0 && slots_[home].load(std::memory_order_acquire) == id) {
      return static_cast<uint16_t>(home);
    }
    return InternSlow(id);
  }
  // The id tagged `tag`; 0 for tag 0 or a tag never handed out.
  uint64_t IdOf(uint16_t tag) const { return slots_[tag].load(std::memory_order_relaxed); }
  // Tags handed out so far.
  size_t size() const { return used_.load(std::memory_order_relaxed); }

 private:
  uint16_t InternSlow(uint64_t id);

  static NamespaceTags global_;

  std::atomic<uint64_t> slots_[kSlots] = {};  // slot 0 stays 0: tag 0 is "no tag"
  std::atomic<size_t> used_{0};
};

}  // namespace kvengine

#endif  // KVENGINE_DB_NAMESPACE_TAGS_H_
