// Rendezvous (highest random weight) hashing: which members own a key.
//
// Every member scores every key, XXH3 over (key, 0, member endpoint); the highest scores
// own it.  Adding or removing a member moves only the keys it wins or won, and every
// host computes the same owners from the same member list, with nothing to coordinate.
#ifndef KVENGINE_CLUSTER_RENDEZVOUS_H_
#define KVENGINE_CLUSTER_RENDEZVOUS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvengine/slice.h"

namespace kvengine {

// key's score on `member` (an endpoint as text).
uint64_t RendezvousScore(const Slice& key, const std::string& member);

// The owners of key among `names`, best first: the top `r` by score (ties broken by the
// greater name), at most names.size().
std::vector<std::string> TopOwners(const Slice& key, const std::vector<std::string>& names,
                                   size_t r);

}  // namespace kvengine

#endif  // KVENGINE_CLUSTER_RENDEZVOUS_H_
