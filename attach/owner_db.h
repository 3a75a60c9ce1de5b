// OwnerDB: the layer of a DB that serves the other processes of its host
// (Options::local_listen; docs/attach.md).
//
// It holds the DB it serves -- the top of the owner's stack of layers, the engine or a
// layer over it -- and forwards every call to it unchanged (RocksDB's StackableDB
// shape: it derives from StackableDB).  What it adds:
//   * the local server (attach/local_server.h) on local_listen, which serves that same
//     DB to attached processes, and reaches the engine's arena through SharedArena
//     (db/shared_arena.h) for the value bytes;
//   * the LOCAL_SOCKET record in the DB directory (attach/local_socket_record.h), so
//     that DB::Open of the directory by another process attaches;
//   * the local server's counters in the stats properties: "kvengine.stats" gets its
//     local.* lines, "kvengine.stats.json" its "local" object, the Prometheus
//     properties its kvengine_local_* families (attach/local_counters.h).
// Close stops the server first -- its sessions hold reservations and pins in the arena
// and call the DB served -- then removes the record, then closes the DB served.
//
// Thread-safety: as kvengine::DB; Close may race with every call.
#ifndef KVENGINE_ATTACH_OWNER_DB_H_
#define KVENGINE_ATTACH_OWNER_DB_H_

#include <memory>
#include <string>

#include "attach/local_counters.h"
#include "kvengine/db.h"
#include "kvengine/env.h"
#include "kvengine/stackable_db.h"
#include "util/mutex.h"

namespace kvengine {

class LocalServer;
class Logger;
class SharedArena;

class OwnerDB final : public StackableDB {
 public:
  // `path` made absolute: the LOCAL_SOCKET record names the socket for processes whose
  // working directory is not this one's.  DB::Open resolves Options::local_listen with
  // it before any layer is built, so every layer reports the same path.
  static std::string AbsoluteSocketPath(const std::string& path);

  // Wraps *db, the DB opened in directory `path` with `options`, in an OwnerDB that
  // serves it on options.local_listen (absolute), and records the socket in `path`.
  // `arena` is the engine's at the bottom of *db and `logger` its log: both live as
  // long as *db.  On success *db is the OwnerDB (which owns the DB it serves); on
  // failure *db is left as it was, the socket not served.
  static Status Wrap(const Options& options, const std::string& path, SharedArena* arena,
                     Logger* logger, std::unique_ptr<DB>* db);

  ~OwnerDB() override;

  Status Close() override;
  // The DB served's property, with the local server's counters added to the stats.
  bool GetProperty(const std::string& name, std::string* value) override;

 private:
  OwnerDB(std::unique_ptr<DB> served, Env* env, std::string path);

  // base_ (StackableDB's) is the DB served; null only when Wrap failed and gave it back.
  Env* const env_;                // the DB directory's
  const std::string path_;        // the DB directory
  LocalServerCounters counters_;  // server_'s, kept after it stops

  // One Close at a time: the first stops the server and removes the record.
  Mutex close_mu_;
  std::unique_ptr<LocalServer> server_ GUARDED_BY(close_mu_);  // null once closed
};

}  // namespace kvengine

#endif  // KVENGINE_ATTACH_OWNER_DB_H_
