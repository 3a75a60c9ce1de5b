// DescriptorBudget: how many file descriptors the engine may hold, sized from the
// process's limit (RLIMIT_NOFILE) the way LevelDB sizes its open-file budget.
//
// An inference worker holds many descriptors of its own (CUDA, NCCL, ZMQ, sockets), and
// containers often run with 1024 or less; a DB whose bucket file cache alone may keep
// 1000 files open fails its Open there with EMFILE.  So at Open the engine takes the
// limit, less what the process holds already, less a headroom left to the rest of the
// process (a quarter of what is free, at least kMinHeadroom), and divides what remains:
// a fixed share for the files it always holds or opens briefly (LOCK, the tombstone log
// and its guard, a bucket being written, the checkpoint, recovery's parallel opens, the
// shared arena's memfd, listeners), some io_uring rings, a share for connections (the
// sockets of attached clients and peers, a quarter of what the fixed share leaves, at
// most kMaxConnections), and the rest for the bucket file cache, at most
// Options::max_open_files.  Clamping is logged by the caller.
//
// A server sizes its cap on connections with ConnectionCap at its Start, from a Plan
// made then: the process holds more by then than at the DB's Open, so the share it
// finds is never larger than the one the bucket file cache was sized beside.
//
// Thread-safety: a value type; SetIoUringRingLimit is thread-safe.
#ifndef KVENGINE_ENV_DESCRIPTOR_BUDGET_H_
#define KVENGINE_ENV_DESCRIPTOR_BUDGET_H_

#include <cstdint>

#include "kvengine/env.h"

namespace kvengine {

struct DescriptorBudget {
  static constexpr uint64_t kMinHeadroom = 16;
  // Descriptors the engine holds or opens briefly besides bucket files and rings.
  static constexpr uint64_t kFixed = 16;
  static constexpr uint64_t kMaxRings = 8;
  // The bucket file cache never gets fewer: a read pins one file, a compaction a few.
  static constexpr uint64_t kMinBucketFiles = 4;
  // Connections past this many need more than a raised limit (threads, memory): the
  // share stops growing here however high RLIMIT_NOFILE is.
  static constexpr uint64_t kMaxConnections = 4096;

  bool known = false;         // the Env could tell the limit (else: options as given)
  uint64_t limit = 0;         // RLIMIT_NOFILE (soft); UINT64_MAX when unlimited
  uint64_t in_use = 0;        // held by the process when the DB opened
  uint64_t headroom = 0;      // left to the rest of the process
  uint64_t engine = 0;        // what the engine may hold: limit - in_use - headroom
  uint64_t bucket_files = 0;  // of it, the bucket file cache (<= max_open_files)
  uint64_t rings = 0;         // of it, io_uring rings (one per thread that uses one)
  uint64_t connections = 0;   // of it, sockets of attached clients and peers, all servers
  bool clamped = false;       // bucket_files < max_open_files

  // Asks env for the limit and sizes the budget for `max_open_files` bucket files.
  static DescriptorBudget Plan(Env* env, uint64_t max_open_files);

  // The most connections one server may hold at once: `wanted` when set (0: as many as
  // the budget allows), never more than the connection share allows -- each connection
  // costs `per_connection` descriptors, one more is kept to accept a connection and
  // refuse it, and the share is halved when `shared` (the process serves both attached
  // clients and peers).  At least 1.  *clamped: `wanted` was set and cut.  Unknown
  // limit: `wanted`, or kMaxConnections.
  uint64_t ConnectionCap(uint64_t wanted, uint64_t per_connection, bool shared,
                         bool* clamped) const;
};

// Caps the io_uring rings the process makes (one per thread that submits); a thread past
// the cap reads and writes with pread/pwrite.  The cap only ever goes down.
void SetIoUringRingLimit(uint64_t rings);

}  // namespace kvengine

#endif  // KVENGINE_ENV_DESCRIPTOR_BUDGET_H_
