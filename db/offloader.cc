#include "db/offloader.h"

#include <span>

namespace kvengine {

bool Offloader::OnEvict(const Slice& key, const Slice& value, uint64_t version) {
  if (Persist(key, value, version, SsdTier::StageWait::kPut).ok()) return true;
  // Refused by its namespace's SSD quota (a value larger than it, or none of the
  // namespace's own values to drop for it): kept in memory it would stay there for good,
  // so it goes, like a value evicted without an SSD tier.
  return ssd_->OverNamespaceQuota(key, value.size());
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
