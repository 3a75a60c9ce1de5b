// The control-channel half of a one-sided read (read_validation.h): LOOKUP and RELEASE
// sent over a TcpTransport's authenticated connections, and the GET of the keys the
// owner holds only on SSD.  Shared by the transports that read values one-sided (UCX,
// verbs), which differ only in how the bytes move.
//
// Thread-safety: as TcpTransport::Call (any thread).
#ifndef KVENGINE_TRANSPORT_LEASE_CALLS_H_
#define KVENGINE_TRANSPORT_LEASE_CALLS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "kvengine/transport.h"
#include "transport/read_validation.h"

namespace kvengine {

class TcpTransport;

// LOOKUP(keys) on `peer`: one result per key (kLookupPinned, kLookupNotPinned or a
// negative code) and the pinned keys' locations.  Corruption when the answer is
// malformed or names bytes outside [0, arena_len) -- a location is trusted no further
// than the arena the peer announced.
Status CallLookup(TcpTransport* t, const Endpoint& peer, std::span<const Slice> keys,
                  uint64_t arena_len, std::vector<int64_t>* results,
                  std::vector<RemoteLocation>* locations);

// The halves of LOOKUP and RELEASE that do not depend on the channel (the control
// connection above, or UCX active messages): the request's meta and the answer's
// decoding, with the checks CallLookup and CallRelease describe.
void EncodeLookupRequest(std::span<const Slice> keys, std::string* meta);
Status DecodeLookupAnswer(std::string_view in, size_t keys, uint64_t arena_len,
                          std::vector<int64_t>* results, std::vector<RemoteLocation>* locations);
void EncodeReleaseRequest(std::span<const uint64_t> leases, std::string* meta);
Status DecodeReleaseAnswer(std::string_view in, size_t leases, std::vector<uint8_t>* held);

// RELEASE(leases) on `peer`: (*held)[i] is 1 when leases[i] was still held.
Status CallRelease(TcpTransport* t, const Endpoint& peer, std::span<const uint64_t> leases,
                   std::vector<uint8_t>* held);

// Reads over TCP GET the keys whose (*results)[i] is kLookupNotPinned (present on the
// peer, not in its memory tier) and stores their results in place.  Other keys are
// left as they are.
void GetUnpinnedOverTcp(TcpTransport* t, const Endpoint& peer, std::span<const Slice> keys,
                        std::span<const Destination> dests, std::vector<int64_t>* results);

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_LEASE_CALLS_H_
