// MembershipSource: where a PeerRouter learns the live members of its cluster.
//
// A source hands its listener a whole member set each time the set changes (a
// snapshot, not a diff); the PeerRouter swaps it in under a lock.  Two sources exist:
//
//   static  Options::peers, parsed once; the listener is called once, from Start.
//   etcd    Options::cluster (cluster/etcd_membership.h): members register under a prefix
//           with a lease and every DB watches the prefix.
//
// The set may name this host (`self`); the PeerRouter knows itself and drops it.
//
// Thread-safety: Start and Stop are called by one thread; StatsText from any.
#ifndef KVENGINE_CLUSTER_MEMBERSHIP_H_
#define KVENGINE_CLUSTER_MEMBERSHIP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/status.h"
#include "kvengine/transport.h"

namespace kvengine {

class MembershipSource {
 public:
  // Receives the live member set; called from Start or from the source's own thread,
  // never from two threads at once.
  using Listener = std::function<void(std::vector<Endpoint> members)>;

  virtual ~MembershipSource() = default;

  // Begins feeding `listener`.  `self` is this host's endpoint as peers reach it, or ""
  // for a DB that does not serve: a source that registers members registers `self`.
  // A source that can learn the set quickly calls the listener before returning.
  virtual Status Start(const std::string& self, Listener listener) = 0;

  // Leaves the cluster (a registered member is removed at once) and stops calling the
  // listener.  Idempotent; also run by the destructor of every source.
  virtual void Stop() = 0;

  // The source's state as "name: value" lines, for the kvengine.peers property.
  virtual std::string StatsText() const = 0;

  // "cluster_member: ok" when this host is a member as far as the source can tell (a
  // static list always; etcd once this host's key is registered under a live lease, or
  // always for a DB that does not serve), else "cluster_member: not ready: why".  One
  // line, for the "kvengine.readiness" property.
  virtual std::string Readiness() const { return "cluster_member: ok\n"; }
};

// The static list of Options::peers ("host:port,host:port").  InvalidArgument when the
// list does not parse.
Status NewStaticMembership(const std::string& peers, std::unique_ptr<MembershipSource>* result);

}  // namespace kvengine

#endif  // KVENGINE_CLUSTER_MEMBERSHIP_H_
