// DB: the kvengine key-value store.
//
// A DB maps byte-string keys to byte-string values across tiers (memory, then SSD and
// peers when configured).  It is built for the KV cache of LLM inference: values of tens
// of KiB to a few MiB, written once by a batch of keys, read many times by batches,
// straight into the caller's buffers.
//
// Thread-safety: every method may be called from any number of threads at once, and
// Close() may race with them: calls that begin after Close() return Aborted ("DB is
// closed") and calls in flight finish first.
//
// Results of batch calls.  A batch call returns a Status for the batch as a whole: OK
// when every key was attempted, or an error that names the problem when the batch itself
// is malformed (mismatched list sizes, too many keys, a closed DB) -- then nothing was
// changed and `results` is left empty.  With an OK batch status, results[i] is the
// outcome for keys[i]:
//   BatchPut       0 on success, else a negative error code (see status.h)
//   BatchGetInto   bytes written into the key's buffers (the value size), else negative
//   BatchExists    1 present, 0 absent, else negative
//   BatchDelete    0 deleted, -1 (NotFound) when the key was absent, else negative
// A key that fails does not affect the other keys of the batch.
//
// Input rules, checked before anything changes:
//   * a key is 1 to Options::max_key_size bytes (any bytes), except that a key of the
//     default namespace does not start with byte 0xFE and a key given to a namespace's
//     handle is at most max_key_size - 9 bytes (see "namespaces" below);
//   * a value is 0 to Options::max_value_size bytes and must fit in the memory tier;
//   * a null buffer is only allowed with length 0;
//   * a batch has at most Options::max_batch_size keys, and its lists have equal sizes;
//   * duplicate keys: BatchPut rejects a batch that names a key twice (InvalidArgument
//     naming the key, nothing written), because which value should win is ambiguous.
//     Reads and BatchExists serve each occurrence independently; BatchDelete deletes the
//     first occurrence and reports NotFound for the later ones.
// A key-level problem (empty key, oversized value, null buffer) fails that key only.
//
// Page groups.  Values that are only useful together -- one page of a hybrid model's
// cache: its KV, its DSA indexer page, its Mamba state -- are one group, and a group is
// one key whose value is its members laid end to end: BatchPut takes the members as the
// value's parts (ValueParts, each from its own buffer, no copy to join them) and
// BatchGetInto scatters the value back into one buffer per member (Destination).  The
// members' sizes are the caller's to know (the layout of its pools).  Because every
// layer handles a key as one unit, a group is present whole or absent, never half:
//   * a put publishes the key only after every part is in place; a reader sees the old
//     value or the new one whole (both members of one put);
//   * BatchExists answers 1 only for a value that a BatchGetInto then reads whole, and
//     a member replaced, evicted, removed or damaged between the two makes the whole
//     group a miss (NotFound, or Corruption for a value whose checksum fails): the
//     reader never pairs one put's KV with another's indexer page;
//   * eviction, offload to SSD, GC (bucket compaction) and Delete take the group whole;
//     a crash in the middle of a put leaves the group absent or its previous value after
//     recovery (crash_test.cc, GroupCrashTest);
//   * an attached client, a peer and a replica move the key as any other: whole.
// A caller whose members are written at different times (the same page's KV now, its
// state later) keeps them as separate keys and gets no group guarantee between them.
#ifndef KVENGINE_DB_H_
#define KVENGINE_DB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvengine/options.h"
#include "kvengine/perf.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine {

// The value of one key in BatchPut, given as the buffers whose concatenation it is.
using ValueParts = std::vector<Slice>;
// Where BatchGetInto scatters one key's value: filled in order.
using Destination = std::vector<MutableSlice>;

// What BatchLocate answers for a key that is present: the tier that holds it (the
// nearest, when several do).  DO NOT CHANGE THESE VALUES: attached clients and the
// Python module receive them as numbers.
enum LocatedTier : int64_t {
  kLocatedAbsent = 0,
  kLocatedMemory = 1,
  kLocatedSsd = 2,
  kLocatedPeer = 3,  // ClusterDB: not on this host, held by a peer
};

// One entry of the removal feed (DB::ReadRemovals): a value left a tier.
struct RemovalEvent {
  // The tier the value left.  DO NOT CHANGE THESE VALUES (sent to attached clients).
  enum Tier : uint8_t { kMemory = 1, kSsd = 2 };
  // Why.  DO NOT CHANGE THESE VALUES (sent to attached clients).
  enum Reason : uint8_t {
    // The tier was full: the value was evicted to make room.  From the memory tier of a
    // DB with an SSD tier, the value went to SSD first (unless a newer write or a delete
    // had replaced it): it is still readable there.
    kCapacity = 1,
    // Delete, BatchDelete, DeleteByRegex or DeleteAll removed it.
    kDeleted = 2,
  };
  uint64_t sequence = 0;     // 1, 2, ... in the order the DB recorded them
  uint64_t time_micros = 0;  // when, in microseconds since the Unix epoch (Env clock)
  Tier tier = kMemory;
  Reason reason = kCapacity;
  std::string key;
};

// What one ReadRemovals call returns.
struct RemovalBatch {
  // The events with sequence > `after`, oldest first, at most `max_events`.
  std::vector<RemovalEvent> events;
  // Events after `after` that the ring no longer held (overwritten by newer ones before
  // this reader asked): they are lost to this reader, and counted in the stats as
  // "removal_feed.missed".
  uint64_t missed = 0;
  // The sequence of the newest event the DB has recorded (0: none yet).  A reader
  // that wants only what happens from now on starts its cursor here.
  uint64_t last_sequence = 0;
};

// One key a tier holds, as DB::ReadResident reports it.
struct ResidentKey {
  std::string key;
  LocatedTier tier = kLocatedMemory;  // kLocatedMemory or kLocatedSsd
};

// What a DB::ReadResident snapshot was taken against.
struct ResidentSnapshot {
  // The DB's boot epoch ("kvengine.epoch"): a random number drawn at each open, so a
  // subscriber tells a restarted store (whose removal feed starts again at 1) from the
  // one it indexed.
  uint64_t epoch = 0;
  // The removal feed's newest sequence when the snapshot began (RemovalBatch's
  // last_sequence, in the numbering of the DB handle asked): apply the feed's events
  // after it to the snapshot and the result is exact.  0 when the DB has no feed.
  uint64_t removal_sequence = 0;
  uint64_t keys = 0;  // entries reported
};

// The options of a namespace (DB::CreateNamespace), kept in the DB's namespace registry
// and reported by ListNamespaces and, with what each namespace holds, hits, misses and
// evictions, in the stats ("namespace.NAME.*" lines, the JSON's "namespaces" object,
// Prometheus families kvengine_namespace_* with a `namespace` label).
//
// Both tiers enforce them.  A put into a namespace at its memory quota first evicts
// that namespace's own coldest values (with the SSD tier, write_back, they are
// offloaded as any eviction's are), and fails NoSpace, naming the namespace, when none
// can go (memory_eviction=none, every value in use) or the value is larger than the
// quota; other namespaces' puts go on.  A value going to SSD (write_through puts,
// write_back evictions, Flush) of a namespace at its SSD quota first drops that
// namespace's own values from its coldest buckets; when it cannot, a write_through put
// fails NoSpace naming the namespace, a write_back eviction drops the value instead of
// offloading it, and Flush fails NoSpace for the values that did not stay on SSD.
// When a tier is full, it evicts first from the namespace most over its fair share (the
// tier split by weight among the namespaces that hold values in it), so a namespace
// within its share keeps its values while another churns; the SSD tier evicts whole
// buckets, so there the choice is the bucket holding the fewest live bytes of namespaces
// within their share.  Concurrent puts may overshoot a quota by the values being committed at
// that moment (docs/design.md, "Namespaces: quotas and fair shares").
struct NamespaceOptions {
  // Bytes of the memory tier the namespace's values may occupy.  0: no quota.
  // Default: 0
  uint64_t memory_quota_bytes = 0;
  // Bytes of the SSD tier the namespace's values may occupy.  0: no quota.
  // Default: 0
  uint64_t ssd_quota_bytes = 0;
  // The namespace's share of a tier under pressure, relative to the other namespaces
  // (the default namespace weighs 1).  1 to 1000.
  // Default: 1
  uint32_t weight = 1;
};

// One namespace, as ListNamespaces reports it.
struct NamespaceInfo {
  std::string name;
  // The id its keys carry inside the DB (docs/namespace_format.md).
  uint64_t id = 0;
  NamespaceOptions options;
  // A DropNamespace began and did not finish (the process died, or the DB below failed):
  // the namespace cannot be opened or created again until DropNamespace is called again,
  // which finishes it.
  bool dropping = false;
};

class DB {
 public:
  // Opens the DB in directory `path` (created when missing and create_if_missing).
  // Applies KVENGINE_* environment variables first (see options.h).  Takes the
  // directory's LOCK: a second Open of the same path fails with Busy.
  // On success stores the DB in *db and returns OK; on failure stores nullptr.
  static Status Open(const Options& options, const std::string& path, std::unique_ptr<DB>* db);

  // Attaches to the DB that another process of this host serves on the Unix socket
  // `socket_path` (opened with Options::local_listen; see docs/attach.md).  The DB
  // returned has this whole API, served by that owner: results, error codes and
  // properties are the owner's, and value bytes are copied once, between the caller's
  // buffers and the owner's memory tier, which this process maps.  Of `options` only
  // peer_timeout_ms (the longest any call may take) and perf_level are used; the DB's
  // own options are the owner's.  The owner must run as the same uid (or allow this
  // one; root is always allowed): the arena is shared memory, and the trust boundary.
  //
  // When the owner dies or stops answering, every call fails with IOError naming the
  // socket; the next call reconnects, so the DB recovers by itself once an owner serves
  // the path again.  Close() detaches (the owner's DB stays open).
  // On success stores the DB in *db and returns OK; on failure (no owner serving, or a
  // refused uid) stores nullptr.
  static Status Attach(const Options& options, const std::string& socket_path,
                       std::unique_ptr<DB>* db);

  DB() = default;
  DB(const DB&) = delete;
  DB& operator=(const DB&) = delete;
  // Closes the DB if still open.
  virtual ~DB() = default;

  // Waits for calls in flight, makes the DB durable as Flush() does (unless
  // Options::flush_on_close is false), releases the memory and the LOCK.  Returns the
  // flush's error, if any, after releasing everything.  Idempotent: a second Close
  // returns OK.
  virtual Status Close() = 0;

  // ---------------------------------------------------------------- single keys
  // Stores value under key, replacing any previous value.
  virtual Status Put(const WriteOptions& options, const Slice& key, const Slice& value) = 0;
  // Copies the value of key into *value.  NotFound when absent.
  virtual Status Get(const ReadOptions& options, const Slice& key, std::string* value) = 0;
  // Copies the value of key into buffer and stores its size in *value_size.  When the
  // buffer is too small returns BufferTooSmall, stores the size needed in *value_size and
  // leaves the buffer's contents unspecified.
  virtual Status GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                         size_t* value_size) = 0;
  // Removes key.  NotFound when absent.
  virtual Status Delete(const WriteOptions& options, const Slice& key) = 0;
  // Stores the size of key's value in *size.  NotFound when absent.  In sharded mode a
  // key owned by another member is asked of its owner (IOError naming it when it cannot
  // be reached), as Get does.
  virtual Status GetValueSize(const Slice& key, uint64_t* size) = 0;

  // ---------------------------------------------------------------- batches
  // Stores values[i] (the concatenation of its parts) under keys[i].
  virtual Status BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                          std::span<const ValueParts> values, std::vector<int64_t>* results) = 0;
  // Copies the value of keys[i] into destinations[i], filling its buffers in order.  A
  // value larger than the destination's total fails that key with BufferTooSmall.
  virtual Status BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                              std::span<const Destination> destinations,
                              std::vector<int64_t>* results) = 0;
  virtual Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) = 0;
  virtual Status BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                             std::vector<int64_t>* results) = 0;

  // A layer-wise load: BatchGetInto of keys that come in groups -- a request's layers, in
  // the order the caller will use them -- each group reported as soon as its keys are in.
  // Group g is keys[group_ends[g-1], group_ends[g]) (group_ends[-1] being 0):
  // group_ends never falls, may repeat (an empty group), and ends at keys.size().
  // *results is sized keys.size() before the first report; on_ready(g) is called once per
  // group, in group order, on the calling thread, once group g's results are stored and
  // its bytes are in their destinations, while later groups may still be on their way.
  // on_ready may be empty.  The call returns when every group has been reported.  A
  // key's result is BatchGetInto's; a key that fails never reports bytes it did not
  // read.  Each group is a batch of its own for max_batch_size.  Malformed input
  // (mismatched sizes, group_ends that fall or do not end at keys.size()) is
  // InvalidArgument before anything is read or reported, with *results empty; a batch
  // error met later (the DB closed meanwhile) ends the call with that error, the groups
  // already reported staying so.
  //
  // The default reads one group after the other, one BatchGetInto each.  ClusterDB
  // issues every group's reads of other members when the call starts (pipelined over
  // the transport's connections) and reports each group once its answers are in, so a
  // load over peers waits for the network's round trip about once rather than once per
  // group (docs/cluster.md, "Layer-wise loads").
  using GroupReadyFn = std::function<void(size_t group)>;
  virtual Status BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                                    std::span<const Destination> destinations,
                                    std::span<const size_t> group_ends,
                                    const GroupReadyFn& on_ready, std::vector<int64_t>* results);

  // Removes every key that matches `pattern` (RE2 syntax, whole key) and stores the
  // count in *deleted (may be nullptr).  InvalidArgument, naming the pattern and why,
  // for a pattern that is empty, longer than 4096 bytes, malformed, or whose compiled
  // form exceeds RE2's memory budget (4 MiB) — nothing is removed anywhere then.  RE2
  // matches in time linear in the key and never recurses on the pattern, so no pattern
  // crashes or stalls the DB; back-references and lookarounds (RE2 has neither) are
  // refused.  Keys and pattern are matched as bytes 0..255:
  // "[\x80-\xff]" is the high half, "[\x00-\xff]*" every key.  No lock is held while
  // keys are matched: the keys are copied a shard at a time and matched after, so other
  // calls wait at most for one shard's keys to be copied (docs/reliability.md).
  virtual Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) = 0;
  // Removes every key; stores the count in *deleted (may be nullptr).
  //
  // In sharded mode both act on the whole cluster: this host's tiers and every member,
  // in parallel (each member acts on its own tiers only and never passes the request
  // on), and *deleted is the sum.  When a member fails (unreachable, timed out, or its
  // own error) the call returns IOError naming each failed member and its error, and
  // *deleted still holds the sum of the counts of the hosts that succeeded: those keys
  // are gone, and a retry removes the rest.  A pattern refused by the checks above is
  // refused before anything is removed anywhere.  A
  // member may take up to peer_timeout_ms to answer, deletes included.
  virtual Status DeleteAll(uint64_t* deleted) = 0;

  // Promotion ahead of the load: starts bringing the values of `keys` that lie only on
  // SSD up into the memory tier, in the background, for reads the caller expects soon
  // (a scheduler that matched a prefix before its worker loads it).  Returns at once
  // with (*results)[i] 1 when keys[i]'s read was started, 0 when it was not needed or
  // not possible: in memory already, absent, already on its way, no SSD tier, or over
  // Options::prefetch_max_bytes (dropped, without error: the later read still works).
  // A read of a key whose prefetch is on its way waits for it instead of reading the
  // same bytes again.  A prefetched value is inserted only while it is still the key's
  // current one, and never displaces a newer write.  In sharded mode only the keys this
  // host holds are prefetched (0 for the others).  Counters: "prefetch_*" in
  // "kvengine.stats" (docs/observability.md).
  // The default (a DB without tiers of its own to promote between) queues nothing.
  virtual Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) {
    if (results == nullptr) return Status::InvalidArgument("Prefetch: results is null");
    results->assign(keys.size(), 0);
    return Status::OK();
  }

  // ---------------------------------------------------------------- buffers
  // Declares [addr, addr+length) a buffer the caller will pass to puts and gets again
  // and again, so transports can register it once (RDMA).  Regions may not overlap
  // a registered one (InvalidArgument).  Registration is optional: unregistered buffers
  // work everywhere, registered ones may be faster.
  virtual Status RegisterBuffer(void* addr, size_t length) = 0;
  // NotFound when addr does not start a registered buffer.
  virtual Status UnregisterBuffer(void* addr) = 0;

  // ---------------------------------------------------------------- the rest
  // Makes every value written and every delete made before the call durable, where the
  // DB has an SSD tier, in both offload policies: values that are only in memory are
  // written to SSD buckets (they stay in memory too), the pending buckets are written and
  // synced, and the tombstone log is synced.  After a crash, the DB reopens with each of
  // those keys exactly as it was at the Flush (or as a later write left it).  Without an
  // SSD tier there is nothing durable and Flush returns OK.  When some values cannot be
  // written (the SSD tier is full and may not evict, or the disk fails), returns that
  // error naming how many; the others are durable.
  virtual Status Flush() = 0;

  // Runs one round of SSD garbage collection now (compacting buckets whose deleted ratio
  // exceeds gc_deleted_ratio) and stores the bytes of disk space reclaimed in
  // *reclaimed_bytes (may be nullptr).  OK with nothing to do, or without an SSD tier.
  virtual Status CompactBuckets(uint64_t* reclaimed_bytes) = 0;

  // Stores, in (*results)[i], where keys[i] is: a LocatedTier (kLocatedAbsent when
  // absent), or a negative error.  BatchExists's answer, with the tier named: for
  // accounting and tools, not for deciding what to read (a value may move between the
  // call and the read).  Batch rules as BatchExists.
  // Default: NotSupported (a DB implementation that does not know its tiers).
  virtual Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) {
    (void)keys;
    (void)results;
    return Status::NotSupported("BatchLocate");
  }

  // ---------------------------------------------------------------- removal feed
  // The removal feed: the DB announces each value that leaves a tier -- evicted for
  // room, or deleted -- so that a cache-aware router, or an account of why a read
  // missed, learns of it (docs/observability.md, "The removal feed").  The DB keeps the
  // newest Options::removal_feed_capacity events in a ring; each reader keeps its own
  // cursor, so any number of readers, in this process or attached ones, read the same
  // feed without taking events from each other.
  //
  // Stores in *batch the events with sequence > `after` (oldest first, at most
  // `max_events`; 0 asks only for last_sequence), how many of them the ring no longer
  // held, and the newest sequence.  A reader passes the sequence of the last event it
  // saw as the next `after`.  Recording starts with the DB's first ReadRemovals call:
  // removals before it are not recorded.  One event per tier a value leaves: a delete
  // of a value held in memory and on SSD is two events.  Overwrites are not removals;
  // neither is a promotion.
  //
  // Thread-safety: as every call.  The feed is one mutex-guarded ring, taken once per
  // removal only while recording; eviction paths never wait on a reader.
  // NotSupported when the feed is off (removal_feed_capacity = 0) or the DB cannot
  // report removals; InvalidArgument when max_events exceeds Options::max_batch_size.
  // ClusterDB reports this host's tiers only; an attached client reads its owner's feed.
  virtual Status ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) {
    (void)after;
    (void)max_events;
    (void)batch;
    return Status::NotSupported("ReadRemovals");
  }

  // ---------------------------------------------------------------- resident set
  // A snapshot of what this host holds, for a router that (re)builds its index after it
  // or the store restarted (docs/observability.md, "Resync after a restart").  Calls
  // `batch` with the keys starting with `prefix` that a tier holds, at most `max_batch`
  // at a time, one entry per tier holding the key (a key in memory and on SSD comes
  // twice), in no order; `batch` returns false to stop early.  Starts the removal feed's
  // recording and stores its newest sequence in snapshot->removal_sequence *before*
  // reading the first key: a key removed after that sequence is either not reported or
  // removed again by the feed event that follows, so "snapshot, then the feed's events
  // after removal_sequence" is exactly the resident set.  Memory held: one index shard's
  // keys and one batch at a time; the SSD tier's keys are read from its bucket indexes.
  //
  // Thread-safety: as every call; `batch` runs on the calling thread and must not close
  // the DB.  InvalidArgument when max_batch is 0 or exceeds Options::max_batch_size;
  // NotSupported where the layer cannot list its keys (an attached client of an owner
  // older than READ_RESIDENT).  ClusterDB reports this host's tiers only; a namespace's
  // handle its own keys, as its user names them; an attached client its owner's (of its
  // namespace), streamed a batch at a time, and `batch` must return within the owner's
  // peer_timeout_ms (docs/attach.md, "The resident set").
  using ResidentFn = std::function<bool(std::span<const ResidentKey>)>;
  virtual Status ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                              ResidentSnapshot* snapshot) {
    (void)prefix;
    (void)max_batch;
    (void)batch;
    (void)snapshot;
    return Status::NotSupported("ReadResident");
  }

  // ---------------------------------------------------------------- namespaces
  // A namespace is a keyspace of its own inside the DB (RocksDB's column families, in the
  // shape of a view): the handle CreateNamespace and OpenNamespace return is itself a DB,
  // with this whole API, whose keys are the namespace's.  A key of one namespace never
  // matches, overwrites or deletes a key of another: Get, BatchExists, BatchLocate,
  // Prefetch, GetValueSize, BatchGetInto, Put, BatchPut, Delete, BatchDelete,
  // DeleteByRegex (its pattern matches the key as the namespace's user sees it),
  // DeleteAll and ReadRemovals (its events, with its keys) of a handle touch only its
  // namespace; its GetProperty("kvengine.namespace") is the namespace's name.  The calls of the DB
  // itself are those of the default namespace, which every DB has: they never see the keys of a
  // namespace, and refuse with InvalidArgument a key whose first byte is 0xFE (that byte starts the
  // keys of namespaces).  Flush, CompactBuckets, RegisterBuffer, GetProperty and ResetPerf act on
  // the whole DB from any handle.
  //
  // The registry of namespaces (name, id, options) is a file of the DB directory,
  // replaced atomically at each change: namespaces survive a restart and a crash, and a
  // damaged registry fails DB::Open with Corruption (docs/namespace_format.md).  A
  // namespace costs no RAM per key beyond its 9 bytes of key prefix.
  //
  // Handles: any number per namespace, each usable from many threads at once.  A handle
  // may outlive its DB (its calls then return Aborted) and the namespace (after
  // DropNamespace its calls return Aborted naming it); Close() on a handle releases the
  // handle only.  In a cluster (peers or cluster set) namespaces are the cluster's: each
  // host keeps its own registry, in agreement with every member's -- a create or a drop
  // through any member or cluster client is forwarded to every member, and a member that
  // missed one learns it once it is back; quotas are enforced by each member on its own
  // tiers (docs/cluster.md, "Namespaces across the cluster").  A namespace's id derives
  // from its name, so every host agrees on its keys.  An attached client (DB::Attach) has its
  // owner's namespaces, as far as the owner's Options::local_allowed_uids grants its credentials: a
  // namespace outside its grant fails PermissionDenied naming it (docs/attach.md).
  //
  // Names: 1 to 64 bytes of letters, digits, '.', '_', '-'; "default" is reserved.

  // Registers a new namespace and stores a handle to it in *handle.  InvalidArgument for
  // a bad name or options, or a name that exists already (OpenNamespace opens it);
  // the registry's write error otherwise (nothing registered).
  virtual Status CreateNamespace(const std::string& name, const NamespaceOptions& options,
                                 std::unique_ptr<DB>* handle) {
    (void)name;
    (void)options;
    handle->reset();
    return Status::NotSupported("CreateNamespace: this DB has no namespace registry");
  }
  // Stores a handle to the existing namespace `name` in *handle.  NotFound when there is
  // none; Aborted while it is being dropped.
  virtual Status OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) {
    (void)name;
    handle->reset();
    return Status::NotSupported("OpenNamespace: this DB has no namespace registry");
  }
  // Removes every key of namespace `name`, in every tier (in sharded mode, on every
  // member, as DeleteByRegex does), makes the removal durable (Flush), then its
  // registration; stores the count of keys removed in *deleted (may be nullptr).  Its
  // open handles fail with Aborted from the start of the call.  When the removal fails
  // the namespace stays registered as `dropping` and a later DropNamespace finishes it.
  // NotFound when there is no such namespace.
  virtual Status DropNamespace(const std::string& name, uint64_t* deleted) {
    (void)name;
    (void)deleted;
    return Status::NotSupported("DropNamespace: this DB has no namespace registry");
  }
  // Stores every registered namespace in *namespaces, by name (the default namespace is
  // not listed).
  virtual Status ListNamespaces(std::vector<NamespaceInfo>* namespaces) {
    (void)namespaces;
    return Status::NotSupported("ListNamespaces: this DB has no namespace registry");
  }

  // Stores a property's value in *value and returns true; false for an unknown name.
  //   "kvengine.stats"       counters and bytes per tier, as text
  //   "kvengine.stats.json"  the same as one JSON object
  //   "kvengine.options"     the options in force, "name=value" per line
  //   "kvengine.perf"        latency histograms of every perf key (count, mean, P50,
  //                          P90, P99, P99.9, max in microseconds), as text
  //   "kvengine.perf.json"   the same as one JSON object
  //   "kvengine.stats.prometheus" (or "kvengine.prometheus")  the stats and the perf
  //                          histograms in the Prometheus text exposition format 0.0.4
  // See docs/observability.md.
  virtual bool GetProperty(const std::string& name, std::string* value) = 0;

  // Clears the perf histograms ("kvengine.perf").  They are process-wide (see
  // kvengine/perf.h), so this clears them for every DB of the process.
  virtual void ResetPerf() { ::kvengine::ResetPerf(); }
};

}  // namespace kvengine

#endif  // KVENGINE_DB_H_
