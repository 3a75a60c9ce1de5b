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
// Then it picks buckets whose deleted bytes still taking space are at least
// gc_deleted_ratio of their bytes (or any with such bytes when the tier is over its high
// watermark), or whose deleted bytes, punched or not, are at least gc_merge_deleted_ratio,
// and -- when there are more tombstones than live keys -- those holding the most
// tombstones per live byte (a punched value's tombstone stays in memory and in the log
// until its bucket goes; without this, small values deleted at random could leave ~9
// tombstones per live key), coldest first, and compacts them, as many at a time as fit one bucket
// image, into one new bucket:
//   1. under the lock, list the entries the map still reaches (key -> this bucket, same
//      version) and pin the bucket against retirement;
//   2. read them (checksums verified) straight into a new bucket's image and write it:
//      temporary name, sync, rename, directory sync;
//   3. under the lock, for every entry the builder actually wrote -- by key, never by
//      position in another list -- compare-and-swap the map: old location -> new, only
//      if the key still maps to the old bucket with the same version.  A key that lost
//      the race (deleted or overwritten meanwhile) is dead in the new bucket: it gets a
//      tombstone naming the new bucket, so no restart revives it;
//   4. sync the tombstone log; at the end of the round, wait for in-flight reads of the
//      old buckets without holding any lock, delete their files and drop their tombstones.
// A failure before step 3 leaves the old bucket authoritative and removes the new file.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "db/hole_plan.h"
#include "db/ssd_bucket.h"
#include "db/ssd_tier.h"
#include "util/logging.h"
#include "util/perf_point.h"

namespace kvengine {

namespace {

// Below this many tombstones their memory does not matter (see AddTombstoneHeavyLocked).
constexpr uint64_t kTombstonesWorthMerging = 4096;

// Bytes of values a compaction reads in one batch before handing them to the writer.
constexpr uint64_t kCompactionChunkBytes = 4 << 20;

// Entries [begin, end) of a compaction's live list, from one old bucket; the new image
// is complete up to image_end once they are read.
struct CompactionChunk {
  size_t begin;
  size_t end;
  uint64_t image_end;
};

// Reads a compaction's chunks, in order, on the SSD tier's chunk-reader thread, never
// waiting for the writer (the whole image is already allocated).  The destructor stops
// it after the chunk in progress and waits, so no read outlives the image it fills.
class ChunkReader {
 public:
  ChunkReader(WorkerThread* worker, size_t chunks, std::function<void(size_t)> read_chunk) {
    worker->Submit([this, chunks, read = std::move(read_chunk)] {
      for (size_t c = 0; c < chunks; c++) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (stop_) break;
        }
        read(c);
        std::lock_guard<std::mutex> lock(mu_);
        done_ = c + 1;
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      cv_.notify_all();
    });
  }
  ~ChunkReader() {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    cv_.wait(lock, [this] { return finished_; });
  }
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  // Blocks until chunk c has been read.
  void WaitFor(size_t c) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ > c; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t done_ = 0;        // chunks read so far; guarded by mu_
  bool stop_ = false;      // guarded by mu_
  bool finished_ = false;  // the task has returned; guarded by mu_
};

}  // namespace

Status SsdTier::CompactBuckets(uint64_t* reclaimed) {
  PerfPoint perf(PerfKey::ssd_gc_round);
  std::lock_guard<std::mutex> round(gc_mu_);
  if (reclaimed != nullptr) *reclaimed = 0;
  uint64_t punched = 0;
  Status first = PunchDeadExtents(&punched);
  if (reclaimed != nullptr) *reclaimed += punched;
  std::vector<std::shared_ptr<SsdBucket>> candidates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::Aborted("SSD tier is closed");
    const bool pressure =
        options_.ssd_capacity_bytes > 0 &&
        static_cast<double>(used_bytes_) >=
            options_.gc_high_watermark_ratio * static_cast<double>(options_.ssd_capacity_bytes);
    auto ratio = [](const SsdBucket& b, uint64_t bytes) {
      return b.total_bytes == 0 ? 1.0
                                : static_cast<double>(bytes) / static_cast<double>(b.total_bytes);
    };
    for (const auto& [id, b] : buckets_) {
      if (b->state != SsdBucket::State::kOnDisk || b->deleted_bytes == 0) continue;
      const uint64_t unreclaimed = b->unreclaimed_bytes();
      if ((unreclaimed > 0 && (pressure || ratio(*b, unreclaimed) >= options_.gc_deleted_ratio)) ||
          ratio(*b, b->deleted_bytes) >= options_.gc_merge_deleted_ratio) {
        candidates.push_back(b);
      }
    }
    AddTombstoneHeavyLocked(&candidates);
    std::sort(candidates.begin(), candidates.end(),
              [](const auto& a, const auto& b) { return a->last_access < b->last_access; });
    if (candidates.size() > options_.gc_max_buckets_per_round) {
      candidates.resize(options_.gc_max_buckets_per_round);
    }
    for (const auto& b : candidates) b->compacting = true;
  }
  std::vector<std::shared_ptr<SsdBucket>> retired;
  // Sparse buckets are merged, as many as fit one bucket image, so that the fixed cost
  // of a compaction (three syncs and a verification read) is paid once for all of them.
  for (size_t begin = 0; begin < candidates.size();) {
    std::vector<std::shared_ptr<SsdBucket>> group;
    uint64_t group_live = 0;
    for (size_t i = begin; i < candidates.size(); i++) {
      uint64_t live;
      {
        std::lock_guard<std::mutex> lock(mu_);
        live = candidates[i]->total_bytes - candidates[i]->deleted_bytes;
      }
      if (!group.empty() && group_live + live > bucket_bytes_) break;
      group.push_back(candidates[i]);
      group_live += live;
    }
    begin += group.size();
    uint64_t n = 0;
    Status s = CompactGroup(group, &n, &retired);
    if (!s.ok()) {
      logger_->Logf(LogLevel::kError, "compacting %zu bucket(s) from %llu: %s", group.size(),
                    static_cast<unsigned long long>(group.front()->id), s.ToString().c_str());
      if (first.ok()) first = s;
    }
    if (reclaimed != nullptr) *reclaimed += n;
  }
  // The old files go together: one directory sync and one tombstone-log rewrite per
  // round rather than per bucket.
  candidates.clear();  // so that RetireBuckets holds the last references
  RetireBuckets(std::move(retired));
  std::lock_guard<std::mutex> st(stats_mu_);
  stats_.gc_rounds++;
  return first;
}

void SsdTier::AddTombstoneHeavyLocked(std::vector<std::shared_ptr<SsdBucket>>* candidates) {
  uint64_t tombstones = 0;
  for (const auto& [bucket, records] : tombstones_) tombstones += records.size();
  if (tombstones <= std::max<uint64_t>(map_.size(), kTombstonesWorthMerging)) return;
  // The buckets holding the most tombstones per live byte cost the least to rewrite for
  // the memory they give back.
  struct Ranked {
    double weight;
    uint64_t tombstones;
    std::shared_ptr<SsdBucket> bucket;
  };
  std::vector<Ranked> ranked;
  for (const auto& [id, b] : buckets_) {
    auto t = tombstones_.find(id);
    if (b->state != SsdBucket::State::kOnDisk || t == tombstones_.end() || t->second.empty() ||
        std::find(candidates->begin(), candidates->end(), b) != candidates->end()) {
      continue;
    }
    const uint64_t live = b->total_bytes - b->deleted_bytes;
    ranked.push_back({static_cast<double>(t->second.size()) / static_cast<double>(live + 1),
                      t->second.size(), b});
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const Ranked& a, const Ranked& b) { return a.weight > b.weight; });
  uint64_t excess = tombstones - map_.size();
  for (const Ranked& r : ranked) {
    if (excess == 0) break;
    candidates->push_back(r.bucket);
    excess -= std::min(excess, r.tombstones);
  }
}

Status SsdTier::PunchDeadExtents(uint64_t* reclaimed) {
  *reclaimed = 0;
  struct Work {
    std::shared_ptr<SsdBucket> bucket;
    std::vector<SsdBucket::Extent> extents;
  };
  std::vector<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> st(stats_mu_);
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

Status SsdTier::CompactGroup(const std::vector<std::shared_ptr<SsdBucket>>& olds,
                             uint64_t* reclaimed,
                             std::vector<std::shared_ptr<SsdBucket>>* retired) {
  PerfPoint perf(PerfKey::ssd_compaction);
  *reclaimed = 0;
  // 1. The live entries of every old bucket (with the bucket each came from), and a pin
  // on each old file.
  std::vector<BucketEntry> live;
  std::vector<size_t> source;  // live[i] lies in olds[source[i]]
  uint64_t new_id = 0;
  uint64_t live_bytes = 0;
  // Their indexes, from their files (no copy stays in RAM), read with no lock held:
  // a bucket marked compacting is neither evicted nor compacted elsewhere meanwhile.
  std::vector<std::vector<BucketEntry>> indexes(olds.size());
  for (size_t k = 0; k < olds.size(); k++) {
    Status s = ReadBucketIndex(*olds[k], &indexes[k]);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& old : olds) old->compacting = false;
      return s;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = 0; k < olds.size(); k++) {
      for (const BucketEntry& e : indexes[k]) {
        if (MapsToLocked(KeyFingerprint::Of(e.key), olds[k]->id, e.version)) {
          live.push_back(e);
          source.push_back(k);
          live_bytes += BucketBuilder::MaxSpace(e.size);
        }
      }
      olds[k]->readers.fetch_add(1, std::memory_order_acq_rel);
    }
    if (!live.empty()) new_id = next_bucket_id_++;
  }
  auto unpin = [&] {
    for (const auto& old : olds) old->readers.fetch_sub(1, std::memory_order_acq_rel);
  };
  auto give_up = [&](Status s) {  // the old buckets stay authoritative
    unpin();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& old : olds) old->compacting = false;
    return s;
  };

  std::shared_ptr<SsdBucket> fresh;
  std::vector<BucketEntry> written;  // what the builder actually placed, key by key
  std::vector<size_t> written_source;
  if (!live.empty()) {
    // 2. Read the live values straight into the new image and write it.
    std::shared_ptr<BucketBuilder> builder;
    Status s = NewBuilder(new_id, kBucketHeaderSize + live_bytes + kBucketAlignment, &builder);
    if (!s.ok()) return give_up(s);
    std::vector<ValueRead> reads(live.size());
    std::vector<MutableSlice> dests(live.size());
    std::vector<uint64_t> offsets(live.size());
    for (size_t i = 0; i < live.size(); i++) {
      // Cannot fail: the image has room for every value's MaxSpace and a page.
      if (!builder->Reserve(live[i].size, &offsets[i])) {
        return give_up(Status::Corruption("GC: compaction image too small"));
      }
      // The padded length keeps the read aligned: the source's padding is zeros too, and
      // at least as long (a unit of its format is never smaller than the current one).
      dests[i] = MutableSlice(builder->MutableData(offsets[i]),
                              PaddedValueSize(kBucketFormatVersion, live[i].size));
      reads[i].offset = live[i].offset;
      reads[i].size = live[i].size;
      reads[i].checksum = live[i].checksum;
      reads[i].key = live[i].key;
      reads[i].dest = std::span<const MutableSlice>(&dests[i], 1);
    }
    // Chunks of consecutive entries of one old bucket, each one batch of reads.  A
    // helper thread reads them in order while this one appends each finished chunk to
    // the new file, so the disk reads and writes at once.
    std::vector<CompactionChunk> chunks;
    for (size_t begin = 0; begin < live.size();) {
      size_t end = begin + 1;
      uint64_t bytes = BucketBuilder::MaxSpace(live[begin].size);
      while (end < live.size() && source[end] == source[begin] &&
             bytes + BucketBuilder::MaxSpace(live[end].size) <= kCompactionChunkBytes) {
        bytes += BucketBuilder::MaxSpace(live[end].size);
        end++;
      }
      // The image is complete up to the start of the next chunk's first value (its gap is
      // zeros already), and written out in whole pages: the last chunk up to the end of
      // the values region, the others up to their last whole page.
      const uint64_t image_end = end == live.size()
                                     ? builder->values_end()
                                     : offsets[end] / kBucketAlignment * kBucketAlignment;
      chunks.push_back({begin, end, image_end});
      begin = end;
    }
    ChunkReader chunk_reader(&chunk_reader_, chunks.size(), [&](size_t c) {
      const CompactionChunk& chunk = chunks[c];
      const SsdBucket& old = *olds[source[chunk.begin]];
      const std::span<ValueRead> batch(reads.data() + chunk.begin, chunk.end - chunk.begin);
      BucketFileCache::Handle file;           // pinned for this chunk only: a merge of many small
      Status st = BucketFile(old.id, &file);  // buckets never holds all their files
      if (!st.ok()) {
        for (ValueRead& r : batch) r.status = st;
        return;
      }
      old.reader->ReadValues(env_, *file, batch, /*verify=*/true);
    });
    auto append_image = [&](WritableFile* file) {
      uint64_t appended = 0;  // the header goes with the first chunk
      for (size_t c = 0; c < chunks.size(); c++) {
        chunk_reader.WaitFor(c);
        if (chunks[c].image_end <= appended) continue;  // all in a page still being filled
        Status st = file->Append(Slice(builder->Data(appended), chunks[c].image_end - appended));
        if (!st.ok()) return st;
        appended = chunks[c].image_end;
      }
      // Only now are the reads' results known: the index lists what was read intact.
      for (size_t i = 0; i < live.size(); i++) {
        if (!reads[i].status.ok()) {
          // A value that fails its checksum cannot be carried over; it was unreadable
          // anyway.  It is dropped (tombstoned) below.
          logger_->Logf(LogLevel::kError, "GC: dropping unreadable value: %s",
                        reads[i].status.ToString().c_str());
          continue;
        }
        BucketEntry e = live[i];
        e.offset = offsets[i];
        if (olds[source[i]]->reader->header().format_version != kBucketFormatVersion) {
          // From a bucket of an older format: checksummed as the new bucket's format says.
          e.checksum =
              BucketEntryChecksum(kBucketFormatVersion, e.key, builder->Data(offsets[i]), e.size);
        }
        written.push_back(std::move(e));
        written_source.push_back(source[i]);
      }
      return Status::OK();
    };
    uint64_t file_size = 0;
    std::unique_ptr<BucketReader> reader;
    s = WriteBucketFile(*builder, written, &file_size, &reader, append_image);
    if (!s.ok()) return give_up(s);
    fresh = std::make_shared<SsdBucket>();
    fresh->id = new_id;
    fresh->state = SsdBucket::State::kOnDisk;
    fresh->reader = std::move(reader);
    fresh->file_size = file_size;
    fresh->opened_micros = env_->NowMicros();
    std::lock_guard<std::mutex> st(stats_mu_);
    stats_.gc_bytes_rewritten += file_size;
  }

  // 3. Validate and swap, key by key, from what the builder wrote.
  uint64_t lost = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fresh != nullptr) {
      checkpoint_backlog_ += written.size();
      for (const auto& old : olds)
        fresh->last_access = std::max(fresh->last_access, old->last_access);
      for (size_t i = 0; i < written.size(); i++) {
        const BucketEntry& e = written[i];
        fresh->keys++;
        fresh->total_bytes += e.size;
        const KeyFingerprint fp = KeyFingerprint::Of(e.key);
        if (MapsToLocked(fp, olds[written_source[i]]->id, e.version)) {
          map_.Put(fp, SsdLocation{fresh->id, e.offset, e.size, e.version, e.checksum});
          fresh->live_keys++;
        } else {
          fresh->deleted_bytes += e.size;
          TombstoneLocked(e.key, SsdLocation{fresh->id, e.offset, e.size, e.version, e.checksum});
          lost++;
        }
      }
      buckets_[fresh->id] = fresh;
      used_bytes_ += fresh->file_size;
    }
    // Entries that could not be read: drop them from the map so no one reads garbage.
    for (size_t i = 0; i < live.size(); i++) {
      const KeyFingerprint fp = KeyFingerprint::Of(live[i].key);
      SsdLocation loc;
      if (map_.Find(fp, &loc) && loc.bucket == olds[source[i]]->id &&
          loc.version == live[i].version) {
        RemoveLocked(live[i].key, fp, loc, /*tombstone=*/true);
      }
    }
    uint64_t old_bytes = 0;
    for (const auto& old : olds) {
      buckets_.erase(old->id);
      used_bytes_ -= old->allocated_bytes();
      old_bytes += old->allocated_bytes();
    }
    const uint64_t new_bytes = fresh != nullptr ? fresh->file_size : 0;
    *reclaimed = old_bytes > new_bytes ? old_bytes - new_bytes : 0;
  }
  unpin();
  {
    std::lock_guard<std::mutex> st(stats_mu_);
    stats_.gc_buckets_compacted += olds.size();
    stats_.gc_bytes_reclaimed += *reclaimed;
    stats_.gc_keys_lost_race += lost;
  }
  // 4. Make the new tombstones durable before the old files (whose tombstones covered
  // the same values) disappear; the caller then retires them.
  Status s = log_->Sync();
  if (!s.ok()) return s;
  retired->insert(retired->end(), olds.begin(), olds.end());
  return Status::OK();
}

void SsdTier::GcLoop() {
  std::unique_lock<std::mutex> lock(gc_mu_);
  while (!gc_stop_) {
    gc_cv_.wait_for(lock, std::chrono::milliseconds(options_.gc_interval_ms),
                    [this] { return gc_stop_; });
    if (gc_stop_) break;
    lock.unlock();
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
    lock.lock();
  }
}

}  // namespace kvengine
