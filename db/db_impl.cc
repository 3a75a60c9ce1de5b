#include "db/db_impl.h"

#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_set>

#include "db/local_server.h"
#include "env/gpu_io.h"
#include "env/peer_env.h"
#include "transport/server.h"
#include "util/buffers.h"
#include "util/byte_regex.h"
#include "util/config_parse.h"

namespace kvengine {

namespace {

const char kIdentityFile[] = "IDENTITY";
const char kIdentityText[] = "kvengine db format 1\n";

std::string Printable(const Slice& key) {
  // Keys are arbitrary bytes; messages show at most 64 of them, escaping the rest.
  std::string out;
  for (size_t i = 0; i < key.size() && i < 64; i++) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (key.size() > 64) out += "...";
  return "'" + out + "'";
}

// A GpuIo error about one key's buffers, with the key named.
Status ForKey(const Slice& key, const Status& s) {
  return Status::FromErrorCode(s.ErrorCode(), "key " + Printable(key) + ": " + s.message());
}

uint64_t PartsSize(std::span<const Slice> parts) {
  uint64_t size = 0;
  for (const Slice& part : parts) size += part.size();
  return size;
}

// BufferTooSmall for a value of `size` bytes and buffers of `capacity`.
Status TooSmall(const Slice& key, uint64_t size, uint64_t capacity) {
  return Status::BufferTooSmall("value of key " + Printable(key) + " is " + std::to_string(size) +
                                " bytes; buffers hold " + std::to_string(capacity));
}

}  // namespace

// Write-back offload: a value the memory tier evicts, or one that Flush() makes durable,
// goes to SSD.  The value is staged (copied into a bucket image) outside any lock, then
// published on SSD under the key's lock, and only if memory still holds that very version:
// a delete or overwrite that came in between wins, and the staged copy is given up.
class DBImpl::Offloader final : public EvictionHandler {
 public:
  Offloader(MemoryTier* memory, SsdTier* ssd) : memory_(memory), ssd_(ssd) {}

  bool OnEvict(const Slice& key, const Slice& value, uint64_t version) override {
    // SSD full or failing: the value stays in memory.
    return Persist(key, value, version).ok();
  }

  // OK when the value is safe on SSD (staged; durable once its bucket is written), or
  // memory no longer holds that version; the error of Stage otherwise.
  Status Persist(const Slice& key, const Slice& value, uint64_t version) {
    if (ssd_->HasVersion(key, version)) return Status::OK();  // write-through, or done
    SsdTier::Ticket ticket;
    Status s = ssd_->Stage(key, std::span<const Slice>(&value, 1), value.size(), &ticket);
    if (!s.ok()) return s;
    bool current = false;
    memory_->WithKeyLocked(key, [&](uint64_t in_memory) {
      current = in_memory == version;
      if (current) ssd_->Commit(&ticket, version);
    });
    if (!current) ssd_->Abort(&ticket);
    return Status::OK();
  }

 private:
  MemoryTier* const memory_;
  SsdTier* const ssd_;
};

Status DB::Open(const Options& options, const std::string& path, std::unique_ptr<DB>* db) {
  db->reset();
  Options effective = options;
  if (effective.apply_environment) {
    Status s = effective.ApplyEnvironment();
    if (!s.ok()) return s;
  }
  Status s = effective.Validate();
  if (!s.ok()) return s;
  if (path.empty()) return Status::InvalidArgument("DB path is empty");
  SetPerfLevel(effective.perf_level);
  PerfPoint perf(PerfKey::db_open);
  const uint64_t start_nanos = perf_internal::NowNanos();
  auto impl = std::make_unique<DBImpl>(effective, path);
  s = impl->Init();
  if (s.IsBusy()) {
    // Held by another process: when that owner serves local clients, attach to it.
    std::string socket_path;
    std::ifstream record(path + "/" + kLocalSocketFile);
    if (std::getline(record, socket_path) && !socket_path.empty()) {
      impl.reset();
      Status attached = DB::Attach(options, socket_path, db);
      return attached.ok() ? attached
                           : Status::Busy(s.ToString(), "attaching failed: " + attached.ToString());
    }
  }
  // Built after Init, which configures the logger.
  s = CallLog(impl->info_log(), "open", nullptr, start_nanos).Finish(std::move(s));
  if (!s.ok()) return s;
  *db = std::move(impl);
  return Status::OK();
}

DBImpl::DBImpl(const Options& options, std::string path)
    : options_(options), path_(std::move(path)) {
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
  // A record left by an owner that died names a socket nobody serves.
  if (options_.local_listen.empty()) env_->RemoveFile(path_ + "/" + kLocalSocketFile);
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

  if (options_.ssd_capacity_bytes > 0) {
    s = SsdTier::Open(options_, path_, env_, &logger_, &ssd_);
    if (!s.ok()) return s;
    version_source_.store(ssd_->recovered_max_version());
  }
  s = MemoryTier::Create(options_, &logger_, &version_source_, &memory_);
  if (!s.ok()) return s;
  if (ssd_ != nullptr) {
    offloader_ = std::make_unique<Offloader>(memory_.get(), ssd_.get());
    memory_->SetEvictionHandler(offloader_.get());
  }
  s = PeerEnv::Open(options_, &logger_, &peer_);  // peers: transports register the arena
  if (!s.ok()) return s;
  if (peer_ != nullptr) options_.memory_registrar = peer_->Registrar(options_.memory_registrar);
  if (options_.memory_registrar) {
    s = options_.memory_registrar->Register(memory_->arena_base(), memory_->arena_size(), "arena");
    if (!s.ok()) return s;
  }
  gpu_ = std::make_unique<GpuIo>(options_, &logger_, memory_->arena_base(), memory_->arena_size());
  if (peer_ != nullptr) {
    s = peer_->StartServing(
        this,
        [this](const Slice& key, bool wait, PinnedValue* out) {
          auto handle = std::make_shared<MemoryTier::Handle>();
          if (!(wait ? memory_->Lookup(key, handle.get())
                     : memory_->TryLookup(key, handle.get()))) {
            return false;
          }
          out->data = handle->value().data();
          out->size = handle->value().size();
          out->version = handle->version();
          out->pin = std::move(handle);
          return true;
        },
        memory_->arena_base());
    if (!s.ok()) return s;
  }
  if (!options_.local_listen.empty()) {
    s = StartLocalServer();
    if (!s.ok()) return s;
  }
  logger_.Logf(LogLevel::kInfo, "opened %s: memory tier %s (%s pages, numa node %d)", path_.c_str(),
               FormatSize(memory_->arena_size()).c_str(), memory_->arena().backing(),
               memory_->arena().numa_node());
  return Status::OK();
}

Status DBImpl::StartLocalServer() {
  std::error_code ec;
  options_.local_listen = std::filesystem::absolute(options_.local_listen, ec).string();
  Status s = LocalServer::Start(options_, this, &logger_, &local_counters_, &local_server_);
  if (!s.ok()) return s;
  // Recorded so that DB::Open of this directory by another process attaches.
  const std::string record = path_ + "/" + kLocalSocketFile;
  std::unique_ptr<WritableFile> file;
  s = env_->NewWritableFile(record, FileOptions(), &file);
  if (s.ok()) s = file->Append(Slice(options_.local_listen));
  if (s.ok()) s = file->Close();
  return s;
}

Status DBImpl::Close() {
  PerfPoint perf(PerfKey::db_close);
  CallLog log(&logger_, "close", nullptr);
  std::lock_guard<std::mutex> closing(close_mu_);
  // Attached clients go first: their sessions hold reservations and pins in the arena.
  if (local_server_ != nullptr) {
    local_server_->Stop();
    local_server_.reset();
    env_->RemoveFile(path_ + "/" + kLocalSocketFile);
  }
  // Drain the peers' requests first: they hold lifecycle_mu_ shared while they run.
  if (peer_ != nullptr) peer_->Close();
  std::unique_lock<std::shared_mutex> guard(lifecycle_mu_);
  if (closed_) {
    perf.Abandon();  // not a close: the DB was closed before
    return Status::OK();
  }
  closed_ = true;
  if (memory_ == nullptr && lock_ == nullptr) return Status::OK();  // Init failed early
  if (options_.memory_registrar) {
    std::lock_guard<std::mutex> lock(buffers_mu_);
    for (const auto& [start, length] : registered_buffers_) {
      options_.memory_registrar->Unregister(reinterpret_cast<void*>(start), length);
    }
    if (memory_ != nullptr) {
      options_.memory_registrar->Unregister(memory_->arena_base(), memory_->arena_size());
    }
  }
  registered_buffers_.clear();
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

Status DBImpl::CheckOpen() const {
  if (closed_) return Status::Aborted("DB is closed");
  return Status::OK();
}

Status DBImpl::CheckKey(const Slice& key) const {
  if (key.size() == 0) return Status::InvalidArgument("key is empty");
  if (key.data() == nullptr) return Status::InvalidArgument("key is a null pointer");
  if (key.size() > options_.max_key_size) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes exceeds max_key_size (" +
                                   std::to_string(options_.max_key_size) + "): " + Printable(key));
  }
  return Status::OK();
}

Status DBImpl::CheckBatchSize(size_t keys, size_t others, const char* what) const {
  if (keys != others) {
    return Status::InvalidArgument("batch has " + std::to_string(keys) + " keys but " +
                                   std::to_string(others) + " " + what);
  }
  if (keys > options_.max_batch_size) {
    return Status::InvalidArgument("batch of " + std::to_string(keys) +
                                   " keys exceeds max_batch_size (" +
                                   std::to_string(options_.max_batch_size) + ")");
  }
  return Status::OK();
}

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
  if (size > options_.max_value_size) {
    return Status::InvalidArgument("value of key " + Printable(key) + " exceeds max_value_size (" +
                                   FormatSize(options_.max_value_size) + ")");
  }
  return Status::OK();
}

Status DBImpl::Publish(const Slice& key, std::span<const Slice> parts, uint64_t size,
                       MemoryTier::Reservation* reserved) {
  Status s;
  SsdTier::Ticket ticket;
  if (ssd_ != nullptr && options_.offload_policy == OffloadPolicy::kWriteThrough) {
    s = ssd_->Stage(key, parts, size, &ticket);
    if (!s.ok()) {
      counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
  }
  MemoryTier::VersionHook published;
  if (ssd_ != nullptr) {
    // Under the key's lock: the SSD copy of this version is published, or an older SSD
    // value is retired (and tombstoned), atomically with the memory tier.
    published = [&](uint64_t version) {
      if (ticket.valid()) {
        ssd_->Commit(&ticket, version);
      } else {
        ssd_->EraseOlderThan(key, version);
      }
    };
  }
  s = reserved != nullptr ? memory_->Commit(key, reserved, nullptr, published)
                          : memory_->Put(key, parts, size, nullptr, published);
  if (!s.ok() && ssd_ != nullptr) ssd_->Abort(&ticket);
  if (s.ok()) {
    counters_.puts.fetch_add(1, std::memory_order_relaxed);
    counters_.put_bytes.fetch_add(size, std::memory_order_relaxed);
  } else {
    counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

Status DBImpl::ReserveForClient(const Slice* key, uint64_t size,
                                MemoryTier::Reservation* reservation) {
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (s.ok() && key != nullptr) s = CheckKey(*key);
  if (s.ok()) s = CheckValueSize(key != nullptr ? *key : Slice("(a spare slot)"), size);
  if (s.ok()) s = memory_->Reserve(size, reservation);
  if (!s.ok()) counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
  return s;
}

Status DBImpl::CommitForClient(const Slice& key, MemoryTier::Reservation* reservation) {
  PerfPoint perf(PerfKey::db_put_one);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
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

Status DBImpl::PinForClient(const Slice& key, uint64_t capacity, MemoryTier::Handle* handle,
                            MemoryTier::Reservation* staging, Slice* value) {
  {
    std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
    Status s = CheckOpen();
    if (s.ok()) s = CheckKey(key);
    if (!s.ok()) return s;
    if (memory_->Lookup(key, handle)) {
      counters_.gets.fetch_add(1, std::memory_order_relaxed);
      counters_.memory_hits.fetch_add(1, std::memory_order_relaxed);
      *value = handle->value();
      if (value->size() > capacity) {
        handle->Release();
        return TooSmall(key, value->size(), capacity);
      }
      counters_.get_bytes.fetch_add(value->size(), std::memory_order_relaxed);
      return Status::OK();
    }
  }
  // Not in memory: read it (SSD, peers; promoted by policy) into a staging reservation of
  // the arena that only this client sees.  The value may change size between the two
  // calls: then read again.
  for (int attempt = 0; attempt < 4; attempt++) {
    uint64_t size = 0;
    Status s = GetValueSize(key, &size);
    if (!s.ok()) return s;
    if (size > capacity) {
      *value = Slice(static_cast<const char*>(nullptr), size);  // the size needed
      return TooSmall(key, size, capacity);
    }
    {
      std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
      s = CheckOpen();
      if (s.ok()) s = memory_->Reserve(size, staging);
      if (!s.ok()) return s;
    }
    std::vector<Destination> dest(1);
    dest[0].emplace_back(staging->data(), size);
    std::vector<int64_t> result;
    s = BatchGetInto(ReadOptions(), std::span<const Slice>(&key, 1), dest, &result);
    if (!s.ok()) return s;
    if (result[0] >= 0) {
      *value = Slice(staging->data(), static_cast<size_t>(result[0]));
      return Status::OK();
    }
    staging->Abandon();
    if (result[0] != Status::BufferTooSmall("").ErrorCode()) {
      return Status::FromErrorCode(static_cast<int>(result[0]), "key " + Printable(key));
    }
  }
  return Status::Busy("key " + Printable(key) + " kept changing size while it was read");
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
  MemoryTier::Handle handle;
  memory_->Lookup(key, &handle);
  return CopyFromMemory(key, &handle, dest, capacity, size);
}

Status DBImpl::CopyFromMemory(const Slice& key, MemoryTier::Handle* handle,
                              std::span<const MutableSlice> dest, uint64_t capacity,
                              uint64_t* size) {
  if (!handle->valid()) return Status::NotFound("key " + Printable(key));
  counters_.memory_hits.fetch_add(1, std::memory_order_relaxed);
  const Slice value = handle->value();
  *size = value.size();
  Status s;
  if (value.size() > capacity) {
    s = TooSmall(key, value.size(), capacity);
  } else {
    ScatterCopy(value.data(), value.size(), dest);
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
    counters_.misses.fetch_add(1, std::memory_order_relaxed);
    return s;
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
  return Status::FromErrorCode(static_cast<int>(result[0]), "key " + Printable(key));
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
  if (s.ok()) s = memory_->Reserve(size, &put->room);
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

Status DBImpl::GetOneToDevice(const Slice& key, std::span<const MutableSlice> dest, int device,
                              GpuIo::Queue* copies, MemoryTier::Handle* pin, size_t* copy,
                              uint64_t* size) {
  *size = 0;
  *copy = kNoCopy;
  Status s = CheckKey(key);
  uint64_t capacity = 0;
  if (s.ok()) s = CheckDestination(key, dest, &capacity);
  if (!s.ok()) return s;
  if (memory_->Lookup(key, pin)) {  // host -> device straight from the arena
    counters_.gets.fetch_add(1, std::memory_order_relaxed);
    counters_.memory_hits.fetch_add(1, std::memory_order_relaxed);
    const Slice value = pin->value();
    *size = value.size();
    if (value.size() > capacity) {
      pin->Release();
      return TooSmall(key, value.size(), capacity);
    }
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

Status DBImpl::DeleteOne(const Slice& key) {
  PerfPoint perf(PerfKey::db_delete_one);
  Status s = CheckKey(key);
  if (!s.ok()) return s;
  MemoryTier::CheckHook also_on_ssd;
  if (ssd_ != nullptr) also_on_ssd = [&] { return ssd_->Erase(key); };
  if (!memory_->Erase(key, also_on_ssd)) return Status::NotFound("key " + Printable(key));
  counters_.deletes.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

Status DBImpl::Put(const WriteOptions&, const Slice& key, const Slice& value) {
  PerfPoint perf(PerfKey::db_put);
  CallLog log(&logger_, "put", &errors_);
  Endpoint owner;
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->Replicated()) {
    return log.FinishKey(peer_->PutReplicated(this, key, value), key,
                         static_cast<int64_t>(value.size()), "replicas");
  }
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->RemoteOwner(key, &owner)) {
    return log.FinishKey(peer_->Put(owner, key, value), key, static_cast<int64_t>(value.size()),
                         "peer");
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
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

Status DBImpl::Get(const ReadOptions& options, const Slice& key, std::string* value) {
  PerfPoint perf(PerfKey::db_get);
  CallLog log(&logger_, "get", &errors_);
  Endpoint owner;
  if (peer_ != nullptr && value != nullptr && CheckKey(key).ok() && peer_->Replicated()) {
    return log.FinishKey(peer_->GetReplicated(this, key, value), key, -1, "replicas");
  }
  if (peer_ != nullptr && value != nullptr && CheckKey(key).ok() &&
      peer_->RemoteOwner(key, &owner)) {
    return log.FinishKey(peer_->Get(owner, key, value), key, -1, "peer");
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (value == nullptr) return log.Finish(Status::InvalidArgument("Get: value pointer is null"));
  s = CheckKey(key);
  if (!s.ok()) return log.FinishKey(s, key, -1, nullptr);
  MemoryTier::Handle handle;
  if (memory_->Lookup(key, &handle)) {
    counters_.gets.fetch_add(1, std::memory_order_relaxed);
    counters_.memory_hits.fetch_add(1, std::memory_order_relaxed);
    value->assign(handle.value().data(), handle.value().size());
    counters_.get_bytes.fetch_add(value->size(), std::memory_order_relaxed);
    return log.FinishKey(Status::OK(), key, static_cast<int64_t>(value->size()), "memory");
  }
  // Not in memory: size the string from the SSD location, then read into it.  A value
  // replaced meanwhile by a larger one is retried.
  (void)options;
  for (int attempt = 0; attempt < 8; attempt++) {
    SsdLocation loc;
    if (ssd_ == nullptr || !ssd_->Locate(key, &loc)) {
      if (!memory_->Lookup(key, &handle)) break;
      value->assign(handle.value().data(), handle.value().size());
      return log.FinishKey(Status::OK(), key, static_cast<int64_t>(value->size()), "memory");
    }
    value->resize(loc.size);
    MutableSlice buf(value->data(), value->size());
    uint64_t size = 0;
    s = GetOne(key, std::span<const MutableSlice>(&buf, 1), &size);
    if (s.ok()) {
      value->resize(size);
      return log.FinishKey(s, key, static_cast<int64_t>(size), "ssd");
    }
    if (!s.IsBufferTooSmall()) return log.FinishKey(s, key, -1, nullptr);
  }
  if (peer_ != nullptr && peer_->ReadThrough()) {
    s = peer_->ReadThroughGetString(
        key, value,
        [this](const Slice& k, std::span<const Slice> p, uint64_t n) { PromoteFromPeer(k, p, n); });
    if (s.ok()) return s;
  }
  counters_.gets.fetch_add(1, std::memory_order_relaxed);
  counters_.misses.fetch_add(1, std::memory_order_relaxed);
  return log.FinishKey(Status::NotFound("key " + Printable(key)), key, -1, nullptr);
}

Status DBImpl::GetInto(const ReadOptions&, const Slice& key, MutableSlice buffer,
                       size_t* value_size) {
  PerfPoint perf(PerfKey::db_get_into);
  CallLog log(&logger_, "get_into", &errors_);
  Endpoint owner;
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->Replicated()) {
    return log.FinishKey(peer_->GetIntoReplicated(this, key, buffer, value_size), key, -1,
                         "replicas");
  }
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->RemoteOwner(key, &owner)) {
    return log.FinishKey(peer_->GetInto(owner, key, buffer, value_size), key, -1, "peer");
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
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
  if (s.IsNotFound() && device < 0 && peer_ != nullptr && peer_->ReadThrough()) {
    std::vector<int64_t> result{s.ErrorCode()};
    const Destination where{buffer};
    peer_->ReadThroughGet(
        std::span<const Slice>(&key, 1), std::span<const Destination>(&where, 1), &result,
        [this](const Slice& k, std::span<const Slice> p, uint64_t n) { PromoteFromPeer(k, p, n); });
    if (result[0] >= 0) {
      size = static_cast<uint64_t>(result[0]);
      s = Status::OK();
    } else if (result[0] != s.ErrorCode()) {
      s = Status::FromErrorCode(static_cast<int>(result[0]),
                                "key " + Printable(key) + " read from a peer");
    }
  }
  if (value_size != nullptr) *value_size = size;
  const bool size_known = s.ok() || s.IsBufferTooSmall();
  return log.FinishKey(s, key, size_known ? static_cast<int64_t>(size) : -1,
                       s.ok() ? "memory" : nullptr);
}

Status DBImpl::Delete(const WriteOptions&, const Slice& key) {
  PerfPoint perf(PerfKey::db_delete);
  CallLog log(&logger_, "delete", &errors_);
  Endpoint owner;
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->Replicated()) {
    return log.FinishKey(peer_->DeleteReplicated(this, key), key, -1, "replicas");
  }
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->RemoteOwner(key, &owner)) {
    return log.FinishKey(peer_->Delete(owner, key), key, -1, "peer");
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  return log.FinishKey(DeleteOne(key), key, -1, nullptr);
}

Status DBImpl::GetValueSize(const Slice& key, uint64_t* size) {
  PerfPoint perf(PerfKey::db_get_value_size);
  if (size == nullptr) return Status::InvalidArgument("GetValueSize: size pointer is null");
  Endpoint owner;
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->Replicated()) {
    return peer_->GetValueSizeReplicated(this, key, size);
  }
  if (peer_ != nullptr && CheckKey(key).ok() && peer_->RemoteOwner(key, &owner)) {
    return peer_->GetValueSize(owner, key, size);
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  s = CheckKey(key);
  if (!s.ok()) return s;
  MemoryTier::Handle handle;
  if (memory_->Lookup(key, &handle)) {
    *size = handle.value().size();
    return Status::OK();
  }
  SsdLocation loc;
  if (ssd_ != nullptr && ssd_->Locate(key, &loc)) {
    *size = loc.size;
    return Status::OK();
  }
  // Read-through: a GetInto of this key would find it on a peer, so its size must too
  // (the Python get sizes its bytes object this way).
  if (peer_ != nullptr && peer_->ReadThrough() && peer_->ReadThroughValueSize(key, size).ok()) {
    return Status::OK();
  }
  return Status::NotFound("key " + Printable(key));
}

Status DBImpl::BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                        std::span<const ValueParts> values, std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_put);
  CallLog log(&logger_, "batch_put", &errors_);
  log.Add("num_keys", keys.size());
  if (peer_ != nullptr && peer_->Routing()) {
    return log.Finish(peer_->BatchPut(this, options, keys, values, results));
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (results == nullptr) {
    return log.Finish(Status::InvalidArgument("BatchPut: results pointer is null"));
  }
  results->clear();
  s = CheckBatchSize(keys.size(), values.size(), "values");
  if (!s.ok()) return log.Finish(s);
  if (keys.size() > 1) {
    std::unordered_set<std::string_view> seen;
    seen.reserve(keys.size());
    for (const Slice& key : keys) {
      if (!seen.insert(key.view()).second) {
        return log.Finish(Status::InvalidArgument("BatchPut names key " + Printable(key) +
                                                  " more than once; nothing was written"));
      }
    }
  }
  counters_.batch_calls.fetch_add(1, std::memory_order_relaxed);
  results->resize(keys.size());
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

Status DBImpl::BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_get_into);
  CallLog log(&logger_, "batch_get_into", &errors_);
  log.Add("num_keys", keys.size());
  if (peer_ != nullptr && peer_->Routing()) {
    return log.Finish(peer_->BatchGetInto(this, options, keys, destinations, results));
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (results == nullptr) {
    return log.Finish(Status::InvalidArgument("BatchGetInto: results pointer is null"));
  }
  results->clear();
  s = CheckBatchSize(keys.size(), destinations.size(), "destinations");
  if (!s.ok()) return log.Finish(s);
  counters_.batch_calls.fetch_add(1, std::memory_order_relaxed);
  results->resize(keys.size());
  std::vector<size_t> misses;
  // Where each key was served from and the size of a value too big for its buffers: the
  // log lines are written at the end, once SSD and peers have answered.
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
  std::vector<MemoryTier::Handle> pinned;
  memory_->BatchLookup(host_keys, &pinned);
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
        counters_.misses.fetch_add(1, std::memory_order_relaxed);
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
  if (peer_ != nullptr && peer_->ReadThrough()) {
    peer_->ReadThroughGet(
        keys, destinations, results,
        [this](const Slice& k, std::span<const Slice> p, uint64_t n) { PromoteFromPeer(k, p, n); });
  }
  for (size_t i = 0; i < keys.size(); i++) {
    const int64_t r = (*results)[i];
    if (r >= 0 && tiers[i] == nullptr) {
      total_bytes += static_cast<uint64_t>(r);
      tiers[i] = "peer";
    }
    const bool size_known = r >= 0 || r == Status::BufferTooSmall("").ErrorCode();
    log.Key(i, r < 0 ? r : 0, size_known ? (r >= 0 ? r : sizes[i]) : -1, tiers[i]);
  }
  log.Add("total_bytes", total_bytes);
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_exists);
  CallLog log(&logger_, "batch_exists", &errors_);
  log.Add("num_keys", keys.size());
  if (peer_ != nullptr && peer_->Routing())
    return log.Finish(peer_->BatchExists(this, keys, results));
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (results == nullptr) {
    return log.Finish(Status::InvalidArgument("BatchExists: results pointer is null"));
  }
  results->clear();
  s = CheckBatchSize(keys.size(), keys.size(), "keys");
  if (!s.ok()) return log.Finish(s);
  counters_.batch_calls.fetch_add(1, std::memory_order_relaxed);
  counters_.exists_queries.fetch_add(keys.size(), std::memory_order_relaxed);
  results->resize(keys.size());
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
      (*results)[i] = 1;
      tier = "memory";
    } else if (ssd_ != nullptr && ssd_->Contains(keys[i])) {
      (*results)[i] = 1;
      tier = "ssd";
    } else {
      (*results)[i] = 0;
    }
    const int64_t r = (*results)[i];
    log.Key(i, r, -1, tier, r >= 0 ? static_cast<int>(r) : -1);
  }
  if (peer_ != nullptr && peer_->ReadThrough()) peer_->ReadThroughExists(keys, results);
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                           std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_delete);
  CallLog log(&logger_, "batch_delete", &errors_);
  log.Add("num_keys", keys.size());
  if (peer_ != nullptr && peer_->Routing()) {
    return log.Finish(peer_->BatchDelete(this, options, keys, results));
  }
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (results == nullptr) {
    return log.Finish(Status::InvalidArgument("BatchDelete: results pointer is null"));
  }
  results->clear();
  s = CheckBatchSize(keys.size(), keys.size(), "keys");
  if (!s.ok()) return log.Finish(s);
  counters_.batch_calls.fetch_add(1, std::memory_order_relaxed);
  results->resize(keys.size());
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
  ByteRegex re;
  Status s = re.Compile(pattern);
  if (!s.ok()) return log.Finish(std::move(s));
  return DeleteWhere(
      &log, [&](uint64_t* n) { return peer_->DeleteByRegex(this, pattern, n); },
      [&re](std::string_view key) { return re.Matches(key); }, deleted);
}

Status DBImpl::DeleteAll(uint64_t* deleted) {
  PerfPoint perf(PerfKey::db_delete_all);
  CallLog log(&logger_, "delete_all", &errors_);
  return DeleteWhere(
      &log, [&](uint64_t* n) { return peer_->DeleteAll(this, n); },
      [](std::string_view) { return true; }, deleted);
}

Status DBImpl::DeleteWhere(CallLog* log, const std::function<Status(uint64_t*)>& cluster,
                           const std::function<bool(std::string_view)>& pred, uint64_t* deleted) {
  uint64_t n = 0;
  Status s;
  if (peer_ != nullptr && peer_->Routing()) {
    s = cluster(&n);  // on failure n counts what the members that succeeded removed
  } else {
    std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
    s = CheckOpen();
    if (!s.ok()) return log->Finish(s);
    n = DeleteMatching(pred);
  }
  if (deleted != nullptr) *deleted = n;
  log->Add("deleted", n);
  return log->Finish(s);
}

Status DBImpl::RegisterBuffer(void* addr, size_t length) {
  PerfPoint perf(PerfKey::db_register_buffer);
  CallLog log(&logger_, "register_buffer", &errors_);
  log.Add("length", length);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (addr == nullptr)
    return log.Finish(Status::InvalidArgument("RegisterBuffer: address is null"));
  if (length == 0) return log.Finish(Status::InvalidArgument("RegisterBuffer: length is zero"));
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (start + length < start)
    return log.Finish(Status::InvalidArgument("RegisterBuffer: range wraps around"));
  std::lock_guard<std::mutex> lock(buffers_mu_);
  auto next = registered_buffers_.lower_bound(start);
  bool overlaps = next != registered_buffers_.end() && next->first < start + length;
  if (next != registered_buffers_.begin()) {
    auto prev = std::prev(next);
    overlaps |= prev->first + prev->second > start;
  }
  if (overlaps) {
    return log.Finish(
        Status::InvalidArgument("RegisterBuffer: region overlaps a registered buffer"));
  }
  if (options_.memory_registrar) {
    s = options_.memory_registrar->Register(addr, length, "user buffer");
    if (!s.ok()) return log.Finish(s);
  }
  registered_buffers_.emplace(start, length);
  return log.Finish(Status::OK());
}

Status DBImpl::UnregisterBuffer(void* addr) {
  PerfPoint perf(PerfKey::db_unregister_buffer);
  CallLog log(&logger_, "unregister_buffer", &errors_);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  std::lock_guard<std::mutex> lock(buffers_mu_);
  auto it = registered_buffers_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == registered_buffers_.end()) {
    return log.Finish(
        Status::NotFound("UnregisterBuffer: no registered buffer starts at this address"));
  }
  if (options_.memory_registrar) options_.memory_registrar->Unregister(addr, it->second);
  registered_buffers_.erase(it);
  return log.Finish(Status::OK());
}

Status DBImpl::Flush() {
  PerfPoint perf(PerfKey::db_flush);
  CallLog log(&logger_, "flush", &errors_);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok() || ssd_ == nullptr) return log.Finish(s);  // memory has nothing durable
  return log.Finish(FlushLocked());
}

Status DBImpl::FlushLocked() {
  // Serialized: the watermark is only raised by the Flush that wrote everything below it.
  std::lock_guard<std::mutex> flush_lock(flush_mu_);
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
  for (const std::string& key : keys) {
    MemoryTier::Handle handle;
    if (!memory_->Lookup(key, &handle)) continue;  // deleted or evicted (to SSD) meanwhile
    Status s = offloader_->Persist(key, handle.value(), handle.version());
    if (!s.ok()) {
      if (failed++ == 0) first_error = s;
    }
  }
  if (failed == 0) return Status::OK();
  return Status::FromErrorCode(
      first_error.ErrorCode(),
      "Flush: " + std::to_string(failed) + " of " + std::to_string(keys.size()) +
          " values could not be written to SSD; first: " + first_error.message());
}

Status DBImpl::CompactBuckets(uint64_t* reclaimed_bytes) {
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  if (reclaimed_bytes != nullptr) *reclaimed_bytes = 0;
  Status s = CheckOpen();
  if (!s.ok() || ssd_ == nullptr) return s;
  return ssd_->CompactBuckets(reclaimed_bytes);
}

uint64_t DBImpl::DeleteMatching(const std::function<bool(std::string_view)>& pred) {
  if (ssd_ == nullptr) {
    uint64_t n = memory_->EraseIf(pred);
    counters_.deletes.fetch_add(n, std::memory_order_relaxed);
    return n;
  }
  // Keys may live in either tier or both: collect them, then delete each one through
  // the per-key path so both tiers change together.
  std::set<std::string> doomed;
  memory_->ForEach([&](std::string_view key, uint64_t, uint64_t) {
    if (pred(key)) doomed.emplace(key);
  });
  ssd_->ForEachKey([&](const std::string& key) {
    if (pred(key)) doomed.insert(key);
  });
  uint64_t n = 0;
  for (const std::string& key : doomed) n += DeleteOne(key).ok();
  return n;
}

void DBImpl::ReadFromSsd(std::span<const Slice> keys, std::span<const Destination> dests,
                         const std::vector<size_t>& misses, std::vector<int64_t>* results,
                         bool verify) {
  std::vector<SsdTier::Read> reads(misses.size());
  for (size_t j = 0; j < misses.size(); j++) {
    reads[j].key = keys[misses[j]];
    reads[j].dest = dests[misses[j]];
  }
  uint64_t promotions = 0;
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
      }
    };
  }
  ssd_->MultiGet(reads, verify, promote);
  counters_.promotions.fetch_add(promotions, std::memory_order_relaxed);
  for (size_t j = 0; j < misses.size(); j++) {
    SsdTier::Read& r = reads[j];
    const Slice key = keys[misses[j]];
    if (r.status.IsNotFound()) {
      // Promoted or written into memory while we looked: read it from there.
      uint64_t size = 0;
      MemoryTier::Handle handle;
      Status s = memory_->Contains(key) ? GetOne(key, r.dest, &size)
                                        : Status::NotFound("key " + Printable(key));
      if (s.IsNotFound()) counters_.misses.fetch_add(1, std::memory_order_relaxed);
      (*results)[misses[j]] = s.ok() ? static_cast<int64_t>(size) : s.ErrorCode();
      continue;
    }
    if (!r.status.ok()) {
      if (r.status.IsCorruption() || r.status.IsIOError()) {
        logger_.Logf(LogLevel::kError, "reading key %s from SSD: %s", Printable(key).c_str(),
                     r.status.ToString().c_str());
      }
      (*results)[misses[j]] = r.status.ErrorCode();
      continue;
    }
    counters_.ssd_hits.fetch_add(1, std::memory_order_relaxed);
    counters_.get_bytes.fetch_add(r.size, std::memory_order_relaxed);
    (*results)[misses[j]] = static_cast<int64_t>(r.size);
  }
}

void DBImpl::PromoteFromPeer(const Slice& key, std::span<const Slice> parts, uint64_t size) {
  // A new local version; given up when the key appeared locally meanwhile.
  const uint64_t version = version_source_.fetch_add(1) + 1;
  if (memory_->Insert(key, parts, size, version,
                      [&] { return ssd_ == nullptr || !ssd_->Contains(key); })) {
    counters_.promotions.fetch_add(1, std::memory_order_relaxed);
  }
}

std::string DBImpl::StatsText() const {
  MemoryTier::Stats m = memory_->GetStats();
  std::ostringstream out;
  out << "** kvengine stats **\n"
      << "memory.items: " << m.items << "\n"
      << "memory.value_bytes: " << m.value_bytes << "\n"
      << "memory.allocated_bytes: " << m.allocated_bytes << "\n"
      << "memory.capacity_bytes: " << m.capacity_bytes << "\n"
      << "memory.hits: " << counters_.memory_hits.load() << "\n"
      << "memory.evictions: " << m.evictions << "\n"
      << "memory.evicted_bytes: " << m.evicted_bytes << "\n"
      << "memory.rejected_puts: " << m.rejected_puts << "\n"
      << "ssd.hits: " << counters_.ssd_hits.load() << "\n"
      << "promotions: " << counters_.promotions.load() << "\n"
      << "memory.eviction_refusals: " << m.eviction_refusals << "\n"
      << "memory.lookup_hits: " << m.lookup_hits << "\n"
      << "memory.lookup_misses: " << m.lookup_misses << "\n"
      << "memory.index_bytes: " << m.index_bytes << "\n"
      << "memory.index_bytes_per_key: " << (m.items == 0 ? 0 : m.index_bytes / m.items) << "\n"
      << "misses: " << counters_.misses.load() << "\n"
      << "puts: " << counters_.puts.load() << "\n"
      << "put_bytes: " << counters_.put_bytes.load() << "\n"
      << "put_failures: " << counters_.put_failures.load() << "\n"
      << "gets: " << counters_.gets.load() << "\n"
      << "get_bytes: " << counters_.get_bytes.load() << "\n"
      << "exists_queries: " << counters_.exists_queries.load() << "\n"
      << "deletes: " << counters_.deletes.load() << "\n"
      << "batch_calls: " << counters_.batch_calls.load() << "\n";
  out << errors_.ToText();
  if (ssd_ != nullptr) {
    const SsdTier::Stats d = ssd_->GetStats();
    const double ratio = d.live_bytes + d.deleted_bytes == 0
                             ? 0.0
                             : static_cast<double>(d.deleted_bytes) /
                                   static_cast<double>(d.live_bytes + d.deleted_bytes);
    out << "ssd.keys: " << d.keys << "\n"
        << "ssd.live_bytes: " << d.live_bytes << "\n"
        << "ssd.used_bytes: " << d.used_bytes << "\n"
        << "ssd.capacity_bytes: " << d.capacity_bytes << "\n"
        << "ssd.buckets: " << d.buckets << "\n"
        << "ssd.pending_buckets: " << d.pending_buckets << "\n"
        << "ssd.deleted_bytes: " << d.deleted_bytes << "\n"
        << "ssd.deleted_ratio: " << ratio << "\n"
        << "ssd.offloads: " << d.offloads << "\n"
        << "ssd.offload_bytes: " << d.offload_bytes << "\n"
        << "ssd.offload_failures: " << d.offload_failures << "\n"
        << "ssd.reads: " << d.reads << "\n"
        << "ssd.read_bytes: " << d.read_bytes << "\n"
        << "ssd.read_errors: " << d.read_errors << "\n"
        << "ssd.bucket_writes: " << d.bucket_writes << "\n"
        << "ssd.bucket_write_errors: " << d.bucket_write_errors << "\n"
        << "ssd.tombstones: " << d.tombstones << "\n"
        << "ssd.evicted_buckets: " << d.evicted_buckets << "\n"
        << "ssd.evicted_keys: " << d.evicted_keys << "\n"
        << "ssd.gc_rounds: " << d.gc_rounds << "\n"
        << "ssd.gc_buckets_compacted: " << d.gc_buckets_compacted << "\n"
        << "ssd.gc_bytes_reclaimed: " << d.gc_bytes_reclaimed << "\n"
        << "ssd.gc_bytes_punched: " << d.gc_bytes_punched << "\n"
        << "ssd.gc_bytes_rewritten: " << d.gc_bytes_rewritten << "\n"
        << "ssd.gc_keys_lost_race: " << d.gc_keys_lost_race << "\n"
        << "ssd.quarantined_buckets: " << d.quarantined_buckets << "\n"
        << "ssd.recovered_keys: " << d.recovered_keys << "\n"
        << "ssd.torn_tombstone_bytes: " << d.torn_tombstone_bytes << "\n"
        << "ssd.damaged_tombstone_bytes: " << d.damaged_tombstone_bytes << "\n"
        << "ssd.io_uring: " << (d.io_uring ? "true" : "false") << "\n"
        << "ssd.direct_io: " << (d.direct_io ? "true" : "false") << "\n"
        << "ssd.index_bytes: " << d.index_bytes << "\n"
        << "ssd.index_bytes_per_key: " << (d.keys == 0 ? 0 : d.index_bytes / d.keys) << "\n"
        << "ssd.open_files: " << d.open_files << "\n"
        << "ssd.file_opens: " << d.file_opens << "\n"
        << "ssd.open_micros: " << d.open_micros << "\n"
        << "ssd.checkpoint_keys: " << d.checkpoint_keys << "\n"
        << "ssd.checkpoint_rejected: " << d.checkpoint_rejected << "\n"
        << "ssd.checkpoint_writes: " << d.checkpoint_writes << "\n"
        << "ssd.checkpoint_backlog: " << d.checkpoint_backlog << "\n";
  }
  if (!options_.local_listen.empty()) {
    const LocalServerCounters& l = local_counters_;
    out << "local.clients_accepted: " << l.accepted.load() << "\n"
        << "local.clients_refused: " << l.refused.load() << "\n"
        << "local.reservations_expired: " << l.reservations_expired.load() << "\n"
        << "local.reserve_requests: " << l.reserve_requests.load() << "\n"
        << "local.spare_commits: " << l.spare_commits.load() << "\n"
        << "local.shared_channels: " << l.shared_channels.load() << "\n";
  }
  return out.str();
}

std::string DBImpl::StatsJson() const {
  MemoryTier::Stats m = memory_->GetStats();
  std::ostringstream out;
  out << "{\"memory\":{\"items\":" << m.items << ",\"value_bytes\":" << m.value_bytes
      << ",\"allocated_bytes\":" << m.allocated_bytes << ",\"capacity_bytes\":" << m.capacity_bytes
      << ",\"hits\":" << counters_.memory_hits.load() << ",\"evictions\":" << m.evictions
      << ",\"evicted_bytes\":" << m.evicted_bytes << ",\"rejected_puts\":" << m.rejected_puts
      << ",\"eviction_refusals\":" << m.eviction_refusals << ",\"lookup_hits\":" << m.lookup_hits
      << ",\"lookup_misses\":" << m.lookup_misses << ",\"index_bytes\":" << m.index_bytes
      << ",\"index_bytes_per_key\":" << (m.items == 0 ? 0 : m.index_bytes / m.items)
      << "},\"misses\":" << counters_.misses.load() << ",\"puts\":" << counters_.puts.load()
      << ",\"put_bytes\":" << counters_.put_bytes.load()
      << ",\"put_failures\":" << counters_.put_failures.load()
      << ",\"gets\":" << counters_.gets.load() << ",\"get_bytes\":" << counters_.get_bytes.load()
      << ",\"exists_queries\":" << counters_.exists_queries.load()
      << ",\"deletes\":" << counters_.deletes.load()
      << ",\"batch_calls\":" << counters_.batch_calls.load() << ",\"errors\":" << errors_.ToJson()
      << ",\"ssd_hits\":" << counters_.ssd_hits.load()
      << ",\"promotions\":" << counters_.promotions.load();
  if (ssd_ != nullptr) {
    const SsdTier::Stats d = ssd_->GetStats();
    out << ",\"ssd\":{\"keys\":" << d.keys << ",\"live_bytes\":" << d.live_bytes
        << ",\"used_bytes\":" << d.used_bytes << ",\"capacity_bytes\":" << d.capacity_bytes
        << ",\"buckets\":" << d.buckets << ",\"pending_buckets\":" << d.pending_buckets
        << ",\"deleted_bytes\":" << d.deleted_bytes << ",\"offloads\":" << d.offloads
        << ",\"offload_bytes\":" << d.offload_bytes
        << ",\"offload_failures\":" << d.offload_failures << ",\"reads\":" << d.reads
        << ",\"read_bytes\":" << d.read_bytes << ",\"read_errors\":" << d.read_errors
        << ",\"bucket_writes\":" << d.bucket_writes
        << ",\"bucket_write_errors\":" << d.bucket_write_errors
        << ",\"tombstones\":" << d.tombstones << ",\"evicted_buckets\":" << d.evicted_buckets
        << ",\"evicted_keys\":" << d.evicted_keys << ",\"gc_rounds\":" << d.gc_rounds
        << ",\"gc_buckets_compacted\":" << d.gc_buckets_compacted
        << ",\"gc_bytes_reclaimed\":" << d.gc_bytes_reclaimed
        << ",\"gc_bytes_punched\":" << d.gc_bytes_punched
        << ",\"gc_bytes_rewritten\":" << d.gc_bytes_rewritten
        << ",\"gc_keys_lost_race\":" << d.gc_keys_lost_race
        << ",\"quarantined_buckets\":" << d.quarantined_buckets
        << ",\"recovered_keys\":" << d.recovered_keys
        << ",\"torn_tombstone_bytes\":" << d.torn_tombstone_bytes
        << ",\"damaged_tombstone_bytes\":" << d.damaged_tombstone_bytes
        << ",\"io_uring\":" << (d.io_uring ? "true" : "false")
        << ",\"direct_io\":" << (d.direct_io ? "true" : "false")
        << ",\"index_bytes\":" << d.index_bytes << ",\"open_files\":" << d.open_files
        << ",\"file_opens\":" << d.file_opens << ",\"open_micros\":" << d.open_micros
        << ",\"checkpoint_keys\":" << d.checkpoint_keys
        << ",\"checkpoint_rejected\":" << d.checkpoint_rejected
        << ",\"checkpoint_writes\":" << d.checkpoint_writes
        << ",\"checkpoint_backlog\":" << d.checkpoint_backlog << "}";
  }
  if (!options_.local_listen.empty()) {
    const LocalServerCounters& l = local_counters_;
    out << ",\"local\":{\"clients_accepted\":" << l.accepted.load()
        << ",\"clients_refused\":" << l.refused.load()
        << ",\"reservations_expired\":" << l.reservations_expired.load()
        << ",\"reserve_requests\":" << l.reserve_requests.load()
        << ",\"spare_commits\":" << l.spare_commits.load()
        << ",\"shared_channels\":" << l.shared_channels.load() << "}";
  }
  out << "}";
  return out.str();
}

bool DBImpl::GetProperty(const std::string& name, std::string* value) {
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  if (value == nullptr) return false;
  if (closed_) {
    *value = "DB is closed";
    return false;
  }
  if (name == "kvengine.stats") {
    *value = StatsText();
  } else if (name == "kvengine.stats.json") {
    *value = StatsJson();
  } else if (name == "kvengine.peers" && peer_ != nullptr) {
    *value = peer_->StatsText();
  } else if (name == "kvengine.options") {
    *value = options_.ToString();
  } else if (name == "kvengine.perf" || name == "kvengine.perf.json") {
    *value = PerfReport(name == "kvengine.perf.json");
  } else if (name == "kvengine.stats.prometheus" || name == "kvengine.prometheus") {
    *value = StatsPrometheus();
  } else {
    return false;
  }
  return true;
}

void DBImpl::ResetPerf() { ::kvengine::ResetPerf(); }

}  // namespace kvengine
