// MapCheckpoint: the SSD tier's object map and bucket table, saved at Close so that the
// next Open loads them instead of reading every bucket's index.
//
// The file (SSDMAP in the DB directory; byte layout in docs/ssd_tier.md) holds:
//   - a header: magic, format version, the slot layout's sizes, the next bucket id and
//     the highest version when it was written, and its own checksum;
//   - the bucket table: for each bucket on disk, its id, file size, creation time (from
//     its header: a file of that id written again would not match), counts, and the dead
//     extents not yet punched; one checksum over the table;
//   - the map: SsdIndex's 64 shards as they lie in memory, each with its own checksum,
//     so a load is a read and a hash per shard, in parallel, no key re-inserted.
//
// The checkpoint says what the buckets it lists held; the SSD tier checks it against
// the directory at Open (every bucket listed is there with the same size and creation
// time, and no other bucket below its next id) and replays only what came after it:
// buckets with higher ids and the tombstone log.  A checkpoint that fails any check is
// not used (the full scan runs) and the reason is logged.
//
// Thread-safety: none needed (Open and Close only).
#ifndef KVENGINE_DB_MAP_CHECKPOINT_H_
#define KVENGINE_DB_MAP_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "db/ssd_index.h"
#include "kvengine/env.h"

namespace kvengine {

class MapCheckpoint {
 public:
  static constexpr const char* kFileName = "SSDMAP";

  struct Extent {
    uint64_t offset = 0, length = 0, value_size = 0;
  };
  // One bucket on disk, as SsdBucket counts it.
  struct Bucket {
    uint64_t id = 0;
    uint64_t file_size = 0;
    uint64_t created_micros = 0;  // the bucket header's
    uint64_t format_version = 0;  // the bucket's
    uint64_t keys = 0, live_keys = 0, total_bytes = 0, deleted_bytes = 0;
    uint64_t punched_bytes = 0, punched_value_bytes = 0;
    std::vector<Extent> dead_extents;  // not punched yet
  };
  struct Contents {
    uint64_t next_bucket_id = 0;
    uint64_t max_version = 0;
    std::vector<Bucket> buckets;
  };

  // Writes `contents` and `map` to dir/SSDMAP (temporary name, then rename; not synced:
  // whatever a crash leaves of it fails its checksums and is not used).
  static Status Write(Env* env, const std::string& dir, const Contents& contents,
                      const SsdIndex& map);
  // Reads dir/SSDMAP into *contents and *map (which it clears first).  NotFound when
  // there is none; Corruption (naming the check) when it is damaged: *map is then empty.
  // Shards are read and verified by `threads` threads.
  static Status Read(Env* env, const std::string& dir, int threads, Contents* contents,
                     SsdIndex* map);
  // Removes dir/SSDMAP, if there is one.
  static Status Remove(Env* env, const std::string& dir);
};

}  // namespace kvengine

#endif  // KVENGINE_DB_MAP_CHECKPOINT_H_
