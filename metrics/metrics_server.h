// MetricsServer: the HTTP endpoint of Options::metrics_listen (docs/observability.md).
//
//   GET /metrics     the Prometheus text exposition (format 0.0.4) of Source::Metrics
//   GET /health      200 "ok" and the DB's boot epoch ("epoch: N") while the process
//                    serves and the DB is open; 503 and the reason otherwise
//   GET /ready       200 and one "check: ok" line per readiness check; 503 and the same
//                    lines, the failing ones saying why, while any check fails
//   GET /stats.json  what the "kvengine.stats.json" property says
// Anything else is 404; a method other than GET or HEAD is 405.
//
// Served by a purpose-built HTTP/1.1 server (why not cpp-httplib: docs/observability.md,
// "Bounds"): one thread runs an epoll loop that accepts, reads and writes every
// connection without ever waiting on one, and `threads` threads render the answers.
// Every bound is the code's, checked by test/metrics_test.cc with real sockets:
//   - a request's head (line and headers) must arrive whole within request_timeout_ms of
//     its first byte -- a deadline for the request, not a timeout per read -- and its
//     answer be taken by the client within request_timeout_ms; an idle connection is
//     closed after idle_timeout_ms;
//   - a connection holds at most HttpRequestHead::Limits::max_head_bytes of request: a
//     request line past max_request_line is answered 414, a head past max_head_bytes or
//     max_headers 431, each as soon as the bytes received prove it; a body is never
//     read (GET with a body: 413, other methods: 405) and the connection is closed --
//     after discarding what the client still sends, for idle_timeout_ms at most, so
//     that the answer is not lost to a reset;
//   - at most max_connections are open; one more evicts the connection that has waited
//     longest for its request to complete (idle or slow), so slow clients cannot keep a
//     new one out; at most max_answers answers are rendered or written at a time, the
//     next complete requests wait for a slot (within their deadline);
//   - the listen backlog is `backlog` (the kernel caps it at net.core.somaxconn).
// The handlers read counters and render text: they take no lock a data-path call holds
// for long, so scraping does not slow the DB (measured in docs/observability.md).
//
// Thread-safety: Start and Stop from one thread; the Source is called from the server's
// threads, concurrently.
#ifndef KVENGINE_METRICS_METRICS_SERVER_H_
#define KVENGINE_METRICS_METRICS_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "kvengine/status.h"
#include "metrics/http_request.h"

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
    // The DB's boot epoch ("kvengine.epoch"); 0 when it has none to tell.
    virtual uint64_t Epoch() { return 0; }
  };

  struct Limits {
    size_t threads = 2;                  // threads rendering answers
    size_t max_connections = 256;        // open connections; one more evicts the oldest waiting
    size_t max_answers = 16;             // answers rendered or being written at a time
    int backlog = 4096;                  // listen backlog (capped by net.core.somaxconn)
    uint64_t request_timeout_ms = 2000;  // a head must arrive, an answer be taken, within this
    uint64_t idle_timeout_ms = 5000;     // a connection with no request begun is closed after
    HttpRequestHead::Limits head;        // request line, header count and bytes
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
  // Connections closed before their request completed: evicted for a newer one,
  // past their deadline, or refused for a limit.
  uint64_t dropped_connections() const;

 private:
  class Loop;
  MetricsServer() = default;

  std::unique_ptr<Loop> loop_;
  std::string address_;
};

}  // namespace kvengine

#endif  // KVENGINE_METRICS_METRICS_SERVER_H_
