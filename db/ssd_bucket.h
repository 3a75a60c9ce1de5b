// SsdBucket: the SSD tier's bookkeeping for one bucket, pending or on disk.
#ifndef KVENGINE_DB_SSD_BUCKET_H_
#define KVENGINE_DB_SSD_BUCKET_H_

#include <atomic>
#include <memory>
#include <vector>

#include "table/bucket_builder.h"
#include "table/bucket_reader.h"

namespace kvengine {

struct SsdBucket {
  enum class State { kOpen, kSealed, kOnDisk };

  // Every field but `readers` is read and written under SsdTier::mu_ (a bucket cannot
  // name its tier's mutex for the compiler's analysis; SsdTier's own members say it).
  uint64_t id = 0;
  State state = State::kOpen;
  std::shared_ptr<BucketBuilder> builder;  // the image, until the file is in place
  std::shared_ptr<BucketReader> reader;    // once on disk
  std::vector<BucketEntry> staged;         // committed values, for the index
  int staging = 0;                         // tickets not yet committed or aborted
  uint64_t opened_micros = 0;
  uint64_t file_size = 0;      // on disk; the image's used bytes before
  uint64_t total_bytes = 0;    // value bytes of every entry
  uint64_t deleted_bytes = 0;  // value bytes no longer reachable through the map
  // Dead values whose blocks the next GC round gives back to the filesystem (punches a
  // hole over), and what has been given back so far.
  struct Extent {
    uint64_t offset = 0;
    uint64_t length = 0;      // the value's padded bytes (PaddedValueSize)
    uint64_t value_size = 0;  // of deleted_bytes: credited when the extent is punched
  };
  std::vector<Extent> dead_extents;
  // How many of dead_extents share their blocks with live values, as the last GC round
  // found: until another value dies in this bucket, a round has nothing to punch here.
  size_t dead_extents_parked = 0;
  uint64_t punched_bytes = 0;        // file bytes given back (padded)
  uint64_t punched_value_bytes = 0;  // of deleted_bytes
  uint64_t keys = 0;
  uint64_t live_keys = 0;
  // The live values' bytes and count per namespace (the id in their keys; 0: the default
  // namespace), which the SSD tier's per-namespace figures and quotas add up
  // (db/ssd_namespaces.cc).  A bucket holds one or a few namespaces' values: a short
  // list, searched in order.
  struct NamespaceTally {
    uint64_t id = 0;
    uint64_t bytes = 0;
    uint64_t items = 0;
  };
  std::vector<NamespaceTally> namespaces;
  // A bucket restored from a partial checkpoint, whose counts (live_keys, and
  // `live_bytes`) were taken from the map: its tally is scaled to add up to them, each
  // namespace keeping its proportion (an approximation, gone with the bucket); with no
  // tally to scale, the default namespace's.  Defined in db/ssd_namespaces.cc.
  void FitNamespacesTo(uint64_t live_bytes);
  uint64_t last_access = 0;  // SsdTier's access clock, for LRU choices
  bool compacting = false;
  bool write_failed = false;
  bool writing = false;  // a writer thread has taken it

  // The format its values are placed in: the file's, or the builder's (the current).
  uint32_t format_version() const {
    return reader != nullptr ? reader->header().format_version : kBucketFormatVersion;
  }

  // Bytes of the file that still take disk space.
  uint64_t allocated_bytes() const { return file_size - punched_bytes; }
  // Deleted value bytes still taking disk space: what only a compaction can reclaim.
  uint64_t unreclaimed_bytes() const { return deleted_bytes - punched_value_bytes; }

  // Reads in flight against the file; a retired bucket's file is deleted only once
  // this is zero.
  std::atomic<int> readers{0};
};

}  // namespace kvengine

#endif  // KVENGINE_DB_SSD_BUCKET_H_
