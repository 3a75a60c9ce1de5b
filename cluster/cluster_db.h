// ClusterDB: a DB over the local DB that spreads keys across hosts.
//
// RocksDB's StackableDB shape: ClusterDB wraps the DB of this host (a DBImpl, which knows
// nothing of peers) and overrides the calls whose keys may live elsewhere; the rest
// (buffers, Flush, CompactBuckets, the local properties) go straight to the local DB.
// A call walks one way down: ClusterDB -> local DB -> tiers, or ClusterDB -> PeerRouter
// -> transport -> a peer's server -> that peer's local DB.  Never back up.
//
//   read_through  keys are stored locally; a local miss is asked of every peer, the
//                 first peer that has the key serves its bytes straight into the
//                 caller's buffers, and the value is offered back to the local DB as a
//                 cache fill (WriteOptions::fill_cache) when promote_from_peers.
//   sharded       each key has an owner among the members (rendezvous hashing,
//                 cluster/rendezvous.h); calls go to the owner, this host's keys to the
//                 local DB.  DeleteByRegex and DeleteAll act on every member.
//   replicated    sharded with a cluster or cluster_replicas > 1: R owners per key.
// See cluster/peer_router.h for the details of each mode and docs/cluster.md.
//
// An attached client's put (its arena slots, db/shared_arena.h) is a put of this layer
// too: ClusterDB is also the StackableArena over the engine's arena, and its Commit
// sends each key to its owners as BatchPut does -- a key this host owns is published in
// place (zero-copy), a key another member owns is sent from the slot the client filled,
// and the slot given back.  The owner's local server is handed ClusterDB's arena.
//
// Peers' requests are served by the local DB (PeerRouter's server), not by ClusterDB:
// a request that reaches this host is answered here and never forwarded.
//
// Thread-safety: as DB.
#ifndef KVENGINE_CLUSTER_CLUSTER_DB_H_
#define KVENGINE_CLUSTER_CLUSTER_DB_H_

#include <memory>
#include <string>

#include "cluster/peer_router.h"
#include "db/shared_arena.h"
#include "kvengine/db.h"
#include "kvengine/stackable_db.h"
#include "util/call_log.h"
#include "util/logging.h"

namespace kvengine {

class ClusterDB final : public StackableDB, public StackableArena {
 public:
  // Parses the peer options and creates the transports, before the local DB is opened:
  // the local DB's arena must be registered with them (Registrar).  Stores nullptr in
  // *result when `options` name no peers, no cluster and no listen address.
  static Status Create(const Options& options, std::unique_ptr<ClusterDB>* result);
  ~ClusterDB() override;

  // A registrar that registers memory with the transports, then with `next` (may be
  // null): the local DB's Options::memory_registrar.
  std::shared_ptr<MemoryRegistrar> Registrar(std::shared_ptr<MemoryRegistrar> next);

  // Takes the opened local DB and its engine's arena (`arena`, which outlives this
  // ClusterDB: the arena below this layer's); serves it to the peers when Options::listen is set
  // (`pin` pins a value of its memory tier, at `arena_base`, for one-sided reads; `served` counts
  // the GETs answered from such pins alone) and joins the membership.  Called once,
  // before any other call.
  // Reads of the peer tier are counted into `peer_tier` (the engine's, which outlives
  // this ClusterDB; db/tier_counters.h).
  Status Start(std::unique_ptr<DB> local, SharedArena* arena, PeerRouter::PinFn pin,
               PeerRouter::ServedFn served, const char* arena_base, TierCounters* peer_tier);

  // Leaves the cluster and stops serving peers (draining their requests), then closes
  // the local DB.
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
  // Sharded: the router's pipelined load (PeerRouter::BatchGetIntoGroups); otherwise
  // group by group through BatchGetInto (DB's default).
  Status BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                            std::vector<int64_t>* results) override;
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  // This host's tiers (the DB below); a key only a peer holds is kLocatedPeer.
  Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override;
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override;
  Status DeleteAll(uint64_t* deleted) override;

  // The arena's commit (SharedArena::Commit) as a BatchPut of the slots' bytes: each
  // key to its R owners, OK when the first owner that took it did; a key no owner took
  // fails with the first owner's error (IOError when it could not be reached; logged
  // naming it), never OK.  This host's share is published in place, after every other
  // owner has been answered (a published slot may be reused at once).  Keys the local
  // DB would refuse, and every key when this DB does not route, go to the engine's
  // arena as they are.  Reserve, ReserveSpare and PinInMemory are the engine's.
  void Commit(std::span<const Slice> keys, std::span<MemoryTier::Reservation* const> slots,
              std::vector<int64_t>* results) override;

  // The namespace registries of the members (namespaces/namespace_fleet.h), which the
  // layer above keeps in agreement: the other members now, a SYNC_NAMESPACES request to
  // one of them, and the answerer of theirs (an empty one uninstalls it, waiting for the
  // requests in flight).
  std::vector<std::string> MemberNames() const { return router_->MemberNames(); }
  Status SyncNamespaces(const std::string& member, const std::string& request,
                        std::string* answer) {
    return router_->SyncNamespaces(member, request, answer);
  }
  void ServeNamespaceSync(PeerRouter::NamespaceSyncFn fn) {
    router_->ServeNamespaceSync(std::move(fn));
  }

  // Buffers, Flush, CompactBuckets and ResetPerf are the local DB's (StackableDB's
  // forwarding).
  // "kvengine.peers" here (members, their health, the remote counters);
  // "kvengine.readiness" is the local DB's with the cluster membership's line added;
  // every other property is the local DB's.
  bool GetProperty(const std::string& name, std::string* value) override;

 private:
  explicit ClusterDB(const Options& options);

  // True when key goes through the router: a key the local DB would refuse stays local,
  // so that its error is the local DB's.
  bool Routable(const Slice& key) const;
  // Offers a value a peer served to the local DB as a cache fill (read-through
  // promotion: WriteOptions::fill_cache).
  PeerRouter::PromoteFn Promoter();
  // Asks the peers for the keys the local DB missed whose buffers are host memory.
  void ReadThroughHostMisses(std::span<const Slice> keys, std::span<const Destination> destinations,
                             std::vector<int64_t>* results);

  const Options options_;
  Logger logger_;
  ErrorCounters errors_;  // failed keys of routed calls, by kind
  std::unique_ptr<PeerRouter> router_;
  // The local DB is StackableDB's base_, set by Start.  ~ClusterDB closes (stopping the
  // router's server, which serves the local DB) before base_ is destroyed.
};

}  // namespace kvengine

#endif  // KVENGINE_CLUSTER_CLUSTER_DB_H_
