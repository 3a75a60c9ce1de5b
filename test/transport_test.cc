// Transport logic without a network or a device: the wire format, endpoints, region
// bookkeeping, what `rdma` is, and the one-sided read validation protocol against an in-process
// "remote memory" that changes between the lookup and the read.
#include "kvengine/transport.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "kvengine/db.h"
#include "test/test_util.h"
#include "transport/frame_reader.h"
#include "transport/mr_table.h"
#include "transport/pending_get.h"
#include "transport/read_validation.h"
#include "transport/shm_channel.h"
#include "transport/socket_util.h"
#include "transport/ucx.h"
#include "transport/unix_socket.h"
#include "transport/wire.h"
#include "util/hash.h"

namespace kvengine {
namespace {

TEST(Wire, HeaderRoundTripAndChecks) {
  wire::FrameHeader h;
  h.op = wire::kGet;
  h.flags = wire::kFlagResponse;
  h.request_id = 0x1122334455667788ull;
  h.meta_len = 77;
  h.body_len = 1ull << 20;
  h.checksum = 42;
  char buf[wire::kHeaderSize];
  h.EncodeTo(buf);
  wire::FrameHeader d;
  ASSERT_TRUE(wire::FrameHeader::DecodeFrom(buf, &d).ok());
  EXPECT_EQ(d.op, h.op);
  EXPECT_EQ(d.flags, h.flags);
  EXPECT_EQ(d.request_id, h.request_id);
  EXPECT_EQ(d.meta_len, h.meta_len);
  EXPECT_EQ(d.body_len, h.body_len);
  EXPECT_EQ(d.checksum, h.checksum);
  char bad[wire::kHeaderSize];
  std::memcpy(bad, buf, sizeof(bad));
  bad[0] ^= 1;
  EXPECT_TRUE(wire::FrameHeader::DecodeFrom(bad, &d).IsCorruption());
  h.meta_len = wire::kMaxMetaLen + 1;
  h.EncodeTo(bad);
  EXPECT_TRUE(wire::FrameHeader::DecodeFrom(bad, &d).IsCorruption());
  h.meta_len = 1;
  h.op = 0;
  h.EncodeTo(bad);
  EXPECT_TRUE(wire::FrameHeader::DecodeFrom(bad, &d).IsCorruption());
  // An op this build does not know decodes: the server answers it NotSupported.
  h.op = 99;
  h.EncodeTo(bad);
  ASSERT_TRUE(wire::FrameHeader::DecodeFrom(bad, &d).ok());
  EXPECT_EQ(d.op, 99);
  // Random headers never crash the decoder.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; i++) {
    for (char& c : bad) c = static_cast<char>(rng());
    (void)wire::FrameHeader::DecodeFrom(bad, &d);
  }
}

TEST(Wire, UnhashedBodyFlagLeavesOnlyTheBodyOutOfTheChecksum) {
  wire::FrameHeader h;
  h.op = wire::kGet;
  h.meta_len = 3;
  h.body_len = 5;
  const std::string meta = "abc";
  const Slice body("hello");
  for (uint16_t flags : {uint16_t{0}, wire::kFlagBodyUnhashed}) {
    h.flags = wire::kFlagResponse | flags;
    char header[wire::kHeaderSize];
    h.EncodeTo(header);
    EXPECT_EQ(wire::BodyUnhashed(header), flags != 0);
    const uint64_t full = wire::FrameChecksum(header, meta, {&body, 1});
    const uint64_t without_body = wire::FrameChecksum(header, meta, {});
    EXPECT_EQ(full == without_body, flags != 0);
    // Header and metadata stay covered either way.
    EXPECT_NE(wire::FrameChecksum(header, "abd", {&body, 1}), full);
    char other[wire::kHeaderSize];
    std::memcpy(other, header, sizeof(other));
    other[8] ^= 1;  // the request id
    EXPECT_NE(wire::FrameChecksum(other, meta, {&body, 1}), full);
  }
}

TEST(Wire, KeysResultsAndLocations) {
  const std::string long_key(300, 'k');
  std::vector<Slice> keys = {"a", Slice("\0b", 2), long_key};
  uint64_t extra[] = {1, 2, 3};
  std::string meta;
  wire::PutKeys(&meta, keys, extra);
  std::string_view in(meta);
  std::vector<std::string_view> got;
  std::vector<uint64_t> got_extra;
  ASSERT_TRUE(wire::GetKeys(&in, &got, &got_extra));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1], std::string_view("\0b", 2));
  EXPECT_EQ(got[2].size(), 300u);
  EXPECT_EQ(got_extra[2], 3u);
  // Truncations are refused, never read past the end.
  for (size_t n = 0; n < meta.size(); n++) {
    std::string_view cut(meta.data(), n);
    EXPECT_FALSE(wire::GetKeys(&cut, &got, &got_extra)) << n;
  }
  std::vector<int64_t> results = {5, -1, kLookupPinned, kLookupNotPinned};
  std::vector<RemoteLocation> locs(4);
  locs[2] = {4096, 100, 9, 77};
  std::string enc;
  EncodeLocations(&enc, results, locs);
  std::string_view ein(enc);
  std::vector<int64_t> r2;
  std::vector<RemoteLocation> l2;
  ASSERT_TRUE(DecodeLocations(&ein, &r2, &l2));
  EXPECT_EQ(r2, results);
  EXPECT_EQ(l2[2].offset, 4096u);
  EXPECT_EQ(l2[2].lease, 77u);
}

TEST(Wire, DeleteMatchingRoundTripAndRefusals) {
  std::string meta;
  wire::PutDeleteMatching(&meta, wire::kMatchRegex, "req1/.*");
  std::string_view in(meta);
  wire::MatchMode mode;
  std::string_view pattern;
  ASSERT_TRUE(wire::GetDeleteMatching(&in, &mode, &pattern));
  EXPECT_EQ(mode, wire::kMatchRegex);
  EXPECT_EQ(pattern, "req1/.*");
  meta.clear();
  wire::PutDeleteMatching(&meta, wire::kMatchAll, "");
  in = meta;
  ASSERT_TRUE(wire::GetDeleteMatching(&in, &mode, &pattern));
  EXPECT_EQ(mode, wire::kMatchAll);
  EXPECT_TRUE(pattern.empty());
  // "All" with a pattern, an unknown mode, trailing bytes and truncations are refused.
  const auto refused = [&](const std::string& bytes) {
    std::string_view v(bytes);
    return !wire::GetDeleteMatching(&v, &mode, &pattern);
  };
  std::string all_with_pattern;
  wire::PutDeleteMatching(&all_with_pattern, wire::kMatchAll, "x");
  EXPECT_TRUE(refused(all_with_pattern));
  std::string bad_mode;
  wire::PutDeleteMatching(&bad_mode, static_cast<wire::MatchMode>(7), "x");
  EXPECT_TRUE(refused(bad_mode));
  std::string regex;
  wire::PutDeleteMatching(&regex, wire::kMatchRegex, "abc");
  EXPECT_TRUE(refused(regex + "!"));
  for (size_t n = 0; n < regex.size(); n++) EXPECT_TRUE(refused(regex.substr(0, n))) << n;
}

TEST(Wire, AuthProofDependsOnNonceAndToken) {
  const std::string n1(16, 'a'), n2(16, 'b');
  EXPECT_EQ(wire::AuthProof(n1, "tok"), wire::AuthProof(n1, "tok"));
  EXPECT_NE(wire::AuthProof(n1, "tok"), wire::AuthProof(n2, "tok"));
  EXPECT_NE(wire::AuthProof(n1, "tok"), wire::AuthProof(n1, "tok2"));
}

TEST(Endpoint, Parse) {
  Endpoint e;
  ASSERT_TRUE(Endpoint::Parse("127.0.0.1:7400", &e).ok());
  EXPECT_EQ(e.host, "127.0.0.1");
  EXPECT_EQ(e.port, 7400);
  EXPECT_TRUE(e.IsLoopback());
  ASSERT_TRUE(Endpoint::Parse("[::1]:80", &e).ok());
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.ToString(), "[::1]:80");
  ASSERT_TRUE(Endpoint::Parse("10.0.0.2:1", &e).ok());
  EXPECT_FALSE(e.IsLoopback());
  EXPECT_FALSE(Endpoint::Parse("nohost", &e).ok());
  EXPECT_FALSE(Endpoint::Parse("h:99999", &e).ok());
  EXPECT_FALSE(Endpoint::Parse("h:", &e).ok());
  // Hosts whose ToString would not parse back to them (found by the options fuzzer).
  EXPECT_FALSE(Endpoint::Parse("210.1:7980:1]:80", &e).ok());
  EXPECT_FALSE(Endpoint::Parse("[ a]:80", &e).ok());
  EXPECT_FALSE(Endpoint::Parse("a,b:80", &e).ok());
  std::vector<Endpoint> list;
  ASSERT_TRUE(Endpoint::ParseList("a:1, b:2,,", &list).ok());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1].ToString(), "b:2");
}

// ReadAhead hands out exactly the bytes asked for, in stream order, whether they come
// from what an earlier read brought ahead or from the socket, and hashes them alike.
TEST(ReadAhead, ReadsInStreamOrderAcrossWhatItReadAhead) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  std::mt19937_64 rng(3);
  std::string stream(3 * 6000 + 17, '\0');
  for (char& c : stream) c = static_cast<char>(rng());
  ASSERT_EQ(write(fds[1], stream.data(), stream.size()), static_cast<ssize_t>(stream.size()));
  ReadAhead reader(fds[0]);
  // Pieces of the sizes a client asks for: header, metadata, a body in two buffers.
  const std::vector<size_t> pieces = {40, 10, 3000, 2950, 40, 5960, 6000, 17};
  size_t at = 0;
  for (size_t piece : pieces) {
    std::string a(piece / 2, '\0'), b(piece - piece / 2, '\0');
    std::vector<iovec> iov{{a.data(), a.size()}, {b.data(), b.size()}};
    Hasher64 hasher;
    ASSERT_TRUE(reader.Read(&iov, DeadlineIn(1000), &hasher).ok()) << "at " << at;
    EXPECT_EQ(a + b, stream.substr(at, piece)) << "at " << at;
    Hasher64 expected;
    expected.Update(stream.data() + at, piece);
    EXPECT_EQ(hasher.Digest(), expected.Digest()) << "at " << at;
    at += piece;
  }
  EXPECT_EQ(reader.buffered(), 0u);
  // Nothing more: the deadline, then the end of the stream.
  char byte;
  std::vector<iovec> iov{{&byte, 1}};
  Status s = reader.Read(&iov, DeadlineIn(50), nullptr);
  EXPECT_TRUE(s.IsIOError() && s.message() == "receive timed out") << s.ToString();
  close(fds[1]);
  iov = {{&byte, 1}};
  s = reader.Read(&iov, DeadlineIn(1000), nullptr);
  EXPECT_TRUE(s.IsIOError() && s.message() == "connection closed by peer") << s.ToString();
  close(fds[0]);
}

// A small read brings what follows ahead, up to the buffer: the next small frame then
// needs no read of the socket.
TEST(ReadAhead, SmallFramesComeInOneRead) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  const std::string two = std::string(100, 'a') + std::string(100, 'b');
  ASSERT_EQ(write(fds[1], two.data(), two.size()), 200);
  ReadAhead reader(fds[0]);
  std::string got(100, '\0');
  std::vector<iovec> iov{{got.data(), got.size()}};
  ASSERT_TRUE(reader.Read(&iov, DeadlineIn(1000), nullptr).ok());
  EXPECT_EQ(got, std::string(100, 'a'));
  EXPECT_EQ(reader.buffered(), 100u);
  close(fds[1]);  // the second frame is already here
  iov = {{got.data(), got.size()}};
  ASSERT_TRUE(reader.Read(&iov, DeadlineIn(1000), nullptr).ok());
  EXPECT_EQ(got, std::string(100, 'b'));
  close(fds[0]);
}

// A connected loopback TCP pair: *client non-blocking and tuned as the transport's
// connections are, *server blocking (a test's writer).
bool TcpPair(int* client, int* server) {
  int listen_fd = -1;
  uint16_t port = 0;
  if (!ListenTcp(Endpoint{"127.0.0.1", 0}, &listen_fd, &port).ok()) return false;
  bool ok = ConnectTcp(Endpoint{"127.0.0.1", port}, DeadlineIn(2000), client).ok() &&
            WaitReadable(listen_fd, DeadlineIn(2000)).ok();
  *server = ok ? accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC) : -1;
  close(listen_fd);
  if (*server < 0) return false;
  TuneSocket(*server);
  return true;
}

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t k = write(fd, data, n);
    if (k <= 0) return false;
    data += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// A large read asks the kernel to wake it only once much of what it waits for is in
// (SO_RCVLOWAT).  The bytes still come whole and in order when they arrive in pieces
// with pauses, and the read leaves the socket waking on the first byte again: a wait
// for the next (small) frame right after must not sleep until its deadline.
TEST(ReadAhead, LargeReadInPiecesThenSmallFrameIsNotHeldBack) {
  int client = -1, server = -1;
  ASSERT_TRUE(TcpPair(&client, &server));
  std::mt19937_64 rng(5);
  std::string body(3 << 20, '\0');
  for (char& c : body) c = static_cast<char>(rng());
  const size_t tail = 512 << 10;  // the last wait is for all of it
  std::atomic<bool> body_read{false};
  std::thread writer([&] {
    for (size_t at = 0; at < body.size() - tail; at += 64 << 10) {
      ASSERT_TRUE(WriteAll(server, body.data() + at, 64 << 10));
      if (at % (512 << 10) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(WriteAll(server, body.data() + body.size() - tail, tail));
    while (!body_read.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(WriteAll(server, "next frame", 10));
  });
  ReadAhead reader(client);
  std::string got(body.size(), '\0');
  std::vector<iovec> iov;
  for (size_t at = 0; at < got.size(); at += 1 << 20) iov.push_back({&got[at], 1 << 20});
  Status s = reader.Read(&iov, DeadlineIn(10000), nullptr);
  body_read.store(true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == body);
  // As the client's reader waits for an answer's header (TcpConnection::ReadOneFrame).
  const auto start = std::chrono::steady_clock::now();
  s = WaitReadable(client, DeadlineIn(3000));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(MillisSince(start), 1500.0);
  char next[10];
  iov = {{next, sizeof(next)}};
  ASSERT_TRUE(reader.Read(&iov, DeadlineIn(1000), nullptr).ok());
  EXPECT_EQ(std::string(next, sizeof(next)), "next frame");
  writer.join();
  close(server);
  close(client);
}

// A peer that closes in the middle of a large read ends it at once, whatever the low
// water mark the read waits with.
TEST(ReadAhead, PeerClosingInTheMiddleOfALargeReadEndsItAtOnce) {
  int client = -1, server = -1;
  ASSERT_TRUE(TcpPair(&client, &server));
  const std::string part(200 << 10, 'x');
  std::thread writer([&] {
    ASSERT_TRUE(WriteAll(server, part.data(), part.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    close(server);
  });
  ReadAhead reader(client);
  std::string got(4 << 20, '\0');
  std::vector<iovec> iov{{got.data(), got.size()}};
  const auto start = std::chrono::steady_clock::now();
  Status s = reader.Read(&iov, DeadlineIn(5000), nullptr);
  EXPECT_TRUE(s.IsIOError() && s.message() == "connection closed by peer") << s.ToString();
  EXPECT_LT(MillisSince(start), 2500.0);
  writer.join();
  close(client);
}

// The server's FrameReader reads ahead of the frame at hand: frames pipelined in one
// write come out whole and in order, a body split between what was read ahead and the
// socket included, and the reader says when bytes wait in its buffer.
TEST(FrameReader, PipelinedFramesReadAheadComeOutWholeInOrder) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  std::mt19937_64 rng(4);
  std::string body(10000, '\0');
  for (char& c : body) c = static_cast<char>(rng());
  const Slice part(body);
  const std::vector<std::string> metas = {"get-keys", "put-keys", "unhashed-put-keys"};
  ASSERT_TRUE(SendFrame(fds[1], wire::kGet, 0, 1, metas[0], {}, DeadlineIn(1000)).ok());
  ASSERT_TRUE(SendFrame(fds[1], wire::kPut, 0, 2, metas[1], {&part, 1}, DeadlineIn(1000)).ok());
  ASSERT_TRUE(SendFrame(fds[1], wire::kPut, wire::kFlagBodyUnhashed, 3, metas[2], {&part, 1},
                        DeadlineIn(1000))
                  .ok());
  BodyPool pool(1 << 20);
  FrameReader reader;
  reader.AllowUnhashedBodies(true);
  for (uint64_t id = 1; id <= 3; id++) {
    FrameReader::Progress progress;
    ASSERT_TRUE(reader.ReadAvailable(fds[0], true, &pool, &progress).ok()) << id;
    ASSERT_EQ(progress, FrameReader::Progress::kComplete) << id;
    EXPECT_EQ(reader.header().request_id, id);
    EXPECT_EQ(reader.meta(), metas[id - 1]);
    if (id > 1) {
      ASSERT_EQ(reader.header().body_len, body.size());
      EXPECT_EQ(std::string(reader.body(), body.size()), body) << id;
    }
    if (id == 1) {
      EXPECT_GT(reader.buffered(), 0u);  // the put's first bytes came along
    }
    reader.Reset(&pool);
  }
  EXPECT_EQ(reader.buffered(), 0u);
  FrameReader::Progress progress;
  ASSERT_TRUE(reader.ReadAvailable(fds[0], true, &pool, &progress).ok());
  EXPECT_EQ(progress, FrameReader::Progress::kNone);
  // A frame whose metadata is damaged is refused, read ahead or not.
  std::string bad(wire::kHeaderSize + 4, '\0');
  wire::FrameHeader h;
  h.op = wire::kExists;
  h.request_id = 4;
  h.meta_len = 4;
  h.EncodeTo(bad.data());
  h.checksum = wire::FrameChecksum(bad.data(), "keys", {});
  h.EncodeTo(bad.data());
  bad.replace(wire::kHeaderSize, 4, "kexs");
  ASSERT_EQ(write(fds[1], bad.data(), bad.size()), static_cast<ssize_t>(bad.size()));
  Status s = reader.ReadAvailable(fds[0], true, &pool, &progress);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  close(fds[0]);
  close(fds[1]);
}

// Loopback is decided on the addresses a host resolves to, every one of them: a name
// that merely starts with "127." may resolve anywhere (or nowhere).
// A Unix listener whose queue of connections not yet accepted is full: ConnectUnix waits
// for room until its deadline and then fails naming it, never handing back a socket that
// is not connected (whose first recvmsg failed with EINVAL: issue 30); once the listener
// accepts, the waiting connect completes.
TEST(UnixSocket, ConnectToAFullQueueWaitsForRoomOrFails) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  const std::string path = dir.Sub("s.sock");
  int listener = -1;
  ASSERT_TRUE(ListenUnix(path, 0600, "", &listener).ok());
  std::vector<int> queued;  // fills the queue: nobody accepts them
  for (;;) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ASSERT_EQ(errno, EAGAIN);
      close(fd);
      break;
    }
    queued.push_back(fd);
    ASSERT_LT(queued.size(), 100000u);
  }
  int fd = -1;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = ConnectUnix(path, DeadlineIn(300), &fd);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.ToString().find("stayed full"), std::string::npos) << s.ToString();
  EXPECT_EQ(fd, -1);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  // A listener that is alive with a full queue is not taken for a dead owner's file.
  int second = -1;
  EXPECT_TRUE(ListenUnix(path, 0600, "", &second).IsBusy());
  // Room made while a connect waits: it completes, connected.
  std::thread acceptor([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int accepted = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    EXPECT_GE(accepted, 0);
    if (accepted >= 0) close(accepted);
  });
  s = ConnectUnix(path, DeadlineIn(5000), &fd);
  acceptor.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  sockaddr_un peer{};
  socklen_t len = sizeof(peer);
  EXPECT_EQ(getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len), 0) << strerror(errno);
  close(fd);
  for (int q : queued) close(q);
  close(listener);
}

TEST(Endpoint, LoopbackDecidedByResolvedAddresses) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "localhost"}) {
    EXPECT_TRUE((Endpoint{host, 7400}.IsLoopback())) << host;
  }
  for (const char* host : {"127.example.invalid", "127.0.0.1.example.invalid", "0.0.0.0",
                           "::", "10.0.0.2", "::ffff:10.0.0.2"}) {
    EXPECT_FALSE((Endpoint{host, 7400}.IsLoopback())) << host;
  }
  // Serving on such a name without a token is refused before anything listens.
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 16 << 20;
  o.prefault_memory = false;
  o.ssd_capacity_bytes = 0;
  o.log_level = LogLevel::kOff;
  o.peer_transport = PeerTransport::kTcp;
  o.listen = "127.example.invalid:0";
  test::TempDir dir;
  std::unique_ptr<DB> db;
  Status s = DB::Open(o, dir.path(), &db);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("requires peer_auth_token_file"), std::string::npos) << s.ToString();
}

TEST(MrTable, RegionBookkeeping) {
  MrTable t;
  std::vector<char> mem(1 << 16);
  int h1 = 0, h2 = 0, h3 = 0;
  MrTable::Region a{reinterpret_cast<uintptr_t>(mem.data()), 4096, &h1};
  MrTable::Region b{reinterpret_cast<uintptr_t>(mem.data() + 8192), 4096, &h2};
  ASSERT_TRUE(t.Add(a).ok());
  ASSERT_TRUE(t.Add(b).ok());
  MrTable::Region overlap{reinterpret_cast<uintptr_t>(mem.data() + 4000), 200, &h3};
  EXPECT_TRUE(t.Add(overlap).IsInvalidArgument());
  EXPECT_TRUE(t.Add({reinterpret_cast<uintptr_t>(mem.data() + 20000), 0, &h3}).IsInvalidArgument());
  MrTable::Region found;
  ASSERT_TRUE(t.Find(mem.data() + 100, 200, &found));
  EXPECT_EQ(found.handle, &h1);
  ASSERT_TRUE(t.Find(mem.data() + 8192, 4096, &found));
  EXPECT_EQ(found.handle, &h2);
  EXPECT_FALSE(t.Find(mem.data() + 4000, 200, &found));  // crosses the end of a
  EXPECT_FALSE(t.Find(mem.data() + 5000, 10, &found));   // between regions
  MrTable::Region removed;
  ASSERT_TRUE(t.Remove(mem.data(), &removed));
  EXPECT_EQ(removed.handle, &h1);
  EXPECT_FALSE(t.Find(mem.data() + 100, 1, &found));
  EXPECT_EQ(t.size(), 1u);
}

// `rdma` is UCX restricted to its RDMA transports (the verbs transport was retired):
// here, with no RDMA device, NotSupported saying what it is and what to use instead.
TEST(Rdma, IsUcxOverItsRdmaTransports) {
  std::unique_ptr<Transport> t;
  Status s = Transport::Create("rdma", TransportOptions(), &t);
#ifdef KV_WITH_UCX
  if (s.ok()) {  // a machine with an RDMA device
    EXPECT_STREQ(t->Name(), "ucx");
  } else {
    EXPECT_TRUE(s.IsNotSupported()) << s.ToString();
    EXPECT_NE(s.ToString().find(kUcxRdmaTransports), std::string::npos) << s.ToString();
    EXPECT_NE(s.ToString().find("'ucx' or 'auto'"), std::string::npos) << s.ToString();
  }
  ASSERT_TRUE(Transport::Create("auto", TransportOptions(), &t).ok());
  EXPECT_STREQ(t->Name(), "ucx");  // UCX first (it reaches RDMA devices too)
#else
  EXPECT_TRUE(s.IsNotSupported()) << s.ToString();
  EXPECT_NE(s.ToString().find("libucx-dev"), std::string::npos) << s.ToString();
  ASSERT_TRUE(Transport::Create("auto", TransportOptions(), &t).ok());
  EXPECT_STREQ(t->Name(), "tcp");
#endif
}

// ---------------------------------------------------------------- read validation
TEST(LeaseTable, GrantReleaseExpire) {
  auto now = std::chrono::steady_clock::now();
  LeaseTable table(std::chrono::milliseconds(100), [&] { return now; });
  auto pin = std::make_shared<int>(1);
  const uint64_t a = table.Grant(pin);
  const uint64_t b = table.Grant(pin);
  EXPECT_EQ(pin.use_count(), 3);
  EXPECT_TRUE(table.Release(a));
  EXPECT_FALSE(table.Release(a));  // twice
  now += std::chrono::milliseconds(150);
  EXPECT_EQ(table.ReapExpired(), 1u);
  EXPECT_FALSE(table.Release(b));  // reaped: the read it covered is not trusted
  EXPECT_EQ(pin.use_count(), 1);
  EXPECT_FALSE(table.Release(12345));
}

// Granting reaps only what expired, not the whole table: a LOOKUP naming one key 200k
// times grants 200k leases in milliseconds (it rescanned every lease per grant).
TEST(LeaseTable, ManyGrantsTakeLinearTime) {
  auto now = std::chrono::steady_clock::now();
  LeaseTable table(std::chrono::milliseconds(100), [&] { return now; });
  auto pin = std::make_shared<int>(1);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200000; i++) table.Grant(pin);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(table.size(), 200000u);
  now += std::chrono::milliseconds(50);
  const uint64_t late = table.Grant(pin);  // expires 50 ms after the others
  now += std::chrono::milliseconds(60);
  EXPECT_EQ(table.ReapExpired(), 200000u);
  EXPECT_TRUE(table.Release(late));
  EXPECT_EQ(pin.use_count(), 1);
}

// An owner's arena in this process: fixed slots, values immutable in place, a slot
// reused only when no key maps to it and no pin holds it -- the memory tier's rules.
class FakeOwner final : public RemoteMemory {
 public:
  static constexpr size_t kSlot = 4096, kSlots = 16;
  FakeOwner()
      : arena_(kSlot * kSlots),
        pins_(kSlots, 0),
        leases_(std::chrono::milliseconds(50), [this] { return now_; }) {}

  void Put(const std::string& key, const std::string& value) {
    auto it = map_.find(key);
    const int slot = FreeSlot();
    ASSERT_GE(slot, 0) << "arena full";
    std::memcpy(&arena_[slot * kSlot], value.data(), value.size());
    const Entry e{static_cast<size_t>(slot), value.size(), ++version_};
    if (it != map_.end()) {
      it->second = e;
    } else {
      map_[key] = e;
    }
  }
  void Erase(const std::string& key) { map_.erase(key); }
  // Lets every lease lapse (the client stalled past the time to live).
  void ExpireLeases() {
    now_ += std::chrono::milliseconds(100);
    leases_.ReapExpired();
  }
  // Overwrites every free slot with garbage, as new puts would.
  void ScribbleFreeSlots() {
    for (size_t s = 0; s < kSlots; s++) {
      if (!Mapped(s) && pins_[s] == 0) std::memset(&arena_[s * kSlot], 0xEE, kSlot);
    }
  }

  std::function<void()> between;  // runs after the lookup, before the reads
  int lookups = 0;

  Status Lookup(std::span<const Slice> keys, std::vector<int64_t>* results,
                std::vector<RemoteLocation>* locations) override {
    lookups++;
    results->assign(keys.size(), 0);
    locations->assign(keys.size(), RemoteLocation());
    for (size_t i = 0; i < keys.size(); i++) {
      auto it = map_.find(std::string(keys[i].view()));
      if (it == map_.end()) {
        (*results)[i] = Status::NotFound("").ErrorCode();
        continue;
      }
      const Entry e = it->second;
      pins_[e.slot]++;
      std::shared_ptr<void> pin(nullptr, [this, s = e.slot](void*) { pins_[s]--; });
      (*locations)[i] = {e.slot * kSlot, e.size, e.version, leases_.Grant(std::move(pin))};
      (*results)[i] = kLookupPinned;
    }
    return Status::OK();
  }
  Status Read(std::span<RemoteRead> reads) override {
    if (between) between();
    for (RemoteRead& r : reads) std::memcpy(r.local, &arena_[r.remote_offset], r.length);
    return Status::OK();
  }
  Status Release(std::span<const uint64_t> leases, std::vector<uint8_t>* held) override {
    held->clear();
    for (uint64_t l : leases) held->push_back(leases_.Release(l));
    return Status::OK();
  }

 private:
  struct Entry {
    size_t slot;
    size_t size;
    uint64_t version;
  };
  bool Mapped(size_t s) const {
    for (const auto& [k, e] : map_) {
      if (e.slot == s) return true;
    }
    return false;
  }
  int FreeSlot() const {
    for (size_t s = 0; s < kSlots; s++) {
      if (!Mapped(s) && pins_[s] == 0) return static_cast<int>(s);
    }
    return -1;
  }

  std::vector<char> arena_;
  std::vector<int> pins_;
  std::chrono::steady_clock::time_point now_ = std::chrono::steady_clock::now();
  LeaseTable leases_;
  std::map<std::string, Entry> map_;
  uint64_t version_ = 0;
};

struct Buffers {
  explicit Buffers(size_t n) : a(n / 3), b(n - n / 3) {}
  Destination dest() {
    return {MutableSlice(a.data(), a.size()), MutableSlice(b.data(), b.size())};
  }
  std::string joined(size_t size) const {
    std::string s(a.begin(), a.end());
    s.append(b.begin(), b.end());
    return s.substr(0, size);
  }
  std::vector<char> a, b;
};

TEST(ValidatedReader, ReadsIntoScatteredBuffers) {
  FakeOwner owner;
  owner.Put("k1", std::string(3000, 'x'));
  owner.Put("k2", "hello");
  ValidatedReader reader(&owner);
  Buffers b1(4096), b2(4096), b3(4096);
  std::vector<Slice> keys = {"k1", "k2", "nope"};
  std::vector<Destination> dests = {b1.dest(), b2.dest(), b3.dest()};
  std::vector<int64_t> results;
  ASSERT_TRUE(reader.BatchGet(keys, dests, &results).ok());
  EXPECT_EQ(results[0], 3000);
  EXPECT_EQ(b1.joined(3000), std::string(3000, 'x'));
  EXPECT_EQ(results[1], 5);
  EXPECT_EQ(b2.joined(5), "hello");
  EXPECT_EQ(results[2], Status::NotFound("").ErrorCode());
  Buffers small(4);
  std::vector<Destination> tiny = {small.dest()};
  ASSERT_TRUE(reader.BatchGet(std::span<const Slice>(&keys[0], 1), tiny, &results).ok());
  EXPECT_EQ(results[0], Status::BufferTooSmall("").ErrorCode());
}

TEST(ValidatedReader, OverwriteDuringReadReturnsTheWholeOldValue) {
  FakeOwner owner;
  owner.Put("k", std::string(4000, 'A'));
  // Between lookup and read the owner overwrites and deletes: the pinned old bytes stay
  // put, so the read returns the complete value that existed at lookup, never a mix.
  owner.between = [&] {
    owner.Put("k", std::string(4000, 'B'));
    owner.Erase("k");
    owner.Put("other", std::string(4000, 'C'));
    owner.ScribbleFreeSlots();
  };
  ValidatedReader reader(&owner);
  Buffers b(4096);
  std::vector<Slice> keys = {"k"};
  std::vector<Destination> dests = {b.dest()};
  std::vector<int64_t> results;
  ASSERT_TRUE(reader.BatchGet(keys, dests, &results).ok());
  EXPECT_EQ(results[0], 4000);
  EXPECT_EQ(b.joined(4000), std::string(4000, 'A'));
  EXPECT_EQ(reader.retries(), 0u);
}

TEST(ValidatedReader, LapsedLeaseIsDetectedAndRetried) {
  FakeOwner owner;
  owner.Put("k", std::string(4000, 'A'));
  int round = 0;
  // First round: the client stalls past the lease, the owner overwrites the key and
  // reuses the freed room -- the read sees garbage.  Validation must catch it.
  owner.between = [&] {
    if (round++ > 0) return;
    owner.ExpireLeases();
    owner.Put("k", std::string(4000, 'N'));
    owner.ScribbleFreeSlots();
  };
  ValidatedReader reader(&owner);
  Buffers b(4096);
  std::vector<Slice> keys = {"k"};
  std::vector<Destination> dests = {b.dest()};
  std::vector<int64_t> results;
  ASSERT_TRUE(reader.BatchGet(keys, dests, &results).ok());
  EXPECT_EQ(results[0], 4000);
  EXPECT_EQ(b.joined(4000), std::string(4000, 'N'));  // the new value, whole
  EXPECT_EQ(reader.retries(), 1u);
  EXPECT_EQ(owner.lookups, 2);
}

TEST(ValidatedReader, LeaseThatAlwaysLapsesFailsTheKey) {
  FakeOwner owner;
  owner.Put("k", std::string(100, 'A'));
  owner.Put("ok", std::string(100, 'B'));
  owner.between = [&] {
    owner.ExpireLeases();
    owner.ScribbleFreeSlots();
  };
  ValidatedReader reader(&owner, 3);
  Buffers b(4096);
  std::vector<Slice> keys = {"k"};
  std::vector<Destination> dests = {b.dest()};
  std::vector<int64_t> results;
  ASSERT_TRUE(reader.BatchGet(keys, dests, &results).ok());
  EXPECT_EQ(results[0], Status::Aborted("").ErrorCode());
  EXPECT_EQ(owner.lookups, 3);
}

// ---------------------------------------------------------------- shared channel
// Both ends of an attached connection's shared channel (transport/shm_channel.h) in one
// process: a real socket pair and a real shared region, one thread per side.
class ShmChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds_), 0);
    ASSERT_TRUE(ShmChannel::Create(fds_[0], kBusyPollUs, &owner_, &memfd_).ok());
    ASSERT_TRUE(ShmChannel::Attach(memfd_, fds_[1], kBusyPollUs, &client_).ok());
  }
  void TearDown() override {
    owner_.reset();
    client_.reset();
    if (memfd_ >= 0) close(memfd_);
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  // Waits for and reads a frame on `ch`.
  // spin=false: asleep on the socket at once, marked as waiting for a frame.
  static Status Receive(ShmChannel* ch, uint64_t ms, wire::FrameHeader* h, std::string* meta,
                        bool spin = true) {
    bool arrived = false;
    Status s = ch->WaitForFrame(0, DeadlineIn(ms), nullptr, spin, &arrived);
    if (s.ok() && !arrived) return Status::IOError("nothing arrived");
    return s.ok() ? ch->ReadFrame(DeadlineIn(ms), h, meta) : s;
  }

  static constexpr uint64_t kBusyPollUs = 50;
  int fds_[2] = {-1, -1};
  int memfd_ = -1;
  std::unique_ptr<ShmChannel> owner_, client_;
};

TEST_F(ShmChannelTest, FramesOfAnySizeGoBothWaysInOrder) {
  std::mt19937_64 rng(3);
  // Frames larger than a ring stream through it while the other side reads.
  const std::vector<size_t> sizes{0,
                                  1,
                                  100,
                                  ShmChannel::kRingBytes - 40,
                                  ShmChannel::kRingBytes,
                                  3 * ShmChannel::kRingBytes + 17,
                                  5000};
  std::vector<std::string> metas;
  for (size_t n : sizes) metas.push_back(test::MakeValue(rng(), n));
  // Request and answer in step, as an attached connection uses it.
  std::thread client([&] {
    for (size_t i = 0; i < metas.size(); i++) {
      ASSERT_TRUE(client_->SendFrame(wire::kPin, 0, i + 1, metas[i], DeadlineIn(5000)).ok());
      wire::FrameHeader h;
      std::string meta;
      ASSERT_TRUE(Receive(client_.get(), 5000, &h, &meta).ok()) << i;
      EXPECT_EQ(h.flags, wire::kFlagResponse);
      EXPECT_EQ(h.request_id, i + 1);
      EXPECT_EQ(meta, metas[i]) << i;
    }
  });
  for (size_t i = 0; i < metas.size(); i++) {
    wire::FrameHeader h;
    std::string meta;
    ASSERT_TRUE(Receive(owner_.get(), 5000, &h, &meta).ok()) << i;
    EXPECT_EQ(h.op, wire::kPin);
    EXPECT_EQ(h.request_id, i + 1);
    EXPECT_EQ(meta, metas[i]) << i;
    ASSERT_TRUE(
        owner_->SendFrame(wire::kPin, wire::kFlagResponse, i + 1, meta, DeadlineIn(5000)).ok());
  }
  client.join();
}

// With spinning off, every wait sleeps on the socket: the doorbell must wake it.
TEST_F(ShmChannelTest, SleepingSideIsWokenByTheDoorbell) {
  std::unique_ptr<ShmChannel> sleeper;
  ASSERT_TRUE(ShmChannel::Attach(memfd_, fds_[1], 0, &sleeper).ok());
  client_.reset();
  int slow = 0;  // rounds that took as long as a lost wake-up would
  for (int i = 0; i < 200; i++) {
    std::thread owner([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(i % 7 == 0 ? 2000 : 0));
      ASSERT_TRUE(
          owner_->SendFrame(wire::kPin, wire::kFlagResponse, i, "x", DeadlineIn(2000)).ok());
    });
    const auto t0 = std::chrono::steady_clock::now();
    wire::FrameHeader h;
    std::string meta;
    ASSERT_TRUE(Receive(sleeper.get(), 5000, &h, &meta).ok()) << i;
    owner.join();
    EXPECT_EQ(h.request_id, static_cast<uint64_t>(i));
    // A lost wake-up costs the sleeper's slice (100 ms); a busy machine may delay a
    // rare round as long, a lost doorbell every round whose frame came 2 ms late.
    if (std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(80)) slow++;
  }
  EXPECT_LE(slow, 5);
}

// Freed room is news only to a side waiting for room: a side asleep waiting for a frame
// is not woken each time its peer reads one.  It was, and every such doorbell cost the
// reader a system call (an attached get's client reading its PIN answers while the
// owner slept waiting for the next request).
TEST_F(ShmChannelTest, ReadingDoesNotWakeAPeerThatWaitsForAFrame) {
  constexpr int kFrames = 20;
  for (int i = 0; i < kFrames; i++) {
    ASSERT_TRUE(
        owner_->SendFrame(wire::kPin, wire::kFlagResponse, i + 1, "answer", DeadlineIn(2000)).ok());
  }
  std::atomic<bool> got{false};
  std::thread owner([&] {
    wire::FrameHeader h;
    std::string meta;
    ASSERT_TRUE(Receive(owner_.get(), 10000, &h, &meta, /*spin=*/false).ok());
    EXPECT_EQ(meta, "request");
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const uint64_t before = client_->wakeups_sent();
  for (int i = 0; i < kFrames; i++) {
    wire::FrameHeader h;
    std::string meta;
    ASSERT_TRUE(Receive(client_.get(), 2000, &h, &meta).ok()) << i;
    EXPECT_EQ(h.request_id, static_cast<uint64_t>(i + 1));
  }
  EXPECT_EQ(client_->wakeups_sent(), before);
  // A frame is what it waits for: that one wakes it, once.
  ASSERT_TRUE(client_->SendFrame(wire::kPin, 0, 99, "request", DeadlineIn(2000)).ok());
  EXPECT_EQ(client_->wakeups_sent(), before + 1);
  owner.join();
  EXPECT_TRUE(got);
}

// Frames sent together are published together: a sleeping peer is woken once for all.
TEST_F(ShmChannelTest, FramesSentTogetherWakeThePeerOnce) {
  std::thread owner([&] {
    for (int i = 0; i < 8; i++) {
      wire::FrameHeader h;
      std::string meta;
      ASSERT_TRUE(Receive(owner_.get(), 10000, &h, &meta, /*spin=*/false).ok());
      EXPECT_EQ(h.request_id, static_cast<uint64_t>(i + 1));
      EXPECT_EQ(meta, std::string(i * 1000, 'a' + i));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<std::string> metas;
  for (int i = 0; i < 8; i++) metas.push_back(std::string(i * 1000, 'a' + i));
  std::vector<ShmChannel::OutFrame> frames;
  for (int i = 0; i < 8; i++) frames.push_back({wire::kPin, 0, uint64_t(i + 1), &metas[i]});
  ASSERT_TRUE(client_->SendFrames(frames, DeadlineIn(2000)).ok());
  EXPECT_EQ(client_->wakeups_sent(), 1u);
  owner.join();
  // Metadata too large is refused before anything is written.
  const std::string huge(wire::kMaxMetaLen + 1, 'x');
  frames = {{wire::kPin, 0, 9, &metas[1]}, {wire::kPin, 0, 10, &huge}};
  EXPECT_TRUE(client_->SendFrames(frames, DeadlineIn(2000)).IsInvalidArgument());
  bool arrived = true;
  ASSERT_TRUE(owner_->WaitForFrame(0, DeadlineIn(20), nullptr, false, &arrived).ok());
  EXPECT_FALSE(arrived);
}

TEST_F(ShmChannelTest, PeerThatDiesWakesTheWaiterWithAnError) {
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    shutdown(fds_[1], SHUT_RDWR);  // what the kernel does when the client process dies
  });
  const auto t0 = std::chrono::steady_clock::now();
  bool arrived = true;
  Status s = owner_->WaitForFrame(0, DeadlineIn(10000), nullptr, true, &arrived);
  closer.join();
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST_F(ShmChannelTest, RegionCannotBeResized) {
  // A client that could shrink the memfd would make the owner fault on its mapping.
  EXPECT_NE(ftruncate(memfd_, 4096), 0);
  EXPECT_NE(ftruncate(memfd_, 64 << 20), 0);
}

TEST_F(ShmChannelTest, GarbageInTheRegionIsAnErrorNeverACrashOrAHang) {
  struct stat st;
  ASSERT_EQ(fstat(memfd_, &st), 0);
  char* region = static_cast<char*>(mmap(nullptr, static_cast<size_t>(st.st_size),
                                         PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0));
  ASSERT_NE(region, MAP_FAILED);
  std::mt19937_64 rng(11);
  for (int round = 0; round < 20; round++) {
    // A client writes anything anywhere, counters included.
    for (off_t i = 0; i < st.st_size; i += 1 + static_cast<off_t>(rng() % 61)) {
      region[i] = static_cast<char>(rng());
    }
    wire::FrameHeader h;
    std::string meta;
    bool arrived = false;
    Status s = owner_->WaitForFrame(0, DeadlineIn(200), nullptr, true, &arrived);
    if (s.ok() && arrived) s = owner_->ReadFrame(DeadlineIn(200), &h, &meta);
    EXPECT_FALSE(s.ok() && arrived && round == 0) << "garbage read as a frame";
    if (!s.ok()) break;  // the owner closes such a connection
  }
  munmap(region, static_cast<size_t>(st.st_size));
}

// A transport whose BatchGet of a group waits until the test opens that group's gate,
// then writes the key itself as the value: StartGroupsInTurnOnAThread's reads seen from
// outside.
class GatedTransport final : public Transport {
 public:
  const char* Name() const override { return "gated"; }
  Status RegisterMemory(void*, size_t, const char*) override { return Status::OK(); }
  void UnregisterMemory(void*, size_t) override {}
  std::shared_ptr<MemoryRegistrar> registrar() override { return nullptr; }
  Status BatchGet(const Endpoint&, std::span<const Slice> keys, std::span<const Destination> dests,
                  std::vector<int64_t>* results) override {
    std::unique_lock<std::mutex> lock(mu_);
    const int call = calls_++;
    cv_.wait(lock, [&] { return open_ > call; });
    results->assign(keys.size(), 0);
    for (size_t i = 0; i < keys.size(); i++) {
      memcpy(dests[i][0].data(), keys[i].data(), keys[i].size());
      (*results)[i] = static_cast<int64_t>(keys[i].size());
    }
    return Status::OK();
  }
  void Open(int gates) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = gates;
    cv_.notify_all();
  }
  Status BatchGetOwned(const Endpoint&, std::span<const Slice>, std::vector<std::string>*,
                       std::vector<int64_t>*) override {
    return Status::NotSupported("");
  }
  Status BatchPut(const Endpoint&, std::span<const Slice>, std::span<const ValueParts>,
                  std::vector<int64_t>*) override {
    return Status::NotSupported("");
  }
  Status BatchExists(const Endpoint&, std::span<const Slice>, std::vector<int64_t>*) override {
    return Status::NotSupported("");
  }
  Status BatchDelete(const Endpoint&, std::span<const Slice>, std::vector<int64_t>*) override {
    return Status::NotSupported("");
  }
  Status BatchValueSize(const Endpoint&, std::span<const Slice>, std::vector<int64_t>*) override {
    return Status::NotSupported("");
  }
  Status DeleteByRegex(const Endpoint&, const std::string&, uint64_t*) override {
    return Status::NotSupported("");
  }
  Status DeleteAll(const Endpoint&, uint64_t*) override { return Status::NotSupported(""); }
  Status GetProperty(const Endpoint&, const std::string&, std::string*) override {
    return Status::NotSupported("");
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  int open_ = 0;
};

TEST(GroupsInTurn, EachGroupIsReadyOnceItsOwnReadIsDoneWhileLaterOnesWait) {
  // UCX's grouped gets (a layer-wise load's layers for one member): the start returns
  // before any read is done, and group g is Ready while group g+1 is still being read.
  GatedTransport t;
  const Endpoint peer{"127.0.0.1", 1};
  std::vector<std::vector<std::string>> key_text = {{"a0", "a1"}, {"b0"}, {"c0", "c1", "c2"}};
  std::vector<std::vector<Slice>> keys(3);
  std::vector<std::vector<std::string>> buffers(3);
  std::vector<std::vector<Destination>> dests(3);
  std::vector<std::vector<int64_t>> results(3);
  std::vector<Transport::GetGroup> groups;
  for (size_t g = 0; g < 3; g++) {
    for (const std::string& k : key_text[g]) {
      keys[g].push_back(k);
      buffers[g].push_back(std::string(8, '.'));
    }
    for (std::string& b : buffers[g]) dests[g].push_back({MutableSlice(b.data(), b.size())});
    groups.push_back({keys[g], dests[g], &results[g]});
  }
  std::vector<std::unique_ptr<PendingGet>> calls;
  StartGroupsInTurnOnAThread(&t, peer, groups, &calls);
  keys.clear();  // the caller's keys may go once the start returns
  key_text.clear();
  ASSERT_EQ(calls.size(), 3u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (auto& c : calls) EXPECT_FALSE(c->Ready());
  t.Open(1);
  EXPECT_TRUE(calls[0]->Wait().ok());
  EXPECT_EQ(results[0], (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(buffers[0][1].substr(0, 2), "a1");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(calls[1]->Ready());  // its gate is shut
  t.Open(3);
  EXPECT_TRUE(calls[2]->Wait().ok());
  EXPECT_TRUE(calls[1]->Ready());
  EXPECT_EQ(buffers[1][0].substr(0, 2), "b0");
  EXPECT_EQ(buffers[2][2].substr(0, 2), "c2");
  EXPECT_EQ(results[2], (std::vector<int64_t>{2, 2, 2}));
}

TEST(GroupsInTurn, ACallDestroyedUnwaitedWaitsForItsGroupFirst) {
  GatedTransport t;
  std::vector<Slice> keys = {"k"};
  std::string buffer(4, '.');
  std::vector<Destination> dests = {{MutableSlice(buffer.data(), buffer.size())}};
  std::vector<int64_t> results;
  std::vector<Transport::GetGroup> groups = {{keys, dests, &results}};
  std::vector<std::unique_ptr<PendingGet>> calls;
  StartGroupsInTurnOnAThread(&t, Endpoint{"127.0.0.1", 1}, groups, &calls);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    t.Open(1);
  });
  calls.clear();  // waits for the read: the buffer is written before this returns
  EXPECT_EQ(buffer[0], 'k');
  EXPECT_EQ(results, (std::vector<int64_t>{1}));
  opener.join();
}

}  // namespace
}  // namespace kvengine
