// UCX: one-sided reads of a peer's arena through UCP (ucp_get_nbx), over whatever UCX
// finds -- shared memory (cma, posix, sysv) and TCP on a host without RDMA, RC/DC verbs
// on InfiniBand and RoCE -- with no change in this code.
//
// Set-up runs over the existing TCP control channel, after its authentication: the
// client sends its UCP worker address in a kUcxConnect request; the server (a tenant
// free to use every namespace only: one-sided reads reach the whole arena) makes an
// endpoint to it and answers with its own worker address, the arena's address and
// length, and the arena's packed remote key (UcxConnectAnswer).  A peer that has not
// proved its token never sees the worker address nor the rkey.  The endpoint and the
// client's record live as long as the control connection that carried the request:
// when it closes (the client exited, was killed, or dropped it) they are released and
// counted (kvengine.peers: ucx_clients, ucx_clients_released).
//
// Gets follow the read-validation protocol (read_validation.h): LOOKUP pins the values
// and grants leases, the bytes come by ucp_get_nbx straight into the caller's buffers
// (all of a batch's reads in flight at once), RELEASE tells whether each lease held.
// LOOKUP and RELEASE go as UCX active messages on the same endpoint (a few microseconds
// over shared memory, where the control connection's round trip costs a hundred or
// more), each carrying the client's token: a random 64-bit number the server handed to
// this client alone in its connect answer, so that an active message from anyone else
// is dropped (counted).  The server serves them as the control connection would, for
// as long as that connection lives.  Keys the owner holds only on SSD come by TCP GET.
// Puts are one-sided as well: RESERVE by active message (the owner reserves room with
// SharedArena::Reserve), the bytes by ucp_put_nbx into the owner's arena and a flush,
// then COMMIT (SharedArena::Commit of the client's own, unexpired reservations); see
// UcxReserved below.  Exists, deletes and properties are the TCP transport's.
// Memory the caller did not register goes through a registered bounce buffer, counted.
//
// Progress: a client progresses its worker from the calling threads (no thread of its
// own; threads take turns, and whoever progresses completes everyone's reads); a server
// has one thread, asleep on the worker's event descriptor when idle, that serves the
// reads transports without one-sided hardware emulate (UCX's TCP), for every client.
#ifndef KVENGINE_TRANSPORT_UCX_H_
#define KVENGINE_TRANSPORT_UCX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/env.h"
#include "kvengine/status.h"
#include "kvengine/slice.h"
#include "kvengine/transport.h"

namespace kvengine {

class SharedArena;

// The client's kUcxConnect request: its packed UCP worker address.
struct UcxConnectRequest {
  std::string worker_address;

  // DO NOT CHANGE: on the wire.  Version byte 1, then the address length-prefixed.
  void EncodeTo(std::string* dst) const;
  // Corruption when malformed, of another version, or the address is empty or over
  // kMaxBlob bytes.
  static Status DecodeFrom(std::string_view in, UcxConnectRequest* out);
};

// The server's answer: where its arena is and how to reach it.
struct UcxConnectAnswer {
  std::string worker_address;  // the server's packed UCP worker address
  uint64_t arena_addr = 0;     // the arena's address in the server's memory
  uint64_t arena_len = 0;
  std::string rkey;  // the arena's packed remote key (ucp_rkey_pack)
  // Names this client in its lease ops by active message (never 0); 0 in a version 1
  // answer, whose server takes them over the control connection only.
  uint64_t token = 0;
  // A lease's time to live on this server (0 in a version 1 answer): a client whose
  // reads of a batch all completed within half of it from sending the LOOKUP knows the
  // leases held without asking, and sends the RELEASE without waiting for its answer.
  uint64_t lease_ttl_ms = 0;
  // How long a reservation of a one-sided put lives uncommitted before the server takes
  // its room back (0: this server takes no one-sided puts; a version 1 or 2 answer).  A
  // client writes into a reservation only within half of it from sending the RESERVE.
  uint64_t put_ttl_ms = 0;

  // DO NOT CHANGE: on the wire.  Version byte 3 (2 without put_ttl_ms, 1 without the
  // token and lease ttl either), the address length-prefixed, fixed64 arena_addr,
  // fixed64 arena_len, the rkey length-prefixed, fixed64 token, fixed64 lease_ttl_ms,
  // fixed64 put_ttl_ms.
  void EncodeTo(std::string* dst) const;
  // Corruption when malformed, of another version, the address or rkey is empty or
  // over kMaxBlob bytes, the arena is empty or wraps around.
  static Status DecodeFrom(std::string_view in, UcxConnectAnswer* out);
  bool operator==(const UcxConnectAnswer& o) const;
};

// Active message ids of the lease ops.  DO NOT CHANGE: on the wire.
// kUcxAmRequest, client to server: the header is version byte 1, the op byte
// (wire::kLookup or wire::kRelease), fixed64 token (UcxConnectAnswer), fixed64 request id
// (kUcxAmRequestHeader bytes); the data is the op's meta as over the control connection.
// kUcxAmAnswer, server to client: the header is the fixed64 request id; the data is the
// answer's meta.  A request whose token names no connected client is dropped, counted.
// The put ops go the same way (op wire::kReserve, wire::kCommit; UcxReserveRequest...).
inline constexpr unsigned kUcxAmRequest = 1;
inline constexpr unsigned kUcxAmAnswer = 2;
inline constexpr size_t kUcxAmRequestHeader = 18;

// A one-sided put's two ops, by active message under the client's token (kUcxAmRequest).
// RESERVE: the server reserves room in its arena for each value (SharedArena::Reserve,
// as a put would: same errors) and answers where; the client writes the bytes there
// with ucp_put_nbx, flushes, and COMMITs: the server publishes each reservation that
// is still this client's (SharedArena::Commit, as a local put) or gives it back.
// DO NOT CHANGE: on the wire.
//   RESERVE meta: varint64 n, then n times: key length-prefixed, varint64 size.
//   RESERVE answer: batch status, then n times: fixed64 result (0 or an error code;
//     NotSupported: put this key over TCP), fixed64 reservation id, fixed64 offset of
//     the room in the arena.
//   COMMIT meta: varint64 n, then n times: fixed64 reservation id, byte 1 (publish) or
//     0 (give back).
//   COMMIT answer: batch status, then n times: fixed64 result (0 or an error code;
//     Aborted: the reservation was not this client's, or had expired).
struct UcxReserved {
  int64_t result = 0;
  uint64_t id = 0;
  uint64_t offset = 0;
};
void EncodeUcxReserveRequest(std::span<const Slice> keys, std::span<const uint64_t> sizes,
                             std::string* meta);
Status DecodeUcxReserveAnswer(std::string_view in, size_t n, std::vector<UcxReserved>* out);
void EncodeUcxCommitRequest(std::span<const uint64_t> ids, std::span<const uint8_t> publish,
                            std::string* meta);
Status DecodeUcxCommitAnswer(std::string_view in, size_t n, std::vector<int64_t>* results);

// Longest worker address or packed rkey accepted from a peer.
inline constexpr size_t kUcxMaxBlob = 64 << 10;

// What the UCX this process runs offers.
struct UcxInfo {
  std::string version;       // "1.13.1"
  bool cuda_memory = false;  // device buffers can be mapped and read into directly
};

// True when the build has UCX and a UCP context can be made here; otherwise false and
// *why says what is missing ("built without UCX: install libucx-dev", ...).  On success
// fills *info (when given) from ucp_context_query: memory types, version.
bool UcxAvailable(std::string* why, UcxInfo* info = nullptr);

// The UCX transport: TCP control channel, UCP one-sided gets.  NotSupported naming the
// package when the build has no UCX, or the reason when no UCP context can be made.
Status NewUcxTransport(const TransportOptions& options, std::unique_ptr<Transport>* result);

// The server's side: a UCP context and worker with their progress thread, the arena
// mapped with ucp_mem_map and its rkey packed once, an endpoint per connected client.
// Thread-safe.
class UcxServer {
 public:
  // `log` may be null.  NotSupported when the build has no UCX.
  static Status Create(std::function<void(LogLevel, const std::string&)> log,
                       std::unique_ptr<UcxServer>* result);
  // Stops the progress thread, closes every endpoint, unmaps every region.  Connections
  // holding a client's record must have dropped it (the TransportServer stopped).
  virtual ~UcxServer() = default;
  // Maps the regions a DB registers (the arena, named "arena", is the one clients read).
  virtual std::shared_ptr<MemoryRegistrar> registrar() = 0;
  // Takes clients' one-sided puts into `arena` (the local engine's, whose arena the
  // registrar mapped; it must outlive every client record).  Until it is called, and
  // for clients connected before, puts go by TCP.  The reservations' time to live is
  // KVENGINE_UCX_PUT_TTL_MS (default 10000).
  virtual void ServePuts(SharedArena* arena) = 0;
  // Answers a client's kUcxConnect: decodes its request, makes an endpoint to it, and
  // encodes the answer in *answer.  *client holds the client's record: dropping it
  // closes the endpoint (counted), and waits for a lease op being served for it.
  // `serve` answers the client's lease ops that come by active message (see
  // ServerOptions::ucx_connect).  NotSupported when no arena is mapped.
  using LeaseOpFn = std::function<bool(uint8_t op, std::string_view meta, std::string* answer)>;
  virtual Status Connect(std::string_view request, std::string* answer,
                         std::shared_ptr<void>* client, LeaseOpFn serve, uint64_t lease_ttl_ms) = 0;
  // "ucx_clients: N\nucx_clients_released: N\nucx_endpoint_errors: N\n
  // ucx_lease_ops: N\nucx_lease_ops_refused: N\nucx_arena_placed: 0|1\n", then the
  // one-sided puts: ucx_puts_served (values published), ucx_put_bytes_served,
  // ucx_reservations (held now), ucx_reservations_reclaimed (expired, or their client's
  // connection closed), ucx_commits_refused (a reservation not the client's, or expired).
  virtual std::string StatsText() const = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_UCX_H_
