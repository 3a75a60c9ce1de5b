// The table of string-settable options: one entry per field of Options, with its parser.
// Options::Set, Options::ApplyEnvironment, Options::ToString and the Python module all go
// through this table, so an option added here is settable everywhere at once.
#include "kvengine/options.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "util/config_parse.h"

namespace kvengine {

namespace {

struct OptionEntry {
  const char* name;
  // Parses `value` into `options`; leaves it unchanged on failure.
  std::function<Status(Options*, const std::string&)> set;
  std::function<std::string(const Options&)> get;
};

const std::vector<std::string>& EvictionNames() {
  static const std::vector<std::string> names = {"lru", "none"};
  return names;
}
const std::vector<std::string>& OffloadPolicyNames() {
  static const std::vector<std::string> names = {"write_back", "write_through"};
  return names;
}
const std::vector<std::string>& SsdEvictionNames() {
  static const std::vector<std::string> names = {"none", "lru", "fifo"};
  return names;
}
const std::vector<std::string>& PerfLevelNames() {
  static const std::vector<std::string> names = {"off", "entry", "all", "auto"};
  return names;
}
const std::vector<std::string>& PeerModeNames() {
  static const std::vector<std::string> names = {"read_through", "sharded"};
  return names;
}
const std::vector<std::string>& PeerTransportNames() {
  static const std::vector<std::string> names = {"auto", "tcp", "rdma", "ucx"};
  return names;
}
const std::vector<std::string>& LogLevelNames() {
  static const std::vector<std::string> names = {"debug", "info", "warn", "error", "off"};
  return names;
}

template <typename T>
OptionEntry SizeOption(const char* name, T Options::*field) {
  return {name,
          [field](Options* o, const std::string& v) {
            uint64_t parsed;
            Status s = ParseSize(v, &parsed);
            if (s.ok()) o->*field = parsed;
            return s;
          },
          [field](const Options& o) { return std::to_string(o.*field); }};
}

OptionEntry BoolOption(const char* name, bool Options::*field) {
  return {name,
          [field](Options* o, const std::string& v) {
            bool parsed;
            Status s = ParseBool(v, &parsed);
            if (s.ok()) o->*field = parsed;
            return s;
          },
          [field](const Options& o) { return std::string(o.*field ? "true" : "false"); }};
}

template <typename E>
OptionEntry EnumOption(const char* name, E Options::*field,
                       const std::vector<std::string>& (*names)()) {
  return {name,
          [field, names](Options* o, const std::string& v) {
            int parsed;
            Status s = ParseEnum(v, names(), &parsed);
            if (s.ok()) o->*field = static_cast<E>(parsed);
            return s;
          },
          [field, names](const Options& o) { return names()[static_cast<int>(o.*field)]; }};
}

OptionEntry RatioOption(const char* name, double Options::*field) {
  return {name,
          [field](Options* o, const std::string& v) {
            double parsed;
            Status s = ParseRatio(v, &parsed);
            if (s.ok()) o->*field = parsed;
            return s;
          },
          [field](const Options& o) {
            char buf[32];
            std::snprintf(buf, sizeof(buf), "%g", o.*field);
            return std::string(buf);
          }};
}

OptionEntry StringOption(const char* name, std::string Options::*field) {
  return {name,
          [field](Options* o, const std::string& v) {
            o->*field = v;
            return Status::OK();
          },
          [field](const Options& o) { return o.*field; }};
}

const std::vector<OptionEntry>& Table() {
  static const std::vector<OptionEntry>* table = new std::vector<OptionEntry>{
      BoolOption("create_if_missing", &Options::create_if_missing),
      BoolOption("error_if_exists", &Options::error_if_exists),
      SizeOption("memory_capacity_bytes", &Options::memory_capacity_bytes),
      EnumOption("memory_eviction", &Options::memory_eviction, EvictionNames),
      BoolOption("use_huge_pages", &Options::use_huge_pages),
      BoolOption("prefault_memory", &Options::prefault_memory),
      SizeOption("memory_slab_size", &Options::memory_slab_size),
      SizeOption("index_shards", &Options::index_shards),
      SizeOption("ssd_capacity_bytes", &Options::ssd_capacity_bytes),
      EnumOption("offload_policy", &Options::offload_policy, OffloadPolicyNames),
      SizeOption("bucket_keys_limit", &Options::bucket_keys_limit),
      SizeOption("bucket_size_limit", &Options::bucket_size_limit),
      SizeOption("bucket_flush_timeout_ms", &Options::bucket_flush_timeout_ms),
      SizeOption("max_open_files", &Options::max_open_files),
      BoolOption("use_direct_io", &Options::use_direct_io),
      BoolOption("use_io_uring", &Options::use_io_uring),
      EnumOption("ssd_eviction", &Options::ssd_eviction, SsdEvictionNames),
      BoolOption("disable_ssd_eviction", &Options::disable_ssd_eviction),
      BoolOption("promote_on_read", &Options::promote_on_read),
      SizeOption("prefetch_max_bytes", &Options::prefetch_max_bytes),
      BoolOption("flush_on_close", &Options::flush_on_close),
      SizeOption("tombstone_sync_interval_ms", &Options::tombstone_sync_interval_ms),
      BoolOption("gc_punch_holes", &Options::gc_punch_holes),
      BoolOption("ssd_map_checkpoint", &Options::ssd_map_checkpoint),
      SizeOption("ssd_map_checkpoint_interval_keys", &Options::ssd_map_checkpoint_interval_keys),
      RatioOption("gc_deleted_ratio", &Options::gc_deleted_ratio),
      RatioOption("gc_merge_deleted_ratio", &Options::gc_merge_deleted_ratio),
      RatioOption("gc_high_watermark_ratio", &Options::gc_high_watermark_ratio),
      SizeOption("gc_interval_ms", &Options::gc_interval_ms),
      SizeOption("gc_max_buckets_per_round", &Options::gc_max_buckets_per_round),
      SizeOption("max_key_size", &Options::max_key_size),
      SizeOption("max_value_size", &Options::max_value_size),
      SizeOption("max_batch_size", &Options::max_batch_size),
      SizeOption("removal_feed_capacity", &Options::removal_feed_capacity),
      SizeOption("gpu_staging_bytes", &Options::gpu_staging_bytes),
      SizeOption("gpu_chunk_bytes", &Options::gpu_chunk_bytes),
      SizeOption("gpu_streams", &Options::gpu_streams),
      StringOption("peers", &Options::peers),
      StringOption("cluster", &Options::cluster),
      SizeOption("cluster_lease_ttl_ms", &Options::cluster_lease_ttl_ms),
      SizeOption("cluster_replicas", &Options::cluster_replicas),
      SizeOption("cluster_join_grace_ms", &Options::cluster_join_grace_ms),
      SizeOption("cluster_delete_hints", &Options::cluster_delete_hints),
      EnumOption("peer_mode", &Options::peer_mode, PeerModeNames),
      StringOption("listen", &Options::listen),
      StringOption("peer_auth_token_file", &Options::peer_auth_token_file),
      SizeOption("peer_timeout_ms", &Options::peer_timeout_ms),
      SizeOption("peer_handshake_timeout_ms", &Options::peer_handshake_timeout_ms),
      SizeOption("peer_frame_timeout_ms", &Options::peer_frame_timeout_ms),
      SizeOption("peer_max_connections_per_address", &Options::peer_max_connections_per_address),
      SizeOption("peer_max_queued_bytes", &Options::peer_max_queued_bytes),
      SizeOption("peer_max_connections", &Options::peer_max_connections),
      BoolOption("peer_hash_loopback_bodies", &Options::peer_hash_loopback_bodies),
      BoolOption("promote_from_peers", &Options::promote_from_peers),
      StringOption("local_listen", &Options::local_listen),
      StringOption("local_listen_mode", &Options::local_listen_mode),
      StringOption("local_listen_group", &Options::local_listen_group),
      StringOption("local_allowed_uids", &Options::local_allowed_uids),
      StringOption("namespace_arenas", &Options::namespace_arenas),
      SizeOption("local_reservation_timeout_ms", &Options::local_reservation_timeout_ms),
      SizeOption("local_max_connections", &Options::local_max_connections),
      SizeOption("local_busy_poll_us", &Options::local_busy_poll_us),
      BoolOption("local_shared_channel", &Options::local_shared_channel),
      EnumOption("peer_transport", &Options::peer_transport, PeerTransportNames),
      EnumOption("log_level", &Options::log_level, LogLevelNames),
      StringOption("log_file", &Options::log_file),
      EnumOption("perf_level", &Options::perf_level, PerfLevelNames),
      StringOption("metrics_listen", &Options::metrics_listen),
  };
  return *table;
}

const OptionEntry* Find(const std::string& name) {
  for (const auto& e : Table()) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

std::string EnvName(const char* option_name) {
  std::string env = "KVENGINE_";
  for (const char* p = option_name; *p; p++) {
    env += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  }
  return env;
}

}  // namespace

Status Options::Set(const std::string& name, const std::string& value) {
  const OptionEntry* entry = Find(name);
  if (entry == nullptr) return Status::InvalidArgument("unknown option '" + name + "'");
  Status s = entry->set(this, value);
  if (!s.ok()) {
    return Status::InvalidArgument("option " + name + "='" + value + "'", s.message());
  }
  return Status::OK();
}

Status Options::ApplyEnvironment() {
  Options updated = *this;
  for (const auto& e : Table()) {
    std::string var = EnvName(e.name);
    const char* raw = std::getenv(var.c_str());
    if (raw == nullptr) continue;  // unset: leave the option alone
    std::string value(raw);
    Status s = e.set(&updated, value);
    if (!s.ok()) {
      return Status::InvalidArgument("environment variable " + var + "='" + value + "'",
                                     s.message());
    }
  }
  *this = std::move(updated);
  return Status::OK();
}

Status Options::Validate() const {
  auto is_pow2 = [](uint64_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!is_pow2(memory_slab_size) || memory_slab_size < (64u << 10) ||
      memory_slab_size > (1ull << 30)) {
    return Status::InvalidArgument(
        "memory_slab_size must be a power of two in [64KiB, 1GiB], got " +
        std::to_string(memory_slab_size));
  }
  if (memory_capacity_bytes < memory_slab_size) {
    return Status::InvalidArgument("memory_capacity_bytes (" + FormatSize(memory_capacity_bytes) +
                                   ") is smaller than memory_slab_size (" +
                                   FormatSize(memory_slab_size) + ")");
  }
  if (memory_capacity_bytes / memory_slab_size > (1u << 24)) {
    return Status::InvalidArgument("memory_capacity_bytes / memory_slab_size exceeds 16M slabs");
  }
  if (index_shards == 0 || index_shards > 65536) {
    return Status::InvalidArgument("index_shards must be in [1, 65536], got " +
                                   std::to_string(index_shards));
  }
  if (max_key_size == 0 || max_key_size > (1u << 20)) {
    return Status::InvalidArgument("max_key_size must be in [1, 1MiB], got " +
                                   std::to_string(max_key_size));
  }
  if (max_batch_size == 0) return Status::InvalidArgument("max_batch_size must be positive");
  if (local_listen_mode.empty() || local_listen_mode.size() > 4 ||
      local_listen_mode.find_first_not_of("01234567") != std::string::npos) {
    return Status::InvalidArgument(
        "local_listen_mode must be octal permission bits like 0600, got '" + local_listen_mode +
        "'");
  }
  if (bucket_keys_limit == 0) return Status::InvalidArgument("bucket_keys_limit must be positive");
  if (max_open_files == 0) return Status::InvalidArgument("max_open_files must be positive");
  if (bucket_size_limit < (64u << 10) || bucket_size_limit > (4ull << 30)) {
    return Status::InvalidArgument("bucket_size_limit must be in [64KiB, 4GiB], got " +
                                   std::to_string(bucket_size_limit));
  }
  if (gc_max_buckets_per_round == 0) {
    return Status::InvalidArgument("gc_max_buckets_per_round must be positive");
  }
  if (max_value_size > (1ull << 40)) {
    return Status::InvalidArgument("max_value_size must be at most 1TiB");
  }
  if (gpu_chunk_bytes < 4096 || gpu_chunk_bytes > gpu_staging_bytes / 2) {
    return Status::InvalidArgument(
        "gpu_chunk_bytes must be in [4KiB, gpu_staging_bytes / 2], got " +
        FormatSize(gpu_chunk_bytes) + " with gpu_staging_bytes " + FormatSize(gpu_staging_bytes));
  }
  if (gpu_staging_bytes / gpu_chunk_bytes > 4096) {
    return Status::InvalidArgument("gpu_staging_bytes / gpu_chunk_bytes exceeds 4096 slots");
  }
  if (cluster_replicas == 0 || cluster_replicas > 16) {
    return Status::InvalidArgument("cluster_replicas must be in [1, 16], got " +
                                   std::to_string(cluster_replicas));
  }
  if (cluster_lease_ttl_ms < 1000) {
    return Status::InvalidArgument("cluster_lease_ttl_ms must be at least 1000, got " +
                                   std::to_string(cluster_lease_ttl_ms));
  }
  if (gpu_streams == 0 || gpu_streams > 64) {
    return Status::InvalidArgument("gpu_streams must be in [1, 64], got " +
                                   std::to_string(gpu_streams));
  }
  return Status::OK();
}

std::vector<std::string> Options::SettableNames() {
  std::vector<std::string> names;
  for (const auto& e : Table()) names.emplace_back(e.name);
  return names;
}

std::string Options::ToString() const {
  std::ostringstream out;
  for (const auto& e : Table()) out << e.name << "=" << e.get(*this) << "\n";
  return out.str();
}

}  // namespace kvengine
