// DBImpl, reads: gets into host or device buffers, exists, value sizes, and the pins of
// values in memory an attached client reads through.
#include <cinttypes>
#include <cstring>
#include <set>
#include <sstream>
#include <unordered_set>

#include "db/db_impl.h"
#include "db/offloader.h"
#include "db/prefetcher.h"
#include "env/gpu_io.h"
#include "util/buffers.h"
#include "util/config_parse.h"
#include "util/hash.h"
#include "util/input_check.h"
#include "util/namespace_key.h"
#include "util/printable.h"

namespace kvengine {

Status DBImpl::PinInMemory(const Slice& key, uint64_t capacity, MemoryTier::Handle* handle) {
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (s.ok()) s = CheckKey(key);
  if (!s.ok()) return s;
  AwaitPrefetch(key);
  const bool found = memory_->Lookup(key, handle);
  NotePrefetchRead(key, found);
  if (!found) return Missing(key);
  counters_.gets.fetch_add(1, std::memory_order_relaxed);
  const uint64_t size = handle->value().size();
  if (size > capacity) {
    handle->Release();
    return TooSmall(key, size, capacity);
  }
  CountHit(tiers_.memory, key, size);
  counters_.get_bytes.fetch_add(size, std::memory_order_relaxed);
  return Status::OK();
}

Status DBImpl::Missing(const Slice& key) {
  if (ns::IsNamespaced(key.view())) return Status::NotFound({});
  return KeyNotFound(key);
}

void DBImpl::CountHit(TierCounters& tier, const Slice& key, uint64_t size) {
  tier.Hit(size);
  NamespaceUsage::Slot* ns = namespace_usage_->Of(key.view());
  ns->Count(ns->hits);
}

void DBImpl::CountMiss(const Slice& key) {
  counters_.misses.fetch_add(1, std::memory_order_relaxed);
  NamespaceUsage::Slot* ns = namespace_usage_->Of(key.view());
  ns->Count(ns->misses);
  if (ssd_ != nullptr) tiers_.ssd.Add(tiers_.ssd.misses);
  TierCounters& last = ssd_ != nullptr ? tiers_.ssd : tiers_.memory;
  last.Failed(evicted_keys_.Contains(Hash64(key.view())) ? ReadFailure::evicted
                                                         : ReadFailure::absent);
}

Status DBImpl::CheckDestination(const Slice& key, std::span<const MutableSlice> dest,
                                uint64_t* capacity) const {
  *capacity = 0;
  for (size_t i = 0; i < dest.size(); i++) {
    if (dest[i].data() == nullptr && dest[i].size() != 0) {
      return Status::InvalidArgument("destination buffer " + std::to_string(i) + " of key " +
                                     Printable(key) + " is null with length " +
                                     std::to_string(dest[i].size()));
    }
    *capacity += dest[i].size();
  }
  return Status::OK();
}

Status DBImpl::GetFromMemory(const Slice& key, std::span<const MutableSlice> dest,
                             uint64_t capacity, uint64_t* size) {
  AwaitPrefetch(key);
  MemoryTier::Handle handle;
  memory_->Lookup(key, &handle);
  NotePrefetchRead(key, handle.valid());
  return CopyFromMemory(key, &handle, dest, capacity, size);
}

Status DBImpl::CopyFromMemory(const Slice& key, MemoryTier::Handle* handle,
                              std::span<const MutableSlice> dest, uint64_t capacity,
                              uint64_t* size) {
  if (!handle->valid()) {
    tiers_.memory.Add(tiers_.memory.misses);
    return Status::NotFound({});  // said to callers only, who name the key if they answer it
  }
  const Slice value = handle->value();
  *size = value.size();
  Status s;
  if (value.size() > capacity) {
    s = TooSmall(key, value.size(), capacity);
  } else {
    ScatterCopy(value.data(), value.size(), dest);
    CountHit(tiers_.memory, key, value.size());
    counters_.get_bytes.fetch_add(value.size(), std::memory_order_relaxed);
  }
  handle->Release();
  return s;
}

Status DBImpl::GetOne(const Slice& key, std::span<const MutableSlice> dest, uint64_t* size) {
  PerfPoint perf(PerfKey::db_get_one);
  *size = 0;
  Status s = CheckKey(key);
  uint64_t capacity = 0;
  if (s.ok()) s = CheckDestination(key, dest, &capacity);
  if (!s.ok()) return s;
  counters_.gets.fetch_add(1, std::memory_order_relaxed);
  s = GetFromMemory(key, dest, capacity, size);
  if (!s.IsNotFound()) return s;
  if (ssd_ == nullptr) {
    CountMiss(key);
    return Missing(key);
  }
  std::vector<int64_t> result(1);
  const Destination where(dest.begin(), dest.end());
  ReadFromSsd(std::span<const Slice>(&key, 1), std::span<const Destination>(&where, 1), {0},
              &result, true);
  if (result[0] >= 0) {
    *size = static_cast<uint64_t>(result[0]);
    return Status::OK();
  }
  if (result[0] == Status::BufferTooSmall("").ErrorCode()) {
    SsdLocation loc;
    if (ssd_->Locate(key, &loc)) *size = loc.size;
    return TooSmall(key, *size, capacity);
  }
  if (result[0] == -static_cast<int>(Status::Code::kNotFound)) return Missing(key);
  return Status::FromErrorCode(static_cast<int>(result[0]), "key " + Printable(key));
}

Status DBImpl::GetOneToDevice(const Slice& key, std::span<const MutableSlice> dest, int device,
                              GpuIo::Queue* copies, MemoryTier::Handle* pin, size_t* copy,
                              uint64_t* size) {
  *size = 0;
  *copy = kNoCopy;
  Status s = CheckKey(key);
  uint64_t capacity = 0;
  if (s.ok()) s = CheckDestination(key, dest, &capacity);
  if (!s.ok()) return s;
  AwaitPrefetch(key);
  if (memory_->Lookup(key, pin)) {  // host -> device straight from the arena
    NotePrefetchRead(key, true);
    counters_.gets.fetch_add(1, std::memory_order_relaxed);
    const Slice value = pin->value();
    *size = value.size();
    if (value.size() > capacity) {
      pin->Release();
      return TooSmall(key, value.size(), capacity);
    }
    CountHit(tiers_.memory, key, value.size());
    *copy = copies->ToDevice("key " + Printable(key), device, value, /*in_arena=*/true, dest);
    return Status::OK();
  }
  // Not in memory: the ordinary read into a host bounce buffer, then host -> device.
  return gpu_->GetViaHost(
      "key " + Printable(key), device, dest, std::min<uint64_t>(capacity, options_.max_value_size),
      [&](MutableSlice bounce, uint64_t* n) {
        return GetOne(key, std::span<const MutableSlice>(&bounce, 1), n);
      },
      size);
}

Status DBImpl::Get(const ReadOptions& options, const Slice& key, std::string* value) {
  PerfPoint perf(PerfKey::db_get);
  CallLog log(&logger_, "get", &errors_);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (value == nullptr) return log.Finish(Status::InvalidArgument("Get: value pointer is null"));
  s = CheckKey(key);
  if (!s.ok()) return log.FinishKey(s, key, -1, nullptr);
  AwaitPrefetch(key);
  MemoryTier::Handle handle;
  const bool in_memory = memory_->Lookup(key, &handle);
  NotePrefetchRead(key, in_memory);
  if (in_memory) {
    counters_.gets.fetch_add(1, std::memory_order_relaxed);
    value->assign(handle.value().data(), handle.value().size());
    CountHit(tiers_.memory, key, value->size());
    counters_.get_bytes.fetch_add(value->size(), std::memory_order_relaxed);
    return log.FinishKey(Status::OK(), key, static_cast<int64_t>(value->size()), "memory");
  }
  // Not in memory: size the string from where the value is, then read into it.  A
  // value replaced meanwhile by a larger one, or moved between the tiers, is retried.
  (void)options;
  for (int move = 0; move < kMaxMoves; move++) {
    uint64_t size = 0;
    const Place place = PlaceOf(key, &size);
    if (place == Place::kAbsent) {
      counters_.gets.fetch_add(1, std::memory_order_relaxed);
      tiers_.memory.Add(tiers_.memory.misses);
      CountMiss(key);
      return log.FinishKey(Missing(key), key, -1, nullptr);
    }
    if (place == Place::kMemory) {
      if (!memory_->Lookup(key, &handle)) continue;  // evicted meanwhile
      counters_.gets.fetch_add(1, std::memory_order_relaxed);
      value->assign(handle.value().data(), handle.value().size());
      CountHit(tiers_.memory, key, value->size());
      counters_.get_bytes.fetch_add(value->size(), std::memory_order_relaxed);
      return log.FinishKey(Status::OK(), key, static_cast<int64_t>(value->size()), "memory");
    }
    value->resize(size);
    MutableSlice buf(value->data(), value->size());
    s = GetOne(key, std::span<const MutableSlice>(&buf, 1), &size);
    if (s.ok()) {
      value->resize(size);
      return log.FinishKey(s, key, static_cast<int64_t>(size), "ssd");
    }
    if (!s.IsBufferTooSmall()) return log.FinishKey(s, key, -1, nullptr);
  }
  return log.FinishKey(Status::Busy("key " + Printable(key) + " kept moving while it was read"),
                       key, -1, nullptr);
}

Status DBImpl::GetInto(const ReadOptions&, const Slice& key, MutableSlice buffer,
                       size_t* value_size) {
  PerfPoint perf(PerfKey::db_get_into);
  CallLog log(&logger_, "get_into", &errors_);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  uint64_t size = 0;
  const std::span<const MutableSlice> dest(&buffer, 1);
  gpu_->BeginBatch();
  int device = -1;
  s = gpu_->Scan(dest, &device);
  if (!s.ok()) return ForKey(key, s);
  if (device >= 0) {
    GpuIo::Queue copies(gpu_.get());
    MemoryTier::Handle pin;
    size_t copy = kNoCopy;
    s = GetOneToDevice(key, dest, device, &copies, &pin, &copy, &size);
    if (s.ok() && copy != kNoCopy) {
      s = copies.Wait(copy);
      if (s.ok()) counters_.get_bytes.fetch_add(size, std::memory_order_relaxed);
    }
  } else {
    s = GetOne(key, dest, &size);
  }
  if (value_size != nullptr) *value_size = size;
  const bool size_known = s.ok() || s.IsBufferTooSmall();
  return log.FinishKey(s, key, size_known ? static_cast<int64_t>(size) : -1,
                       s.ok() ? "memory" : nullptr);
}

Status DBImpl::GetValueSize(const Slice& key, uint64_t* size) {
  PerfPoint perf(PerfKey::db_get_value_size);
  if (size == nullptr) return Status::InvalidArgument("GetValueSize: size pointer is null");
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  s = CheckKey(key);
  if (!s.ok()) return s;
  if (PlaceOf(key, size) == Place::kAbsent) return Missing(key);
  return Status::OK();
}

Status DBImpl::BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_get_into);
  CallLog log(&logger_, "batch_get_into", &errors_);
  log.Add("num_keys", keys.size());
  ReaderLock guard(&lifecycle_mu_);
  Status s = StartBatch("BatchGetInto", keys, destinations.size(), "destinations", false, results);
  if (!s.ok()) return log.Finish(s);
  std::vector<size_t> misses;
  // Where each key was served from and the size of a value too big for its buffers: the
  // log lines are written at the end, once SSD has answered.
  std::vector<const char*> tiers(keys.size(), nullptr);
  std::vector<int64_t> sizes(keys.size(), -1);
  gpu_->BeginBatch();
  // First each key's checks; the keys read into host memory are then looked up in the
  // memory tier all at once (the probes' cache misses overlap, and the values' first
  // bytes are on their way before the first copy).
  std::vector<Status> checks(keys.size());
  std::vector<int> devices(keys.size(), -1);
  std::vector<uint64_t> capacities(keys.size(), 0);
  std::vector<Slice> host_keys;
  for (size_t i = 0; i < keys.size(); i++) {
    Status& check = checks[i];
    check = gpu_->Scan(destinations[i], &devices[i]);
    if (!check.ok()) {
      check = ForKey(keys[i], check);
    } else if (devices[i] < 0) {
      check = CheckKey(keys[i]);
      if (check.ok()) check = CheckDestination(keys[i], destinations[i], &capacities[i]);
      if (check.ok()) host_keys.push_back(keys[i]);
    }
  }
  AwaitPrefetch(host_keys);
  std::vector<MemoryTier::Handle> pinned;
  memory_->BatchLookup(host_keys, &pinned);
  // Only while a prefetched value is followed: otherwise a batch pays one load, no vector.
  if (prefetcher_ != nullptr && prefetcher_->following()) {
    std::vector<bool> found(pinned.size());
    for (size_t j = 0; j < pinned.size(); j++) found[j] = pinned[j].valid();
    prefetcher_->NoteReads(host_keys, found);
  }
  size_t next_pinned = 0;
  uint64_t total_bytes = 0;
  // Copies to device memory are queued back to back on the bus and waited for after
  // the loop, their values pinned until then.
  GpuIo::Queue device_copies(gpu_.get());
  std::vector<MemoryTier::Handle> device_pins;    // moved as it grows: the copies hold values
  std::vector<std::pair<size_t, size_t>> queued;  // (key, copy)
  for (size_t i = 0; i < keys.size(); i++) {
    uint64_t size = 0;
    Status key_status = std::move(checks[i]);
    if (key_status.ok() && devices[i] >= 0) {
      size_t copy = kNoCopy;
      key_status = GetOneToDevice(keys[i], destinations[i], devices[i], &device_copies,
                                  &device_pins.emplace_back(), &copy, &size);
      if (key_status.ok() && copy != kNoCopy) {
        queued.emplace_back(i, copy);
        (*results)[i] = static_cast<int64_t>(size);
        continue;
      }
    } else if (key_status.ok()) {
      counters_.gets.fetch_add(1, std::memory_order_relaxed);
      key_status =
          CopyFromMemory(keys[i], &pinned[next_pinned++], destinations[i], capacities[i], &size);
      if (key_status.IsNotFound()) {
        if (ssd_ != nullptr) {
          misses.push_back(i);  // read with the other misses, in one submission
          continue;
        }
        CountMiss(keys[i]);
      }
    }
    (*results)[i] = key_status.ok() ? static_cast<int64_t>(size) : key_status.ErrorCode();
    if (key_status.ok()) {
      total_bytes += size;
      tiers[i] = "memory";
    }
    if (key_status.IsBufferTooSmall()) sizes[i] = static_cast<int64_t>(size);
  }
  for (const auto& [i, copy] : queued) {
    Status copied = device_copies.Wait(copy);
    if (copied.ok()) {
      counters_.get_bytes.fetch_add(static_cast<uint64_t>((*results)[i]),
                                    std::memory_order_relaxed);
      total_bytes += static_cast<uint64_t>((*results)[i]);
      tiers[i] = "memory";
    } else {
      (*results)[i] = copied.ErrorCode();
    }
  }
  device_pins.clear();
  if (!misses.empty()) ReadFromSsd(keys, destinations, misses, results, options.verify_checksums);
  for (size_t i : misses) {
    const int64_t r = (*results)[i];
    if (r >= 0) {
      total_bytes += static_cast<uint64_t>(r);
      tiers[i] = "ssd";
    }
  }
  for (size_t i = 0; i < keys.size(); i++) {
    const int64_t r = (*results)[i];
    const bool size_known = r >= 0 || r == Status::BufferTooSmall("").ErrorCode();
    log.Key(i, r < 0 ? r : 0, size_known ? (r >= 0 ? r : sizes[i]) : -1, tiers[i]);
  }
  log.Add("total_bytes", total_bytes);
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_exists);
  Status s = LocateBatch("batch_exists", "BatchExists", keys, results);
  if (s.ok()) {
    for (int64_t& r : *results) r = r > 0 ? 1 : r;
  }
  return s;
}

Status DBImpl::BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return LocateBatch("batch_locate", "BatchLocate", keys, results);
}

Status DBImpl::LocateBatch(const char* log_name, const char* call, std::span<const Slice> keys,
                           std::vector<int64_t>* results) {
  CallLog log(&logger_, log_name, &errors_);
  log.Add("num_keys", keys.size());
  ReaderLock guard(&lifecycle_mu_);
  Status s = StartBatch(call, keys, keys.size(), "keys", false, results);
  if (!s.ok()) return log.Finish(s);
  counters_.exists_queries.fetch_add(keys.size(), std::memory_order_relaxed);
  // The memory tier answers for the whole batch at once (its probes overlap); the SSD
  // tier is asked only about the keys memory does not hold, as one by one.
  std::vector<uint8_t> in_memory;
  memory_->BatchContains(keys, &in_memory);
  for (size_t i = 0; i < keys.size(); i++) {
    Status key_status = CheckKey(keys[i]);
    const char* tier = nullptr;
    if (!key_status.ok()) {
      (*results)[i] = key_status.ErrorCode();
    } else if (in_memory[i]) {
      (*results)[i] = kLocatedMemory;
      tier = "memory";
    } else if (ssd_ == nullptr) {
      (*results)[i] = kLocatedAbsent;
    } else {
      // Not in memory a moment ago: both tiers asked under the key's lock, so that a key
      // moving between them is not missed by both looks.
      uint64_t size = 0;
      const Place place = PlaceOf(keys[i], &size);
      (*results)[i] = place == Place::kMemory ? kLocatedMemory
                      : place == Place::kSsd  ? kLocatedSsd
                                              : kLocatedAbsent;
      tier = place == Place::kMemory ? "memory" : place == Place::kSsd ? "ssd" : nullptr;
    }
    const int64_t r = (*results)[i];
    log.Key(i, r, -1, tier, r >= 0 ? static_cast<int>(r != 0) : -1);
  }
  return log.Finish(Status::OK(), keys);
}

void DBImpl::ReadFromSsd(std::span<const Slice> keys, std::span<const Destination> dests,
                         const std::vector<size_t>& misses, std::vector<int64_t>* results,
                         bool verify, bool resolve) {
  std::vector<SsdTier::Read> reads(misses.size());
  for (size_t j = 0; j < misses.size(); j++) {
    reads[j].key = keys[misses[j]];
    reads[j].dest = dests[misses[j]];
  }
  uint64_t promotions = 0, promoted_bytes = 0;
  SsdTier::ReadDone promote;
  if (options_.promote_on_read) {
    // Each value as soon as it is read, while the rest of the batch is still on its way:
    // the bytes are in the caller's buffers; copy them into the memory tier, unless the
    // key changed meanwhile (checked under the key's lock).
    promote = [&](size_t j) {
      const SsdTier::Read& r = reads[j];
      const std::vector<Slice> parts = FilledParts(r.dest, r.size);
      const uint64_t version = r.version;
      if (memory_->Insert(r.key, parts, r.size, version,
                          [&] { return ssd_->HasVersion(r.key, version); })) {
        promotions++;
        promoted_bytes += r.size;
      }
    };
  }
  ssd_->MultiGet(reads, verify, promote);
  tiers_.ssd.Add(tiers_.ssd.promotions, promotions);
  tiers_.memory.Add(tiers_.memory.bytes_in, promoted_bytes);
  for (size_t j = 0; j < misses.size(); j++) {
    SsdTier::Read& r = reads[j];
    const Slice key = keys[misses[j]];
    if (r.status.IsNotFound()) {
      uint64_t size = 0;
      Status s = resolve ? ResolveMiss(key, r.dest, verify, &size) : r.status;
      (*results)[misses[j]] = s.ok() ? static_cast<int64_t>(size) : s.ErrorCode();
      continue;
    }
    if (!r.status.ok()) {
      if (r.status.IsCorruption()) tiers_.ssd.Failed(ReadFailure::checksum_mismatch);
      if (r.status.IsIOError()) tiers_.ssd.Failed(ReadFailure::io_error);
      if (r.status.IsCorruption() || r.status.IsIOError()) {
        logger_.Logf(LogLevel::kError, "reading key %s from SSD: %s", Printable(key).c_str(),
                     r.status.ToString().c_str());
      }
      (*results)[misses[j]] = r.status.ErrorCode();
      continue;
    }
    CountHit(tiers_.ssd, key, r.size);
    counters_.get_bytes.fetch_add(r.size, std::memory_order_relaxed);
    (*results)[misses[j]] = static_cast<int64_t>(r.size);
  }
}

DBImpl::Place DBImpl::PlaceOf(const Slice& key, uint64_t* size) {
  Place place = Place::kAbsent;
  *size = 0;
  // The memory tier's key lock, then the SSD tier's: the order Publish keeps.
  memory_->WithKeyLocked(key, [&](uint64_t version, uint64_t in_memory) {
    SsdLocation loc;
    if (version != 0) {
      place = Place::kMemory;
      *size = in_memory;
    } else if (ssd_ != nullptr && ssd_->Locate(key, &loc)) {
      place = Place::kSsd;
      *size = loc.size;
    }
  });
  return place;
}

Status DBImpl::ResolveMiss(const Slice& key, std::span<const MutableSlice> dest, bool verify,
                           uint64_t* size) {
  *size = 0;
  uint64_t capacity = 0;
  for (const MutableSlice& d : dest) capacity += d.size();
  for (int move = 0; move < kMaxMoves; move++) {
    uint64_t found_size = 0;
    const Place place = PlaceOf(key, &found_size);
    if (place == Place::kAbsent) {
      CountMiss(key);
      return Status::NotFound({});  // its caller keeps the code only
    }
    Status s;
    if (place == Place::kMemory) {
      MemoryTier::Handle handle;
      memory_->Lookup(key, &handle);
      s = CopyFromMemory(key, &handle, dest, capacity, size);
    } else {
      std::vector<int64_t> result(1);
      const Destination where(dest.begin(), dest.end());
      ReadFromSsd(std::span<const Slice>(&key, 1), std::span<const Destination>(&where, 1), {0},
                  &result, verify, /*resolve=*/false);
      if (result[0] >= 0) *size = static_cast<uint64_t>(result[0]);
      // A NotFound is looked again, never answered: not worth naming the key.
      s = result[0] >= 0 ? Status::OK()
          : result[0] == -static_cast<int>(Status::Code::kNotFound)
              ? Status::NotFound({})
              : Status::FromErrorCode(static_cast<int>(result[0]), "key " + Printable(key));
    }
    if (!s.IsNotFound()) return s;  // read (or failed) where it is now
  }
  return Status::Busy("key " + Printable(key) + " kept moving between tiers while it was read");
}

Status DBImpl::Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_prefetch);
  CallLog log(&logger_, "prefetch", &errors_);
  log.Add("num_keys", keys.size());
  ReaderLock guard(&lifecycle_mu_);
  Status s = StartBatch("Prefetch", keys, keys.size(), "keys", false, results);
  if (!s.ok()) return log.Finish(s);
  // Malformed keys are refused one by one; the others go to the prefetcher.
  std::vector<Slice> valid;
  std::vector<size_t> where;
  for (size_t i = 0; i < keys.size(); i++) {
    Status key_status = CheckKey(keys[i]);
    (*results)[i] = key_status.ok() ? 0 : key_status.ErrorCode();
    if (key_status.ok()) {
      valid.push_back(keys[i]);
      where.push_back(i);
    }
  }
  if (prefetcher_ != nullptr && !valid.empty()) {
    std::vector<int64_t> queued(valid.size(), 0);
    prefetcher_->Submit(valid, &queued);
    for (size_t j = 0; j < valid.size(); j++) (*results)[where[j]] = queued[j];
  }
  uint64_t started = 0;
  for (int64_t r : *results) started += r == 1;
  log.Add("queued", started);
  return log.Finish(Status::OK(), keys);
}

void DBImpl::AwaitPrefetch(std::span<const Slice> keys) {
  if (prefetcher_ != nullptr) prefetcher_->AwaitKeys(keys);
}

void DBImpl::AwaitPrefetch(const Slice& key) {
  if (prefetcher_ != nullptr) prefetcher_->AwaitKey(key);
}

void DBImpl::NotePrefetchRead(const Slice& key, bool found) {
  if (prefetcher_ != nullptr) prefetcher_->NoteRead(key, found);
}

}  // namespace kvengine
