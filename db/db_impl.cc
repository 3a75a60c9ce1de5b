#include "db/db_impl.h"

#include <cinttypes>
#include <cstring>
#include <regex>
#include <sstream>
#include <unordered_set>

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

uint64_t PartsSize(std::span<const Slice> parts) {
  uint64_t size = 0;
  for (const Slice& part : parts) size += part.size();
  return size;
}

}  // namespace

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

  s = MemoryTier::Create(options_, &logger_, &version_source_, &memory_);
  if (!s.ok()) return s;
  if (options_.memory_registrar) {
    s = options_.memory_registrar->Register(memory_->arena_base(), memory_->arena_size(), "arena");
    if (!s.ok()) return s;
  }
  logger_.Logf(LogLevel::kInfo, "opened %s: memory tier %s (%s pages, numa node %d)", path_.c_str(),
               FormatSize(memory_->arena_size()).c_str(), memory_->arena().backing(),
               memory_->arena().numa_node());
  return Status::OK();
}

Status DBImpl::Close() {
  PerfPoint perf(PerfKey::db_close);
  CallLog log(&logger_, "close", nullptr);
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
  memory_.reset();
  Status s;
  if (lock_ != nullptr) s = env_->UnlockFile(std::move(lock_));
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
    if (size > options_.max_value_size) {
      return Status::InvalidArgument("value of key " + Printable(key) +
                                     " exceeds max_value_size (" +
                                     FormatSize(options_.max_value_size) + ")");
    }
  }
  s = memory_->Put(key, parts, size, nullptr);
  if (s.ok()) {
    counters_.puts.fetch_add(1, std::memory_order_relaxed);
    counters_.put_bytes.fetch_add(size, std::memory_order_relaxed);
  } else {
    counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

Status DBImpl::GetOne(const Slice& key, std::span<const MutableSlice> dest, uint64_t* size) {
  PerfPoint perf(PerfKey::db_get_one);
  *size = 0;
  Status s = CheckKey(key);
  if (!s.ok()) return s;
  uint64_t capacity = 0;
  for (size_t i = 0; i < dest.size(); i++) {
    if (dest[i].data() == nullptr && dest[i].size() != 0) {
      return Status::InvalidArgument("destination buffer " + std::to_string(i) + " of key " +
                                     Printable(key) + " is null with length " +
                                     std::to_string(dest[i].size()));
    }
    capacity += dest[i].size();
  }
  counters_.gets.fetch_add(1, std::memory_order_relaxed);
  MemoryTier::Handle handle;
  if (!memory_->Lookup(key, &handle)) {
    counters_.misses.fetch_add(1, std::memory_order_relaxed);
    return Status::NotFound("key " + Printable(key));
  }
  counters_.memory_hits.fetch_add(1, std::memory_order_relaxed);
  const Slice value = handle.value();
  *size = value.size();
  if (value.size() > capacity) {
    return Status::BufferTooSmall("value of key " + Printable(key) + " is " +
                                  std::to_string(value.size()) + " bytes; buffers hold " +
                                  std::to_string(capacity));
  }
  const char* src = value.data();
  uint64_t left = value.size();
  for (const MutableSlice& d : dest) {
    if (left == 0) break;
    const uint64_t n = std::min<uint64_t>(left, d.size());
    std::memcpy(d.data(), src, n);
    src += n;
    left -= n;
  }
  counters_.get_bytes.fetch_add(value.size(), std::memory_order_relaxed);
  return Status::OK();
}

Status DBImpl::DeleteOne(const Slice& key) {
  PerfPoint perf(PerfKey::db_delete_one);
  Status s = CheckKey(key);
  if (!s.ok()) return s;
  if (!memory_->Erase(key)) return Status::NotFound("key " + Printable(key));
  counters_.deletes.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

Status DBImpl::Put(const WriteOptions&, const Slice& key, const Slice& value) {
  PerfPoint perf(PerfKey::db_put);
  CallLog log(&logger_, "put", &errors_);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  return log.FinishKey(PutOne(key, std::span<const Slice>(&value, 1)), key,
                       static_cast<int64_t>(value.size()), nullptr);
}

Status DBImpl::Get(const ReadOptions&, const Slice& key, std::string* value) {
  PerfPoint perf(PerfKey::db_get);
  CallLog log(&logger_, "get", &errors_);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  if (value == nullptr) return log.Finish(Status::InvalidArgument("Get: value pointer is null"));
  s = CheckKey(key);
  if (!s.ok()) return log.FinishKey(s, key, -1, nullptr);
  MemoryTier::Handle handle;
  counters_.gets.fetch_add(1, std::memory_order_relaxed);
  if (!memory_->Lookup(key, &handle)) {
    counters_.misses.fetch_add(1, std::memory_order_relaxed);
    return log.FinishKey(Status::NotFound("key " + Printable(key)), key, -1, nullptr);
  }
  counters_.memory_hits.fetch_add(1, std::memory_order_relaxed);
  value->assign(handle.value().data(), handle.value().size());
  counters_.get_bytes.fetch_add(value->size(), std::memory_order_relaxed);
  return log.FinishKey(Status::OK(), key, static_cast<int64_t>(value->size()), "memory");
}

Status DBImpl::GetInto(const ReadOptions&, const Slice& key, MutableSlice buffer,
                       size_t* value_size) {
  PerfPoint perf(PerfKey::db_get_into);
  CallLog log(&logger_, "get_into", &errors_);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  uint64_t size = 0;
  s = GetOne(key, std::span<const MutableSlice>(&buffer, 1), &size);
  if (value_size != nullptr) *value_size = size;
  const bool size_known = s.ok() || s.IsBufferTooSmall();
  return log.FinishKey(s, key, size_known ? static_cast<int64_t>(size) : -1,
                       s.ok() ? "memory" : nullptr);
}

Status DBImpl::Delete(const WriteOptions&, const Slice& key) {
  PerfPoint perf(PerfKey::db_delete);
  CallLog log(&logger_, "delete", &errors_);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  return log.FinishKey(DeleteOne(key), key, -1, nullptr);
}

Status DBImpl::GetValueSize(const Slice& key, uint64_t* size) {
  PerfPoint perf(PerfKey::db_get_value_size);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  s = CheckKey(key);
  if (!s.ok()) return s;
  MemoryTier::Handle handle;
  if (!memory_->Lookup(key, &handle)) return Status::NotFound("key " + Printable(key));
  *size = handle.value().size();
  return Status::OK();
}

Status DBImpl::BatchPut(const WriteOptions&, std::span<const Slice> keys,
                        std::span<const ValueParts> values, std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_put);
  CallLog log(&logger_, "batch_put", &errors_);
  log.Add("num_keys", keys.size());
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
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    (*results)[i] = PutOne(keys[i], values[i]).ErrorCode();
    const int64_t code = (*results)[i];
    if (code == 0 && log.active()) total_bytes += PartsSize(values[i]);
    log.Key(i, code, log.WantsKey(code) ? static_cast<int64_t>(PartsSize(values[i])) : -1, nullptr);
  }
  log.Add("total_bytes", total_bytes);
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::BatchGetInto(const ReadOptions&, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_get_into);
  CallLog log(&logger_, "batch_get_into", &errors_);
  log.Add("num_keys", keys.size());
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
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    uint64_t size = 0;
    Status key_status = GetOne(keys[i], destinations[i], &size);
    (*results)[i] = key_status.ok() ? static_cast<int64_t>(size) : key_status.ErrorCode();
    if (key_status.ok()) total_bytes += size;
    const bool size_known = key_status.ok() || key_status.IsBufferTooSmall();
    log.Key(i, key_status.ErrorCode(), size_known ? static_cast<int64_t>(size) : -1,
            key_status.ok() ? "memory" : nullptr);
  }
  log.Add("total_bytes", total_bytes);
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_exists);
  CallLog log(&logger_, "batch_exists", &errors_);
  log.Add("num_keys", keys.size());
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
  for (size_t i = 0; i < keys.size(); i++) {
    Status key_status = CheckKey(keys[i]);
    (*results)[i] = !key_status.ok() ? key_status.ErrorCode() : memory_->Contains(keys[i]) ? 1 : 0;
    const int64_t r = (*results)[i];
    log.Key(i, r, -1, r == 1 ? "memory" : nullptr, r >= 0 ? static_cast<int>(r) : -1);
  }
  return log.Finish(Status::OK(), keys);
}

Status DBImpl::BatchDelete(const WriteOptions&, std::span<const Slice> keys,
                           std::vector<int64_t>* results) {
  PerfPoint perf(PerfKey::db_batch_delete);
  CallLog log(&logger_, "batch_delete", &errors_);
  log.Add("num_keys", keys.size());
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
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& e) {
    return log.Finish(Status::InvalidArgument("malformed regex '" + pattern + "'", e.what()));
  }
  uint64_t n = memory_->EraseIf(
      [&re](std::string_view key) { return std::regex_match(key.begin(), key.end(), re); });
  counters_.deletes.fetch_add(n, std::memory_order_relaxed);
  if (deleted != nullptr) *deleted = n;
  log.Add("deleted", n);
  return log.Finish(Status::OK());
}

Status DBImpl::DeleteAll(uint64_t* deleted) {
  PerfPoint perf(PerfKey::db_delete_all);
  CallLog log(&logger_, "delete_all", &errors_);
  std::shared_lock<std::shared_mutex> guard(lifecycle_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return log.Finish(s);
  uint64_t n = memory_->EraseIf([](std::string_view) { return true; });
  counters_.deletes.fetch_add(n, std::memory_order_relaxed);
  if (deleted != nullptr) *deleted = n;
  log.Add("deleted", n);
  return log.Finish(Status::OK());
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
  return log.Finish(CheckOpen());  // the memory tier has nothing durable to flush
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
      << "memory.eviction_refusals: " << m.eviction_refusals << "\n"
      << "memory.lookup_hits: " << m.lookup_hits << "\n"
      << "memory.lookup_misses: " << m.lookup_misses << "\n"
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
      << ",\"lookup_misses\":" << m.lookup_misses << "},\"misses\":" << counters_.misses.load()
      << ",\"puts\":" << counters_.puts.load() << ",\"put_bytes\":" << counters_.put_bytes.load()
      << ",\"put_failures\":" << counters_.put_failures.load()
      << ",\"gets\":" << counters_.gets.load() << ",\"get_bytes\":" << counters_.get_bytes.load()
      << ",\"exists_queries\":" << counters_.exists_queries.load()
      << ",\"deletes\":" << counters_.deletes.load()
      << ",\"batch_calls\":" << counters_.batch_calls.load() << ",\"errors\":" << errors_.ToJson()
      << "}";
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
