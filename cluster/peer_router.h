// PeerRouter: ClusterDB's door to the other hosts (cluster/cluster_db.h).
//
// It owns a Transport (the client side) and, when Options::listen is set, a
// TransportServer serving this host's local DB to the peers, and it knows the members.
// ClusterDB decides which keys leave the host; the router moves them:
//
//   read_through  a key missing locally is asked of every peer at once (BatchExists in
//                 parallel); the first peer to answer "present" serves the bytes, straight
//                 into the caller's buffers; the value may then be promoted into the
//                 local memory tier.
//   sharded       each key has one owner among the members (peers + this host's
//                 `listen`), chosen by rendezvous hashing: the member with the highest
//                 XXH3(key, 0, endpoint) wins.  Adding or removing a member moves only
//                 the keys it wins or won.  Puts, gets, deletes, exists and
//                 GetValueSize go to the owner; a dead owner fails its keys with IOError
//                 naming it.  DeleteByRegex and DeleteAll act on every member at once.
//   replicated    sharded with a cluster or cluster_replicas > 1: each key has R owners
//                 (the top R of the rendezvous order).  Puts and deletes go to all R, gets
//                 and exists ask them in order until a hit; a failed owner costs a miss.
//
// Requests the server receives from peers are answered by the local DB below ClusterDB,
// which has no peers, so hosts never bounce a request between each other.  Every
// `DB* local` below is that local DB: calls on it never route again.
//
// Membership comes from a MembershipSource (cluster/membership.h): the static `peers` list
// or a cluster registry (cluster/membership.h).  The source calls SetMembers() with each
// new member set, which swaps a snapshot under a lock; calls in flight keep the snapshot
// they started with.
//
// Membership changes (docs/cluster.md, "Joins and departures"):
//   join     for Options::cluster_join_grace_ms after a member joins, a read that misses
//            on a key's owners asks the owners the key had before (its rendezvous order
//            over the members less the recent joiners); a hit is moved to the owners now
//            (put to them, then deleted where found).  Deletes reach those owners too.
//   failure  a delete an owner missed -- it could not be reached, or it had left the
//            member set and would own the key again on its return -- is recorded for
//            it (a delete hint) and replayed when it is reachable: before any other call
//            this router makes to it, and by a background thread every 200 ms.
//
// Thread-safety: all methods are thread-safe.
#ifndef KVENGINE_CLUSTER_PEER_ROUTER_H_
#define KVENGINE_CLUSTER_PEER_ROUTER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "db/tier_counters.h"
#include "kvengine/db.h"
#include "kvengine/env.h"
#include "kvengine/options.h"
#include "kvengine/transport.h"
#include "transport/tenant_tokens.h"
#include "util/mutex.h"

namespace kvengine {

class SharedArena;

class Logger;
class MembershipSource;
class UcxServer;
class TransportServer;
struct PinnedValue;

// True when a buffer of dest is GPU memory (or cannot be told apart from it): the
// transports copy from and into host memory only.
bool OnDevice(std::span<const MutableSlice> dest);

class PeerRouter {
 public:
  // Pins a key's value in the local memory tier for a peer to read (see
  // transport/server.h).  False when the memory tier does not hold it, or -- unless
  // `wait` -- when its lock is busy.
  using PinFn = std::function<bool(const Slice& key, bool wait, PinnedValue* out)>;
  // Counts `values` reads (of `bytes` bytes) the server's poller answered from values it
  // pinned without waiting: a PinFn call with !wait counts nothing, since the poller
  // gives its pins up when a key of the batch is missing and a worker pins them again.
  using ServedFn = std::function<void(uint64_t values, uint64_t bytes)>;
  // Offers a value read from a peer for promotion into the local memory tier.
  using PromoteFn =
      std::function<void(const Slice& key, std::span<const Slice> parts, uint64_t size)>;

  // Parses the peer options, reads the token file and creates the transport.  Stores
  // nullptr in *result when the options name no peers, no cluster and no listen address.
  // `logger` outlives the router.
  static Status Open(const Options& options, Logger* logger, std::unique_ptr<PeerRouter>* result);
  ~PeerRouter();

  // A registrar that registers with the transports (and then `next`, when set), to
  // install as Options::memory_registrar.
  std::shared_ptr<MemoryRegistrar> Registrar(std::shared_ptr<MemoryRegistrar> next);

  // Starts serving `local` (the DB below ClusterDB) when Options::listen is set, then
  // starts the membership source.  `pin` reads local's memory tier for one-sided reads;
  // `served` counts the GETs the server answered from such pins alone.
  Status StartServing(DB* local, PinFn pin, ServedFn served, const char* arena_base);
  // Stops accepting and drains requests in flight.  Idempotent.  Calls to peers fail
  // with Aborted afterwards.
  void Close();

  // ---------------------------------------------------------------- sharded
  // True when calls are routed to their owners (sharded mode).
  bool Routing() const;
  // True (and the owner in *owner) when another member owns key.
  bool RemoteOwner(const Slice& key, Endpoint* owner) const;
  // The member owning key (its endpoint text; this host's is `listen`).
  std::string OwnerOf(const Slice& key) const;
  // Replaces the members (this host, when named, is dropped).
  void SetMembers(std::vector<Endpoint> peers);

  // True when routing keeps replicas (a cluster, or cluster_replicas > 1): keys then go
  // through the batch calls below or the *Replicated single-key calls, never RemoteOwner.
  bool Replicated() const;
  // The owners of key in rendezvous order, at most cluster_replicas of them (endpoint
  // texts; this host's is `listen`).
  std::vector<std::string> OwnersOf(const Slice& key) const;
  // Single keys over the replicas: a put to all owners (OK when one took it); a get
  // from the first owner that has it (NotFound when none answers with it); a delete
  // from all.  `local` answers for this host.
  Status PutReplicated(DB* local, const Slice& key, const Slice& value);
  Status GetReplicated(DB* local, const Slice& key, std::string* value);
  Status GetIntoReplicated(DB* local, const Slice& key, MutableSlice buffer, size_t* size);
  Status DeleteReplicated(DB* local, const Slice& key);
  Status GetValueSizeReplicated(DB* local, const Slice& key, uint64_t* size);

  // Batch calls split by owner: this host's keys go to `local` (answered from its own
  // tiers), the others to their owners, in parallel.
  Status BatchPut(DB* local, const WriteOptions& options, std::span<const Slice> keys,
                  std::span<const ValueParts> values, std::vector<int64_t>* results);
  Status BatchGetInto(DB* local, const ReadOptions& options, std::span<const Slice> keys,
                      std::span<const Destination> dests, std::vector<int64_t>* results);
  // A layer-wise load (DB::BatchGetIntoGroups): the groups' reads of other members are
  // started ahead of the group being waited for, up to a window of bytes in flight
  // (Transport::StartBatchGetGroups: one request per run of groups and first owner,
  // pipelined over the connections; the first group in a run of its own, so that its
  // answer waits behind none of the others'), and each group is finished in order --
  // this host's share read from `local`, the members' answers waited for, the keys its
  // first owner did not serve asked of the key's other owners as BatchGetInto asks them
  // -- and reported to `on_ready` as soon as it is whole.
  Status BatchGetIntoGroups(DB* local, const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> dests, std::span<const size_t> group_ends,
                            const DB::GroupReadyFn& on_ready, std::vector<int64_t>* results);
  Status BatchExists(DB* local, std::span<const Slice> keys, std::vector<int64_t>* results);
  Status BatchDelete(DB* local, const WriteOptions& options, std::span<const Slice> keys,
                     std::vector<int64_t>* results);
  // This host's share of a batch call: keys[idx[j]] answered into (*r)[j].
  using LocalGroupFn = std::function<Status(const std::vector<size_t>& idx, std::vector<int64_t>*)>;
  // BatchPut whose share for this host is stored by `local_put`, called only once every
  // other owner's share has been sent and answered: `values` may be the very bytes
  // local_put publishes in place (an attached client's arena slots, ClusterDB::Commit),
  // which may be reused as soon as they are published.  Results as BatchPut's: a key's
  // is its first owner's success, else its first owner's error (IOError when that owner
  // could not be reached).  Keys may repeat; the owners check the values.
  Status BatchPutLocalLast(std::span<const Slice> keys, std::span<const ValueParts> values,
                           const LocalGroupFn& local_put, std::vector<int64_t>* results);
  // Single keys on a remote owner; the status names the peer.
  Status Put(const Endpoint& owner, const Slice& key, const Slice& value);
  Status Get(const Endpoint& owner, const Slice& key, std::string* value);
  Status GetInto(const Endpoint& owner, const Slice& key, MutableSlice buffer, size_t* size);
  Status Delete(const Endpoint& owner, const Slice& key);
  Status GetValueSize(const Endpoint& owner, const Slice& key, uint64_t* size);

  // Whole-cluster deletes: `local`'s own tiers and every member, all in
  // parallel; each member acts on its own tiers only.  *deleted (may be nullptr) gets the
  // sum of the counts of the hosts that succeeded, also on failure (their keys stay
  // removed).  When any host fails: IOError naming each failed host and its error.
  // DeleteByRegex: the caller has checked that `pattern` compiles; a pattern over
  // wire::kMaxPatternLen bytes is InvalidArgument before anything is removed.
  Status DeleteByRegex(DB* local, const std::string& pattern, uint64_t* deleted);
  Status DeleteAll(DB* local, uint64_t* deleted);

  // Delete hints not yet replayed (keys, patterns and DeleteAlls, all members).
  uint64_t PendingDeleteHints() const EXCLUDES(hints_mu_);

  // ---------------------------------------------------------------- namespaces
  // Answers a SYNC_NAMESPACES request (namespaces/namespace_fleet.h): `may_change`,
  // whether the client may create and drop namespaces (a token of every namespace);
  // `visible`, the namespaces it may see.
  using NamespaceSyncFn =
      std::function<Status(bool may_change, const std::function<bool(uint64_t id)>& visible,
                           std::string_view request, std::string* answer)>;
  // Installs the answerer of the peers' SYNC_NAMESPACES requests; an empty one
  // uninstalls it, once the requests in flight have returned (they are refused after).
  void ServeNamespaceSync(NamespaceSyncFn fn) EXCLUDES(sync_mu_);
  // The other members now, by endpoint.
  std::vector<std::string> MemberNames() const;
  // Sends `member` (its endpoint) a SYNC_NAMESPACES request; the status names it.
  Status SyncNamespaces(const std::string& member, const std::string& request, std::string* answer);

  // ---------------------------------------------------------------- read-through
  // True when local misses should be asked of the peers.
  bool ReadThrough() const;
  // Fills the keys whose result is NotFound from the peers.
  void ReadThroughGet(std::span<const Slice> keys, std::span<const Destination> dests,
                      std::vector<int64_t>* results, const PromoteFn& promote);
  // As ReadThroughGet for one key into a string; NotFound when no peer has it.
  Status ReadThroughGetString(const Slice& key, std::string* value, const PromoteFn& promote);
  // Sets to 1 the keys whose result is 0 that a peer holds.  *unasked (when given): why
  // the first peer that could not be asked failed; OK when every peer answered.
  void ReadThroughExists(std::span<const Slice> keys, std::vector<int64_t>* results,
                         Status* unasked = nullptr);
  // The size of key's value on the first peer found to hold it; NotFound when none does.
  Status ReadThroughValueSize(const Slice& key, uint64_t* size);

  // Counters and configuration as text ("listen: host:port" first).
  std::string StatsText() const;
  // The membership's readiness line ("kvengine.readiness").
  std::string Readiness() const;
  // Appends the gauges kvengine_cluster_members (the live members this host routes
  // over, itself included when it serves) and kvengine_cluster_failing_members (those
  // whose last call failed), Prometheus text format ("kvengine.metrics").
  void AppendPrometheus(std::string* out) const;
  // Where reads of the peer tier are counted (db/tier_counters.h): the engine's peer
  // TierCounters, which outlive the router.  Set once, before any call.
  void SetTierCounters(TierCounters* peer) { peer_tier_ = peer != nullptr ? peer : &own_tier_; }
  // The local engine's arena, into which peers served over UCX put their values
  // one-sidedly (UcxServer::ServePuts); it must outlive the router's server.
  void ServeOneSidedPuts(SharedArena* local_arena);

 private:
  class Service;
  class Chain;
  // A peer's SYNC_NAMESPACES request, answered by the installed NamespaceSyncFn.
  Status AnswerNamespaceSync(const Tenant* tenant, std::string_view request,
                             std::string* answer) const EXCLUDES(sync_mu_);
  PeerRouter(const Options& options, Logger* logger);
  Status ServePeers(DB* db, PinFn pin, ServedFn served, const char* arena_base);
  // The server's cap on connections: peer_max_connections within the descriptor
  // budget (env/descriptor_budget.h), logged when clamped.
  uint64_t ServingConnectionCap();
  std::vector<Endpoint> Members() const;
  // Splits keys by owner: groups[j] for members[j]; local_idx for this host.
  void Partition(std::span<const Slice> keys, std::vector<Endpoint>* members,
                 std::vector<std::vector<size_t>>* groups, std::vector<size_t>* local_idx) const;
  // One owner's share of a replicated batch: the keys (indexes into the batch) and
  // their results.
  struct OwnerGroup {
    std::string owner;
    std::vector<size_t> idx;
    std::vector<int64_t> r;
    Status status;  // the call's (RunGroups): not OK when the owner was not reached
  };
  using RemoteGroupFn = std::function<Status(const Endpoint& owner, const std::vector<size_t>& idx,
                                             std::vector<int64_t>*)>;
  // Runs every group at once: this host's through `local`, the others' through `remote`.  A failed
  // call fills its keys' results with its error code.  With `local_last`, this host's
  // group runs only after every other group has been answered.
  void RunGroups(std::vector<OwnerGroup>* groups, const LocalGroupFn& local,
                 const RemoteGroupFn& remote, bool local_last = false);
  // Each key's owners for one batch (one member snapshot for all).
  std::vector<std::vector<std::string>> OwnersOfAll(std::span<const Slice> keys) const;
  // The owners each key had before the recent joins (cluster_join_grace_ms) that are
  // not among its owners now (`owners`, OwnersOfAll's); all empty when no member joined
  // within the grace.
  std::vector<std::vector<std::string>> PreviousOwnersOfAll(
      std::span<const Slice> keys, const std::vector<std::vector<std::string>>& owners) const
      EXCLUDES(members_mu_);
  // Asks each key its owners in order, one rank at a time, until `done(result)`, then
  // (within a join's grace) its previous owners the same way; keys no owner settled get
  // NotFound (a failed owner costs a miss, never an error).  `asked` (empty, or one per
  // key; "" for none): an owner the key was already asked of, which is not asked again
  // -- by name, not by rank, since the member set may have changed since (a dead first
  // owner that left it would otherwise shift its second owner to rank 0 and the key be
  // asked of a member that never held it).  `from` (may be null): per key, the previous
  // owner that settled it, else "".
  void AskInOrder(std::span<const Slice> keys, std::vector<int64_t>* results,
                  const std::function<bool(int64_t)>& done, const LocalGroupFn& local,
                  const RemoteGroupFn& remote, std::vector<std::string>* from = nullptr,
                  std::span<const std::string> asked = {});
  // Replicated BatchGetInto from the owners (AskInOrder, less each key's `asked`), a key
  // found on an owner it had before a join moved to its owners now.
  void GetFromOwners(DB* local, const ReadOptions& options, std::span<const Slice> keys,
                     std::span<const Destination> dests, std::vector<int64_t>* results,
                     std::span<const std::string> asked = {});
  // One group of a layer-wise load (BatchGetIntoGroups) sent to one member.
  struct GroupCall;
  // Waits for group g's calls, reads its local share, asks its unserved keys of their
  // other owners (replicated), and stores its results.
  void FinishGroup(DB* local, const ReadOptions& options, std::span<const Slice> keys,
                   std::span<const Destination> dests, const std::vector<size_t>& local_idx,
                   std::span<const std::unique_ptr<GroupCall>> calls,
                   std::vector<int64_t>* results);
  // Moves keys read from a previous owner (`from`, per key; "" for none) to their owners
  // now: a put of `values` to them, then a delete where each was found.
  void MoveToOwners(DB* local, std::span<const Slice> keys, std::span<const ValueParts> values,
                    const std::vector<std::string>& from);
  // BatchDelete over the owners (and previous owners within a join's grace); records a
  // delete hint for every owner that missed it.
  void DeleteOnOwners(DB* local, const WriteOptions& options, std::span<const Slice> keys,
                      std::vector<int64_t>* results);
  // Collapses each key's answers from its owners (SendToAll's rule) into *results;
  // answers of other groups' owners (previous owners) are ignored.
  static void CollapseAnswers(const std::vector<std::vector<std::string>>& owners,
                              const std::vector<OwnerGroup>& groups, std::vector<int64_t>* results);
  // Sends each key to all its owners; a key's result is the first owner's success, else
  // NotFound when one answered NotFound, else the first owner's error.
  void SendToAll(std::span<const Slice> keys, std::vector<int64_t>* results,
                 const LocalGroupFn& local, const RemoteGroupFn& remote, bool local_last = false);
  // Asks key's owners in order (this host through `local`) until one answers OK;
  // NotFound when none does.
  // Within a join's grace, then its previous owners; `from` (may be null) gets the one
  // that answered when it was a previous owner, else "".
  Status FromFirstOwner(const Slice& key, const std::function<Status()>& local,
                        const std::function<Status(const Endpoint&)>& remote,
                        std::string* from = nullptr);
  bool IsSelf(const std::string& owner) const { return owner.empty() || owner == self_; }

  // Runs `local` and `remote` for every member, in parallel; sums the counts.  `what` names the
  // call in the error.
  // Records `hint` for every member that failed and every member that has left the set
  // (delete hints).
  struct Hint;
  Status DeleteEverywhere(const char* what, const std::function<Status(uint64_t*)>& local,
                          const std::function<Status(const Endpoint&, uint64_t*)>& remote,
                          uint64_t* deleted, const Hint& hint);

  // ---------------------------------------------------------------- delete hints
  // Deletes a member missed, replayed in this order: DeleteAll, patterns, keys.
  struct Hint {
    bool all = false;
    std::vector<std::string> patterns;
    std::set<std::string> keys;
    size_t size() const { return (all ? 1 : 0) + patterns.size() + keys.size(); }
  };
  // Adds `delta` to member's hint, within cluster_delete_hints (what does not fit is
  // counted and logged).  A pending DeleteAll covers every later delete.
  void RecordHint(const std::string& member, const Hint& delta) EXCLUDES(hints_mu_);
  // Counts one more recorded hint when `limit` leaves room for it, else one more in
  // *dropped.
  bool AdmitHintLocked(uint64_t limit, uint64_t* dropped) REQUIRES(hints_mu_);
  // Forgets the part of member's hint that was replayed.
  void ForgetHint(const std::string& member, const Hint& done) EXCLUDES(hints_mu_);
  // Replays member's hint, if any; OK when there was none or all of it was applied.
  // Called before every call to a member, so a member that missed a delete never
  // answers this router before it has applied it.
  Status ReplayFirst(const Endpoint& peer) EXCLUDES(hints_mu_, replay_mu_);
  Status ReplayTo(const std::string& member) EXCLUDES(hints_mu_, replay_mu_);
  // The background thread: replays hints to the members in the set every 200 ms, and
  // at once when the set changes.
  void ReplayLoop() EXCLUDES(hints_mu_);
  // Members that have left the set (etcd) and may return, newest last.
  std::vector<std::string> Departed() const EXCLUDES(members_mu_);
  void Log(LogLevel level, const std::string& line) const;
  // transport_->BatchGet and BatchPut, counted in the peer tier's counters: per key a
  // hit and its bytes, a miss, or a failure by reason (a failed call: every key).
  Status RemoteGet(const Endpoint& peer, std::span<const Slice> keys,
                   std::span<const Destination> dests, std::vector<int64_t>* r);
  // RemoteGet's count of a get's answer (`s`, per key `r`) of n keys.
  void CountRemoteGet(const Status& s, size_t n, const std::vector<int64_t>& r);
  Status RemotePut(const Endpoint& peer, std::span<const Slice> keys,
                   std::span<const ValueParts> values, std::vector<int64_t>* r);
  // Counts one read of the peer tier that failed with `s` (not NotFound).
  void CountPeerFailure(const Status& s);
  // Counts one read that no peer served: a miss, absent, when `why` is OK (every peer
  // that was asked said it has no such key), else a failure for `why` (the first peer
  // that could not be asked or read).
  void CountNotRead(const Status& why);
  bool closed() const { return closed_.load(); }

  const Options options_;
  Logger* const logger_;
  std::string token_;                 // the credential presented to peers
  std::vector<TenantEntry> tenants_;  // of peer_auth_token_file; required when serving
  Endpoint listen_;
  std::string self_;  // listen_ as text; "" when not serving
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Transport> registry_transport_;  // SyncNamespaces' (tcp)
  std::unique_ptr<MembershipSource> membership_;
  std::unique_ptr<UcxServer> ucx_server_;  // serving over ucx: the arena mapped for clients
  std::unique_ptr<Service> service_;
  std::unique_ptr<TransportServer> server_;
  std::atomic<bool> closed_{false};

  // Records how a call to a member went (its state in StatsText): a failure other than
  // NotFound marks it failing until a call succeeds.
  void NoteCall(const std::string& member, const Status& s) EXCLUDES(health_mu_);

  mutable Mutex health_mu_;
  std::map<std::string, std::string> failing_ GUARDED_BY(health_mu_);  // member -> last error

  mutable Mutex members_mu_;
  std::shared_ptr<const std::vector<Endpoint>> peers_ GUARDED_BY(members_mu_) =
      std::make_shared<const std::vector<Endpoint>>();
  bool had_members_ GUARDED_BY(members_mu_) = false;  // SetMembers was called
  // Members seen to join (this host, at its start, among members already there), when.
  std::map<std::string, std::chrono::steady_clock::time_point> joined_ GUARDED_BY(members_mu_);
  // Members seen to leave, when (at most kMaxDeparted, the oldest forgotten).
  std::map<std::string, std::chrono::steady_clock::time_point> departed_ GUARDED_BY(members_mu_);

  mutable SharedMutex sync_mu_;  // held shared by each answer, so that uninstalling waits
  NamespaceSyncFn sync_fn_ GUARDED_BY(sync_mu_);

  mutable Mutex hints_mu_;
  std::map<std::string, Hint> hints_ GUARDED_BY(hints_mu_);  // member -> its missed deletes
  uint64_t hint_count_ GUARDED_BY(hints_mu_) = 0;            // sum of their sizes
  bool replay_wake_ GUARDED_BY(hints_mu_) = false;           // the set changed
  CondVar replay_cv_;
  std::atomic<size_t> hinted_members_{0};  // hints_.size(), read without the lock
  Mutex replay_mu_;  // one replay at a time, so a call waits for one in flight
  std::thread replayer_;
  mutable std::atomic<uint64_t> hints_recorded_{0}, hints_replayed_{0}, hints_dropped_{0},
      grace_hits_{0}, moved_{0};

  mutable std::atomic<uint64_t> remote_gets_{0}, remote_hits_{0}, remote_errors_{0},
      remote_puts_{0}, promotions_{0};
  TierCounters own_tier_;                 // counted when no engine's is given
  TierCounters* peer_tier_ = &own_tier_;  // the engine's (SetTierCounters)
};

}  // namespace kvengine

#endif  // KVENGINE_CLUSTER_PEER_ROUTER_H_
