// DB::Open: composes the layers a DB directory's options ask for, bottom up.
//
//   DBImpl      the local engine (db/): memory tier, SSD tier; always.
//   ClusterDB   over it when peers, a cluster or a listen address are configured
//               (cluster/): routes keys to their owners, reads through to peers, and
//               serves the DBImpl to the peers.
//
// A call on the DB returned enters the top layer and walks down; no layer calls one
// above it.  This file is the only one that knows every layer (docs/design.md).
#include <memory>
#include <string>

#include "cluster/cluster_db.h"
#include "db/db_impl.h"
#include "kvengine/db.h"
#include "transport/server.h"
#include "util/call_log.h"
#include "util/perf_point.h"

namespace kvengine {

namespace {

// A peer's one-sided read of a value in local's memory tier: the pin keeps it in place
// until the peer has read it.
PeerRouter::PinFn PinForPeers(DBImpl* local) {
  return [local](const Slice& key, bool wait, PinnedValue* out) {
    auto handle = std::make_shared<MemoryTier::Handle>();
    if (!local->LookupInMemory(key, wait, handle.get())) return false;
    out->data = handle->value().data();
    out->size = handle->value().size();
    out->version = handle->version();
    out->pin = std::move(handle);
    return true;
  };
}

// The directory is locked by another process: when that owner serves local clients
// (its LOCAL_SOCKET record), attach to it.  Busy(`locked`) otherwise.
Status AttachToOwner(const Options& options, const std::string& path, const Status& locked,
                     std::unique_ptr<DB>* db) {
  Env* env = options.env != nullptr ? options.env : Env::Default();
  std::string record;
  Status s = ReadFileToString(env, path + "/" + kLocalSocketFile, &record);
  const std::string socket_path = record.substr(0, record.find('\n'));
  if (!s.ok() || socket_path.empty()) return locked;
  Status attached = DB::Attach(options, socket_path, db);
  return attached.ok() ? attached
                       : Status::Busy(locked.ToString(), "attaching failed: " + attached.ToString());
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

  // The transports come first: the local arena is registered with them as it is made.
  std::unique_ptr<ClusterDB> cluster;
  s = ClusterDB::Create(effective, &cluster);
  if (!s.ok()) return s;
  if (cluster != nullptr) effective.memory_registrar = cluster->Registrar(effective.memory_registrar);

  auto local = std::make_unique<DBImpl>(effective, path);
  s = local->Init();
  if (s.IsBusy()) {
    local.reset();
    cluster.reset();
    return AttachToOwner(options, path, s, db);
  }
  // Built after Init, which configures the logger.
  s = CallLog(local->info_log(), "open", nullptr, start_nanos).Finish(std::move(s));
  if (!s.ok()) return s;
  if (cluster == nullptr) {
    *db = std::move(local);
    return Status::OK();
  }
  DBImpl* engine = local.get();
  s = cluster->Start(std::move(local), PinForPeers(engine), engine->arena_base());
  if (!s.ok()) return s;
  *db = std::move(cluster);
  return Status::OK();
}

}  // namespace kvengine
