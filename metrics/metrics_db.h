// MetricsDB: the layer of a DB that serves its metrics over HTTP
// (Options::metrics_listen; docs/observability.md).
//
// DB::Open and DB::Attach (api/db_open.cc) put it on top of the stack when
// metrics_listen is set, so any process that opens or attaches a DB can be scraped.
// It forwards every call unchanged (StackableDB) and runs a MetricsServer
// (metrics/metrics_server.h) whose answers come from the DB below through properties
// only:
//   /metrics     "kvengine.metrics": the engine's statistics and this process's perf
//                histograms (an owner's, with its local.* counters); in an attached
//                process, that client's own calls (attach/attached_db.h)
//   /stats.json  "kvengine.stats.json"
//   /ready       "kvengine.readiness": each layer's checks (SSD tier writable, recovery
//                done, cluster member registered)
//   /health      open, or the reason it is not
// Close closes the DB below but keeps the endpoint up, answering 503 "DB is closed",
// until the MetricsDB is destroyed: an orchestrator sees the DB drain.
//
// Thread-safety: as kvengine::DB; the server's threads read the DB below concurrently.
#ifndef KVENGINE_METRICS_METRICS_DB_H_
#define KVENGINE_METRICS_METRICS_DB_H_

#include <atomic>
#include <memory>
#include <string>

#include "kvengine/db.h"
#include "kvengine/stackable_db.h"
#include "metrics/metrics_server.h"

namespace kvengine {

class MetricsDB final : public StackableDB, private MetricsServer::Source {
 public:
  // Wraps *db in a MetricsDB serving options.metrics_listen.  On success *db is the
  // MetricsDB (which owns the DB below); on failure (the address does not parse or
  // cannot be bound) *db is left as it was.
  static Status Wrap(const Options& options, std::unique_ptr<DB>* db);

  // Stops the endpoint, then closes the DB below.
  ~MetricsDB() override;

  // Closes the DB below; the endpoint stays up, answering 503, until destruction.
  Status Close() override;
  // "kvengine.metrics_listen": the endpoint's address (the port chosen, when 0 was
  // asked for); every other property is the DB below's.
  bool GetProperty(const std::string& name, std::string* value) override;

 private:
  explicit MetricsDB(std::unique_ptr<DB> base) : StackableDB(std::move(base)) {}

  // MetricsServer::Source
  bool Metrics(std::string* text) override;
  bool StatsJson(std::string* json) override;
  Status Health() override;
  Status Ready(std::string* detail) override;
  uint64_t Epoch() override;

  std::atomic<bool> closed_{false};
  std::unique_ptr<MetricsServer> server_;  // set once by Wrap
};

}  // namespace kvengine

#endif  // KVENGINE_METRICS_METRICS_DB_H_
