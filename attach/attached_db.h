// AttachedDB: a DB served by another process of this host (DB::Attach; docs/attach.md).
//
// The owner process opened the DB with Options::local_listen.  This client talks to it
// over that Unix socket and maps the owner's memory-tier arena (received once per
// connection), so value bytes move once, between the caller's buffers and the arena:
//   BatchPut      RESERVE slots -> copy the parts in -> COMMIT (published as a local put)
//   BatchGetInto  PIN the values -> copy them out -> UNPIN, in rounds when the values not
//                 in memory fill the connection's staging window (attach/staging_window.h)
//   BatchGetIntoGroups  one PIN_GROUPS for all the groups of a layer-wise load: the
//                 owner answers each group as soon as it is in, the client copies it out
//                 and reports it (older owners: one BatchGetInto per group)
// Requests and answers go through a shared channel (transport/shm_channel.h) when the
// owner offers one, and a batch's commits and pins are pipelined with its copies.
// Everything else is a plain request.  Results, error codes and properties are the
// owner's, except "kvengine.attached": the socket path, answered by the client (an
// owner does not know the property), so a caller can tell an attached DB from its own.
//
// A put's slots are reclaimed by the owner after its local_reservation_timeout_ms; the
// client copies into a slot only within half of that, else the key fails with Aborted.
//
// Failures: when the owner dies or stops answering within Options::peer_timeout_ms,
// every call fails with IOError naming the socket; the next call reconnects, so the
// client recovers by itself once an owner serves the path again.  Nothing a client held
// (reservations, pins) outlives its connection on the owner's side.
//
// Connections: a pool of up to kMaxConnections, one per call in flight (a call holds one
// from start to end: a put's RESERVE and COMMIT, a get's PIN and UNPIN go over the same
// connection, which owns the reservations and pins); more concurrent calls wait for one.
// An owner at its cap of connections (Options::local_max_connections, its descriptor
// budget) refuses a new one with Busy: the first connection's refusal is what
// DB::Attach returns; a later one lowers the pool's size to the connections it has, and
// the call waits for one of them instead of failing.
// The arena is mapped once and shared by the connections that received the same memfd;
// it is unmapped with the last of them.  After a failure the pool's idle connections
// are dropped with the failed one: the next call connects afresh.
//
// GPU buffers: parts and destinations in device memory are detected as by a DB opened in
// this process (env/gpu_io.h, docs/gpu.md); a put copies device -> its reserved slot, a
// get copies its pinned value -> device, both straight by DMA once the mapping is
// page-locked (cudaHostRegister, on first use), else through the staging ring.
//
// Namespaces: CreateNamespace, OpenNamespace, DropNamespace and ListNamespaces are the
// owner's, checked there against this process's credentials (Options::local_allowed_uids
// of the owner; docs/attach.md, "Namespaces and credentials").  The handle of a namespace
// is another AttachedDB on the same socket whose connections are bound to the namespace
// as they open (USE_NAMESPACE): the client sends the keys as its caller gave them, and
// the owner maps them into the namespace -- the client's own check of a key is only
// there to fail early.  A handle has its own pool of connections and outlives the DB it
// came from; its calls fail PermissionDenied when the owner's grant does not cover its
// namespace, Aborted once the namespace was dropped (NotFound on a connection opened
// after the drop).  ListNamespaces lists the
// namespaces this process may use.
//
// Thread-safety: all methods are thread-safe; calls of different threads run at once,
// each on its own connection.
#ifndef KVENGINE_ATTACH_ATTACHED_DB_H_
#define KVENGINE_ATTACH_ATTACHED_DB_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attach/local_counters.h"
#include "env/owned_fd.h"
#include "env/shared_mapping.h"
#include "kvengine/db.h"
#include "namespaces/namespace_keys.h"
#include "transport/read_validation.h"
#include "transport/socket_util.h"
#include "util/logging.h"
#include "util/region_map.h"

namespace kvengine {

class GpuIo;

class AttachedDB final : public DB {
 public:
  // Connections one client opens to its owner at most.
  static constexpr size_t kMaxConnections = 16;

  // A client of the owner at `socket_path`, in namespace `name_space` ("": the default
  // namespace; a namespace's handles come from OpenNamespace).
  AttachedDB(const Options& options, std::string socket_path, std::string name_space = "");
  ~AttachedDB() override;

  // Connects to the owner (the pool's first connection); IOError naming the socket when
  // it cannot, or the owner's refusal.
  Status Connect();

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
  // A layer-wise load in one request to owners with wire::kFeatureGroups (PIN_GROUPS):
  // the owner reads every group at once -- its DB's BatchGetIntoGroups, over the peers
  // when it is a cluster's member -- and answers each group as soon as it is in; the
  // values are copied out of the arena or the staging window as by BatchGetInto, and
  // on_ready(g) runs before later groups' answers are read.  In rounds of at most the
  // staging window's bytes (values not in memory), as BatchGetInto.  Older owners: the
  // default, one BatchGetInto per group.
  Status BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                            std::vector<int64_t>* results) override;
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  // Both answered by the owner (its BatchLocate and its removal feed, over the
  // attach protocol's LOCATE and READ_REMOVALS).
  Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) override;
  // The owner's resident set of this handle's namespace (READ_RESIDENT, streamed a batch
  // at a time: attach/resident_wire.h), its epoch and its removal sequence, which is
  // that of ReadRemovals here.  `batch` must return within Options::peer_timeout_ms of
  // the owner (it drops a client that does not ask for the next batch by then).
  // NotSupported from an owner that predates it (no wire::kFeatureResident).
  Status ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                      ResidentSnapshot* snapshot) override;
  Status BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override;
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override;
  Status DeleteAll(uint64_t* deleted) override;
  Status RegisterBuffer(void* addr, size_t length) override;
  Status UnregisterBuffer(void* addr) override;
  Status Flush() override;
  Status CompactBuckets(uint64_t* reclaimed_bytes) override;
  // "kvengine.attached": the socket path; "kvengine.namespace": a handle's namespace;
  // the others the owner's.
  bool GetProperty(const std::string& name, std::string* value) override;

  // The owner's, checked there (see above); a namespace's handle has none of its own
  // (InvalidArgument: namespaces do not nest).
  Status CreateNamespace(const std::string& name, const NamespaceOptions& options,
                         std::unique_ptr<DB>* handle) override;
  Status OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) override;
  Status DropNamespace(const std::string& name, uint64_t* deleted) override;
  Status ListNamespaces(std::vector<NamespaceInfo>* namespaces) override;

 private:
  struct ArenaMapping;
  struct Connection;
  class Checkout;
  struct PutPlan;
  class PutRun;
  struct GetPlan;
  class GetRun;
  using Clock = std::chrono::steady_clock;

  // A put's values are committed in groups as they are copied (owners with spares), so
  // that the owner publishes one group while the next is copied; a get's keys are pinned
  // in groups, the first copied out while the owner pins the rest.  A group holds at
  // least kMinGroupBytes of values (destinations), and a batch makes at most about
  // kMaxGroups: each group costs a frame each way.
  static constexpr uint64_t kMinGroupBytes = 256u << 10;
  static constexpr uint64_t kMaxGroups = 8;
  static uint64_t GroupBytes(const std::vector<uint64_t>& sizes);
  // Puts of more keys commit at once: their answers (~40 bytes a key) might not fit in
  // the channel's ring while the client is still copying.
  static constexpr size_t kMaxPipelinedKeys = 1024;

  // One COMMIT_RESERVE of a put, posted: values [first, first + count) of those copied,
  // and (the first group) the spares wanted for the next put.
  struct CommitGroup {
    size_t first = 0, count = 0;
    std::vector<uint64_t> wanted;
    Clock::time_point sent;
    std::string answer;
  };

  // A reserved slot of the arena for one value of a put.
  struct Slot {
    int64_t code = 0;  // < 0: the key's error instead of a slot
    uint64_t offset = 0, size = 0, id = 0;
    Clock::time_point copy_deadline;  // copy into it only before this
  };

  // BatchPut's steps: the client's own checks of each value (PlanPut), a slot for each
  // (TakeSlots), the copies into them and the commits (PutRun).  When `refusal` is not
  // null, the Status of the first value the checks refused is stored there, naming the
  // problem (Put returns it).
  Status PutValues(std::span<const Slice> keys, std::span<const ValueParts> values,
                   std::vector<int64_t>* results, Status* refusal);
  Status PutValuesUncounted(std::span<const Slice> keys, std::span<const ValueParts> values,
                            std::vector<int64_t>* results, Status* refusal);
  void PlanPut(GpuIo* gpu, std::span<const Slice> keys, std::span<const ValueParts> values,
               PutPlan* plan, std::vector<int64_t>* results, Status* refusal) const;
  // BatchGetInto's steps: the client's own checks of each destination and the groups of
  // pins (PlanGet), every group's PIN posted at once, then the copies out of the pinned
  // values and the UNPIN (GetRun).  `refusal` as for PutValues.
  Status GetValues(std::span<const Slice> keys, std::span<const Destination> destinations,
                   std::vector<int64_t>* results, Status* refusal);
  // Counts a read's results (s: the call's status) into counters_; returns s.
  Status CountGets(const Status& s, size_t keys, const std::vector<int64_t>* results);
  Status GetValuesUncounted(std::span<const Slice> keys, std::span<const Destination> destinations,
                            std::vector<int64_t>* results, Status* refusal);
  void PlanGet(GpuIo* gpu, std::span<const Slice> keys, std::span<const Destination> destinations,
               GetPlan* plan, Status* refusal) const;
  // One round of a BatchGetInto on conn: PlanGet, the PINs, GetRun.  The keys the owner
  // answered wire::kPinLater (its staging window full) are left out of *results and
  // listed, by index, in *later: the caller reads them in another round.
  Status GetRound(Connection* conn, GpuIo* gpu, std::span<const Slice> keys,
                  std::span<const Destination> destinations, Status* refusal,
                  std::vector<int64_t>* results, std::vector<size_t>* later);
  // One round of a BatchGetIntoGroups on conn: the PIN_GROUPS of `keys` in groups ending
  // at `ends`, each group's values copied out as its answer comes, then on_group(g).
  // The keys answered wire::kPinLater are listed, by index, in *later.
  Status GroupRound(Connection* conn, GpuIo* gpu, std::span<const Slice> keys,
                    std::span<const Destination> destinations, std::span<const size_t> ends,
                    const std::function<void(size_t, bool)>& on_group,
                    std::vector<int64_t>* results, std::vector<size_t>* later);
  Status GroupsUncounted(std::span<const Slice> keys, std::span<const Destination> destinations,
                         std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                         std::vector<int64_t>* results, bool* fallback);
  // Reads the answer to request `id` (of `op`) on conn by `deadline`: a failure loses
  // the connection.
  Status ReadAnswer(Connection* conn, uint8_t op, uint64_t id, Deadline deadline,
                    std::string* answer);
  // Rounds in a row in which no key could be staged before a BatchGetInto gives up on
  // its remaining keys (Busy): only values that keep changing size make one.
  static constexpr int kMaxStalledRounds = 4;
  // An idle connection of the pool, or a new one.
  Status Acquire(std::unique_ptr<Connection>* conn);
  // Back to the pool, or closed when it failed, the DB closed or connections failed
  // since it was opened.
  void Release(std::unique_ptr<Connection> conn);
  // Opens conn: connect, receive the arena (mapped, or the mapping already shared).
  Status Open(Connection* conn);
  // Gives conn the mapping of the arena `fd` (`file`, `size` bytes): the one the other
  // connections share when it is the same arena, else a new one, which they will share.
  Status MapArena(Connection* conn, int fd, const SharedMapping::FileId& file, uint64_t size);
  // Binds conn to namespace_ (wire::kUseNamespace): the owner's refusal, or OK.
  Status UseNamespace(Connection* conn);
  // Binds conn to namespace_ and receives the memfd of its arena (wire::kOpenArena, on
  // the socket) into *memfd and its size into *size: the owner's refusal, or OK.
  Status OpenArena(Connection* conn, Deadline deadline, OwnedFd* memfd, uint64_t* size);
  // Gives conn an empty mapping: the owner passed it no arena (its grant reaches no
  // namespace of the default arena).
  Status NoArena(Connection* conn);
  // InvalidArgument when this is a namespace's handle: namespaces do not nest.
  Status NotNested(const char* call) const;
  // Sends `op` (with `meta`) on conn's socket and reads its answer there, before any
  // channel: a memfd alongside (into *memfd; invalid when none came), the owner's status
  // (*owner) and the rest of the answer's metadata (*rest).  A transport failure or an answer that
  // is not op's is returned.
  Status RequestRegion(Connection* conn, uint8_t op, Deadline deadline, OwnedFd* memfd,
                       Status* owner, std::string* rest, const std::string& meta = "");
  // Asks the owner for conn's shared channel (wire::kOpenChannel) and maps it.
  Status OpenChannel(Connection* conn, Deadline deadline);
  // Asks the owner for conn's staging window (wire::kOpenStaging) and maps it.
  Status OpenStaging(Connection* conn, Deadline deadline);
  // Sends one request on conn and reads its answer's metadata (after the answers of
  // the requests posted before it).  Any transport failure drops the connection and
  // returns IOError naming the socket.
  Status Call(Connection* conn, uint8_t op, const std::string& meta, std::string* answer);
  // Sends a request whose answer is read into *answer by the next CollectAnswers (or
  // Call): requests are pipelined, the owner answering them in order.
  Status Post(Connection* conn, uint8_t op, const std::string& meta, std::string* answer);
  // Posts one request per element of metas, answers[i] receiving the answer to metas[i].
  // Over the shared channel the owner sees them all at once (ShmChannel::SendFrames).
  Status PostAll(Connection* conn, uint8_t op, const std::vector<std::string>& metas,
                 std::vector<std::string>* answers);
  // Reads the answers of the oldest `count` requests posted on conn (all by default).
  Status CollectAnswers(Connection* conn, size_t count = SIZE_MAX);
  // Sends a request without waiting for an answer (UNPIN is one-way; Post registers
  // the answer of the others).  A failure drops the connection.
  Status Send(Connection* conn, uint8_t op, const std::string& meta);
  // A slot of sizes[j] for keys[j]: a spare of conn when it has one (unless `fresh`),
  // else reserved now.
  Status TakeSlots(Connection* conn, const std::vector<Slice>& keys,
                   const std::vector<uint64_t>& sizes, std::vector<Slot>* slots,
                   bool fresh = false);
  // Publishes slots `ids` under `keys` with a plain COMMIT (owners without spares; the
  // others take COMMIT_RESERVE groups, BatchPut).
  Status CommitSlots(Connection* conn, const std::vector<Slice>& keys,
                     const std::vector<uint64_t>& ids, std::vector<int64_t>* published);
  // Adds the spares an answer reserved (sizes, as asked) to conn's.
  void AddSpares(Connection* conn, Clock::time_point sent, const std::vector<uint64_t>& sizes,
                 const std::vector<int64_t>& reserved, const std::vector<RemoteLocation>& locs);
  // A request whose answer is a batch status and per-key results.
  Status CallForResults(uint8_t op, const std::string& meta, size_t expected,
                        std::vector<int64_t>* results);
  // A request whose answer is a batch status and one fixed64.
  Status CallForCount(uint8_t op, const std::string& meta, uint64_t* count);
  // Marks conn lost (its socket closes when the call gives it back) and retires the
  // pool's idle connections; IOError naming the socket.
  Status Lost(Connection* conn, const std::string& what);
  // What a request on a connection already lost answers.
  Status Gone() const;

  const Options options_;
  const std::string socket_path_;
  const std::string namespace_;  // "": the default namespace
  const NamespaceKeys rule_;     // namespace_'s keys, for the client's own early check
  // This client's own calls, for its process's metrics ("kvengine.metrics").
  AttachedClientCounters counters_;
  Logger logger_;  // GPU staging's messages

  std::mutex mu_;  // guards everything below
  std::condition_variable released_;
  bool closed_ = false;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t open_ = 0;                    // connections idle or in use
  size_t max_open_ = kMaxConnections;  // lowered when the owner refuses one (Busy)
  uint64_t generation_ = 0;            // bumped by every loss: older idle connections are retired
  std::weak_ptr<ArenaMapping> arena_;  // the connections' mapping, while one holds it
  RegionMap registered_buffers_;       // RegisterBuffer's regions (the caller's own memory)
};

}  // namespace kvengine

#endif  // KVENGINE_ATTACH_ATTACHED_DB_H_
