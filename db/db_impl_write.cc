// DBImpl, writes: puts (from host or device memory, and an attached client's
// reservations), deletes, and the deletes by pattern.
#include <cinttypes>
#include <cstring>
#include <set>
#include <sstream>
#include <unordered_set>

#include "db/db_impl.h"
#include "db/offloader.h"
#include "env/gpu_io.h"
#include "util/buffers.h"
#include "util/config_parse.h"
#include "util/hash.h"
#include "util/input_check.h"
#include "util/key_pattern.h"
#include "util/namespace_key.h"
#include "util/printable.h"

namespace kvengine {

Status DBImpl::PutOne(const Slice& key, std::span<const Slice> parts) {
  PerfPoint perf(PerfKey::db_put_one);
  Status s = CheckKey(key);
  if (!s.ok()) return s;
  uint64_t size = 0;
  for (size_t i = 0; i < parts.size(); i++) {
    if (parts[i].data() == nullptr && parts[i].size() != 0) {
      return Status::InvalidArgument("value buffer " + std::to_string(i) + " of key " +
                                     Printable(key) + " is null with length " +
                                     std::to_string(parts[i].size()));
    }
    size += parts[i].size();
  }
  s = CheckValueSize(key, size);
  if (!s.ok()) return s;
  return Publish(key, parts, size, nullptr);
}

Status DBImpl::CheckValueSize(const Slice& key, uint64_t size) const {
  return input::CheckValueSize(key, size, options_.max_value_size);
}

Status DBImpl::Publish(const Slice& key, std::span<const Slice> parts, uint64_t size,
                       MemoryTier::Reservation* reserved) {
  Status s;
  SsdTier::Ticket ticket;
  if (ssd_ != nullptr && options_.offload_policy == OffloadPolicy::kWriteThrough) {
    s = ssd_->Stage(key, parts, size, &ticket, SsdTier::StageWait::kPut);
    if (!s.ok()) {
      counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
  }
  MemoryTier::VersionHook published;
  // What the hook needs, reached through one pointer: a lambda that captured its three
  // references would not fit std::function's inline room, and every put would allocate.
  struct PublishTo {
    SsdTier* ssd;
    SsdTier::Ticket* ticket;
    const Slice* key;
  } to{ssd_.get(), &ticket, &key};
  if (ssd_ != nullptr) {
    // Under the key's lock: the SSD copy of this version is published, or an older SSD
    // value is retired (and tombstoned), atomically with the memory tier.
    published = [to = &to](uint64_t version) {
      if (to->ticket->valid()) {
        to->ssd->Commit(to->ticket, version);
      } else {
        to->ssd->EraseOlderThan(*to->key, version);
      }
    };
  }
  s = reserved != nullptr ? memory_->Commit(key, reserved, nullptr, published)
                          : memory_->Put(key, parts, size, nullptr, published);
  if (!s.ok() && ssd_ != nullptr) ssd_->Abort(&ticket);
  if (s.ok()) {
    counters_.puts.fetch_add(1, std::memory_order_relaxed);
    counters_.put_bytes.fetch_add(size, std::memory_order_relaxed);
    tiers_.memory.Add(tiers_.memory.bytes_in, size);
  } else {
    counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

Status DBImpl::Reserve(const Slice& key, uint64_t size, MemoryTier::Reservation* reservation) {
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (s.ok()) s = CheckKey(key);
  if (s.ok()) s = CheckValueSize(key, size);
  if (s.ok()) s = memory_->Reserve(key, size, MemoryTier::QuotaRoom::kEvictOwn, reservation);
  if (!s.ok()) counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
  return s;
}

Status DBImpl::ReserveSpare(uint64_t namespace_id, uint64_t size,
                            MemoryTier::Reservation* reservation) {
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (s.ok()) s = CheckValueSize(Slice("(a spare slot)"), size);
  if (!s.ok()) return s;
  // The namespace's prefix alone names it (MemoryTier::Reserve); "" the default one.
  const std::string charge_to = namespace_id == 0 ? std::string() : ns::Prefix(namespace_id);
  return memory_->Reserve(charge_to, size, MemoryTier::QuotaRoom::kNoEvict, reservation);
}

void DBImpl::Commit(std::span<const Slice> keys, std::span<MemoryTier::Reservation* const> slots,
                    std::vector<int64_t>* results) {
  results->assign(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); i++) (*results)[i] = CommitOne(keys[i], slots[i]).ErrorCode();
}

Status DBImpl::CommitOne(const Slice& key, MemoryTier::Reservation* reservation) {
  PerfPoint perf(PerfKey::db_put_one);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  // Checked again: a spare slot was reserved before its key was known.
  if (s.ok()) s = CheckKey(key);
  if (s.ok()) s = CheckValueSize(key, reservation->size());
  if (!s.ok()) {
    counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  const uint64_t size = reservation->size();
  const Slice value(reservation->data(), size);
  return Publish(key, std::span<const Slice>(&value, 1), size, reservation);
}

Status DBImpl::StartPutFromDevice(const Slice& key, std::span<const Slice> parts, int device,
                                  GpuIo::Queue* copies, DevicePut* put) {
  Status s = CheckKey(key);
  uint64_t size = 0;
  for (size_t i = 0; s.ok() && i < parts.size(); i++) {
    if (parts[i].data() == nullptr && parts[i].size() != 0) {
      s = Status::InvalidArgument("value buffer " + std::to_string(i) + " of key " +
                                  Printable(key) + " is null with length " +
                                  std::to_string(parts[i].size()));
    }
    size += parts[i].size();
  }
  if (s.ok()) s = CheckValueSize(key, size);
  if (s.ok()) s = memory_->Reserve(key, size, MemoryTier::QuotaRoom::kEvictOwn, &put->room);
  if (!s.ok()) return s;
  put->size = size;
  put->copy = copies->FromDevice("key " + Printable(key), device, parts, put->room.data(), size);
  return Status::OK();
}

Status DBImpl::FinishPutFromDevice(const Slice& key, GpuIo::Queue* copies, DevicePut* put) {
  Status s = copies->Wait(put->copy);
  if (!s.ok()) {
    put->room.Abandon();  // the copy is over: nothing writes into the room any more
    counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  const Slice value(put->room.data(), put->size);
  return Publish(key, std::span<const Slice>(&value, 1), put->size, &put->room);
}

Status DBImpl::PutOneFromDevice(const Slice& key, std::span<const Slice> parts, int device) {
  GpuIo::Queue copies(gpu_.get());
  DevicePut put;
  Status s = StartPutFromDevice(key, parts, device, &copies, &put);
  if (s.ok()) return FinishPutFromDevice(key, &copies, &put);
  counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
  return s;
}

Status DBImpl::DeleteOne(const Slice& key) {
  PerfPoint perf(PerfKey::db_delete_one);
  Status s = CheckKey(key);
  if (!s.ok()) return s;
  MemoryTier::CheckHook also_on_ssd;
  bool on_ssd = false, in_memory = false;
  // One pointer captured, as Publish's hook does, so that the hook does not allocate.
  struct EraseFrom {
    SsdTier* ssd;
    const Slice* key;
    bool* on_ssd;
  } from{ssd_.get(), &key, &on_ssd};
  if (ssd_ != nullptr) {
    also_on_ssd = [from = &from] { return *from->on_ssd = from->ssd->Erase(*from->key); };
  }
  evicted_keys_.Forget(Hash64(key.view()));  // a later miss is "absent" again
  if (!memory_->Erase(key, also_on_ssd, &in_memory)) {
    return Missing(key);
  }
  counters_.deletes.fetch_add(1, std::memory_order_relaxed);
  if (in_memory) tiers_.memory.Add(tiers_.memory.explicit_removals);
  if (on_ssd) tiers_.ssd.Add(tiers_.ssd.explicit_removals);
  return Status::OK();
}

Status DBImpl::Put(const WriteOptions&, const Slice& key, const Slice& value) {
  PerfPoint perf(PerfKey::db_put);
  CallLog log(&logger_, "put", &errors_);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  const std::span<const Slice> parts(&value, 1);
  gpu_->BeginBatch();
  int device = -1;
  s = gpu_->Scan(parts, &device);
  if (!s.ok()) return log.FinishKey(ForKey(key, s), key, -1, nullptr);
  s = device >= 0 ? PutOneFromDevice(key, parts, device) : PutOne(key, parts);
  return log.FinishKey(s, key, static_cast<int64_t>(value.size()), nullptr);
}

Status DBImpl::Delete(const WriteOptions&, const Slice& key) {
  PerfPoint perf(PerfKey::db_delete);
  CallLog log(&logger_, "delete", &errors_);
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  return log.FinishKey(DeleteOne(key), key, -1, nullptr);
}

Status DBImpl::BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                        std::span<const ValueParts> values, std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_put);
  CallLog log(&logger_, "batch_put", &errors_);
  log.Add("num_keys", keys.size());
  ReaderLock guard(&lifecycle_mu_);
  Status s = StartBatch("BatchPut", keys, values.size(), "values", true, results);
  if (!s.ok()) return log.Finish(s);
  if (options.fill_cache) {
    gpu_->BeginBatch();
    for (size_t i = 0; i < keys.size(); i++) {
      (*results)[i] = FillCache(keys[i], values[i]).ErrorCode();
      log.Key(i, (*results)[i], -1, "memory");
    }
    return log.Finish(Status::OK(), keys);
  }
  gpu_->BeginBatch();
  uint64_t total_bytes = 0;
  auto record = [&](size_t i, const Status& st) {
    const int64_t code = (*results)[i] = st.ErrorCode();
    if (code == 0 && log.active()) total_bytes += PartsSize(values[i]);
    log.Key(i, code, log.WantsKey(code) ? static_cast<int64_t>(PartsSize(values[i])) : -1, nullptr);
  };
  // Values in device memory are copied into their arena room ahead of the one being
  // published, so that the bus moves key after key: up to gpu_staging_bytes in flight,
  // and at most a quarter of the memory tier (rooms in flight cannot be evicted).
  const uint64_t window =
      std::min<uint64_t>(options_.gpu_staging_bytes, options_.memory_capacity_bytes / 4);
  GpuIo::Queue device_copies(gpu_.get());
  std::vector<std::pair<size_t, DevicePut>> device_puts;  // (key, put), in order
  size_t oldest = 0;                                      // device_puts[oldest..] are in flight
  uint64_t device_bytes = 0;                              // their values' bytes
  auto finish_oldest = [&] {
    auto& [i, put] = device_puts[oldest++];
    device_bytes -= put.size;
    record(i, FinishPutFromDevice(keys[i], &device_copies, &put));
  };
  for (size_t i = 0; i < keys.size(); i++) {
    int device = -1;
    Status gpu_status = gpu_->Scan(values[i], &device);
    if (!gpu_status.ok()) {
      record(i, ForKey(keys[i], gpu_status));
    } else if (device < 0) {
      record(i, PutOne(keys[i], values[i]));
    } else {
      DevicePut put;
      Status started = StartPutFromDevice(keys[i], values[i], device, &device_copies, &put);
      // No room: publish the puts in flight (their values become evictable), then retry.
      while (started.IsNoSpace() && oldest < device_puts.size()) {
        finish_oldest();
        started = StartPutFromDevice(keys[i], values[i], device, &device_copies, &put);
      }
      if (!started.ok()) {
        counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
        record(i, started);
        continue;
      }
      device_bytes += put.size;
      device_puts.emplace_back(i, std::move(put));
      while (oldest < device_puts.size() && device_bytes > window) finish_oldest();
    }
  }
  while (oldest < device_puts.size()) finish_oldest();
  log.Add("total_bytes", total_bytes);
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::FillCache(const Slice& key, std::span<const Slice> parts) {
  const uint64_t size = PartsSize(parts);
  Status s = CheckKey(key);
  if (s.ok()) s = CheckValueSize(key, size);
  int device = -1;
  if (s.ok()) s = gpu_->Scan(parts, &device);
  if (s.ok() && device >= 0) {
    s = Status::InvalidArgument("a cache fill of key " + Printable(key) +
                                " must come from host memory");
  }
  if (!s.ok()) return s;
  // A new local version; given up when the key appeared locally meanwhile, and never
  // evicting anything to make room (a fill is worth less than what is here).
  const uint64_t version = version_source_.fetch_add(1) + 1;
  if (memory_->Insert(key, parts, size, version,
                      [&] { return ssd_ == nullptr || !ssd_->Contains(key); })) {
    // The cluster layer's read-through promotion of a value a peer served.
    tiers_.peer.Add(tiers_.peer.promotions);
    tiers_.memory.Add(tiers_.memory.bytes_in, size);
  }
  return Status::OK();
}

Status DBImpl::BatchDelete(const WriteOptions&, std::span<const Slice> keys,
                           std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_delete);
  CallLog log(&logger_, "batch_delete", &errors_);
  log.Add("num_keys", keys.size());
  ReaderLock guard(&lifecycle_mu_);
  Status s = StartBatch("BatchDelete", keys, keys.size(), "keys", false, results);
  if (!s.ok()) return log.Finish(s);
  for (size_t i = 0; i < keys.size(); i++) {
    (*results)[i] = DeleteOne(keys[i]).ErrorCode();
    log.Key(i, (*results)[i], -1, nullptr);
  }
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
  PerfPoint perf(PerfKey::db_delete_by_regex);
  CallLog log(&logger_, "delete_by_regex", &errors_);
  // Checked before anything is sent to a peer: a bad pattern removes nothing anywhere.
  KeyPattern re;
  Status s = re.Compile(pattern);
  if (!s.ok()) return log.Finish(std::move(s));
  return DeleteWhere(
      &log, [&re](std::string_view key) { return re.Matches(key); }, deleted);
}

Status DBImpl::DeleteAll(uint64_t* deleted) {
  PerfPoint perf(PerfKey::db_delete_all);
  CallLog log(&logger_, "delete_all", &errors_);
  return DeleteWhere(
      &log, [](std::string_view) { return true; }, deleted);
}

Status DBImpl::DeleteWhere(CallLog* log, const std::function<bool(std::string_view)>& pred,
                           uint64_t* deleted) {
  ReaderLock guard(&lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log->Finish(s);
  const uint64_t n = DeleteMatching(pred);
  if (deleted != nullptr) *deleted = n;
  log->Add("deleted", n);
  return log->Finish(s);
}

uint64_t DBImpl::DeleteMatching(const std::function<bool(std::string_view)>& pred) {
  // The keys are copied a memory shard at a time (then the SSD tier's), and matched with
  // no lock held: a slow pattern costs its caller, while every other call waits at most
  // for one shard's keys to be copied.  Each match is then deleted through the per-key
  // path, so that both tiers change together.  A key in both tiers is deleted from both
  // by the memory pass and not listed by the SSD tier after; a key written again while
  // the call runs may or may not be removed, as with a Delete racing a Put.
  uint64_t n = 0;
  std::vector<std::string> keys;
  const auto delete_matches = [&] {
    for (const std::string& key : keys) {
      if (pred(key)) n += DeleteOne(key).ok();
    }
    keys.clear();
  };
  for (size_t shard = 0; shard < memory_->shard_count(); shard++) {
    memory_->CopyKeys(shard, &keys);
    delete_matches();
  }
  if (ssd_ != nullptr) {
    ssd_->ForEachKey([&](const std::string& key) { keys.push_back(key); });
    delete_matches();
  }
  return n;
}

}  // namespace kvengine
