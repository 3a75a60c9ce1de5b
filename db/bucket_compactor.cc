#include "db/bucket_compactor.h"

#include <algorithm>
#include <functional>
#include <span>

#include "db/ssd_bucket.h"
#include "db/ssd_tier.h"
#include "util/logging.h"
#include "util/mutex.h"
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

// Reads a compaction's chunks, in order, on the compactor's chunk-reader thread, never
// waiting for the writer (the whole image is already allocated).  The destructor stops
// it after the chunk in progress and waits, so no read outlives the image it fills.
class ChunkReader {
 public:
  ChunkReader(WorkerThread* worker, size_t chunks, std::function<void(size_t)> read_chunk) {
    worker->Submit([this, chunks, read = std::move(read_chunk)] {
      for (size_t c = 0; c < chunks; c++) {
        {
          MutexLock lock(&mu_);
          if (stop_) break;
        }
        read(c);
        MutexLock lock(&mu_);
        done_ = c + 1;
        cv_.NotifyAll();
      }
      MutexLock lock(&mu_);
      finished_ = true;
      cv_.NotifyAll();
    });
  }
  ~ChunkReader() {
    MutexLock lock(&mu_);
    stop_ = true;
    while (!finished_) cv_.Wait(&mu_);
  }
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  // Blocks until chunk c has been read.
  void WaitFor(size_t c) {
    MutexLock lock(&mu_);
    while (done_ <= c) cv_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  size_t done_ GUARDED_BY(mu_) = 0;  // chunks read so far
  bool stop_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;  // the task has returned
};

// Chunks of consecutive entries of one old bucket (live[i] lies in source[i] and is
// placed at offsets[i]), each one batch of reads of at most kCompactionChunkBytes.
std::vector<CompactionChunk> PlanChunks(const std::vector<BucketEntry>& live,
                                        const std::vector<size_t>& source,
                                        const std::vector<uint64_t>& offsets, uint64_t values_end) {
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
    const uint64_t image_end =
        end == live.size() ? values_end : offsets[end] / kBucketAlignment * kBucketAlignment;
    chunks.push_back({begin, end, image_end});
    begin = end;
  }
  return chunks;
}

// Appends the image to `file` chunk by chunk, each as soon as `reader` has read it; the
// header goes with the first.
Status AppendChunks(const BucketBuilder& builder, const std::vector<CompactionChunk>& chunks,
                    ChunkReader* reader, WritableFile* file) {
  uint64_t appended = 0;
  for (size_t c = 0; c < chunks.size(); c++) {
    reader->WaitFor(c);
    if (chunks[c].image_end <= appended) continue;  // all in a page still being filled
    Status s = file->Append(Slice(builder.Data(appended), chunks[c].image_end - appended));
    if (!s.ok()) return s;
    appended = chunks[c].image_end;
  }
  return Status::OK();
}

void Unpin(const BucketCompactor::Buckets& buckets) {
  for (const auto& b : buckets) b->readers.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace

// The state of one group's compaction, filled in step by step.
struct BucketCompactor::Group {
  explicit Group(const Buckets& olds) : olds(olds) {}

  const Buckets& olds;
  bool pinned = false;  // each old bucket's readers count holds one for the compaction

  // Step 1: the entries the map still reaches.
  std::vector<BucketEntry> live;
  std::vector<size_t> source;  // live[i] lies in olds[source[i]]
  uint64_t live_space = 0;     // the image bytes they may take (MaxSpace each)
  uint64_t new_id = 0;         // the new bucket's, when something is live

  // Step 2: the new image, where each live value goes in it, and the reads filling it.
  std::shared_ptr<BucketBuilder> builder;
  std::vector<uint64_t> offsets;  // live[i] is placed at offsets[i]
  std::vector<MutableSlice> dests;
  std::vector<ValueRead> reads;
  std::vector<CompactionChunk> chunks;
  std::vector<BucketEntry> written;  // what the builder actually placed, key by key
  std::vector<size_t> written_source;
  std::shared_ptr<SsdBucket> fresh;  // the new bucket, once its file is in place
};

// ------------------------------------------------------------------ picking

BucketCompactor::Buckets BucketCompactor::PickLocked() {
  // REQUIRES (in the header, where SsdTier is incomplete): the tier's mu_ held.
  tier_->mu_.AssertHeld();
  const Options& options = tier_->options_;
  const bool pressure =
      options.ssd_capacity_bytes > 0 &&
      static_cast<double>(tier_->used_bytes_) >=
          options.gc_high_watermark_ratio * static_cast<double>(options.ssd_capacity_bytes);
  auto ratio = [](const SsdBucket& b, uint64_t bytes) {
    return b.total_bytes == 0 ? 1.0
                              : static_cast<double>(bytes) / static_cast<double>(b.total_bytes);
  };
  Buckets candidates;
  for (const auto& [id, b] : tier_->buckets_) {
    if (b->state != SsdBucket::State::kOnDisk || b->deleted_bytes == 0) continue;
    const uint64_t unreclaimed = b->unreclaimed_bytes();
    if ((unreclaimed > 0 && (pressure || ratio(*b, unreclaimed) >= options.gc_deleted_ratio)) ||
        ratio(*b, b->deleted_bytes) >= options.gc_merge_deleted_ratio) {
      candidates.push_back(b);
    }
  }
  AddTombstoneHeavyLocked(&candidates);
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return a->last_access < b->last_access; });
  if (candidates.size() > options.gc_max_buckets_per_round) {
    candidates.resize(options.gc_max_buckets_per_round);
  }
  for (const auto& b : candidates) b->compacting = true;
  return candidates;
}

void BucketCompactor::AddTombstoneHeavyLocked(Buckets* candidates) {
  // REQUIRES (in the header, where SsdTier is incomplete): the tier's mu_ held.
  tier_->mu_.AssertHeld();
  uint64_t tombstones = 0;
  for (const auto& [bucket, records] : tier_->tombstones_) tombstones += records.size();
  const uint64_t keys = tier_->map_.size();
  if (tombstones <= std::max<uint64_t>(keys, kTombstonesWorthMerging)) return;
  // The buckets holding the most tombstones per live byte cost the least to rewrite for
  // the memory they give back.
  struct Ranked {
    double weight;
    uint64_t tombstones;
    std::shared_ptr<SsdBucket> bucket;
  };
  std::vector<Ranked> ranked;
  for (const auto& [id, b] : tier_->buckets_) {
    auto t = tier_->tombstones_.find(id);
    if (b->state != SsdBucket::State::kOnDisk || t == tier_->tombstones_.end() ||
        t->second.empty() ||
        std::find(candidates->begin(), candidates->end(), b) != candidates->end()) {
      continue;
    }
    const uint64_t live = b->total_bytes - b->deleted_bytes;
    ranked.push_back({static_cast<double>(t->second.size()) / static_cast<double>(live + 1),
                      t->second.size(), b});
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const Ranked& a, const Ranked& b) { return a.weight > b.weight; });
  uint64_t excess = tombstones - keys;
  for (const Ranked& r : ranked) {
    if (excess == 0) break;
    candidates->push_back(r.bucket);
    excess -= std::min(excess, r.tombstones);
  }
}

// ------------------------------------------------------------------ compacting

Status BucketCompactor::Compact(Buckets picked, uint64_t* reclaimed, Buckets* retired) {
  *reclaimed = 0;
  Status first;
  // Sparse buckets are merged, as many as fit one bucket image, so that the fixed cost
  // of a compaction (three syncs and a verification read) is paid once for all of them.
  for (size_t begin = 0; begin < picked.size();) {
    Buckets group;
    uint64_t group_live = 0;
    for (size_t i = begin; i < picked.size(); i++) {
      uint64_t live;
      {
        MutexLock lock(&tier_->mu_);
        live = picked[i]->total_bytes - picked[i]->deleted_bytes;
      }
      if (!group.empty() && group_live + live > tier_->bucket_bytes_) break;
      group.push_back(picked[i]);
      group_live += live;
    }
    begin += group.size();
    uint64_t n = 0;
    Status s = CompactGroup(group, &n, retired);
    if (!s.ok()) {
      tier_->logger_->Logf(LogLevel::kError, "compacting %zu bucket(s) from %llu: %s", group.size(),
                           static_cast<unsigned long long>(group.front()->id),
                           s.ToString().c_str());
      if (first.ok()) first = s;
    }
    *reclaimed += n;
  }
  return first;
}

Status BucketCompactor::CompactGroup(const Buckets& olds, uint64_t* reclaimed, Buckets* retired) {
  PerfPoint perf(PerfKey::ssd_compaction);
  *reclaimed = 0;
  Group group(olds);
  Status s = CollectLive(&group);
  if (!s.ok()) return s;
  if (!group.live.empty()) {
    s = WriteImage(&group);
    if (!s.ok()) return s;
  }
  uint64_t lost = 0;
  ValidateAndSwap(&group, reclaimed, &lost);
  Unpin(olds);
  {
    MutexLock st(&tier_->stats_mu_);
    tier_->stats_.gc_buckets_compacted += olds.size();
    tier_->stats_.gc_bytes_reclaimed += *reclaimed;
    tier_->stats_.gc_keys_lost_race += lost;
  }
  // Make the new tombstones durable before the old files (whose tombstones covered
  // the same values) disappear; the caller then retires them.
  s = tier_->log_->Sync();
  if (!s.ok()) return s;
  retired->insert(retired->end(), olds.begin(), olds.end());
  return Status::OK();
}

Status BucketCompactor::GiveUp(Group* group, Status why) {
  if (group->pinned) Unpin(group->olds);
  MutexLock lock(&tier_->mu_);
  for (const auto& old : group->olds) old->compacting = false;
  return why;
}

// ------------------------------------------------------------------ 1. collect the live entries

Status BucketCompactor::CollectLive(Group* group) {
  // The indexes, from their files (no copy stays in RAM), each verified against its
  // checksum, read with no lock held: a bucket marked compacting is neither evicted nor
  // compacted elsewhere meanwhile.
  const Buckets& olds = group->olds;
  std::vector<std::vector<BucketEntry>> indexes(olds.size());
  for (size_t k = 0; k < olds.size(); k++) {
    Status s = tier_->ReadBucketIndex(*olds[k], &indexes[k]);
    if (!s.ok()) return GiveUp(group, s);
  }
  MutexLock lock(&tier_->mu_);
  for (size_t k = 0; k < olds.size(); k++) {
    for (BucketEntry& e : indexes[k]) {
      if (tier_->MapsToLocked(KeyFingerprint::Of(e.key), olds[k]->id, e.version)) {
        group->live_space += BucketBuilder::MaxSpace(e.size);
        group->live.push_back(std::move(e));
        group->source.push_back(k);
      }
    }
    olds[k]->readers.fetch_add(1, std::memory_order_acq_rel);  // keeps the file in place
  }
  group->pinned = true;
  if (!group->live.empty()) group->new_id = tier_->next_bucket_id_++;
  return Status::OK();
}

// ------------------------------------------------------------------ 2. write the new bucket image

Status BucketCompactor::WriteImage(Group* group) {
  Status s = PlaceValues(group);
  if (!s.ok()) return GiveUp(group, s);
  group->chunks =
      PlanChunks(group->live, group->source, group->offsets, group->builder->values_end());
  uint64_t file_size = 0;
  std::unique_ptr<BucketReader> reader;
  {
    // A helper thread reads the chunks in order while this one appends each finished
    // chunk to the new file, so the disk reads and writes at once.
    ChunkReader chunk_reader(&chunk_reader_, group->chunks.size(),
                             [this, group](size_t c) { ReadChunk(group, c); });
    auto append_image = [&](WritableFile* file) {
      Status st = AppendChunks(*group->builder, group->chunks, &chunk_reader, file);
      // Only now are the reads' results known: the index lists what was read intact.
      if (st.ok()) ListWritten(group);
      return st;
    };
    s = tier_->WriteBucketFile(*group->builder, group->written, &file_size, &reader, append_image);
  }
  if (!s.ok()) return GiveUp(group, s);
  // The image goes back to the pool; the reads that filled it are done.
  group->reads.clear();
  group->dests.clear();
  group->builder.reset();
  auto fresh = std::make_shared<SsdBucket>();
  fresh->id = group->new_id;
  fresh->state = SsdBucket::State::kOnDisk;
  fresh->reader = std::move(reader);
  fresh->file_size = file_size;
  fresh->opened_micros = tier_->env_->NowMicros();
  group->fresh = std::move(fresh);
  MutexLock st(&tier_->stats_mu_);
  tier_->stats_.gc_bytes_rewritten += file_size;
  return Status::OK();
}

Status BucketCompactor::PlaceValues(Group* group) {
  Status s = tier_->NewBuilder(
      group->new_id, kBucketHeaderSize + group->live_space + kBucketAlignment, &group->builder);
  if (!s.ok()) return s;
  const size_t n = group->live.size();
  group->offsets.resize(n);
  group->dests.resize(n);
  group->reads.resize(n);
  for (size_t i = 0; i < n; i++) {
    const BucketEntry& e = group->live[i];
    // Cannot fail: the image has room for every value's MaxSpace and a page.
    if (!group->builder->Reserve(e.size, &group->offsets[i])) {
      return Status::Corruption("GC: compaction image too small");
    }
    // The padded length keeps the read aligned: the source's padding is zeros too, and
    // at least as long (a unit of its format is never smaller than the current one).
    group->dests[i] = MutableSlice(group->builder->MutableData(group->offsets[i]),
                                   PaddedValueSize(kBucketFormatVersion, e.size));
    ValueRead& r = group->reads[i];
    r.offset = e.offset;
    r.size = e.size;
    r.checksum = e.checksum;
    r.key = e.key;
    r.dest = std::span<const MutableSlice>(&group->dests[i], 1);
  }
  return Status::OK();
}

void BucketCompactor::ReadChunk(Group* group, size_t c) {
  const CompactionChunk& chunk = group->chunks[c];
  const SsdBucket& old = *group->olds[group->source[chunk.begin]];
  const std::span<ValueRead> batch(group->reads.data() + chunk.begin, chunk.end - chunk.begin);
  // The old file is pinned for this chunk only: a merge of many small buckets never
  // holds all their files.
  BucketFileCache::Handle file;
  Status s = tier_->BucketFile(old.id, &file);
  if (!s.ok()) {
    for (ValueRead& r : batch) r.status = s;
    return;
  }
  old.reader->ReadValues(tier_->env_, *file, batch, /*verify=*/true);
}

void BucketCompactor::ListWritten(Group* group) {
  for (size_t i = 0; i < group->live.size(); i++) {
    if (!group->reads[i].status.ok()) {
      // A value that fails its checksum cannot be carried over; it was unreadable
      // anyway.  It leaves the map (tombstoned) in ValidateAndSwap.
      tier_->logger_->Logf(LogLevel::kError, "GC: dropping unreadable value: %s",
                           group->reads[i].status.ToString().c_str());
      continue;
    }
    BucketEntry e = group->live[i];
    e.offset = group->offsets[i];
    if (group->olds[group->source[i]]->reader->header().format_version != kBucketFormatVersion) {
      // From a bucket of an older format: checksummed as the new bucket's format says.
      e.checksum = BucketEntryChecksum(kBucketFormatVersion, e.key,
                                       group->builder->Data(group->offsets[i]), e.size);
    }
    group->written.push_back(std::move(e));
    group->written_source.push_back(group->source[i]);
  }
}

// ------------------------------------------------------------------ 3. validate and swap

void BucketCompactor::ValidateAndSwap(Group* group, uint64_t* reclaimed, uint64_t* lost) {
  MutexLock lock(&tier_->mu_);
  if (group->fresh != nullptr) SwapSurvivorsLocked(group, lost);
  // Entries that could not be read: dropped from the map so no one reads garbage (the
  // others no longer map to an old bucket).
  for (size_t i = 0; i < group->live.size(); i++) {
    const BucketEntry& e = group->live[i];
    const KeyFingerprint fp = KeyFingerprint::Of(e.key);
    SsdLocation loc;
    if (tier_->map_.Find(fp, &loc) && loc.bucket == group->olds[group->source[i]]->id &&
        loc.version == e.version) {
      tier_->RemoveLocked(e.key, fp, loc, /*tombstone=*/true);
    }
  }
  uint64_t old_bytes = 0;
  for (const auto& old : group->olds) {
    tier_->DropTallyLocked(old.get());  // empty unless restored approximately
    tier_->buckets_.erase(old->id);
    tier_->used_bytes_ -= old->allocated_bytes();
    old_bytes += old->allocated_bytes();
  }
  const uint64_t new_bytes = group->fresh != nullptr ? group->fresh->file_size : 0;
  *reclaimed = old_bytes > new_bytes ? old_bytes - new_bytes : 0;
}

void BucketCompactor::SwapSurvivorsLocked(Group* group, uint64_t* lost) {
  // REQUIRES (in the header, where SsdTier is incomplete): the tier's mu_ held.
  tier_->mu_.AssertHeld();
  SsdBucket* fresh = group->fresh.get();
  tier_->checkpoint_backlog_ += group->written.size();
  for (const auto& old : group->olds) {
    fresh->last_access = std::max(fresh->last_access, old->last_access);
  }
  for (size_t i = 0; i < group->written.size(); i++) {
    const BucketEntry& e = group->written[i];
    fresh->keys++;
    fresh->total_bytes += e.size;
    const KeyFingerprint fp = KeyFingerprint::Of(e.key);
    const SsdLocation here{fresh->id, e.offset, e.size, e.version, e.checksum};
    // Compare and swap: old location -> new, only if the key still maps to the old
    // bucket with the same version; a concurrent delete or overwrite wins.
    SsdBucket* old = group->olds[group->written_source[i]].get();
    if (tier_->MapsToLocked(fp, old->id, e.version)) {
      tier_->map_.Put(fp, here);
      fresh->live_keys++;
      tier_->TallyLocked(old, e.key, e.size, /*add=*/false);
      tier_->TallyLocked(fresh, e.key, e.size, /*add=*/true);
    } else {
      fresh->deleted_bytes += e.size;
      tier_->TombstoneLocked(e.key, here);
      (*lost)++;
    }
  }
  tier_->buckets_[fresh->id] = group->fresh;
  tier_->used_bytes_ += fresh->file_size;
}

}  // namespace kvengine
