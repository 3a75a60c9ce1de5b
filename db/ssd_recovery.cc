// Rebuilding the SSD tier's object map at Open: SsdTier::Recover() and its steps.
//
//   1. ScanDirectory: leftover temporary files (a bucket or log write cut short) are
//      removed; any file named like a bucket but not exactly as this DB names one
//      ("bucket-12.kvb") is moved to quarantine/ (Quarantine: reported in the log and in
//      stats; the rest of the DB opens without it).
//   2. LoadCheckpoint: with a map checkpoint (db/map_checkpoint.h) that matches the
//      directory, the buckets it lists are opened with their header and footer read,
//      not their indexes (verified when they were written), and the map and their counts
//      come from it.
//   3. OpenBuckets (called by ReplayBuckets, step 5, a window of buckets at a time):
//      every other bucket file is opened and verified (header, footer, index
//      checksums); one that fails is quarantined.
//   4. ReadTombstones (before step 2): a torn tail of the tombstone log is ignored; a
//      damaged stretch followed by valid records is skipped, counted, logged, and the
//      damaged log is copied to quarantine/TOMBSTONES.damaged before step 6 rewrites it.
//      The log is checked against its guard (db/tombstone_guard.h): one that lost
//      deletes (shorter than synced, missing, an older copy, damaged) makes every value
//      a lost delete may have covered dead (buried with a tombstone, counted in
//      ssd.lost_delete_drops); then the checkpoint is not used and every bucket is read.
//   5. ApplyTombstonesToCheckpoint, ReplayBuckets: the tombstones logged since the
//      checkpoint kill the values still live in the buckets it restored; the buckets of
//      step 3 are replayed in id order, each window's indexes dropped once replayed (the
//      open holds a window's entries, not every bucket's): an entry whose (key, version) has a
//      tombstone is dead; otherwise the highest version of a key wins, and an older one it
//      supersedes gets a tombstone so that it can never come back.  Two copies of one version (a
//      crash in the middle of a compaction) keep the newer bucket's; the other copy is
//      remembered so that a later delete tombstones both.
//   6. The log is rewritten with the tombstones that still cover a value in some bucket.
#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <set>
#include <thread>
#include <unordered_set>

#include "db/hole_plan.h"
#include "db/map_checkpoint.h"
#include "db/ssd_bucket.h"
#include "db/ssd_tier.h"
#include "util/coding.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/perf_point.h"

namespace kvengine {

namespace {
std::string DeadKey(std::string_view key, uint64_t version) {
  std::string k(key);
  PutFixed64(&k, version);
  return k;
}

// Bucket files are opened and verified by this many threads: the reads of one are
// small and dependent, so several in flight keep the disk busy.
constexpr int kOpenThreads = 4;
// Buckets whose indexes are held at once while they are replayed (ReplayBuckets).
constexpr size_t kReplayWindow = 4 * kOpenThreads;

// Calls fn(i) for i in [0, n) on `threads` threads.
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < n; t++) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}
}  // namespace

void SsdTier::LoadCheckpoint(const std::vector<uint64_t>& ids, std::vector<uint64_t>* covered) {
  covered->clear();
  if (!options_.ssd_map_checkpoint) return;
  MapCheckpoint::Contents cp;
  Status s = MapCheckpoint::Read(base_env_, dir_, 2, &cp, &map_);
  if (s.IsNotFound()) return;
  std::string why = s.ok() ? "" : s.ToString();
  // Listed buckets that are gone (compacted or evicted after the checkpoint) lose their
  // keys; buckets it does not list, of any id, are replayed (a running DB's checkpoint
  // does not list the buckets still pending when it was begun).
  bool prune = (cp.flags & MapCheckpoint::kPartial) != 0;
  if (why.empty()) {
    const std::set<uint64_t> present(ids.begin(), ids.end());
    const size_t listed = cp.buckets.size();
    std::erase_if(cp.buckets,
                  [&](const MapCheckpoint::Bucket& b) { return present.count(b.id) == 0; });
    prune |= cp.buckets.size() != listed;
  }
  std::vector<std::unique_ptr<BucketReader>> readers(cp.buckets.size());
  if (why.empty()) {
    std::vector<Status> status(cp.buckets.size());
    ParallelFor(cp.buckets.size(), kOpenThreads, [&](size_t i) {
      const MapCheckpoint::Bucket& b = cp.buckets[i];
      status[i] = OpenBucketReader(b.id, /*read_index=*/false, &readers[i]);
      if (!status[i].ok()) return;
      const BucketReader& r = *readers[i];
      if (r.header().bucket_id != b.id || r.file_size() != b.file_size ||
          r.header().created_micros != b.created_micros ||
          r.header().format_version != b.format_version) {
        status[i] = Status::Corruption(BucketPath(b.id), "differs from the checkpoint's");
      }
      // Into the cache at once: the cache bounds the descriptors held.
      file_cache_->Insert(b.id, readers[i]->TakeFile());
    });
    for (const Status& st : status) {
      if (!st.ok()) why = st.ToString();
    }
  }
  if (!why.empty()) {
    for (const MapCheckpoint::Bucket& b : cp.buckets) file_cache_->Erase(b.id);
    map_.Clear();
    logger_->Logf(LogLevel::kWarn, "map checkpoint %s/%s not used (%s): reading every bucket",
                  dir_.c_str(), MapCheckpoint::kFileName, why.c_str());
    MutexLock st(&stats_mu_);
    stats_.checkpoint_rejected = 1;
    return;
  }
  for (size_t i = 0; i < cp.buckets.size(); i++) {
    const MapCheckpoint::Bucket& r = cp.buckets[i];
    auto b = std::make_shared<SsdBucket>();
    b->id = r.id;
    b->state = SsdBucket::State::kOnDisk;
    b->file_size = r.file_size;
    b->keys = r.keys;
    b->live_keys = r.live_keys;
    b->total_bytes = r.total_bytes;
    b->deleted_bytes = r.deleted_bytes;
    b->punched_bytes = r.punched_bytes;
    b->punched_value_bytes = r.punched_value_bytes;
    b->last_access = r.id;
    for (const MapCheckpoint::NamespaceTally& t : r.namespaces) {
      b->namespaces.push_back({t.id, t.bytes, t.items});
    }
    b->reader = std::move(readers[i]);
    buckets_[r.id] = b;
    used_bytes_ += r.file_size - r.punched_bytes;
    // The extents it found not punched yet may have been punched since (a checkpoint
    // kept at Close, or one written while the DB ran): the file says.
    for (const MapCheckpoint::Extent& e : r.dead_extents) {
      DeadExtentAtOpen(b.get(), e.offset, e.length, e.value_size);
    }
    covered->push_back(r.id);
  }
  if (prune) {
    // Keys only in the buckets the table lists and the directory holds; the counts from
    // the map itself (a running DB's table counted them before its shards were copied).
    // One pass over the map, bucket ids looked up in a flat table from the lowest: ids
    // are dense (each bucket takes the next).  Ids spread wider than the table would be
    // worth (a damaged header's next id, say) are looked up in their sorted list
    // instead, so that no id sizes an allocation.
    std::vector<uint64_t> ids(*covered);
    std::sort(ids.begin(), ids.end());
    const uint64_t lowest = ids.empty() ? 0 : ids.front();
    const bool flat = ids.empty() || ids.back() - lowest < 4 * ids.size() + 4096;
    struct Live {
      bool listed = false;
      uint64_t keys = 0, bytes = 0;
    };
    std::vector<Live> live(flat ? (ids.empty() ? 0 : ids.back() - lowest + 1) : ids.size());
    auto live_of = [&](uint64_t id) -> Live* {
      if (flat) {
        if (id < lowest || id - lowest >= live.size()) return nullptr;
        return &live[id - lowest];
      }
      auto it = std::lower_bound(ids.begin(), ids.end(), id);
      return it != ids.end() && *it == id ? &live[it - ids.begin()] : nullptr;
    };
    for (uint64_t id : ids) live_of(id)->listed = true;
    std::vector<KeyFingerprint> doomed;
    map_.ForEach([&](const KeyFingerprint& key, const SsdLocation& l) {
      Live* in = live_of(l.bucket);
      if (in == nullptr || !in->listed) {
        doomed.push_back(key);
        return;
      }
      in->keys++;
      in->bytes += l.size;
    });
    for (const KeyFingerprint& key : doomed) map_.Erase(key);
    for (uint64_t id : ids) {
      SsdBucket* b = buckets_.at(id).get();
      const Live& l = *live_of(id);
      b->live_keys = l.keys;
      b->deleted_bytes = b->total_bytes >= l.bytes ? b->total_bytes - l.bytes : 0;
      b->punched_value_bytes = std::min(b->punched_value_bytes, b->deleted_bytes);
      b->FitNamespacesTo(l.bytes);
    }
  }
  // The namespaces' figures from the tallies, now that they hold what the map does.
  for (uint64_t id : *covered) AddTallyToUsageLocked(*buckets_.at(id));
  next_bucket_id_ = std::max(next_bucket_id_, cp.next_bucket_id);
  recovered_max_version_ = std::max(recovered_max_version_, cp.max_version);
  checkpoint_on_disk_ = true;
  MutexLock st(&stats_mu_);
  stats_.checkpoint_keys = map_.size();
}

Status SsdTier::OpenBucketReader(uint64_t id, bool read_index,
                                 std::unique_ptr<BucketReader>* reader) {
  Status s = BucketReader::Open(env_, BucketPath(id), file_options_, reader, read_index);
  if (IsTooManyOpenFiles(s)) {
    // Something else took the descriptors the budget left: give back every bucket file
    // no read holds (recovery's own included), and try once more.
    file_cache_->CloseUnused();
    s = BucketReader::Open(env_, BucketPath(id), file_options_, reader, read_index);
  }
  return s;
}

void SsdTier::DeadAtOpen(SsdBucket* b, uint64_t offset, uint64_t size) {
  DeadExtentAtOpen(b, offset, PaddedValueSize(b->format_version(), size), size);
}

void SsdTier::DeadExtentAtOpen(SsdBucket* b, uint64_t offset, uint64_t length,
                               uint64_t value_size) {
  // Asked only when holes are punched at all; a file that cannot be opened cannot tell.
  BucketFileCache::Handle file;
  if (options_.gc_punch_holes && !BucketFile(b->id, &file).ok()) file = nullptr;
  // Part by part, since a packed value's first and last blocks may hold live neighbours
  // (never punched) or dead ones (punched with them before the restart).
  for (const SsdBucket::Extent& part :
       SplitAtBlocks({offset, length, value_size}, kBucketAlignment)) {
    // A file that cannot tell where its holes are reports data everywhere: queued.
    uint64_t data = 0;
    if (file != nullptr && file->NextDataOffset(part.offset, &data).ok() &&
        data >= part.offset + part.length) {
      b->punched_bytes += part.length;  // punched before the restart: not again, not counted
      b->punched_value_bytes += part.value_size;
      used_bytes_ -= part.length;
      continue;
    }
    if (options_.gc_punch_holes) b->dead_extents.push_back(part);
  }
}

void SsdTier::ApplyTombstonesToCheckpoint(const std::vector<uint64_t>& covered,
                                          const std::vector<TombstoneLog::Record>& records) {
  const std::set<uint64_t> restored(covered.begin(), covered.end());
  for (const TombstoneLog::Record& r : records) {
    if (restored.count(r.bucket) == 0) continue;  // a newer bucket's: replayed below
    SsdBucket* b = buckets_.at(r.bucket).get();
    const KeyFingerprint fp = KeyFingerprint::Of(r.key);
    SsdLocation loc;
    // A delete made after the checkpoint: the value it kills is still live in it.  The
    // others were dead already when it was written, and counted so.
    if (map_.Find(fp, &loc) && loc.bucket == r.bucket && loc.version == r.version) {
      b->deleted_bytes += loc.size;
      b->live_keys--;
      TallyLocked(b, r.key, loc.size, /*add=*/false);
      DeadAtOpen(b, loc.offset, loc.size);
      map_.Erase(fp);
    }
    tombstones_[r.bucket].push_back(r);
  }
}

Status SsdTier::QuarantinePath(const std::string& name, std::string* path) {
  const std::string dir = dir_ + "/" + kQuarantineDir;
  Status s = base_env_->CreateDirIfMissing(dir);
  if (!s.ok()) return s;
  // Never over an earlier casualty: a second one of the same name gets a suffix.
  *path = dir + "/" + name;
  for (int n = 1; base_env_->FileExists(*path); n++)
    *path = dir + "/" + name + "." + std::to_string(n);
  return Status::OK();
}

Status SsdTier::Quarantine(const std::string& name, const Status& why) {
  std::string to;
  Status s = QuarantinePath(name, &to);
  if (s.ok()) s = base_env_->RenameFile(dir_ + "/" + name, to);
  logger_->Logf(LogLevel::kError, "quarantined %s/%s: %s%s", dir_.c_str(), name.c_str(),
                why.ToString().c_str(),
                s.ok() ? "" : (" (move failed: " + s.ToString() + ")").c_str());
  {
    MutexLock st(&stats_mu_);
    stats_.quarantined_buckets++;
  }
  if (!s.ok()) {
    return Status::IOError(dir_ + "/" + name + ": " + why.ToString(),
                           "cannot move it to quarantine: " + s.ToString());
  }
  return Status::OK();
}

Status SsdTier::KeepDamagedLog(std::string* copy) {
  // Copied, not renamed: until the rewritten log is in place, the damaged one is the only
  // record of the deletes that survived.
  const std::string from = dir_ + "/" + TombstoneLog::kFileName;
  std::unique_ptr<RandomAccessFile> in;
  std::unique_ptr<WritableFile> out;
  Status s = QuarantinePath(std::string(TombstoneLog::kFileName) + ".damaged", copy);
  if (s.ok()) s = base_env_->NewRandomAccessFile(from, FileOptions(), &in);
  std::string data;
  if (s.ok()) {
    data.resize(in->Size());
    size_t n = 0;
    s = in->Read(0, data.size(), data.data(), &n);
    data.resize(n);
  }
  if (s.ok()) s = base_env_->NewWritableFile(*copy, FileOptions(), &out);
  if (s.ok()) s = out->Append(Slice(data));
  if (s.ok()) s = out->Sync();
  if (s.ok()) s = out->Close();
  if (!s.ok()) {
    return Status::IOError(from + " is damaged and cannot be kept aside", s.ToString());
  }
  return Status::OK();
}

Status SsdTier::Recover() {
  PerfPoint perf(PerfKey::ssd_recovery);
  MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  Status s = ScanDirectory(&ids);
  if (!s.ok()) return s;
  // The log first: when it lost deletes, the values they may have covered are found by
  // reading every bucket's index (the checkpoint's map has no keys to tombstone them by).
  std::vector<TombstoneLog::Record> records;
  TombstoneLog::ReadReport report;
  s = ReadTombstones(!ids.empty(), &records, &report);
  if (!s.ok()) return s;
  if (report.lost) lost_through_version_ = report.lost_through_version;
  std::vector<uint64_t> covered;
  if (!report.lost) LoadCheckpoint(ids, &covered);
  std::vector<uint64_t> rest;  // the buckets the checkpoint does not cover, read in full
  std::set_difference(ids.begin(), ids.end(), covered.begin(), covered.end(),
                      std::back_inserter(rest));
  ApplyTombstonesToCheckpoint(covered, records);
  s = ReplayBuckets(rest, records);
  if (!s.ok()) return s;
  base_env_->SyncDir(dir_);  // the buckets quarantined meanwhile
  if (report.lost) {
    logger_->Logf(LogLevel::kError,
                  "tombstone log %s/%s lost deletes (%s): %llu values that a lost delete may "
                  "have covered (version %s) are dropped, never served; see "
                  "docs/tombstone_log.md",
                  dir_.c_str(), TombstoneLog::kFileName, report.lost_why.c_str(),
                  static_cast<unsigned long long>(lost_delete_drops_),
                  report.lost_through_version == TombstoneLog::kAllVersions
                      ? "any"
                      : ("<= " + std::to_string(report.lost_through_version)).c_str());
  }
  // The log is rewritten with the records that still cover a value (those of the values
  // just dropped included), so that appends never follow a torn tail; its guard starts
  // a new generation.
  s = TombstoneLog::Create(base_env_, dir_, TombstonesLocked(), &log_, &report);
  if (!s.ok()) return s;
  MutexLock st(&stats_mu_);
  stats_.recovered_keys = map_.size();
  stats_.torn_tombstone_bytes = report.torn_bytes;
  stats_.damaged_tombstone_bytes = report.damaged_bytes;
  stats_.lost_tombstone_logs = report.lost ? 1 : 0;
  stats_.lost_delete_drops = lost_delete_drops_;
  return Status::OK();
}

Status SsdTier::ScanDirectory(std::vector<uint64_t>* ids) {
  std::vector<std::string> names;
  Status s = base_env_->GetChildren(dir_, &names);
  if (!s.ok()) return s;
  for (const std::string& name : names) {
    uint64_t id;
    if (name.size() > 4 && name.ends_with(".tmp")) {
      // A write cut short.  One that cannot be removed (a directory) would block the
      // next write of that name: it is moved aside.
      s = base_env_->RemoveFile(dir_ + "/" + name);
      if (!s.ok() && base_env_->FileExists(dir_ + "/" + name)) {
        s = Quarantine(name, Status::IOError("leftover temporary file", s.ToString()));
        if (!s.ok()) return s;
      }
    } else if (ParseBucketFileName(name, &id)) {
      ids->push_back(id);
    } else if (LooksLikeBucketFileName(name)) {  // not a file this DB wrote
      Quarantine(name, Status::Corruption("not the name of a bucket file of this DB"));
    }
  }
  std::sort(ids->begin(), ids->end());
  if (!ids->empty()) next_bucket_id_ = ids->back() + 1;
  // Quarantined files keep their ids out of reuse too.
  std::vector<std::string> quarantined;
  if (base_env_->GetChildren(dir_ + "/" + kQuarantineDir, &quarantined).ok()) {
    for (const std::string& name : quarantined) {
      uint64_t id;
      if (ParseBucketFileName(name, &id)) next_bucket_id_ = std::max(next_bucket_id_, id + 1);
    }
  }
  return Status::OK();
}

SsdTier::OpenedReaders SsdTier::ReadBuckets(std::vector<uint64_t> ids) {
  OpenedReaders r;
  r.ids = std::move(ids);
  r.readers.resize(r.ids.size());
  r.status.resize(r.ids.size());
  ParallelFor(r.ids.size(), kOpenThreads, [&](size_t i) {
    r.status[i] = OpenBucketReader(r.ids[i], /*read_index=*/true, &r.readers[i]);
    // The cache keeps the newest max_open_files open; holding every file until the end
    // would run out of descriptors with many buckets.
    if (r.status[i].ok()) file_cache_->Insert(r.ids[i], r.readers[i]->TakeFile());
  });
  return r;
}

Status SsdTier::OpenBuckets(OpenedReaders read, std::vector<std::shared_ptr<SsdBucket>>* opened) {
  for (size_t i = 0; i < read.ids.size(); i++) {
    const uint64_t id = read.ids[i];
    std::unique_ptr<BucketReader> reader = std::move(read.readers[i]);
    Status s = read.status[i];
    if (s.ok() && reader->header().bucket_id != id) {
      s = Status::Corruption(BucketPath(id),
                             "header names bucket " + std::to_string(reader->header().bucket_id));
    }
    // Damaged, of an unknown format, or not a file at all: moved aside.
    if (s.IsCorruption() || s.IsNotSupported() || s.IsInvalidArgument()) {
      file_cache_->Erase(id);
      // Left in place when it cannot be moved: it takes no part, its id stays taken.
      Quarantine(BucketFileName(id), s);
      continue;
    }
    if (!s.ok()) return s;
    auto b = std::make_shared<SsdBucket>();
    b->id = id;
    b->state = SsdBucket::State::kOnDisk;
    b->file_size = reader->file_size();
    b->reader = std::move(reader);
    b->last_access = id;  // older buckets count as colder
    opened->push_back(b);
  }
  return Status::OK();
}

Status SsdTier::ReadTombstones(bool have_buckets, std::vector<TombstoneLog::Record>* records,
                               TombstoneLog::ReadReport* report) {
  Status s = TombstoneLog::Read(base_env_, dir_, records, report);
  if (!s.ok()) return s;
  if (!report->log_exists && have_buckets && !report->lost) {
    // Every DB that wrote a bucket has a log (recovery creates one before any write).
    report->lost = true;
    report->lost_through_version = TombstoneLog::kAllVersions;
    report->lost_why = "it is missing, but bucket files are here";
    report->vouched.clear();
  }
  if (report->torn_bytes > 0) {
    logger_->Logf(LogLevel::kWarn, "tombstone log: ignored a torn tail of %llu bytes",
                  static_cast<unsigned long long>(report->torn_bytes));
  }
  if ((report->damaged_bytes > 0 || report->lost) && report->log_exists) {
    // The log is rewritten at the end of recovery: the damaged one is kept, for whoever
    // can tell which deletes it held.
    std::string copy;
    s = KeepDamagedLog(&copy);
    if (!s.ok()) return s;
    logger_->Logf(LogLevel::kError,
                  "tombstone log: %llu damaged bytes in %llu places%s; a copy of the log: %s "
                  "(see docs/tombstone_log.md)",
                  static_cast<unsigned long long>(report->damaged_bytes),
                  static_cast<unsigned long long>(report->damaged_stretches),
                  report->lost ? (", and it lost deletes: " + report->lost_why).c_str() : "",
                  copy.c_str());
  }
  return Status::OK();
}

Status SsdTier::ReplayBuckets(const std::vector<uint64_t>& ids,
                              const std::vector<TombstoneLog::Record>& records) {
  std::unordered_set<std::string> dead;
  for (const auto& r : records) {
    dead.insert(DeadKey(r.key, r.version));
    recovered_max_version_ = std::max(recovered_max_version_, r.version);
  }
  // A window of buckets at a time: their indexes are read in parallel and dropped once
  // replayed, so that an open that reads every bucket (no checkpoint, or one that lost
  // its log) holds the entries of two windows (the one replayed, the next one being
  // read meanwhile), not of every bucket.
  auto read_window = [this, &ids](size_t first) {
    const size_t last = std::min(ids.size(), first + kReplayWindow);
    std::vector<uint64_t> window(ids.begin() + first, ids.begin() + last);
    return std::async(std::launch::async, [this, w = std::move(window)]() mutable {
      return ReadBuckets(std::move(w));
    });
  };
  std::future<OpenedReaders> next;
  if (!ids.empty()) next = read_window(0);
  for (size_t first = 0; first < ids.size(); first += kReplayWindow) {
    OpenedReaders read = next.get();
    if (first + kReplayWindow < ids.size()) next = read_window(first + kReplayWindow);
    std::vector<std::shared_ptr<SsdBucket>> opened;
    Status s = OpenBuckets(std::move(read), &opened);
    if (!s.ok()) {
      if (next.valid()) next.wait();  // its threads use this tier
      return s;
    }
    for (const auto& b : opened) {
      buckets_[b->id] = b;
      used_bytes_ += b->file_size;
      checkpoint_backlog_ += b->reader->entries().size();  // not covered by a checkpoint
      for (const BucketEntry& e : b->reader->entries()) {
        recovered_max_version_ = std::max(recovered_max_version_, e.version);
        b->keys++;
        b->total_bytes += e.size;
        ReplayEntry(b.get(), e, dead);
      }
      b->reader->DropEntries();  // the map holds what reads need; the index stays on disk
    }
  }
  // Duplicates whose key ended up elsewhere (a newer version) are not needed.
  for (auto it = duplicates_.begin(); it != duplicates_.end();) {
    SsdLocation loc;
    it = map_.Find(KeyFingerprint::Of(it->first), &loc) ? std::next(it) : duplicates_.erase(it);
  }
  return Status::OK();
}

void SsdTier::BuryAtOpen(SsdBucket* in, const std::string& key, uint64_t version, uint64_t offset,
                         uint64_t size) {
  // A dead value's blocks may still be allocated (a crash before its hole was punched):
  // the first GC round punches again; a hole punched twice costs nothing.
  in->deleted_bytes += size;
  DeadAtOpen(in, offset, size);
  tombstones_[in->id].push_back({key, version, in->id});
}

void SsdTier::ReplayEntry(SsdBucket* b, const BucketEntry& e,
                          const std::unordered_set<std::string>& dead) {
  if (dead.count(DeadKey(e.key, e.version)) != 0) {
    BuryAtOpen(b, e.key, e.version, e.offset, e.size);
    return;
  }
  if (lost_through_version_ != 0 && e.version <= lost_through_version_) {
    // A delete the log lost may have covered it: never served, buried for good.
    BuryAtOpen(b, e.key, e.version, e.offset, e.size);
    lost_delete_drops_++;
    return;
  }
  const KeyFingerprint fp = KeyFingerprint::Of(e.key);
  const SsdLocation here{b->id, e.offset, e.size, e.version, e.checksum};
  SsdLocation cur;
  if (!map_.Find(fp, &cur)) {
    map_.Put(fp, here);
    b->live_keys++;
    TallyLocked(b, e.key, e.size, /*add=*/true);
    return;
  }
  if (e.version < cur.version) {  // superseded: dead here for good
    BuryAtOpen(b, e.key, e.version, e.offset, e.size);
    return;
  }
  SsdBucket* loser = buckets_.at(cur.bucket).get();
  loser->live_keys--;
  TallyLocked(loser, e.key, cur.size, /*add=*/false);
  if (e.version > cur.version) {
    BuryAtOpen(loser, e.key, cur.version, cur.offset, cur.size);
  } else {
    loser->deleted_bytes += cur.size;          // not punched: its tombstone is not logged yet
    duplicates_[e.key].push_back(cur.bucket);  // the same value twice
  }
  map_.Put(fp, here);
  b->live_keys++;
  TallyLocked(b, e.key, e.size, /*add=*/true);
}

}  // namespace kvengine
