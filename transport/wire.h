// The peer protocol's frames and messages (docs/transport.md has the byte layout).
//
// A frame is a fixed 40-byte header, then `meta_len` bytes of metadata (the message:
// keys, sizes, results), then `body_len` bytes of bulk value bytes.  The header's
// checksum is XXH3-64 over header bytes [0, 32), the metadata and the body (the body
// left out on loopback connections that agreed to it: kFlagBodyUnhashed), so a torn or
// corrupted frame is told apart from a good one before anything it carries is trusted.
#ifndef KVENGINE_TRANSPORT_WIRE_H_
#define KVENGINE_TRANSPORT_WIRE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/key_pattern.h"

namespace kvengine {
namespace wire {

// DO NOT CHANGE THESE VALUES: they are on the wire between hosts of different builds.
inline constexpr uint32_t kMagic = 0x3154564b;  // "KVT1" little-endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 40;
// Limits a receiver enforces before reading anything a header announces.
inline constexpr uint32_t kMaxMetaLen = 64u << 20;
inline constexpr uint64_t kMaxBodyLen = 4ull << 30;
inline constexpr uint32_t kMaxKeysPerRequest = 1u << 20;
// A DELETE_MATCHING pattern longer than this is refused (InvalidArgument) by both ends
// before it is compiled: patterns travel scoped to namespaces, so the limit is the
// scoped one (util/key_pattern.h), and a user's own pattern is held to the shorter
// KeyPattern::kMaxLength by the layer that scopes it.
inline constexpr uint32_t kMaxPatternLen = KeyPattern::kMaxScopedLength;

enum Op : uint8_t {
  kChallenge = 1,        // server -> client at connect: nonce, whether a token is required
  kAuth = 2,             // client -> server: proof; the answer says accepted or refused
  kGet = 3,              // keys + capacities -> results; body: the found values
  kPut = 4,              // keys + sizes, body: the values -> results
  kExists = 5,           // keys -> results (1/0/error)
  kDelete = 6,           // keys -> results
  kLookup = 7,           // keys -> locations in the owner's arena, pinned under a lease
  kRelease = 8,          // lease ids -> whether each lease was still held (read valid)
  kProperty = 9,         // name -> value (stats)
  kRdmaConnect = 10,     // reserved: the retired verbs transport's; answered NotSupported
  kValueSize = 11,       // keys -> results (value size, or negative error)
  kDeleteMatching = 12,  // match mode + pattern -> count of keys removed (local tiers)
  kPrefetch = 13,        // keys -> results (1: read up from SSD started, 0: not)
  kUcxConnect = 14,      // client UCP worker address -> server's, arena and rkey (ucx.h)
  // A namespace registry's request (namespaces/namespace_fleet.h, whose bytes it carries
  // whole) -> batch status, length-prefixed answer.
  kSyncNamespaces = 15,
  // GET of several groups of keys in one request (PutGetGroups): answered by one GET
  // answer frame per group, in order, group g's carrying request id + g; servers with
  // kFeatureGetGroups.
  kGetGroups = 16,

  // Attached clients only, on the owner's Unix socket (attach/local_server.h,
  // docs/attach.md).  Locations are offsets in the shared arena.
  kAttach = 32,          // owner -> client at connect: status, arena size (fd alongside)
  kReserve = 33,         // keys + sizes -> results + locations (offset, reservation id)
  kCommit = 34,          // keys + reservation ids -> results (published as local puts)
  kPin = 35,             // keys + capacities -> results + locations (offset, size, lease)
  kUnpin = 36,           // lease ids; one-way: never answered
  kFlush = 37,           // -> status
  kCompactBuckets = 38,  // -> status, fixed64 bytes reclaimed
  // keys + reservation ids, spare ids given back, spare sizes wanted -> results +
  // locations of the spares (for the client's next put); owners with kFeatureSpares.
  kCommitReserve = 39,
  // -> status, with a memfd alongside: the connection's shared channel
  // (transport/shm_channel.h), which carries every later frame both ways; owners with
  // kFeatureChannel.
  kOpenChannel = 40,
  // keys -> batch status, a result per key (a LocatedTier of kvengine/db.h, or an error).
  kLocate = 41,
  // fixed64 after, fixed64 max_events -> status, then the RemovalBatch (PutRemovalBatch).
  kReadRemovals = 42,
  // Namespaces (attach/namespace_wire.h): each checked against the client's grant
  // (Options::local_allowed_uids).  USE binds the connection to a namespace: its later
  // requests are that namespace's.
  kUseNamespace = 43,     // name ("": the default namespace) -> status, fixed64 id
  kCreateNamespace = 44,  // name, NamespaceOptions -> status, fixed64 id
  kDropNamespace = 45,    // name -> status, fixed64 keys removed
  kListNamespaces = 46,   // -> status, the namespaces the client may use
  // -> status, fixed64 window size, with a memfd alongside (on the socket, before
  // kOpenChannel): the connection's staging window, where the owner reads the values of
  // its PINs that are not in memory; owners with kFeatureStaging.
  kOpenStaging = 47,
  // name -> status, fixed64 namespace id, fixed64 arena size, with the memfd of the
  // namespace's arena alongside (on the socket, before kOpenStaging and kOpenChannel):
  // binds the connection to the namespace, as kUseNamespace, and to its arena
  // (Options::namespace_arenas; docs/attach.md, "An arena per trust boundary"), whose
  // offsets its locations are from then on; owners with kFeatureArenas.
  kOpenArena = 48,
  // A layer-wise load's PINs in one request (DB::BatchGetIntoGroups): keys +
  // capacities, then the groups' ends (PutResults) -> one answer per group, in group
  // order, each as soon as the group's values are pinned or read into the staging window
  // (batch status, then a PIN's locations of the group's keys); an answer whose status is
  // an error is the request's last.  Keys the window had no room for are kPinLater, as
  // for PIN; owners with kFeatureGroups.
  kPinGroups = 49,
  // The owner's resident set (DB::ReadResident) of the connection's namespace, streamed
  // a batch per answer, the client asking for each (attach/resident_wire.h); owners with
  // kFeatureResident.
  kReadResident = 50,
};
// A PIN's answer on a connection with a staging window: a location whose version field
// is kPinInWindow is an offset in the window, not in the arena; the result kPinLater
// means the window is full of this connection's pins: ask again after their UNPIN.
inline constexpr uint64_t kPinInWindow = 1;
inline constexpr int64_t kPinLater = 2;
// Bits of the features an owner announces in its ATTACH answer.
constexpr uint64_t kFeatureSpares = 1;   // kCommitReserve
constexpr uint64_t kFeatureChannel = 2;  // kOpenChannel
constexpr uint64_t kFeatureStaging = 4;  // kOpenStaging
// kOpenArena; the greeting passes the default arena only to clients whose grant includes
// a namespace in it (else no memfd, and an arena size of 0).
constexpr uint64_t kFeatureArenas = 8;
constexpr uint64_t kFeatureGroups = 16;  // kPinGroups
constexpr uint64_t kFeatureResident = 32;  // kReadResident
// A server answers a well-formed frame carrying an op it does not know with
// NotSupported and keeps the connection; servers built before ops 11 and 12 existed
// close the connection instead (the client reports that as IOError).

// DELETE_MATCHING's match mode (the first byte of its metadata).
enum MatchMode : uint8_t {
  kMatchAll = 0,    // every key; the pattern must be empty
  kMatchRegex = 1,  // keys the pattern (util/key_pattern.h) matches whole
};
inline constexpr uint16_t kFlagResponse = 1;
// The frame's checksum covers the header and the metadata only; its body is not hashed.
// Used only on loopback connections, where the body never leaves this host's memory
// (docs/transport.md, "Checksums on loopback"): a client sets it on its requests when
// the server offered kFeatureLoopbackUnhashed, and the server then answers with it.
// A server refuses (closes) a connection that is not loopback sending it; a client
// refuses an answer carrying it on a connection that did not ask for it.
inline constexpr uint16_t kFlagBodyUnhashed = 2;

// Features a server offers after the batch status of its AUTH answer (u32, bits below);
// clients built before them ignore the trailing bytes.
inline constexpr uint32_t kFeatureLoopbackUnhashed = 1;  // takes and answers kFlagBodyUnhashed
inline constexpr uint32_t kFeatureGetGroups = 2;         // serves kGetGroups

struct FrameHeader {
  uint8_t op = 0;
  uint16_t flags = 0;
  uint64_t request_id = 0;
  uint32_t meta_len = 0;
  uint64_t body_len = 0;
  uint64_t checksum = 0;

  // Writes the 40 header bytes (checksum as stored in the field).
  void EncodeTo(char* dst) const;
  // Parses and checks magic, version and limits; Corruption naming the problem.
  static Status DecodeFrom(const char* src, FrameHeader* out);
};

// The checksum of a frame: header bytes [0, 32) (of a header encoded with any checksum),
// then meta, then every body part in order -- unless the header's flags carry
// kFlagBodyUnhashed, when the body is left out.
uint64_t FrameChecksum(const char* header, std::string_view meta, std::span<const Slice> body);
// Encodes the kHeaderSize bytes of a frame of `meta` and `body` into `header`, checksum
// included.
void EncodeFrameHeader(uint8_t op, uint16_t flags, uint64_t request_id, std::string_view meta,
                       std::span<const Slice> body, char* header);
// True when the encoded header's flags say its body is not covered by the checksum.
bool BodyUnhashed(const char* header);

// ---------------------------------------------------------------- messages
// Every response's metadata starts with the batch status: int32 code (0 OK, else the
// negative code of status.h) and a length-prefixed message.
void PutBatchStatus(std::string* dst, const Status& s);
bool GetBatchStatus(std::string_view* in, Status* s);

// Keys: uint32 count, then per key varint length + bytes; `extra` (when non-null) adds
// one fixed64 per key after its bytes (get: capacity; put: value size).
void PutKeys(std::string* dst, std::span<const Slice> keys, const uint64_t* extra);
// Parses what PutKeys wrote; views point into *in's storage.  False when malformed.
bool GetKeys(std::string_view* in, std::vector<std::string_view>* keys,
             std::vector<uint64_t>* extra);

// GET_GROUPS request: uint32 group count, a uint32 key count per group (each at least
// 1), then every group's keys and capacities in order, as GET's (PutKeys).  A request of
// more groups than keys, or whose counts do not add up to its keys, is malformed.
void PutGetGroups(std::string* dst, std::span<const uint32_t> counts, std::span<const Slice> keys,
                  const uint64_t* capacity);
bool GetGetGroups(std::string_view* in, std::vector<uint32_t>* counts,
                  std::vector<std::string_view>* keys, std::vector<uint64_t>* capacity);

// Results: uint32 count, then one fixed64 (two's complement int64) per key.
void PutResults(std::string* dst, std::span<const int64_t> results);
bool GetResults(std::string_view* in, std::vector<int64_t>* results);

// READ_REMOVALS answer after its status: fixed64 missed, fixed64 last_sequence, uint32
// count, then per event fixed64 sequence, fixed64 time_micros, u8 tier, u8 reason and the
// length-prefixed key.
void PutRemovalBatch(std::string* dst, const RemovalBatch& batch);
// False when malformed (an unknown tier or reason, short or trailing bytes).
bool GetRemovalBatch(std::string_view* in, RemovalBatch* batch);

// DELETE_MATCHING request: u8 mode, then the length-prefixed pattern.
void PutDeleteMatching(std::string* dst, MatchMode mode, std::string_view pattern);
// False when malformed (unknown mode, a pattern with kMatchAll, trailing bytes); the
// pattern's length is checked by the server, which answers InvalidArgument.
bool GetDeleteMatching(std::string_view* in, MatchMode* mode, std::string_view* pattern);

// Authentication (integrity of membership, not secrecy): the server sends a random
// 16-byte nonce at connect; the client answers AuthProof(nonce, token).  The token never
// crosses the wire, but XXH3 is not a cryptographic MAC: this keeps out misconfigured or
// stray clients, not an attacker who can observe traffic (use a private network).
inline constexpr size_t kNonceSize = 16;
uint64_t AuthProof(std::string_view nonce, std::string_view token);

// CHALLENGE (server -> client): the nonce, then one byte of these bits.  Clients built
// before kChallengeTakesTenant read any non-zero byte as "a token is required".
inline constexpr uint8_t kChallengeTokenRequired = 1;
// The server reads a tenant's name after the proof (transport/tenant_tokens.h); sent
// only with kChallengeTokenRequired.
inline constexpr uint8_t kChallengeTakesTenant = 2;

// AUTH request (client -> server): empty (no token), or fixed64 AuthProof(nonce,
// token), then -- to a server whose challenge has kChallengeTakesTenant, from a client
// that has one -- the length-prefixed name of the tenant the token is of.
void PutAuth(std::string* dst, uint64_t proof, std::string_view tenant);
// False when malformed (a proof cut short, a name cut short, trailing bytes).  An empty
// request stores has_proof = false.
bool GetAuth(std::string_view meta, bool* has_proof, uint64_t* proof, std::string_view* tenant);

}  // namespace wire
}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_WIRE_H_
