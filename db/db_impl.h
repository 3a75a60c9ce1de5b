// DBImpl: the facade behind kvengine::DB.  It checks input, routes each key to its tier
// and keeps the DB-wide counters; the tiers do the storing.
//
// One class in four files, split by concern as RocksDB splits its DBImpl:
//   db_impl.cc        open, close, flush, registered buffers, properties
//   db_impl_read.cc   Get, GetInto, GetValueSize, BatchGetInto, BatchExists, the SSD
//                     reads of memory misses, the device (GPU) reads, client pins
//   db_impl_write.cc  Put, BatchPut, Delete, BatchDelete, DeleteByRegex, DeleteAll,
//                     the device (GPU) puts, client reservations and commits
//   db_impl_stats.cc  "kvengine.stats" as text, JSON and Prometheus
// The write-back path to SSD is its own class (db/offloader.h).
#ifndef KVENGINE_DB_DB_IMPL_H_
#define KVENGINE_DB_DB_IMPL_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "db/evicted_keys.h"
#include "db/memory_tier.h"
#include "db/removal_feed.h"
#include "db/shared_arena.h"
#include "db/ssd_tier.h"
#include "db/tier_counters.h"
#include "env/gpu_io.h"
#include "kvengine/db.h"
#include "kvengine/env.h"
#include "util/call_log.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/perf_point.h"
#include "util/region_map.h"

namespace kvengine {

class Offloader;
class Prefetcher;

class DBImpl final : public DB, public SharedArena, public NamespaceRemovals {
 public:
  DBImpl(const Options& options, std::string path);
  ~DBImpl() override;

  // Takes the LOCK and builds the tiers.  Called once, by DB::Open (api/db_open.cc),
  // which wraps the DBImpl in the layers its options ask for.
  Status Init();

  Status Close() override;
  Status Put(const WriteOptions& options, const Slice& key, const Slice& value) override;
  Status Get(const ReadOptions& options, const Slice& key, std::string* value) override;
  Status GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                 size_t* value_size) override;
  Status Delete(const WriteOptions& options, const Slice& key) override;
  Status GetValueSize(const Slice& key, uint64_t* size) override;
  Status BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                  std::span<const ValueParts> values, std::vector<int64_t>* results) override;
  Status BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                      std::span<const Destination> destinations,
                      std::vector<int64_t>* results) override;
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override;
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override;
  Status DeleteAll(uint64_t* deleted) override;
  Status RegisterBuffer(void* addr, size_t length) override;
  Status UnregisterBuffer(void* addr) override;
  Status Flush() override;
  Status CompactBuckets(uint64_t* reclaimed_bytes) override;
  bool GetProperty(const std::string& name, std::string* value) override;
  void ResetPerf() override;
  Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  // The whole DB's feed: every namespace's events, numbered in one sequence.
  Status ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) override;
  // Every namespace's keys, as stored (prefixed); removal_sequence in the whole feed's
  // numbering.
  Status ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                      ResidentSnapshot* snapshot) override;
  // The boot epoch drawn at construction (DB::ReadResident, "kvengine.epoch").
  uint64_t epoch() const { return epoch_; }
  // NamespaceRemovals (db/removal_feed.h): one namespace's, numbered among its own.
  Status ReadNamespaceRemovals(uint64_t id, uint64_t after, size_t max_events,
                               RemovalBatch* batch) override;

  Logger* info_log() { return &logger_; }

  // ---------------------------------------------------------------- SharedArena
  // The owner's side of DB::Attach (db/shared_arena.h says what each does).
  char* arena_base() const override { return memory_->arena_base(); }
  uint64_t arena_size() const override { return memory_->arena_size(); }
  int arena_fd() const override { return memory_->arena().fd(); }
  size_t arena_part_count() const override { return memory_->layout().part_count(); }
  Part arena_part(size_t i) const override;
  uint32_t ArenaPartOf(uint64_t namespace_id) const override {
    return memory_->layout().PartOfId(namespace_id);
  }
  Status Reserve(const Slice& key, uint64_t size, MemoryTier::Reservation* reservation) override;
  Status ReserveSpare(uint64_t namespace_id, uint64_t size,
                      MemoryTier::Reservation* reservation) override;
  void Commit(std::span<const Slice> keys, std::span<MemoryTier::Reservation* const> slots,
              std::vector<int64_t>* results) override;
  Status PinInMemory(const Slice& key, uint64_t capacity, MemoryTier::Handle* handle) override;

  // ---------------------------------------------------------------- peers
  // Pins key's value in the memory tier into *handle, for a peer's one-sided read
  // (cluster/: ClusterDB serves this DB to the peers).  False when memory does not hold
  // it, or -- unless `wait` -- when the key's lock is busy.
  // Counted as a read the memory tier served only with `wait` (see db_impl.cc): the
  // peer server counts what it answers from pins taken without waiting through
  // CountServedFromMemory, once it is sure to answer from them.
  bool LookupInMemory(const Slice& key, bool wait, MemoryTier::Handle* handle);
  // `values` reads of `bytes` value bytes served from the memory tier by pins that
  // LookupInMemory(wait=false) took.
  void CountServedFromMemory(uint64_t values, uint64_t bytes);
  // The peer tier's counters, which the cluster layer counts (db/tier_counters.h).
  // Lives as long as this DBImpl.
  TierCounters* peer_tier_counters() { return &tiers_.peer; }
  // What each namespace holds and may hold in the tiers: the namespace layer sets the
  // registered namespaces' names and limits in it (db/namespace_usage.h).  Valid once
  // Init succeeded, for the DB's life.
  NamespaceUsage* namespace_usage() { return namespace_usage_.get(); }

  // "kvengine.readiness": whether this DB takes writes (docs/observability.md).
  std::string Readiness() const;

 private:
  // A read of the feed: checks the DB and the arguments, runs `read`, counts what it gave.
  Status ReadFeed(size_t max_events, RemovalBatch* batch, const std::function<void()>& read);
  // The DB-wide counters, one per KV_COUNTER line of db/db_stats.def (which says how
  // the stats report each); relaxed atomics.
  struct Counters {
#define KV_COUNTER(group, field, kind, outputs, help) std::atomic<uint64_t> field{0};
#include "db/db_stats.def"
  };

  Status CheckOpen() const REQUIRES_SHARED(lifecycle_mu_);
  // A read of `key` that `tier` served (`size` bytes), counted there and for its namespace.
  void CountHit(TierCounters& tier, const Slice& key, uint64_t size);
  // A read of `key` that no tier could serve: counted as a miss and, on the last tier
  // asked, as absent or evicted.
  void CountMiss(const Slice& key);
  Status CheckKey(const Slice& key) const;
  // The NotFound a call on `key` answers.  A namespaced key's is bare: only the
  // namespace's handle knows the name its user calls the key and the namespace by, and
  // it names them (namespaces/namespace_view.cc), so nothing is printed twice on a path
  // where a third of readrandom's gets end.
  static Status Missing(const Slice& key);
  // The start every batch call shares: the DB is open, the lists are well formed
  // (util/input_check.h; with `unique_keys`, no key twice) -- else *results (when not
  // null) is left empty -- then the call is counted and *results has a slot per key.
  Status StartBatch(const char* call, std::span<const Slice> keys, size_t others, const char* what,
                    bool unique_keys, std::vector<int64_t>* results) REQUIRES_SHARED(lifecycle_mu_);
  Status PutOne(const Slice& key, std::span<const Slice> parts);
  // Publishes one filled reservation of the arena under key (SharedArena::Commit).
  Status CommitOne(const Slice& key, MemoryTier::Reservation* reservation);
  Status CheckValueSize(const Slice& key, uint64_t size) const;
  // Stores a checked value in the tiers: `parts` (total `size` bytes), already copied
  // into `reserved` when it is not null.
  Status Publish(const Slice& key, std::span<const Slice> parts, uint64_t size,
                 MemoryTier::Reservation* reserved);
  // Copies key's value into dest's buffers; stores the value size in *size.
  Status GetOne(const Slice& key, std::span<const MutableSlice> dest, uint64_t* size);
  // Checks dest's buffers and stores their total size in *capacity.
  Status CheckDestination(const Slice& key, std::span<const MutableSlice> dest,
                          uint64_t* capacity) const;
  // Copies key's value from the memory tier only; NotFound (without a message: a miss in
  // memory is most often no answer yet, and naming the key costs) when it is not there.
  Status GetFromMemory(const Slice& key, std::span<const MutableSlice> dest, uint64_t capacity,
                       uint64_t* size);
  // The same for a value the memory tier has already looked up and pinned into *handle
  // (not valid: NotFound); releases the handle.
  Status CopyFromMemory(const Slice& key, MemoryTier::Handle* handle,
                        std::span<const MutableSlice> dest, uint64_t capacity, uint64_t* size);
  // BatchExists and BatchLocate: (*results)[i] is the tier that holds keys[i]
  // (LocatedTier) or a negative error; `log_name` names the call in the log, `call`
  // in error messages.
  Status LocateBatch(const char* log_name, const char* call, std::span<const Slice> keys,
                     std::vector<int64_t>* results);
  Status DeleteOne(const Slice& key);
  // Reads wait for a prefetch of their keys under way (db/prefetcher.h), then tell it
  // which keys they found in memory (prefetch hits and waste).  Nothing without SSD.
  void AwaitPrefetch(std::span<const Slice> keys);
  void AwaitPrefetch(const Slice& key);
  void NotePrefetchRead(const Slice& key, bool found);
  // Reads the keys that missed the memory tier from SSD (one submission) and promotes
  // them by policy.  misses[i] indexes keys/dests/results.  A key SSD does not hold
  // either goes to ResolveMiss when `resolve`; otherwise its result is NotFound's code.
  void ReadFromSsd(std::span<const Slice> keys, std::span<const Destination> dests,
                   const std::vector<size_t>& misses, std::vector<int64_t>* results, bool verify,
                   bool resolve = true);
  // Where a key is at one instant.  Both tiers are asked under the memory tier's lock of
  // the key, which every move of a key between the tiers holds (a put that retires the
  // SSD copy, an offload that publishes one, a delete of both): a lookup in memory and
  // then one on SSD can each miss a value that an overwrite or an eviction moved between
  // them, but this never does.  *size is the value's size where it is.
  enum class Place { kAbsent, kMemory, kSsd };
  Place PlaceOf(const Slice& key, uint64_t* size);
  // A read that missed memory and then SSD: the key is absent only if PlaceOf says so;
  // else it moved between the two looks and is read again where it is now.  A key that
  // moves on every look (kMaxMoves times) is answered Busy, never absent.  NotFound has
  // no message: ReadFromSsd keeps its code only.
  static constexpr int kMaxMoves = 8;
  Status ResolveMiss(const Slice& key, std::span<const MutableSlice> dest, bool verify,
                     uint64_t* size);
  // Removes every key matching pred from every tier; returns the count.
  uint64_t DeleteMatching(const std::function<bool(std::string_view)>& pred);
  // DeleteByRegex and DeleteAll after their checks: DeleteMatching(pred); stores the
  // count in *deleted (may be nullptr) and finishes *log.
  Status DeleteWhere(CallLog* log, const std::function<bool(std::string_view)>& pred,
                     uint64_t* deleted);
  // GPU staging (env/gpu_io.h): keys with a buffer on CUDA device `device`.
  //
  // A put of a value in device memory, under way: its bytes are being copied by DMA
  // into arena room reserved for it, the copy queued on a GpuIo::Queue.
  struct DevicePut {
    size_t copy = 0;    // its number on the queue
    uint64_t size = 0;  // the value's bytes
    MemoryTier::Reservation room;
  };
  // Checks the value (parts, some on `device`), reserves its room in the arena and
  // queues its copy there on *copies: one crossing of the bus, straight into the
  // value's final place (once the arena is page-locked), and no host copy.  A failure
  // is not counted: the caller may make room and try again.
  Status StartPutFromDevice(const Slice& key, std::span<const Slice> parts, int device,
                            GpuIo::Queue* copies, DevicePut* put);
  // Waits for put's copy and publishes the value, exactly as a put of host bytes; a
  // failed copy gives the room back at once.
  Status FinishPutFromDevice(const Slice& key, GpuIo::Queue* copies, DevicePut* put);
  Status PutOneFromDevice(const Slice& key, std::span<const Slice> parts, int device);
  // Copies key's value into dest (some of it on `device`).  A value in the memory tier
  // is queued on *copies straight from the arena and stays pinned by *pin until that
  // copy is waited for: *copy is its number (kNoCopy otherwise).  Any other value is
  // read through a host bounce buffer and copied before the call returns.
  static constexpr size_t kNoCopy = ~size_t{0};
  Status GetOneToDevice(const Slice& key, std::span<const MutableSlice> dest, int device,
                        GpuIo::Queue* copies, MemoryTier::Handle* pin, size_t* copy,
                        uint64_t* size);
  // A put with WriteOptions::fill_cache: inserts a value read elsewhere (a peer) into the
  // memory tier, unless this DB holds the key already.
  Status FillCache(const Slice& key, std::span<const Slice> parts);
  // Makes every value written before the call durable (Flush's work).
  // The SSD tier must be configured.
  Status FlushLocked() REQUIRES_SHARED(lifecycle_mu_);
  // write_back: stages every memory value whose version is above `watermark` and that is
  // not on SSD yet.
  Status PersistMemoryAbove(uint64_t watermark);
  std::string StatsText() const;
  std::string StatsJson() const;
  // Prometheus text exposition of the stats and perf histograms (db/db_impl_stats.cc, from the
  // table db/db_stats.def).
  std::string StatsPrometheus() const;

  Options options_;
  const std::string path_;
  Env* env_ = nullptr;
  Logger logger_;
  std::unique_ptr<FileLock> lock_;
  std::atomic<uint64_t> version_source_{0};
  // Before the tiers, which record into it, so that it outlives them.
  std::unique_ptr<RemovalFeed> removal_feed_;
  const uint64_t epoch_;                             // random, nonzero, drawn once per open
  std::unique_ptr<NamespaceUsage> namespace_usage_;  // the same: the tiers charge it
  std::unique_ptr<MemoryTier> memory_;
  std::unique_ptr<SsdTier> ssd_;  // null when ssd_capacity_bytes == 0
  std::unique_ptr<Offloader> offloader_;
  std::unique_ptr<Prefetcher> prefetcher_;  // with the SSD tier only
  std::unique_ptr<GpuIo> gpu_;              // after memory_: it page-locks memory_'s arena

  Mutex flush_mu_;                                      // one Flush at a time
  uint64_t flushed_through_ GUARDED_BY(flush_mu_) = 0;  // versions made durable by Flush

  // One Close at a time, held for all of it.
  Mutex close_mu_;
  // Calls hold it shared; Close holds it exclusively, so Close waits for calls in flight.
  mutable SharedMutex lifecycle_mu_;
  bool closed_ GUARDED_BY(lifecycle_mu_) = false;

  RegionMap registered_buffers_;  // RegisterBuffer's regions

  Counters counters_;
  ErrorCounters errors_;      // failed keys and calls by kind
  AllTierCounters tiers_;     // per tier (db/tier_counters.h); the cluster layer counts peer
  EvictedKeys evicted_keys_;  // what the tiers dropped lately: "evicted" vs "absent"
};

}  // namespace kvengine

#endif  // KVENGINE_DB_DB_IMPL_H_
