// Options: every knob of a kvengine DB, with its default beside it.
//
// Each option can also be set from the environment as KVENGINE_<NAME> (upper case), e.g.
// KVENGINE_MEMORY_CAPACITY_BYTES=2GiB or KVENGINE_MEMORY_EVICTION=none.  DB::Open applies
// the environment on top of the Options it is given (unless apply_environment is false),
// so an operator can tune a deployed binary without rebuilding it.  Values are parsed
// strictly, and a malformed one makes DB::Open fail with InvalidArgument naming the
// variable and the value; nothing is ever silently defaulted.
//
// Value syntax (the same for environment variables, Options::Set and the Python module):
//   size     "4096", "64KiB", "2GiB", "1.5MiB", "64KB" (KB/MB/GB are decimal, KiB/MiB/GiB
//            binary); fractional values must come out as whole bytes
//   integer  "42", "-1" (where a negative value is meaningful)
//   ratio    "0.25", "1", "0" (a fraction in [0, 1])
//   bool     "1"/"0", "true"/"false", "yes"/"no", "on"/"off" (any case)
//   enum     one of the names listed beside the option (any case)
//   string   taken as is
#ifndef KVENGINE_OPTIONS_H_
#define KVENGINE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/perf.h"
#include "kvengine/status.h"

namespace kvengine {

class Env;
class MemoryRegistrar;

// What the memory tier does when it is full.
enum class MemoryEviction : int {
  kLru = 0,   // "lru": evict (or offload to SSD, when configured) the coldest values
  kNone = 1,  // "none": reject the put with NoSpace
};

// When values go to the SSD tier.
enum class OffloadPolicy : int {
  kWriteBack = 0,     // "write_back": when the memory tier needs room (a cache that spills)
  kWriteThrough = 1,  // "write_through": every put also goes to SSD (a persistent cache)
};

// Which whole buckets the SSD tier drops when it is full.
enum class SsdEviction : int {
  kNone = 0,  // "none": never; a full tier refuses offloads with NoSpace
  kLru = 1,   // "lru": the bucket read or written least recently
  kFifo = 2,  // "fifo": the oldest bucket
};

// How a DB uses its peers (see docs/transport.md).
enum class PeerMode : int {
  kReadThrough = 0,  // "read_through": local first; a miss asks every peer, first hit wins
  kSharded = 1,      // "sharded": each key lives on one owner among peers + this host
};

// Which transport reaches peers.
enum class PeerTransport : int {
  kAuto = 0,  // "auto": UCX when built with it (it reaches RDMA devices too), else TCP
              // (the choice is logged)
  kTcp = 1,   // "tcp"
  kRdma = 2,  // "rdma": UCX over its RDMA transports alone; NotSupported without a device
  kUcx = 3,   // "ucx": one-sided reads through UCX; NotSupported when built without it
};

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

struct Options {
  // ---------------------------------------------------------------- opening the DB
  // Create the DB directory if it does not exist.
  // Default: true
  bool create_if_missing = true;

  // Fail DB::Open if the directory already holds a DB.
  // Default: false
  bool error_if_exists = false;

  // Apply KVENGINE_<NAME> environment variables on top of these options at Open.
  // Default: true.  (Not settable from the environment itself.)
  bool apply_environment = true;

  // ---------------------------------------------------------------- memory tier
  // Size of the memory tier's arena: the most value bytes held in DRAM.  The arena is
  // allocated once at Open, page-aligned and on the caller's NUMA node.
  // Default: 1 GiB
  uint64_t memory_capacity_bytes = 1ull << 30;

  // What to do when the arena is full: "lru" or "none" (see MemoryEviction).
  // Default: lru
  MemoryEviction memory_eviction = MemoryEviction::kLru;

  // Back the arena with huge pages: explicit 2 MiB pages when some are reserved
  // (vm.nr_hugepages), else transparent huge pages (logged at info).  Fewer TLB misses
  // made 1 MiB puts and gets measurably faster on the machines tried.
  // Default: true
  bool use_huge_pages = true;

  // Touch every page of the arena at Open so that the first writes do not pay for page
  // faults.  Costs about 0.1 s per GiB at Open.
  // Default: true
  bool prefault_memory = true;

  // Size of a slab, the unit in which the arena is handed to size classes.  A value
  // larger than a slab occupies a run of whole slabs.  Must be a power of two between
  // 64 KiB and 1 GiB, and at most memory_capacity_bytes.
  // Default: 4 MiB
  uint64_t memory_slab_size = 4ull << 20;

  // Number of shards of the key index (more shards, less lock contention).
  // Default: 64
  uint64_t index_shards = 64;

  // ---------------------------------------------------------------- SSD tier
  // Most bytes of bucket files the SSD tier may hold in the DB directory.  0 disables
  // the SSD tier (a memory-only cache; nothing survives Close).
  // Default: 64 GiB
  uint64_t ssd_capacity_bytes = 64ull << 30;

  // "write_back" or "write_through" (see OffloadPolicy).
  // Default: write_back
  OffloadPolicy offload_policy = OffloadPolicy::kWriteBack;

  // A bucket is sealed and written once it holds this many values ...
  // Default: 512
  uint64_t bucket_keys_limit = 512;

  // ... or this many bytes (a larger value gets a bucket of its own) ...
  // Default: 64 MiB
  uint64_t bucket_size_limit = 64ull << 20;

  // ... or once it has been open this long, so a few values are never held back.
  // Default: 500
  uint64_t bucket_flush_timeout_ms = 500;

  // Most bucket files the SSD tier keeps open for reads.  Files past it are closed, least
  // recently used first (never one a read is using), and reopened when next read, so the
  // tier can hold more buckets than the process may open descriptors.  At Open it is
  // clamped (and the clamp logged) to the engine's share of the process's descriptor
  // limit (RLIMIT_NOFILE less those in use less a headroom for the rest of the process;
  // docs/ssd_tier.md, "The descriptor budget"): the stats' ssd.max_open_files is the
  // size in force.
  // Default: 1000
  uint64_t max_open_files = 1000;

  // Read and write bucket files with O_DIRECT (falls back to buffered I/O, with a logged
  // message, where the file system refuses it).
  // Default: true
  bool use_direct_io = true;

  // Read batches and write buckets through io_uring (falls back to pread/pwrite, with a
  // logged message, where the kernel refuses io_uring).
  // Default: true
  bool use_io_uring = true;

  // "none", "lru" or "fifo": which whole buckets to drop when the SSD tier is full.
  // Default: lru
  SsdEviction ssd_eviction = SsdEviction::kLru;

  // Never drop values from SSD except by explicit delete (overrides ssd_eviction).
  // Default: false
  bool disable_ssd_eviction = false;

  // Copy a value read from SSD back into the memory tier.
  // Default: true
  bool promote_on_read = true;

  // DB::Prefetch: the most bytes of values queued or being read up from SSD at once (and
  // so the most one Prefetch call queues).  Kept well under the memory tier's size so
  // that a prefetched batch never evicts its own values.  0: a quarter of
  // memory_capacity_bytes.
  // Default: 0
  uint64_t prefetch_max_bytes = 0;

  // Close() first does what Flush() does: with write_back, every value still only in
  // memory is written to SSD, so a reopened DB finds what the closed one held.  Turn it
  // off for a pure memory cache that restarts empty anyway: Close then costs no disk
  // writes (roughly the memory tier's bytes at the disk's write bandwidth, plus a sync).
  // Default: true
  bool flush_on_close = true;

  // Sync the tombstone log at most this long after a delete even without Flush().
  // 0: only at Flush().
  // Default: 1000
  uint64_t tombstone_sync_interval_ms = 1000;

  // ---------------------------------------------------------------- SSD garbage collection
  // Give the disk blocks of deleted values back to the filesystem in place (fallocate
  // PUNCH_HOLE), in the GC round after their tombstones are durable: space comes back
  // without copying anything.  Where the filesystem cannot, the GC falls back to
  // compaction alone (logged once).
  // Default: true
  bool gc_punch_holes = true;
  // Save the SSD tier's object map (the SSDMAP file: from the GC thread while the DB
  // runs, and at Close) and load it at Open instead of reading every bucket's index,
  // replaying only the buckets it does not cover; a stale or damaged one is not used
  // (see docs/ssd_tier.md).  False: every Open reads every bucket, and no SSDMAP is
  // written (an old one is removed).  Default: true.
  bool ssd_map_checkpoint = true;
  // With ssd_map_checkpoint, the GC thread writes a new checkpoint (while the DB runs)
  // once this many keys were written to bucket files since the one on disk: they are
  // what the next Open must replay from the buckets' indexes, about 2 us a key, after a
  // crash or when Close keeps the checkpoint on disk (it does for maps over 1M keys when
  // less than this is left to replay, rather than spend a second writing a new one).
  // 0: the larger of 131072 and a thirty-second of the keys on SSD.  Default: 0.
  uint64_t ssd_map_checkpoint_interval_keys = 0;

  // A bucket whose deleted bytes still taking space (not given back by a punched hole)
  // exceed this fraction of its bytes is compacted.
  // Default: 0.5
  double gc_deleted_ratio = 0.5;

  // A bucket whose deleted bytes, holes punched or not, exceed this fraction of its bytes
  // is compacted too (merged with others): it holds little but its index and tombstones,
  // and its few live values are cheap to copy.
  // Default: 0.9
  double gc_merge_deleted_ratio = 0.9;

  // Above this fraction of ssd_capacity_bytes, any bucket with deleted bytes is compacted.
  // Default: 0.9
  double gc_high_watermark_ratio = 0.9;

  // How often the GC thread looks for work.  0 disables the thread (CompactBuckets()
  // still works).
  // Default: 1000
  uint64_t gc_interval_ms = 1000;

  // Most buckets compacted in one GC round.
  // Default: 4
  uint64_t gc_max_buckets_per_round = 4;

  // ---------------------------------------------------------------- limits
  // Longest key accepted, in bytes.  Keys are arbitrary bytes but never empty.
  // Default: 4096
  uint64_t max_key_size = 4096;

  // Largest value accepted, in bytes (a value must also fit in the memory tier).
  // Default: 256 MiB
  uint64_t max_value_size = 256ull << 20;

  // Most keys in one batch call.
  // Default: 65536
  uint64_t max_batch_size = 65536;

  // ---------------------------------------------------------------- removal feed
  // Events the removal feed (DB::ReadRemovals) keeps: a ring of this many of the newest
  // removals (a value evicted from or deleted in a tier).  The feed records nothing
  // until the first ReadRemovals call on the DB (or an attached client's), so a DB whose
  // feed nobody reads pays one relaxed atomic load per removal.  0 turns the feed off
  // (ReadRemovals then returns NotSupported).
  // Default: 65536
  uint64_t removal_feed_capacity = 65536;

  // ---------------------------------------------------------------- GPU staging
  // Buffers given to puts and gets may be GPU memory (CUDA device pointers, e.g. a torch
  // tensor's data_ptr()) when kvengine is built with CUDA; see docs/gpu.md.  These size
  // the staging machinery, made per GPU the first time one of its buffers is seen.

  // Page-locked host memory per GPU for staging: the ring of gpu_chunk_bytes slots that
  // chunks cross on their way, and the landing place of a put's value (values larger
  // than this go through the ring into an ordinary buffer).  At least 2 chunks.
  // Default: 64 MiB
  uint64_t gpu_staging_bytes = 64ull << 20;

  // Most bytes moved by one copy: values are split into chunks of this size so that
  // copying one chunk overlaps preparing the next.  Between 4 KiB and
  // gpu_staging_bytes / 2.
  // Default: 1 MiB
  uint64_t gpu_chunk_bytes = 1ull << 20;

  // CUDA streams per GPU; consecutive chunks go to consecutive streams.  1 to 64.
  // Default: 2
  uint64_t gpu_streams = 2;

  // ---------------------------------------------------------------- peers
  // Other hosts whose DBs this one reaches: "host:port,host:port" (kv_server processes or
  // DBs opened with `listen`).  Empty: no peers.  Membership is this static list.
  // Default: ""
  std::string peers;

  // Membership from etcd instead of (or besides) `peers`:
  // "etcd://HOST:PORT[,HOST:PORT...]/PREFIX" (see docs/cluster.md).  A DB with `listen`
  // registers itself under PREFIX/members/ with a lease; every DB of the cluster watches
  // the prefix and routes over the live members.  Empty: membership is `peers`.
  // Default: ""
  std::string cluster;

  // The lease a cluster member registers under: a member that dies leaves the member
  // set this long after its last renewal (renewed every third of it).  At least 1000
  // (etcd counts whole seconds; it may raise a short TTL to its own minimum).
  // Default: 5000
  uint64_t cluster_lease_ttl_ms = 5000;

  // Sharded mode: each key lives on the first R members of its rendezvous order.  A put
  // goes to all R, a get tries them in order and stops at the first hit, a delete goes
  // to all R.  With a cluster, a member that fails or went away costs a miss (not an
  // error) once peer_timeout_ms passes.  1 to 16.
  // Default: 1
  uint64_t cluster_replicas = 1;

  // Sharded mode, a cluster: for this long after a member joins (as this DB saw it
  // join; a member counts itself as joining the members it finds at its start), a
  // read that misses on a key's owners also asks the owners the key had before the
  // join, and a hit there moves the value to its owners now (put to them, then deleted
  // where it was found).  Deletes reach those previous owners too.  0: joins are not
  // bridged (a key whose owner changed is a miss).  See docs/cluster.md.
  // Default: 60000
  uint64_t cluster_join_grace_ms = 60000;

  // Sharded mode: the most deletes this DB keeps to replay on owners that missed them
  // (a member that could not be reached, or that had left the member set) once they
  // are reachable again, counting a DeleteByRegex pattern or a DeleteAll as one.
  // Beyond it a delete is not recorded (counted in kvengine.peers, delete_hints_dropped,
  // and logged).  0: deletes are not recorded.  See docs/cluster.md.
  // Default: 100000
  uint64_t cluster_delete_hints = 100000;

  // "read_through" or "sharded" (see PeerMode).  In sharded mode each key's owner is
  // chosen among peers + `listen` (this host, when set) by rendezvous hashing (XXH3 of
  // key and endpoint text), so every host must name the members the same way.
  // Default: read_through
  PeerMode peer_mode = PeerMode::kReadThrough;

  // Serve this DB to peers on "host:port" (port 0: any free port, see the
  // "kvengine.peers" property).  Any address other than loopback requires
  // peer_auth_token_file.  Empty: not serving.
  // Default: ""
  std::string listen;

  // The token file peers prove at connect (both ways: required of clients when serving,
  // offered to peers when calling them), in one of two forms (docs/transport.md, "Tenant
  // tokens"): one shared secret, the whole file (who proves it may use every
  // namespace); or "kvengine-tokens 1" and lines "tenant NAME TOKEN NAMESPACE..." (a
  // namespace's name, "default", or "*" for all), when a client's requests may name
  // only keys of its tenant's namespaces (others: PermissionDenied) and this host
  // presents the first tenant to its peers.  A malformed file fails Open with
  // InvalidArgument naming the line.  Empty: none.
  // Default: ""
  std::string peer_auth_token_file;

  // Longest a call to a peer may take (connect, send, answer); past it the keys for
  // that peer fail with IOError naming it.
  // Default: 2000
  uint64_t peer_timeout_ms = 2000;

  // Serving (`listen`): a client that connects must authenticate within this long, or
  // the server closes the connection.
  // Default: 5000
  uint64_t peer_handshake_timeout_ms = 5000;

  // Serving: a request frame that began to arrive must arrive whole within this long
  // (and a client must take an answer within it), or the server closes the connection.
  // An idle authenticated connection has no deadline.
  // Default: 10000
  uint64_t peer_frame_timeout_ms = 10000;

  // Serving: connections one client address (IP) may hold at once; further ones are
  // closed at accept, logged.  A client process opens 4 per server.
  // Default: 128
  uint64_t peer_max_connections_per_address = 128;

  // Serving: connections all clients together may hold at once.  Each costs a socket,
  // counted in the engine's share of the process's descriptor limit (docs/ssd_tier.md,
  // "The descriptor budget"): past the cap a new connection is refused at once with
  // Busy ("... its descriptor budget; raise ulimit -n"), counted in "kvengine.peers"
  // as refused_over_budget and logged at most once per 10 s; the connections held are
  // served as before.  0: sized from the budget (a quarter of the engine's share, half
  // of that when local_listen is set too).  A larger value is clamped to that size.
  // Default: 0
  uint64_t peer_max_connections = 0;

  // Serving: bytes of answers one connection may have queued and not yet read by its
  // client.  Answers are written as the socket takes them, never waited on; an answer
  // that would take a connection's unread bytes past this closes it (counted in
  // "kvengine.peers" as slow_readers_closed, logged at most once per 10 s).  The first
  // answer waiting is never refused, whatever its size.
  // Default: 256 MiB
  uint64_t peer_max_queued_bytes = 256ull << 20;

  // Hash value bodies in peer frames on loopback connections too, both as a client and
  // serving.  Off: between processes of one host (loopback TCP) the frame checksum
  // covers headers and metadata only, as value bytes there never leave this host's
  // memory (docs/transport.md, "Checksums on loopback").  Frames to and from other
  // hosts always hash their bodies.
  // Default: false
  bool peer_hash_loopback_bodies = false;

  // Copy a value read from a peer (read_through mode) into the local memory tier.
  // Default: true
  bool promote_from_peers = true;

  // "auto", "tcp", "rdma" or "ucx" (see PeerTransport).
  // Default: auto
  PeerTransport peer_transport = PeerTransport::kAuto;

  // ---------------------------------------------------------------- local clients
  // Serve this DB to other processes of this host on the Unix domain socket at this
  // path (see docs/attach.md): they call DB::Attach (or DB::Open of this directory) and
  // move value bytes directly in and out of the memory tier's arena, which then lives in
  // shared memory.  The path is recorded in the DB directory (file LOCAL_SOCKET) so that
  // DB::Open of the directory by another process attaches instead of failing Busy.
  // Empty: not serving local clients.
  // Default: ""
  std::string local_listen;

  // Permission bits of the socket file, in octal ("0600", "0660").  The socket is the
  // door to the whole DB, arena included; widen it only together with
  // local_allowed_uids.
  // Default: 0600
  std::string local_listen_mode = "0600";

  // Group given to the socket file (a name or a number).  Empty: the owner's group.
  // Default: ""
  std::string local_listen_group;

  // Who, besides the owner's own uid and root (always allowed, to everything), may
  // attach, and to which namespaces: entries separated by ',' (or ';', which kv_server's
  // comma-separated --options=... needs)
  //   entry     := principal [ '=' grant ]
  //   principal := N | 'uid:' N | 'gid:' N          (a plain N is a uid)
  //   grant     := scope { '+' scope }
  //   scope     := NAME | 'default' | '*' | '@admin'
  // NAME is a namespace, 'default' the default namespace, '*' every namespace (the
  // default one included), '@admin' lets the client create and drop the namespaces its
  // grant names.  An entry without '=' grants '*+@admin', so a plain list of uids
  // ("1001,1002") means what it always did.  Examples: "uid:1001=tenantA+tenantB",
  // "gid:2000=*", "uid:1002=tenantC+@admin".  A gid entry matches a client whose primary
  // or supplementary group it is; several matching entries add up.  The credentials are
  // the kernel's (SO_PEERCRED, SO_PEERGROUPS), checked at every connection: a client no
  // entry names is refused and logged; a request outside its grant fails
  // PermissionDenied naming the namespace, counted (local.namespace_refusals) and logged.
  // A namespace protects against mistakes and other tenants' calls; against a client's
  // own process, which maps its arena read-write, give namespaces that must not share
  // bytes arenas of their own (namespace_arenas; docs/attach.md, "An arena per trust
  // boundary").
  // A malformed entry fails DB::Open with InvalidArgument naming it.
  // Default: ""
  std::string local_allowed_uids;

  // Arenas of their own for namespaces that must not share memory with the others: an
  // arena per trust boundary (docs/attach.md, "An arena per trust boundary").  Entries
  // separated by ',' (or ';' inside kv_server's --options=...):
  //   entry := NAME { '+' NAME } '=' SIZE
  // Each entry cuts an arena of SIZE (rounded up to 2 MiB and whole slabs) out of
  // memory_capacity_bytes for the namespaces it names, which share it and hold their
  // values nowhere else; the default namespace and every namespace no entry names share
  // what is left (the default arena).  With local_listen each arena is a memfd of its
  // own, passed only to the attached clients whose grant (local_allowed_uids) includes
  // one of its namespaces: a client granted tenantA never maps memory that holds, or
  // ever held, another arena's values.  Each arena evicts within itself (quotas and fair
  // shares apply among the namespaces of one arena).  Example: "tenantA=4GiB,
  // tenantB+tenantC=8GiB".  A malformed entry, a namespace named twice, or arenas that
  // leave the default one less than 2 MiB fail DB::Open with InvalidArgument naming it.
  // Default: "" (one arena, shared by every namespace)
  std::string namespace_arenas;

  // Longest an attached client may hold a slot it reserved for a put without committing
  // it (a client that is alive but stopped in the middle of a put).  Past it the owner
  // gives the slot back to the arena, where another value may take it, and the client's
  // commit of that slot fails with Aborted and publishes nothing.  The client itself
  // copies into a slot only while it is younger than half of this, so that its bytes
  // never land in a slot reclaimed meanwhile.  0: reservations are held until the
  // connection closes.
  // Default: 30000
  uint64_t local_reservation_timeout_ms = 30000;

  // Connections of attached clients the owner serves at once (a client process opens
  // one per call it has in flight).  Each costs the owner a socket and, while its shared
  // channel is set up, a memfd, counted in the engine's share of the process's
  // descriptor limit (docs/ssd_tier.md, "The descriptor budget"): past the cap a new
  // connection is refused at once with Busy ("the owner serves N attached connections,
  // its descriptor budget; raise ulimit -n"), which DB::Attach returns; counted
  // (local.clients_over_budget) and logged at most once per 10 s.  0: sized from the
  // budget (a quarter of the engine's share, half of that when `listen` is set too).
  // A larger value is clamped to that size.
  // Default: 0
  uint64_t local_max_connections = 0;

  // Longest a thread waiting on a local socket -- an attached client for its answer,
  // the owner's thread of a connection for the next request -- polls without sleeping
  // before it sleeps, in microseconds.  Waking a sleeping thread costs tens of
  // microseconds on virtual machines, about a 64 KiB copy, and so does the system call
  // that wakes it; spinning costs a core while it lasts, so a waiter spins only while
  // that kind of wait has recently been shorter than this (docs/attach.md, "Latency").
  // The default covers the owner's wait while a client copies a group of 1 MiB values
  // (a few hundred microseconds); a client that pauses longer between calls lets the
  // owner's thread sleep.  Applies to owner and clients alike, each taking its own.
  // 0: never spin.
  // Default: 1000
  uint64_t local_busy_poll_us = 1000;

  // Carry an attached client's requests and the owner's answers through a ring in
  // shared memory instead of the Unix socket, which then only wakes a sleeping side and
  // tells that the other died (docs/attach.md, "The shared channel").  A round trip
  // between two busy sides then makes no system call.  The client asks for it at
  // connect; owners without it (and clients with it off) use the socket.
  // Default: true
  bool local_shared_channel = true;

  // ---------------------------------------------------------------- logging
  // Least severe message written to the log: "debug", "info", "warn", "error", "off".
  // Default: warn
  LogLevel log_level = LogLevel::kWarn;

  // Write the log to this file (appending) instead of stderr.  Empty: stderr.
  // Default: ""
  std::string log_file;

  // ---------------------------------------------------------------- observability
  // What is timed into the perf histograms (GetProperty("kvengine.perf")): "off",
  // "entry" (the calls users make), "all" (every instrumented method too) or "auto":
  // "entry" when metrics_listen is set -- a DB that serves /metrics exports latency
  // histograms with samples -- and "off" otherwise (an embedded DB nobody scrapes pays
  // no clock reads).  The level is process-wide (see kvengine/perf.h): DB::Open sets it
  // from this option, and SetPerfLevel() changes it at run time.  With "off" a timed
  // scope costs one branch; "entry" and "all" about two clock reads per timed scope
  // (the cost measured is in docs/observability.md).
  // Default: auto
  PerfLevel perf_level = PerfLevel::kAuto;

  // Serve this process's metrics over HTTP on "HOST:PORT" ("PORT" alone: 127.0.0.1,
  // loopback like every listener here; port 0: any free port, see the
  // "kvengine.metrics_listen" property): GET /metrics (Prometheus text format),
  // /health, /ready and /stats.json (docs/observability.md).  Any process that opens or
  // attaches a DB may serve it; an attached process reports its own calls.  The
  // endpoint answers with no authentication: give a non-loopback address only on a
  // network the operators trust.  Empty: no endpoint.
  // Default: ""
  std::string metrics_listen;

  // ---------------------------------------------------------------- not from strings
  // Called for each log line instead of the file/stderr sink when set.  Must be
  // thread-safe.
  std::function<void(LogLevel, const std::string&)> log_callback;

  // The environment the DB uses for files.  nullptr: the default PosixEnv.
  // Not owned; must outlive the DB.
  Env* env = nullptr;

  // Told about every memory region that a peer may need to reach: the memory tier's
  // arena at Open and each RegisterBuffer.  Transports that need registration (RDMA)
  // install one.  nullptr: nothing is registered beyond the DB's own bookkeeping.
  std::shared_ptr<MemoryRegistrar> memory_registrar;

  // Sets the option called `name` (as spelled in this struct) from its string form.
  // Returns InvalidArgument naming the option and the value when the name is unknown or
  // the value malformed or out of range; *this is then unchanged.
  Status Set(const std::string& name, const std::string& value);

  // Applies every KVENGINE_<NAME> variable of the process environment.  Stops at the
  // first malformed one and returns InvalidArgument naming the variable and its value;
  // *this is then unchanged.  An unset variable leaves its option alone.
  Status ApplyEnvironment();

  // Checks the relations between options (slab size vs capacity ...).
  Status Validate() const;

  // The names of every option settable with Set(), in declaration order.
  static std::vector<std::string> SettableNames();

  // Every settable option as "name=value" lines, for logs and kv_ldb.
  std::string ToString() const;
};

// Per-read options.
struct ReadOptions {
  // Verify the stored checksum of values read from SSD or a peer.
  // Default: true
  bool verify_checksums = true;
};

// Per-write options.
struct WriteOptions {
  // Make the write durable (on SSD) before returning, where the DB has an SSD tier.
  // Default: false
  bool sync = false;

  // The write is a cache fill: a copy of a value read elsewhere (ClusterDB's read-through
  // promotion of a value a peer served), offered to the memory tier only.  It is stored
  // only where the DB holds no value for the key (a write that raced with the read
  // wins), never evicts anything to make room, and is never written to SSD by the put.
  // A key's result is 0 whether the copy was kept or not; bad input fails as for any
  // put.  The values must be in host memory.
  // Default: false
  bool fill_cache = false;
};

}  // namespace kvengine

#endif  // KVENGINE_OPTIONS_H_
