// DB::Attach with real processes: this binary re-executes itself as the attached
// clients (and, for the owner-restart test, as the owner), over a real Unix socket and a
// real memfd arena.  Every test is bounded in time.
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attach/local_server.h"
#include "attach/staging_window.h"
#include "env/gpu_io.h"
#include "env/gpu_staging.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/json_check.h"
#include "test/raw_attach_client.h"
#include "test/test_util.h"
#include "transport/read_validation.h"
#include "transport/socket_util.h"
#include "transport/unix_socket.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/namespace_key.h"

namespace kvengine {
namespace {

using Clock = std::chrono::steady_clock;
using test::RawClient;

Options OwnerOptions(const std::string& socket) { return test::AttachOwnerOptions(socket); }
Options ClientOptions() { return test::AttachClientOptions(); }

// A value that names its key and carries its own checksum: bytes [0, 8) FNV-1a of the
// rest, [8, 16) the key's hash.  A torn, mixed or misdirected read fails ValueIsFor.
uint64_t Fnv(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}
std::string ValueFor(const std::string& key, std::mt19937_64& rng, size_t size) {
  std::string v = test::MakeValue(rng(), size);
  const uint64_t kh = Fnv(key.data(), key.size());
  std::memcpy(v.data() + 8, &kh, 8);
  const uint64_t sum = Fnv(v.data() + 8, size - 8);
  std::memcpy(v.data(), &sum, 8);
  return v;
}
bool ValueIsFor(const std::string& key, const char* v, size_t size) {
  if (size < 16) return false;
  uint64_t sum, kh;
  std::memcpy(&sum, v, 8);
  std::memcpy(&kh, v + 8, 8);
  return sum == Fnv(v + 8, size - 8) && kh == Fnv(key.data(), key.size());
}

uint64_t Stat(DB* db, const std::string& name) {
  std::string text;
  if (!db->GetProperty("kvengine.stats", &text)) return ~0ull;
  const size_t at = text.find("\n" + name + ": ");
  if (at == std::string::npos) return ~0ull;
  return std::stoull(text.substr(at + name.size() + 3));
}

// Waits up to 5 s for db's arena to hold nothing (the owner gives back what a closed
// connection held asynchronously); the bytes still allocated then.
uint64_t AllocatedOnceSettled(DB* db) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Stat(db, "memory.allocated_bytes") != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Stat(db, "memory.allocated_bytes");
}

pid_t Spawn(const std::vector<std::string>& args) { return test::SpawnSelf(args); }
using test::WaitExit;

// ------------------------------------------------------------------ children

// Mixed puts, gets, exists and deletes on a shared key space for `seconds`.  Exit 1 on
// any wrong byte, 2 on an unexpected error.
int WorkLoop(DB* db, uint64_t seed, double seconds) {
  Status s;
  std::mt19937_64 rng(seed);
  std::vector<char> buf(256 << 10);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  uint64_t ops = 0;
  while (Clock::now() < end) {
    const std::string key = "k" + std::to_string(rng() % 64);
    const int op = static_cast<int>(rng() % 10);
    if (op < 4) {
      const std::string v = ValueFor(key, rng, 16 + rng() % (128 << 10));
      s = db->Put(WriteOptions(), key, v);
      if (!s.ok() && !s.IsNoSpace()) {
        std::fprintf(stderr, "worker: put: %s\n", s.ToString().c_str());
        return 2;
      }
    } else if (op < 8) {
      size_t n = 0;
      s = db->GetInto(ReadOptions(), key, MutableSlice(buf.data(), buf.size()), &n);
      if (s.ok() && !ValueIsFor(key, buf.data(), n)) {
        std::fprintf(stderr, "worker: wrong bytes for %s (%zu bytes)\n", key.c_str(), n);
        return 1;
      }
      if (!s.ok() && !s.IsNotFound()) {
        std::fprintf(stderr, "worker: get: %s\n", s.ToString().c_str());
        return 2;
      }
    } else if (op == 8) {
      std::vector<Slice> keys{key, "absent-key"};
      std::vector<int64_t> r;
      s = db->BatchExists(keys, &r);
      if (!s.ok() || r.size() != 2 || r[1] != 0) {
        std::fprintf(stderr, "worker: exists: %s\n", s.ToString().c_str());
        return 2;
      }
    } else {
      s = db->Delete(WriteOptions(), key);
      if (!s.ok() && !s.IsNotFound()) {
        std::fprintf(stderr, "worker: delete: %s\n", s.ToString().c_str());
        return 2;
      }
    }
    ops++;
  }
  return ops > 0 ? 0 : 2;
}

int WorkerMain(const std::string& socket, uint64_t seed, double seconds) {
  std::unique_ptr<DB> db;
  Status s = DB::Attach(ClientOptions(), socket, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "worker: attach: %s\n", s.ToString().c_str());
    return 2;
  }
  return WorkLoop(db.get(), seed, seconds);
}

// WorkLoop on `threads` threads sharing one attached DB (its pool of connections).
int ThreadedMain(const std::string& socket, int threads, double seconds) {
  std::unique_ptr<DB> db;
  if (!DB::Attach(ClientOptions(), socket, &db).ok()) return 2;
  std::vector<int> codes(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; t++) {
    workers.emplace_back([&, t] { codes[t] = WorkLoop(db.get(), 1000 + t, seconds); });
  }
  for (auto& w : workers) w.join();
  return *std::max_element(codes.begin(), codes.end());
}

// Puts and gets until killed.
int PutterMain(const std::string& socket, uint64_t seed) {
  std::unique_ptr<DB> db;
  if (!DB::Attach(ClientOptions(), socket, &db).ok()) return 2;
  std::mt19937_64 rng(seed);
  std::vector<std::string> keys;
  std::vector<ValueParts> values;
  std::vector<std::string> bytes(8);
  std::vector<char> buf(64 << 10);
  for (;;) {
    keys.clear();
    values.assign(bytes.size(), {});
    for (size_t i = 0; i < bytes.size(); i++) {
      keys.push_back("p" + std::to_string(rng() % 32));
      if (std::find(keys.begin(), keys.end() - 1, keys.back()) != keys.end() - 1) {
        keys.back() += "-" + std::to_string(i);
      }
      bytes[i] = ValueFor(keys.back(), rng, 64 << 10);
      values[i] = {Slice(bytes[i].data(), 100),
                   Slice(bytes[i].data() + 100, bytes[i].size() - 100)};
    }
    std::vector<Slice> key_slices(keys.begin(), keys.end());
    std::vector<int64_t> r;
    db->BatchPut(WriteOptions(), key_slices, values, &r);
    size_t n;
    db->GetInto(ReadOptions(), key_slices[0], MutableSlice(buf.data(), buf.size()), &n);
  }
}

// Sends requests with large answers and never reads one, until killed.  Exit 2 when it
// cannot even attach.
int DeafMain(const std::string& socket) {
  RawClient client;
  if (!client.Connect(socket).ok()) return 2;
  std::vector<std::string> names(1024);
  std::vector<Slice> keys;
  for (size_t i = 0; i < names.size(); i++) names[i] = "deaf-" + std::to_string(i);
  keys.assign(names.begin(), names.end());
  std::string meta;
  wire::PutKeys(&meta, keys, nullptr);
  for (;;) client.Send(wire::kExists, meta);  // blocks once both socket buffers are full
}

// Attaches, puts and reads a key, and closes, `count` times.  Exit 0 when every attach
// and call succeeded; 1 with the failures counted (the first few named) otherwise.
int AttacherMain(const std::string& socket, int count) {
  Options options = ClientOptions();
  options.prefault_memory = false;  // 300 attaches, each mapping the arena anew
  int failures = 0;
  for (int i = 0; i < count; i++) {
    std::unique_ptr<DB> db;
    Status s = DB::Attach(options, socket, &db);
    const std::string key = "a" + std::to_string(getpid()) + "-" + std::to_string(i % 4);
    std::string v;
    if (s.ok()) s = db->Put(WriteOptions(), key, "value");
    if (s.ok()) s = db->Get(ReadOptions(), key, &v);
    if (s.ok() && v != "value") s = Status::Corruption("read back '" + v + "'");
    if (s.ok()) s = db->Close();
    if (!s.ok() && ++failures <= 3) {
      std::fprintf(stderr, "attacher: attach %d: %s\n", i, s.ToString().c_str());
    }
  }
  if (failures > 0) std::fprintf(stderr, "attacher: %d of %d failed\n", failures, count);
  return failures > 0 ? 1 : 0;
}

// A socket connected to the owner with plain system calls (blocking), as any process of
// the uid may; -1 when it cannot connect.
int RawConnect(const std::string& socket) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket.data(), std::min(socket.size(), sizeof(addr.sun_path) - 1));
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Misbehaves on the owner's socket for `seconds`, as `kind` says:
//   garbage  connects, writes random bytes (sometimes after a zero length prefix, or a
//            well-formed header promising more than follows) and closes, over and over
//   halfopen holds 64 connections that never read nor write
//   stall    holds 64 connections that each send the first half of a valid request
//            frame (or a whole one, never reading its answer) and stop
//   hang     connects and waits to be killed (the test kills it mid-handshake)
int MisbehaveMain(const std::string& socket, const std::string& kind, double seconds,
                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  std::vector<int> held;
  while (Clock::now() < end) {
    const int fd = RawConnect(socket);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (kind == "hang") {
      for (;;) pause();
    }
    if (kind == "garbage") {
      std::string bytes;
      const int shape = static_cast<int>(rng() % 3);
      if (shape == 1) bytes.assign(4, '\0');  // a zero length prefix
      if (shape == 2) {                       // a header that promises more than follows
        char header[wire::kHeaderSize];
        wire::EncodeFrameHeader(wire::kExists, 0, 1, std::string(100, 'm'), {}, header);
        bytes.assign(header, sizeof(header));
      }
      for (size_t i = rng() % 256; i > 0; i--) bytes += static_cast<char>(rng());
      [[maybe_unused]] ssize_t n = write(fd, bytes.data(), bytes.size());
      close(fd);
      continue;
    }
    if (kind == "stall") {
      const std::string meta(64, 'k');
      char header[wire::kHeaderSize];
      wire::EncodeFrameHeader(wire::kOpenChannel, 0, 1, rng() % 2 ? meta : "", {}, header);
      std::string bytes(header, sizeof(header));
      if (!meta.empty()) bytes += meta.substr(0, 32);  // half of what the header promises
      [[maybe_unused]] ssize_t n = write(fd, bytes.data(), bytes.size());
    }
    held.push_back(fd);  // halfopen, stall: kept open and silent
    if (held.size() >= 64) {
      std::this_thread::sleep_until(end);
      break;
    }
  }
  for (int fd : held) close(fd);
  return 0;
}

// The value of key `key` in the SSD read tests: `size` bytes that only this key has.
std::string SsdValue(const std::string& key, size_t size) {
  return test::MakeValue(Fnv(key.data(), key.size()), size);
}

// Puts `count` values of `size` bytes through attach (namespace `ns`; "-": the default
// one), in batches of 8, then reads `batches` BatchGetInto's of `batch_keys` random keys
// of them and checks every key bit-exact.  Exit 0 when every key read back; 1 on wrong
// bytes; 3 when keys failed (counted, the first codes printed); 2 when a put failed.
int SsdReaderMain(const std::string& socket, const std::string& ns, int count, size_t size,
                  int batches, int batch_keys, uint64_t seed) {
  std::unique_ptr<DB> attached, handle;
  Status s = DB::Attach(ClientOptions(), socket, &attached);
  if (s.ok() && ns != "-") s = attached->OpenNamespace(ns, &handle);
  if (!s.ok()) {
    std::fprintf(stderr, "ssd reader: attach: %s\n", s.ToString().c_str());
    return 2;
  }
  DB* db = ns == "-" ? attached.get() : handle.get();
  std::vector<std::string> names;
  for (int i = 0; i < count; i++) names.push_back("ssd-" + std::to_string(i));
  for (int first = 0; first < count; first += 8) {
    std::vector<std::string> bytes;
    std::vector<Slice> keys;
    std::vector<ValueParts> values;
    for (int i = first; i < std::min(count, first + 8); i++) {
      bytes.push_back(SsdValue(names[i], size));
      keys.push_back(names[i]);
    }
    for (const std::string& b : bytes) values.push_back({Slice(b)});
    std::vector<int64_t> r;
    s = db->BatchPut(WriteOptions(), keys, values, &r);
    for (size_t i = 0; s.ok() && i < r.size(); i++) {
      if (r[i] != 0)
        s = Status::FromErrorCode(static_cast<int>(r[i]), "put of " + names[first + i]);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "ssd reader: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  std::mt19937_64 rng(seed);
  std::vector<char> buf(static_cast<size_t>(batch_keys) * size);
  int failed = 0, wrong = 0, read = 0;
  for (int b = 0; b < batches; b++) {
    std::vector<Slice> keys;
    std::vector<Destination> dest;
    for (int i = 0; i < batch_keys; i++) {
      keys.push_back(names[rng() % names.size()]);
      dest.push_back({MutableSlice(buf.data() + i * size, size)});
    }
    std::vector<int64_t> r;
    s = db->BatchGetInto(ReadOptions(), keys, dest, &r);
    if (!s.ok()) {
      std::fprintf(stderr, "ssd reader: batch %d: %s\n", b, s.ToString().c_str());
      return 3;
    }
    for (int i = 0; i < batch_keys; i++) {
      read++;
      if (r[i] < 0) {
        if (++failed <= 3) {
          std::fprintf(stderr, "ssd reader: %s: %s\n", keys[i].ToString().c_str(),
                       Status::FromErrorCode(static_cast<int>(r[i])).ToString().c_str());
        }
      } else if (static_cast<size_t>(r[i]) != size ||
                 std::memcmp(buf.data() + i * size, SsdValue(keys[i].ToString(), size).data(),
                             size) != 0) {
        wrong++;
      }
    }
  }
  std::fprintf(stderr, "ssd reader: %d keys read, %d failed, %d wrong\n", read, failed, wrong);
  return wrong > 0 ? 1 : failed > 0 ? 3 : 0;
}

// Serves the DB at dir on socket until killed.
int OwnerMain(const std::string& socket, const std::string& dir) {
  std::unique_ptr<DB> db;
  Status s = DB::Open(OwnerOptions(socket), dir, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "owner: %s\n", s.ToString().c_str());
    return 2;
  }
  for (;;) pause();
}

// Drops to nobody and tries to attach: exit 0 when refused as expected.
int NobodyMain(const std::string& socket) {
  if (setgid(65534) != 0 || setuid(65534) != 0) return 3;
  std::unique_ptr<DB> db;
  Status s = DB::Attach(ClientOptions(), socket, &db);
  if (s.ok()) return 1;
  std::fprintf(stderr, "nobody: %s\n", s.ToString().c_str());
  return s.ToString().find("refused") != std::string::npos ? 0 : 4;
}

// ------------------------------------------------------------------ tests

class AttachTest : public ::testing::Test {
 protected:
  AttachTest() { std::filesystem::create_directories(dir_.path()); }
  void OpenOwner() {
    Status s = DB::Open(OwnerOptions(socket_), dir_.Sub("db"), &owner_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // An owner whose arena (16 MiB) is much smaller than its SSD tier (256 MiB).
  void OpenSsdOwner() {
    Options o = OwnerOptions(socket_);
    o.memory_capacity_bytes = 16ull << 20;
    o.ssd_capacity_bytes = 256ull << 20;
    Status s = DB::Open(o, dir_.Sub("db"), &owner_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  test::TempDir dir_;
  const std::string socket_ = dir_.Sub("db") + "/kv.sock";
  std::unique_ptr<DB> owner_;
};

TEST_F(AttachTest, WholeApiThroughAttach) {
  OpenOwner();
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  ASSERT_TRUE(db->Put(WriteOptions(), "a", "hello").ok());
  std::string v;
  ASSERT_TRUE(db->Get(ReadOptions(), "a", &v).ok());
  EXPECT_EQ(v, "hello");
  ASSERT_TRUE(owner_->Get(ReadOptions(), "a", &v).ok());  // the owner sees it
  EXPECT_EQ(v, "hello");
  ASSERT_TRUE(owner_->Put(WriteOptions(), "b", "from owner").ok());
  char small[4];
  size_t n = 0;
  EXPECT_TRUE(db->GetInto(ReadOptions(), "b", MutableSlice(small, 4), &n).IsBufferTooSmall());
  EXPECT_EQ(n, 10u);
  EXPECT_TRUE(db->Get(ReadOptions(), "zz", &v).IsNotFound());
  uint64_t size = 0;
  ASSERT_TRUE(db->GetValueSize("b", &size).ok());
  EXPECT_EQ(size, 10u);

  std::vector<Slice> keys{"x", "y", ""};
  std::vector<ValueParts> values{{"x1", "x2"}, {"yy"}, {"e"}};
  std::vector<int64_t> r;
  ASSERT_TRUE(db->BatchPut(WriteOptions(), keys, values, &r).ok());
  EXPECT_EQ(r, (std::vector<int64_t>{0, 0, Status::InvalidArgument("").ErrorCode()}));
  std::vector<Slice> dup{"x", "x"};
  EXPECT_TRUE(db->BatchPut(WriteOptions(), dup, std::vector<ValueParts>{{"1"}, {"2"}}, &r)
                  .IsInvalidArgument());
  char b1[2], b2[8];
  std::vector<Destination> dests{{MutableSlice(b1, 2), MutableSlice(b2, 8)}};
  ASSERT_TRUE(db->BatchGetInto(ReadOptions(), std::vector<Slice>{"x"}, dests, &r).ok());
  EXPECT_EQ(r[0], 4);
  EXPECT_EQ(std::string(b1, 2) + std::string(b2, 2), "x1x2");
  ASSERT_TRUE(db->BatchExists(std::vector<Slice>{"x", "nope"}, &r).ok());
  EXPECT_EQ(r, (std::vector<int64_t>{1, 0}));
  ASSERT_TRUE(db->BatchDelete(WriteOptions(), std::vector<Slice>{"x", "nope"}, &r).ok());
  EXPECT_EQ(r, (std::vector<int64_t>{0, Status::NotFound("").ErrorCode()}));
  uint64_t deleted = 0;
  ASSERT_TRUE(db->DeleteByRegex("[ab]", &deleted).ok());
  EXPECT_EQ(deleted, 2u);
  EXPECT_TRUE(db->DeleteByRegex("(", &deleted).IsInvalidArgument());
  ASSERT_TRUE(db->Flush().ok());
  ASSERT_TRUE(db->CompactBuckets(nullptr).ok());
  std::string stats;
  ASSERT_TRUE(db->GetProperty("kvengine.stats", &stats));
  EXPECT_NE(stats.find("memory.items: 1"), std::string::npos) << stats;
  EXPECT_FALSE(db->GetProperty("no.such", &stats));
  ASSERT_TRUE(db->GetProperty("kvengine.attached", &stats));  // the client's own answer
  EXPECT_EQ(stats, socket_);
  EXPECT_FALSE(owner_->GetProperty("kvengine.attached", &stats));
  ASSERT_TRUE(db->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, 1u);
  ASSERT_TRUE(db->Close().ok());
  EXPECT_TRUE(db->Put(WriteOptions(), "a", "b").IsAborted());
}

// Frames go through the shared channel unless the client turns it off, and both ways
// serve the same answers, batches larger than the channel's ring included.
TEST_F(AttachTest, SharedChannelAndSocketServeTheSameAnswers) {
  OpenOwner();
  for (bool channel : {true, false}) {
    Options options = ClientOptions();
    options.local_shared_channel = channel;
    std::unique_ptr<DB> db;
    ASSERT_TRUE(DB::Attach(options, socket_, &db).ok());
    const uint64_t channels_before = Stat(owner_.get(), "local.shared_channels");
    // 20,000 keys of 40 bytes: about 1 MB of metadata each way, four rings' worth.
    std::vector<std::string> names;
    for (int i = 0; i < 20000; i++) {
      names.push_back("key-" + std::to_string(channel) + "-" + std::string(20, 'k') +
                      std::to_string(100000 + i));
    }
    std::vector<Slice> keys(names.begin(), names.end());
    std::vector<ValueParts> values;
    for (const auto& n : names) values.push_back({Slice(n)});
    std::vector<int64_t> r;
    ASSERT_TRUE(db->BatchPut(WriteOptions(), keys, values, &r).ok());
    ASSERT_EQ(r, std::vector<int64_t>(keys.size(), 0));
    keys.push_back("absent");
    ASSERT_TRUE(db->BatchExists(keys, &r).ok());
    std::vector<int64_t> expected(names.size(), 1);
    expected.push_back(0);
    EXPECT_EQ(r, expected);
    std::string v;
    ASSERT_TRUE(db->Get(ReadOptions(), names[123], &v).ok());
    EXPECT_EQ(v, names[123]);
    // The first call's connection asked for a channel at connect (or did not).
    EXPECT_EQ(Stat(owner_.get(), "local.shared_channels"), channels_before) << channel;
    ASSERT_TRUE(db->Close().ok());
  }
  EXPECT_EQ(Stat(owner_.get(), "local.shared_channels"), 1u);
}

// Puts and gets of many large values go in groups (commits while the rest is copied,
// pins while the first groups are copied out): every key gets its own result and bytes,
// failed keys in the middle of a group included.
TEST_F(AttachTest, PipelinedBatchesKeepEveryKeysResult) {
  OpenOwner();
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::mt19937_64 rng(21);
  constexpr int kKeys = 48;
  for (int round = 0; round < 4; round++) {  // later rounds put into spares
    std::vector<std::string> names, bytes;
    for (int i = 0; i < kKeys; i++) {
      names.push_back(i == 17 ? "" : "r" + std::to_string(round) + "-" + std::to_string(i));
      bytes.push_back(ValueFor(names.back(), rng, 64 << 10));
    }
    std::vector<Slice> keys(names.begin(), names.end());
    std::vector<ValueParts> values;
    for (const auto& b : bytes) values.push_back({Slice(b)});
    std::vector<int64_t> r;
    ASSERT_TRUE(db->BatchPut(WriteOptions(), keys, values, &r).ok());
    for (int i = 0; i < kKeys; i++) {
      EXPECT_EQ(r[i], i == 17 ? Status::InvalidArgument("").ErrorCode() : 0) << i;
    }
    // Back, with a missing key and a buffer too small among them.
    keys.push_back("absent");
    std::vector<std::vector<char>> buffers(keys.size(), std::vector<char>(64 << 10));
    buffers[30].resize(100);
    std::vector<Destination> dests;
    for (auto& b : buffers) dests.push_back({MutableSlice(b.data(), b.size())});
    ASSERT_TRUE(db->BatchGetInto(ReadOptions(), keys, dests, &r).ok());
    for (size_t i = 0; i < keys.size(); i++) {
      if (i == 17) {
        EXPECT_EQ(r[i], Status::InvalidArgument("").ErrorCode());
      } else if (i == 30) {
        EXPECT_EQ(r[i], Status::BufferTooSmall("").ErrorCode());
      } else if (i == keys.size() - 1) {
        EXPECT_EQ(r[i], Status::NotFound("").ErrorCode());
      } else {
        ASSERT_EQ(r[i], 64 << 10) << i;
        EXPECT_TRUE(ValueIsFor(names[i], buffers[i].data(), buffers[i].size())) << i;
      }
    }
  }
  // Nothing stays pinned or reserved beyond the spares of the last put.
  ASSERT_TRUE(db->Close().ok());
  db.reset();
  const uint64_t live = (kKeys - 1) * 4u;  // values of 64 KiB
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Stat(owner_.get(), "memory.allocated_bytes") / (64 << 10) != live &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Stat(owner_.get(), "memory.allocated_bytes") / (64 << 10), live);
}

TEST_F(AttachTest, EightProcessesNeverSeeWrongBytes) {
  OpenOwner();
  std::vector<pid_t> workers;
  for (int i = 0; i < 7; i++) {
    workers.push_back(Spawn({"--worker", socket_, std::to_string(i + 1), "3"}));
  }
  // The owner works on the same keys meanwhile.
  std::mt19937_64 rng(99);
  std::vector<char> buf(256 << 10);
  const auto end = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < end) {
    const std::string key = "k" + std::to_string(rng() % 64);
    if (rng() % 2) {
      owner_->Put(WriteOptions(), key, ValueFor(key, rng, 16 + rng() % 4096));
    } else {
      size_t n = 0;
      if (owner_->GetInto(ReadOptions(), key, MutableSlice(buf.data(), buf.size()), &n).ok()) {
        ASSERT_TRUE(ValueIsFor(key, buf.data(), n)) << key;
      }
    }
  }
  for (pid_t pid : workers) EXPECT_EQ(WaitExit(pid), 0);
}

// One client's threads share its pool of connections: every byte right, for calls of
// many threads at once (beyond the pool's size) while other processes work too.
TEST_F(AttachTest, ThreadsOfOneClientShareItsConnections) {
  OpenOwner();
  const pid_t threaded = Spawn({"--threaded", socket_, "24", "2"});
  const pid_t other = Spawn({"--worker", socket_, "77", "2"});
  EXPECT_EQ(WaitExit(threaded), 0);
  EXPECT_EQ(WaitExit(other), 0);
}

TEST_F(AttachTest, KilledClientsLeakNothing) {
  OpenOwner();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 60; round++) {
    const pid_t pid = Spawn({"--putter", socket_, std::to_string(round)});
    // Mostly mid-put; every tenth round long enough for a slow start (TSan) to put.
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 40 + (round % 10 ? 0 : 300)));
    kill(pid, SIGKILL);
    WaitExit(pid);
  }
  // Every value visible is whole and its key's.
  std::vector<char> buf(64 << 10);
  uint64_t items = 0;
  for (int k = 0; k < 32; k++) {
    for (int i = -1; i < 8; i++) {
      const std::string key = "p" + std::to_string(k) + (i < 0 ? "" : "-" + std::to_string(i));
      size_t n = 0;
      if (owner_->GetInto(ReadOptions(), key, MutableSlice(buf.data(), buf.size()), &n).ok()) {
        EXPECT_TRUE(ValueIsFor(key, buf.data(), n)) << key;
        items++;
      }
    }
  }
  EXPECT_GT(items, 0u);
  EXPECT_EQ(Stat(owner_.get(), "memory.items"), items);
  // Once the owner has seen every connection close, the arena holds only live values:
  // deleting them all leaves nothing allocated.
  uint64_t deleted = 0;
  ASSERT_TRUE(owner_->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, items);
  EXPECT_EQ(AllocatedOnceSettled(owner_.get()), 0u);
}

TEST_F(AttachTest, OwnerKilledThenRestartedClientsRecover) {
  const std::string dir = dir_.Sub("db");
  pid_t owner = Spawn({"--owner", socket_, dir});
  std::unique_ptr<DB> db;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!DB::Attach(ClientOptions(), socket_, &db).ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->Put(WriteOptions(), "a", "1").ok());
  kill(owner, SIGKILL);
  WaitExit(owner);
  const auto t0 = Clock::now();
  std::string v;
  Status s = db->Get(ReadOptions(), "a", &v);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.ToString().find(socket_), std::string::npos) << s.ToString();
  s = db->Put(WriteOptions(), "a", "2");
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(ClientOptions().peer_timeout_ms));

  owner = Spawn({"--owner", socket_, dir});
  deadline = Clock::now() + std::chrono::seconds(10);
  while (!(s = db->Put(WriteOptions(), "a", "3")).ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(db->Get(ReadOptions(), "a", &v).ok());
  EXPECT_EQ(v, "3");
  kill(owner, SIGKILL);
  WaitExit(owner);
}

// Close may be called from several threads at once (and again by the destructor): the
// local server is stopped once, while attached clients are busy.  TSan checks the race.
TEST_F(AttachTest, ConcurrentClosesOfTheOwner) {
  for (int round = 0; round < 5; round++) {
    OpenOwner();
    const pid_t worker = Spawn({"--worker", socket_, std::to_string(round + 1), "2"});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<std::thread> closers;
    for (int i = 0; i < 4; i++) {
      closers.emplace_back([this] { EXPECT_TRUE(owner_->Close().ok()); });
    }
    for (auto& t : closers) t.join();
    owner_.reset();
    kill(worker, SIGKILL);  // its calls fail once the owner is gone; it need not finish
    WaitExit(worker);
  }
}

// A client alive but idle in the middle of a put: the owner gives its slot back after
// local_reservation_timeout_ms, another value may take the room, and the late COMMIT
// fails with Aborted without publishing anything.
TEST_F(AttachTest, IdleReservationsAreReclaimed) {
  Options options = OwnerOptions(socket_);
  options.local_reservation_timeout_ms = 300;
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &owner_).ok());
  RawClient client;
  ASSERT_TRUE(client.Connect(socket_).ok());
  const size_t size = 64 << 10;
  char* slot = nullptr;
  uint64_t id = 0;
  const auto t0 = Clock::now();
  ASSERT_TRUE(client.Reserve("late", size, &slot, &id).ok());
  std::memset(slot, 'L', size);
  EXPECT_GT(Stat(owner_.get(), "memory.allocated_bytes"), 0u);
  while (Stat(owner_.get(), "memory.allocated_bytes") != 0 &&
         Clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Stat(owner_.get(), "memory.allocated_bytes"), 0u);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(300));
  // The room is free again: another value takes it.
  const std::string other(size, 'O');
  ASSERT_TRUE(owner_->Put(WriteOptions(), "other", other).ok());
  EXPECT_EQ(client.Commit("late", id), Status::Aborted("").ErrorCode());
  std::string v;
  EXPECT_TRUE(owner_->Get(ReadOptions(), "late", &v).IsNotFound());
  ASSERT_TRUE(owner_->Get(ReadOptions(), "other", &v).ok());
  EXPECT_TRUE(v == other);
  // An id never granted is still a plain mistake.
  EXPECT_EQ(client.Commit("late", id + 1000), Status::InvalidArgument("").ErrorCode());
}

// The owner checks the keys of the arena path itself: a client that skips its own check
// (this raw one) cannot reserve or commit a namespace's internal key (0xFE, id, key)
// from the default namespace.  Before the owner checked, the slot was published inside
// namespace "a".
TEST_F(AttachTest, TheOwnerChecksArenaKeysItself) {
  OpenOwner();
  std::unique_ptr<DB> a;
  ASSERT_TRUE(owner_->CreateNamespace("a", NamespaceOptions(), &a).ok());
  const std::string forged = ns::Prefix(ns::IdOf("a")) + "k";
  RawClient client;
  ASSERT_TRUE(client.Connect(socket_).ok());
  char* slot = nullptr;
  uint64_t id = 0;
  EXPECT_TRUE(client.Reserve(forged, 8, &slot, &id).IsInvalidArgument());
  ASSERT_TRUE(client.Reserve("plain", 8, &slot, &id).ok());
  std::memcpy(slot, "12345678", 8);
  EXPECT_EQ(client.Commit(forged, id), Status::InvalidArgument("").ErrorCode());
  std::string v;
  EXPECT_TRUE(a->Get(ReadOptions(), "k", &v).IsNotFound());
}

// Puts of one shape (a vLLM request's layers) take one round trip each: the COMMIT of
// one reserves the slots of the next, which copies into them without a RESERVE.  A put
// of another shape reserves again and gives the unused spares back; a client that goes
// away leaves no spare behind.
TEST_F(AttachTest, PutsOfOneShapeTakeOneRoundTripThroughSpares) {
  ASSERT_TRUE(DB::Open(OwnerOptions(socket_), dir_.Sub("db"), &owner_).ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::mt19937_64 rng(11);
  std::map<std::string, std::string> stored;
  auto put = [&](int request, int layers, size_t size) {
    std::vector<std::string> keys, values;
    for (int l = 0; l < layers; l++) {
      keys.push_back("req" + std::to_string(request) + "/layer" + std::to_string(l));
      values.push_back(ValueFor(keys.back(), rng, size));
    }
    std::vector<Slice> key_slices(keys.begin(), keys.end());
    std::vector<ValueParts> parts;
    for (const auto& v : values) parts.push_back({Slice(v)});
    std::vector<int64_t> results;
    ASSERT_TRUE(db->BatchPut(WriteOptions(), key_slices, parts, &results).ok());
    for (int l = 0; l < layers; l++) {
      EXPECT_EQ(results[l], 0) << keys[l];
      stored[keys[l]] = values[l];
    }
  };
  for (int r = 0; r < 10; r++) put(r, 4, 8 << 10);
  EXPECT_EQ(Stat(owner_.get(), "local.reserve_requests"), 1u);
  EXPECT_EQ(Stat(owner_.get(), "local.spare_commits"), 36u);
  put(10, 2, 12 << 10);  // another shape: reserved afresh
  put(11, 2, 12 << 10);
  EXPECT_EQ(Stat(owner_.get(), "local.reserve_requests"), 2u);
  EXPECT_EQ(Stat(owner_.get(), "local.spare_commits"), 38u);
  for (const auto& [key, value] : stored) {
    std::string v;
    ASSERT_TRUE(owner_->Get(ReadOptions(), key, &v).ok()) << key;
    EXPECT_TRUE(v == value) << key;
  }
  EXPECT_EQ(Stat(owner_.get(), "local.reservations_expired"), 0u);
  // Once the client is gone and the values deleted, the arena holds nothing: no spare
  // outlived its connection.
  db.reset();
  uint64_t deleted = 0;
  ASSERT_TRUE(owner_->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, stored.size());
  EXPECT_EQ(AllocatedOnceSettled(owner_.get()), 0u);
}

// Spares hold arena room on speculation, so the owner gives them back on its own after
// a short lifetime -- silently, since nothing went wrong -- and a later put of the same
// shape, which can no longer trust them, reserves afresh.
TEST_F(AttachTest, SparesOfAnIdleClientAreGivenBackSilently) {
  Options options = OwnerOptions(socket_);
  options.local_reservation_timeout_ms = 200;  // spares live as long
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &owner_).ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::mt19937_64 rng(12);
  const std::string v1 = ValueFor("a", rng, 16 << 10);
  ASSERT_TRUE(db->Put(WriteOptions(), "a", v1).ok());
  uint64_t deleted = 0;
  ASSERT_TRUE(owner_->DeleteAll(&deleted).ok());
  EXPECT_GT(Stat(owner_.get(), "memory.allocated_bytes"), 0u);  // the spare
  const auto t0 = Clock::now();
  while (Stat(owner_.get(), "memory.allocated_bytes") != 0 &&
         Clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Stat(owner_.get(), "memory.allocated_bytes"), 0u);
  EXPECT_EQ(Stat(owner_.get(), "local.reservations_expired"), 0u);
  const std::string v2 = ValueFor("b", rng, 16 << 10);
  ASSERT_TRUE(db->Put(WriteOptions(), "b", v2).ok());
  EXPECT_EQ(Stat(owner_.get(), "local.reserve_requests"), 2u);
  std::string v;
  ASSERT_TRUE(owner_->Get(ReadOptions(), "b", &v).ok());
  EXPECT_TRUE(v == v2);
}

// A spare is reserved before its key is known, so the commit checks the key: a key the
// owner refuses fails alone, publishes nothing, and its slot goes back.
TEST_F(AttachTest, KeyCommittedIntoASpareIsCheckedAtCommit) {
  Options options = OwnerOptions(socket_);
  options.max_key_size = 64;
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &owner_).ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::mt19937_64 rng(13);
  const std::string v(4096, 'v');
  std::vector<int64_t> results;
  std::vector<Slice> keys{"k1", "k2"};
  std::vector<ValueParts> parts{{Slice(v)}, {Slice(v)}};
  ASSERT_TRUE(db->BatchPut(WriteOptions(), keys, parts, &results).ok());
  const std::string long_key(65, 'L');
  keys = {"k3", long_key};
  ASSERT_TRUE(db->BatchPut(WriteOptions(), keys, parts, &results).ok());
  EXPECT_EQ(results[0], 0);
  EXPECT_EQ(results[1], Status::InvalidArgument("").ErrorCode());
  EXPECT_EQ(Stat(owner_.get(), "local.spare_commits"), 1u);
  std::string out;
  EXPECT_TRUE(owner_->Get(ReadOptions(), "k3", &out).ok());
  EXPECT_TRUE(owner_->Get(ReadOptions(), long_key, &out).IsInvalidArgument());
  db.reset();
  uint64_t deleted = 0;
  ASSERT_TRUE(owner_->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, 3u);
  EXPECT_EQ(AllocatedOnceSettled(owner_.get()), 0u);
}

// Through DB::Attach: a put that cannot copy within half the owner's timeout fails
// with a status that says why, and leaves nothing behind.
TEST_F(AttachTest, PutThatOutlivesItsReservationFailsCleanly) {
  Options options = OwnerOptions(socket_);
  options.local_reservation_timeout_ms = 1;  // every copy comes too late
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &owner_).ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  Status s = db->Put(WriteOptions(), "k", std::string(4096, 'x'));
  EXPECT_TRUE(s.IsAborted()) << s.ToString();
  EXPECT_NE(s.ToString().find("local_reservation_timeout_ms"), std::string::npos) << s.ToString();
  std::string v;
  EXPECT_TRUE(owner_->Get(ReadOptions(), "k", &v).IsNotFound());
  EXPECT_EQ(AllocatedOnceSettled(owner_.get()), 0u);
  // Without a timeout the same put succeeds.
  ASSERT_TRUE(owner_->Close().ok());
  owner_.reset();
  db.reset();
  options.local_reservation_timeout_ms = 0;
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &owner_).ok());
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  EXPECT_TRUE(db->Put(WriteOptions(), "k", std::string(4096, 'x')).ok());
}

// A batch whose copies take longer than half the owner's reservation timeout: the values
// copied too late go again into slots reserved then, until every one is in, rather than
// fail puts the owner would take (under load a stalled client lost puts this way; the
// SGLang and LMCache back ends retried them once themselves).
TEST_F(AttachTest, ValuesCopiedTooLateGoAgainIntoNewSlots) {
  Options options = OwnerOptions(socket_);
  options.memory_capacity_bytes = 512ull << 20;
  options.local_reservation_timeout_ms = 50;  // 25 ms to copy a batch of 256 MiB: too short
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &owner_).ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  const size_t kValues = 1024, kSize = 256 << 10;
  std::mt19937_64 rng(7);
  std::vector<std::string> keys, values;
  for (size_t i = 0; i < kValues; i++) {
    keys.push_back("late." + std::to_string(i));
    values.push_back(ValueFor(keys.back(), rng, kSize));
  }
  std::vector<Slice> key_slices(keys.begin(), keys.end());
  std::vector<ValueParts> parts;
  for (const std::string& v : values) parts.push_back({Slice(v)});
  std::vector<int64_t> results;
  ASSERT_TRUE(db->BatchPut(WriteOptions(), key_slices, parts, &results).ok());
  for (size_t i = 0; i < kValues; i++) {
    ASSERT_EQ(results[i], 0) << keys[i] << ": "
                             << Status::FromErrorCode(static_cast<int>(results[i])).ToString();
    std::string got;
    ASSERT_TRUE(owner_->Get(ReadOptions(), keys[i], &got).ok()) << keys[i];
    ASSERT_TRUE(ValueIsFor(keys[i], got.data(), got.size())) << keys[i];
  }
}

// A client that sends requests and never reads the answers stalls only its own
// connection: another client's calls keep being answered promptly meanwhile.
TEST_F(AttachTest, ClientThatStopsReadingStallsOnlyItself) {
  Options options = OwnerOptions(socket_);
  options.peer_timeout_ms = 3000;  // how long the owner waits on the deaf client's answers
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &owner_).ok());
  const pid_t deaf = Spawn({"--deaf", socket_});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // its socket fills up
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::mt19937_64 rng(5);
  std::vector<char> buf(64 << 10);
  Clock::duration worst{};
  int ops = 0;
  const auto end = Clock::now() + std::chrono::milliseconds(1500);
  while (Clock::now() < end) {
    const std::string key = "live" + std::to_string(ops % 16);
    const auto t0 = Clock::now();
    ASSERT_TRUE(db->Put(WriteOptions(), key, ValueFor(key, rng, 32 << 10)).ok());
    size_t n = 0;
    ASSERT_TRUE(db->GetInto(ReadOptions(), key, MutableSlice(buf.data(), buf.size()), &n).ok());
    ASSERT_TRUE(ValueIsFor(key, buf.data(), n));
    std::vector<int64_t> r;
    ASSERT_TRUE(db->BatchExists(std::vector<Slice>{key}, &r).ok());
    worst = std::max(worst, Clock::now() - t0);
    ops++;
  }
  // Still stuck, not gone: the owner has not given up on it yet.
  EXPECT_EQ(waitpid(deaf, nullptr, WNOHANG), 0);
  kill(deaf, SIGKILL);
  WaitExit(deaf);
  EXPECT_GT(ops, 10);
  EXPECT_LT(worst, std::chrono::milliseconds(1000))
      << std::chrono::duration_cast<std::chrono::milliseconds>(worst).count() << " ms";
}

// Device buffers of an attached client, on the CPU: host buffers the hooks call memory
// of device 0, copied by HostCopiers.  A put goes device -> its reserved slot, a get
// pinned value -> device; both arrive bit-exact, and through the copier, not memcpy.
// GpuIo hooks that make the given host strings "device" memory of CUDA device 0, copied
// by HostCopiers (each lane's is added to *copiers) with `faults`.
GpuIo::Hooks DeviceHooks(std::vector<const std::string*> device_memory,
                         std::vector<HostCopier*>* copiers, const HostCopier::Faults& faults) {
  GpuIo::Hooks hooks;
  hooks.classify = [device_memory](const void* p, PointerInfo* info) {
    for (const std::string* s : device_memory) {
      if (p >= s->data() && p < s->data() + s->size()) {
        info->kind = MemoryKind::kDevice;
        info->device = 0;
        return true;
      }
    }
    return false;
  };
  hooks.new_copier = [copiers, faults](int, std::unique_ptr<DeviceCopier>* result) {
    auto copier = std::make_unique<HostCopier>(faults);
    copiers->push_back(copier.get());
    *result = std::move(copier);
    return Status::OK();
  };
  return hooks;
}

TEST_F(AttachTest, DeviceBuffersOfAnAttachedClient) {
  std::string device_src(300 << 10, 0), device_dst(300 << 10, 0);
  std::mt19937_64 rng(3);
  for (char& c : device_src) c = static_cast<char>(rng());
  std::atomic<uint64_t> copied{0};
  HostCopier::Faults faults;
  faults.fail_complete = [&](const void*, const void*, size_t n) {
    copied += n;  // counts the bytes; fails nothing
    return false;
  };
  std::vector<HostCopier*> copiers;
  const GpuIo::Hooks hooks = DeviceHooks({&device_src, &device_dst}, &copiers, faults);
  GpuIo::SetHooksForTesting(&hooks);
  OpenOwner();
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  // A value from two device parts and a host part.
  const std::string host_part(1000, 'h');
  std::vector<Slice> keys{"gpu-key"};
  std::vector<ValueParts> values{{Slice(device_src.data(), 200 << 10), Slice(host_part),
                                  Slice(device_src.data() + (200 << 10), 100 << 10)}};
  std::vector<int64_t> r;
  ASSERT_TRUE(db->BatchPut(WriteOptions(), keys, values, &r).ok());
  ASSERT_EQ(r[0], 0);
  const std::string expected =
      device_src.substr(0, 200 << 10) + host_part + device_src.substr(200 << 10);
  std::string v;
  ASSERT_TRUE(owner_->Get(ReadOptions(), "gpu-key", &v).ok());
  EXPECT_TRUE(v == expected);
  EXPECT_GE(copied.load(), 300u << 10);  // the device parts went through the copier
  const uint64_t before = copied.load();
  // Back into a device buffer (two destinations: device, then host).
  std::string host_tail(2000, 0);
  std::vector<Destination> dests{
      {MutableSlice(device_dst.data(), 300 << 10), MutableSlice(host_tail.data(), 2000)}};
  ASSERT_TRUE(db->BatchGetInto(ReadOptions(), keys, dests, &r).ok());
  ASSERT_EQ(r[0], static_cast<int64_t>(expected.size()));
  EXPECT_TRUE(device_dst + host_tail.substr(0, 1000) == expected);
  EXPECT_GE(copied.load() - before, 300u << 10);
  db.reset();
  owner_.reset();
  GpuIo::SetHooksForTesting(nullptr);
}

// The window is handed out front to back and emptied by the release of its last room;
// an idle one gives its pages back (they read zeros), a held one never does.
TEST(StagingWindowTest, RoundsFillItAndIdleOnesGiveTheirPagesBack) {
  std::unique_ptr<StagingWindow> window;
  int memfd = -1;
  ASSERT_TRUE(StagingWindow::Create(&window, &memfd).ok());
  close(memfd);
  uint64_t a = 1, b = 1, c = 1;
  ASSERT_TRUE(window->Take(StagingWindow::kBytes - 4096, &a));
  ASSERT_TRUE(window->Take(4096, &b));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, StagingWindow::kBytes - 4096);
  EXPECT_FALSE(window->Take(1, &c));  // full: the key waits for another round
  window->Release();
  EXPECT_FALSE(window->Take(1, &c));  // one room still held
  std::memset(window->base(), 'x', 4096);
  std::this_thread::sleep_for(StagingWindow::kIdleRelease + std::chrono::milliseconds(100));
  window->ReleaseIfIdle();
  EXPECT_EQ(window->base()[0], 'x');  // held: kept
  window->Release();
  ASSERT_TRUE(window->Take(StagingWindow::kBytes, &c));  // empty again
  EXPECT_EQ(c, 0u);
  window->Release();
  window->ReleaseIfIdle();
  EXPECT_EQ(window->base()[0], 'x');  // not idle long enough
  std::this_thread::sleep_for(StagingWindow::kIdleRelease + std::chrono::milliseconds(100));
  window->ReleaseIfIdle();
  EXPECT_EQ(window->base()[0], 0);  // given back
}

// A value only on SSD read into a device buffer: the copy goes from the connection's
// staging window, which is not the arena (so not page-locked as the arena is).
TEST_F(AttachTest, DeviceBufferReadsAValueOnlyOnSsdThroughTheWindow) {
  std::string device_src(300 << 10, 0), device_dst(300 << 10, 0);
  std::mt19937_64 rng(4);
  for (char& c : device_src) c = static_cast<char>(rng());
  std::vector<HostCopier*> copiers;
  const GpuIo::Hooks hooks =
      DeviceHooks({&device_src, &device_dst}, &copiers, HostCopier::Faults());
  GpuIo::SetHooksForTesting(&hooks);
  OpenSsdOwner();
  const std::string value(device_src.data(), 300 << 10);
  ASSERT_TRUE(owner_->Put(WriteOptions(), "gpu-key", value).ok());
  // 24 MiB of its size class through a 16 MiB arena: gpu-key goes to SSD.
  for (int i = 0; i < 80; i++) {
    ASSERT_TRUE(owner_
                    ->Put(WriteOptions(), "filler-" + std::to_string(i),
                          std::string(300 << 10, static_cast<char>(i)))
                    .ok());
  }
  std::vector<Slice> keys{"gpu-key"};
  std::vector<int64_t> r;
  ASSERT_TRUE(owner_->BatchLocate(keys, &r).ok());
  ASSERT_EQ(r[0], kLocatedSsd);
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::vector<Destination> dests{{MutableSlice(device_dst.data(), device_dst.size())}};
  ASSERT_TRUE(db->BatchGetInto(ReadOptions(), keys, dests, &r).ok());
  ASSERT_EQ(r[0], static_cast<int64_t>(value.size()));
  EXPECT_TRUE(device_dst == value);
  EXPECT_EQ(Stat(owner_.get(), "local.window_staged_values"), 1u);
  db.reset();
  owner_.reset();
  GpuIo::SetHooksForTesting(nullptr);
}

// The device copies of a batch are queued back to back, not waited for key by key:
// with copies that take a while, several are in flight at once (never more than one
// when each key was waited for before the next was queued).
TEST_F(AttachTest, DeviceCopiesOfABatchAreQueuedBackToBack) {
  constexpr size_t kKeys = 8, kSize = 64 << 10;  // one chunk each
  std::string device_src(kKeys * kSize, 0), device_dst(kKeys * kSize, 0);
  std::mt19937_64 rng(5);
  for (char& c : device_src) c = static_cast<char>(rng());
  HostCopier::Faults faults;
  faults.max_delay_us = 2000;
  std::vector<HostCopier*> copiers;
  const GpuIo::Hooks hooks = DeviceHooks({&device_src, &device_dst}, &copiers, faults);
  GpuIo::SetHooksForTesting(&hooks);
  OpenOwner();
  std::vector<std::string> names;
  std::vector<ValueParts> values;
  std::vector<Destination> dests;
  for (size_t k = 0; k < kKeys; k++) {
    names.push_back("queued/" + std::to_string(k));
    values.push_back({Slice(device_src.data() + k * kSize, kSize)});
    dests.push_back({MutableSlice(device_dst.data() + k * kSize, kSize)});
  }
  const std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> r;
  std::unique_ptr<DB> writer, reader;  // a lane (and copier) each
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &writer).ok());
  ASSERT_TRUE(writer->BatchPut(WriteOptions(), keys, values, &r).ok());
  EXPECT_EQ(r, std::vector<int64_t>(kKeys, 0));
  for (size_t k = 0; k < kKeys; k++) {
    std::string v;
    ASSERT_TRUE(owner_->Get(ReadOptions(), keys[k], &v).ok());
    EXPECT_TRUE(v == device_src.substr(k * kSize, kSize)) << k;
  }
  ASSERT_EQ(copiers.size(), 1u);
  EXPECT_GE(copiers[0]->counters().max_in_flight, 2u);
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &reader).ok());
  ASSERT_TRUE(reader->BatchGetInto(ReadOptions(), keys, dests, &r).ok());
  EXPECT_EQ(r, std::vector<int64_t>(kKeys, static_cast<int64_t>(kSize)));
  EXPECT_TRUE(device_dst == device_src);
  ASSERT_EQ(copiers.size(), 2u);
  EXPECT_GE(copiers[1]->counters().max_in_flight, 2u);
  writer.reset();
  reader.reset();
  owner_.reset();
  GpuIo::SetHooksForTesting(nullptr);
}

// The client side of this process's connection to `socket` (the descriptor whose peer
// is bound to that path) and its inode, or -1.
int ClientSocketTo(const std::string& socket, ino_t* inode) {
  for (int fd = 0; fd < 4096; fd++) {
    sockaddr_un peer{};
    socklen_t len = sizeof(peer);
    struct stat st {};
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 &&
        peer.sun_family == AF_UNIX && socket == peer.sun_path && fstat(fd, &st) == 0) {
      *inode = st.st_ino;
      return fd;
    }
  }
  return -1;
}

// A put that loses its connection while device copies into its slots are in flight
// keeps the socket open until those copies are done: the owner gives a connection's
// slots to other values once its socket closes.  (Here the owner goes away during the
// first copy; the third is still running when the put has failed.)
TEST_F(AttachTest, LostConnectionClosesOnlyAfterItsDeviceCopies) {
  constexpr size_t kKeys = 4, kSize = 256 << 10;  // one chunk, one commit group each
  std::string device_src(kKeys * kSize, 0);
  std::mt19937_64 rng(9);
  for (char& c : device_src) c = static_cast<char>(rng());
  int client_fd = -1;
  ino_t client_inode = 0;
  std::atomic<bool> owner_closed{false}, late_copy_ran{false}, open_during_late_copy{false};
  HostCopier::Faults faults;
  faults.fail_complete = [&](const void*, const void* src, size_t) {
    const size_t key =
        static_cast<size_t>(static_cast<const char*>(src) - device_src.data()) / kSize;
    if (key == 0 && !owner_closed.exchange(true)) (void)owner_->Close();
    if (key == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      struct stat st {};
      open_during_late_copy = fstat(client_fd, &st) == 0 && st.st_ino == client_inode;
      late_copy_ran = true;
    }
    return false;
  };
  std::vector<HostCopier*> copiers;
  const GpuIo::Hooks hooks = DeviceHooks({&device_src}, &copiers, faults);
  GpuIo::SetHooksForTesting(&hooks);
  OpenOwner();
  Options client_options = ClientOptions();
  client_options.local_shared_channel = false;  // a send to the closed owner fails at once
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(client_options, socket_, &db).ok());
  client_fd = ClientSocketTo(socket_, &client_inode);
  ASSERT_GE(client_fd, 0);
  std::vector<std::string> names;
  std::vector<ValueParts> values;
  for (size_t k = 0; k < kKeys; k++) {
    names.push_back("lost/" + std::to_string(k));
    values.push_back({Slice(device_src.data() + k * kSize, kSize)});
  }
  const std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> r;
  Status s = db->BatchPut(WriteOptions(), keys, values, &r);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_TRUE(late_copy_ran.load());
  EXPECT_TRUE(open_during_late_copy.load()) << "the socket closed while a copy into a slot ran";
  db.reset();
  owner_.reset();
  GpuIo::SetHooksForTesting(nullptr);
}

TEST_F(AttachTest, AnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as nobody";
  OpenOwner();
  // The directory must be reachable by nobody for the refusal to come from the owner.
  chmod(dir_.path().c_str(), 0755);
  chmod(dir_.Sub("db").c_str(), 0755);
  chmod(socket_.c_str(), 0666);
  EXPECT_EQ(WaitExit(Spawn({"--nobody", socket_})), 0);
}

TEST_F(AttachTest, OpenOfAServedDirectoryAttaches) {
  OpenOwner();
  Options options = OwnerOptions("");
  std::unique_ptr<DB> db;
  Status s = DB::Open(options, dir_.Sub("db"), &db);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(db->Put(WriteOptions(), "via-open", "v").ok());
  std::string v;
  ASSERT_TRUE(owner_->Get(ReadOptions(), "via-open", &v).ok());
  EXPECT_EQ(v, "v");
  // Closed, the owner no longer records a socket: Open takes the directory itself.
  db.reset();
  ASSERT_TRUE(owner_->Close().ok());
  s = DB::Open(options, dir_.Sub("db"), &db);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// A socket path longer than sun_path (107 bytes: a DB in a deep directory) failed Open;
// it is now reached through its directory, for the owner and for clients.
TEST_F(AttachTest, SocketPathsLongerThanSunPathWork) {
  const std::string deep = dir_.Sub(std::string(60, 'd') + "/" + std::string(60, 'e'));
  std::filesystem::create_directories(deep);
  const std::string socket = deep + "/kv.sock";
  ASSERT_GT(socket.size(), 108u);
  Status s = DB::Open(OwnerOptions(socket), deep + "/db", &owner_);
  ASSERT_TRUE(s.ok()) << s.ToString();
  struct stat st;
  ASSERT_EQ(stat(socket.c_str(), &st), 0);  // the real file, where it was asked for
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  std::unique_ptr<DB> db;
  s = DB::Attach(ClientOptions(), socket, &db);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(db->Put(WriteOptions(), "deep", "v").ok());
  std::string v;
  ASSERT_TRUE(owner_->Get(ReadOptions(), "deep", &v).ok());
  EXPECT_EQ(v, "v");
  // A file name that does not fit even so is a clear error.
  std::unique_ptr<DB> none;
  s = DB::Attach(ClientOptions(), deep + "/" + std::string(120, 'n'), &none);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("longer than"), std::string::npos) << s.ToString();
}

TEST_F(AttachTest, OpenOfALockedDirectoryNotServedIsBusy) {
  Options options;
  options.apply_environment = false;
  options.ssd_capacity_bytes = 0;
  options.memory_capacity_bytes = 16ull << 20;
  options.prefault_memory = false;
  std::unique_ptr<DB> first, second;
  ASSERT_TRUE(DB::Open(options, dir_.Sub("db"), &first).ok());
  EXPECT_TRUE(DB::Open(options, dir_.Sub("db"), &second).IsBusy());
}

TEST_F(AttachTest, SocketFileIsPrivate) {
  OpenOwner();
  struct stat st;
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::unique_ptr<DB> db;
  EXPECT_TRUE(DB::Attach(ClientOptions(), dir_.Sub("nothing.sock"), &db).IsIOError());
}

// The owner serves the top of its stack: with peers (a ClusterDB under the OwnerDB), a
// key that only a peer holds reaches an attached client as it reaches the owner's own
// callers, read through the owner's ClusterDB into the client's staging slot.
TEST_F(AttachTest, AttachedClientReadsAKeyOnlyAPeerHolds) {
  const uint16_t owner_port = test::FreePort(), peer_port = test::FreePort();
  auto with_peer = [](Options o, uint16_t port, uint16_t peer) {
    o.listen = "127.0.0.1:" + std::to_string(port);
    o.peers = "127.0.0.1:" + std::to_string(peer);
    o.peer_mode = PeerMode::kReadThrough;
    o.peer_transport = PeerTransport::kTcp;
    o.peer_timeout_ms = 5000;
    return o;
  };
  std::unique_ptr<DB> peer;
  Status s = DB::Open(with_peer(OwnerOptions(""), peer_port, owner_port), dir_.Sub("peer"), &peer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = DB::Open(with_peer(OwnerOptions(socket_), owner_port, peer_port), dir_.Sub("db"), &owner_);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(peer->Put(WriteOptions(), "only-on-the-peer", "the peer's bytes").ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::string value;
  s = db->Get(ReadOptions(), "only-on-the-peer", &value);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(value, "the peer's bytes");
  EXPECT_TRUE(db->Get(ReadOptions(), "nowhere", &value).IsNotFound());
  ASSERT_TRUE(db->Close().ok());
  ASSERT_TRUE(owner_->Close().ok());
  ASSERT_TRUE(peer->Close().ok());
}

// The client's own checks of a call's input fail it with a Status that names the
// problem, as a DB opened in this process does, and send nothing for the key.
TEST_F(AttachTest, InputChecksOfTheClientNameTheProblem) {
  OpenOwner();
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  Status s = db->Put(WriteOptions(), "k", Slice(static_cast<const char*>(nullptr), 5));
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("value buffer 0 of key 'k' is null with length 5"), std::string::npos)
      << s.ToString();
  size_t size = 0;
  s = db->GetInto(ReadOptions(), "k", MutableSlice(nullptr, 8), &size);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("destination buffer 0 of key 'k' is null with length 8"),
            std::string::npos)
      << s.ToString();
  std::vector<int64_t> r;
  s = db->BatchPut(WriteOptions(), std::vector<Slice>{"d", "d"},
                   std::vector<ValueParts>{{"1"}, {"2"}}, &r);
  EXPECT_NE(s.ToString().find("key 'd' more than once"), std::string::npos) << s.ToString();
  EXPECT_TRUE(r.empty());
  // A key the owner refuses is named too, with the owner's kind of error.
  s = db->Put(WriteOptions(), "", "v");
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("put of key ''"), std::string::npos) << s.ToString();
  EXPECT_EQ(Stat(owner_.get(), "memory.items"), 0u);
}

// The owner's layer adds its server's counters to every stats property, its own and the
// one its clients read, and a DB that serves nobody reports none.
// Attaching processes beside a process of the same uid that misbehaves on the socket
// (`kind`, MisbehaveMain): every legitimate attach succeeds, each connection's handshake
// independent of the others'.  Returns the owner's log lines; *refused: its count of
// connections closed for not speaking the protocol (local.clients_malformed).
std::vector<std::string> AttachBesideMisbehaving(const std::string& dir, const std::string& socket,
                                                 const std::string& kind,
                                                 uint64_t* refused = nullptr) {
  std::vector<std::string> lines;
  std::mutex lines_mu;
  Options options = OwnerOptions(socket);
  options.log_level = LogLevel::kInfo;
  options.log_callback = [&](LogLevel, const std::string& line) {
    std::lock_guard<std::mutex> lock(lines_mu);
    lines.push_back(line);
  };
  std::unique_ptr<DB> owner;
  Status s = DB::Open(options, dir, &owner);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return lines;
  std::vector<pid_t> bad;
  std::thread killer;
  if (kind == "hang") {
    // Clients killed at random points of their handshake, one after another.
    killer = std::thread([&socket] {
      std::mt19937_64 rng(3);
      const auto end = Clock::now() + std::chrono::seconds(3);
      while (Clock::now() < end) {
        const pid_t pid = Spawn({"--misbehave", socket, "hang", "10", "1"});
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
        kill(pid, SIGKILL);
        WaitExit(pid);
      }
    });
  } else {
    for (int i = 0; i < 2; i++) {
      bad.push_back(Spawn({"--misbehave", socket, kind, "3", std::to_string(i + 1)}));
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the neighbours get going
  std::vector<pid_t> good;
  for (int i = 0; i < 3; i++) good.push_back(Spawn({"--attacher", socket, "100"}));
  for (pid_t pid : good) EXPECT_EQ(WaitExit(pid), 0) << "beside '" << kind << "'";
  for (pid_t pid : bad) WaitExit(pid);
  if (killer.joinable()) killer.join();
  if (refused != nullptr) *refused = Stat(owner.get(), "local.clients_malformed");
  EXPECT_TRUE(owner->Close().ok());
  std::lock_guard<std::mutex> lock(lines_mu);
  return lines;
}

int CountLines(const std::vector<std::string>& lines, const std::string& part) {
  return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.find(part) != std::string::npos;
  }));
}

TEST_F(AttachTest, GarbageOfAnotherClientBreaksNoAttach) {
  uint64_t refused = 0;
  const auto lines = AttachBesideMisbehaving(dir_.Sub("db"), socket_, "garbage", &refused);
  // Refused and counted, logged once per interval (the test is shorter than one).
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(CountLines(lines, "malformed handshake"), 1);
}

TEST_F(AttachTest, HalfOpenConnectionsBreakNoAttach) {
  AttachBesideMisbehaving(dir_.Sub("db"), socket_, "halfopen");
}

TEST_F(AttachTest, StalledRequestsBreakNoAttach) {
  AttachBesideMisbehaving(dir_.Sub("db"), socket_, "stall");
}

TEST_F(AttachTest, ClientsKilledMidHandshakeBreakNoAttach) {
  AttachBesideMisbehaving(dir_.Sub("db"), socket_, "hang");
}

TEST_F(AttachTest, StatsOfTheOwnerReportTheLocalCountersInEveryFormat) {
  OpenOwner();
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  ASSERT_TRUE(db->Put(WriteOptions(), "k", "v").ok());
  for (DB* reader : {owner_.get(), db.get()}) {
    EXPECT_EQ(Stat(reader, "local.clients_accepted"), 1u);
    EXPECT_EQ(Stat(reader, "local.shared_channels"), 1u);
    EXPECT_EQ(Stat(reader, "local.reserve_requests"), 1u);
    std::string json, prom;
    ASSERT_TRUE(reader->GetProperty("kvengine.stats.json", &json));
    std::string error;
    EXPECT_TRUE(test::JsonChecker::Valid(json, &error)) << error << "\n" << json;
    EXPECT_NE(json.find(",\"local\":{\"clients_accepted\":1,\"clients_refused\":0,"
                        "\"clients_over_budget\":0,\"clients_malformed\":0,\"reservations_"
                        "expired\":0,\"reserve_requests\":1,"
                        "\"spare_commits\":0,"
                        "\"shared_channels\":1,\"staging_windows\":1,"
                        "\"window_staged_values\":0,\"window_deferred_keys\":0,"
                        "\"group_loads\":0,\"namespace_refusals\":0}}"),
              std::string::npos)
        << json;
    ASSERT_TRUE(reader->GetProperty("kvengine.stats.prometheus", &prom));
    EXPECT_NE(prom.find("# HELP kvengine_local_clients_accepted_total Connections of attached "
                        "processes admitted.\n# TYPE kvengine_local_clients_accepted_total "
                        "counter\nkvengine_local_clients_accepted_total 1\n"),
              std::string::npos)
        << prom;
    EXPECT_NE(prom.find("\nkvengine_local_shared_channels_total 1\n"), std::string::npos) << prom;
  }
  Options plain = OwnerOptions("");
  std::unique_ptr<DB> alone;
  ASSERT_TRUE(DB::Open(plain, dir_.Sub("alone"), &alone).ok());
  std::string text, json, prom;
  ASSERT_TRUE(alone->GetProperty("kvengine.stats", &text));
  ASSERT_TRUE(alone->GetProperty("kvengine.stats.json", &json));
  ASSERT_TRUE(alone->GetProperty("kvengine.prometheus", &prom));
  EXPECT_EQ(text.find("local."), std::string::npos) << text;
  EXPECT_EQ(json.find("\"local\""), std::string::npos) << json;
  EXPECT_EQ(prom.find("kvengine_local_"), std::string::npos) << prom;
}

// Issue 50, item 2: an attached client's batches of values only on SSD, each larger than
// the whole arena, read as the same batches do in the owner's process -- every key,
// bit-exact (docs/attach.md, "Reading values that are not in memory").  The issue's
// figure scaled down by 4: a 16 MiB arena, 200 values of 256 KiB put through attach,
// then 16 BatchGetInto's of 96 random keys (24 MiB each).  Before the staging window,
// about half of the keys failed with NoSpace.
TEST_F(AttachTest, SsdBatchesLargerThanTheArenaReadAsInProcess) {
  OpenSsdOwner();
  constexpr size_t kSize = 256 << 10;
  const pid_t child =
      Spawn({"--ssd-reader", socket_, "-", "200", std::to_string(kSize), "16", "96", "7"});
  EXPECT_EQ(WaitExit(child), 0);
  // The owner's own read of such a batch, which the client's must match.
  std::vector<std::string> names;
  std::vector<Slice> keys;
  std::vector<char> buf(96 * kSize);
  std::vector<Destination> dest;
  for (int i = 0; i < 96; i++) names.push_back("ssd-" + std::to_string(i * 2));
  for (int i = 0; i < 96; i++) {
    keys.push_back(names[i]);
    dest.push_back({MutableSlice(buf.data() + i * kSize, kSize)});
  }
  std::vector<int64_t> r;
  ASSERT_TRUE(owner_->BatchGetInto(ReadOptions(), keys, dest, &r).ok());
  for (int i = 0; i < 96; i++) {
    ASSERT_EQ(r[i], static_cast<int64_t>(kSize)) << names[i];
    EXPECT_EQ(std::memcmp(buf.data() + i * kSize, SsdValue(names[i], kSize).data(), kSize), 0);
  }
  EXPECT_GT(Stat(owner_.get(), "local.window_staged_values"), 0u);
}

// The same reads in a namespace at its memory quota: staging them must neither fail for
// the quota (a read is not a put) nor push another namespace's values out of memory.
// Before the staging window a staged value was a reservation charged to the namespace,
// and the keys past its quota failed with NoSpace.
TEST_F(AttachTest, SsdReadsOfANamespaceAtItsQuotaNeitherFailNorEvictOthers) {
  OpenSsdOwner();
  constexpr size_t kSize = 256 << 10;
  NamespaceOptions quota;
  quota.memory_quota_bytes = 4ull << 20;
  std::unique_ptr<DB> tenant, other;
  ASSERT_TRUE(owner_->CreateNamespace("tenant", quota, &tenant).ok());
  ASSERT_TRUE(owner_->CreateNamespace("other", NamespaceOptions(), &other).ok());
  std::vector<std::string> names;
  for (int i = 0; i < 8; i++) {
    names.push_back("other-" + std::to_string(i));
    ASSERT_TRUE(other->Put(WriteOptions(), names.back(), SsdValue(names.back(), kSize)).ok());
  }
  // 64 values of 256 KiB (16 MiB, four times the quota), read 32 at a time (8 MiB).
  const pid_t child =
      Spawn({"--ssd-reader", socket_, "tenant", "64", std::to_string(kSize), "8", "32", "11"});
  EXPECT_EQ(WaitExit(child), 0);
  const std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> where;
  ASSERT_TRUE(other->BatchLocate(keys, &where).ok());
  for (size_t i = 0; i < names.size(); i++) {
    EXPECT_EQ(where[i], kLocatedMemory) << names[i] << " was pushed out of memory";
    std::string v;
    ASSERT_TRUE(other->Get(ReadOptions(), names[i], &v).ok());
    EXPECT_EQ(v, SsdValue(names[i], kSize));
  }
}

// ------------------------------------------------------------------ layer-wise loads

// A layer-wise load (DB::BatchGetIntoGroups) through attach, checked at every report:
// the groups reported, in order, and the keys of each group already read when it is.
struct GroupLoad {
  std::vector<std::string> names;
  std::vector<size_t> ends;
  std::vector<std::string> bufs;
  std::vector<int64_t> results;
  std::vector<size_t> reported;
  int unread_at_report = 0;  // keys of a reported group with no result yet

  Status Run(DB* db, size_t capacity) {
    std::vector<Slice> keys(names.begin(), names.end());
    bufs.assign(names.size(), std::string(capacity, '\0'));
    std::vector<Destination> dests;
    for (std::string& b : bufs) dests.push_back({MutableSlice(b.data(), b.size())});
    reported.clear();
    return db->BatchGetIntoGroups(
        ReadOptions(), keys, dests, ends,
        [&](size_t g) {
          reported.push_back(g);
          for (size_t i = g == 0 ? 0 : ends[g - 1]; i < ends[g]; i++) {
            unread_at_report += results[i] == 0;  // every value here is longer than 0
          }
        },
        &results);
  }
  void ExpectReportedInOrder() const {
    ASSERT_EQ(reported.size(), ends.size());
    for (size_t g = 0; g < ends.size(); g++) EXPECT_EQ(reported[g], g);
    EXPECT_EQ(unread_at_report, 0);
  }
};

// Issue #50 item 7: an attached client's layer-wise load is one PIN_GROUPS request per
// round of the owner's staging window, not a request per group, and reports each group
// in order once its bytes are in, bit-exact: 16 groups of 4 values of 512 KiB (32 MiB),
// half of them only on SSD, through an 8 MiB window.  An absent key, a buffer too small
// and empty groups among them; then one group of 64 keys, four times the window, which
// is read in rounds and reported once.
TEST_F(AttachTest, LayerwiseLoadIsOneRequestPerRoundInGroupOrder) {
  OpenSsdOwner();
  constexpr size_t kSize = 512 << 10;
  constexpr int kKeys = 64;
  std::vector<std::string> names;
  for (int i = 0; i < kKeys; i++) {
    names.push_back("layer" + std::to_string(i / 4) + "/block" + std::to_string(i % 4));
    ASSERT_TRUE(owner_->Put(WriteOptions(), names.back(), SsdValue(names.back(), kSize)).ok());
  }
  ASSERT_TRUE(owner_->Flush().ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  const uint64_t rounds_before = Stat(owner_.get(), "local.group_loads");
  GroupLoad load;
  load.names = names;
  load.names.insert(load.names.begin() + 9, "layer2/absent");
  for (int g = 0; g < kKeys / 4; g++) load.ends.push_back(4 * (g + 1) + (g >= 2 ? 1 : 0));
  load.ends.insert(load.ends.begin() + 5, load.ends[4]);  // an empty group
  load.ends.insert(load.ends.begin(), 0);                 // and one first
  ASSERT_TRUE(load.Run(db.get(), kSize).ok());
  ASSERT_EQ(load.results.size(), load.names.size());
  ASSERT_EQ(load.reported.size(), load.ends.size());
  for (size_t g = 0; g < load.ends.size(); g++) EXPECT_EQ(load.reported[g], g);
  for (size_t i = 0; i < load.names.size(); i++) {
    if (i == 9) {
      EXPECT_EQ(load.results[i], Status::NotFound("").ErrorCode());
      continue;
    }
    ASSERT_EQ(load.results[i], static_cast<int64_t>(kSize)) << load.names[i];
    EXPECT_EQ(load.bufs[i], SsdValue(load.names[i], kSize)) << load.names[i];
  }
  const uint64_t rounds = Stat(owner_.get(), "local.group_loads") - rounds_before;
  // About 16 MiB on SSD through an 8 MiB window: a few rounds, never one per group.
  EXPECT_GE(rounds, 2u);
  EXPECT_LE(rounds, 5u);
  EXPECT_GT(Stat(owner_.get(), "local.window_deferred_keys"), 0u);

  // A buffer too small fails its key alone.
  GroupLoad small;
  small.names = {names[0], names[40], names[41]};
  small.ends = {1, 3};
  std::vector<Slice> keys(small.names.begin(), small.names.end());
  std::string b0(kSize, '\0'), b1(kSize - 1, '\0'), b2(kSize, '\0');
  std::vector<Destination> dests{{MutableSlice(b0.data(), kSize)},
                                 {MutableSlice(b1.data(), kSize - 1)},
                                 {MutableSlice(b2.data(), kSize)}};
  std::vector<int64_t> r;
  ASSERT_TRUE(db->BatchGetIntoGroups(ReadOptions(), keys, dests, small.ends, nullptr, &r).ok());
  EXPECT_EQ(r, (std::vector<int64_t>{kSize, Status::BufferTooSmall("").ErrorCode(), kSize}));
  EXPECT_EQ(b2, SsdValue(names[41], kSize));

  // One group four times the window: read in rounds, reported once, whole.
  GroupLoad one;
  one.names = names;
  one.ends = {names.size()};
  ASSERT_TRUE(one.Run(db.get(), kSize).ok());
  one.ExpectReportedInOrder();
  for (size_t i = 0; i < names.size(); i++) {
    ASSERT_EQ(one.results[i], static_cast<int64_t>(kSize)) << names[i];
    EXPECT_EQ(one.bufs[i], SsdValue(names[i], kSize)) << names[i];
  }
  // Malformed groups are refused before anything is asked of the owner.
  const uint64_t asked = Stat(owner_.get(), "local.group_loads");
  for (const std::vector<size_t>& bad :
       {std::vector<size_t>{4, 2, names.size()}, std::vector<size_t>{4, 8}}) {
    GroupLoad refused = one;
    refused.ends = bad;
    EXPECT_TRUE(refused.Run(db.get(), kSize).IsInvalidArgument());
    EXPECT_TRUE(refused.reported.empty());
  }
  EXPECT_EQ(Stat(owner_.get(), "local.group_loads"), asked);
}

// An owner that does not announce PIN_GROUPS (one built before it) serves the same load
// the older way, one BatchGetInto per group, with the same reports and bytes.
TEST_F(AttachTest, LayerwiseLoadFromAnOwnerWithoutGroupsIsOneBatchPerGroup) {
  OpenSsdOwner();
  constexpr size_t kSize = 256 << 10;
  std::vector<std::string> names;
  for (int i = 0; i < 32; i++) {
    names.push_back("old/layer" + std::to_string(i / 4) + "/block" + std::to_string(i % 4));
    ASSERT_TRUE(owner_->Put(WriteOptions(), names.back(), SsdValue(names.back(), kSize)).ok());
  }
  ASSERT_TRUE(owner_->Flush().ok());
  for (const bool withheld : {true, false}) {
    SCOPED_TRACE(withheld ? "owner without kFeatureGroups" : "owner with it");
    LocalServer::WithholdFeaturesForTesting(withheld ? wire::kFeatureGroups : 0);
    std::unique_ptr<DB> db;
    ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
    LocalServer::WithholdFeaturesForTesting(0);
    const uint64_t before = Stat(owner_.get(), "local.group_loads");
    GroupLoad load;
    load.names = names;
    for (size_t g = 1; g <= 8; g++) load.ends.push_back(4 * g);
    ASSERT_TRUE(load.Run(db.get(), kSize).ok());
    load.ExpectReportedInOrder();
    for (size_t i = 0; i < names.size(); i++) {
      ASSERT_EQ(load.results[i], static_cast<int64_t>(kSize)) << names[i];
      EXPECT_EQ(load.bufs[i], SsdValue(names[i], kSize)) << names[i];
    }
    EXPECT_EQ(Stat(owner_.get(), "local.group_loads") - before, withheld ? 0u : 1u);
  }
}

// Values replaced (in place, of other sizes) and evicted while attached clients load
// them: every key reported read holds one whole value that was its own, never mixed or
// another key's bytes; the others fail (a miss, or a buffer too small).
TEST_F(AttachTest, LayerwiseLoadsOfValuesBeingReplacedNeverSeeWrongBytes) {
  OpenSsdOwner();
  constexpr size_t kCapacity = 384 << 10;
  std::vector<std::string> names;
  for (int i = 0; i < 48; i++)
    names.push_back("churn/L" + std::to_string(i / 6) + "/" + std::to_string(i % 6));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::mt19937_64 rng(11);
    while (!stop.load()) {
      const std::string& k = names[rng() % names.size()];
      const size_t size = 16 + rng() % (kCapacity + (64 << 10));  // some too large to read
      (void)owner_->Put(WriteOptions(), k, ValueFor(k, rng, size));
      if (rng() % 16 == 0) (void)owner_->Delete(WriteOptions(), k);
    }
  });
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  int read = 0;
  const auto end = Clock::now() + std::chrono::seconds(3);
  for (int n = 0; Clock::now() < end || n < 4; n++) {
    GroupLoad load;
    load.names = names;
    for (size_t g = 1; g <= 8; g++) load.ends.push_back(6 * g);
    ASSERT_TRUE(load.Run(db.get(), kCapacity).ok());
    ASSERT_EQ(load.reported.size(), load.ends.size());
    for (size_t i = 0; i < names.size(); i++) {
      const int64_t r = load.results[i];
      if (r < 0) {
        EXPECT_TRUE(r == Status::NotFound("").ErrorCode() ||
                    r == Status::BufferTooSmall("").ErrorCode())
            << names[i] << ": " << r;
        continue;
      }
      ASSERT_TRUE(ValueIsFor(names[i], load.bufs[i].data(), static_cast<size_t>(r)))
          << "wrong bytes for " << names[i] << " (" << r << " bytes)";
      read++;
    }
  }
  stop.store(true);
  writer.join();
  EXPECT_GT(read, 0);
}

// A layer-wise load into device buffers (the copier's queued copies delayed at random):
// each group's device copies are waited for before it is reported, so at on_ready(g)
// the device memory already holds group g's values, bit-exact; with values in memory
// (copied from the arena) and only on SSD (from the staging window).
TEST_F(AttachTest, LayerwiseLoadIntoDeviceBuffersReportsAGroupOnceItsCopiesAreDone) {
  constexpr size_t kSize = 192 << 10;
  constexpr int kKeys = 160;  // 30 MiB: about half of it only on SSD, through the window
  std::string device(kKeys * kSize, 0);
  HostCopier::Faults faults;
  faults.max_delay_us = 300;
  std::vector<HostCopier*> copiers;
  const GpuIo::Hooks hooks = DeviceHooks({&device}, &copiers, faults);
  GpuIo::SetHooksForTesting(&hooks);
  OpenSsdOwner();
  std::vector<std::string> names;
  for (int i = 0; i < kKeys; i++) {
    names.push_back("dev/L" + std::to_string(i / 4) + "/" + std::to_string(i % 4));
    ASSERT_TRUE(owner_->Put(WriteOptions(), names.back(), SsdValue(names.back(), kSize)).ok());
  }
  ASSERT_TRUE(owner_->Flush().ok());
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<Destination> dests;
  for (int i = 0; i < kKeys; i++) dests.push_back({MutableSlice(device.data() + i * kSize, kSize)});
  std::vector<size_t> ends;
  for (int g = 1; g <= kKeys / 4; g++) ends.push_back(4 * g);
  std::vector<int64_t> r;
  std::vector<size_t> reported;
  int wrong_at_report = 0;
  ASSERT_TRUE(db->BatchGetIntoGroups(
                    ReadOptions(), keys, dests, ends,
                    [&](size_t g) {
                      reported.push_back(g);
                      for (size_t i = 4 * g; i < 4 * g + 4; i++) {
                        wrong_at_report +=
                            r[i] != static_cast<int64_t>(kSize) ||
                            device.compare(i * kSize, kSize, SsdValue(names[i], kSize)) != 0;
                      }
                    },
                    &r)
                  .ok());
  EXPECT_EQ(reported.size(), ends.size());
  EXPECT_EQ(wrong_at_report, 0);
  EXPECT_GE(Stat(owner_.get(), "local.group_loads"), 2u);
  db.reset();
  owner_.reset();
  GpuIo::SetHooksForTesting(nullptr);
}

// A namespace's handle loads its own keys in groups (the owner maps them, and reads
// those only on SSD through the namespace's view); the default namespace's key of the
// same name is not what it reads.
TEST_F(AttachTest, LayerwiseLoadOfANamespaceReadsItsOwnKeys) {
  OpenSsdOwner();
  constexpr size_t kSize = 256 << 10;
  std::unique_ptr<DB> tenant;
  ASSERT_TRUE(owner_->CreateNamespace("tenant", NamespaceOptions(), &tenant).ok());
  std::vector<std::string> names;
  for (int i = 0; i < 96; i++) {  // 24 MiB: more than the memory tier
    names.push_back("t/L" + std::to_string(i / 8) + "/" + std::to_string(i % 8));
    ASSERT_TRUE(tenant->Put(WriteOptions(), names.back(), SsdValue(names.back(), kSize)).ok());
  }
  ASSERT_TRUE(owner_->Put(WriteOptions(), names[0], std::string(kSize, 'x')).ok());
  ASSERT_TRUE(owner_->Flush().ok());
  std::unique_ptr<DB> db, handle;
  ASSERT_TRUE(DB::Attach(ClientOptions(), socket_, &db).ok());
  ASSERT_TRUE(db->OpenNamespace("tenant", &handle).ok());
  GroupLoad load;
  load.names = names;
  for (size_t g = 1; g <= 12; g++) load.ends.push_back(8 * g);
  ASSERT_TRUE(load.Run(handle.get(), kSize).ok());
  load.ExpectReportedInOrder();
  for (size_t i = 0; i < names.size(); i++) {
    ASSERT_EQ(load.results[i], static_cast<int64_t>(kSize)) << names[i];
    EXPECT_EQ(load.bufs[i], SsdValue(names[i], kSize)) << names[i];
  }
  EXPECT_GE(Stat(owner_.get(), "local.group_loads"), 2u);
}

}  // namespace
}  // namespace kvengine

int main(int argc, char** argv) {
  if (argc >= 2) {
    const std::string mode = argv[1];
    if (mode == "--worker" && argc == 5) {
      return kvengine::WorkerMain(argv[2], std::stoull(argv[3]), std::stod(argv[4]));
    }
    if (mode == "--putter" && argc == 4) return kvengine::PutterMain(argv[2], std::stoull(argv[3]));
    if (mode == "--owner" && argc == 4) return kvengine::OwnerMain(argv[2], argv[3]);
    if (mode == "--nobody" && argc == 3) return kvengine::NobodyMain(argv[2]);
    if (mode == "--deaf" && argc == 3) return kvengine::DeafMain(argv[2]);
    if (mode == "--attacher" && argc == 4)
      return kvengine::AttacherMain(argv[2], std::stoi(argv[3]));
    if (mode == "--misbehave" && argc == 6) {
      return kvengine::MisbehaveMain(argv[2], argv[3], std::stod(argv[4]), std::stoull(argv[5]));
    }
    if (mode == "--ssd-reader" && argc == 9) {
      return kvengine::SsdReaderMain(argv[2], argv[3], std::stoi(argv[4]), std::stoull(argv[5]),
                                     std::stoi(argv[6]), std::stoi(argv[7]), std::stoull(argv[8]));
    }
    if (mode == "--threaded" && argc == 5) {
      return kvengine::ThreadedMain(argv[2], std::stoi(argv[3]), std::stod(argv[4]));
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
