// DBImpl, part one of four: open, close, flush, buffers and properties.  Reads are in
// db_impl_read.cc, writes and deletes in db_impl_write.cc, the statistics in
// db_impl_stats.cc (db/db_impl.h says which part holds what).
#include "db/db_impl.h"

#include <cinttypes>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <unordered_set>

#include "db/offloader.h"
#include "db/prefetcher.h"
#include "env/gpu_io.h"
#include "util/buffers.h"
#include "util/config_parse.h"
#include "util/input_check.h"
#include "util/printable.h"

namespace kvengine {

namespace {

const char kIdentityFile[] = "IDENTITY";
const char kIdentityText[] = "kvengine db format 1\n";

}  // namespace

namespace {

// A boot epoch: random (the kernel's generator), never 0 (0 means "none" to readers).
uint64_t DrawEpoch() {
  std::random_device random;
  uint64_t epoch = 0;
  while (epoch == 0) epoch = (uint64_t{random()} << 32) ^ random();
  return epoch;
}

}  // namespace

DBImpl::DBImpl(const Options& options, std::string path)
    : options_(options), path_(std::move(path)), epoch_(DrawEpoch()) {
  env_ = options_.env != nullptr ? options_.env : Env::Default();
}

DBImpl::~DBImpl() { Close(); }

Status DBImpl::Init() {
  Status s = logger_.Configure(options_);
  if (!s.ok()) return s;
  const std::string identity = path_ + "/" + kIdentityFile;
  if (!env_->FileExists(path_)) {
    if (!options_.create_if_missing) {
      return Status::InvalidArgument("DB directory " + path_ +
                                     " does not exist and create_if_missing is false");
    }
  }
  s = env_->CreateDirIfMissing(path_);
  if (!s.ok()) return s;
  s = env_->LockFile(path_ + "/LOCK", &lock_);
  if (!s.ok()) return s;
  if (env_->FileExists(identity)) {
    if (options_.error_if_exists) {
      return Status::InvalidArgument("DB " + path_ + " already exists and error_if_exists is true");
    }
  } else {
    std::unique_ptr<WritableFile> file;
    s = env_->NewWritableFile(identity, FileOptions(), &file);
    if (s.ok()) s = file->Append(Slice(kIdentityText));
    if (s.ok()) s = file->Sync();
    if (s.ok()) s = file->Close();
    if (s.ok()) s = env_->SyncDir(path_);
    if (!s.ok()) return s;
  }

  removal_feed_ = std::make_unique<RemovalFeed>(options_.removal_feed_capacity, env_);
  ArenaLayout layout;  // the memory tier parses it again; an error stops Open here
  s = ArenaLayout::Parse(options_, &layout);
  if (!s.ok()) return s;
  namespace_usage_ = std::make_unique<NamespaceUsage>(
      options_.memory_capacity_bytes / options_.memory_slab_size * options_.memory_slab_size,
      &layout);
  if (options_.ssd_capacity_bytes > 0) {
    s = SsdTier::Open(options_, path_, env_, &logger_, &ssd_, namespace_usage_.get());
    if (!s.ok()) return s;
    ssd_->SetEvictedKeys(&evicted_keys_);  // before any put can make it evict
    version_source_.store(ssd_->recovered_max_version());
  }
  s = MemoryTier::Create(options_, &logger_, &version_source_, &memory_);
  if (!s.ok()) return s;
  memory_->SetRemovalFeed(removal_feed_.get());
  if (ssd_ != nullptr) ssd_->SetRemovalFeed(removal_feed_.get());
  memory_->SetEvictedKeys(&evicted_keys_);
  memory_->SetNamespaceUsage(namespace_usage_.get());
  if (ssd_ != nullptr) {
    offloader_ = std::make_unique<Offloader>(memory_.get(), ssd_.get());
    memory_->SetEvictionHandler(offloader_.get());
    const uint64_t prefetch_bytes = options_.prefetch_max_bytes > 0
                                        ? options_.prefetch_max_bytes
                                        : options_.memory_capacity_bytes / 4;
    prefetcher_ = std::make_unique<Prefetcher>(
        memory_.get(), ssd_.get(), prefetch_bytes, /*verify_checksums=*/true,
        Prefetcher::Counters{&counters_.prefetch_requested, &counters_.prefetch_queued,
                             &counters_.prefetched, &counters_.prefetch_hits,
                             &counters_.prefetch_wasted, &counters_.prefetch_dropped});
  }
  if (options_.memory_registrar) {
    s = options_.memory_registrar->Register(memory_->arena_base(), memory_->arena_size(), "arena");
    if (!s.ok()) return s;
  }
  gpu_ = std::make_unique<GpuIo>(options_, &logger_, memory_->arena_base(), memory_->arena_size());
  logger_.Logf(LogLevel::kInfo, "opened %s: memory tier %s (%s pages, numa node %d)", path_.c_str(),
               FormatSize(memory_->arena_size()).c_str(), memory_->arena().backing(),
               memory_->arena().numa_node());
  return Status::OK();
}

SharedArena::Part DBImpl::arena_part(size_t i) const {
  const ArenaLayout::Part& part = memory_->layout().part(i);
  return Part{memory_->arena_base() + part.offset, part.size, memory_->arena().part_fd(i),
              part.names};
}

Status DBImpl::Close() {
  PerfPoint perf(PerfKey::db_close);
  CallLog log(&logger_, "close", nullptr);
  MutexLock closing(&close_mu_);
  WriterLock guard(&lifecycle_mu_);
  if (closed_) {
    perf.Abandon();  // not a close: the DB was closed before
    return Status::OK();
  }
  closed_ = true;
  if (memory_ == nullptr && lock_ == nullptr) return Status::OK();  // Init failed early
  if (prefetcher_ != nullptr) prefetcher_->Stop();                  // it reads and writes the tiers
  const auto user_buffers = registered_buffers_.TakeAll();
  if (options_.memory_registrar) {
    for (const auto& [start, length] : user_buffers) {
      options_.memory_registrar->Unregister(start, length);
    }
    if (memory_ != nullptr) {
      options_.memory_registrar->Unregister(memory_->arena_base(), memory_->arena_size());
    }
  }
  Status s;
  // By default what is only in memory is made durable first, as Flush() would (Close
  // holds lifecycle_mu_ exclusively: no call races with it).
  if (ssd_ != nullptr && options_.flush_on_close) s = FlushLocked();
  if (memory_ != nullptr) memory_->SetEvictionHandler(nullptr);
  if (ssd_ != nullptr) {
    Status c = ssd_->Close();
    if (s.ok()) s = c;
  }
  const uint64_t teardown = env_->NowMicros();
  ssd_.reset();
  prefetcher_.reset();
  offloader_.reset();
  gpu_.reset();  // unregisters the arena from CUDA before it is unmapped
  memory_.reset();
  logger_.Logf(LogLevel::kDebug, "close: tiers freed in %.3f s",
               static_cast<double>(env_->NowMicros() - teardown) / 1e6);
  if (lock_ != nullptr) {
    Status u = env_->UnlockFile(std::move(lock_));
    if (s.ok()) s = u;
  }
  return log.Finish(s);
}

bool DBImpl::LookupInMemory(const Slice& key, bool wait, MemoryTier::Handle* handle) {
  if (!(wait ? memory_->Lookup(key, handle) : memory_->TryLookup(key, handle))) return false;
  // A peer's server reads the value pinned: a read served by the memory tier.  The
  // server's worker (`wait`) always serves what it pins: counted here.  The poller's
  // attempt (!wait) gives its pins up when a key of the batch is not in memory, and a
  // worker pins them again: counted by CountServedFromMemory once the poller answers,
  // so that every read is counted once.  A miss goes on to the ordinary read path,
  // which counts it.
  if (wait) CountServedFromMemory(1, handle->value().size());
  return true;
}

void DBImpl::CountServedFromMemory(uint64_t values, uint64_t bytes) {
  counters_.gets.fetch_add(values, std::memory_order_relaxed);
  counters_.get_bytes.fetch_add(bytes, std::memory_order_relaxed);
  tiers_.memory.Add(tiers_.memory.hits, values);
  tiers_.memory.Add(tiers_.memory.bytes_out, bytes);
}

Status DBImpl::CheckOpen() const {
  if (closed_) return Status::Aborted("DB is closed");
  return Status::OK();
}

Status DBImpl::StartBatch(const char* call, std::span<const Slice> keys, size_t others,
                          const char* what, bool unique_keys, std::vector<int64_t>* results) {
  Status s = CheckOpen();
  if (s.ok()) {
    s = input::CheckBatch(call, results, keys.size(), others, what, options_.max_batch_size);
  }
  if (s.ok() && unique_keys) s = input::CheckUniqueKeys(keys);
  if (results != nullptr) results->clear();
  if (!s.ok()) return s;
  counters_.batch_calls.fetch_add(1, std::memory_order_relaxed);
  results->resize(keys.size());
  return s;
}

Status DBImpl::CheckKey(const Slice& key) const {
  return input::CheckKey(key, options_.max_key_size);
}

Status DBImpl::RegisterBuffer(void* addr, size_t length) {
  PerfPoint perf(PerfKey::db_register_buffer);
  CallLog log(&logger_, "register_buffer", &errors_);
  log.Add("length", length);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  s = registered_buffers_.Add(addr, length, "RegisterBuffer");
  if (!s.ok()) return log.Finish(s);
  if (options_.memory_registrar) {
    s = options_.memory_registrar->Register(addr, length, "user buffer");
    if (!s.ok()) registered_buffers_.Remove(addr);
  }
  return log.Finish(s);
}

Status DBImpl::UnregisterBuffer(void* addr) {
  PerfPoint perf(PerfKey::db_unregister_buffer);
  CallLog log(&logger_, "unregister_buffer", &errors_);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  const size_t length = registered_buffers_.Remove(addr);
  if (length == 0) {
    return log.Finish(
        Status::NotFound("UnregisterBuffer: no registered buffer starts at this address"));
  }
  if (options_.memory_registrar) options_.memory_registrar->Unregister(addr, length);
  return log.Finish(Status::OK());
}

Status DBImpl::Flush() {
  PerfPoint perf(PerfKey::db_flush);
  CallLog log(&logger_, "flush", &errors_);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok() || ssd_ == nullptr) return log.Finish(s);  // memory has nothing durable
  return log.Finish(FlushLocked());
}

Status DBImpl::FlushLocked() {
  // Serialized: the watermark is only raised by the Flush that wrote everything below it.
  MutexLock flush_lock(&flush_mu_);
  const uint64_t target = version_source_.load();
  Status s;
  if (options_.offload_policy == OffloadPolicy::kWriteBack)
    s = PersistMemoryAbove(flushed_through_);
  Status synced = ssd_->Flush();
  if (s.ok()) s = synced;
  if (s.ok()) flushed_through_ = target;
  return s;
}

Status DBImpl::PersistMemoryAbove(uint64_t watermark) {
  // Every value in memory with a version above the watermark was written (or read through
  // from a peer) since the last complete Flush; the ones below it were staged then, or
  // came back from SSD with their SSD version.
  std::vector<std::string> keys;
  memory_->ForEach([&](std::string_view key, uint64_t, uint64_t version) {
    if (version > watermark) keys.emplace_back(key);
  });
  uint64_t failed = 0;
  Status first_error;
  std::vector<std::pair<std::string, uint64_t>> persisted;
  for (std::string& key : keys) {
    MemoryTier::Handle handle;
    if (!memory_->Lookup(key, &handle)) continue;  // deleted or evicted (to SSD) meanwhile
    Status s = offloader_->Persist(key, handle.value(), handle.version());
    if (!s.ok()) {
      if (failed++ == 0) first_error = s;
    } else {
      persisted.emplace_back(std::move(key), handle.version());
    }
  }
  // A value staged early in this Flush may have been evicted from SSD by a later one: its
  // namespace's SSD quota, or a tier smaller than what memory holds, made room with it.
  // Still the value memory holds, it is not durable: the Flush says so.
  for (const auto& [key, version] : persisted) {
    if (ssd_->HasVersion(key, version)) continue;
    MemoryTier::Handle handle;
    if (!memory_->Lookup(key, &handle) || handle.version() != version) continue;
    if (failed++ == 0) {
      first_error = Status::NoSpace(
          "the value of key " + Printable(key) +
          " left the SSD tier before the Flush ended (evicted to make room: its namespace's "
          "SSD quota, or the tier, is smaller than what memory holds)");
    }
  }
  if (failed == 0) return Status::OK();
  return Status::FromErrorCode(
      first_error.ErrorCode(),
      "Flush: " + std::to_string(failed) + " of " + std::to_string(keys.size()) +
          " values could not be written to SSD; first: " + first_error.message());
}

Status DBImpl::CompactBuckets(uint64_t* reclaimed_bytes) {
  ReaderLock guard(&lifecycle_mu_);
  if (reclaimed_bytes != nullptr) *reclaimed_bytes = 0;
  Status s = CheckOpen();
  if (!s.ok() || ssd_ == nullptr) return s;
  return ssd_->CompactBuckets(reclaimed_bytes);
}

Status DBImpl::ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) {
  return ReadFeed(max_events, batch, [&] { removal_feed_->Read(after, max_events, batch); });
}

Status DBImpl::ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                            ResidentSnapshot* snapshot) {
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (snapshot == nullptr || !batch) {
    return Status::InvalidArgument("ReadResident: snapshot or batch is null");
  }
  if (max_batch == 0 || max_batch > options_.max_batch_size) {
    return Status::InvalidArgument("ReadResident: max_batch " + std::to_string(max_batch) +
                                   " is not in [1, max_batch_size (" +
                                   std::to_string(options_.max_batch_size) + ")]");
  }
  *snapshot = ResidentSnapshot();
  snapshot->epoch = epoch_;
  if (removal_feed_->enabled()) {  // first: a removal after it is in the feed
    RemovalBatch newest;
    removal_feed_->Read(0, 0, &newest);  // starts the recording too
    snapshot->removal_sequence = newest.last_sequence;
  }
  std::vector<ResidentKey> out;
  out.reserve(max_batch);
  bool more = true;
  const auto emit = [&](std::string&& key, LocatedTier tier) {
    if (!more || !std::string_view(key).starts_with(prefix.view())) return;
    out.push_back(ResidentKey{std::move(key), tier});
    if (out.size() == max_batch) {
      snapshot->keys += out.size();
      more = batch(out);
      out.clear();
    }
  };
  std::vector<std::string> keys;
  for (size_t shard = 0; more && shard < memory_->shard_count(); shard++) {
    memory_->CopyKeys(shard, &keys);
    for (std::string& key : keys) emit(std::move(key), kLocatedMemory);
    keys.clear();
  }
  if (more && ssd_ != nullptr) {
    ssd_->ForEachKey([&](const std::string& key) { emit(std::string(key), kLocatedSsd); });
  }
  if (more && !out.empty()) {
    snapshot->keys += out.size();
    batch(out);
  }
  return Status::OK();
}

Status DBImpl::ReadNamespaceRemovals(uint64_t id, uint64_t after, size_t max_events,
                                     RemovalBatch* batch) {
  return ReadFeed(max_events, batch,
                  [&] { removal_feed_->ReadNamespace(id, after, max_events, batch); });
}

Status DBImpl::ReadFeed(size_t max_events, RemovalBatch* batch, const std::function<void()>& read) {
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (batch == nullptr) return Status::InvalidArgument("ReadRemovals: batch is null");
  if (!removal_feed_->enabled()) {
    return Status::NotSupported("ReadRemovals: the removal feed is off (removal_feed_capacity=0)");
  }
  if (max_events > options_.max_batch_size) {
    return Status::InvalidArgument("ReadRemovals: max_events " + std::to_string(max_events) +
                                   " exceeds max_batch_size (" +
                                   std::to_string(options_.max_batch_size) + ")");
  }
  read();
  counters_.removal_feed_read.fetch_add(batch->events.size(), std::memory_order_relaxed);
  counters_.removal_feed_missed.fetch_add(batch->missed, std::memory_order_relaxed);
  return Status::OK();
}

bool DBImpl::GetProperty(const std::string& name, std::string* value) {
  ReaderLock guard(&lifecycle_mu_);
  if (value == nullptr) return false;
  if (closed_) {
    *value = "DB is closed";
    return false;
  }
  if (name == "kvengine.stats") {
    *value = StatsText();
  } else if (name == "kvengine.stats.json") {
    *value = StatsJson();
  } else if (name == "kvengine.options") {
    *value = options_.ToString();
  } else if (name == "kvengine.perf" || name == "kvengine.perf.json") {
    *value = PerfReport(name == "kvengine.perf.json");
  } else if (name == "kvengine.stats.prometheus" || name == "kvengine.prometheus" ||
             name == "kvengine.metrics") {
    *value = StatsPrometheus();
  } else if (name == "kvengine.readiness") {
    *value = Readiness();
  } else if (name == "kvengine.epoch") {
    *value = std::to_string(epoch_);
  } else {
    return false;
  }
  return true;
}

// One "check: ok" or "check: not ready: why" line per condition the engine knows.  The
// SSD tier's recovery runs inside Open, so a DB that answers has finished it.
std::string DBImpl::Readiness() const {
  std::string out = "recovery: ok\n";
  if (ssd_ != nullptr) {
    const Status writer = ssd_->WriterStatus();
    out += writer.ok() ? "ssd_writable: ok\n"
                       : "ssd_writable: not ready: SSD tier is read-only, its bucket writer "
                         "failing: " +
                             writer.ToString() + "\n";
  }
  return out;
}

void DBImpl::ResetPerf() { ::kvengine::ResetPerf(); }

}  // namespace kvengine
