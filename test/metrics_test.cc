// The metrics endpoint (Options::metrics_listen, kv_server --metrics_listen;
// docs/observability.md), scraped over real sockets: the families and their values after
// known traffic, /health and /ready with their 503 cases, the bounds, an attached
// client's own view, `promtool check metrics` on a live kv_server, a real Prometheus
// scraping a kv_server, and the Grafana dashboard against the families exported.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "env/fault_injection_env.h"
#include "kvengine/db.h"
#include "test/peer_harness.h"
#include "test/test_util.h"
#include "util/prometheus.h"

namespace kvengine {
namespace {

using Clock = std::chrono::steady_clock;

struct Answer {
  int status = 0;  // 0: no answer
  std::string body;
};

Answer Fetch(const std::string& address, const std::string& path) {
  httplib::Client client("http://" + address);
  client.set_connection_timeout(3);
  client.set_read_timeout(5);
  auto res = client.Get(path.c_str());
  if (!res) return {};
  return {res->status, res->body};
}

std::string MetricsAddress(DB* db) {
  std::string address;
  EXPECT_TRUE(db->GetProperty("kvengine.metrics_listen", &address));
  return address;
}

// family -> TYPE, from the "# TYPE" lines; also checks every family has HELP first.
std::map<std::string, std::string> Families(const std::string& text) {
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) {
      helped.insert(line.substr(7, line.find(' ', 7) - 7));
    } else if (line.rfind("# TYPE ", 0) == 0) {
      const size_t sp = line.find(' ', 7);
      const std::string name = line.substr(7, sp - 7);
      EXPECT_TRUE(helped.count(name)) << "no HELP before TYPE of " << name;
      EXPECT_FALSE(types.count(name)) << "family twice: " << name;
      types[name] = line.substr(sp + 1);
    }
  }
  return types;
}

// The value of the sample `name{labels}` (exactly as written), or -1.
double SampleValue(const std::string& text, const std::string& sample) {
  const size_t at = text.find("\n" + sample + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + sample.size() + 2, nullptr);
}

class MetricsTest : public ::testing::Test {
 protected:
  Options BaseOptions() {
    Options o;
    o.apply_environment = false;
    o.memory_capacity_bytes = 16 << 20;
    o.memory_slab_size = 1 << 20;
    o.prefault_memory = false;
    o.use_huge_pages = false;
    o.ssd_capacity_bytes = 0;
    o.log_level = LogLevel::kOff;
    o.metrics_listen = "127.0.0.1:0";
    return o;
  }
  void SetUp() override { std::filesystem::create_directories(dir_.path()); }
  test::TempDir dir_;
};

TEST_F(MetricsTest, ScrapeOverSocketShowsEveryFamilyAndTheCountsOfKnownTraffic) {
  Options o = BaseOptions();
  o.perf_level = PerfLevel::kAll;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  ResetPerf();
  for (int i = 0; i < 5; i++)
    ASSERT_TRUE(db->Put(WriteOptions(), "k" + std::to_string(i), "value").ok());
  std::string v;
  for (int i = 0; i < 3; i++) ASSERT_TRUE(db->Get(ReadOptions(), "k" + std::to_string(i), &v).ok());
  for (int i = 0; i < 2; i++)
    EXPECT_TRUE(db->Get(ReadOptions(), "nope" + std::to_string(i), &v).IsNotFound());
  ASSERT_TRUE(db->Delete(WriteOptions(), "k4").ok());

  const Answer a = Fetch(MetricsAddress(db.get()), "/metrics");
  ASSERT_EQ(a.status, 200) << a.body;
  const auto families = Families(a.body);
  for (const auto& [name, type] : families) {
    EXPECT_EQ(name.rfind("kvengine_", 0), 0u) << name;
    if (type == "counter") {
      EXPECT_TRUE(name.ends_with("_total")) << name;
    }
  }
  EXPECT_EQ(families.at("kvengine_tier_hits_total"), "counter");
  EXPECT_EQ(families.at("kvengine_read_failures_total"), "counter");
  EXPECT_EQ(families.at("kvengine_operation_latency_seconds"), "histogram");
  EXPECT_EQ(SampleValue(a.body, "kvengine_tier_hits_total{tier=\"memory\"}"), 3);
  EXPECT_EQ(SampleValue(a.body, "kvengine_tier_hits_total{tier=\"peer\"}"), 0);
  EXPECT_EQ(SampleValue(a.body, "kvengine_tier_read_bytes_total{tier=\"memory\"}"), 15);
  EXPECT_EQ(SampleValue(a.body, "kvengine_tier_written_bytes_total{tier=\"memory\"}"), 25);
  EXPECT_EQ(SampleValue(a.body, "kvengine_tier_misses_total{tier=\"memory\"}"), 2);
  EXPECT_EQ(SampleValue(a.body, "kvengine_read_failures_total{tier=\"memory\",reason=\"absent\"}"),
            2);
  EXPECT_EQ(
      SampleValue(a.body, "kvengine_tier_evictions_total{tier=\"memory\",reason=\"explicit\"}"), 1);
  EXPECT_EQ(SampleValue(a.body, "kvengine_puts_total"), 5);
  // The histogram: cumulative buckets ending in +Inf = _count.
  const std::string base = "kvengine_operation_latency_seconds";
  const std::string labels = "operation=\"db_get\",layer=\"db\"";
  EXPECT_EQ(SampleValue(a.body, base + "_bucket{" + labels + ",le=\"+Inf\"}"), 5);
  EXPECT_EQ(SampleValue(a.body, base + "_count{" + labels + "}"), 5);
  double last = 0;
  for (double le : kLatencyBucketsSeconds) {
    char bound[32];
    std::snprintf(bound, sizeof(bound), "%g", le);
    const double n = SampleValue(a.body, base + "_bucket{" + labels + ",le=\"" + bound + "\"}");
    ASSERT_GE(n, last) << bound;
    last = n;
  }

  const Answer json = Fetch(MetricsAddress(db.get()), "/stats.json");
  EXPECT_EQ(json.status, 200);
  std::string property;
  ASSERT_TRUE(db->GetProperty("kvengine.stats.json", &property));
  EXPECT_EQ(json.body.substr(0, 40), property.substr(0, 40));
}

TEST_F(MetricsTest, HealthAndReadyAnswer200ThenClosedAnswers503WithTheReason) {
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(BaseOptions(), dir_.path(), &db).ok());
  const std::string at = MetricsAddress(db.get());
  EXPECT_EQ(Fetch(at, "/health").status, 200);
  const Answer ready = Fetch(at, "/ready");
  EXPECT_EQ(ready.status, 200) << ready.body;
  EXPECT_NE(ready.body.find("recovery: ok\n"), std::string::npos) << ready.body;
  ASSERT_TRUE(db->Close().ok());
  const Answer health = Fetch(at, "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("DB is closed"), std::string::npos) << health.body;
  const Answer closed = Fetch(at, "/ready");
  EXPECT_EQ(closed.status, 503);
  EXPECT_NE(closed.body.find("not ready: DB is closed"), std::string::npos) << closed.body;
  EXPECT_EQ(Fetch(at, "/metrics").status, 503);
  db.reset();  // the endpoint goes with the DB
  EXPECT_EQ(Fetch(at, "/health").status, 0);
}

TEST_F(MetricsTest, ReadyIs503WhileTheSsdTierIsReadOnly) {
  FaultInjectionEnv env(Env::Default());
  Options o = BaseOptions();
  o.env = &env;
  o.ssd_capacity_bytes = 64 << 20;
  o.bucket_flush_timeout_ms = 10;
  o.use_direct_io = false;
  o.use_io_uring = false;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  const std::string at = MetricsAddress(db.get());
  Answer ready = Fetch(at, "/ready");
  EXPECT_EQ(ready.status, 200);
  EXPECT_NE(ready.body.find("ssd_writable: ok\n"), std::string::npos) << ready.body;
  env.SetFilesystemActive(false);  // the disk refuses every write from now on
  ASSERT_TRUE(db->Put(WriteOptions(), "key", std::string(4096, 'x')).ok());
  EXPECT_FALSE(db->Flush().ok());
  ready = Fetch(at, "/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("ssd_writable: not ready: SSD tier is read-only"), std::string::npos)
      << ready.body;
  EXPECT_EQ(Fetch(at, "/health").status, 200);  // it still serves reads
  env.SetFilesystemActive(true);                // the writer's retry succeeds
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Fetch(at, "/ready").status != 200 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Fetch(at, "/ready").status, 200);
}

TEST_F(MetricsTest, RequestsAreBoundedAndOnlyGetIsServed) {
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(BaseOptions(), dir_.path(), &db).ok());
  const std::string at = MetricsAddress(db.get());
  EXPECT_EQ(Fetch(at, "/nothing").status, 404);
  httplib::Client client("http://" + at);
  auto post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  auto big = client.Post("/metrics", std::string(1 << 20, 'x'), "text/plain");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 405);  // refused unread
  auto long_uri = client.Get(("/metrics?" + std::string(20000, 'a')).c_str());
  ASSERT_TRUE(long_uri);
  EXPECT_EQ(long_uri->status, 414);
  // More idle connections than the endpoint keeps (256): the oldest give way, and a
  // scrape is answered while they are all still open.
  std::vector<int> idle;
  const Endpoint ep = [&] {
    Endpoint e;
    EXPECT_TRUE(Endpoint::Parse(at, &e).ok());
    return e;
  }();
  for (int i = 0; i < 300; i++) {
    int fd = -1;
    if (ConnectTcp(ep, Clock::now() + std::chrono::seconds(2), &fd).ok()) idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = Clock::now();
  EXPECT_EQ(Fetch(at, "/health").status, 200);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  for (int fd : idle) close(fd);
}

TEST_F(MetricsTest, BadOrTakenAddressFailsOpenNamingIt) {
  Options o = BaseOptions();
  o.metrics_listen = "127.0.0.1:notaport";
  std::unique_ptr<DB> db;
  Status s = DB::Open(o, dir_.Sub("a"), &db);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("metrics_listen"), std::string::npos) << s.ToString();
  ASSERT_TRUE(DB::Open(BaseOptions(), dir_.Sub("b"), &db).ok());
  o.metrics_listen = MetricsAddress(db.get());
  std::unique_ptr<DB> second;
  s = DB::Open(o, dir_.Sub("c"), &second);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.ToString().find("metrics_listen"), std::string::npos) << s.ToString();
  EXPECT_EQ(second, nullptr);
  // A port alone listens on loopback.
  o.metrics_listen = std::to_string(test::FreePort());
  ASSERT_TRUE(DB::Open(o, dir_.Sub("d"), &second).ok());
  EXPECT_EQ(MetricsAddress(second.get()), "127.0.0.1:" + o.metrics_listen);
}

TEST_F(MetricsTest, AnAttachedProcessReportsItsOwnCalls) {
  Options owner_options = BaseOptions();
  owner_options.local_listen = dir_.Sub("local.sock");
  std::unique_ptr<DB> owner;
  ASSERT_TRUE(DB::Open(owner_options, dir_.Sub("db"), &owner).ok());
  Options client_options = BaseOptions();
  std::unique_ptr<DB> client;
  ASSERT_TRUE(DB::Attach(client_options, owner_options.local_listen, &client).ok());
  ASSERT_TRUE(owner->Put(WriteOptions(), "owners", "v").ok());
  for (int i = 0; i < 3; i++)
    ASSERT_TRUE(client->Put(WriteOptions(), "c" + std::to_string(i), "vv").ok());
  std::string v;
  ASSERT_TRUE(client->Get(ReadOptions(), "c0", &v).ok());
  EXPECT_TRUE(client->Get(ReadOptions(), "none", &v).IsNotFound());

  const Answer mine = Fetch(MetricsAddress(client.get()), "/metrics");
  ASSERT_EQ(mine.status, 200);
  EXPECT_EQ(SampleValue(mine.body, "kvengine_client_puts_total"), 3);
  EXPECT_EQ(SampleValue(mine.body, "kvengine_client_put_bytes_total"), 6);
  EXPECT_EQ(SampleValue(mine.body, "kvengine_client_gets_total"), 1);
  EXPECT_EQ(mine.body.find("kvengine_memory_items"), std::string::npos);  // not the store's
  const Answer store = Fetch(MetricsAddress(owner.get()), "/metrics");
  ASSERT_EQ(store.status, 200);
  EXPECT_EQ(SampleValue(store.body, "kvengine_puts_total"), 4);  // everyone's
  EXPECT_EQ(SampleValue(store.body, "kvengine_local_clients_accepted_total"), 1);
  EXPECT_EQ(Fetch(MetricsAddress(client.get()), "/ready").status, 200);  // the owner's checks
}

// ---------------------------------------------------------------- kv_server, promtool, Prometheus

bool HaveBinary(const char* name) {
  return std::system((std::string("command -v ") + name + " >/dev/null 2>&1").c_str()) == 0;
}

// A kv_server with a metrics endpoint, and known traffic through its peer port: 7 keys
// stored, 5 read back, 3 asked for that it does not hold.
class ServedMetrics : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.path());
    metrics_ = "127.0.0.1:" + std::to_string(test::FreePort());
    server_ = std::make_unique<Server>(dir_.Sub("db"), test::FreePort(),
                                       std::vector<std::string>{"--metrics_listen=" + metrics_});
    server_->set_options(",ssd_capacity_bytes=0,perf_level=all");
    ASSERT_TRUE(server_->Start());
    auto client = NewClient();
    std::vector<std::string> keys;
    for (int i = 0; i < 7; i++) keys.push_back("key" + std::to_string(i));
    std::vector<Slice> slices(keys.begin(), keys.end());
    const std::string value(1000, 'v');
    std::vector<ValueParts> values(keys.size(), ValueParts{Slice(value)});
    std::vector<int64_t> r;
    ASSERT_TRUE(client->BatchPut(server_->endpoint(), slices, values, &r).ok());
    std::vector<std::string> ask = {"key0", "key1", "key2", "key3", "key4", "x", "y", "z"};
    std::vector<Slice> ask_slices(ask.begin(), ask.end());
    std::vector<std::string> got;
    ASSERT_TRUE(client->BatchGetOwned(server_->endpoint(), ask_slices, &got, &r).ok());
  }
  test::TempDir dir_;
  std::string metrics_;
  std::unique_ptr<Server> server_;
};

TEST_F(ServedMetrics, PromtoolChecksTheExposition) {
  if (!HaveBinary("promtool")) GTEST_SKIP() << "promtool not installed (Debian: prometheus)";
  const Answer a = Fetch(metrics_, "/metrics");
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(SampleValue(a.body, "kvengine_tier_hits_total{tier=\"memory\"}"), 5);
  const std::string file = dir_.Sub("metrics.txt");
  std::ofstream(file) << a.body;
  const std::string out = dir_.Sub("promtool.out");
  const int rc =
      std::system(("promtool check metrics < '" + file + "' > '" + out + "' 2>&1").c_str());
  std::ifstream in(out);
  std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << report;
  EXPECT_EQ(report, "") << report;  // not even a lint warning
}

TEST_F(ServedMetrics, ARealPrometheusScrapesItAndAnswersTheCounters) {
  if (!HaveBinary("prometheus")) GTEST_SKIP() << "prometheus not installed (Debian: prometheus)";
  const std::string web = "127.0.0.1:" + std::to_string(test::FreePort());
  const std::string config = dir_.Sub("prometheus.yml");
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: kvengine\n    static_configs:\n"
                        << "      - targets: ['" << metrics_ << "']\n";
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string log = dir_.Sub("prometheus.log");
    freopen(log.c_str(), "w", stderr);
    freopen(log.c_str(), "a", stdout);
    execlp("prometheus", "prometheus", ("--config.file=" + config).c_str(),
           ("--storage.tsdb.path=" + dir_.Sub("tsdb")).c_str(),
           ("--web.listen-address=" + web).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  // The query API's answer, once a scrape has landed: {"status":"success",...,"value":[t,"5"]}.
  std::string body;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  const std::regex value(R"re("value":\[[0-9.]+,"([0-9.e+]+)"\])re");
  std::smatch m;
  bool found = false;
  while (!found && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    httplib::Client api("http://" + web);
    auto res = api.Get("/api/v1/query?query=kvengine_tier_hits_total%7Btier%3D%22memory%22%7D");
    if (!res || res->status != 200) continue;
    body = res->body;
    found = std::regex_search(body, m, value);
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  ASSERT_TRUE(found) << "no answer from Prometheus in 60 s: " << body;
  EXPECT_EQ(m[1].str(), "5") << body;
  EXPECT_NE(body.find("\"job\":\"kvengine\""), std::string::npos) << body;
}

// ---------------------------------------------------------------- the Grafana dashboard

// Every family a process can export: an owner with an SSD tier, a local socket and every
// perf key's layer timed, and an attached client.
std::set<std::string> ExportedFamilies(const test::TempDir& dir, const Options& base) {
  Options o = base;
  o.perf_level = PerfLevel::kAll;
  o.ssd_capacity_bytes = 64 << 20;
  o.local_listen = dir.Sub("f.sock");
  o.listen = "127.0.0.1:0";  // a ClusterDB: the cluster member gauges
  std::unique_ptr<DB> owner, client;
  EXPECT_TRUE(DB::Open(o, dir.Sub("families"), &owner).ok());
  Options c = base;
  EXPECT_TRUE(DB::Attach(c, o.local_listen, &client).ok());
  EXPECT_TRUE(owner->Put(WriteOptions(), "k", "v").ok());
  // With a namespace, the per-namespace families.
  std::unique_ptr<DB> tenant;
  EXPECT_TRUE(owner->CreateNamespace("tenant", NamespaceOptions(), &tenant).ok());
  EXPECT_TRUE(tenant->Put(WriteOptions(), "k", "v").ok());
  std::set<std::string> families;
  for (DB* db : {owner.get(), client.get()}) {
    const Answer a = Fetch(MetricsAddress(db), "/metrics");
    EXPECT_EQ(a.status, 200);
    for (const auto& [name, type] : Families(a.body)) families.insert(name);
  }
  return families;
}

TEST_F(MetricsTest, TheGrafanaDashboardCoversEveryFamilyAndNamesOnlyExportedOnes) {
  std::ifstream in(std::string(KV_SOURCE_DIR) + "/docs/grafana/kvengine.json");
  ASSERT_TRUE(in) << "docs/grafana/kvengine.json";
  const std::string dashboard((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
  const std::set<std::string> exported = ExportedFamilies(dir_, BaseOptions());
  ASSERT_GT(exported.size(), 20u);
  // The family of a series name: histograms' and summaries' _bucket, _sum, _count.
  auto family_of = [&](std::string name) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string f = name.substr(0, name.size() - std::strlen(suffix));
      if (name.ends_with(suffix) && exported.count(f)) return f;
    }
    return name;
  };
  std::set<std::string> charted;
  const std::regex expr(R"re("expr"\s*:\s*"((?:[^"\\]|\\.)*)")re");
  const std::regex series(R"(kvengine_[a-z_]+)");
  int panels_with_queries = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), expr);
       it != std::sregex_iterator(); ++it) {
    panels_with_queries++;
    const std::string q = (*it)[1].str();
    bool names_one = false;
    for (auto s = std::sregex_iterator(q.begin(), q.end(), series); s != std::sregex_iterator();
         ++s) {
      const std::string f = family_of(s->str());
      EXPECT_TRUE(exported.count(f))
          << "the query " << q << " names " << s->str() << ", which the endpoint does not export";
      charted.insert(f);
      names_one = true;
    }
    EXPECT_TRUE(names_one) << "a query that names no kvengine family: " << q;
  }
  EXPECT_GT(panels_with_queries, 10);
  for (const std::string& f : exported) {
    EXPECT_TRUE(charted.count(f)) << "no panel of docs/grafana/kvengine.json charts " << f;
  }
}

// ---------------------------------------------------------------- why reads failed

double Prom(DB* db, const std::string& sample) {
  std::string text;
  EXPECT_TRUE(db->GetProperty("kvengine.stats.prometheus", &text));
  return SampleValue(text, sample);
}

std::string Failures(const char* tier, const char* reason) {
  return std::string("kvengine_read_failures_total{tier=\"") + tier + "\",reason=\"" + reason +
         "\"}";
}

// Reads `key` once with Get and once with GetInto; each must fail as `failed` says.
void GetAndGetInto(DB* db, const std::string& key, bool (Status::*failed)() const) {
  std::string value;
  Status s = db->Get(ReadOptions(), key, &value);
  EXPECT_TRUE((s.*failed)()) << "Get: " << s.ToString();
  std::vector<char> buffer(2 << 20);
  size_t size = 0;
  s = db->GetInto(ReadOptions(), key, MutableSlice(buffer.data(), buffer.size()), &size);
  EXPECT_TRUE((s.*failed)()) << "GetInto: " << s.ToString();
}

// A peer's GETs of values in memory are counted once each: those the server's poller
// answers alone (every key in memory), and those it gives up on (a key missing) and a
// worker answers after pinning them again.
TEST_F(MetricsTest, APeerServersGetsFromMemoryAreCountedOnceEach) {
  Options o = BaseOptions();
  o.metrics_listen.clear();
  const uint16_t port = test::FreePort();
  o.listen = "127.0.0.1:" + std::to_string(port);
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  for (int i = 0; i < 8; i++)
    ASSERT_TRUE(db->Put(WriteOptions(), "k" + std::to_string(i), std::string(100, 'v')).ok());
  auto client = NewClient();
  const Endpoint peer{"127.0.0.1", port};
  auto get = [&](std::vector<std::string> keys, int found) {
    // Time for the worker that answered the last request to leave the connection to
    // the poller: a request arriving while the worker still reads is the worker's.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<Slice> slices(keys.begin(), keys.end());
    std::vector<std::string> values;
    std::vector<int64_t> r;
    ASSERT_TRUE(client->BatchGetOwned(peer, slices, &values, &r).ok());
    EXPECT_EQ(std::count(r.begin(), r.end(), 100), found);
  };
  get({"k0", "k1", "k2", "k3", "k4"}, 5);  // the poller's
  get({"k5", "k6", "missing"}, 2);         // the poller's attempt, then a worker's
  get({"k7", "k7"}, 2);                    // one value, read once
  EXPECT_EQ(Prom(db.get(), "kvengine_tier_hits_total{tier=\"memory\"}"), 8);
  EXPECT_EQ(Prom(db.get(), "kvengine_tier_read_bytes_total{tier=\"memory\"}"), 800);
  EXPECT_EQ(Prom(db.get(), "kvengine_gets_total"), 8);
}

TEST_F(MetricsTest, AReadOfAKeyEvictedToMakeRoomIsToldFromAbsent) {
  Options o = BaseOptions();
  o.metrics_listen.clear();
  o.memory_capacity_bytes = 4 << 20;
  o.memory_slab_size = 1 << 20;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  const std::string value(256 << 10, 'v');
  for (int i = 0; i < 40; i++)
    ASSERT_TRUE(db->Put(WriteOptions(), "k" + std::to_string(i), value).ok());
  std::string got;
  GetAndGetInto(db.get(), "k0", &Status::IsNotFound);  // evicted: the oldest
  GetAndGetInto(db.get(), "never", &Status::IsNotFound);
  EXPECT_EQ(Prom(db.get(), Failures("memory", "evicted")), 2);
  EXPECT_EQ(Prom(db.get(), Failures("memory", "absent")), 2);
  EXPECT_GT(Prom(db.get(), "kvengine_tier_evictions_total{tier=\"memory\",reason=\"capacity\"}"),
            0);
  // A delete forgets the eviction: the key is absent now.
  EXPECT_TRUE(db->Delete(WriteOptions(), "k0").IsNotFound());
  ASSERT_TRUE(db->Get(ReadOptions(), "k0", &got).IsNotFound());
  EXPECT_EQ(Prom(db.get(), Failures("memory", "absent")), 3);
}

// With an SSD tier the SSD tier answers last: a key its bucket eviction dropped is
// "evicted" there, for Get and GetInto alike.
TEST_F(MetricsTest, ASingleKeyReadOfAKeyTheSsdTierEvictedIsToldFromAbsent) {
  Options o = BaseOptions();
  o.metrics_listen.clear();
  o.memory_capacity_bytes = 1 << 20;
  o.memory_slab_size = 64 << 10;
  o.ssd_capacity_bytes = 2 << 20;
  o.ssd_eviction = SsdEviction::kFifo;
  o.bucket_keys_limit = 4;
  o.bucket_size_limit = 1 << 20;
  o.gc_interval_ms = 0;
  o.promote_on_read = false;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  for (int i = 0; i < 64; i++)
    ASSERT_TRUE(db->Put(WriteOptions(), "k" + std::to_string(i), std::string(64 << 10, 'v')).ok());
  const Status flushed = db->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed.ToString();
  GetAndGetInto(db.get(), "k0", &Status::IsNotFound);  // the oldest bucket's: dropped
  GetAndGetInto(db.get(), "never", &Status::IsNotFound);
  EXPECT_EQ(Prom(db.get(), Failures("ssd", "evicted")), 2);
  EXPECT_EQ(Prom(db.get(), Failures("ssd", "absent")), 2);
  EXPECT_EQ(Prom(db.get(), Failures("memory", "absent")), 0);
}

// Options of a DB whose value "key" (1 MiB) StoreKeyOnSsd writes to its SSD tier.
Options SsdOptions(Options o) {
  o.metrics_listen.clear();
  o.ssd_capacity_bytes = 64 << 20;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  o.use_direct_io = false;
  return o;
}

// Stores "key" on SSD, and closes the DB: opened again, "key" is on SSD only.
void StoreKeyOnSsd(const Options& o, const std::string& path) {
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, path, &db).ok());
  ASSERT_TRUE(db->Put(WriteOptions(), "key", std::string(1 << 20, 'x')).ok());
  ASSERT_TRUE(db->Flush().ok());
}

TEST_F(MetricsTest, AValueWhoseBytesFailTheirChecksumIsCountedUnreadableNotAbsent) {
  const Options o = SsdOptions(BaseOptions());
  StoreKeyOnSsd(o, dir_.path());
  // One byte in the middle of the value, in its bucket file.
  bool corrupted = false;
  for (const auto& f : std::filesystem::directory_iterator(dir_.path())) {
    if (f.path().extension() != ".kvb") continue;
    std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(f.file_size() / 2));
    file.put('Y');
    corrupted = true;
  }
  ASSERT_TRUE(corrupted);
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  GetAndGetInto(db.get(), "key", &Status::IsCorruption);
  EXPECT_EQ(Prom(db.get(), Failures("ssd", "checksum_mismatch")), 2);
  EXPECT_EQ(Prom(db.get(), Failures("ssd", "absent")), 0);
}

TEST_F(MetricsTest, AValueWhoseReadFailsOnDiskIsCountedIoErrorNotAbsent) {
  Options o = SsdOptions(BaseOptions());
  o.use_io_uring = false;  // reads through the Env, where the fault is
  StoreKeyOnSsd(o, dir_.path());
  FaultInjectionEnv env(Env::Default());
  o.env = &env;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  std::string value;
  env.FailAfter(FaultInjectionEnv::Op::kRead, 1);
  Status s = db->Get(ReadOptions(), "key", &value);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  std::vector<char> buffer(2 << 20);
  size_t size = 0;
  env.FailAfter(FaultInjectionEnv::Op::kRead, 1);
  s = db->GetInto(ReadOptions(), "key", MutableSlice(buffer.data(), buffer.size()), &size);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_EQ(env.injected_failures(), 2);
  EXPECT_EQ(Prom(db.get(), Failures("ssd", "io_error")), 2);
  EXPECT_EQ(Prom(db.get(), Failures("ssd", "absent")), 0);
  ASSERT_TRUE(db->Get(ReadOptions(), "key", &value).ok());  // the fault was once
}

// A single-key read-through (Get, GetInto) to a peer that is down, or that takes the
// connection and never answers, counts peer_down or timeout on the peer tier, not
// absent (the read still answers NotFound: the key may be absent).  A fresh DB for each
// read: a transport backs off a peer that failed, and says so ("unavailable").
TEST_F(MetricsTest, ASingleKeyReadThroughToAPeerDownOrSilentCountsWhy) {
  const int silent = socket(AF_INET, SOCK_STREAM, 0);  // listens, never accepts
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(silent, 16), 0);
  socklen_t len = sizeof(a);
  getsockname(silent, reinterpret_cast<sockaddr*>(&a), &len);
  struct Case {
    std::string peer;
    const char* reason;
  };
  const Case cases[] = {{"127.0.0.1:" + std::to_string(test::FreePort()), "peer_down"},
                        {"127.0.0.1:" + std::to_string(ntohs(a.sin_port)), "timeout"}};
  for (const Case& c : cases) {
    for (bool into : {false, true}) {
      SCOPED_TRACE(std::string(c.reason) + (into ? " GetInto" : " Get"));
      Options o = BaseOptions();
      o.metrics_listen.clear();
      o.peers = c.peer;
      o.peer_timeout_ms = 300;
      std::unique_ptr<DB> db;
      ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
      std::string value;
      std::vector<char> buffer(64);
      size_t size = 0;
      const Status s =
          into ? db->GetInto(ReadOptions(), "k", MutableSlice(buffer.data(), buffer.size()), &size)
               : db->Get(ReadOptions(), "k", &value);
      EXPECT_TRUE(s.IsNotFound()) << s.ToString();
      EXPECT_EQ(Prom(db.get(), Failures("peer", c.reason)), 1);
      EXPECT_EQ(Prom(db.get(), Failures("peer", "absent")), 0);
      db.reset();
      std::filesystem::remove_all(dir_.path());
    }
  }
  close(silent);
}

TEST_F(MetricsTest, AReadThroughToAPeerThatIsDownIsCountedPeerDown) {
  Options o = BaseOptions();
  o.metrics_listen.clear();
  o.peers = "127.0.0.1:" + std::to_string(test::FreePort());  // nobody listens there
  o.peer_timeout_ms = 500;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir_.path(), &db).ok());
  const std::vector<std::string> keys = {"a", "b"};
  std::vector<Slice> slices(keys.begin(), keys.end());
  std::vector<char> buf(16);
  std::vector<Destination> dests = {{MutableSlice(buf.data(), 8)},
                                    {MutableSlice(buf.data() + 8, 8)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db->BatchGetInto(ReadOptions(), slices, dests, &results).ok());
  EXPECT_EQ(results[0], Status::NotFound("").ErrorCode());
  EXPECT_EQ(Prom(db.get(), "kvengine_read_failures_total{tier=\"peer\",reason=\"peer_down\"}"), 2);
  EXPECT_EQ(Prom(db.get(), "kvengine_read_failures_total{tier=\"peer\",reason=\"absent\"}"), 0);
}

}  // namespace
}  // namespace kvengine
