// One-sided reads that never hand back a value its owner evicted, moved or overwrote.
//
// The protocol (docs/transport.md, "One-sided read validation"):
//   1. LOOKUP(keys): the owner pins each value it holds in memory and grants a lease on
//      the pin.  Memory-tier values are immutable in place (an overwrite or delete
//      publishes new room and the old room is reused only after its last pin goes), so
//      while the lease holds, the bytes at {offset, size} are exactly version `version`.
//      A lease that is not released within its time to live is reaped: the pin goes and
//      the room may be reused.
//   2. The client reads {offset, size} one-sided (ucp_get_nbx) into the caller's buffers.
//   3. RELEASE(leases), sent only after every read completed: the owner answers, per
//      lease, whether it was still held.  Held: the pin covered the whole read, so the
//      bytes are the value.  Reaped: the bytes are not trusted; the key goes back to
//      step 1 (at most max_attempts times, then it fails with Aborted).
// This file holds the logic both sides share, independent of any transport, so that it
// is tested with an in-process "remote memory" (test/transport_test.cc).
#ifndef KVENGINE_TRANSPORT_READ_VALIDATION_H_
#define KVENGINE_TRANSPORT_READ_VALIDATION_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/mutex.h"

namespace kvengine {

// Where a key's value lies in its owner's arena, pinned under `lease`.
struct RemoteLocation {
  uint64_t offset = 0;  // from the start of the owner's arena
  uint64_t size = 0;
  uint64_t version = 0;
  uint64_t lease = 0;
};

// LOOKUP result codes beside the negative Status codes.
inline constexpr int64_t kLookupPinned = 0;     // found in memory, location valid
inline constexpr int64_t kLookupNotPinned = 1;  // present, but not in memory (ask by GET)

void EncodeLocations(std::string* dst, std::span<const int64_t> results,
                     std::span<const RemoteLocation> locations);
bool DecodeLocations(std::string_view* in, std::vector<int64_t>* results,
                     std::vector<RemoteLocation>* locations);

// Server side: the pins behind granted leases.  Thread-safe.
class LeaseTable {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // `ttl`: how long a lease holds its pin without a release.  `clock`: for tests.
  explicit LeaseTable(std::chrono::milliseconds ttl, Clock clock = nullptr);
  ~LeaseTable();

  // Keeps `pin` (whose destruction unpins the value) until Release or expiry; returns
  // the lease id (never 0).  Reaps expired leases first, in time proportional to their
  // number: granting N leases costs O(N log N) however many are held.
  uint64_t Grant(std::shared_ptr<void> pin);
  // Drops the lease.  True when it was still held (the pin covered every read made
  // before this call); false when it expired and was reaped, or was never granted.
  bool Release(uint64_t lease);
  // Drops every lease past its time to live; returns how many.
  size_t ReapExpired();
  // Drops every lease (a closing server).
  void Clear();
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<void> pin;
    std::chrono::steady_clock::time_point expires;
  };
  std::chrono::steady_clock::time_point Now() const;

  // Moves the expired leases' pins to *reaped (unpinned by the caller, outside the lock).
  void ReapExpiredLocked(std::vector<std::shared_ptr<void>>* reaped) REQUIRES(mu_);

  const std::chrono::milliseconds ttl_;
  const Clock clock_;
  mutable Mutex mu_;
  uint64_t next_ GUARDED_BY(mu_) = 1;
  // By id.  Ids grow with the grant time and every lease lives ttl_, so the earliest
  // expiry is always first: reaping stops at the first lease still alive.
  std::map<uint64_t, Entry> leases_ GUARDED_BY(mu_);
};

// One one-sided read: `length` bytes at `remote_offset` of the owner's arena into local.
struct RemoteRead {
  uint64_t remote_offset = 0;
  uint64_t length = 0;
  char* local = nullptr;
  size_t key_index = 0;  // which key of the batch it serves
  Status status;         // out
};

// What a one-sided reader needs from its peer.  UCX implements it with LOOKUP and
// RELEASE by active message and ucp_get_nbx (or the owner's active messages where reads
// cannot be one-sided); tests with plain memory.
class RemoteMemory {
 public:
  virtual ~RemoteMemory() = default;
  // One result per key (kLookupPinned, kLookupNotPinned or a negative code) and, for
  // pinned keys, their locations.
  virtual Status Lookup(std::span<const Slice> keys, std::vector<int64_t>* results,
                        std::vector<RemoteLocation>* locations) = 0;
  // Performs every read (a batch of work requests) and sets each read's status.
  virtual Status Read(std::span<RemoteRead> reads) = 0;
  // Releases the leases; (*held)[i] tells whether leases[i] was still held.
  virtual Status Release(std::span<const uint64_t> leases, std::vector<uint8_t>* held) = 0;
};

// Client side: runs the protocol over a RemoteMemory.  Keys the owner has but not in
// memory are left with kLookupNotPinned in results, for the caller to GET.
class ValidatedReader {
 public:
  explicit ValidatedReader(RemoteMemory* remote, int max_attempts = 3)
      : remote_(remote), max_attempts_(max_attempts) {}

  // results[i]: value size on success, kLookupNotPinned (see above), or a negative
  // code: NotFound, BufferTooSmall, IOError (a failed read), Aborted (every attempt's
  // lease expired before the read completed).
  Status BatchGet(std::span<const Slice> keys, std::span<const Destination> dests,
                  std::vector<int64_t>* results);

  // Reads retried because their lease had expired (for stats and tests).
  uint64_t retries() const { return retries_; }

 private:
  RemoteMemory* const remote_;
  const int max_attempts_;
  uint64_t retries_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_READ_VALIDATION_H_
