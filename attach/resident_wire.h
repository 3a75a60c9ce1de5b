// The metadata of the attach protocol's READ_RESIDENT (wire::kReadResident; docs/attach.md,
// "The resident set"), encoded and decoded once for both ends.
//
// Why a stream of answers the client asks for one by one, not a cursor: the owner's
// DB::ReadResident walks its tiers once, calling back per batch, and has no position a
// later request could resume from (a walk begun again and skipped forward would cost the
// square of the set, and skip or repeat keys as it changes).  So the owner keeps the one
// walk running while the client reads: after each batch it sends, it waits for the
// client's NEXT (go on) or STOP (the client's ResidentFn returned false: the walk ends at
// once).  Each side holds one batch at a time; the owner waits for a NEXT at most
// Options::peer_timeout_ms, then drops the connection, so a stalled client never holds
// the walk (and the SSD tier's compaction, which waits for it) for longer.
//
//   client                          owner
//   START prefix, max_batch   ->
//                             <-    OK, KEYS n, (tier, key) x n      (n <= max_batch)
//   NEXT                      ->
//                             <-    OK, KEYS ...
//   NEXT | STOP               ->
//                             <-    OK, END epoch, removal_sequence, keys
//
// Every request has one answer, in order.  An answer whose status is not OK ends the
// stream too (an invalid max_batch, a refused namespace).  A NEXT or STOP outside a
// stream is answered InvalidArgument.
//
// Every Get* returns false, its output unspecified, on bytes that do not parse.
#ifndef KVENGINE_ATTACH_RESIDENT_WIRE_H_
#define KVENGINE_ATTACH_RESIDENT_WIRE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/db.h"

namespace kvengine {
namespace wire {

// The first byte of a READ_RESIDENT request.  DO NOT CHANGE THESE VALUES.
enum ResidentStep : uint8_t {
  kResidentStart = 0,  // then the length-prefixed prefix and fixed64 max_batch
  kResidentNext = 1,
  kResidentStop = 2,
};

// The most key bytes one KEYS answer carries: a batch of more is sent in several
// answers (each asked for), so that a frame stays small whatever the keys' sizes.
inline constexpr uint64_t kResidentFrameBytes = 4u << 20;

void PutResidentStart(std::string* dst, std::string_view prefix, uint64_t max_batch);
void PutResidentStep(std::string* dst, ResidentStep step);  // NEXT or STOP
// `prefix` and `max_batch` are set for kResidentStart only.
bool GetResidentRequest(std::string_view* in, ResidentStep* step, std::string_view* prefix,
                        uint64_t* max_batch);

// The answers after their OK status: u8 1 (KEYS), fixed32 count, then per key u8 tier
// (LocatedTier: 1 memory, 2 SSD) and the length-prefixed key; or u8 0 (END), then
// fixed64 epoch, removal_sequence and keys.
void PutResidentKeys(std::string* dst, std::span<const ResidentKey> keys);
void PutResidentEnd(std::string* dst, const ResidentSnapshot& snapshot);
// The bytes PutResidentKeys spends on one key.
uint64_t ResidentKeyBytes(const ResidentKey& key);
// A KEYS answer stores *end false and its keys; an END answer *end true and *snapshot.
// False too for a tier other than memory or SSD, or trailing bytes.
bool GetResidentAnswer(std::string_view* in, bool* end, std::vector<ResidentKey>* keys,
                       ResidentSnapshot* snapshot);

}  // namespace wire
}  // namespace kvengine

#endif  // KVENGINE_ATTACH_RESIDENT_WIRE_H_
