// The descriptor budget (env/descriptor_budget.h): a process with a low RLIMIT_NOFILE
// opens, reads and writes a DB of thousands of bucket files with the default
// max_open_files, and no call fails with EMFILE; an owner serving attached processes and
// a kv_server serving peers refuse the connections past their share with Busy, and the
// ones they admit see no failure.  Each case runs in a child process (EXPECT_EXIT, or
// the kv_server) that lowers its own limit; a failure prints what failed and exits 1.
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"
#ifdef KV_SERVER_PATH
#include "test/peer_harness.h"
#endif

namespace kvengine {
namespace {

constexpr int kKeys = 2000;  // one bucket each

[[noreturn]] void Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void LowerLimit(rlim_t limit) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = std::min<rlim_t>(limit, rl.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) Fail("setrlimit", Status::IOError("failed"));
}

// Of this process (less the directory's own), or of process `pid`.
uint64_t OpenDescriptors(pid_t pid = 0) {
  uint64_t n = 0;
  DIR* d = opendir(pid == 0 ? "/proc/self/fd" : ("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return ~0ull;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return pid == 0 ? n - 1 : n;
}

// Every put in a bucket of its own, the default max_open_files (1000), an owner's socket.
Options ManyBuckets(const std::string& dir) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 1 << 20;
  o.memory_slab_size = 64 << 10;
  o.prefault_memory = false;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  o.bucket_keys_limit = 1;
  o.gc_interval_ms = 0;
  o.promote_on_read = false;
  o.local_listen = dir + "/kv.sock";
  return o;
}

std::string Key(int i) { return "k" + std::to_string(i); }
std::string Value(int i) { return test::MakeValue(i, 600 + i % 700); }

// The budget holds: the cache within its clamped size, the process under its limit.
void CheckBudget(DB* db, rlim_t limit, const std::string& when) {
  const uint64_t open = test::StatOf(db, "ssd.open_files");
  const uint64_t max = test::StatOf(db, "ssd.max_open_files");
  if (max == 0 || max >= 1000 || open > max) {
    Fail(when + ": ssd.open_files " + std::to_string(open) + ", ssd.max_open_files " +
             std::to_string(max),
         Status::InvalidArgument("not within the budget"));
  }
  if (test::StatOf(db, "ssd.descriptor_limit") != limit) {
    Fail(when + ": ssd.descriptor_limit", Status::InvalidArgument("not the process's limit"));
  }
  if (OpenDescriptors() >= limit - 8) {
    Fail(when + ": " + std::to_string(OpenDescriptors()) + " descriptors open",
         Status::InvalidArgument("no headroom left"));
  }
}

void ReadAll(DB* db, int keys, const std::string& when) {
  for (int i = 0; i < keys; i++) {
    std::string got;
    Status s = db->Get(ReadOptions(), Key(i), &got);
    if (!s.ok() || got != Value(i)) Fail(when + ": get " + Key(i), s);
  }
}

// Under `limit`: writes keys [from, to) (one bucket each), reads every key, attaches
// four clients that read through the owner, reopens (through the map checkpoint, then
// with every bucket read), and reads every key again.
[[noreturn]] void UnderALimit(const std::string& dir, rlim_t limit, int from, int to) {
  LowerLimit(limit);
  const Options o = ManyBuckets(dir);
  std::unique_ptr<DB> db;
  Status s = DB::Open(o, dir, &db);
  if (!s.ok()) Fail("open", s);
  ReadAll(db.get(), from, "after open");
  for (int i = from; i < to; i++) {
    s = db->Put(WriteOptions(), Key(i), Value(i));
    if (!s.ok()) Fail("put " + Key(i), s);
  }
  s = db->Flush();
  if (!s.ok()) Fail("flush", s);
  ReadAll(db.get(), to, "after puts");
  CheckBudget(db.get(), limit, "after puts");
  {
    Options client;
    client.apply_environment = false;
    // Four attach; those past the owner's share of connections (one under 64: each
    // costs it two descriptors) are refused with Busy.
    std::vector<std::unique_ptr<DB>> clients;
    for (int i = 0; i < 4; i++) {
      std::unique_ptr<DB> c;
      s = DB::Attach(client, o.local_listen, &c);
      if (s.ok()) {
        clients.push_back(std::move(c));
      } else if (!s.IsBusy() || clients.empty()) {
        Fail("attach", s);
      }
    }
    for (int i = 0; i < to; i += 7) {
      std::string got;
      s = clients[i % clients.size()]->Get(ReadOptions(), Key(i), &got);
      if (!s.ok() || got != Value(i)) Fail("attached get " + Key(i), s);
    }
    CheckBudget(db.get(), limit, "with attached clients");
  }
  for (bool checkpoint : {true, false}) {
    s = db->Close();
    if (!s.ok()) Fail("close", s);
    db.reset();
    if (!checkpoint) std::filesystem::remove(dir + "/SSDMAP");
    s = DB::Open(o, dir, &db);
    if (!s.ok()) Fail(checkpoint ? "reopen" : "reopen reading every bucket", s);
    ReadAll(db.get(), to, "after reopen");
    CheckBudget(db.get(), limit, "after reopen");
  }
  s = db->Close();
  if (!s.ok()) Fail("final close", s);
  std::_Exit(0);
}

// ---------------------------------------------------------------- attached clients
// An attaching process: waits for its go (a byte on `go`), attaches, reports
// "A <i>" (admitted) or "R <i> <status>" (refused) on `report`, then, admitted, puts
// and reads keys of its own and reads the owner's, reports "D <i>" or "F <i> <what>",
// and holds its connection until its go pipe closes.
[[noreturn]] void AttachingClient(int i, const std::string& path, int go, int report) {
  auto say = [&](const std::string& line) {
    const std::string l = line + "\n";  // one write, under PIPE_BUF: never interleaved
    if (write(report, l.data(), l.size()) != static_cast<ssize_t>(l.size())) std::_Exit(2);
  };
  char c;
  if (read(go, &c, 1) != 1) std::_Exit(0);
  Options o;
  o.apply_environment = false;
  std::unique_ptr<DB> db;
  Status s = DB::Attach(o, path, &db);
  if (!s.ok()) {
    say("R " + std::to_string(i) + " " + s.ToString());
    std::_Exit(0);
  }
  say("A " + std::to_string(i));
  std::string failure;
  for (int j = 0; j < 20 && failure.empty(); j++) {
    const std::string key = "c" + std::to_string(i) + "-" + std::to_string(j);
    std::string got;
    s = db->Put(WriteOptions(), key, Value(j));
    if (s.ok()) s = db->Get(ReadOptions(), key, &got);
    if (s.ok() && got != Value(j)) s = Status::Corruption("wrong bytes");
    if (s.ok()) s = db->Get(ReadOptions(), Key(j), &got);
    if (s.ok() && got != Value(j)) s = Status::Corruption("wrong bytes of the owner's key");
    if (!s.ok()) failure = key + ": " + s.ToString();
  }
  say((failure.empty() ? "D " : "F ") + std::to_string(i) + " " + failure);
  read(go, &c, 1);  // until the owner closes it
  db.reset();
  std::_Exit(0);
}

std::vector<std::string> ReadLines(int fd, size_t n) {
  std::vector<std::string> lines;
  std::string line;
  char c;
  while (lines.size() < n && read(fd, &c, 1) == 1) {
    if (c != '\n') {
      line += c;
    } else {
      lines.push_back(line);
      line.clear();
    }
  }
  return lines;
}

// Under `limit`: an owner with `clients` processes attaching at once, more than its
// share of connections.  Those past the share are refused with Busy, naming the budget;
// the admitted ones put and read with no failure; nobody sees EMFILE; the owner's
// descriptors stay within its budget, and a connection is admitted again once others
// closed.
[[noreturn]] void OwnerUnderALimit(const std::string& dir, rlim_t limit, int clients) {
  LowerLimit(limit);
  Options o = ManyBuckets(dir);
  // Forked before the DB starts a thread; each waits for its go.
  int report[2];
  if (pipe(report) != 0) Fail("pipe", Status::IOError("failed"));
  std::vector<int> go;
  std::vector<pid_t> pids;
  for (int i = 0; i < clients; i++) {
    int p[2];
    if (pipe(p) != 0) Fail("pipe", Status::IOError("failed"));
    const pid_t pid = fork();
    if (pid == 0) {
      for (int fd : go) close(fd);
      close(p[1]);
      close(report[0]);
      AttachingClient(i, o.local_listen, p[0], report[1]);
    }
    close(p[0]);
    go.push_back(p[1]);
    pids.push_back(pid);
  }
  close(report[1]);
  std::unique_ptr<DB> db;
  Status s = DB::Open(o, dir, &db);
  if (!s.ok()) Fail("open", s);
  for (int i = 0; i < 20; i++) {
    s = db->Put(WriteOptions(), Key(i), Value(i));
    if (!s.ok()) Fail("put " + Key(i), s);
  }
  for (int fd : go) {
    if (write(fd, "g", 1) != 1) Fail("go", Status::IOError("failed"));
  }
  // Each client says A (admitted) or R (refused), and an admitted one D (done) or F
  // (failed) after its calls: an early one's D may come before a later one's A or R.
  int admitted = 0, refused = 0, done = 0;
  while (admitted + refused < clients || done < admitted) {
    const std::vector<std::string> lines = ReadLines(report[0], 1);
    if (lines.empty()) Fail("reports", Status::IOError("a client went away unheard"));
    const std::string& line = lines[0];
    if (line[0] == 'A') {
      admitted++;
    } else if (line[0] == 'D') {
      done++;
    } else if (line[0] == 'F') {
      Fail("admitted client: " + line, Status::IOError("failed"));
    } else if (line.find("Busy") == std::string::npos ||
               line.find("descriptor budget") == std::string::npos ||
               line.find("ulimit -n") == std::string::npos) {
      Fail("attach: " + line, Status::InvalidArgument("not the budget's refusal"));
    } else {
      refused++;
    }
  }
  if (admitted == 0 || refused == 0) {
    Fail(std::to_string(admitted) + " admitted, " + std::to_string(refused) + " refused of " +
             std::to_string(clients),
         Status::InvalidArgument("the share did not hold"));
  }
  CheckBudget(db.get(), limit, "with attached clients");
  if (test::StatOf(db.get(), "local.clients_over_budget") != static_cast<uint64_t>(refused)) {
    Fail("local.clients_over_budget", Status::InvalidArgument("not the refusals counted"));
  }
  for (int fd : go) close(fd);  // the admitted ones detach and exit
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      Fail("client process " + std::to_string(pid), Status::IOError("did not exit cleanly"));
    }
  }
  close(report[0]);
  // Their connections closed: one more is admitted once the owner's threads saw them
  // end (they wake within 100 ms).
  Options client;
  client.apply_environment = false;
  std::unique_ptr<DB> again;
  for (int attempt = 0; attempt < 50; attempt++) {
    s = DB::Attach(client, o.local_listen, &again);
    if (!s.IsBusy()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!s.ok()) Fail("attach after the others left", s);
  std::string got;
  s = again->Get(ReadOptions(), Key(3), &got);
  if (!s.ok() || got != Value(3)) Fail("get after the others left", s);
  again.reset();
  s = db->Close();
  if (!s.ok()) Fail("close", s);
  std::_Exit(0);
}

TEST(DescriptorBudgetTest, AnOwnerRefusesAttachedClientsPastItsShare) {
  for (const auto& [limit, clients] : {std::pair<rlim_t, int>{64, 8}, {256, 48}}) {
    test::TempDir dir;
    std::filesystem::create_directories(dir.path());
    EXPECT_EXIT(OwnerUnderALimit(dir.path(), limit, clients), ::testing::ExitedWithCode(0), "")
        << "RLIMIT_NOFILE " << limit;
  }
}

// An explicit local_max_connections: the connection past it is refused with Busy
// naming the cap; a client whose pool the owner holds to one connection runs calls of
// four threads at once over it, none failing.
TEST(DescriptorBudgetTest, AnExplicitCapOfAttachedConnections) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  Options o = ManyBuckets(dir.path());
  o.local_max_connections = 1;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, dir.path(), &db).ok());
  ASSERT_TRUE(db->Put(WriteOptions(), Key(1), Value(1)).ok());
  Options client;
  client.apply_environment = false;
  std::unique_ptr<DB> first, second;
  ASSERT_TRUE(DB::Attach(client, o.local_listen, &first).ok());
  Status s = DB::Attach(client, o.local_listen, &second);
  EXPECT_TRUE(s.IsBusy()) << s.ToString();
  EXPECT_NE(s.message().find("serves 1 attached connections"), std::string::npos) << s.ToString();
  EXPECT_EQ(test::StatOf(db.get(), "local.clients_over_budget"), 1u);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; i++) {
        std::string got;
        const std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
        Status st = first->Put(WriteOptions(), key, Value(i));
        if (st.ok()) st = first->Get(ReadOptions(), key, &got);
        if (!st.ok() || got != Value(i)) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  first.reset();
  ASSERT_TRUE(db->Close().ok());
}

// ---------------------------------------------------------------- peers
#ifdef KV_SERVER_PATH
// The verdict of a handshake with the server (no token), or IOError when it closed
// the connection without one.
Status Handshake(int fd) {
  const Deadline deadline = DeadlineIn(3000);
  for (uint8_t want : {wire::kChallenge, wire::kAuth}) {
    char header[wire::kHeaderSize];
    std::vector<iovec> iov{{header, sizeof(header)}};
    wire::FrameHeader h;
    Status s = ReadFully(fd, &iov, deadline, nullptr);
    if (s.ok()) s = wire::FrameHeader::DecodeFrom(header, &h);
    if (!s.ok()) return Status::IOError("no answer", s.ToString());
    if (h.op != want) return Status::Corruption("unexpected frame");
    std::string meta(h.meta_len, '\0');
    iov = {{meta.data(), meta.size()}};
    s = ReadFully(fd, &iov, deadline, nullptr);
    if (!s.ok()) return Status::IOError("no answer", s.ToString());
    if (want == wire::kChallenge) {
      s = SendFrame(fd, wire::kAuth, 0, 0, "", {}, deadline);
      if (!s.ok() && !s.IsIOError()) return s;  // one past the cap may be closed already
      continue;
    }
    std::string_view in(meta);
    Status verdict;
    if (!wire::GetBatchStatus(&in, &verdict)) return Status::Corruption("malformed verdict");
    return verdict;
  }
  return Status::OK();
}

// A kv_server under `limit` with `conns` connections at once, more than its share: those
// past it get a Busy verdict naming the budget, the admitted ones are served, a real
// client is told Busy too, and once connections close a new one is served.
// With `options`, exactly `expect_admitted` are admitted (when not 0).
void ServerUnderALimit(rlim_t limit, int conns, const std::string& options = "",
                       size_t expect_admitted = 0) {
  Server server(TempDir("budget" + std::to_string(limit)), FreePort());
  server.set_fd_limit(limit);
  if (!options.empty()) server.set_options(",ssd_capacity_bytes=0," + options);
  ASSERT_TRUE(server.Start());
  std::vector<int> admitted;
  int refused = 0;
  for (int i = 0; i < conns; i++) {
    int fd = -1;
    ASSERT_TRUE(ConnectTcp(server.endpoint(), DeadlineIn(3000), &fd).ok());
    const Status verdict = Handshake(fd);
    if (verdict.ok()) {
      admitted.push_back(fd);
      continue;
    }
    EXPECT_TRUE(verdict.IsBusy()) << verdict.ToString();
    EXPECT_NE(verdict.message().find("descriptor budget"), std::string::npos) << verdict.ToString();
    EXPECT_NE(verdict.message().find("ulimit -n"), std::string::npos) << verdict.ToString();
    refused++;
    close(fd);
  }
  ASSERT_GT(admitted.size(), 0u);
  EXPECT_GT(refused, 0) << admitted.size() << " admitted of " << conns;
  if (expect_admitted != 0) {
    EXPECT_EQ(admitted.size(), expect_admitted);
  }
  // The admitted ones are served.
  for (int fd : admitted) {
    std::string meta;
    const std::vector<Slice> keys = {"k"};
    wire::PutKeys(&meta, keys, nullptr);
    ASSERT_TRUE(SendFrame(fd, wire::kExists, 0, 7, meta, {}, DeadlineIn(3000)).ok());
  }
  for (int fd : admitted) {
    char header[wire::kHeaderSize];
    std::vector<iovec> iov{{header, sizeof(header)}};
    wire::FrameHeader h;
    ASSERT_TRUE(ReadFully(fd, &iov, DeadlineIn(3000), nullptr).ok());
    ASSERT_TRUE(wire::FrameHeader::DecodeFrom(header, &h).ok());
    std::string answer(h.meta_len, '\0');
    iov = {{answer.data(), answer.size()}};
    ASSERT_TRUE(ReadFully(fd, &iov, DeadlineIn(3000), nullptr).ok());
    std::string_view in(answer);
    Status s;
    ASSERT_TRUE(wire::GetBatchStatus(&in, &s));
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // Full, it keeps the headroom its budget leaves to the rest of the process.
  if (limit != 0) {
    EXPECT_LT(OpenDescriptors(server.pid()), limit - 8);
  }
  // A real client while the server is full: Busy, as the server put it.
  auto client = NewClient("", 2000);
  std::vector<Slice> keys = {"k"};
  std::vector<int64_t> results;
  Status s = client->BatchExists(server.endpoint(), keys, &results);
  EXPECT_TRUE(s.IsBusy()) << s.ToString();
  for (int fd : admitted) close(fd);
  // Room again: served, and the refusals counted.
  auto again = NewClient("", 2000);
  bool served = false;
  for (int attempt = 0; attempt < 50 && !served; attempt++) {
    served = again->BatchExists(server.endpoint(), keys, &results).ok();
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(served);
  std::string text;
  ASSERT_TRUE(again->GetProperty(server.endpoint(), "kvengine.peers", &text).ok());
  // (The retries above may have been refused too, before the server saw the others go.)
  const size_t at = text.find("refused_over_budget: ");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GE(std::stoull(text.substr(at + 21)), static_cast<uint64_t>(refused + 1)) << text;
  EXPECT_TRUE(server.Alive());
}

TEST(DescriptorBudgetTest, AKvServerRefusesConnectionsPastItsShare) {
  ServerUnderALimit(64, 16);
  ServerUnderALimit(256, 80);
  // An explicit cap, under the process's own (high) limit.
  ServerUnderALimit(0, 6, "peer_max_connections=3", 3);
}
#endif  // KV_SERVER_PATH

TEST(DescriptorBudgetTest, ThousandsOfBucketsUnderLowLimits) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  // Written under 256, then opened, read and grown under 64 and 256 again.
  EXPECT_EXIT(UnderALimit(dir.path(), 256, 0, kKeys / 2), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(UnderALimit(dir.path(), 64, kKeys / 2, kKeys), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(UnderALimit(dir.path(), 256, kKeys, kKeys + 50), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvengine
