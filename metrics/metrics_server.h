// MetricsServer: the HTTP endpoint of Options::metrics_listen (docs/observability.md).
//
//   GET /metrics     the Prometheus text exposition (format 0.0.4) of Source::Metrics
//   GET /health      200 "ok" while the process serves and the DB is open; 503 and the
//                    reason otherwise
//   GET /ready       200 and one "check: ok" line per readiness check; 503 and the same
//                    lines, the failing ones saying why, while any check fails
//   GET /stats.json  what the "kvengine.stats.json" property says
// Anything else is 404; a method other than GET or HEAD is 405.
//
// Served by cpp-httplib (Debian's libcpp-httplib-dev), never a parser of our own, on
// `threads` threads.  Bounded: at most `max_queued` accepted connections wait for a
// thread; a further one is answered 503 on the accepting thread and closed (which holds
// that thread at most keep_alive_ms when the client sends nothing: httplib gives the
// pool no way to close a connection unread); a request line or header past the
// library's 8 KiB limit is refused (414 / 400), a body past max_request_bytes (413); a
// client that stalls mid-request is dropped after read_timeout_ms, an idle one after
// keep_alive_ms.  The handlers read counters and render text: they take no lock a
// data-path call holds for long, so scraping does not slow the DB (measured in
// docs/observability.md).
//
// Thread-safety: Start and Stop from one thread; the Source is called from the server's
// threads, concurrently.
#ifndef KVENGINE_METRICS_METRICS_SERVER_H_
#define KVENGINE_METRICS_METRICS_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "kvengine/status.h"

namespace httplib {
class Server;
}

namespace kvengine {

class MetricsServer {
 public:
  // What the endpoint reports.  Called from the server's threads, concurrently.
  class Source {
   public:
    virtual ~Source() = default;
    // The exposition text; false when there is none to give (the DB is closed).
    virtual bool Metrics(std::string* text) = 0;
    // The "kvengine.stats.json" text; false when there is none to give.
    virtual bool StatsJson(std::string* json) = 0;
    // OK while the process serves and the DB is open; otherwise why not.
    virtual Status Health() = 0;
    // One "check: ok" or "check: not ready: why" line per check into *detail; OK when
    // every check passes, otherwise the first failing line's reason.
    virtual Status Ready(std::string* detail) = 0;
  };

  struct Limits {
    size_t threads = 4;               // threads answering requests
    size_t max_queued = 32;           // accepted connections waiting for a thread
    size_t max_request_bytes = 4096;  // a request's body
    uint64_t read_timeout_ms = 2000;  // a request must arrive within this once begun
    uint64_t keep_alive_ms = 1000;    // a connection idle this long is closed (whole seconds)
  };

  // Listens on `listen`: "HOST:PORT", or "PORT" alone for 127.0.0.1:PORT (port 0: any
  // free port, see address()).  InvalidArgument when it does not parse; IOError when
  // the address cannot be bound.  `source` is not owned and must outlive the server.
  static Status Start(const std::string& listen, Source* source, const Limits& limits,
                      std::unique_ptr<MetricsServer>* result);
  ~MetricsServer();

  // Stops accepting, finishes the requests in flight, joins the threads.  Idempotent.
  void Stop();

  // The address bound, "HOST:PORT" with the port chosen when 0 was asked for.
  const std::string& address() const { return address_; }
  // Connections answered 503 because max_queued were already waiting.
  uint64_t refused_connections() const { return refused_->load(); }

 private:
  MetricsServer() = default;
  void Route(Source* source, const Limits& limits);

  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  std::string address_;
  std::shared_ptr<std::atomic<uint64_t>> refused_ = std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace kvengine

#endif  // KVENGINE_METRICS_METRICS_SERVER_H_
