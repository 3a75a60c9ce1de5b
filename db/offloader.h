// Offloader: the write-back path from the memory tier to the SSD tier.
//
// A value the memory tier evicts, or one that Flush() makes durable, goes to SSD.  The
// value is staged (copied into a bucket image) outside any lock, then published on SSD
// under the key's lock, and only if memory still holds that very version: a delete or
// overwrite that came in between wins, and the staged copy is given up.
//
// Thread-safety: all methods are thread-safe (the tiers lock what they touch).
#ifndef KVENGINE_DB_OFFLOADER_H_
#define KVENGINE_DB_OFFLOADER_H_

#include <cstdint>

#include "db/memory_tier.h"
#include "db/ssd_tier.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine {

class Offloader final : public EvictionHandler {
 public:
  // Neither tier is owned; both outlive the offloader.
  Offloader(MemoryTier* memory, SsdTier* ssd) : memory_(memory), ssd_(ssd) {}

  // The memory tier's eviction hook: true when the value may leave memory (it is safe
  // on SSD, or stale, or its namespace's SSD quota refuses it); false leaves it in
  // memory (SSD full or failing).
  bool OnEvict(const Slice& key, const Slice& value, uint64_t version) override;

  // OK when the value is safe on SSD (staged; durable once its bucket is written), or
  // memory no longer holds that version; the error of Stage otherwise.  `wait`: how long
  // staging may wait for a writer that is behind (SsdTier::StageWait; an eviction runs
  // inside a put and waits as a put does).
  Status Persist(const Slice& key, const Slice& value, uint64_t version,
                 SsdTier::StageWait wait = SsdTier::StageWait::kFlush);

 private:
  MemoryTier* const memory_;
  SsdTier* const ssd_;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_OFFLOADER_H_
