// kv_transport_bench: TCP transport get throughput against a raw loopback socket
// stream of the same bytes, in the same run.
//
//   kv_transport_bench [--value_size=1048576] [--keys=32] [--batch=4] [--seconds=2]
//
// A DB serving on 127.0.0.1 (in this process, its own threads) holds `keys` values; one
// client thread reads them with Transport::BatchGet into a buffer, `batch` keys per call.
// The baseline sends the same bytes over one loopback TCP connection with plain
// send()/recv() of value_size chunks.  Prints both rates and their ratio, and the P50 /
// P99 latency of a single-key get.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/transport.h"

namespace {

using Clock = std::chrono::steady_clock;

uint64_t FlagValue(int argc, char** argv, const char* name, uint64_t def) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; i++) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') {
      return std::strtoull(argv[i] + n + 1, nullptr, 10);
    }
  }
  return def;
}

// Raw loopback stream: bytes per second for `seconds`.
double RawLoopback(size_t chunk, double seconds) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(lfd, 1);
  socklen_t len = sizeof(addr);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  int bytes = 4 << 20;
  std::thread sender([&] {
    int fd = accept(lfd, nullptr, nullptr);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    std::vector<char> buf(chunk, 'x');
    for (;;) {
      size_t off = 0;
      while (off < chunk) {
        ssize_t n = send(fd, buf.data() + off, chunk - off, MSG_NOSIGNAL);
        if (n <= 0) {
          close(fd);
          return;
        }
        off += static_cast<size_t>(n);
      }
    }
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  std::vector<char> buf(chunk);
  uint64_t total = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    size_t off = 0;
    while (off < chunk) {
      ssize_t n = recv(fd, buf.data() + off, chunk - off, 0);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    total += off;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  close(fd);
  sender.join();
  close(lfd);
  return static_cast<double>(total) / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t value_size = FlagValue(argc, argv, "--value_size", 1 << 20);
  const uint64_t keys = FlagValue(argc, argv, "--keys", 32);
  const uint64_t batch = std::max<uint64_t>(1, FlagValue(argc, argv, "--batch", 4));
  const double seconds = static_cast<double>(FlagValue(argc, argv, "--seconds", 2));

  char dir[] = "/tmp/kv_transport_bench.XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  kvengine::Options options;
  options.apply_environment = false;
  options.ssd_capacity_bytes = 0;
  options.memory_capacity_bytes = std::max<uint64_t>(64 << 20, keys * value_size * 2);
  options.listen = "127.0.0.1:0";
  options.peer_transport = kvengine::PeerTransport::kTcp;
  std::unique_ptr<kvengine::DB> db;
  kvengine::Status s = kvengine::DB::Open(options, dir, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.ToString().c_str());
    return 1;
  }
  std::string peers;
  db->GetProperty("kvengine.peers", &peers);
  kvengine::Endpoint ep;
  s = kvengine::Endpoint::Parse(peers.substr(8, peers.find('\n') - 8), &ep);
  std::vector<std::string> names;
  std::string value(value_size, 'v');
  for (uint64_t i = 0; i < keys; i++) {
    names.push_back("bench/" + std::to_string(i));
    value[0] = static_cast<char>(i);
    db->Put(kvengine::WriteOptions(), names.back(), value);
  }
  std::unique_ptr<kvengine::Transport> t;
  kvengine::TransportOptions to;
  to.connections_per_peer = 1;
  s = kvengine::Transport::Create("tcp", to, &t);

  std::vector<char> buf(batch * value_size);
  std::vector<kvengine::Slice> batch_keys(batch);
  std::vector<kvengine::Destination> dests(batch);
  for (uint64_t j = 0; j < batch; j++)
    dests[j] = {kvengine::MutableSlice(&buf[j * value_size], value_size)};
  std::vector<int64_t> results;
  uint64_t bytes = 0, next = 0;
  auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    for (uint64_t j = 0; j < batch; j++) batch_keys[j] = names[next++ % keys];
    s = t->BatchGet(ep, batch_keys, dests, &results);
    if (!s.ok() || results[0] != static_cast<int64_t>(value_size)) {
      std::fprintf(stderr, "get failed: %s\n", s.ToString().c_str());
      return 1;
    }
    bytes += batch * value_size;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  const double tcp_rate = static_cast<double>(bytes) / elapsed;

  // Latency of single-key gets.
  std::vector<double> lat;
  for (int i = 0; i < 300; i++) {
    const auto t0 = Clock::now();
    t->BatchGet(ep, std::span<const kvengine::Slice>(&batch_keys[0], 1),
                std::span<const kvengine::Destination>(&dests[0], 1), &results);
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(lat.begin(), lat.end());

  const double raw_rate = RawLoopback(value_size, seconds);
  std::printf("value_size=%llu batch=%llu\n", static_cast<unsigned long long>(value_size),
              static_cast<unsigned long long>(batch));
  std::printf("transport tcp get : %8.1f MB/s\n", tcp_rate / 1e6);
  std::printf("raw loopback      : %8.1f MB/s\n", raw_rate / 1e6);
  std::printf("ratio             : %8.2f\n", tcp_rate / raw_rate);
  std::printf("single get latency: P50 %.0f us  P99 %.0f us\n", lat[lat.size() / 2],
              lat[lat.size() * 99 / 100]);
  t.reset();
  db->Close();
  std::string cmd = std::string("rm -rf ") + dir;
  return std::system(cmd.c_str()) == 0 ? 0 : 1;
}
