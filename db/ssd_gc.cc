// The SSD tier's garbage collector: holes punched over dead values, and copy-on-write
// compaction of buckets.
//
// A round first gives back the blocks of the values deleted since the last one
// (gc_punch_holes): it syncs the tombstone log, so that no restart can bring those values
// back, waits until every read that might still be reading them has finished (a
// GracePeriod entered by MultiGet before its lookups), and punches a hole over each.
// A hole frees whole blocks only: a run of neighbouring dead values gives back the blocks
// inside it, and its ends that share a block with a live value stay queued (see
// db/hole_plan.h), so a hole never touches a live value.  The bucket file keeps its size and index;
// only the map and the tombstones know those entries are dead, as before.
//
// Then its compactor (db/bucket_compactor.h) picks the buckets whose remaining garbage is
// high, that are nearly empty, or that hold the most tombstones, and compacts them
// copy-on-write, as many at a time as fit one bucket image, into one new bucket; at the
// end of the round the old buckets are retired together: their in-flight reads drain
// (waited for without holding any lock), their files are deleted and their tombstones
// dropped.
#include <chrono>

#include "db/hole_plan.h"
#include "db/ssd_bucket.h"
#include "db/ssd_tier.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/perf_point.h"

namespace kvengine {

Status SsdTier::CompactBuckets(uint64_t* reclaimed) {
  PerfPoint perf(PerfKey::ssd_gc_round);
  MutexLock round(&gc_mu_);
  if (reclaimed != nullptr) *reclaimed = 0;
  uint64_t punched = 0;
  Status first = PunchDeadExtents(&punched);
  if (reclaimed != nullptr) *reclaimed += punched;
  BucketCompactor::Buckets picked;
  {
    MutexLock lock(&mu_);
    if (stopping_) return Status::Aborted("SSD tier is closed");
    picked = compactor_.PickLocked();
  }
  BucketCompactor::Buckets retired;
  uint64_t compacted = 0;
  Status s = compactor_.Compact(std::move(picked), &compacted, &retired);
  if (first.ok()) first = s;
  if (reclaimed != nullptr) *reclaimed += compacted;
  // The old files go together: one directory sync and one tombstone-log rewrite per
  // round rather than per bucket.
  RetireBuckets(std::move(retired));
  MutexLock st(&stats_mu_);
  stats_.gc_rounds++;
  return first;
}

Status SsdTier::PunchDeadExtents(uint64_t* reclaimed) {
  *reclaimed = 0;
  struct Work {
    std::shared_ptr<SsdBucket> bucket;
    std::vector<SsdBucket::Extent> extents;
  };
  std::vector<Work> work;
  {
    MutexLock lock(&mu_);
    if (stopping_) return Status::Aborted("SSD tier is closed");
    for (const auto& [id, b] : buckets_) {
      if (b->dead_extents.size() <= b->dead_extents_parked) continue;
      b->dead_extents_parked = 0;
      if (!punch_supported_ || b->state != SsdBucket::State::kOnDisk) {
        b->dead_extents.clear();  // left to compaction
        continue;
      }
      b->readers.fetch_add(1, std::memory_order_acq_rel);  // keeps the file in place
      work.push_back({b, std::move(b->dead_extents)});
      b->dead_extents.clear();
    }
  }
  if (work.empty()) return Status::OK();
  auto unpin = [&] {
    for (Work& w : work) w.bucket->readers.fetch_sub(1, std::memory_order_acq_rel);
  };
  // REQUIRES: mu_ held.
  auto requeue = [](SsdBucket* b, const std::vector<SsdBucket::Extent>& extents) {
    b->dead_extents.insert(b->dead_extents.end(), extents.begin(), extents.end());
  };
  // The tombstones first: a restart must never find a dead value's key pointing at a hole.
  Status s = log_->Sync();
  if (!s.ok()) {
    MutexLock lock(&mu_);
    for (Work& w : work) requeue(w.bucket.get(), w.extents);
    unpin();
    return s;
  }
  readers_.Wait();
  for (Work& w : work) {
    // Neighbouring extents go as one hole: fewer calls, and the blocks that packed small
    // values share.  The holes of one bucket are punched with one open of its file.
    const HolePlan plan = PlanHoles(std::move(w.extents), kBucketAlignment);
    std::vector<FileRange> holes;
    for (const HolePlan::Hole& h : plan.holes) holes.push_back(h.range);
    size_t holes_punched = 0;
    if (s.ok() && !holes.empty()) {
      s = env_->PunchHoles(BucketPath(w.bucket->id), holes.data(), holes.size(), &holes_punched);
    }
    uint64_t bytes = 0, value_bytes = 0;
    for (size_t h = 0; h < holes_punched; h++) {
      bytes += holes[h].length;
      value_bytes += plan.holes[h].value_bytes;
    }
    MutexLock lock(&mu_);
    w.bucket->punched_bytes += bytes;
    w.bucket->punched_value_bytes += value_bytes;
    auto it = buckets_.find(w.bucket->id);
    if (it != buckets_.end() && it->second == w.bucket) used_bytes_ -= bytes;
    *reclaimed += bytes;
    if (s.IsNotSupported()) continue;  // left to compaction
    // What was not punched is tried again next round: the parts of punched runs that
    // share a block with a live value, and whole runs after a failure.
    requeue(w.bucket.get(), plan.unpunchable);
    w.bucket->dead_extents_parked += plan.unpunchable.size();
    for (size_t h = 0; h < plan.holes.size(); h++) {
      if (h < holes_punched) {
        requeue(w.bucket.get(), plan.holes[h].leftovers);
        w.bucket->dead_extents_parked += plan.holes[h].leftovers.size();
      } else {
        requeue(w.bucket.get(), plan.holes[h].extents);
      }
    }
  }
  unpin();
  {
    MutexLock st(&stats_mu_);
    stats_.gc_bytes_punched += *reclaimed;
    stats_.gc_bytes_reclaimed += *reclaimed;
  }
  if (s.IsNotSupported()) {
    // Not an error: this filesystem cannot, so compaction alone reclaims space.
    punch_supported_ = false;
    logger_->Logf(LogLevel::kWarn, "GC: %s; deleted values are reclaimed by compaction only",
                  s.ToString().c_str());
    return Status::OK();
  }
  return s;
}

void SsdTier::GcLoop() {
  MutexLock lock(&gc_mu_);
  while (!gc_stop_) {
    const auto round_at =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.gc_interval_ms);
    while (!gc_stop_ && gc_cv_.WaitUntil(&gc_mu_, round_at)) {
    }
    if (gc_stop_) break;
    lock.Unlock();
    uint64_t reclaimed = 0;
    CompactBuckets(&reclaimed);
    if (reclaimed > 0) {
      logger_->Logf(LogLevel::kInfo, "GC round reclaimed %llu bytes",
                    static_cast<unsigned long long>(reclaimed));
    }
    // After the compactions: the checkpoint then lists their outputs, not the buckets
    // they retired.
    Status c = MaybeWriteCheckpointWhileRunning();
    if (!c.ok() && !c.IsAborted()) {
      logger_->Logf(LogLevel::kWarn, "map checkpoint not written: %s", c.ToString().c_str());
    }
    lock.Lock();
  }
}

}  // namespace kvengine
