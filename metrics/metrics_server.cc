#include "metrics/metrics_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "kvengine/transport.h"

namespace kvengine {

namespace {

// Set on the accepting thread while it answers a connection refused for want of room.
thread_local bool t_overloaded = false;

// httplib's thread pool with a bound on the connections waiting for a thread.  A
// connection past the bound is served on the accepting thread, flagged, so that the
// route answers 503 without running a handler.  (httplib's own pool queues without
// bound.)  The mutex is std::mutex rather than util/mutex.h's: the condition variable
// must be std's to pair with it, and the class lives only here.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t max_queued, std::shared_ptr<std::atomic<uint64_t>> refused)
      : max_queued_(max_queued), refused_(std::move(refused)) {
    for (size_t i = 0; i < threads; i++) threads_.emplace_back([this] { Work(); });
  }
  ~BoundedPool() override = default;

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.size() < max_queued_) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    refused_->fetch_add(1);
    t_overloaded = true;
    fn();  // reads the request (within the read timeout), answers 503, closes
    t_overloaded = false;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::shared_ptr<std::atomic<uint64_t>> refused_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

void Answer(httplib::Response& res, int status, const std::string& body,
            const char* type = "text/plain; charset=utf-8") {
  res.status = status;
  res.set_content(body, type);
}

}  // namespace

Status MetricsServer::Start(const std::string& listen, Source* source, const Limits& limits,
                            std::unique_ptr<MetricsServer>* result) {
  result->reset();
  Endpoint where;
  const bool port_only =
      !listen.empty() && listen.find_first_not_of("0123456789") == std::string::npos;
  Status s = Endpoint::Parse(port_only ? "127.0.0.1:" + listen : listen, &where);
  if (!s.ok()) return Status::InvalidArgument("metrics_listen", s.message());
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->http_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *server->http_;
  auto refused = server->refused_;
  http.new_task_queue = [limits, refused] {
    return new BoundedPool(std::max<size_t>(1, limits.threads), limits.max_queued, refused);
  };
  http.set_payload_max_length(limits.max_request_bytes);
  http.set_read_timeout(std::chrono::milliseconds(limits.read_timeout_ms));
  http.set_write_timeout(std::chrono::milliseconds(limits.read_timeout_ms));
  http.set_keep_alive_timeout(
      static_cast<time_t>(std::max<uint64_t>(1, limits.keep_alive_ms / 1000)));
  http.set_keep_alive_max_count(100);
  // httplib's default sets SO_REUSEPORT too, which lets a second process bind the same
  // port and take half the scrapes: only SO_REUSEADDR (a restart may rebind at once).
  http.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->Route(source, limits);
  const std::string host =
      where.host.starts_with('[') ? where.host.substr(1, where.host.size() - 2) : where.host;
  int port = where.port;
  if (port == 0) {
    port = http.bind_to_any_port(host);
  } else if (!http.bind_to_port(host, port)) {
    port = -1;
  }
  if (port < 0) {
    return Status::IOError("metrics_listen: cannot listen on " + where.ToString(),
                           "address in use or not this host's");
  }
  where.port = static_cast<uint16_t>(port);
  server->address_ = where.ToString();
  server->listener_ = std::thread([&http] { http.listen_after_bind(); });
  // Stop() must not come before the loop runs (httplib's stop() would miss it).
  for (int i = 0; i < 5000 && !http.is_running(); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *result = std::move(server);
  return Status::OK();
}

void MetricsServer::Route(Source* source, const Limits&) {
  httplib::Server& http = *http_;
  http.set_pre_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (!t_overloaded) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");
    Answer(res, 503, "too many connections to the metrics endpoint\n");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Get("/metrics", [source](const httplib::Request&, httplib::Response& res) {
    std::string text;
    if (!source->Metrics(&text)) {
      Answer(res, 503, source->Health().ToString() + "\n");
      return;
    }
    Answer(res, 200, text, "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/stats.json", [source](const httplib::Request&, httplib::Response& res) {
    std::string json;
    if (!source->StatsJson(&json)) {
      Answer(res, 503, source->Health().ToString() + "\n");
      return;
    }
    Answer(res, 200, json, "application/json");
  });
  http.Get("/health", [source](const httplib::Request&, httplib::Response& res) {
    const Status health = source->Health();
    Answer(res, health.ok() ? 200 : 503, health.ok() ? "ok\n" : health.ToString() + "\n");
  });
  http.Get("/ready", [source](const httplib::Request&, httplib::Response& res) {
    std::string detail;
    const Status ready = source->Ready(&detail);
    Answer(res, ready.ok() ? 200 : 503, detail);
  });
  auto not_allowed = [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Allow", "GET, HEAD");
    Answer(res, 405, "only GET\n");
  };
  for (const char* path : {"/metrics", "/stats.json", "/health", "/ready"}) {
    http.Post(path, not_allowed);
    http.Put(path, not_allowed);
    http.Delete(path, not_allowed);
    http.Patch(path, not_allowed);
  }
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (http_ == nullptr) return;
  http_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace kvengine
