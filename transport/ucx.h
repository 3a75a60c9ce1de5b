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
// client's record live as long as the control connection that carried the request (the
// client's own, kept idle beside its endpoint): when it closes (the client exited, was
// killed, or dropped it) they are released and counted (kvengine.peers: ucx_clients,
// ucx_clients_released).  The same connection closing tells the client its owner died,
// which UCX over shared memory cannot (docs/transport.md, "Failures").
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
// Over a transport without one-sided hardware (UCX's TCP) reads are not one-sided: the
// owner sends each value's bytes by active message (kUcxAmRead), from a worker without
// one-sided operations at all, since UCX 1.13's emulation of them aborts the owner when
// a client dies mid-read (docs/transport.md).  The connect answer says which.  Such a
// client's puts are not one-sided either (UCX emulates ucp_put_nbx there the same way):
// they go by TCP PUT.  An expired reservation's room stays with its client until its
// connection closes, so that a late put can never land in room reused for another value.
//
// Progress: a client progresses its worker from the calling threads (no thread of its
// own; threads take turns, and whoever progresses completes everyone's reads); a server
// has one thread, asleep on its workers' event descriptors when idle, that serves lease
// ops and reads by active message (and what UCX emulates over shared memory), for every
// client.  Each client read one-sidedly has a worker of its own on the server, so that
// one dying mid-message over shared memory wedges no other client (docs/transport.md).
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
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "kvengine/transport.h"

namespace kvengine {

class SharedArena;

// The client's kUcxConnect request: its packed UCP worker address.
struct UcxConnectRequest {
  std::string worker_address;
  // The client reads by the owner's active messages (kUcxAmRead) where the owner asks it
  // to (UcxConnectAnswer::reads_by_am); false from an older client, which the owner then
  // serves only where reads are one-sided.
  bool reads_by_am = true;

  // DO NOT CHANGE: on the wire.  Version byte 2 (1 from an older client, without the
  // flags), the address length-prefixed, a flags byte: bit 0 reads_by_am.
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
  // its room back (0: this server takes no one-sided puts from this client, which puts
  // by TCP; always 0 in a version 1 or 2 answer, and with reads_by_am).  A client writes
  // into a reservation only within half of it from sending the RESERVE.
  uint64_t put_ttl_ms = 0;
  // The owner serves this client's reads with its own active messages (kUcxAmRead),
  // not one-sided: they reach it over a transport without one-sided hardware (UCX's
  // TCP), whose emulation of one-sided operations UCX 1.13 cannot survive a client
  // dying in (docs/transport.md).  Then rkey is empty and put_ttl_ms 0 (one-sided puts
  // over that emulation have the same hazard).  Only for a client that said it can.
  bool reads_by_am = false;

  // DO NOT CHANGE: on the wire.  Version byte 3 (2 without put_ttl_ms and the flags, 1
  // without the token and lease ttl either), the address length-prefixed, fixed64
  // arena_addr, fixed64 arena_len, the rkey length-prefixed, fixed64 token, fixed64
  // lease_ttl_ms, fixed64 put_ttl_ms, a flags byte: bit 0 reads_by_am (other bits 0).
  void EncodeTo(std::string* dst) const;
  // Corruption when malformed, of another version, the address is empty or over
  // kMaxBlob bytes, the rkey is (unless reads_by_am: empty) or over kMaxBlob bytes, the
  // arena is empty or wraps around.
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
// Reads by active message (UcxConnectAnswer::reads_by_am).  DO NOT CHANGE: on the wire.
// kUcxAmRead, client to server: the header is kUcxAmRequest's (op byte 0); the data is
// each read's fixed64 offset in the arena and fixed64 length, at most kUcxMaxAmReads.
// kUcxAmReadData, server to client, one per read: the header is the fixed64 request id,
// the fixed32 index of the read in its request and a status byte (0: the data are the
// read's bytes; 1: refused, out of the arena, no data) (kUcxAmReadDataHeader bytes).
inline constexpr unsigned kUcxAmRead = 3;
inline constexpr unsigned kUcxAmReadData = 4;
inline constexpr size_t kUcxAmReadDataHeader = 13;
inline constexpr size_t kUcxMaxAmReads = 1 << 16;

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
  std::string version;  // "1.13.1"
  // Device buffers can be mapped and read into directly: UCX was built with CUDA
  // (ucp_context_query lists UCS_MEMORY_TYPE_CUDA).  Debian's UCX is not: there device
  // bytes go through the GPU staging path (docs/gpu.md).
  bool cuda_memory = false;
};

// Whether ucp_context_attr_t::memory_types `memory_types` (a bit per ucs_memory_type_t)
// has CUDA device memory.  False in a build without UCX.
bool UcxCudaMemory(uint64_t memory_types);

// True when the build has UCX and a UCP context can be made here; otherwise false and
// *why says what is missing ("built without UCX: install libucx-dev", ...).  On success
// fills *info (when given) from ucp_context_query: memory types, version.
bool UcxAvailable(std::string* why, UcxInfo* info = nullptr);

// The UCX transport: TCP control channel, UCP one-sided gets.  NotSupported naming the
// package when the build has no UCX, or the reason when no UCP context can be made.
// `tls`: the UCX transports it may use (UCX_TLS's syntax; empty: UCX_TLS's, or all).
Status NewUcxTransport(const TransportOptions& options, std::unique_ptr<Transport>* result,
                       const std::string& tls = "");

// What `peer_transport=rdma` is: UCX restricted to its RDMA transports (RC, DC and UD
// over verbs, InfiniBand and RoCE), which replaced kvengine's own verbs code.
inline constexpr const char* kUcxRdmaTransports = "rc,dc,ud";

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
  // ucx_lease_ops: N\nucx_lease_ops_refused: N\nucx_arena_placed: 0|1\n
  // ucx_clients_by_am: N\nucx_am_reads: N\nucx_am_read_bytes: N\nucx_am_reads_refused: N\n"
  // (ucx_clients_by_am: those of ucx_clients whose reads are served by active message),
  // then the one-sided puts: ucx_puts_served (values published), ucx_put_bytes_served,
  // ucx_reservations (held now), ucx_reservations_quarantined (expired uncommitted, their
  // room kept from reuse until their client's connection closes: its late put may still
  // land), ucx_reservations_reclaimed (room given back: their client's connection
  // closed), ucx_commits_refused (a reservation not the client's, or expired).
  virtual std::string StatsText() const = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_UCX_H_
