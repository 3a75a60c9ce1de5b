#include "db/ssd_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "db/evicted_keys.h"
#include "db/map_checkpoint.h"
#include "db/removal_feed.h"
#include "db/ssd_bucket.h"
#include "env/descriptor_budget.h"
#include "env/heap_release.h"
#include "util/buffers.h"
#include "util/config_parse.h"
#include "util/grace_period.h"
#include "util/hash.h"
#include "util/huge_array.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/perf_point.h"

namespace kvengine {

namespace {
// Sealed buckets waiting for the writer before Stage() waits: bounds the memory held by
// images when the disk is slower than the offload rate.
constexpr size_t kMaxSealedBuckets = 3;
// Bucket writers: while one syncs, renames and verifies its file, the other keeps the
// disk busy with data.
constexpr int kWriterThreads = 2;
// How long the writer waits before retrying a bucket whose write failed.
constexpr auto kWriteRetryDelay = std::chrono::milliseconds(200);
}  // namespace

// A few bucket-sized images, recycled.  Shared with the builders' deleters, so an image
// returns here whenever its last reader lets go of it.
class SsdTier::ImagePool {
 public:
  explicit ImagePool(uint64_t image_bytes) : image_bytes_(image_bytes) {}
  // An image of exactly the standard size, recycled when one is free.
  Status Get(AlignedBuffer* image) {
    {
      MutexLock lock(&mu_);
      if (!free_.empty()) {
        *image = std::move(free_.back());
        free_.pop_back();
        return Status::OK();
      }
    }
    if (!image->TryAllocate(image_bytes_)) {
      return Status::NoSpace("cannot allocate a bucket image of " + FormatSize(image_bytes_));
    }
    return Status::OK();
  }
  void Put(AlignedBuffer image) {
    MutexLock lock(&mu_);
    if (image.capacity() == RoundUpTo(image_bytes_, AlignedBuffer::kAlignment) &&
        free_.size() < kKeep) {
      free_.push_back(std::move(image));
    }
  }
  uint64_t image_bytes() const { return image_bytes_; }

 private:
  static constexpr size_t kKeep = 5;  // the open bucket, three sealed ones, one being read
  const uint64_t image_bytes_;
  Mutex mu_;
  std::vector<AlignedBuffer> free_;
};

SsdTier::SsdTier(const Options& options, std::string dir, Env* env, Logger* logger)
    : options_(options), dir_(std::move(dir)), base_env_(env), env_(env), logger_(logger) {
  file_options_.use_direct_io = options.use_direct_io;
  bucket_bytes_ = std::min<uint64_t>(options.bucket_size_limit,
                                     std::max<uint64_t>(64 << 10, options.ssd_capacity_bytes / 4));
  image_pool_ = std::make_shared<ImagePool>(bucket_bytes_);
}

Status SsdTier::Open(const Options& options, const std::string& dir, Env* env, Logger* logger,
                     std::unique_ptr<SsdTier>* result, NamespaceUsage* usage) {
  result->reset();
  std::unique_ptr<SsdTier> tier(new SsdTier(options, dir, env, logger));
  if (usage == nullptr) {
    tier->own_usage_ = std::make_unique<NamespaceUsage>(options.memory_capacity_bytes);
    usage = tier->own_usage_.get();
  }
  tier->usage_ = usage;
  if (options.use_io_uring) {
    std::string why;
    tier->uring_env_ = Env::NewIoUringEnv(env, &why);
    if (tier->uring_env_ != nullptr) {
      tier->env_ = tier->uring_env_.get();
    } else {
      logger->Logf(LogLevel::kWarn, "use_io_uring: io_uring unavailable (%s); using pread/pwrite",
                   why.c_str());
    }
  }
  // Descriptors from the process limit: the cache never takes what the rest of the
  // process needs, so that no open, read or put fails with EMFILE.
  const DescriptorBudget budget = DescriptorBudget::Plan(env, options.max_open_files);
  if (budget.clamped) {
    logger->Logf(LogLevel::kWarn,
                 "descriptor budget: RLIMIT_NOFILE is %llu with %llu in use; the engine takes "
                 "at most %llu (a headroom of %llu left to the process): max_open_files %llu "
                 "is clamped to %llu bucket files, %llu io_uring rings",
                 static_cast<unsigned long long>(budget.limit),
                 static_cast<unsigned long long>(budget.in_use),
                 static_cast<unsigned long long>(budget.engine),
                 static_cast<unsigned long long>(budget.headroom),
                 static_cast<unsigned long long>(options.max_open_files),
                 static_cast<unsigned long long>(budget.bucket_files),
                 static_cast<unsigned long long>(budget.rings));
  }
  if (budget.known) SetIoUringRingLimit(budget.rings);
  {
    MutexLock lock(&tier->stats_mu_);
    tier->stats_.max_open_files = budget.bucket_files;
    tier->stats_.descriptor_limit = budget.known ? budget.limit : 0;
    tier->stats_.descriptor_budget = budget.known ? budget.engine : 0;
  }
  tier->file_cache_ =
      std::make_unique<BucketFileCache>(tier->env_, tier->file_options_, budget.bucket_files);
  const uint64_t start = env->NowMicros();
  Status s = tier->Recover();
  // Recovery's bucket indexes, read on several threads and dropped: not kept resident.
  ReleaseFreeHeap();
  {
    MutexLock lock(&tier->stats_mu_);
    tier->stats_.open_micros = env->NowMicros() - start;
  }
  if (!s.ok()) {
    // Nothing was started and the tombstone log may not be open: the destructor must
    // not flush what recovery left half-built.
    MutexLock lock(&tier->mu_);
    tier->stopping_ = true;
    return s;
  }
  for (int i = 0; i < kWriterThreads; i++) {
    tier->writers_.emplace_back([t = tier.get(), i] { t->WriterLoop(i); });
  }
  if (options.gc_interval_ms > 0) tier->gc_ = std::thread([t = tier.get()] { t->GcLoop(); });
  *result = std::move(tier);
  return Status::OK();
}

SsdTier::~SsdTier() { Close(); }

Status SsdTier::Close() {
  Status s;
  {
    MutexLock lock(&mu_);
    if (stopping_) return Status::OK();
  }
  const uint64_t start = env_->NowMicros();
  s = Flush();
  {
    MutexLock lock(&gc_mu_);
    gc_stop_ = true;
  }
  gc_cv_.NotifyAll();
  if (gc_.joinable()) gc_.join();
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  writer_cv_.NotifyAll();
  written_cv_.NotifyAll();
  for (std::thread& w : writers_) w.join();
  writers_.clear();
  closer_.Drain();  // no retired file stays open past Close
  const uint64_t stopped = env_->NowMicros();
  if (s.ok()) {
    Status c = WriteCheckpoint();
    if (!c.ok()) {  // the next Open reads every bucket instead
      logger_->Logf(LogLevel::kWarn, "map checkpoint not written: %s", c.ToString().c_str());
    }
  }
  const uint64_t end = env_->NowMicros();
  logger_->Logf(LogLevel::kDebug,
                "SSD tier closed in %.3f s: flush and threads %.3f s, map checkpoint %.3f s",
                static_cast<double>(end - start) / 1e6, static_cast<double>(stopped - start) / 1e6,
                static_cast<double>(end - stopped) / 1e6);
  return s;
}

std::string SsdTier::BucketPath(uint64_t id) const { return dir_ + "/" + BucketFileName(id); }

// ------------------------------------------------------------------ staging and the map

Status SsdTier::Stage(const Slice& key, std::span<const Slice> parts, uint64_t size, Ticket* ticket,
                      StageWait wait) {
  PerfPoint perf(PerfKey::ssd_offload);
  std::shared_ptr<SsdBucket> bucket;
  uint64_t offset = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;  // the first look's
  // Once, but again when another thread took the open bucket's last room, or when the
  // room to open a bucket is held by buckets the writer has yet to write.
  for (;;) {
    MutexLock lock(&mu_);
    if (stopping_) return Status::Aborted("SSD tier is closed");
    if (!SsdIndex::Fits(SsdLocation{next_bucket_id_, 0, size, 0, 0})) {
      return Status::NoSpace("a value of " + std::to_string(size) +
                             " bytes does not fit the SSD tier's map (4 GiB - 1 at most)");
    }
    if (Status q = MakeNamespaceRoomLocked(key.view(), size); !q.ok()) {
      MutexLock st(&stats_mu_);
      stats_.offload_failures++;
      return q;
    }
    // A value that does not fit the open bucket seals it; one larger than
    // bucket_size_limit gets a bucket of its own.
    if (open_ != nullptr && (!open_->builder->Fits(size) ||
                             open_->keys + open_->staging >= options_.bucket_keys_limit)) {
      SealOpenLocked();
    }
    // Backpressure: wait while the writer is behind.  A writer out of file descriptors
    // will not catch up by waiting: that fails at once, naming the cause.
    auto out_of_descriptors = [this]() REQUIRES(mu_) {
      return sealed_.size() >= kMaxSealedBuckets && IsTooManyOpenFiles(writer_error_);
    };
    auto has_room = [&]() REQUIRES(mu_) {
      return sealed_.size() < kMaxSealedBuckets || stopping_ || out_of_descriptors();
    };
    const auto now = std::chrono::steady_clock::now();
    const bool put = wait == StageWait::kPut;
    if (!deadline) {
      deadline = !put                          ? now + kFlushStageWait
                 : now < puts_skip_wait_until_ ? now
                                               : now + kPutStageWait;
    }
    const auto stage_deadline = *deadline;
    while (!has_room() && written_cv_.WaitUntil(&mu_, stage_deadline)) {
    }
    if (put && !has_room() && stage_deadline > now) {
      puts_skip_wait_until_ = std::chrono::steady_clock::now() + kBehindBackoff;
    }
    if (!has_room() || out_of_descriptors()) {
      MutexLock s(&stats_mu_);
      stats_.offload_failures++;
      if (out_of_descriptors()) {
        return Status::IOError(
            "SSD writer cannot open a bucket file",
            writer_error_.ToString() + "; raise ulimit -n or lower max_open_files");
      }
      return Status::NoSpace("SSD writer is behind or failing",
                             writer_error_.ok() ? "timed out" : writer_error_.ToString());
    }
    if (stopping_) return Status::Aborted("SSD tier is closed");
    if (open_ == nullptr) {
      const uint64_t capacity =
          std::max<uint64_t>(bucket_bytes_, kBucketHeaderSize + RoundUpTo(size, kBucketAlignment));
      Status s = MakeRoomLocked(capacity);
      if (!s.ok() && may_evict() && !sealed_.empty() && writer_error_.ok() && !stopping_ &&
          std::chrono::steady_clock::now() < stage_deadline) {
        // What could be evicted is in buckets the writer has not written yet (a slow or
        // busy disk, a small tier): they can go once written, so this waits for the
        // writer, as the backpressure above does, instead of failing a Flush or a put
        // that only a writer behind kept from fitting.
        written_cv_.WaitUntil(&mu_, stage_deadline);
        continue;
      }
      if (!s.ok()) {
        MutexLock st(&stats_mu_);
        stats_.offload_failures++;
        return s;
      }
      if (open_ == nullptr) {  // MakeRoomLocked may have let another thread open one
        auto b = std::make_shared<SsdBucket>();
        s = NewBuilder(next_bucket_id_, capacity, &b->builder);
        if (!s.ok()) return s;
        b->id = next_bucket_id_++;
        b->opened_micros = env_->NowMicros();
        b->last_access = ++access_clock_;
        buckets_[b->id] = b;
        open_ = b;
        used_bytes_ += capacity;  // reserved until the file's real size is known
      }
    }
    if (!open_->builder->Reserve(size, &offset)) {
      // Another staging thread took the last room while this one waited for the writer
      // (the wait lets go of mu_): seal it and start again.  Not by calling Stage here:
      // mu_ is held, and taking it again deadlocked the thread on itself.
      SealOpenLocked();
      continue;
    }
    bucket = open_;
    bucket->staging++;
    break;
  }
  char* dst = bucket->builder->MutableData(offset);
  for (const Slice& p : parts) {
    if (p.size() != 0) std::memcpy(dst, p.data(), p.size());
    dst += p.size();
  }
  ticket->bucket_ = std::move(bucket);
  ticket->key_.assign(key.data(), key.size());
  ticket->offset_ = offset;
  ticket->size_ = size;
  ticket->checksum_ = BucketEntryChecksum(kBucketFormatVersion, ticket->key_,
                                          ticket->bucket_->builder->Data(offset), size);
  return Status::OK();
}

void SsdTier::Commit(Ticket* ticket, uint64_t version) {
  MutexLock lock(&mu_);
  SsdBucket* b = ticket->bucket_.get();
  const KeyFingerprint fp = KeyFingerprint::Of(ticket->key_);
  SsdLocation cur;
  if (map_.Find(fp, &cur)) {
    if (cur.version >= version) {
      // A newer value already won (cannot happen under the caller's key lock, but a
      // stale commit must never replace it), or this very write is already here: a Flush
      // and an eviction both staged it.  Keep the copy that is there: a tombstone names
      // the write, not the copy, so tombstoning it would bury this one too at Open.
      b->staging--;
      b->total_bytes += ticket->size_;
      b->deleted_bytes += ticket->size_;
      written_cv_.NotifyAll();
      ticket->bucket_.reset();
      return;
    }
    RemoveLocked(ticket->key_, fp, cur, /*tombstone=*/true);
  }
  BucketEntry e;
  e.key = ticket->key_;
  e.offset = ticket->offset_;
  e.size = ticket->size_;
  e.version = version;
  e.checksum = ticket->checksum_;
  b->keys++;
  b->live_keys++;
  b->total_bytes += e.size;
  TallyLocked(b, e.key, e.size, /*add=*/true);
  b->staged.push_back(std::move(e));
  b->staging--;
  max_version_ = std::max(max_version_, version);
  map_.Put(fp, SsdLocation{b->id, ticket->offset_, ticket->size_, version, ticket->checksum_});
  {
    MutexLock s(&stats_mu_);
    stats_.offloads++;
    stats_.offload_bytes += ticket->size_;
  }
  if (b == open_.get() && b->keys >= options_.bucket_keys_limit) SealOpenLocked();
  written_cv_.NotifyAll();  // a sealed bucket may be waiting for its last ticket
  ticket->bucket_.reset();
}

void SsdTier::Abort(Ticket* ticket) {
  if (!ticket->valid()) return;
  MutexLock lock(&mu_);
  ticket->bucket_->staging--;
  written_cv_.NotifyAll();
  ticket->bucket_.reset();
}

void SsdTier::TombstoneLocked(const std::string& key, const SsdLocation& loc) {
  PerfPoint perf(PerfKey::ssd_tombstone_append);
  std::vector<uint64_t> holders = {loc.bucket};
  if (auto d = duplicates_.find(key); d != duplicates_.end()) {
    for (uint64_t b : d->second) {
      if (buckets_.count(b) != 0) holders.push_back(b);
    }
    duplicates_.erase(d);
  }
  for (uint64_t bucket : holders) {
    TombstoneLog::Record r{key, loc.version, bucket};
    log_->Add(r);
    tombstones_[bucket].push_back(std::move(r));
  }
  // The value's own blocks can go once the tombstone is durable (copies left by a crash
  // are compacted away instead).  A bucket not yet on disk keeps its dead bytes until a
  // compaction.
  if (auto b = buckets_.find(loc.bucket);
      b != buckets_.end() && b->second->state == SsdBucket::State::kOnDisk) {
    QueueHoleLocked(b->second.get(), loc.offset, loc.size);
  }
}

void SsdTier::QueueHoleLocked(SsdBucket* bucket, uint64_t offset, uint64_t size) {
  if (options_.gc_punch_holes) {
    bucket->dead_extents.push_back({offset, PaddedValueSize(bucket->format_version(), size), size});
  }
}

void SsdTier::RemoveLocked(const std::string& key, const KeyFingerprint& fp, const SsdLocation& loc,
                           bool tombstone) {
  auto b = buckets_.find(loc.bucket);
  if (b != buckets_.end()) {
    b->second->deleted_bytes += loc.size;
    b->second->live_keys--;
    TallyLocked(b->second.get(), key, loc.size, /*add=*/false);
  }
  if (tombstone) TombstoneLocked(key, loc);
  map_.Erase(fp);
}

bool SsdTier::MapsToLocked(const KeyFingerprint& fp, uint64_t bucket, uint64_t version) const {
  SsdLocation loc;
  return map_.Find(fp, &loc) && loc.bucket == bucket && loc.version == version;
}

bool SsdTier::HasVersion(const Slice& key, uint64_t version) {
  const KeyFingerprint fp = KeyFingerprint::Of(std::string_view(key.data(), key.size()));
  MutexLock lock(&mu_);
  SsdLocation loc;
  return map_.Find(fp, &loc) && loc.version == version;
}

bool SsdTier::Contains(const Slice& key) {
  SsdLocation loc;
  return Locate(key, &loc);
}

bool SsdTier::Locate(const Slice& key, SsdLocation* location) {
  const KeyFingerprint fp = KeyFingerprint::Of(std::string_view(key.data(), key.size()));
  MutexLock lock(&mu_);
  return map_.Find(fp, location);
}

void SsdTier::EraseOlderThan(const Slice& key, uint64_t version) {
  const KeyFingerprint fp = KeyFingerprint::Of(std::string_view(key.data(), key.size()));
  MutexLock lock(&mu_);
  SsdLocation loc;
  if (map_.Find(fp, &loc) && loc.version < version) {
    RemoveLocked(key.ToString(), fp, loc, /*tombstone=*/true);
    // The key left this tier (its new value is in memory only): a subscriber that
    // indexes the SSD tier must hear of it, or it keeps an entry no read can serve.
    if (removal_feed_ != nullptr) {
      removal_feed_->Record(key.view(), RemovalEvent::kSsd, RemovalEvent::kDeleted);
    }
  }
}

bool SsdTier::Erase(const Slice& key) {
  const KeyFingerprint fp = KeyFingerprint::Of(std::string_view(key.data(), key.size()));
  MutexLock lock(&mu_);
  SsdLocation loc;
  if (!map_.Find(fp, &loc)) return false;
  RemoveLocked(key.ToString(), fp, loc, /*tombstone=*/true);
  if (removal_feed_ != nullptr) {
    removal_feed_->Record(key.view(), RemovalEvent::kSsd, RemovalEvent::kDeleted);
  }
  return true;
}

void SsdTier::ForEachKey(const std::function<void(const std::string&)>& fn) {
  // No compaction moves a key between buckets meanwhile, so a key alive in a bucket read
  // below is found there (an eviction may still drop it: then it is gone anyway).
  MutexLock round(&gc_mu_);
  std::vector<std::shared_ptr<SsdBucket>> on_disk;
  std::vector<std::string> keys;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, b] : buckets_) {
      if (b->state == SsdBucket::State::kOnDisk) {
        on_disk.push_back(b);
        continue;
      }
      for (const BucketEntry& e : b->staged) {  // a pending bucket's keys are in RAM
        if (MapsToLocked(KeyFingerprint::Of(e.key), b->id, e.version)) keys.push_back(e.key);
      }
    }
  }
  for (const std::string& key : keys) fn(key);
  for (const auto& b : on_disk) {
    std::vector<BucketEntry> entries;
    Status s = ReadBucketIndex(*b, &entries);
    if (!s.ok()) {
      MutexLock lock(&mu_);
      if (buckets_.count(b->id) == 0) continue;  // evicted meanwhile: its keys are gone
      logger_->Logf(LogLevel::kError, "listing keys: bucket %llu: %s",
                    static_cast<unsigned long long>(b->id), s.ToString().c_str());
      continue;
    }
    keys.clear();
    {
      MutexLock lock(&mu_);
      for (BucketEntry& e : entries) {
        if (MapsToLocked(KeyFingerprint::Of(e.key), b->id, e.version)) {
          keys.push_back(std::move(e.key));
        }
      }
    }
    for (const std::string& key : keys) fn(key);
  }
}

// ------------------------------------------------------------------ reads

void SsdTier::MultiGet(std::span<Read> reads, bool verify_checksums, const ReadDone& on_read) {
  PerfPoint perf(PerfKey::ssd_bucket_read);
  struct Pending {
    size_t read;  // index into reads
    std::shared_ptr<SsdBucket> bucket;
    std::shared_ptr<BucketBuilder> image;  // set when served from memory
    SsdLocation loc;
    BucketFileCache::Handle file;  // else: the bucket's file, pinned until the read is done
  };
  std::vector<Pending> pending;
  // Entered before the locations are looked up: a hole is punched over a dead value
  // only once every read that might have found it has finished.
  GracePeriodReader in_flight(&readers_);
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < reads.size(); i++) {
      Read& r = reads[i];
      SsdLocation loc;
      if (!map_.Find(KeyFingerprint::Of(std::string_view(r.key.data(), r.key.size())), &loc)) {
        r.status = Status::NotFound("key not on SSD");
        continue;
      }
      r.size = loc.size;
      r.version = loc.version;
      uint64_t capacity = 0;
      for (const MutableSlice& d : r.dest) capacity += d.size();
      if (capacity < loc.size) {
        r.status = Status::BufferTooSmall("value is " + std::to_string(loc.size) +
                                          " bytes; buffers hold " + std::to_string(capacity));
        continue;
      }
      std::shared_ptr<SsdBucket> b = buckets_.at(loc.bucket);
      b->last_access = ++access_clock_;
      Pending p{i, b, b->builder, loc, nullptr};
      if (p.image == nullptr) b->readers.fetch_add(1, std::memory_order_acq_rel);
      pending.push_back(std::move(p));
    }
  }
  // Values still in an image are copied; the rest are read from their files as one batch.
  std::vector<ValueRead> file_reads;
  std::vector<size_t> file_owner;
  for (size_t k = 0; k < pending.size(); k++) {
    Pending& p = pending[k];
    Read& r = reads[p.read];
    if (p.image != nullptr) {
      ScatterCopy(p.image->Data(p.loc.offset), p.loc.size, r.dest);
      r.status = Status::OK();
      if (on_read) on_read(p.read);
      continue;
    }
    // Reads of one batch often share buckets: the previous read's handle saves a lookup.
    if (k > 0 && pending[k - 1].bucket == p.bucket && pending[k - 1].file != nullptr) {
      p.file = pending[k - 1].file;
    } else {
      r.status = BucketFile(p.bucket->id, &p.file);
      if (!r.status.ok()) {
        p.bucket->readers.fetch_sub(1, std::memory_order_acq_rel);
        continue;
      }
    }
    ValueRead v;
    v.offset = p.loc.offset;
    v.size = p.loc.size;
    v.checksum = p.loc.checksum;
    v.checksum_mask = SsdIndex::kChecksumMask;  // the map keeps the low 32 bits
    // The entry checksum covers the key (format v2): a read that reached another key's
    // value through a fingerprint collision fails verification instead of returning it.
    v.key = std::string_view(r.key.data(), r.key.size());
    v.dest = r.dest;
    file_reads.push_back(v);
    file_owner.push_back(k);
  }
  if (!file_reads.empty()) {
    // One submission for all of them, whatever bucket each is in.  Each value is
    // finished (checksum, bounce copy, unpinned, handed to on_read) as soon as its last
    // request completes, while the others are still in flight.
    std::vector<BucketReader::Plan> plans(file_reads.size());
    std::vector<ReadRequest> all;
    std::vector<size_t> request_owner;  // all[i] belongs to file_reads[request_owner[i]]
    std::vector<size_t> first_request(file_reads.size()), outstanding(file_reads.size(), 0);
    auto finish = [&](size_t j) {
      Pending& p = pending[file_owner[j]];
      if (file_reads[j].status.ok()) {
        for (size_t i = 0; i < plans[j].requests.size(); i++) {
          plans[j].requests[i] = std::move(all[first_request[j] + i]);
        }
        file_reads[j].status =
            p.bucket->reader->FinishRead(file_reads[j], &plans[j], verify_checksums);
      }
      reads[p.read].status = file_reads[j].status;
      p.file.reset();
      p.bucket->readers.fetch_sub(1, std::memory_order_acq_rel);
      if (on_read && reads[p.read].status.ok()) on_read(p.read);
    };
    for (size_t j = 0; j < file_reads.size(); j++) {
      const Pending& p = pending[file_owner[j]];
      file_reads[j].status = p.bucket->reader->PlanRead(*p.file, file_reads[j], &plans[j]);
      first_request[j] = all.size();
      if (file_reads[j].status.ok()) {
        all.insert(all.end(), plans[j].requests.begin(), plans[j].requests.end());
        outstanding[j] = plans[j].requests.size();
        request_owner.insert(request_owner.end(), plans[j].requests.size(), j);
      }
      if (outstanding[j] == 0) finish(j);  // nothing to read (it failed to plan)
    }
    env_->MultiRead(all.data(), all.size(), [&](size_t i) {
      const size_t j = request_owner[i];
      if (--outstanding[j] == 0) finish(j);
    });
  }
  MutexLock s(&stats_mu_);
  for (const Pending& p : pending) {
    const Read& r = reads[p.read];
    if (r.status.ok()) {
      stats_.reads++;
      stats_.read_bytes += r.size;
    } else {
      stats_.read_errors++;
    }
  }
}

// ------------------------------------------------------------------ sealing and writing

void SsdTier::SealOpenLocked() {
  if (open_ == nullptr) return;
  open_->state = SsdBucket::State::kSealed;
  sealed_.push_back(open_);
  open_.reset();
  writer_cv_.NotifyAll();
}

Status SsdTier::WriteBucket(const std::shared_ptr<SsdBucket>& bucket) {
  PerfPoint perf(PerfKey::ssd_bucket_write);
  std::vector<BucketEntry> entries;
  {
    MutexLock lock(&mu_);
    while (bucket->staging != 0) written_cv_.Wait(&mu_);
    // Only values the map still reaches go into the index; the rest are dead already.
    for (const BucketEntry& e : bucket->staged) {
      if (MapsToLocked(KeyFingerprint::Of(e.key), bucket->id, e.version)) entries.push_back(e);
    }
  }
  // The tombstones of the older versions this bucket's values supersede are durable
  // before it is: should the bucket be lost to damage, those versions stay dead.
  Status s = log_->Sync();
  if (!s.ok()) return s;
  uint64_t file_size = 0;
  std::unique_ptr<BucketReader> reader;
  s = WriteBucketFile(*bucket->builder, entries, &file_size, &reader);
  if (!s.ok()) return s;
  MutexLock lock(&mu_);
  used_bytes_ -= bucket->builder->capacity();
  used_bytes_ += file_size;
  checkpoint_backlog_ += entries.size();
  bucket->file_size = file_size;
  bucket->reader = std::move(reader);
  bucket->builder.reset();  // readers holding the image keep it until they finish
  bucket->state = SsdBucket::State::kOnDisk;
  // Values that died while the bucket was pending are in the file all the same (left
  // out of its index, or removed since): their blocks can go too.
  for (const BucketEntry& e : bucket->staged) {
    if (!MapsToLocked(KeyFingerprint::Of(e.key), bucket->id, e.version)) {
      QueueHoleLocked(bucket.get(), e.offset, e.size);
    }
  }
  bucket->staged.clear();
  bucket->staged.shrink_to_fit();
  return Status::OK();
}

Status SsdTier::NewBuilder(uint64_t id, uint64_t capacity, std::shared_ptr<BucketBuilder>* result) {
  AlignedBuffer image;
  Status s = capacity <= bucket_bytes_ ? image_pool_->Get(&image)
             : image.TryAllocate(capacity)
                 ? Status::OK()
                 : Status::NoSpace("cannot allocate a bucket image of " + FormatSize(capacity));
  if (!s.ok()) return s;
  BucketBuilder* builder =
      BucketBuilder::CreateIn(id, std::move(image), env_->NowMicros()).release();
  *result = std::shared_ptr<BucketBuilder>(builder, [pool = image_pool_](BucketBuilder* p) {
    pool->Put(p->TakeImage());
    delete p;
  });
  return Status::OK();
}

Status SsdTier::WriteBucketFile(const BucketBuilder& builder,
                                const std::vector<BucketEntry>& entries, uint64_t* file_size,
                                std::unique_ptr<BucketReader>* reader,
                                const ImageAppender& append_image) {
  const std::string path = BucketPath(builder.id());
  const std::string tmp = path + ".tmp";
  std::unique_ptr<WritableFile> file;
  Status s = env_->NewWritableFile(tmp, file_options_, &file);
  if (IsTooManyOpenFiles(s)) {
    file_cache_->CloseUnused();  // the bucket files nobody reads give their descriptors
    s = env_->NewWritableFile(tmp, file_options_, &file);
  }
  if (s.ok()) {
    s = append_image ? append_image(file.get())
                     : file->Append(Slice(builder.Data(0), builder.values_end()));
  }
  if (s.ok()) s = builder.WriteIndex(file.get(), entries, file_size);
  file.reset();
  if (s.ok()) s = env_->RenameFile(tmp, path);
  if (s.ok()) s = env_->SyncDir(dir_);
  // Reading it back verifies what reached the disk before anyone relies on it.
  if (s.ok()) s = BucketReader::Open(env_, path, file_options_, reader);
  if (!s.ok()) {
    env_->RemoveFile(tmp);
    env_->RemoveFile(path);
    return s;
  }
  // Its first reads are likely soon (a compaction's output is read back): keep it open.
  // Its index stays on disk: the map holds what reads need.
  file_cache_->Insert(builder.id(), (*reader)->TakeFile());
  (*reader)->DropEntries();
  return s;
}

std::shared_ptr<SsdBucket> SsdTier::NextToWriteLocked() {
  for (const auto& b : sealed_) {
    if (!b->writing) return b;
  }
  return nullptr;
}

void SsdTier::WriterLoop(int index) {
  MutexLock lock(&mu_);
  uint64_t last_tombstone_sync = env_->NowMicros();
  while (true) {
    const auto tick = std::chrono::milliseconds(
        std::max<uint64_t>(10, std::min<uint64_t>(options_.bucket_flush_timeout_ms, 100)));
    const auto tick_end = std::chrono::steady_clock::now() + tick;
    while (!stopping_ && NextToWriteLocked() == nullptr && writer_cv_.WaitUntil(&mu_, tick_end)) {
    }
    const uint64_t now = env_->NowMicros();
    if (index == 0) {  // the housekeeping is the first writer's
      if (open_ != nullptr && open_->keys > 0 &&
          now - open_->opened_micros >= options_.bucket_flush_timeout_ms * 1000) {
        SealOpenLocked();  // a few values are not held back forever
      }
      if (options_.tombstone_sync_interval_ms > 0 &&
          now - last_tombstone_sync >= options_.tombstone_sync_interval_ms * 1000) {
        last_tombstone_sync = now;
        lock.Unlock();
        Status s = log_->Sync();
        if (!s.ok()) {
          logger_->Logf(LogLevel::kError, "tombstone log sync: %s", s.ToString().c_str());
        }
        lock.Lock();
      }
    }
    std::shared_ptr<SsdBucket> bucket = NextToWriteLocked();
    if (bucket == nullptr) {
      if (stopping_) return;
      continue;
    }
    bucket->writing = true;
    lock.Unlock();
    Status s = WriteBucket(bucket);
    lock.Lock();
    bucket->writing = false;
    {
      MutexLock st(&stats_mu_);
      if (s.ok()) {
        stats_.bucket_writes++;
      } else {
        stats_.bucket_write_errors++;
      }
    }
    if (s.ok()) {
      sealed_.erase(std::find(sealed_.begin(), sealed_.end(), bucket));
      writer_error_ = Status::OK();
    } else {
      // The image stays in memory and keeps serving reads; the write is retried.  Flush()
      // reports the failure meanwhile.
      bucket->write_failed = true;
      writer_error_ = s;
      logger_->Logf(LogLevel::kError, "writing bucket %llu failed: %s",
                    static_cast<unsigned long long>(bucket->id), s.ToString().c_str());
    }
    written_cv_.NotifyAll();
    if (!s.ok()) {
      if (stopping_) return;  // give up: the bucket stays unwritten
      const auto retry_at = std::chrono::steady_clock::now() + kWriteRetryDelay;
      while (!stopping_ && writer_cv_.WaitUntil(&mu_, retry_at)) {
      }
    }
  }
}

Status SsdTier::Flush() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return Status::Aborted("SSD tier is closed");
    if (open_ != nullptr && (open_->keys > 0 || open_->staging > 0)) SealOpenLocked();
    if (sealed_.empty()) {
      // nothing pending
    } else {
      const uint64_t target = sealed_.back()->id;
      while (!(sealed_.empty() || sealed_.front()->id > target || stopping_ ||
               (sealed_.front()->write_failed && !writer_error_.ok()))) {
        written_cv_.Wait(&mu_);
      }
      if (!sealed_.empty() && sealed_.front()->id <= target) {
        return writer_error_.ok() ? Status::Aborted("SSD tier closed during Flush") : writer_error_;
      }
    }
  }
  return log_->Sync();
}

// ------------------------------------------------------------------ space

Status SsdTier::MakeRoomLocked(uint64_t bytes) {
  if (used_bytes_ + bytes <= options_.ssd_capacity_bytes) return Status::OK();
  if (!may_evict()) {
    return Status::NoSpace(
        "SSD tier is full (" + FormatSize(used_bytes_) + " of " +
        FormatSize(options_.ssd_capacity_bytes) + ") and may not evict (" +
        (options_.disable_ssd_eviction ? "disable_ssd_eviction" : "ssd_eviction=none") + ")");
  }
  // Drop whole buckets, coldest (lru) or oldest (fifo) first -- fair shares permitting
  // -- until the room is there.
  std::vector<std::shared_ptr<SsdBucket>> victims = PickEvictionVictimsLocked(bytes);
  uint64_t freed = 0;
  for (const auto& v : victims) freed += v->allocated_bytes();
  if (used_bytes_ + bytes > options_.ssd_capacity_bytes + freed) {
    return Status::NoSpace("SSD tier is full (" + FormatSize(used_bytes_) + " of " +
                           FormatSize(options_.ssd_capacity_bytes) +
                           ") and nothing on disk can be evicted yet");
  }
  uint64_t evicted_keys = 0;
  for (const auto& v : victims) {
    evicted_keys += EraseKeysOfLocked(*v);  // gone with their bucket: no tombstones needed
    CountBucketEvictionsLocked(*v);
    DropTallyLocked(v.get());
    buckets_.erase(v->id);
    used_bytes_ -= v->allocated_bytes();
  }
  {
    MutexLock st(&stats_mu_);
    stats_.evicted_buckets += victims.size();
    stats_.evicted_keys += evicted_keys;
  }
  mu_.Unlock();  // the caller's MutexLock holds it again before it returns
  RetireBuckets(std::move(victims));
  mu_.Lock();
  return Status::OK();
}

Status SsdTier::WriterStatus() const {
  MutexLock lock(&mu_);
  return writer_error_;
}

uint64_t SsdTier::EraseKeysOfLocked(const SsdBucket& bucket) {
  uint64_t erased = 0;
  // The index is on disk only (a small read: bucket_keys_limit entries at most).
  std::vector<BucketEntry> entries;
  Status s = ReadBucketIndex(bucket, &entries);
  if (s.ok()) {
    for (const BucketEntry& e : entries) {
      const KeyFingerprint fp = KeyFingerprint::Of(e.key);
      SsdLocation loc;
      if (map_.Find(fp, &loc) && loc.bucket == bucket.id) {
        map_.Erase(fp);
        erased++;
        if (removal_feed_ != nullptr) {
          removal_feed_->Record(e.key, RemovalEvent::kSsd, RemovalEvent::kCapacity);
        }
        if (evicted_keys_ != nullptr) evicted_keys_->Note(Hash64(e.key));
      }
    }
    return erased;
  }
  // Unreadable now: the whole map is searched, so that no key keeps pointing at it.  The
  // map keeps fingerprints, not keys: these removals cannot be announced on the feed.
  logger_->Logf(LogLevel::kWarn, "evicting bucket %llu: %s; searching the whole map",
                static_cast<unsigned long long>(bucket.id), s.ToString().c_str());
  return map_.EraseIf([&](const SsdLocation& loc) { return loc.bucket == bucket.id; });
}

Status SsdTier::ReadBucketIndex(const SsdBucket& bucket, std::vector<BucketEntry>* entries) {
  BucketFileCache::Handle file;
  Status s = BucketFile(bucket.id, &file);
  if (s.ok()) s = bucket.reader->ReadEntries(*file, entries);
  return s;
}

void SsdTier::RetireBuckets(std::vector<std::shared_ptr<SsdBucket>> retired) {
  if (retired.empty()) return;
  std::vector<uint64_t> ids;
  for (auto& b : retired) {
    // In-flight reads finish against the open file; wait for them without holding any
    // lock (a reader never needs one to finish).
    while (b->readers.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    Status s = base_env_->RemoveFile(BucketPath(b->id));
    if (!s.ok()) logger_->Logf(LogLevel::kWarn, "remove bucket: %s", s.ToString().c_str());
    ids.push_back(b->id);
    // Closing the deleted file frees its blocks, which takes a while: not on this
    // thread.  The reference handed over must be the last one for that to hold.
    BucketFileCache::Handle file = file_cache_->Erase(b->id);
    closer_.Submit([bucket = std::move(b), file = std::move(file)]() mutable {
      file.reset();
      bucket.reset();
    });
  }
  base_env_->SyncDir(dir_);
  {
    MutexLock lock(&mu_);
    for (uint64_t id : ids) tombstones_.erase(id);
  }
  Status s = RewriteTombstones();
  if (!s.ok()) logger_->Logf(LogLevel::kError, "rewrite tombstone log: %s", s.ToString().c_str());
}

Status SsdTier::RewriteTombstones() {
  // Holding mu_ keeps Add() (always under mu_) from slipping between the snapshot and
  // the rewrite.
  MutexLock lock(&mu_);
  return log_->Rewrite(TombstonesLocked());
}

std::vector<TombstoneLog::Record> SsdTier::TombstonesLocked() const {
  std::vector<TombstoneLog::Record> all;
  for (const auto& [bucket, records] : tombstones_)
    all.insert(all.end(), records.begin(), records.end());
  return all;
}

namespace {
// A checkpoint of this many keys takes about 45 MB and well under 0.1 s to write: Close
// writes one whenever anything changed.
constexpr uint64_t kKeysAlwaysCheckpointedAtClose = 1 << 20;
// The least backlog worth a checkpoint while running: replaying it costs the next Open
// about 0.25 s (some 2 us a key).
constexpr uint64_t kMinCheckpointBacklog = 1 << 17;
}  // namespace

uint64_t SsdTier::CheckpointBacklogLimitLocked() const {
  if (options_.ssd_map_checkpoint_interval_keys != 0) {
    return options_.ssd_map_checkpoint_interval_keys;
  }
  // A thirty-second of the map: the writes of checkpoints stay a bounded fraction of the
  // bucket writes (a 10M-key map is 455 MB, written once per 312k new keys), and the
  // replay a bounded fraction of the load.
  return std::max<uint64_t>(kMinCheckpointBacklog, map_.size() / 32);
}

// Bucket table records of the buckets on disk.  REQUIRES: mu_ held.
static MapCheckpoint::Bucket CheckpointRecord(const SsdBucket& b) {
  MapCheckpoint::Bucket r;
  r.id = b.id;
  r.file_size = b.file_size;
  r.created_micros = b.reader->header().created_micros;
  r.format_version = b.reader->header().format_version;
  r.keys = b.keys;
  r.live_keys = b.live_keys;
  r.total_bytes = b.total_bytes;
  r.deleted_bytes = b.deleted_bytes;
  r.punched_bytes = b.punched_bytes;
  r.punched_value_bytes = b.punched_value_bytes;
  for (const SsdBucket::Extent& e : b.dead_extents) {
    r.dead_extents.push_back({e.offset, e.length, e.value_size});
  }
  for (const SsdBucket::NamespaceTally& t : b.namespaces) {
    r.namespaces.push_back({t.id, t.bytes, t.items});
  }
  return r;
}

MapCheckpoint::Contents SsdTier::CheckpointContentsLocked(uint32_t flags) const {
  MapCheckpoint::Contents cp;
  cp.next_bucket_id = next_bucket_id_;
  cp.max_version = std::max(max_version_, recovered_max_version_);
  cp.flags = flags;
  for (const auto& [id, b] : buckets_) {
    if (b->state == SsdBucket::State::kOnDisk) cp.buckets.push_back(CheckpointRecord(*b));
  }
  return cp;
}

Status SsdTier::WriteCheckpoint() {
  MutexLock lock(&mu_);
  if (!options_.ssd_map_checkpoint) return MapCheckpoint::Remove(base_env_, dir_);
  const bool pending = !sealed_.empty() || (open_ != nullptr && open_->keys > 0);
  if (pending || !duplicates_.empty()) {
    // What the buckets on disk hold is not all there is: a checkpoint would be wrong.
    MapCheckpoint::Remove(base_env_, dir_);
    checkpoint_on_disk_ = false;
    return Status::Aborted(pending ? "buckets not written" : "copies left by a crash");
  }
  if (checkpoint_on_disk_ &&
      (checkpoint_backlog_ == 0 || (map_.size() > kKeysAlwaysCheckpointedAtClose &&
                                    checkpoint_backlog_ < CheckpointBacklogLimitLocked()))) {
    logger_->Logf(LogLevel::kDebug,
                  "map checkpoint on disk kept: the next Open replays %llu keys on top of it",
                  static_cast<unsigned long long>(checkpoint_backlog_));
    return Status::OK();
  }
  Status s = MapCheckpoint::Write(base_env_, dir_, CheckpointContentsLocked(0), map_);
  checkpoint_on_disk_ = s.ok();
  if (s.ok()) {
    checkpoint_backlog_ = 0;
    MutexLock st(&stats_mu_);
    stats_.checkpoint_writes++;
  }
  return s;
}

Status SsdTier::MaybeWriteCheckpointWhileRunning() {
  MapCheckpoint::Contents cp;
  uint64_t backlog = 0;
  {
    MutexLock lock(&mu_);
    if (!options_.ssd_map_checkpoint || stopping_ || !duplicates_.empty() ||
        checkpoint_backlog_ < CheckpointBacklogLimitLocked()) {
      return Status::OK();
    }
    // The buckets on disk now are the ones it covers: every bucket written from here on
    // is replayed at Open, whatever its id.
    cp = CheckpointContentsLocked(MapCheckpoint::kPartial);
    backlog = checkpoint_backlog_;
  }
  const uint64_t start = env_->NowMicros();
  MapCheckpoint::Writer writer(base_env_, dir_);
  Status s = writer.Begin(cp);
  for (size_t i = 0; s.ok() && i < SsdIndex::kShardCount; i++) {
    SsdIndex::ShardImage image;
    HugeArray<char> copy;  // a mapping of its own: unmapped, not left in the heap, after
    {
      MutexLock lock(&mu_);
      if (stopping_) return Status::Aborted("SSD tier is closing");
      image = map_.GetShardImage(i);
      const size_t bytes = image.capacity * SsdIndex::kSlotBytes;
      copy = NewZeroedHugeArray<char>(bytes);
      if (bytes > 0) std::memcpy(copy.get(), image.slots, bytes);
    }
    image.slots = copy.get();
    s = writer.AddShard(image);
  }
  if (!s.ok()) return s;
  {
    // The punched state as it is now (the keys of buckets gone since are dropped at
    // Open); the counts are recounted from the map at Open.
    MutexLock lock(&mu_);
    std::vector<MapCheckpoint::Bucket> kept;
    for (const MapCheckpoint::Bucket& r : cp.buckets) {
      auto it = buckets_.find(r.id);
      if (it != buckets_.end()) kept.push_back(CheckpointRecord(*it->second));
    }
    cp.buckets = std::move(kept);
  }
  s = writer.Finish(cp.buckets);
  MutexLock lock(&mu_);
  if (s.ok()) {
    checkpoint_on_disk_ = true;
    checkpoint_backlog_ -= std::min(checkpoint_backlog_, backlog);
    {
      MutexLock st(&stats_mu_);
      stats_.checkpoint_writes++;
    }
    logger_->Logf(LogLevel::kInfo, "map checkpoint of %llu keys written in %.3f s",
                  static_cast<unsigned long long>(map_.size()),
                  static_cast<double>(env_->NowMicros() - start) / 1e6);
  }
  return s;
}

// ------------------------------------------------------------------ introspection

SsdTier::Stats SsdTier::GetStats() const {
  Stats s;
  {
    MutexLock st(&stats_mu_);
    s = stats_;
  }
  MutexLock lock(&mu_);
  s.keys = map_.size();
  s.used_bytes = used_bytes_;
  s.capacity_bytes = options_.ssd_capacity_bytes;
  s.buckets = buckets_.size();
  s.pending_buckets = sealed_.size() + (open_ != nullptr ? 1 : 0);
  s.live_bytes = 0;
  s.deleted_bytes = 0;
  s.tombstones = 0;  // records in the log now (the ones recovered at Open included)
  for (const auto& [bucket, records] : tombstones_) s.tombstones += records.size();
  for (const auto& [id, b] : buckets_) {
    s.live_bytes += b->total_bytes - b->deleted_bytes;
    s.deleted_bytes += b->unreclaimed_bytes();
  }
  s.index_bytes = IndexBytesLocked();
  s.checkpoint_backlog = checkpoint_backlog_;
  s.io_uring = uring_env_ != nullptr;
  s.open_files = file_cache_->open_files();
  s.file_opens = file_cache_->opens();
  s.direct_io = file_options_.use_direct_io;
  return s;
}

uint64_t SsdTier::KeyHeapBytes(const std::string& key) {
  // A key too long for the string's inline buffer is a heap block of its own (malloc
  // rounds to 16 bytes and keeps an 8-byte header).
  const std::string empty;
  if (key.capacity() <= empty.capacity()) return 0;
  return RoundUpTo(key.capacity() + 1 + 8, 16);
}

uint64_t SsdTier::IndexBytesLocked() const {
  uint64_t bytes = map_.MemoryBytes();
  // Tombstones kept for the log's rewrite: their keys are copies too.
  for (const auto& [bucket, records] : tombstones_) {
    bytes += records.capacity() * sizeof(TombstoneLog::Record);
    for (const auto& r : records) bytes += KeyHeapBytes(r.key);
  }
  return bytes;
}

}  // namespace kvengine
