// MapCheckpoint: the SSD tier's object map and bucket table, saved at Close (and by the
// GC thread while the DB runs) so that the next Open loads them instead of reading every
// bucket's index.
//
// The file (SSDMAP in the DB directory; byte layout in docs/ssd_tier.md) holds, in the
// order a writer streams them:
//   - a header: magic, format version, the slot layout's sizes, flags, the next bucket id
//     and the highest version when it was begun, and its own checksum;
//   - the map: SsdIndex's 64 shards as they lie in memory, each with its own checksum,
//     so a load is a read and a hash per shard, in parallel, no key re-inserted;
//   - the bucket table: for each bucket on disk, its id, file size, creation time (from
//     its header: a file of that id written again would not match), counts, and the dead
//     extents not yet punched, and its live values' bytes and count per namespace; one
//     checksum over the table;
//   - a footer: the table's size and bucket count, the key count, a checksum, the magic.
//
// The checkpoint says what the buckets it lists held.  The SSD tier checks it against
// the directory at Open (every bucket listed and still there has the same size and
// creation time), forgets the keys of listed buckets that are gone (compacted or evicted
// since), and replays what the checkpoint does not cover: the buckets it does not list
// and the tombstone log.  A checkpoint written while the DB ran (kPartial) may name
// buckets in its map that its table does not list (they were not written yet) and
// carries approximate counts: those keys are dropped and the counts taken from the map.
// A checkpoint that fails any check is not used (the full scan runs) and the reason is
// logged.
//
// Thread-safety: a Writer is used by one thread; Read and Remove by Open and Close.
#ifndef KVENGINE_DB_MAP_CHECKPOINT_H_
#define KVENGINE_DB_MAP_CHECKPOINT_H_

#include <cstdint>
#include <memory>
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
  // What a bucket's live values are per namespace (SsdBucket::namespaces).
  struct NamespaceTally {
    uint64_t id = 0, bytes = 0, items = 0;
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
    std::vector<NamespaceTally> namespaces;
  };
  // Flags.
  // Written while the DB ran: its shards were copied one at a time, so the map may name
  // buckets the table does not list, and the table's key and byte counts are approximate.
  static constexpr uint32_t kPartial = 1;
  struct Contents {
    uint64_t next_bucket_id = 0;
    uint64_t max_version = 0;
    uint32_t flags = 0;
    std::vector<Bucket> buckets;
  };

  // Streams a checkpoint to dir/SSDMAP.tmp and renames it into place when finished (not
  // synced: whatever a crash leaves of it fails its checksums and is not used).  A writer
  // destroyed before Finish removes the temporary file.
  class Writer {
   public:
    Writer(Env* env, std::string dir) : env_(env), dir_(std::move(dir)) {}
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;

    // `contents` gives the header fields (its buckets are ignored here).
    Status Begin(const Contents& contents);
    // The shards, in order, kShardCount of them.
    Status AddShard(const SsdIndex::ShardImage& image);
    // The bucket table and the footer; then the file takes the name SSDMAP.
    Status Finish(const std::vector<Bucket>& buckets);

   private:
    Env* const env_;
    const std::string dir_;
    std::unique_ptr<WritableFile> file_;
    size_t shards_ = 0;
    uint64_t keys_ = 0;
    bool finished_ = false;
  };

  // Writes `contents` and `map` at once (the DB is not running: Close).
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
