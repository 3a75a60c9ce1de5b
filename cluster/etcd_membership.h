// The etcd membership source (Options::cluster = "etcd://HOST:PORT[,...]/PREFIX").
//
// A DB that serves peers registers PREFIX/members/<endpoint> = <endpoint> under a lease
// of Options::cluster_lease_ttl_ms, renewed by a background thread (every third of the
// TTL) and revoked by Stop, so that a member that leaves disappears at once and one
// that dies disappears when its lease expires.  Every DB of the cluster lists the
// members and then watches PREFIX/members/ from the revision it listed at, feeding each
// new set to the listener.
//
// etcd down or unreachable: the last member set stays in force; the failure is logged
// once (and the recovery once); calls are retried with a backoff of 100 ms doubling to
// 2 s.  The watch resumes from the revision after the last one it saw, so no event is
// missed; when etcd has compacted that revision away the source lists again.  A lease
// found expired (etcd was down longer than the TTL) is granted anew and the key put
// again.  A value that is not a "host:port" endpoint is ignored and logged.
#ifndef KVENGINE_CLUSTER_ETCD_MEMBERSHIP_H_
#define KVENGINE_CLUSTER_ETCD_MEMBERSHIP_H_

#include <functional>
#include <memory>
#include <string>

#include "cluster/membership.h"
#include "kvengine/options.h"

namespace kvengine {

using MembershipLog = std::function<void(LogLevel level, const std::string& line)>;

// InvalidArgument when `cluster` is not an etcd:// URL; NotSupported in a build
// without libcurl.  Contacts nothing until Start.
Status NewEtcdMembership(const std::string& cluster, uint64_t lease_ttl_ms, MembershipLog log,
                         std::unique_ptr<MembershipSource>* result);

}  // namespace kvengine

#endif  // KVENGINE_CLUSTER_ETCD_MEMBERSHIP_H_
