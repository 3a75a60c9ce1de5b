// TransportServer: serves a PeerService (a DB) to peers over TCP.
//
// One epoll thread accepts connections and watches them (EPOLLONESHOT); a pool of
// workers takes a readable connection, reads what it has without waiting for more
// (transport/frame_reader.h), answers every whole frame in it in order, and hands it
// back to the poller -- so a slow or stalled client never holds a worker, requests
// pipelined on one connection are answered in order, and different connections are
// served in parallel.  Answers are never waited on either: each is queued on its
// connection and written as far as the socket takes it, the rest when epoll reports
// the socket writable (EPOLLOUT), so a client that does not read its answers holds no
// thread.  Its queue is bounded: an answer that would take the bytes it has not read
// past max_queued_bytes closes the connection, counted (slow_readers_closed) and
// logged at most once per 10 s; so does taking nothing for io_timeout_ms.  Of each
// batch of readable connections the poller serves one itself when its request is a
// small GET of values all in the memory tier (no I/O, nothing to wait for): the common
// call is spared a hand-over to a worker and its wake-up, and the others go to the
// workers at once.  The poller closes a connection
// that has not authenticated within handshake_timeout_ms, or whose frame began and is
// not whole within io_timeout_ms.  Before authentication only a small AUTH frame is
// accepted.  A malformed frame (bad magic, checksum, limits, undecodable message)
// closes that connection only, logged.  A well-formed frame with an op this build does
// not know (a newer client) is answered with NotSupported and the connection kept.
// Past max_connections a new connection is refused at accept with a Busy verdict,
// counted (refused_over_budget) and logged at most once per 10 s.
// Stop() drains: it stops accepting, lets every request already received finish and be
// answered (queued answers written within io_timeout_ms), then closes the connections.
#ifndef KVENGINE_TRANSPORT_SERVER_H_
#define KVENGINE_TRANSPORT_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/options.h"
#include "kvengine/transport.h"
#include "transport/read_validation.h"
#include "transport/tenant_tokens.h"

namespace kvengine {

// A value pinned in the memory tier: its bytes stay unchanged while `pin` lives.
struct PinnedValue {
  const char* data = nullptr;
  uint64_t size = 0;
  uint64_t version = 0;
  std::shared_ptr<void> pin;
};

// What a server serves.  Implemented over a DB by the peer Env.  Thread-safe.
class PeerService {
 public:
  virtual ~PeerService() = default;
  // Pins key's value when the memory tier holds it; false otherwise.
  virtual bool Pin(const Slice& key, PinnedValue* out) = 0;
  // Pin without waiting for any lock (false also when the value's is busy): for the
  // server's poller, which must never wait.
  virtual bool TryPin(const Slice& key, PinnedValue* out) = 0;
  // The poller answered a GET from TryPin's pins alone: `values` distinct values of
  // `bytes` bytes, to be counted as reads served.  TryPin counts nothing itself, since
  // the poller gives its pins up when a key is missing and a worker pins them again
  // with Pin.  Default: not counted.
  virtual void ServedFromMemory(uint64_t /*values*/, uint64_t /*bytes*/) {}
  // The start of the memory tier's arena (locations are offsets from it); may be null.
  virtual const char* ArenaBase() const = 0;
  virtual Status GetValueSize(const Slice& key, uint64_t* size) = 0;
  virtual Status BatchGetInto(std::span<const Slice> keys, std::span<const Destination> dests,
                              std::vector<int64_t>* results) = 0;
  virtual Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                          std::vector<int64_t>* results) = 0;
  virtual Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) = 0;
  virtual Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) = 0;
  // DB::DeleteByRegex and DB::DeleteAll over the local tiers only.
  virtual Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) = 0;
  virtual Status DeleteAll(uint64_t* deleted) = 0;
  virtual bool GetProperty(const std::string& name, std::string* value) = 0;
  // Answers a SYNC_NAMESPACES request of a client that proved `tenant` (null: the server
  // takes no token, or its old form's) into *answer.  Default: NotSupported.
  virtual Status SyncNamespaces(const Tenant* tenant, std::string_view request,
                                std::string* answer) {
    (void)tenant;
    (void)request;
    (void)answer;
    return Status::NotSupported("this server keeps no namespace registry");
  }
};

struct ServerOptions {
  // Required of every client when non-empty (see wire::AuthProof); who proves it may use
  // every namespace.  Ignored when `tenants` is not empty.
  std::string auth_token;
  // The tenants of a token file (transport/tenant_tokens.h): every client must prove one
  // tenant's token, and each request of its connection may name only keys of that
  // tenant's namespaces; others are refused with PermissionDenied naming the namespace,
  // counted (permission_denied, per tenant) and logged at most once per 10 s.
  std::vector<TenantEntry> tenants;
  // Longest the server waits for the rest of a frame it began to receive, or for a
  // client to take any more bytes of its answers.
  uint64_t io_timeout_ms = 10000;
  // Bytes of answers one connection may have waiting for its client to read them; an
  // answer that would take it past this closes the connection.  The first answer
  // waiting is never refused, whatever its size (up to the frame limit).
  uint64_t max_queued_bytes = 256ull << 20;
  // Longest a client may take from connecting to authenticating.
  uint64_t handshake_timeout_ms = 5000;
  // Connections one client IP may hold; further ones are closed at accept.
  uint64_t max_connections_per_address = 128;
  // Connections all clients together may hold (the server's share of the descriptor
  // budget, env/descriptor_budget.h); 0: no cap.  A connection past it is sent the
  // challenge and then a Busy verdict naming the cap, and closed at once: its client's
  // handshake fails with that Busy.
  uint64_t max_connections = 0;
  // Idle put-body memory kept for reuse, across all connections.
  uint64_t kept_body_bytes = 64ull << 20;
  // Worker threads.
  int workers = 8;
  // Hash value bodies on loopback connections too.  Off: a client on a loopback
  // connection may leave its frames' bodies out of their checksums, and is answered the
  // same way (docs/transport.md, "Checksums on loopback").
  bool hash_loopback_bodies = false;
  // Time to live of a one-sided read lease (read_validation.h).
  uint64_t lease_ttl_ms = 2000;
  std::function<void(LogLevel, const std::string&)> log;
  // Answers kUcxConnect (transport/ucx.h), for connections whose tenant may read every
  // namespace: given the client's request, stores the encoded answer and the client's
  // record, which the connection keeps until it closes (then the record's release
  // closes the client's endpoint).  `serve` answers the client's lease ops (kLookup,
  // kRelease) that come by UCX active messages instead of this connection: it returns
  // false when one is undecodable, and may be called until the record is released.
  // `lease_ttl_ms` is lease_ttl_ms above, for the client (see UcxConnectAnswer).  A
  // server with ucx_connect set waits, as it stops, for the leases still held to lapse
  // (at most lease_ttl_ms): a UCX client may trust a lease by its age alone.
  // Null: NotSupported.
  using LeaseOpFn = std::function<bool(uint8_t op, std::string_view meta, std::string* answer)>;
  std::function<Status(std::string_view request, std::string* answer, std::shared_ptr<void>* client,
                       LeaseOpFn serve, uint64_t lease_ttl_ms)>
      ucx_connect;
};

class TransportServer {
 public:
  // Listens on `at` (port 0: any free port) and serves `service`, which must outlive
  // the server.
  static Status Start(const Endpoint& at, const ServerOptions& options, PeerService* service,
                      std::unique_ptr<TransportServer>* result);
  virtual ~TransportServer() = default;
  // Stops accepting, drains requests in flight, closes every connection.  Idempotent.
  virtual void Stop() = 0;
  virtual uint16_t port() const = 0;
  // Counters for stats and tests.
  virtual uint64_t requests() const = 0;
  // Leases of one-sided reads granted and neither released nor lapsed yet.
  virtual uint64_t leases_held() = 0;
  virtual uint64_t rejected_frames() const = 0;
  virtual uint64_t refused_auth() const = 0;
  // Connections closed for not reading their answers (max_queued_bytes, io_timeout_ms).
  virtual uint64_t slow_readers_closed() const = 0;
  // Connections refused for max_connections (the descriptor budget).
  virtual uint64_t refused_over_budget() const = 0;
  // Requests refused for naming a namespace their connection's tenant is not bound to
  // (or a property such a tenant may not read), in all and per tenant name (in the
  // order of the token file; "" for a token of the old form).
  virtual uint64_t permission_denied() const = 0;
  virtual std::vector<std::pair<std::string, uint64_t>> permission_denied_by_tenant() const = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_SERVER_H_
