// NamespaceDB: the layer that gives a DB its namespaces (include/kvengine/db.h,
// "namespaces").
//
// It sits over the engine (DBImpl) or the cluster router (ClusterDB), below OwnerDB and
// MetricsDB, and does three jobs:
//   * keeps the registry of namespaces (namespaces/namespace_registry.h), loaded at Open
//     (a damaged registry fails it) and rewritten atomically at each change -- in a
//     cluster, in agreement with every member's (namespaces/namespace_fleet.h): a change
//     is forwarded to every member, and the members' changes merged in;
//   * hands out handles (NamespaceView), which map their keys into their namespace and
//     call the DB below directly;
//   * is the default namespace: its own calls refuse namespaced keys (0xFE first) and
//     never touch them -- DeleteAll and DeleteByRegex match only the default namespace's
//     keys, ReadRemovals reports only its events, numbered among its own.
// Why a view and not a handle argument on every call (RocksDB's ColumnFamilyHandle*):
// docs/design.md, "Namespaces".
//
// Thread-safety: every call from any thread.  admin_mu_ serialises the changes of the
// registry (held through a drop's deletion, never while calling a member); mu_ guards
// the registry in memory.
#ifndef KVENGINE_NAMESPACES_NAMESPACE_DB_H_
#define KVENGINE_NAMESPACES_NAMESPACE_DB_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "db/namespace_usage.h"
#include "kvengine/env.h"
#include "kvengine/options.h"
#include "kvengine/stackable_db.h"
#include "namespaces/namespace_fleet.h"
#include "namespaces/namespace_keys.h"
#include "namespaces/namespace_registry.h"
#include "namespaces/namespace_view.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace kvengine {

class NamespaceDB : public StackableDB, private NamespaceFleet::Registry {
 public:
  // Loads the registry of the DB directory `path` and puts a NamespaceDB over *top.
  // `foreign_keys`: whether namespaced keys may reach the DB below from elsewhere (peers
  // of a cluster), so that DeleteAll of the default namespace must always spare them.
  // `usage`: the engine's accounting of the namespaces (db/namespace_usage.h), told each
  // registered namespace's name, quotas and weight, which the tiers then enforce; not
  // owned, outlives the NamespaceDB; null when there is no local engine to tell.
  // `removals`: the engine's removal feed, read per namespace (db/removal_feed.h); not
  // owned, outlives the NamespaceDB.
  // `local`: this host's tiers alone (the engine; *top itself when it does not route),
  // where a drop learnt from a member removes the namespace's keys; not owned, outlives
  // the NamespaceDB.  `peers`: the members of the cluster *top routes over, whose
  // registries this one is kept in agreement with; null for a DB of no cluster.  `log`
  // (may be null, outlives the NamespaceDB): where the changes learnt from members are
  // logged.
  // On failure returns the registry's error and leaves *top as it was.
  static Status Wrap(const Options& options, const std::string& path, bool foreign_keys,
                     NamespaceUsage* usage, NamespaceRemovals* removals, DB* local,
                     const NamespacePeers* peers, Logger* log, std::unique_ptr<DB>* top);
  ~NamespaceDB() override;

  // Stops agreeing with the members, detaches every namespace's handles (their calls
  // then fail Aborted), then closes the DB below.
  Status Close() override;

  // ---- the default namespace: keys checked, namespaced ones refused or spared
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
  Status BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                            std::vector<int64_t>* results) override;
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override;
  Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override;
  Status DeleteAll(uint64_t* deleted) override;
  Status ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) override;
  // The default namespace's keys only; removal_sequence in its own numbering.
  Status ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                      ResidentSnapshot* snapshot) override;

  // ---- namespaces.  In a cluster, CreateNamespace and DropNamespace first ask every
  // member for its registry (PermissionDenied, changing nothing, when a member says this
  // DB's token may not change it), and forward the change to every member; OpenNamespace
  // and ListNamespaces ask them first too (docs/cluster.md).
  Status CreateNamespace(const std::string& name, const NamespaceOptions& options,
                         std::unique_ptr<DB>* handle) override;
  Status OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) override;
  Status DropNamespace(const std::string& name, uint64_t* deleted) override;
  Status ListNamespaces(std::vector<NamespaceInfo>* namespaces) override;

 private:
  NamespaceDB(std::unique_ptr<DB> base, Env* env, std::string dir, uint64_t max_key_size,
              bool foreign_keys, NamespaceUsage* usage, NamespaceRemovals* removals, DB* local,
              Logger* log, NamespaceRecords records);
  // Tells the engine the limits of `record`.
  void SetLimits(const NamespaceInfo& record);

  // Marks the DB closed and detaches every namespace's handles.
  void DetachAll() EXCLUDES(mu_);
  // Detaches the handles of `name` (their calls then fail Aborted with `why`), waiting
  // for their calls in flight.
  void DetachHandles(const std::string& name, const std::string& why) EXCLUDES(mu_);
  // The registry's record of `name` (a namespace, live or being dropped), or null.
  const NamespaceRecord* Find(const std::string& name) const REQUIRES(mu_);
  // The registry's record of `name`, a tombstone included, or null.
  const NamespaceRecord* FindAny(const std::string& name) const REQUIRES(mu_);
  // A stamp later than the wall clock's now and every stamp the registry holds.
  uint64_t NextStamp() const REQUIRES(mu_);
  // Writes the registry with `record` in place of its name's, and makes it the registry
  // in memory (tombstones past kMaxNamespaceTombstones forgotten, oldest first).
  Status Replace(const NamespaceRecord& record) REQUIRES(mu_);
  // Writes `records` and makes them the registry in memory.
  Status Commit(NamespaceRecords records) REQUIRES(mu_);
  // A handle of the registered namespace `record`.
  std::unique_ptr<DB> NewHandle(const NamespaceInfo& record) REQUIRES(mu_);
  // Marks `name` dropping in the registry (stamped anew).
  Status MarkDropping(const std::string& name, uint64_t* id) EXCLUDES(mu_);
  // Replaces `name`'s record by a tombstone.
  Status Unregister(const std::string& name) EXCLUDES(mu_);
  // CreateNamespace's change of the registry, and DropNamespace's removal.
  Status CreateHere(const std::string& name, const NamespaceOptions& options,
                    std::unique_ptr<DB>* handle) EXCLUDES(mu_, admin_mu_);
  Status DropHere(const std::string& name, uint64_t* deleted) EXCLUDES(mu_, admin_mu_);
  // The namespaces in the registry (tombstones left out).
  std::vector<NamespaceInfo> Registered() const REQUIRES(mu_);
  // Asks every member for its registry first (when in a cluster).
  Status PullFromFleet();
  // Forwards a change to every member (when in a cluster); `what` names it in the log.
  Status PushToFleet();

  // NamespaceFleet::Registry.
  NamespaceRecords Snapshot() override EXCLUDES(mu_);
  Status Merge(const NamespaceRecords& remote, const std::string& from) override
      EXCLUDES(mu_, admin_mu_);
  // Removes every key of namespace `id` from this host's tiers, durably.
  Status RemoveLocalKeys(uint64_t id);

  Env* const env_;
  const std::string dir_;
  const uint64_t max_key_size_;
  const bool foreign_keys_;
  NamespaceUsage* const usage_;  // may be null
  NamespaceRemovals* const removals_;
  DB* const local_;
  Logger* const log_;  // may be null
  const NamespaceKeys default_keys_;
  // The registries of the cluster's members, kept in agreement; null outside a cluster.
  std::unique_ptr<NamespaceFleet> fleet_;

  Mutex admin_mu_ ACQUIRED_BEFORE(mu_);
  Mutex mu_;
  NamespaceRecords records_ GUARDED_BY(mu_);
  // The shared state of each namespace a handle was made for.
  std::map<std::string, std::shared_ptr<NamespaceState>> states_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;

  // DeleteAll of the default namespace may clear everything below while no namespace can
  // hold keys there: no namespace registered yet and none from peers.  The first
  // CreateNamespace turns that off for good, after the DeleteAlls in flight (which hold
  // this shared) end.
  SharedMutex delete_all_mu_;
  bool namespaced_keys_possible_ GUARDED_BY(delete_all_mu_);
};

}  // namespace kvengine

#endif  // KVENGINE_NAMESPACES_NAMESPACE_DB_H_
