// BucketCompactor: the SSD tier's copy-on-write compaction of buckets.
//
// A round picks the buckets on disk whose dead values still take much of their space
// (gc_deleted_ratio, or any such bytes once the tier is over gc_high_watermark_ratio),
// that are nearly empty (gc_merge_deleted_ratio), or -- when tombstones outnumber live
// keys -- that hold the most tombstones per live byte, coldest first, and compacts them,
// as many at a time as fit one bucket image, into one new bucket per group.
//
// A group is compacted in three steps, which validate in the order CacheLib Navy's
// reclaim does (record header checksum, "does the map still point here?", value
// checksum, compare-and-swap of the map entry):
//   1. CollectLive: the old buckets' indexes are read from their files, each index
//      checked against its own checksum (the records' headers); under the tier's lock,
//      the entries the map still reaches (key -> this bucket, same version) are kept, and
//      the old files are pinned against retirement;
//   2. WriteImage: their values are read, each verified against its checksum, straight
//      into a new bucket's image, in chunks, while the image is appended to the new file;
//      its index lists the values read intact, at the offsets the builder gave them;
//   3. ValidateAndSwap: under the tier's lock, for every entry the builder wrote -- by
//      key, never by position in another list -- the map entry is swapped, old location ->
//      new, only if the key still maps to the old bucket with the same version.  A key
//      that lost the race (deleted or overwritten meanwhile) is dead in the new bucket and
//      gets a tombstone naming it, so no restart revives it.  A value that could not be
//      read leaves the map.  The old buckets leave the bucket table.
// Then the tombstone log is synced, and the old buckets go to the caller, which waits
// for their in-flight reads, deletes their files and drops their tombstones
// (SsdTier::RetireBuckets).  A failure before step 3 leaves the old buckets authoritative
// and no new file behind.
//
// The compactor works on the tier's state (it is the tier's friend): the map, the bucket
// table and the tombstones stay the tier's, and are read and changed only under the
// tier's mu_, which the compactor never holds across I/O.
//
// Thread-safety: one round at a time (the caller holds the tier's gc_mu_).
#ifndef KVENGINE_DB_BUCKET_COMPACTOR_H_
#define KVENGINE_DB_BUCKET_COMPACTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kvengine/status.h"
#include "util/worker_thread.h"

namespace kvengine {

class SsdTier;
struct SsdBucket;

class BucketCompactor {
 public:
  using Buckets = std::vector<std::shared_ptr<SsdBucket>>;

  explicit BucketCompactor(SsdTier* tier) : tier_(tier) {}
  BucketCompactor(const BucketCompactor&) = delete;
  BucketCompactor& operator=(const BucketCompactor&) = delete;

  // The buckets worth compacting now, coldest first, at most gc_max_buckets_per_round,
  // each marked compacting (so that nothing else evicts or compacts it meanwhile).
  // REQUIRES: the tier's mu_ held.
  Buckets PickLocked();

  // Compacts `picked` (from PickLocked), as many at a time as fit one bucket image.
  // Appends the buckets compacted to *retired, for the tier to retire; a group that fails
  // is left as it was and unmarked.  Stores the bytes given back in *reclaimed.  Returns
  // the first failure (each is logged).  REQUIRES: the tier's mu_ not held.
  Status Compact(Buckets picked, uint64_t* reclaimed, Buckets* retired);

 private:
  struct Group;  // one group's compaction, step by step

  // REQUIRES: the tier's mu_ held.  When tombstones outnumber live keys, adds to
  // *candidates the buckets that hold the most tombstones per live byte, until compacting
  // them would bring the count down to the live keys'.
  void AddTombstoneHeavyLocked(Buckets* candidates);

  // Compacts the buckets of `olds` into one new bucket; on success appends them to
  // *retired.  REQUIRES: each is marked compacting.
  Status CompactGroup(const Buckets& olds, uint64_t* reclaimed, Buckets* retired);
  // Step 1.  On failure the old buckets are unmarked and unpinned.
  Status CollectLive(Group* group);
  // Step 2 (only when something is live).  On success group->fresh is the new bucket,
  // on disk and not yet in the table; on failure no new file is left and the old
  // buckets are unmarked and unpinned.
  Status WriteImage(Group* group);
  // Places every live value in the new image and sets up its read.
  Status PlaceValues(Group* group);
  // Reads chunk c of the live entries into the new image (on the chunk reader).
  void ReadChunk(Group* group, size_t c);
  // Once every value is read: the entries of the values read intact, at their new offsets.
  void ListWritten(Group* group);
  // Step 3.  Stores the bytes the old files gave back beyond the new one in *reclaimed
  // and the keys that lost the race in *lost.
  void ValidateAndSwap(Group* group, uint64_t* reclaimed, uint64_t* lost);
  // The compare-and-swap of step 3 for every entry written, then the new bucket joins
  // the table.  REQUIRES: the tier's mu_ held.
  void SwapSurvivorsLocked(Group* group, uint64_t* lost);
  // The old buckets stay authoritative: unpinned and unmarked.  Returns `why`.
  Status GiveUp(Group* group, Status why);

  SsdTier* const tier_;
  WorkerThread chunk_reader_;  // reads compaction chunks while the GC thread writes
};

}  // namespace kvengine

#endif  // KVENGINE_DB_BUCKET_COMPACTOR_H_
