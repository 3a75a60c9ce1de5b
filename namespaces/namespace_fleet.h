// NamespaceFleet: keeps the namespace registries of a cluster's members in agreement
// (docs/cluster.md, "Namespaces across the cluster").
//
// Every member -- and every cluster client -- keeps its own registry file
// (namespaces/namespace_registry.h).  A change made through any of them (a create, the
// start of a drop, its end) is stamped (NamespaceRecord::stamp: the wall clock, kept
// above every stamp seen) and forwarded to every member at once (a push); and every DB
// asks each member for its registry every kPullIntervalMs (a pull, one round trip that
// carries only a digest while the two agree), merging what it gets record by record:
// the later stamp wins (Supersedes), and a finished drop leaves a tombstone, which wins
// over the live record of a member that missed the drop.  So a member that was down
// during a change learns it on its first pull once it is back, from any member that saw
// it, whether or not the DB that made the change is still there.
//
// The registry is forwarded rather than kept under the cluster's etcd prefix because a
// cluster of static peers has no etcd, and because each member must keep a registry of
// its own anyway: it opens, serves and enforces its namespaces' quotas while etcd is
// unreachable, as it keeps serving keys then.
//
// The wire form of a request and its answer (carried whole by the peer protocol's
// SYNC_NAMESPACES, docs/transport.md) is this file's:
//   request  u8 kind (0 pull, 1 push), fixed64 the digest of the sender's registry,
//            then for a push the sender's registry (the file's encoding)
//   answer   u8 bits (1: a registry follows; 2: the sender may create and drop
//            namespaces), then the server's registry when it differs from the digest
// A server shows a tenant bound to namespaces only those (its pull's answer), and
// refuses its pushes (PermissionDenied).
//
// Thread-safety: every call from any thread.  The calls to members are made outside
// every lock of the Registry, so two DBs pushing to each other never wait on each other.
#ifndef KVENGINE_NAMESPACES_NAMESPACE_FLEET_H_
#define KVENGINE_NAMESPACES_NAMESPACE_FLEET_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvengine/status.h"
#include "namespaces/namespace_registry.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace kvengine {

// Answers a SYNC_NAMESPACES request: `may_change`, whether its sender may create and
// drop namespaces; `visible`, the namespaces (by id) the sender may see.
using NamespaceSyncFn =
    std::function<Status(bool may_change, const std::function<bool(uint64_t id)>& visible,
                         std::string_view request, std::string* answer)>;

// The members of the cluster, as the DB below the namespace layer reaches them (ClusterDB).
struct NamespacePeers {
  // The other members now, by endpoint ("host:port").
  std::function<std::vector<std::string>()> members;
  // Sends `request` to one member's SYNC_NAMESPACES and stores its answer.
  std::function<Status(const std::string& member, const std::string& request, std::string* answer)>
      call;
  // Installs the answerer of the members' requests (a DB that serves peers); an empty
  // function uninstalls it, after the calls in flight have returned.
  std::function<void(NamespaceSyncFn serve)> serve;
};

class NamespaceFleet {
 public:
  // What the fleet keeps in agreement: NamespaceDB's registry.
  class Registry {
   public:
    virtual ~Registry() = default;
    // Every record, tombstones included.
    virtual NamespaceRecords Snapshot() = 0;
    // Takes every record of `remote` that supersedes this registry's (applying what it
    // means here: a drop removes the namespace's keys from this host's tiers).  `from`
    // names the member, for the log.
    virtual Status Merge(const NamespaceRecords& remote, const std::string& from) = 0;
  };

  static constexpr uint64_t kPullIntervalMs = 1000;

  // `registry` outlives the fleet.  Installs the answerer of the members' requests.
  NamespaceFleet(NamespacePeers peers, Registry* registry, Logger* log);
  // Stops (Stop).
  ~NamespaceFleet();

  // Starts the thread that pulls from every member every kPullIntervalMs.
  void Start();
  // Uninstalls the answerer (waiting for the requests in flight) and stops the thread.
  // Idempotent.
  void Stop();

  // Pulls every member's registry at once and merges it.  PermissionDenied when a
  // member says this DB's credential may not create or drop namespaces; otherwise OK
  // (a member that cannot be reached is skipped: it catches up by its own pulls).
  Status PullAll();
  // Sends this DB's registry to every member at once, after a change.  A member that
  // cannot be reached is logged and skipped (it catches up when it is back); OK unless
  // a member refused.
  Status PushAll();

  // Answers a member's request (NamespaceSyncFn).
  Status Serve(bool may_change, const std::function<bool(uint64_t id)>& visible,
               std::string_view request, std::string* answer);

 private:
  // One pull from `member`: merges its registry when it differs, and pushes this one
  // back when, after the merge, the two still differ and the member lets this DB change
  // its registry (`push_back`).  *may_change: what the member said of this DB's rights.
  Status PullFrom(const std::string& member, bool push_back, bool* may_change);
  Status PushTo(const std::string& member, const std::string& registry);
  // Runs fn(member) for every member at once; the first error that is not IOError, else OK.
  Status ForEachMember(const std::function<Status(const std::string&)>& fn);
  void Loop() EXCLUDES(mu_);
  void Log(LogLevel level, const std::string& line);

  const NamespacePeers peers_;
  Registry* const registry_;
  Logger* const log_;
  Mutex mu_;
  CondVar wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::thread puller_;
};

}  // namespace kvengine

#endif  // KVENGINE_NAMESPACES_NAMESPACE_FLEET_H_
