// The public entry points, which compose the layers.
//
// DB::Open builds the stack of DB implementations a DB directory's options ask for,
// bottom up, each layer wrapping the one below through kvengine::DB (RocksDB's
// StackableDB shape):
//   DBImpl      the local engine (db/): memory tier, SSD tier; always.
//   ClusterDB   over it when peers, a cluster or a listen address are configured
//               (cluster/): routes keys to their owners, reads through to peers, and
//               serves the DBImpl to the peers.
//   NamespaceDB over it, always (namespaces/): the DB directory's namespace registry,
//               the namespaces' handles, and the default namespace's key rule.
//   OwnerDB     over the top when local_listen is set (attach/): serves the top layer
//               to the other processes of this host, their value bytes moving through
//               the engine's arena (db/shared_arena.h), whose puts enter the top of
//               the arena's stack (ClusterDB's when there is one: routed to their
//               owners) as every put enters the top of the DB stack.
//   MetricsDB   over the top when metrics_listen is set (metrics/): serves the
//               process's metrics, health and readiness over HTTP.
// DB::Attach builds the client of another process's DB (attach/), with a MetricsDB over
// it when metrics_listen is set.
//
// A call on the DB returned enters the top layer and walks down; no layer calls one
// above it.  This file is the only one that knows every layer (docs/design.md).
#include <memory>
#include <string>

#include "attach/attached_db.h"
#include "attach/local_socket_record.h"
#include "attach/owner_db.h"
#include "cluster/cluster_db.h"
#include "db/db_impl.h"
#include "kvengine/db.h"
#include "metrics/metrics_db.h"
#include "namespaces/namespace_db.h"
#include "transport/server.h"
#include "util/call_log.h"
#include "util/perf_point.h"

namespace kvengine {

namespace {

// `options` with the KVENGINE_* environment variables applied when it asks for them
// (Options::apply_environment).
Status EffectiveOptions(const Options& options, Options* effective) {
  *effective = options;
  Status s = effective->apply_environment ? effective->ApplyEnvironment() : Status::OK();
  // A DB that serves /metrics times its entry calls unless told otherwise, so the
  // latency histogram it exports has samples (the cost: docs/observability.md).
  if (effective->perf_level == PerfLevel::kAuto) {
    effective->perf_level = effective->metrics_listen.empty() ? PerfLevel::kOff : PerfLevel::kEntry;
  }
  return s;
}

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
Status AttachToOwner(const Options& options, Env* env, const std::string& path,
                     const Status& locked, std::unique_ptr<DB>* db) {
  std::string socket_path;
  if (!ReadLocalSocketRecord(env, path, &socket_path).ok()) return locked;
  Status attached = DB::Attach(options, socket_path, db);
  return attached.ok()
             ? attached
             : Status::Busy(locked.ToString(), "attaching failed: " + attached.ToString());
}

}  // namespace

Status DB::Open(const Options& options, const std::string& path, std::unique_ptr<DB>* db) {
  db->reset();
  Options effective;
  Status s = EffectiveOptions(options, &effective);
  if (s.ok()) s = effective.Validate();
  if (!s.ok()) return s;
  if (path.empty()) return Status::InvalidArgument("DB path is empty");
  if (!effective.local_listen.empty()) {
    effective.local_listen = OwnerDB::AbsoluteSocketPath(effective.local_listen);
  }
  SetPerfLevel(effective.perf_level);
  PerfPoint perf(PerfKey::db_open);
  const uint64_t start_nanos = perf_internal::NowNanos();
  Env* const env = effective.env != nullptr ? effective.env : Env::Default();

  // The transports come first: the local arena is registered with them as it is made.
  std::unique_ptr<ClusterDB> cluster;
  s = ClusterDB::Create(effective, &cluster);
  if (!s.ok()) return s;
  if (cluster != nullptr)
    effective.memory_registrar = cluster->Registrar(effective.memory_registrar);

  auto local = std::make_unique<DBImpl>(effective, path);
  DBImpl* const engine = local.get();  // lives as long as the layers over it
  s = local->Init();
  if (s.IsBusy()) {
    local.reset();
    cluster.reset();
    return AttachToOwner(options, env, path, s, db);
  }
  if (s.ok() && effective.local_listen.empty()) {
    // A record left by an owner that died names a socket nobody serves.
    RemoveLocalSocketRecord(env, path);
  }
  std::unique_ptr<DB> top = std::move(local);
  // The top of the arena's stack (db/shared_arena.h): an attached client's put enters
  // there, as every put enters the top of the DB stack.
  SharedArena* arena = engine;
  const bool clustered = cluster != nullptr;  // peers may send keys of any namespace
  if (s.ok() && cluster != nullptr) {
    arena = cluster.get();
    s = cluster->Start(
        std::move(top), engine, PinForPeers(engine),
        [engine](uint64_t values, uint64_t bytes) { engine->CountServedFromMemory(values, bytes); },
        engine->arena_base(), engine->peer_tier_counters());
    top = std::move(cluster);  // which owns the engine now, started or not
  }
  // In a cluster the namespace registry is kept in agreement with every member's
  // (namespaces/namespace_fleet.h), through the cluster's transport.
  NamespacePeers peers;
  if (clustered) {
    auto* router = static_cast<ClusterDB*>(top.get());
    peers.members = [router] { return router->MemberNames(); };
    peers.call = [router](const std::string& member, const std::string& request,
                          std::string* answer) {
      return router->SyncNamespaces(member, request, answer);
    };
    peers.serve = [router](NamespaceSyncFn fn) { router->ServeNamespaceSync(std::move(fn)); };
  }
  if (s.ok()) {
    s = NamespaceDB::Wrap(effective, path, clustered, engine->namespace_usage(), engine, engine,
                          clustered ? &peers : nullptr, engine->info_log(), &top);
  }
  if (s.ok() && !effective.local_listen.empty()) {
    s = OwnerDB::Wrap(effective, path, arena, engine->info_log(), &top);
  }
  if (s.ok() && !effective.metrics_listen.empty()) s = MetricsDB::Wrap(effective, &top);
  // Logged once every layer is up (the engine's Init configured the log).
  s = CallLog(engine->info_log(), "open", nullptr, start_nanos).Finish(std::move(s));
  if (!s.ok()) return s;  // destroying top closes every layer built
  *db = std::move(top);
  return Status::OK();
}

Status DB::Attach(const Options& options, const std::string& socket_path, std::unique_ptr<DB>* db) {
  db->reset();
  Options effective;
  Status s = EffectiveOptions(options, &effective);
  if (!s.ok()) return s;
  SetPerfLevel(effective.perf_level);
  auto client = std::make_unique<AttachedDB>(effective, socket_path);
  s = client->Connect();
  if (!s.ok()) return s;
  std::unique_ptr<DB> top = std::move(client);
  if (!effective.metrics_listen.empty()) {
    s = MetricsDB::Wrap(effective, &top);
    if (!s.ok()) return s;
  }
  *db = std::move(top);
  return Status::OK();
}

}  // namespace kvengine
