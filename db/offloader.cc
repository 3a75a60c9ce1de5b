#include "db/offloader.h"

#include <span>

namespace kvengine {

bool Offloader::OnEvict(const Slice& key, const Slice& value, uint64_t version) {
  return Persist(key, value, version, SsdTier::StageWait::kPut).ok();
}

Status Offloader::Persist(const Slice& key, const Slice& value, uint64_t version,
                          SsdTier::StageWait wait) {
  if (ssd_->HasVersion(key, version)) return Status::OK();  // write-through, or done
  SsdTier::Ticket ticket;
  Status s = ssd_->Stage(key, std::span<const Slice>(&value, 1), value.size(), &ticket, wait);
  if (!s.ok()) return s;
  bool current = false;
  memory_->WithKeyLocked(key, [&](uint64_t in_memory, uint64_t) {
    current = in_memory == version;
    if (current) ssd_->Commit(&ticket, version);
  });
  if (!current) ssd_->Abort(&ticket);
  return Status::OK();
}

}  // namespace kvengine
