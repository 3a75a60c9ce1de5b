// The metrics endpoint against clients that try to stall or bloat it (issue 49): a real
// kv_server with --metrics_listen, attacked over real sockets while a good scraper asks
// for /metrics every 100 ms -- 100 clients sending their head a byte at a time, 1000 idle
// connections, a 64 MiB request line, 500,000 headers, a 64 MiB chunked body, 64
// concurrent scrapers.  Every good scrape must be answered 200 within 2 s and the
// kv_server's resident memory must stay flat.  Also the request-head parser's rules
// (metrics/http_request.h) one by one.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "metrics/http_request.h"
#include "test/peer_harness.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

using Clock = std::chrono::steady_clock;
using Result = HttpRequestHead::Result;

// ------------------------------------------------------------------ the parser's rules

TEST(HttpRequestHeadTest, ACompleteHeadIsReadWithItsLength) {
  HttpRequestHead h;
  size_t used = 0;
  const std::string req = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\nGET /";
  ASSERT_EQ(h.Parse(req, {}, &used), Result::kComplete);
  EXPECT_EQ(used, req.size() - 5);  // the pipelined request's start is left
  EXPECT_EQ(h.method, "GET");
  EXPECT_EQ(h.path, "/metrics");
  EXPECT_TRUE(h.keep_alive);
  EXPECT_FALSE(h.has_body);
}

// The head parsed from `text` with the default limits; fails the test unless complete.
HttpRequestHead Complete(const std::string& text) {
  HttpRequestHead h;
  size_t used = 0;
  EXPECT_EQ(h.Parse(text, {}, &used), Result::kComplete) << text;
  return h;
}

TEST(HttpRequestHeadTest, ConnectionRulesOfOneZeroAndOneOne) {
  EXPECT_FALSE(Complete("GET / HTTP/1.1\nConnection: Close\n\n").keep_alive);
  EXPECT_FALSE(Complete("GET / HTTP/1.0\r\n\r\n").keep_alive);
  EXPECT_TRUE(Complete("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").keep_alive);
}

TEST(HttpRequestHeadTest, BodiesAreSeenFromEitherHeader) {
  EXPECT_FALSE(Complete("GET / HTTP/1.1\r\nContent-Length: 000\r\n\r\n").has_body);
  EXPECT_TRUE(Complete("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n").has_body);
  EXPECT_TRUE(Complete("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").has_body);
  HttpRequestHead h;
  size_t used = 0;
  EXPECT_EQ(h.Parse("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", {}, &used), Result::kRefused);
  EXPECT_EQ(h.status, 400);
}

TEST(HttpRequestHeadTest, LimitsAreJudgedBeforeTheLineOrHeadEnds) {
  HttpRequestHead::Limits limits;
  HttpRequestHead h;
  size_t used = 0;
  EXPECT_EQ(h.Parse("GET /" + std::string(2000, 'a'), limits, &used), Result::kIncomplete);
  EXPECT_EQ(h.Parse("GET /" + std::string(3000, 'a'), limits, &used), Result::kRefused);
  EXPECT_EQ(h.status, 414);
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 65; i++) many += "X: y\r\n";
  h = HttpRequestHead();
  EXPECT_EQ(h.Parse(many, limits, &used), Result::kRefused);  // no blank line yet
  EXPECT_EQ(h.status, 431);
  h = HttpRequestHead();
  EXPECT_EQ(h.Parse("GET / HTTP/1.1\r\nX: " + std::string(9000, 'b'), limits, &used),
            Result::kRefused);
  EXPECT_EQ(h.status, 431);
}

TEST(HttpRequestHeadTest, MalformedHeadsAreRefused) {
  size_t used = 0;
  for (const char* bad : {"GET\r\n\r\n", "GET / HTTP/1.1 x\r\n\r\n", "GET / FTP/1\r\n\r\n",
                          "GET / HTTP/1.1\r\nno colon\r\n\r\n", "G(T / HTTP/1.1\r\n\r\n"}) {
    HttpRequestHead h;
    EXPECT_EQ(h.Parse(bad, {}, &used), Result::kRefused) << bad;
    EXPECT_EQ(h.status, 400) << bad;
  }
  HttpRequestHead h;
  EXPECT_EQ(h.Parse("GET / HTTP/2.0\r\n\r\n", {}, &used), Result::kRefused);
  EXPECT_EQ(h.status, 505);
}

// ------------------------------------------------------------------ sockets

int Connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when the peer has answered (or closed): a client stops sending then.
bool Answered(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// Sends all of `bytes` or until the peer stops taking them; false in that case.
bool SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads until the peer closes or `timeout`; the bytes read.
std::string ReadToClose(int fd, std::chrono::milliseconds timeout) {
  std::string got;
  const auto deadline = Clock::now() + timeout;
  char buf[65536];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (poll(&p, 1, std::max(left, 1)) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

int StatusOf(const std::string& answer) {
  return answer.starts_with("HTTP/1.1 ") ? std::atoi(answer.c_str() + 9) : 0;
}

// One request on a connection of its own; the answer's status, 0 for none.
int Ask(uint16_t port, const std::string& request, std::chrono::milliseconds timeout) {
  const int fd = Connect(port);
  if (fd < 0) return 0;
  SendAll(fd, request);
  const int status = StatusOf(ReadToClose(fd, timeout));
  close(fd);
  return status;
}

uint64_t RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// A good scraper: /metrics every 100 ms on a new connection, the slowest answer kept.
class GoodScraper {
 public:
  explicit GoodScraper(uint16_t port) : port_(port), thread_([this] { Run(); }) {}
  ~GoodScraper() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Takes the figures since the last call.
  void Take(int* scrapes, int* failed, double* slowest_s) {
    *scrapes = scrapes_.exchange(0);
    *failed = failed_.exchange(0);
    *slowest_s = slowest_us_.exchange(0) / 1e6;
  }

 private:
  void Run() {
    while (!stop_.load()) {
      const auto start = Clock::now();
      const int status = Ask(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                             std::chrono::milliseconds(5000));
      const uint64_t us =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
      scrapes_++;
      if (status != 200) failed_++;
      uint64_t prev = slowest_us_.load();
      while (us > prev && !slowest_us_.compare_exchange_weak(prev, us)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  const uint16_t port_;
  std::atomic<bool> stop_{false};
  std::atomic<int> scrapes_{0};
  std::atomic<int> failed_{0};
  std::atomic<uint64_t> slowest_us_{0};
  std::thread thread_;
};

class HostileClients : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.path());
    port_ = test::FreePort();
    server_ = std::make_unique<Server>(
        dir_.Sub("db"), test::FreePort(),
        std::vector<std::string>{"--metrics_listen=127.0.0.1:" + std::to_string(port_)});
    ASSERT_TRUE(server_->Start());
    ASSERT_EQ(Ask(port_, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
                  std::chrono::milliseconds(3000)),
              200);
    rss_before_ = RssKiB(server_->pid());
    scraper_ = std::make_unique<GoodScraper>(port_);
  }
  void TearDown() override {
    scraper_.reset();
    server_.reset();
  }

  // Checks the good scraper's figures over the attack just run and the server's memory.
  void ExpectScrapesOnTimeAndMemoryFlat(const char* attack) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // scrapes after it, too
    int scrapes = 0, failed = 0;
    double slowest = 0;
    scraper_->Take(&scrapes, &failed, &slowest);
    EXPECT_GE(scrapes, 2) << attack;
    EXPECT_EQ(failed, 0) << attack;
    EXPECT_LT(slowest, 2.0) << attack << ": the slowest scrape took " << slowest << " s";
    const uint64_t rss = RssKiB(server_->pid());
    EXPECT_LT(rss, rss_before_ + 16 * 1024)
        << attack << ": RSS " << rss_before_ << " KiB before, " << rss << " KiB after";
    std::printf("%-28s %3d scrapes, slowest %.3f s, RSS %llu -> %llu KiB\n", attack, scrapes,
                slowest, static_cast<unsigned long long>(rss_before_),
                static_cast<unsigned long long>(rss));
  }

  test::TempDir dir_;
  uint16_t port_ = 0;
  std::unique_ptr<Server> server_;
  std::unique_ptr<GoodScraper> scraper_;
  uint64_t rss_before_ = 0;
};

TEST_F(HostileClients, NoneStallsAScrapeOrGrowsTheServer) {
  {  // 100 clients sending their head one byte every 100 ms, for 3 s
    std::vector<int> slow;
    for (int i = 0; i < 100; i++) slow.push_back(Connect(port_));
    const std::string head = "GET /metrics HTTP/1.1\r\nX-Slow: " + std::string(200, 's');
    for (size_t b = 0; b < 30; b++) {
      for (int fd : slow) send(fd, head.data() + b, 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int fd : slow) close(fd);
    ExpectScrapesOnTimeAndMemoryFlat("100 slow-header clients");
  }
  {  // 1000 idle connections, held 2 s
    std::vector<int> idle;
    for (int i = 0; i < 1000; i++) {
      const int fd = Connect(port_);
      if (fd >= 0) idle.push_back(fd);
    }
    EXPECT_EQ(idle.size(), 1000u) << "the backlog refused connections";
    std::this_thread::sleep_for(std::chrono::seconds(2));
    for (int fd : idle) close(fd);
    ExpectScrapesOnTimeAndMemoryFlat("1000 idle connections");
  }
  {  // a 64 MiB request line: 414, read no further than the limit
    const int fd = Connect(port_);
    std::string chunk = "GET /" + std::string(1 << 20, 'a');
    for (int i = 0; i < 64; i++) {  // all of it, answered or not, as the probe
      if (!SendAll(fd, chunk)) break;
      chunk.assign(1 << 20, 'a');
    }
    EXPECT_EQ(StatusOf(ReadToClose(fd, std::chrono::milliseconds(3000))), 414);
    close(fd);
    ExpectScrapesOnTimeAndMemoryFlat("a 64 MiB request line");
  }
  {  // 500,000 headers: 431
    const int fd = Connect(port_);
    std::string headers = "GET /metrics HTTP/1.1\r\n";
    for (int i = 0; i < 500000; i++) headers += "X-Many: y\r\n";
    headers += "\r\n";
    for (size_t at = 0; at < headers.size() && !Answered(fd); at += 65536) {
      if (!SendAll(fd, std::string_view(headers).substr(at, 65536))) break;
    }
    EXPECT_EQ(StatusOf(ReadToClose(fd, std::chrono::milliseconds(3000))), 431);
    close(fd);
    ExpectScrapesOnTimeAndMemoryFlat("500,000 headers");
  }
  {  // a 64 MiB chunked body: 405, the body never read into memory
    const int fd = Connect(port_);
    SendAll(fd, "POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string chunk = "100000\r\n" + std::string(1 << 20, 'c') + "\r\n";
    for (int i = 0; i < 64; i++) {
      if (!SendAll(fd, chunk)) break;
    }
    EXPECT_EQ(StatusOf(ReadToClose(fd, std::chrono::milliseconds(3000))), 405);
    close(fd);
    ExpectScrapesOnTimeAndMemoryFlat("a 64 MiB chunked body");
  }
  {  // 64 concurrent scrapers, 10 scrapes each over one kept-alive connection
    std::atomic<int> answered{0};
    std::vector<std::thread> scrapers;
    for (int t = 0; t < 64; t++) {
      scrapers.emplace_back([&] {
        const int fd = Connect(port_);
        for (int i = 0; i < 10; i++) {
          if (!SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")) break;
          // Read one answer: head, then Content-Length bytes.
          std::string got;
          char buf[65536];
          size_t want = std::string::npos;
          while (want == std::string::npos || got.size() < want) {
            const ssize_t n = recv(fd, buf, sizeof(buf), 0);
            if (n <= 0) break;
            got.append(buf, static_cast<size_t>(n));
            const size_t end = got.find("\r\n\r\n");
            const size_t cl = got.find("Content-Length: ");
            if (want == std::string::npos && end != std::string::npos && cl < end) {
              want = end + 4 + std::stoull(got.substr(cl + 16));
            }
          }
          if (StatusOf(got) == 200 && got.size() == want) answered++;
        }
        close(fd);
      });
    }
    for (std::thread& t : scrapers) t.join();
    EXPECT_EQ(answered.load(), 640);
    ExpectScrapesOnTimeAndMemoryFlat("64 concurrent scrapers");
  }
}

TEST_F(HostileClients, OnlyGetAndHeadAreServed) {
  const auto t = std::chrono::milliseconds(3000);
  EXPECT_EQ(Ask(port_, "OPTIONS /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", t), 405);
  EXPECT_EQ(Ask(port_, "TRACE /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", t), 405);
  EXPECT_EQ(Ask(port_, "POST /health HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", t), 405);
  EXPECT_EQ(Ask(port_, "GET /health HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", t), 413);
  EXPECT_EQ(Ask(port_, "GET /nothing HTTP/1.1\r\nConnection: close\r\n\r\n", t), 404);
  const int fd = Connect(port_);
  SendAll(fd, "HEAD /health HTTP/1.0\r\n\r\n");
  const std::string head = ReadToClose(fd, t);
  close(fd);
  EXPECT_EQ(StatusOf(head), 200);
  EXPECT_NE(head.find("Content-Length: "), std::string::npos) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;  // no body
  // GET's body: "ok" and the store's boot epoch.
  const int get = Connect(port_);
  SendAll(get, "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string answer = ReadToClose(get, t);
  close(get);
  EXPECT_NE(answer.find("\r\n\r\nok\nepoch: "), std::string::npos) << answer;
}

// A kv_server started with only --metrics_listen (perf_level "auto": entry) exports
// latency samples for the calls its peers make (issue 49 item 3).
TEST_F(HostileClients, LatencyHistogramsHaveSamplesByDefault) {
  auto client = NewClient();
  std::vector<std::string> keys = {"k0", "k1", "k2"};
  std::vector<Slice> slices(keys.begin(), keys.end());
  const std::string value(1000, 'v');
  std::vector<ValueParts> values(keys.size(), ValueParts{Slice(value)});
  std::vector<int64_t> r;
  ASSERT_TRUE(client->BatchPut(server_->endpoint(), slices, values, &r).ok());
  const int fd = Connect(port_);
  SendAll(fd, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string text = ReadToClose(fd, std::chrono::milliseconds(5000));
  close(fd);
  ASSERT_EQ(StatusOf(text), 200);
  const std::string sample =
      "\nkvengine_operation_latency_seconds_count{operation=\"db_batch_put\",layer=\"db\"} ";
  const size_t at = text.find(sample);
  ASSERT_NE(at, std::string::npos) << "no db_batch_put samples";
  EXPECT_GE(std::atof(text.c_str() + at + sample.size()), 1.0);
}

TEST_F(HostileClients, ASlowClientIsClosedAtItsRequestsDeadlineNotPerRead) {
  // One byte every 500 ms never lets a read time out; the request's 2 s deadline ends it.
  const int fd = Connect(port_);
  const std::string head = "GET /metrics HTTP/1.1\r\n";
  const auto start = Clock::now();
  bool closed = false;
  for (size_t b = 0; b < head.size() && !closed; b++) {
    send(fd, head.data() + b, 1, MSG_NOSIGNAL);
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 500) > 0) {
      char c;
      closed = recv(fd, &c, 1, 0) <= 0;
    }
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_GT(took, 1.5);
  EXPECT_LT(took, 3.5);
}

}  // namespace
}  // namespace kvengine
