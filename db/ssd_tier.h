// SsdTier: values on SSD, in immutable bucket files, with durable tombstones and a
// copy-on-write garbage collector.
//
// Values arrive staged: Stage() copies a value into the open bucket's in-memory image
// (outside any lock), Commit() publishes it in the object map under the caller's per-key
// lock.  A bucket is sealed when it reaches bucket_keys_limit or bucket_size_limit, when
// it has been open for bucket_flush_timeout_ms, or on Flush(); a background writer
// writes each sealed bucket to a temporary file, syncs it, renames it into place and
// syncs the directory.  Until then reads are served from the image.
//
// The object map (key fingerprint -> bucket, offset, size, version, checksum: SsdIndex,
// 40 bytes a slot whatever the key length) lives in memory and is rebuilt at Open from the buckets
// and the tombstone log (see db/ssd_recovery.cc). Whenever a value leaves the map while its bucket
// stays (delete, overwrite), a tombstone (key, version, bucket) is logged, so a restart never
// brings it back.
//
// The GC (db/ssd_gc.cc) first gives the blocks of deleted values back to the filesystem in
// place (punches holes over them) once their tombstones are durable; then its compactor
// (db/bucket_compactor.h) compacts buckets whose remaining garbage is high, or that are
// nearly empty: it copies their live values into a new bucket, then re-validates each key
// against the map under the lock and swaps only those that still point at the old bucket
// with the same version.
//
// Locking: mu_ guards the map and the bucket table.  Callers that change both tiers for a
// key (the DB) hold that key's memory-tier shard lock around Commit/Erase*, so a key
// moves between tiers atomically; mu_ is always taken inside it, never around it.
//
// Thread-safety: all public methods are thread-safe.
#ifndef KVENGINE_DB_SSD_TIER_H_
#define KVENGINE_DB_SSD_TIER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "db/bucket_compactor.h"
#include "db/bucket_file_cache.h"
#include "db/map_checkpoint.h"
#include "db/namespace_usage.h"
#include "db/ssd_index.h"
#include "db/tombstone_log.h"
#include "kvengine/env.h"
#include "kvengine/options.h"
#include "table/bucket_builder.h"
#include "table/bucket_reader.h"
#include "util/grace_period.h"
#include "util/mutex.h"
#include "util/worker_thread.h"

namespace kvengine {

class RemovalFeed;
class EvictedKeys;

class Logger;

class SsdTier {
 public:
  struct Stats {
    uint64_t keys = 0;
    uint64_t live_bytes = 0;  // value bytes reachable through the map
    uint64_t used_bytes = 0;  // bucket files + images not yet written
    uint64_t capacity_bytes = 0;
    uint64_t buckets = 0;
    uint64_t pending_buckets = 0;  // open or sealed, not yet on disk
    uint64_t deleted_bytes = 0;    // dead value bytes still taking space in buckets
    uint64_t offloads = 0, offload_bytes = 0;
    uint64_t offload_failures = 0;  // Stage refused (no space, writer failing)
    uint64_t reads = 0, read_bytes = 0, read_errors = 0;
    uint64_t bucket_writes = 0, bucket_write_errors = 0;
    uint64_t tombstones = 0;
    uint64_t evicted_buckets = 0, evicted_keys = 0;
    uint64_t gc_rounds = 0, gc_buckets_compacted = 0, gc_bytes_reclaimed = 0,
             gc_bytes_rewritten = 0, gc_keys_lost_race = 0;
    uint64_t gc_bytes_punched = 0;  // of gc_bytes_reclaimed: given back in place
    uint64_t quarantined_buckets = 0, recovered_keys = 0, torn_tombstone_bytes = 0;
    // Tombstone log bytes found damaged at Open (a bad stretch before valid records):
    // the deletes they held are lost.  Non-zero calls for attention.
    uint64_t damaged_tombstone_bytes = 0;
    // 1 when the log held less than its guard says at Open (lost deletes), and the values
    // dropped then because a lost delete may have covered them.
    uint64_t lost_tombstone_logs = 0, lost_delete_drops = 0;
    bool io_uring = false;
    bool direct_io = false;
    // Bucket files held open now (at most max_open_files, plus any pinned by reads past
    // it) and the opens made since Open (a high rate means max_open_files is too low).
    uint64_t open_files = 0, file_opens = 0;
    // The bucket files the cache may keep open: max_open_files, clamped at Open to the
    // descriptor budget (env/descriptor_budget.h); the process's RLIMIT_NOFILE and the
    // engine's share of it then (0 where the Env cannot tell).
    uint64_t max_open_files = 0, descriptor_limit = 0, descriptor_budget = 0;
    // RAM the SSD tier's index takes (estimated from the allocator's sizes): the object
    // map and the tombstones kept for the log.  Bucket indexes stay on disk.
    uint64_t index_bytes = 0;
    // Open: how long it took; the keys loaded from the map checkpoint (SSDMAP) rather
    // than from the buckets' indexes; 1 when a checkpoint was there but stale or
    // damaged, so that every bucket was read instead (the log says why).
    uint64_t open_micros = 0, checkpoint_keys = 0, checkpoint_rejected = 0;
    // Map checkpoints written (at Close and while running), and the keys in bucket files
    // the one on disk does not cover: what the next Open replays.
    uint64_t checkpoint_writes = 0, checkpoint_backlog = 0;
  };

  // A staged value: copied into a bucket image, not yet visible.  Commit or Abort it.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&&) = default;
    Ticket& operator=(Ticket&&) = default;
    bool valid() const { return bucket_ != nullptr; }

   private:
    friend class SsdTier;
    std::shared_ptr<struct SsdBucket> bucket_;
    std::string key_;
    uint64_t offset_ = 0, size_ = 0, checksum_ = 0;
  };

  // One key of a batched read.
  struct Read {
    Slice key;
    std::span<const MutableSlice> dest;
    uint64_t size = 0;     // out: the value size (also on BufferTooSmall)
    uint64_t version = 0;  // out
    Status status;         // out: OK, NotFound, BufferTooSmall, Corruption, IOError
  };

  // Opens (recovering) the SSD tier in `dir`.  `usage` (not owned; outlives the tier):
  // the table the tier charges its values to, per namespace, and whose SSD quotas and
  // weights it keeps; null: a table of its own (no quotas).
  static Status Open(const Options& options, const std::string& dir, Env* env, Logger* logger,
                     std::unique_ptr<SsdTier>* result, NamespaceUsage* usage = nullptr);
  ~SsdTier();

  // Seals and writes what is pending, syncs the tombstone log, stops the threads, and
  // saves the map checkpoint (SSDMAP) for the next Open.
  Status Close();

  // Where the tier announces the keys it evicts (with their bucket) or erases (not
  // owned; outlives the tier).  Set before the tier is used.
  void SetRemovalFeed(RemovalFeed* feed) { removal_feed_ = feed; }

  // The highest version found at Open; the DB hands out versions above it.
  uint64_t recovered_max_version() const { return recovered_max_version_; }

  // How long Stage may wait for a bucket writer that is behind.  A put's staging (a
  // write-through put, an eviction that makes room for a put) runs inside a call its
  // caller waits on -- an attached client's request, whose peer_timeout_ms is 2 s by
  // default -- so it waits at most kPutStageWait, and not at all for kBehindBackoff
  // after a put's wait ran out: the put fails NoSpace soon, as a cache put should,
  // rather than stall past its caller's timeout.  Flush waits up to kFlushStageWait.
  enum class StageWait { kPut, kFlush };
  static constexpr std::chrono::milliseconds kPutStageWait{500};
  static constexpr std::chrono::milliseconds kBehindBackoff{100};
  static constexpr std::chrono::milliseconds kFlushStageWait{10000};

  // Copies the value into the open bucket.  NoSpace when the tier is full and may not
  // evict, or the writer is behind past `wait` (or keeps failing) -- with a backlog, or
  // with the room a new bucket needs held by buckets it has yet to write -- or the key's
  // namespace is at its SSD quota and none of its own values can make room (its values
  // that can are dropped first, coldest buckets first); nothing else changes then.
  Status Stage(const Slice& key, std::span<const Slice> parts, uint64_t size, Ticket* ticket,
               StageWait wait = StageWait::kFlush);
  // Publishes a staged value as key's SSD value with `version`, superseding (and
  // tombstoning) an older one.  REQUIRES: the caller holds key's lock.
  void Commit(Ticket* ticket, uint64_t version);
  // Gives a staged value up; its room in the bucket is wasted.
  void Abort(Ticket* ticket);

  bool HasVersion(const Slice& key, uint64_t version);
  bool Contains(const Slice& key);
  bool Locate(const Slice& key, SsdLocation* location);
  // Removes key if its SSD version is older than `version` (an overwrite whose value is
  // not written to SSD), recorded in the removal feed as an SSD deletion.  REQUIRES:
  // key's lock held.
  void EraseOlderThan(const Slice& key, uint64_t version);
  // Removes key; false when absent.  REQUIRES: key's lock held.
  bool Erase(const Slice& key);
  // Calls fn(key) for every key on SSD when the call began (keys written meanwhile may
  // be left out; a key left twice by a crash may come twice).  The keys are not in RAM:
  // they are read from the buckets' indexes on disk, with no lock held while fn runs
  // (compaction waits meanwhile).
  void ForEachKey(const std::function<void(const std::string&)>& fn);

  // Called for a read of MultiGet as soon as its value is in place, on the calling thread.
  using ReadDone = std::function<void(size_t index)>;
  // Reads each key's value into its destination; all file reads of the batch go out as
  // one submission.  `on_read(i)`, when set, is called once for each read i that
  // succeeds, as soon as its bytes are in place (verified), while later reads may still
  // be in flight: what the caller does with it overlaps them.  No lock is held then.
  void MultiGet(std::span<Read> reads, bool verify_checksums, const ReadDone& on_read = nullptr);

  // Seals the open bucket, waits until every sealed bucket is on disk, syncs the log.
  Status Flush();

  // Runs one GC round now.  Stores bytes reclaimed in *reclaimed (may be nullptr).
  Status CompactBuckets(uint64_t* reclaimed);

  Stats GetStats() const;

  // OK while the tier takes writes; the bucket writer's last failure while it keeps
  // failing (cleared by its next success): the tier then serves reads only.
  Status WriterStatus() const;

  // Whether `size` more bytes of key's namespace would pass its SSD quota now.
  bool OverNamespaceQuota(const Slice& key, uint64_t size);

  // Told the hash (Hash64) of every key dropped with a bucket evicted to make room.  Not
  // owned; set before the tier is used.  nullptr: nobody is told.
  void SetEvictedKeys(EvictedKeys* evicted) { evicted_keys_ = evicted; }

 private:
  // Compaction works on the map and the bucket table under mu_ (db/bucket_compactor.h).
  friend class BucketCompactor;

  SsdTier(const Options& options, std::string dir, Env* env, Logger* logger);

  // ---------------------------------------------------------------- recovery
  // ssd_recovery.cc; only during Open, before the tier's threads start.  Recover() rebuilds the
  // map, the bucket table and the tombstone log from the directory, in these steps:
  // Holds mu_ throughout (nothing else runs yet) so that every step may touch the map.
  Status Recover() EXCLUDES(mu_);
  // 1. Scan: the ids of the bucket files in the directory, sorted, into *ids (and
  // next_bucket_id_ past them and past the quarantined ones).  Leftover temporary files
  // are removed; a file named like a bucket but not as this DB names one is quarantined.
  Status ScanDirectory(std::vector<uint64_t>* ids) REQUIRES(mu_);
  // 2. Checkpoint: loads the map checkpoint when it matches the buckets listed in `ids`
  // (adding them to buckets_, the map and the counts); *covered: the buckets it
  // restored.  Anything else (none, stale, damaged) leaves the tier empty; stale or
  // damaged is logged and counted.
  void LoadCheckpoint(const std::vector<uint64_t>& ids, std::vector<uint64_t>* covered)
      REQUIRES(mu_);
  // Opens bucket `id`'s reader; out of descriptors (EMFILE), closes the unused cached
  // files and tries once more.
  Status OpenBucketReader(uint64_t id, bool read_index, std::unique_ptr<BucketReader>* reader);
  // 3. Open: ReadBuckets opens and verifies the buckets `ids` (several at a time), each
  // with its index, touching nothing but the file cache (so it may run beside a replay);
  // then OpenBuckets quarantines and leaves out one that is damaged, of an unknown format
  // or not a file.  *opened: the others, in id order.  Fails on any other error.
  struct OpenedReaders {
    std::vector<uint64_t> ids;
    std::vector<std::unique_ptr<BucketReader>> readers;
    std::vector<Status> status;
  };
  OpenedReaders ReadBuckets(std::vector<uint64_t> ids);
  Status OpenBuckets(OpenedReaders read, std::vector<std::shared_ptr<SsdBucket>>* opened)
      REQUIRES(mu_);
  // 4. Tombstones: reads the log past a torn tail and damage (logged; a damaged log is
  // copied to quarantine/ first, since it is rewritten at the end).  Fails on a file
  // that is not a log.
  // `have_buckets`: bucket files are in the directory (then a missing log and guard
  // mean lost deletes, not a new DB).
  Status ReadTombstones(bool have_buckets, std::vector<TombstoneLog::Record>* records,
                        TombstoneLog::ReadReport* report);
  // 5. Replay: applies the tombstones logged after the checkpoint to the buckets it
  // restored (the deletes it does not know) and keeps every record of a restored bucket.
  void ApplyTombstonesToCheckpoint(const std::vector<uint64_t>& covered,
                                   const std::vector<TombstoneLog::Record>& records) REQUIRES(mu_);
  // ... then opens the buckets `ids` (OpenBuckets, a window at a time) and replays
  // them in id order into the map: a (key, version) with a tombstone is dead, the
  // highest version of a key wins, an older one gets a tombstone.  Fails as OpenBuckets.
  Status ReplayBuckets(const std::vector<uint64_t>& ids,
                       const std::vector<TombstoneLog::Record>& records) REQUIRES(mu_);
  // One entry of bucket b; `dead` holds the (key, version) of every tombstone, encoded
  // as ssd_recovery.cc's DeadKey.
  void ReplayEntry(SsdBucket* b, const BucketEntry& e, const std::unordered_set<std::string>& dead)
      REQUIRES(mu_);
  // The value (key, version) at [offset, offset+size) of bucket `in` is dead at Open:
  // counted deleted, its extent queued (DeadAtOpen), its tombstone kept for the log.
  void BuryAtOpen(SsdBucket* in, const std::string& key, uint64_t version, uint64_t offset,
                  uint64_t size) REQUIRES(mu_);
  // A value of bucket b found dead at Open: its extent is counted as punched when the
  // file already has a hole there (punched before the restart), else queued for the GC.
  // REQUIRES: b's file size is in used_bytes_.
  void DeadAtOpen(SsdBucket* b, uint64_t offset, uint64_t size) REQUIRES(mu_);
  // A dead extent of bucket b found at Open (from the tombstones, or queued in the
  // checkpoint): the parts of it that are already holes count as punched, the rest are
  // queued for the GC.  REQUIRES: b's file size is in used_bytes_.
  void DeadExtentAtOpen(SsdBucket* b, uint64_t offset, uint64_t length, uint64_t value_size)
      REQUIRES(mu_);
  // Quarantine: moves dir_/name (a file or directory that must not take part in the DB)
  // into quarantine/, under a name no earlier casualty holds; logs and counts it.  Fails
  // (still counted) when it cannot be moved.
  Status Quarantine(const std::string& name, const Status& why);
  static constexpr const char* kQuarantineDir = "quarantine";
  // Stores in *path a path in quarantine/ for `name` that nothing holds yet.
  Status QuarantinePath(const std::string& name, std::string* path);
  // Copies the tombstone log to quarantine/ (TOMBSTONES.damaged), synced; *copy: where.
  Status KeepDamagedLog(std::string* copy);
  // ---------------------------------------------------------------- the map checkpoint

  // Writes the map checkpoint, or removes a stale one when the state cannot be saved
  // (buckets not written, duplicate copies left by a crash).  At Close, threads stopped.
  // A large map whose checkpoint on disk leaves little to replay keeps that one: Close
  // does not spend a second writing hundreds of MB that the next Open would save
  // milliseconds with.
  Status WriteCheckpoint();
  // The GC thread's checkpoint, written while puts, deletes and compactions go on, when
  // the buckets the one on disk does not cover hold CheckpointBacklogLimitLocked() keys
  // or more.  Shards are copied one at a time under mu_ (a few ms each), so the file is
  // kPartial (db/map_checkpoint.h).
  Status MaybeWriteCheckpointWhileRunning();
  uint64_t CheckpointBacklogLimitLocked() const REQUIRES(mu_);
  // The header fields and bucket table of a checkpoint of the state now.
  MapCheckpoint::Contents CheckpointContentsLocked(uint32_t flags) const REQUIRES(mu_);
  // ---------------------------------------------------------------- running
  void WriterLoop(int index);
  // The oldest sealed bucket no writer has taken, or null.
  std::shared_ptr<SsdBucket> NextToWriteLocked() REQUIRES(mu_);
  void GcLoop();
  void SealOpenLocked() REQUIRES(mu_);
  // Releases mu_ while it retires the buckets it evicts, and takes it again.
  Status MakeRoomLocked(uint64_t bytes) REQUIRES(mu_);
  // Whether the options let the tier evict buckets to make room.
  bool may_evict() const {
    return !options_.disable_ssd_eviction && options_.ssd_eviction != SsdEviction::kNone;
  }
  // ---------------------------------------------------------------- namespaces
  // ssd_namespaces.cc (issue #29): per-bucket tallies of live values by namespace, the
  // namespace figures they add up to, SSD quotas, and fair shares in bucket evictions.
  NamespaceUsage::Slot* NamespaceSlot(uint64_t id);
  // A live value of `key` (size bytes) enters (`add`) or leaves bucket b: its tally and
  // its namespace's ssd_bytes and ssd_items follow.
  void TallyLocked(SsdBucket* b, std::string_view key, uint64_t size, bool add) REQUIRES(mu_);
  // Bucket b leaves the table: its namespaces lose what its tally holds.
  void DropTallyLocked(SsdBucket* b) REQUIRES(mu_);
  // A bucket restored from the checkpoint: its tally counts for its namespaces.
  void AddTallyToUsageLocked(const SsdBucket& b) REQUIRES(mu_);
  // Every bucket, coldest (lru) or oldest (fifo) first.
  std::vector<std::shared_ptr<SsdBucket>> EvictionOrderLocked() const REQUIRES(mu_);
  // Before key's value of `size` bytes is staged: when its namespace would pass its SSD
  // quota, drops the namespace's own values, coldest buckets first (each one's index
  // read), until it is a sixteenth of the quota under what the value needs.  NoSpace,
  // naming the namespace, when the value is larger than the quota or nothing of the
  // namespace can go.
  Status MakeNamespaceRoomLocked(std::string_view key, uint64_t size) REQUIRES(mu_);
  // The buckets on disk to evict for `bytes` more: the coldest first, but while
  // namespaces share the tier, the one holding the fewest live bytes of namespaces within
  // their fair share for its size.  Fewer when not enough can go.
  std::vector<std::shared_ptr<SsdBucket>> PickEvictionVictimsLocked(uint64_t bytes) REQUIRES(mu_);
  // Bucket b is evicted: each namespace counts the values it loses with it.
  void CountBucketEvictionsLocked(const SsdBucket& b) REQUIRES(mu_);
  void TombstoneLocked(const std::string& key, const SsdLocation& loc) REQUIRES(mu_);
  // Queues the blocks of a dead value in `bucket` (on disk) for the next GC round to
  // punch a hole over, when gc_punch_holes is on.
  void QueueHoleLocked(SsdBucket* bucket, uint64_t offset, uint64_t size) REQUIRES(mu_);
  // Removes key (whose fingerprint is fp, found at loc) from the map: its bucket counts
  // it deleted, and with `tombstone` the log records it.
  void RemoveLocked(const std::string& key, const KeyFingerprint& fp, const SsdLocation& loc,
                    bool tombstone) REQUIRES(mu_);
  // Whether key (fingerprint fp) maps to `bucket` with `version`.
  bool MapsToLocked(const KeyFingerprint& fp, uint64_t bucket, uint64_t version) const
      REQUIRES(mu_);
  // Heap bytes a key copy takes besides its std::string (none for a short key).
  static uint64_t KeyHeapBytes(const std::string& key);
  uint64_t IndexBytesLocked() const REQUIRES(mu_);
  // Removes from map_ every key whose value lies in `bucket` (evicted); returns how many.
  // Reads the bucket's index from its file.
  uint64_t EraseKeysOfLocked(const SsdBucket& bucket) REQUIRES(mu_);
  // Reads bucket's index (kept on disk only) through the file cache.
  Status ReadBucketIndex(const SsdBucket& bucket, std::vector<BucketEntry>* entries);
  Status WriteBucket(const std::shared_ptr<SsdBucket>& bucket);
  // Appends a builder's image to a bucket file, possibly piece by piece while the image
  // is still being filled.
  using ImageAppender = std::function<Status(WritableFile* file)>;
  // Writes builder's image with an index of `entries` as a bucket file (temporary name,
  // sync, rename, directory sync) and opens it.  The image goes through `append_image`
  // when one is given, else in one append; `entries` is read only after that, so the
  // appender may still be filling it.  On failure no file is left behind.
  Status WriteBucketFile(const BucketBuilder& builder, const std::vector<BucketEntry>& entries,
                         uint64_t* file_size, std::unique_ptr<BucketReader>* reader,
                         const ImageAppender& append_image = nullptr);
  // A builder for bucket `id` whose image holds at least `capacity` bytes: a recycled
  // standard image when that is large enough, else a fresh one.  Its image returns to
  // the pool when the last holder lets go.
  Status NewBuilder(uint64_t id, uint64_t capacity, std::shared_ptr<BucketBuilder>* result);
  // Retires buckets already removed from the table: waits for their readers, deletes
  // their files, drops their tombstones.
  // Takes the caller's references, so that the last one is dropped off this thread.
  void RetireBuckets(std::vector<std::shared_ptr<SsdBucket>> retired) EXCLUDES(mu_);
  Status RewriteTombstones();
  // Every tombstone kept for the log, of every bucket.
  std::vector<TombstoneLog::Record> TombstonesLocked() const REQUIRES(mu_);
  // ssd_gc.cc
  // Syncs the tombstone log, waits for the reads that may still see the dead values,
  // and punches holes over them.  Adds the bytes given back to *reclaimed.
  Status PunchDeadExtents(uint64_t* reclaimed) REQUIRES(gc_mu_);
  std::string BucketPath(uint64_t id) const;
  // Bucket `id`'s open file, from the cache (opened if it is not there).
  Status BucketFile(uint64_t id, BucketFileCache::Handle* file) {
    return file_cache_->Get(id, BucketPath(id), file);
  }

  const Options options_;
  const std::string dir_;
  Env* const base_env_;
  std::unique_ptr<Env> uring_env_;  // set when io_uring is in use
  Env* env_;                        // uring_env_ or base_env_
  Logger* const logger_;
  std::unique_ptr<NamespaceUsage> own_usage_;  // when Open was given none
  NamespaceUsage* usage_ = nullptr;            // never null once open
  RemovalFeed* removal_feed_ = nullptr;
  EvictedKeys* evicted_keys_ = nullptr;
  FileOptions file_options_;
  // The image size of a bucket: bucket_size_limit, but never more than a quarter of a
  // small SSD tier, so that a few buckets always fit.
  uint64_t bucket_bytes_;
  std::unique_ptr<TombstoneLog> log_;
  std::unique_ptr<BucketFileCache> file_cache_;  // the open bucket files, max_open_files
  uint64_t recovered_max_version_ = 0;
  // Open: every value of this version or lower may have lost its delete with the
  // tombstone log's lost records (0: none lost), and how many were dropped for it.
  uint64_t lost_through_version_ = 0;
  uint64_t lost_delete_drops_ = 0;
  // The highest version committed or recovered, for the checkpoint.
  uint64_t max_version_ GUARDED_BY(mu_) = 0;
  // Keys in bucket files that the map checkpoint on disk does not cover (the next Open
  // replays them), and whether a usable one is there.
  uint64_t checkpoint_backlog_ GUARDED_BY(mu_) = 0;
  bool checkpoint_on_disk_ GUARDED_BY(mu_) = false;
  // Images of written buckets, kept for the next ones: fresh memory costs page faults
  // on every first write, which made staging several times slower than the copy itself.
  class ImagePool;
  std::shared_ptr<ImagePool> image_pool_;

  mutable Mutex mu_;
  CondVar writer_cv_;             // sealed buckets to write, or stop
  CondVar written_cv_;            // a bucket was written (or failed), staging done
  SsdIndex map_ GUARDED_BY(mu_);  // the object map
  std::map<uint64_t, std::shared_ptr<SsdBucket>> buckets_ GUARDED_BY(mu_);  // not retired
  std::shared_ptr<SsdBucket> open_ GUARDED_BY(mu_);                // accepting Stage(), or null
  std::deque<std::shared_ptr<SsdBucket>> sealed_ GUARDED_BY(mu_);  // waiting for the writer
  // Tombstones kept for the log, by bucket.
  std::unordered_map<uint64_t, std::vector<TombstoneLog::Record>> tombstones_ GUARDED_BY(mu_);
  // Keys whose current value also lies, same version, in other buckets (left by a crash
  // during compaction): a tombstone of the key must name those buckets too.
  std::unordered_map<std::string, std::vector<uint64_t>> duplicates_ GUARDED_BY(mu_);
  uint64_t next_bucket_id_ GUARDED_BY(mu_) = 1;
  // Until when a put's Stage does not wait for a writer that is behind (kBehindBackoff
  // after a put's wait ran out).
  std::chrono::steady_clock::time_point puts_skip_wait_until_ GUARDED_BY(mu_){};
  uint64_t used_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t access_clock_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  Status writer_error_ GUARDED_BY(mu_);  // the writer's last failure, cleared by a success

  Mutex gc_mu_;  // one GC round at a time
  CondVar gc_cv_;
  bool gc_stop_ GUARDED_BY(gc_mu_) = false;

  GracePeriod readers_;                             // MultiGet calls, for PunchDeadExtents
  bool punch_supported_ GUARDED_BY(gc_mu_) = true;  // cleared when the filesystem refuses

  mutable Mutex stats_mu_;
  Stats stats_ GUARDED_BY(stats_mu_);

  std::vector<std::thread> writers_;
  std::thread gc_;
  BucketCompactor compactor_{this};  // the GC's compactions, one round at a time (gc_mu_)
  WorkerThread closer_;              // drops the last references to retired buckets
};

}  // namespace kvengine

#endif  // KVENGINE_DB_SSD_TIER_H_
