// Peers over real sockets between real processes on 127.0.0.1: kv_server is forked and
// exec'd from the build tree; this process is the client (a Transport, or a DB with
// `peers`).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kvengine/db.h"
#include "kvengine/transport.h"
#include "test/test_util.h"
#include "transport/rdma.h"
#include "transport/wire.h"

namespace kvengine {
namespace {

using Clock = std::chrono::steady_clock;

// ThreadSanitizer slows sockets and threads ~10x: smaller loads keep its run short.
#if defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("KV_TEST_TMPDIR");
  std::string dir =
      std::string(base ? base : "/tmp") + "/peer_test_" + name + "_" + std::to_string(getpid());
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

// A kv_server child process.
class Server {
 public:
  Server(std::string db, uint16_t port, std::vector<std::string> extra = {})
      : db_(std::move(db)), port_(port), extra_(std::move(extra)) {}
  ~Server() { Kill(SIGKILL); }

  // Starts it and waits for its "serving" line.  False when it exited instead.
  bool Start() {
    int out[2];
    if (pipe(out) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      std::vector<std::string> args = {KV_SERVER_PATH, "--db=" + db_,
                                       "--listen=127.0.0.1:" + std::to_string(port_),
                                       "--transport=tcp",
                                       "--options=memory_capacity_bytes=64MiB,"
                                       "prefault_memory=false,log_level=error" +
                                           options_};
      for (const auto& e : extra_) args.push_back(e);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    if (line.find("serving") == std::string::npos) {
      Wait(nullptr);
      return false;
    }
    return true;
  }
  void Kill(int sig) {
    if (pid_ > 0) {
      kill(pid_, sig);
      if (sig == SIGKILL || sig == SIGTERM) Wait(nullptr);
    }
  }
  // Waits for exit; stores the exit status.  Returns false if it is still running after 15 s.
  bool Wait(int* status) {
    if (pid_ <= 0) return true;
    for (int i = 0; i < 1500; i++) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        if (status != nullptr) *status = st;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  bool Alive() { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  pid_t pid() const { return pid_; }
  Endpoint endpoint() const { return Endpoint{"127.0.0.1", port_}; }
  std::string address() const { return endpoint().ToString(); }
  void set_options(const std::string& o) { options_ = o; }

 private:
  const std::string db_;
  const uint16_t port_;
  const std::vector<std::string> extra_;
  std::string options_ = ",ssd_capacity_bytes=0";
  pid_t pid_ = -1;
};

std::unique_ptr<Transport> NewClient(const std::string& token = "", uint64_t timeout_ms = 3000) {
  TransportOptions o;
  o.auth_token = token;
  o.timeout_ms = timeout_ms;
  o.log = [](LogLevel, const std::string&) {};
  std::unique_ptr<Transport> t;
  EXPECT_TRUE(Transport::Create("tcp", o, &t).ok());
  return t;
}

std::string RandomValue(std::mt19937_64* rng, size_t size) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t r = (*rng)();
    std::memcpy(&v[i], &r, std::min<size_t>(8, size - i));
  }
  return v;
}

Options ClientOptions(const std::string& peers, PeerMode mode) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 64 << 20;
  o.prefault_memory = false;
  o.ssd_capacity_bytes = 0;
  o.log_level = LogLevel::kOff;
  o.peers = peers;
  o.peer_mode = mode;
  o.peer_timeout_ms = 1000;
  o.peer_transport = PeerTransport::kTcp;
  return o;
}

TEST(PeerTest, PipelinedBatchesBitExactFrom64Threads) {
  Server server(TempDir("pipelined"), FreePort());
  server.set_options(",ssd_capacity_bytes=0,memory_capacity_bytes=512MiB");  // no eviction
  ASSERT_TRUE(server.Start());
  auto client = NewClient("", kSanitized ? 30000 : 3000);
  const Endpoint ep = server.endpoint();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const int kThreads = kSanitized ? 16 : 64;
  const size_t kMaxValue = kSanitized ? 64 << 10 : 300 << 10;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int round = 0; round < 3; round++) {
        // 6 keys, values of 3 parts each (multi-buffer), 1 byte to 300 KiB.
        std::vector<std::string> names, values;
        std::vector<Slice> keys;
        std::vector<ValueParts> parts;
        for (int k = 0; k < 6; k++) {
          names.push_back("t" + std::to_string(t) + "/r" + std::to_string(round) + "/k" +
                          std::to_string(k));
          values.push_back(RandomValue(&rng, 1 + rng() % kMaxValue));
        }
        for (int k = 0; k < 6; k++) {
          keys.push_back(names[k]);
          const std::string& v = values[k];
          const size_t a = v.size() / 3, b = v.size() / 2;
          parts.push_back(
              {Slice(v.data(), a), Slice(v.data() + a, b - a), Slice(v.data() + b, v.size() - b)});
        }
        std::vector<int64_t> results;
        if (!client->BatchPut(ep, keys, parts, &results).ok()) failures++;
        for (int64_t r : results) failures += r != 0;
        // Read back with a missing key mixed in, into two buffers per key.
        names.push_back("t" + std::to_string(t) + "/absent");
        keys.push_back(names.back());
        std::vector<std::vector<char>> first(7, std::vector<char>(100 << 10)),
            second(7, std::vector<char>(250 << 10));
        std::vector<Destination> dests;
        for (int k = 0; k < 7; k++) {
          dests.push_back({MutableSlice(first[k].data(), first[k].size()),
                           MutableSlice(second[k].data(), second[k].size())});
        }
        if (!client->BatchGet(ep, keys, dests, &results).ok()) failures++;
        for (int k = 0; k < 6; k++) {
          if (results[k] != static_cast<int64_t>(values[k].size())) {
            failures++;
            continue;
          }
          std::string got(first[k].begin(), first[k].end());
          got.append(second[k].begin(), second[k].end());
          if (got.substr(0, values[k].size()) != values[k]) failures++;
        }
        if (results[6] != Status::NotFound("").ErrorCode()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<int64_t> results;
  std::vector<Slice> keys = {"t0/r0/k0", "t0/absent"};
  ASSERT_TRUE(client->BatchExists(ep, keys, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{1, 0}));
  ASSERT_TRUE(client->BatchDelete(ep, keys, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{0, -1}));
}

TEST(PeerTest, ReadThroughHitFromPeerWithPromotion) {
  Server server(TempDir("readthrough_srv"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  std::mt19937_64 rng(1);
  const std::string value = RandomValue(&rng, 200 << 10);
  std::vector<Slice> keys = {"shared/prefix"};
  std::vector<ValueParts> parts = {{Slice(value)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchPut(server.endpoint(), keys, parts, &results).ok());

  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(ClientOptions(server.address(), PeerMode::kReadThrough),
                       TempDir("readthrough_cli"), &db)
                  .ok());
  ASSERT_TRUE(db->BatchExists(std::vector<Slice>{"shared/prefix", "nowhere"}, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{1, 0}));
  std::vector<char> buf(256 << 10);
  std::vector<Slice> want = {"shared/prefix", "nowhere"};
  std::vector<Destination> dests = {{MutableSlice(buf.data(), buf.size())},
                                    {MutableSlice(buf.data(), 1)}};
  ASSERT_TRUE(db->BatchGetInto(ReadOptions(), want, dests, &results).ok());
  ASSERT_EQ(results[0], static_cast<int64_t>(value.size()));
  EXPECT_EQ(std::string(buf.data(), value.size()), value);
  EXPECT_EQ(results[1], Status::NotFound("").ErrorCode());
  std::string got;
  ASSERT_TRUE(db->Get(ReadOptions(), "shared/prefix", &got).ok());
  EXPECT_EQ(got, value);
  // Promoted: the peer can go away and the value is still served locally.
  server.Kill(SIGKILL);
  got.clear();
  ASSERT_TRUE(db->Get(ReadOptions(), "shared/prefix", &got).ok());
  EXPECT_EQ(got, value);
  // A miss with the peer gone is still a clean NotFound.
  EXPECT_TRUE(db->Get(ReadOptions(), "nowhere", &got).IsNotFound());
}

TEST(PeerTest, ShardedPlacementStableAndBalanced) {
  Server a(TempDir("shard_a"), FreePort()), b(TempDir("shard_b"), FreePort());
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  const std::string peers = a.address() + "," + b.address();
  std::unique_ptr<DB> writer, reader;
  ASSERT_TRUE(DB::Open(ClientOptions(peers, PeerMode::kSharded), TempDir("shard_w"), &writer).ok());
  // The reader names the members in the other order: placement must not care.
  ASSERT_TRUE(DB::Open(ClientOptions(b.address() + "," + a.address(), PeerMode::kSharded),
                       TempDir("shard_r"), &reader)
                  .ok());
  constexpr int kKeys = 400;
  std::vector<std::string> names, values;
  std::vector<Slice> keys;
  std::vector<ValueParts> parts;
  std::mt19937_64 rng(3);
  for (int i = 0; i < kKeys; i++) {
    names.push_back("model@tp0/layer." + std::to_string(i % 32) + "/" + std::to_string(i));
    values.push_back(RandomValue(&rng, 1024 + i));
  }
  for (int i = 0; i < kKeys; i++) {
    keys.push_back(names[i]);
    parts.push_back({Slice(values[i])});
  }
  std::vector<int64_t> results;
  ASSERT_TRUE(writer->BatchPut(WriteOptions(), keys, parts, &results).ok());
  for (int64_t r : results) ASSERT_EQ(r, 0);
  // Each key lives on exactly one server; the split is balanced.
  auto client = NewClient();
  std::vector<int64_t> on_a, on_b;
  ASSERT_TRUE(client->BatchExists(a.endpoint(), keys, &on_a).ok());
  ASSERT_TRUE(client->BatchExists(b.endpoint(), keys, &on_b).ok());
  int count_a = 0;
  for (int i = 0; i < kKeys; i++) {
    EXPECT_EQ(on_a[i] + on_b[i], 1) << names[i];
    count_a += static_cast<int>(on_a[i]);
  }
  EXPECT_GT(count_a, kKeys * 35 / 100);
  EXPECT_LT(count_a, kKeys * 65 / 100);
  // Another host with the same members finds every key, bit-exact.
  std::vector<std::vector<char>> bufs(kKeys, std::vector<char>(4096));
  std::vector<Destination> dests;
  for (auto& buf : bufs) dests.push_back({MutableSlice(buf.data(), buf.size())});
  ASSERT_TRUE(reader->BatchGetInto(ReadOptions(), keys, dests, &results).ok());
  for (int i = 0; i < kKeys; i++) {
    ASSERT_EQ(results[i], static_cast<int64_t>(values[i].size()));
    ASSERT_EQ(std::string(bufs[i].data(), values[i].size()), values[i]);
  }
  std::string got;
  ASSERT_TRUE(reader->Get(ReadOptions(), names[7], &got).ok());
  EXPECT_EQ(got, values[7]);
  ASSERT_TRUE(reader->Delete(WriteOptions(), names[7]).ok());
  EXPECT_TRUE(writer->Get(ReadOptions(), names[7], &got).IsNotFound());
}

TEST(PeerTest, DeadOwnerFailsCleanlyThenRecoversAfterRestart) {
  const uint16_t port = FreePort();
  const std::string dir = TempDir("dead_owner");
  auto server = std::make_unique<Server>(dir, port);
  ASSERT_TRUE(server->Start());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(
      DB::Open(ClientOptions(server->address(), PeerMode::kSharded), TempDir("dead_cli"), &db)
          .ok());
  const std::string value(64 << 10, 'v');
  ASSERT_TRUE(db->Put(WriteOptions(), "k", value).ok());
  server->Kill(SIGKILL);
  std::vector<char> buf(value.size());
  std::vector<Slice> keys = {"k", "k2"};
  std::vector<Destination> dests = {{MutableSlice(buf.data(), buf.size())},
                                    {MutableSlice(buf.data(), buf.size())}};
  std::vector<int64_t> results;
  const auto start = Clock::now();
  ASSERT_TRUE(db->BatchGetInto(ReadOptions(), keys, dests, &results).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(results[0], Status::IOError("").ErrorCode());
  EXPECT_EQ(results[1], Status::IOError("").ErrorCode());
  std::string got;
  Status s = db->Get(ReadOptions(), "k", &got);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.message().find(server->address()), std::string::npos) << s.ToString();
  printf("dead owner: %s\n", s.ToString().c_str());

  server = std::make_unique<Server>(dir, port);
  ASSERT_TRUE(server->Start());
  // Reconnect with backoff: within a few seconds the peer serves again.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!(s = db->Put(WriteOptions(), "k", value)).ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(db->Get(ReadOptions(), "k", &got).ok());
  EXPECT_EQ(got, value);
}

// True once /proc says every thread of pid is stopped (state T), within a few seconds.
bool WaitUntilStopped(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (int i = 0; i < 500; i++) {
    bool all = true;
    for (const auto& task : std::filesystem::directory_iterator(tasks)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');
      if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'T') {
        all = false;
      }
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(PeerTest, StoppedPeerTimesOutInsteadOfHanging) {
  Server server(TempDir("stopped"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient("", 500);
  std::vector<Slice> keys = {"a"};
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchExists(server.endpoint(), keys, &results).ok());
  kill(server.pid(), SIGSTOP);
  // kill() returns before the process has stopped; on a loaded machine its threads may
  // still answer a request or two.  Wait until the kernel reports it stopped.
  ASSERT_TRUE(WaitUntilStopped(server.pid()));
  const auto start = Clock::now();
  Status s = client->BatchExists(server.endpoint(), keys, &results);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_EQ(results[0], Status::IOError("").ErrorCode());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  kill(server.pid(), SIGCONT);
}

TEST(PeerTest, AuthTokenAcceptedAndRefused) {
  const std::string dir = TempDir("auth");
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "s3cret-token\n";
  Server server(dir + "/db", FreePort(), {"--auth_token_file=" + token_file});
  ASSERT_TRUE(server.Start());
  std::vector<Slice> keys = {"a"};
  std::vector<int64_t> results;
  EXPECT_TRUE(NewClient("s3cret-token")->BatchExists(server.endpoint(), keys, &results).ok());
  Status wrong = NewClient("guess")->BatchExists(server.endpoint(), keys, &results);
  EXPECT_FALSE(wrong.ok());
  EXPECT_NE(wrong.ToString().find("refused"), std::string::npos) << wrong.ToString();
  Status none = NewClient("")->BatchExists(server.endpoint(), keys, &results);
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.ToString().find("token"), std::string::npos) << none.ToString();
  // A DB configured with the token file reaches it.
  Options o = ClientOptions(server.address(), PeerMode::kSharded);
  o.peer_auth_token_file = token_file;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir + "/cli", &db).ok());
  ASSERT_TRUE(db->Put(WriteOptions(), "x", "y").ok());
  // Listening beyond loopback without a token is refused at start.
  Server wide(dir + "/db3", 0, {"--listen=0.0.0.0:" + std::to_string(FreePort())});
  EXPECT_FALSE(wide.Start());
}

TEST(PeerTest, MalformedFramesCloseOnlyThatConnection) {
  Server server(TempDir("fuzz"), FreePort());
  ASSERT_TRUE(server.Start());
  auto good = NewClient();
  std::vector<Slice> keys = {"k"};
  std::vector<ValueParts> parts = {{Slice("value")}};
  std::vector<int64_t> results;
  ASSERT_TRUE(good->BatchPut(server.endpoint(), keys, parts, &results).ok());
  std::mt19937_64 rng(11);
  for (int round = 0; round < 60; round++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(server.endpoint().port);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    std::string junk;
    if (round % 3 == 0) {
      junk = RandomValue(&rng, 1 + rng() % 4096);  // pure noise
    } else {
      // A plausible header with lies in it: huge or truncated lengths, bad checksum.
      wire::FrameHeader h;
      h.op = static_cast<uint8_t>(1 + rng() % 10);
      h.request_id = rng();
      h.meta_len = static_cast<uint32_t>(rng() % 64);
      h.body_len = round % 3 == 1 ? (rng() % 2 ? 1ull << 40 : 0) : rng() % 100;
      h.checksum = rng();
      char hdr[wire::kHeaderSize];
      h.EncodeTo(hdr);
      junk.assign(hdr, sizeof(hdr));
      junk += RandomValue(&rng, rng() % 80);
    }
    [[maybe_unused]] ssize_t n = send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    close(fd);
    if (round % 20 == 19) {
      ASSERT_TRUE(good->BatchExists(server.endpoint(), keys, &results).ok());
      EXPECT_EQ(results[0], 1);
    }
  }
  EXPECT_TRUE(server.Alive());
  std::vector<char> buf(16);
  std::vector<Destination> dests = {{MutableSlice(buf.data(), buf.size())}};
  ASSERT_TRUE(NewClient()->BatchGet(server.endpoint(), keys, dests, &results).ok());
  EXPECT_EQ(std::string(buf.data(), 5), "value");
}

TEST(PeerTest, SigtermDrainsFlushesAndExitsZero) {
  const uint16_t port = FreePort();
  const std::string dir = TempDir("sigterm");
  auto server = std::make_unique<Server>(dir, port);
  // No SSD eviction: a fast machine writes more than 256 MiB in the 300 ms below, and LRU
  // eviction would then rightly drop acknowledged values (a cache may).  Without it a
  // put is acknowledged only once its value has a place on SSD.
  server->set_options(
      ",ssd_capacity_bytes=256MiB,offload_policy=write_through,use_direct_io=false,"
      "disable_ssd_eviction=true");
  ASSERT_TRUE(server->Start());
  auto client = NewClient();
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> acked;
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; t++) {
    writers.emplace_back([&, t] {
      const std::string value(32 << 10, static_cast<char>('a' + t));
      for (int i = 0; !stop.load(); i++) {
        const std::string key = "w" + std::to_string(t) + "/" + std::to_string(i);
        std::vector<Slice> keys = {key};
        std::vector<ValueParts> parts = {{Slice(value)}};
        std::vector<int64_t> results;
        if (client->BatchPut(server->endpoint(), keys, parts, &results).ok() && results[0] == 0) {
          std::lock_guard<std::mutex> lock(mu);
          acked.push_back(key);
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(server->pid(), SIGTERM);
  int status = 0;
  ASSERT_TRUE(server->Wait(&status));
  stop.store(true);
  for (auto& w : writers) w.join();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_FALSE(acked.empty());
  // Every put the server acknowledged survived the shutdown.
  server = std::make_unique<Server>(dir, port);
  server->set_options(
      ",ssd_capacity_bytes=256MiB,offload_policy=write_through,use_direct_io=false,"
      "disable_ssd_eviction=true");
  ASSERT_TRUE(server->Start());
  auto reader = NewClient();
  std::vector<Slice> keys(acked.begin(), acked.end());
  std::vector<int64_t> results;
  ASSERT_TRUE(reader->BatchExists(server->endpoint(), keys, &results).ok());
  for (size_t i = 0; i < keys.size(); i++) EXPECT_EQ(results[i], 1) << acked[i];
}

TEST(PeerTest, StatsOnRequest) {
  Server server(TempDir("stats"), FreePort());
  ASSERT_TRUE(server.Start());
  std::string text;
  ASSERT_TRUE(NewClient()->GetProperty(server.endpoint(), "kvengine.stats", &text).ok());
  EXPECT_NE(text.find("memory.items"), std::string::npos);
  EXPECT_TRUE(NewClient()->GetProperty(server.endpoint(), "no.such", &text).IsNotFound());
  const std::string cmd =
      std::string(KV_SERVER_PATH) + " --stats=" + server.address() + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(PeerTest, RdmaLive) {
  std::string why;
  if (!RdmaAvailable(&why)) GTEST_SKIP() << "no RDMA device: " << why;
  Server server(TempDir("rdma"), FreePort(), {"--transport=rdma"});
  ASSERT_TRUE(server.Start());
  std::unique_ptr<Transport> t;
  ASSERT_TRUE(Transport::Create("rdma", TransportOptions(), &t).ok());
  std::vector<char> buf(1 << 20);
  ASSERT_TRUE(t->RegisterMemory(buf.data(), buf.size(), "user buffer").ok());
  std::vector<Slice> keys = {"r"};
  const std::string value(300 << 10, 'r');
  std::vector<ValueParts> parts = {{Slice(value)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(t->BatchPut(server.endpoint(), keys, parts, &results).ok());
  std::vector<Destination> dests = {{MutableSlice(buf.data(), buf.size())}};
  ASSERT_TRUE(t->BatchGet(server.endpoint(), keys, dests, &results).ok());
  ASSERT_EQ(results[0], static_cast<int64_t>(value.size()));
  EXPECT_EQ(std::string(buf.data(), value.size()), value);
}

}  // namespace
}  // namespace kvengine
