// SsdIndex: the SSD tier's object map in a fixed 40 bytes per slot, whatever the key
// length.  A key is represented by its fingerprint (XXH3-128 of its bytes), never by a
// copy: the keys themselves stay in the buckets' indexes on disk.
//
// A slot packs the fingerprint (16 bytes), the version (8), the bucket id (4), the
// value's offset in 512-byte units (4), its size (4) and the low 32 bits of its entry
// checksum (4).  Values of 4 GiB or more, bucket ids past 2^32 and offsets past 2 TiB do
// not fit (Fits() says so; the tier refuses to stage such a value).
//
// The table is split into 64 open-addressing tables (Robin Hood probing, deletion
// by backward shift, so there are no tombstone slots), each kept between about 84% and
// 92% full: a shard grows by 10% when it passes 92% and shrinks when it falls under
// half, so deletes give memory back and no growth step copies more than one shard.  At
// those loads a key costs 43-48 bytes of RAM.
//
// Fingerprint collisions: two distinct keys with the same 128-bit fingerprint would share
// one slot.  The probability is about n^2 / 2^129 (1.5e-25 for 10M keys).  The tier
// binds the key into each value's checksum (bucket format v2), so a read of one key never
// returns the other's bytes while checksums are verified (the default); it fails with
// Corruption instead.  See docs/ssd_tier.md.
//
// Thread-safety: none; the SSD tier guards it with its mutex.
#ifndef KVENGINE_DB_SSD_INDEX_H_
#define KVENGINE_DB_SSD_INDEX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

namespace kvengine {

struct KeyFingerprint {
  uint64_t low = 0;
  uint64_t high = 0;

  // Never all-zero: that marks an empty slot.
  static KeyFingerprint Of(std::string_view key);
  bool operator==(const KeyFingerprint&) const = default;
};

// Where a key's SSD value is.  `checksum` is the entry checksum; from the index, only its
// low 32 bits are kept (kChecksumMask).
struct SsdLocation {
  uint64_t bucket = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t version = 0;
  uint64_t checksum = 0;
};

class SsdIndex {
 public:
  static constexpr uint64_t kChecksumMask = 0xffffffffull;
  static constexpr uint64_t kSlotBytes = 40;

  SsdIndex();
  ~SsdIndex();
  SsdIndex(const SsdIndex&) = delete;
  SsdIndex& operator=(const SsdIndex&) = delete;

  // Whether `location` can be stored (see the header comment).
  static bool Fits(const SsdLocation& location);

  // Stores key's location in *location (checksum: low 32 bits only); false when absent.
  bool Find(const KeyFingerprint& key, SsdLocation* location) const;
  // Inserts or replaces key's location.  Returns true when the key was new.
  // REQUIRES: Fits(location).
  bool Put(const KeyFingerprint& key, const SsdLocation& location);
  // Removes key; false when absent.
  bool Erase(const KeyFingerprint& key);
  // Removes every key whose location satisfies pred; returns how many.
  uint64_t EraseIf(const std::function<bool(const SsdLocation&)>& pred);
  // Calls fn for every key (no changes to the index from fn).
  void ForEach(const std::function<void(const KeyFingerprint&, const SsdLocation&)>& fn) const;

  uint64_t size() const { return size_; }
  // Empties the index.
  void Clear();

  // For MapCheckpoint: the shards as they lie in memory (kSlotBytes a slot, the layout
  // is docs/ssd_tier.md's), and their replacement by arrays read back from a file, so
  // that a checkpoint loads without re-inserting a key.  Little-endian hosts only.
  static constexpr size_t kShardCount = 64;
  struct ShardImage {
    uint64_t capacity = 0;
    uint64_t count = 0;
    const char* slots = nullptr;  // capacity * kSlotBytes bytes
  };
  ShardImage GetShardImage(size_t shard) const;
  // Replaces shard `shard` by `capacity` empty slots; returns them for the caller to fill.
  // Distinct shards may be reset and adopted on different threads at once; size() is
  // stale until RecountSize().
  char* ResetShard(size_t shard, uint64_t capacity);
  // After the caller filled ResetShard's slots: true when they hold `count` keys, each
  // of this shard, found where it lies (placed as Put places keys, none twice);
  // otherwise false and the shard is emptied.
  bool AdoptShard(size_t shard, uint64_t count);
  void RecountSize();
  // RAM taken by the slots and the shard table.
  uint64_t MemoryBytes() const;

 private:
  struct Slot;
  struct Shard;
  static constexpr int kShardBits = 6;
  static constexpr size_t kShards = size_t{1} << kShardBits;
  static_assert(kShards == kShardCount);

  Shard& ShardOf(const KeyFingerprint& key);
  const Shard& ShardOf(const KeyFingerprint& key) const;

  std::unique_ptr<Shard[]> shards_;
  uint64_t size_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_SSD_INDEX_H_
