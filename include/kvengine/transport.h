// Transport: byte movement between kvengine hosts (TCP, or UCX: shared memory, TCP, RDMA).
//
// A Transport is the client side of the peer protocol: it reaches the kv_server (or any
// DB opened with Options::listen) at an Endpoint and runs batched requests against it.
// Values move straight between the peer and the caller's buffers: a get scatters the
// bytes into the caller's Destination buffers as they come off the wire (readv over TCP,
// one-sided reads of the peer's arena over UCX), a put gathers them from the
// caller's ValueParts (writev).  The wire format is described in docs/transport.md.
//
// Results follow db.h: every batch call returns a Status for the batch as a whole and,
// when it is OK, one result per key in *results (bytes for gets, 1/0 for exists, 0 for
// puts and deletes, else a negative error code of status.h).  A batch that could not
// reach the peer (refused, timed out, closed mid-transfer, failed checksum) returns
// IOError or Aborted naming the peer, and then *results holds that error for every key:
// a key never reports success unless its bytes arrived whole and verified.  Bytes of a
// failed key may have been written into its buffers and are unspecified.
//
// Thread-safety: every method may be called from any number of threads at once.  Calls
// to one peer share a small pool of connections; requests are pipelined on each
// connection (told apart by request id), so concurrent callers do not wait for each
// other's round trips.
#ifndef KVENGINE_TRANSPORT_H_
#define KVENGINE_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/env.h"
#include "kvengine/options.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine {

// A peer's address: "host:port" with an IPv4 address or a name ("localhost"), or
// "[v6addr]:port".
struct Endpoint {
  std::string host;
  uint16_t port = 0;

  // Parses "host:port".  InvalidArgument naming the text when it is malformed.
  static Status Parse(std::string_view text, Endpoint* out);
  // Parses a comma-separated list ("a:1,b:2"); empty items are ignored.
  static Status ParseList(std::string_view text, std::vector<Endpoint>* out);
  std::string ToString() const;
  // True when the host resolves, and every address it resolves to is loopback
  // (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104): "127.0.0.1", "::1" and, as /etc/hosts
  // usually has it, "localhost".  A name is looked up (getaddrinfo), never judged by
  // its text.
  bool IsLoopback() const;
  bool operator==(const Endpoint& o) const { return host == o.host && port == o.port; }
};

// Reads the credential a client presents from the token file at `path`
// (Options::peer_auth_token_file, kv_server --auth_token_file, kv_bench
// --auth_token_file; the format is in docs/transport.md, "Tenant tokens"): in the old
// form, the whole file, trailing newlines and spaces dropped, is the token (and *tenant,
// when given, is set to ""); in a file of tenants ("kvengine-tokens 1" first), the first
// tenant's token and name.  On failure (the file cannot be read, holds no token, or a
// line of tenants is malformed) returns InvalidArgument naming the file and the line,
// and leaves *token and *tenant unchanged.
Status ReadAuthTokenFile(const std::string& path, std::string* token,
                         std::string* tenant = nullptr);

struct TransportOptions {
  // The shared secret that proves this client may talk to peers that require one (see
  // docs/transport.md: a challenge-response over XXH3; it authenticates, it does not
  // encrypt).  Empty: no token is offered, and peers that require one refuse us.
  std::string auth_token;
  // The tenant `auth_token` is of (a token file of tenants), sent with the proof to
  // servers that read it, so that the server checks that tenant's token only.  Empty:
  // none sent (the old form), and such a server tries every tenant's token.
  // Default: ""
  std::string auth_tenant;

  // Longest a call waits for its peer (connect, send, answer) before it fails the
  // batch with IOError naming the peer.
  // Default: 5000
  uint64_t timeout_ms = 5000;

  // Connections kept open per peer; requests are pipelined on each of them.
  // Default: 4
  uint32_t connections_per_peer = 4;

  // After a failed connect, the peer is not tried again for this long, doubling per
  // failure up to reconnect_backoff_max_ms; calls meanwhile fail at once with IOError.
  // Default: 50 and 1000
  uint64_t reconnect_backoff_min_ms = 50;
  uint64_t reconnect_backoff_max_ms = 1000;

  // Hash value bodies on loopback connections too.  Off: where the server offers it, a
  // loopback connection leaves bodies out of the frame checksum (headers and metadata
  // stay checksummed): the bytes never leave this host's memory, as with a local get
  // (docs/transport.md, "Checksums on loopback").  Connections to other hosts always
  // hash bodies.
  // Default: false
  bool hash_loopback_bodies = false;

  // Where the transport writes its log lines (choices, reconnects).  Empty: stderr for
  // warnings and errors.
  std::function<void(LogLevel, const std::string&)> log;
};

// A BatchGet in flight (Transport::StartBatchGet).  Wait() returns once its answer is
// in -- the bytes in their destinations, the results stored -- with the status BatchGet
// would have returned; a failed call fails every key of it, and a destination of a key
// that failed holds unspecified bytes, as after BatchGet.  Destroying a call that was
// not waited for waits first: its destinations may be written until then.
// Thread-safety: one thread at a time (different calls may be waited on by different
// threads).
class PendingGet {
 public:
  PendingGet() = default;
  PendingGet(const PendingGet&) = delete;
  PendingGet& operator=(const PendingGet&) = delete;
  virtual ~PendingGet() = default;
  // True when Wait would return at once.  Never waits for an answer, but may take in
  // the answers that have arrived (TCP reads the frames already on the connection).
  virtual bool Ready() = 0;
  // Waits for the answer (at most the transport's timeout_ms after the start); a second
  // call returns the first's status.
  virtual Status Wait() = 0;
};

class Transport {
 public:
  // Creates a transport.  `kind` is "tcp", "ucx", "rdma" or "auto" (UCX when the build
  // has it, else TCP, with the choice logged).  "ucx" reads values one-sided through UCP
  // (shared memory, TCP or RDMA NICs, whatever UCX finds; transport/ucx.h); without UCX
  // in the build it fails with NotSupported naming the package (libucx-dev).  "rdma" is
  // UCX restricted to its RDMA transports (RC, DC, UD): without a usable device it fails
  // with NotSupported saying why.
  static Status Create(const std::string& kind, const TransportOptions& options,
                       std::unique_ptr<Transport>* result);

  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  // Closes every connection; calls in flight must have returned.
  virtual ~Transport() = default;

  // "tcp", "ucx" or "rdma".
  virtual const char* Name() const = 0;

  // Registers [addr, addr+length) for direct transfers (an RDMA memory region); TCP only
  // keeps the bookkeeping.  InvalidArgument when it overlaps a registered region.
  // The transport's MemoryRegistrar (below) calls these for a DB.
  virtual Status RegisterMemory(void* addr, size_t length, const char* what) = 0;
  virtual void UnregisterMemory(void* addr, size_t length) = 0;
  // A MemoryRegistrar that forwards to RegisterMemory/UnregisterMemory, to install as
  // Options::memory_registrar.  Valid while the transport lives.
  virtual std::shared_ptr<MemoryRegistrar> registrar() = 0;

  // Copies the value of keys[i] on `peer` into destinations[i] (filled in order).
  virtual Status BatchGet(const Endpoint& peer, std::span<const Slice> keys,
                          std::span<const Destination> destinations,
                          std::vector<int64_t>* results) = 0;
  // Starts BatchGet(peer, keys, destinations, results) and returns before its answer is
  // in, so a caller can have many reads in flight and take each answer as it lands (a
  // layer-wise load: DB::BatchGetIntoGroups).  `keys` may go once the call returns;
  // `destinations` and `results` must stay valid until the returned call's Wait returns
  // or it is destroyed.  Bad input is found as BatchGet finds it (the call is then Ready
  // with the error).  Default: runs BatchGet at once and returns a Ready call.  TCP
  // writes the request and returns: calls started one after another are pipelined over
  // the peer's connections (docs/transport.md, "Pipelined gets").
  virtual std::unique_ptr<PendingGet> StartBatchGet(const Endpoint& peer,
                                                    std::span<const Slice> keys,
                                                    std::span<const Destination> destinations,
                                                    std::vector<int64_t>* results);
  // One group of StartBatchGetGroups: its keys, where their values go, its results.
  struct GetGroup {
    std::span<const Slice> keys;
    std::span<const Destination> destinations;
    std::vector<int64_t>* results;
  };
  // Starts one BatchGet per group, as StartBatchGet would, and stores their calls in
  // *calls, in the groups' order: each is Ready as soon as its own group's answer is in,
  // whatever the other groups' (a layer-wise load's layers bound for one member).  Each
  // group's destinations and results must stay valid until its call's Wait returns.
  // Default: StartBatchGet of each group in turn.  TCP sends every group in one request
  // (GET_GROUPS) to a server that offers it, answered a frame per group, in order
  // (docs/transport.md, "Grouped gets").
  virtual void StartBatchGetGroups(const Endpoint& peer, std::span<const GetGroup> groups,
                                   std::vector<std::unique_ptr<PendingGet>>* calls);
  // As BatchGet, with each value received into (*values)[i], sized by the transport.
  virtual Status BatchGetOwned(const Endpoint& peer, std::span<const Slice> keys,
                               std::vector<std::string>* values, std::vector<int64_t>* results) = 0;
  virtual Status BatchPut(const Endpoint& peer, std::span<const Slice> keys,
                          std::span<const ValueParts> values, std::vector<int64_t>* results) = 0;
  virtual Status BatchExists(const Endpoint& peer, std::span<const Slice> keys,
                             std::vector<int64_t>* results) = 0;
  virtual Status BatchDelete(const Endpoint& peer, std::span<const Slice> keys,
                             std::vector<int64_t>* results) = 0;
  // Stores in (*results)[i] the size of keys[i]'s value on `peer` (DB::GetValueSize),
  // else a negative error (NotFound when the peer does not hold the key).
  virtual Status BatchValueSize(const Endpoint& peer, std::span<const Slice> keys,
                                std::vector<int64_t>* results) = 0;
  // Removes on `peer` every key that matches `pattern` (DB::DeleteByRegex), or every key
  // (DeleteAll), and stores the count in *deleted.  The peer acts on its own tiers only,
  // whatever its mode: it never passes the request on to its members.  On failure
  // *deleted is unchanged and the status names the peer: InvalidArgument for a malformed
  // pattern or one over 4096 bytes (nothing removed), IOError when the peer cannot be
  // reached or closed the connection (as a server built before these calls does).
  virtual Status DeleteByRegex(const Endpoint& peer, const std::string& pattern,
                               uint64_t* deleted) = 0;
  virtual Status DeleteAll(const Endpoint& peer, uint64_t* deleted) = 0;
  // Reads a property of the peer's DB (DB::GetProperty), e.g. "kvengine.stats".
  // NotFound when the peer does not know the property.
  virtual Status GetProperty(const Endpoint& peer, const std::string& name, std::string* value) = 0;
  // Sends the peer's namespace registry a request and stores its answer (both opaque
  // here: namespaces/namespace_fleet.h, docs/cluster.md "Namespaces across the cluster").
  // The peer's refusal is the status (PermissionDenied for a tenant bound to namespaces
  // that asks for a change); NotSupported when this transport cannot.
  virtual Status SyncNamespaces(const Endpoint& peer, const std::string& request,
                                std::string* answer) {
    (void)peer;
    (void)request;
    (void)answer;
    return Status::NotSupported("SyncNamespaces");
  }

  // This transport's own counters, one "name: value" line each (ucx: one-sided reads,
  // their bytes, reads into unmapped buffers, batches sent by TCP instead, endpoints
  // made); shown in the property "kvengine.peers".  Default: none.
  virtual std::string StatsText() const { return ""; }
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_H_
