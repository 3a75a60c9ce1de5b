// The UCX transport (transport/ucx.h) between real processes: a kv_server child serving
// --transport=ucx, this process the client.  CTest runs the suite once over UCX's TCP
// transport and once over shared memory (KV_TEST_PEER_TRANSPORT=ucx/tcp, ucx/sm; the
// harness sets UCX_TLS for this process and its children).  Without UCX in the build the
// live tests skip saying so, and UcxBuild.* checks the NotSupported answer.
#include "transport/ucx.h"

#include <gtest/gtest.h>
#ifdef KV_WITH_UCX
#include <ucp/api/ucp.h>

#include "transport/ucp_helpers.h"
#endif
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/transport.h"
#include "test/peer_harness.h"
#include "transport/lease_calls.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/mutex.h"

namespace kvengine {
namespace {

// "ucx/tcp" unless the environment names another form of UCX.
std::string UcxForm() {
  const char* e = std::getenv("KV_TEST_PEER_TRANSPORT");
  return e != nullptr && std::string(e).rfind("ucx", 0) == 0 ? e : "ucx/tcp";
}

// Makes TransportUnderTest() the UCX form before anything reads it.
void UseUcx() {
  static const bool once = [] {
    setenv("KV_TEST_PEER_TRANSPORT", UcxForm().c_str(), 1);
    return TransportUnderTest() == "ucx";
  }();
  ASSERT_TRUE(once);
}

#define SKIP_WITHOUT_UCX()                                      \
  do {                                                          \
    UseUcx();                                                   \
    std::string why;                                            \
    if (!UcxAvailable(&why)) GTEST_SKIP() << "no UCX: " << why; \
  } while (0)

uint64_t Stat(const std::string& text, const std::string& name) {
  const std::string want = name + ": ";
  size_t pos = text.find("\n" + want);
  if (pos == std::string::npos) {
    if (text.rfind(want, 0) != 0) return ~0ull;
    pos = 0;
  } else {
    pos++;
  }
  return std::strtoull(text.c_str() + pos + want.size(), nullptr, 10);
}

std::string ServerStats(Transport* t, const Endpoint& ep) {
  std::string text;
  EXPECT_TRUE(t->GetProperty(ep, "kvengine.peers", &text).ok());
  return text;
}

// Starts this binary as a child running the test `filter` against `ep` (through
// KV_UCX_CHILD_PEER) and waits until it prints the line `ready`: its pid, or -1 when it
// ended first (then reaped).  *output gets everything it printed until then (gtest's own
// lines first), for the failure message.
pid_t StartChildUntil(const std::string& filter, const Endpoint& ep, const std::string& ready,
                      std::string* output) {
  output->clear();
  int out[2];
  if (pipe(out) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    setenv("KV_UCX_CHILD_PEER", ep.ToString().c_str(), 1);
    const std::string flag = "--gtest_filter=" + filter;
    execl("/proc/self/exe", "ucx_test", flag.c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string line;
  char c;
  while (line != ready && read(out[0], &c, 1) == 1) {
    *output += c;
    if (c == '\n') {
      line.clear();
      continue;
    }
    line += c;
  }
  close(out[0]);
  if (line == ready) return pid;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Whether this run's UCX has only its TCP transport: then the owner serves reads by
// active message (transport/ucx.cc, UcxServerImpl), not one-sided.
bool TcpOnly() {
  const char* tls = std::getenv("UCX_TLS");
  return tls != nullptr && std::string(tls) == "tcp";
}

// A value of `size` bytes, every byte `fill`.
std::string Uniform(size_t size, char fill) { return std::string(size, fill); }

// Puts n values of `size` bytes under prefix0, prefix1, ...: the i-th all first+i.
// Fills *names and *values.
void PutUniform(Transport* t, const Endpoint& ep, const std::string& prefix, int n, size_t size,
                char first, std::vector<std::string>* names, std::vector<std::string>* values) {
  for (int i = 0; i < n; i++) {
    names->push_back(prefix + std::to_string(i));
    values->push_back(Uniform(size, static_cast<char>(first + i)));
  }
  std::vector<Slice> keys(names->begin(), names->end());
  std::vector<ValueParts> parts;
  for (const auto& v : *values) parts.push_back({Slice(v)});
  std::vector<int64_t> results;
  ASSERT_TRUE(t->BatchPut(ep, keys, parts, &results).ok());
  for (int64_t r : results) ASSERT_EQ(r, 0);
}

// `a` decodes back as it was; every truncation and a trailing byte are refused, never
// read past.
void RoundTripsAndRefusesTruncations(const UcxConnectAnswer& a) {
  std::string enc;
  a.EncodeTo(&enc);
  UcxConnectAnswer b;
  ASSERT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).ok());
  EXPECT_EQ(a, b);
  for (size_t n = 0; n < enc.size(); n++) {
    EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(std::string_view(enc).substr(0, n), &b).IsCorruption())
        << n;
  }
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc + "x", &b).IsCorruption());
}

TEST(UcxWire, ConnectRequestAndAnswerRoundTrip) {
  UcxConnectRequest req{std::string("\x01\x02worker", 8)};
  std::string enc;
  req.EncodeTo(&enc);
  UcxConnectRequest back;
  ASSERT_TRUE(UcxConnectRequest::DecodeFrom(enc, &back).ok());
  EXPECT_EQ(back.worker_address, req.worker_address);

  UcxConnectAnswer a;
  a.worker_address = "addr";
  a.arena_addr = 0x7f0000001000;
  a.arena_len = 64 << 20;
  a.rkey = std::string("\x00rkey", 5);
  a.token = 0x1234567890abcdefull;
  a.lease_ttl_ms = 2000;
  a.put_ttl_ms = 10000;
  RoundTripsAndRefusesTruncations(a);
}

// Reads by active message: the client says it can, the owner's version 3 answer says
// it does (and carries no rkey); an older client's request (version 1) cannot.
TEST(UcxWire, ReadsByActiveMessageAreNegotiated) {
  UcxConnectRequest req{"worker"};
  EXPECT_TRUE(req.reads_by_am);
  std::string enc;
  req.EncodeTo(&enc);
  UcxConnectRequest back;
  ASSERT_TRUE(UcxConnectRequest::DecodeFrom(enc, &back).ok());
  EXPECT_TRUE(back.reads_by_am);
  req.reads_by_am = false;
  enc.clear();
  req.EncodeTo(&enc);
  ASSERT_TRUE(UcxConnectRequest::DecodeFrom(enc, &back).ok());
  EXPECT_FALSE(back.reads_by_am);
  std::string v1("\x01", 1);  // an older client: version 1, no flags
  PutLengthPrefixed(&v1, "worker");
  ASSERT_TRUE(UcxConnectRequest::DecodeFrom(v1, &back).ok());
  EXPECT_FALSE(back.reads_by_am);
  EXPECT_TRUE(UcxConnectRequest::DecodeFrom(v1 + "x", &back).IsCorruption());
  enc[0] = 1;  // a version 1 request with a flags byte
  EXPECT_TRUE(UcxConnectRequest::DecodeFrom(enc, &back).IsCorruption());

  UcxConnectAnswer a, b;
  a.worker_address = "addr";
  a.arena_addr = 4096;
  a.arena_len = 1 << 20;
  a.token = 9;
  a.lease_ttl_ms = 2000;
  a.reads_by_am = true;  // and no rkey
  RoundTripsAndRefusesTruncations(a);
  a.put_ttl_ms = 10000;  // the field is decoded as sent; clients by AM ignore it
  RoundTripsAndRefusesTruncations(a);
  a.put_ttl_ms = 0;
  enc.clear();
  a.EncodeTo(&enc);
  EXPECT_EQ(enc[0], 3);
  EXPECT_EQ(enc.back(), 1);  // the flags byte, last: bit 0 reads_by_am
  enc.back() = 2;            // an unknown flag
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
  // Without reads by active message: still version 3 (put_ttl_ms), flags byte 0.
  a.reads_by_am = false;
  a.rkey = "rkey";
  enc.clear();
  a.EncodeTo(&enc);
  EXPECT_EQ(enc[0], 3);
  EXPECT_EQ(enc.back(), 0);
  ASSERT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).ok());
  EXPECT_FALSE(b.reads_by_am);
  // A version 2 answer (no put_ttl_ms, no flags) reads one-sided, with no puts.
  enc[0] = 2;
  enc.resize(enc.size() - 9);
  ASSERT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).ok());
  EXPECT_FALSE(b.reads_by_am);
  EXPECT_EQ(b.put_ttl_ms, 0u);
  enc.push_back(1);  // version 2 has no flags byte
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
}

TEST(UcxWire, HostileAnswersAreRefused) {
  UcxConnectAnswer a, b;
  a.worker_address = "addr";
  a.rkey = "rkey";
  a.arena_addr = ~0ull - 10;  // wraps around
  a.arena_len = 100;
  std::string enc;
  a.EncodeTo(&enc);
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
  a.arena_addr = 4096;
  a.arena_len = 0;  // empty arena
  enc.clear();
  a.EncodeTo(&enc);
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
  a.arena_len = 100;
  a.rkey.clear();  // no rkey
  enc.clear();
  a.EncodeTo(&enc);
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
  a.rkey.assign(kUcxMaxBlob + 1, 'k');  // oversized
  enc.clear();
  a.EncodeTo(&enc);
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
  enc = std::string("\x04", 1);  // another version
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
  a.rkey = "rkey";
  a.token = 0;  // a version 2 answer names its client
  enc.clear();
  a.EncodeTo(&enc);
  EXPECT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).IsCorruption());
  // A version 1 answer (no token: lease ops over the control connection) still reads.
  a.token = 7;
  enc.clear();
  a.EncodeTo(&enc);
  a.put_ttl_ms = 5000;
  const std::string v3 = enc;
  enc[0] = 1;
  enc.resize(enc.size() - 25);  // token, lease_ttl_ms, put_ttl_ms, flags
  ASSERT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).ok());
  EXPECT_EQ(b.token, 0u);
  // So does a version 2 answer (no put_ttl_ms: puts go by TCP; no flags).
  enc = v3;
  enc[0] = 2;
  enc.resize(enc.size() - 9);  // put_ttl_ms, flags
  ASSERT_TRUE(UcxConnectAnswer::DecodeFrom(enc, &b).ok());
  EXPECT_EQ(b.token, 7u);
  EXPECT_EQ(b.put_ttl_ms, 0u);
  UcxConnectRequest r;
  EXPECT_TRUE(UcxConnectRequest::DecodeFrom(std::string("\x01\x00", 2), &r).IsCorruption());
}

// The put ops' codecs: round trips, and every truncation refused.
TEST(UcxWire, PutOpsRoundTrip) {
  std::vector<Slice> keys = {"a", "", "key-c"};
  std::vector<uint64_t> sizes = {0, 1 << 20, 7};
  std::string meta;
  EncodeUcxReserveRequest(keys, sizes, &meta);
  EXPECT_FALSE(meta.empty());
  std::string answer;
  wire::PutBatchStatus(&answer, Status::OK());
  const int64_t codes[] = {0, Status::NoSpace("").ErrorCode(), 0};
  for (int i = 0; i < 3; i++) {
    PutFixed64(&answer, static_cast<uint64_t>(codes[i]));
    PutFixed64(&answer, 10 + i);
    PutFixed64(&answer, 4096 * i);
  }
  std::vector<UcxReserved> r;
  ASSERT_TRUE(DecodeUcxReserveAnswer(answer, 3, &r).ok());
  EXPECT_EQ(r[1].result, codes[1]);
  EXPECT_EQ(r[2].id, 12u);
  EXPECT_EQ(r[2].offset, 8192u);
  for (size_t n = 0; n < answer.size(); n++) {
    EXPECT_FALSE(DecodeUcxReserveAnswer(std::string_view(answer).substr(0, n), 3, &r).ok()) << n;
  }
  EXPECT_FALSE(DecodeUcxReserveAnswer(answer + "x", 3, &r).ok());
  answer.clear();
  wire::PutBatchStatus(&answer, Status::NotSupported("no puts here"));
  EXPECT_TRUE(DecodeUcxReserveAnswer(answer, 3, &r).IsNotSupported());

  answer.clear();
  wire::PutBatchStatus(&answer, Status::OK());
  PutFixed64(&answer, 0);
  PutFixed64(&answer, static_cast<uint64_t>(Status::Aborted("").ErrorCode()));
  std::vector<int64_t> results;
  ASSERT_TRUE(DecodeUcxCommitAnswer(answer, 2, &results).ok());
  EXPECT_EQ(results[1], Status::Aborted("").ErrorCode());
  EXPECT_FALSE(DecodeUcxCommitAnswer(answer.substr(0, answer.size() - 1), 2, &results).ok());
  EXPECT_FALSE(DecodeUcxCommitAnswer(answer, 3, &results).ok());
}

TEST(UcxBuild, CreateAnswersAsTheBuildAllows) {
  std::unique_ptr<Transport> t;
  Status s = Transport::Create("ucx", TransportOptions(), &t);
#ifdef KV_WITH_UCX
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_STREQ(t->Name(), "ucx");
  std::unique_ptr<Transport> automatic;
  ASSERT_TRUE(Transport::Create("auto", TransportOptions(), &automatic).ok());
  EXPECT_STREQ(automatic->Name(), "ucx");  // auto prefers UCX when the build has it
  std::string why;
  UcxInfo info;
  ASSERT_TRUE(UcxAvailable(&why, &info)) << why;
  EXPECT_FALSE(info.version.empty());
#else
  EXPECT_TRUE(s.IsNotSupported());
  EXPECT_NE(s.ToString().find("libucx-dev"), std::string::npos) << s.ToString();
#endif
  EXPECT_TRUE(Transport::Create("carrier-pigeon", TransportOptions(), &t).IsInvalidArgument());
}

// Whether device buffers can be mapped directly is asked of UCX at run time
// (ucp_context_query's memory types), never assumed: the answer UcxAvailable gives and
// the one the transport reports (ucx_cuda_memory) are what a context of this UCX says.
// Debian's UCX has no CUDA: there they are false, and device bytes go through the GPU
// staging path (docs/gpu.md).
TEST(UcxBuild, DeviceMemoryIsDetectedNotAssumed) {
#ifdef KV_WITH_UCX
  EXPECT_TRUE(UcxCudaMemory(UCS_BIT(UCS_MEMORY_TYPE_HOST) | UCS_BIT(UCS_MEMORY_TYPE_CUDA)));
  EXPECT_FALSE(UcxCudaMemory(UCS_BIT(UCS_MEMORY_TYPE_HOST)));
  EXPECT_FALSE(UcxCudaMemory(UCS_BIT(UCS_MEMORY_TYPE_CUDA_MANAGED)));  // not device buffers
  EXPECT_FALSE(UcxCudaMemory(0));
  // What this machine's UCX says, asked directly.
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  ASSERT_EQ(ucp_init(&params, nullptr, &context), UCS_OK);
  ucp_context_attr_t attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  ASSERT_EQ(ucp_context_query(context, &attr), UCS_OK);
  ucp_cleanup(context);
  const bool cuda = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  EXPECT_TRUE((attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_HOST)) != 0);
  std::string why;
  UcxInfo info;
  ASSERT_TRUE(UcxAvailable(&why, &info)) << why;
  EXPECT_EQ(info.cuda_memory, cuda);
  std::unique_ptr<Transport> t;
  ASSERT_TRUE(Transport::Create("ucx", TransportOptions(), &t).ok());
  EXPECT_EQ(Stat(t->StatsText(), "ucx_cuda_memory"), cuda ? 1u : 0u) << t->StatsText();
  std::printf("this UCX (%s) %s\n", info.version.c_str(),
              cuda ? "maps device memory directly" : "has no CUDA: the GPU staging path applies");
#else
  EXPECT_FALSE(UcxCudaMemory(~0ull));
  std::string why;
  UcxInfo info;
  EXPECT_FALSE(UcxAvailable(&why, &info));
  EXPECT_FALSE(info.cuda_memory);
#endif
}

// Values of every shape read one-sided into mapped buffers and into plain ones, bit
// exact, with a missing key, an empty value and a too-small buffer in the batch.
TEST(UcxTest, GetsAreOneSidedIntoMappedAndPlainBuffers) {
  SKIP_WITHOUT_UCX();
  Server server(TempDir("ucx_gets"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  ASSERT_STREQ(client->Name(), "ucx");
  const Endpoint ep = server.endpoint();
  std::mt19937_64 rng(7);
  const std::vector<size_t> sizes = {0, 1, 4095, 64 << 10, 1 << 20, 4 << 20};
  std::vector<std::string> names, values;
  for (size_t i = 0; i < sizes.size(); i++) {
    names.push_back("ucx/k" + std::to_string(i));
    values.push_back(RandomValue(&rng, sizes[i]));
  }
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<ValueParts> parts;
  for (const auto& v : values) parts.push_back({Slice(v)});
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  for (int64_t r : results) ASSERT_EQ(r, 0);

  // The puts' bytes came from plain memory, through the bounce buffer; over UCX's TCP
  // (reads by active message) puts are not one-sided: they went by TCP PUT.
  const uint64_t bounced_by_puts = Stat(client->StatsText(), "ucx_bounce_ops");
  EXPECT_EQ(bounced_by_puts, TcpOnly() ? 0u : sizes.size() - 1);  // empty: no byte moved
  EXPECT_EQ(Stat(client->StatsText(), "ucx_tcp_put_keys"), TcpOnly() ? sizes.size() : 0u);
  const size_t kSlot = 4 << 20;
  std::vector<char> mapped(kSlot * (sizes.size() + 2));
  ASSERT_TRUE(client->RegisterMemory(mapped.data(), mapped.size(), "user buffer").ok());
  names.push_back("ucx/absent");
  names.push_back("ucx/k4");  // 1 MiB into 1000 bytes
  keys.assign(names.begin(), names.end());
  std::vector<Destination> dests;
  for (size_t i = 0; i < keys.size(); i++) {
    const size_t cap = i + 1 == keys.size() ? 1000 : kSlot;
    dests.push_back({MutableSlice(mapped.data() + i * kSlot, cap)});
  }
  Status s = client->BatchGet(ep, keys, dests, &results);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < sizes.size(); i++) {
    ASSERT_EQ(results[i], static_cast<int64_t>(sizes[i])) << i;
    EXPECT_TRUE(std::equal(values[i].begin(), values[i].end(), mapped.data() + i * kSlot)) << i;
  }
  EXPECT_EQ(results[sizes.size()], Status::NotFound("").ErrorCode());
  EXPECT_EQ(results[sizes.size() + 1], Status::BufferTooSmall("").ErrorCode());
  std::string stats = client->StatsText();
  EXPECT_GE(Stat(stats, "ucx_gets"), 5u) << stats;
  // Into the registered buffer directly, never through the bounce buffer (or by the
  // owner's active messages, over UCX's TCP).
  EXPECT_GE(Stat(stats, "ucx_direct_ops"), TcpOnly() ? 0u : 5u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_bounce_ops"), bounced_by_puts) << stats;
  EXPECT_EQ(Stat(stats, "ucx_tcp_batches"), 0u) << stats;

  // Plain buffers, each value split over two of them.
  std::vector<std::vector<char>> a(sizes.size(), std::vector<char>(kSlot / 2)),
      b(sizes.size(), std::vector<char>(kSlot));
  keys.assign(names.begin(), names.begin() + sizes.size());
  dests.clear();
  for (size_t i = 0; i < sizes.size(); i++) {
    dests.push_back(
        {MutableSlice(a[i].data(), a[i].size()), MutableSlice(b[i].data(), b[i].size())});
  }
  ASSERT_TRUE(client->BatchGet(ep, keys, dests, &results).ok());
  for (size_t i = 0; i < sizes.size(); i++) {
    ASSERT_EQ(results[i], static_cast<int64_t>(sizes[i])) << i;
    std::string got(a[i].begin(), a[i].end());
    got.append(b[i].begin(), b[i].end());
    EXPECT_EQ(got.substr(0, sizes[i]), values[i]) << i;
  }
  stats = client->StatsText();
  if (TcpOnly()) {  // the owner's active messages, copied into place: no bounce buffer
    EXPECT_EQ(Stat(stats, "ucx_bounce_ops"), 0u) << stats;
    EXPECT_GE(Stat(stats, "ucx_reads_by_am"), 9u) << stats;
    EXPECT_EQ(Stat(ServerStats(client.get(), ep), "ucx_clients_by_am"), 1u);
  } else {
    EXPECT_GE(Stat(stats, "ucx_bounce_ops"), bounced_by_puts + 4) << stats;
    EXPECT_EQ(Stat(stats, "ucx_reads_by_am"), 0u) << stats;
  }
  EXPECT_EQ(Stat(ServerStats(client.get(), ep), "ucx_clients"), 1u);
  client->UnregisterMemory(mapped.data(), mapped.size());
}

// Many threads share the one worker: reads of all of them in flight at once, each
// batch's bytes exact.
TEST(UcxTest, ConcurrentBatchesShareTheWorker) {
  SKIP_WITHOUT_UCX();
  Server server(TempDir("ucx_threads"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient("", 10000);
  const Endpoint ep = server.endpoint();
  const int kKeys = 32;
  std::vector<std::string> names, values;
  std::mt19937_64 rng(3);
  for (int i = 0; i < kKeys; i++) {
    names.push_back("mt/" + std::to_string(i));
    values.push_back(RandomValue(&rng, 64 << 10));
  }
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<ValueParts> parts;
  for (const auto& v : values) parts.push_back({Slice(v)});
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; t++) {
    threads.emplace_back([&, t] {
      std::vector<char> buf(kKeys * (64 << 10));
      std::vector<Destination> dests;
      for (int i = 0; i < kKeys; i++) {
        dests.push_back({MutableSlice(buf.data() + i * (64 << 10), 64 << 10)});
      }
      for (int round = 0; round < 20; round++) {
        std::vector<int64_t> r;
        if (!client->BatchGet(ep, keys, dests, &r).ok()) {
          failures++;
          continue;
        }
        for (int i = 0; i < kKeys; i++) {
          if (r[i] != (64 << 10) ||
              std::memcmp(buf.data() + i * (64 << 10), values[i].data(), 64 << 10) != 0) {
            failures++;
          }
        }
      }
      (void)t;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// Values overwritten and deleted while they are read, in a memory tier small enough
// that their rooms are reused at once: every read that reports success holds exactly
// one version (each value is one repeated byte), never a mix and never a stranger's.
TEST(UcxTest, ValuesReplacedDuringReadsAreNeverServedTorn) {
  SKIP_WITHOUT_UCX();
  Server server(TempDir("ucx_churn"), FreePort());
  server.set_options(",ssd_capacity_bytes=0,memory_capacity_bytes=8MiB");
  ASSERT_TRUE(server.Start());
  auto writer = NewClient();
  auto reader = NewClient();
  const Endpoint ep = server.endpoint();
  const size_t kSize = 256 << 10;
  const int kKeys = 8;
  std::vector<std::string> names;
  for (int i = 0; i < kKeys; i++) names.push_back("churn/" + std::to_string(i));
  std::vector<Slice> keys(names.begin(), names.end());
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    std::mt19937_64 rng(11);
    while (!stop.load()) {
      const int k = static_cast<int>(rng() % kKeys);
      std::vector<Slice> one = {keys[k]};
      std::vector<int64_t> r;
      if (rng() % 4 == 0) {
        writer->BatchDelete(ep, one, &r);
      } else {
        const std::string v = Uniform(kSize, static_cast<char>('a' + rng() % 26));
        std::vector<ValueParts> parts = {{Slice(v)}};
        writer->BatchPut(ep, one, parts, &r);
      }
    }
  });
  std::vector<char> buf(kKeys * kSize);
  ASSERT_TRUE(reader->RegisterMemory(buf.data(), buf.size(), "user buffer").ok());
  std::vector<Destination> dests;
  for (int i = 0; i < kKeys; i++) dests.push_back({MutableSlice(buf.data() + i * kSize, kSize)});
  int served = 0, torn = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kSanitized ? 6 : 3);
  while (std::chrono::steady_clock::now() < until) {
    std::vector<int64_t> r;
    if (!reader->BatchGet(ep, keys, dests, &r).ok()) continue;
    for (int i = 0; i < kKeys; i++) {
      if (r[i] != static_cast<int64_t>(kSize)) continue;
      served++;
      const char* v = buf.data() + i * kSize;
      if (v[0] < 'a' || v[0] > 'z' ||
          std::count(v, v + kSize, v[0]) != static_cast<std::ptrdiff_t>(kSize)) {
        torn++;
      }
    }
  }
  stop.store(true);
  churn.join();
  EXPECT_GT(served, 0);
  EXPECT_EQ(torn, 0);
  EXPECT_GT(Stat(reader->StatsText(), "ucx_gets"), 0u);
  reader->UnregisterMemory(buf.data(), buf.size());
}

// SIGKILL of the server while reads are in flight: every key of a batch that did not
// complete is an error, and no key ever reports success with wrong bytes.
TEST(UcxTest, ServerKilledMidReadFailsEveryKeyNeverWrongBytes) {
  SKIP_WITHOUT_UCX();
  Server server(TempDir("ucx_kill_server"), FreePort());
  server.set_options(",ssd_capacity_bytes=0,memory_capacity_bytes=256MiB");
  ASSERT_TRUE(server.Start());
  auto client = NewClient("", 2000);
  const Endpoint ep = server.endpoint();
  const size_t kSize = 4 << 20;
  const int kKeys = 8;
  std::vector<std::string> names, values;
  PutUniform(client.get(), ep, "kill/", kKeys, kSize, 'A', &names, &values);
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> results;
  std::atomic<int> wrong{0}, ok_batches{0}, failed_batches{0}, partial{0};
  std::atomic<bool> killed{false};
  Mutex mu;
  std::string first_error;  // before the kill: none expected
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; t++) {
    threads.emplace_back([&] {
      std::vector<char> buf(kKeys * kSize);
      client->RegisterMemory(buf.data(), buf.size(), "user buffer");
      std::vector<Destination> dests;
      for (int i = 0; i < kKeys; i++)
        dests.push_back({MutableSlice(buf.data() + i * kSize, kSize)});
      for (int round = 0; round < 400; round++) {
        std::memset(buf.data(), 0, buf.size());
        std::vector<int64_t> r;
        const Status s = client->BatchGet(ep, keys, dests, &r);
        int good = 0;
        for (int i = 0; i < kKeys; i++) {
          if (r.size() != static_cast<size_t>(kKeys) || r[i] < 0) continue;
          good++;
          if (r[i] != static_cast<int64_t>(kSize) ||
              std::memcmp(buf.data() + i * kSize, values[i].data(), kSize) != 0) {
            wrong++;
          }
        }
        if (s.ok() && good == kKeys) {
          ok_batches++;
        } else {
          failed_batches++;
          if (good != 0) partial++;
          MutexLock lock(&mu);
          if (!killed.load() && first_error.empty()) first_error = s.ToString();
        }
        if (killed.load() && round > 0 && !s.ok()) break;
      }
      client->UnregisterMemory(buf.data(), buf.size());
    });
  }
  // Kill it once reads are going well (or after 10 s, and the test fails).
  for (int i = 0; i < 1000 && ok_batches.load() < 3; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  killed.store(true);
  server.Kill(SIGKILL);
  for (auto& th : threads) th.join();
  EXPECT_GT(ok_batches.load(), 0);
  EXPECT_GT(failed_batches.load(), 0);
  EXPECT_EQ(first_error, "");
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(partial.load(), 0);
  // And the client keeps working against a restarted server.
  Server again(TempDir("ucx_kill_server2"), FreePort());
  ASSERT_TRUE(again.Start());
  std::vector<Slice> one = {keys[0]};
  std::vector<ValueParts> one_part = {{Slice(values[0])}};
  ASSERT_TRUE(client->BatchPut(again.endpoint(), one, one_part, &results).ok());
  std::vector<char> buf(kSize);
  std::vector<Destination> d = {{MutableSlice(buf.data(), buf.size())}};
  ASSERT_TRUE(client->BatchGet(again.endpoint(), one, d, &results).ok());
  ASSERT_EQ(results[0], static_cast<int64_t>(kSize)) << client->StatsText();
  EXPECT_EQ(std::memcmp(buf.data(), values[0].data(), kSize), 0);
}

// A client learns that its owner is gone from the owner's end of the control connection
// the UCX endpoint was set up over (the kernel closes a killed process's sockets), not
// by a request timing out: over UCX's shared memory, which cannot tell, a request to a
// killed owner used to wait its whole timeout, and so did the first request to an owner
// restarted on the same port (on the endpoint to the dead process) before its retry.
// Now the first fails at once and the second is read at once.
TEST(UcxTest, AKilledOrRestartedOwnerIsNoticedAtOnceNotByTheTimeout) {
  SKIP_WITHOUT_UCX();
  const std::string dir = TempDir("ucx_restart");
  Server server(dir + "/db", FreePort());
  server.set_options(",ssd_capacity_bytes=0,memory_capacity_bytes=64MiB");
  ASSERT_TRUE(server.Start());
  const Endpoint ep = server.endpoint();
  constexpr uint64_t kTimeoutMs = 5000;
  auto client = NewClient("", kTimeoutMs);
  const size_t kSize = 256 << 10;
  std::vector<std::string> names, values;
  PutUniform(client.get(), ep, "restart/", 4, kSize, 'a', &names, &values);
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<char> buf(keys.size() * kSize);
  std::vector<Destination> dests;
  for (size_t i = 0; i < keys.size(); i++)
    dests.push_back({MutableSlice(buf.data() + i * kSize, kSize)});
  auto read_all = [&](std::chrono::milliseconds* took) {
    std::memset(buf.data(), 0, buf.size());
    std::vector<int64_t> r;
    const auto t0 = std::chrono::steady_clock::now();
    Status s = client->BatchGet(ep, keys, dests, &r);
    *took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  t0);
    for (size_t i = 0; s.ok() && i < keys.size(); i++) {
      if (r[i] != static_cast<int64_t>(kSize)) {
        s = Status::IOError(names[i] + ": " + std::to_string(r[i]));
      } else if (std::memcmp(buf.data() + i * kSize, values[i].data(), kSize) != 0) {
        s = Status::Corruption(names[i] + ": wrong bytes");
      }
    }
    return s;
  };
  std::chrono::milliseconds took{0};
  ASSERT_TRUE(read_all(&took).ok());  // connected over UCX
  const uint64_t connects = Stat(client->StatsText(), "ucx_connects");
  server.Kill(SIGKILL);
  // Gone: an error, long before the timeout.
  EXPECT_FALSE(read_all(&took).ok());
  EXPECT_LT(took.count(), static_cast<int64_t>(kTimeoutMs / 5)) << client->StatsText();
  // Back on the same port (its memory lost: the values put again by another client).
  ASSERT_TRUE(server.Start());
  {
    auto writer = NewClient("", kTimeoutMs);
    std::vector<std::string> n2, v2;
    PutUniform(writer.get(), ep, "restart/", 4, kSize, 'a', &n2, &v2);
  }
  // Wait out the reconnect backoff the failed connect to the dead owner set (at most
  // reconnect_backoff_min_ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const Status s = read_all(&took);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(took.count(), static_cast<int64_t>(kTimeoutMs / 5)) << client->StatsText();
  EXPECT_GE(Stat(client->StatsText(), "ucx_peers_gone"), 1u) << client->StatsText();
  EXPECT_EQ(Stat(client->StatsText(), "ucx_connects"), connects + 1) << client->StatsText();
}

// The client side of the next test, run in a child process (this binary re-executed):
// reads kChildKeys values over UCX, all in flight at once, until it is killed.
constexpr int kChildKeys = 16;
constexpr size_t kChildValue = 1 << 20;
TEST(UcxChild, ReadsUntilKilled) {
  const char* peer = std::getenv("KV_UCX_CHILD_PEER");
  if (peer == nullptr) GTEST_SKIP() << "the child of UcxTest.ClientKilledMidReadLeaksNothing";
  UseUcx();
  Endpoint ep;
  ASSERT_TRUE(Endpoint::Parse(peer, &ep).ok());
  auto client = NewClient();
  std::vector<char> buf(kChildKeys * kChildValue);
  ASSERT_TRUE(client->RegisterMemory(buf.data(), buf.size(), "user buffer").ok());
  std::vector<std::string> names;
  std::vector<Destination> dests;
  for (int i = 0; i < kChildKeys; i++) {
    names.push_back("child/" + std::to_string(i));
    dests.push_back({MutableSlice(buf.data() + i * kChildValue, kChildValue)});
  }
  std::vector<Slice> keys(names.begin(), names.end());
  bool told = false;
  for (;;) {
    std::vector<int64_t> r;
    if (client->BatchGet(ep, keys, dests, &r).ok() && !told) {
      std::printf("reading\n");
      std::fflush(stdout);
      told = true;
    }
  }
}

// A client killed mid-read (kChildKeys reads in flight) leaves nothing behind on the
// server, which keeps serving: its endpoint is closed and counted when its control
// connection drops, and its leases lapse; another client reads on, bit exact, all the
// while.  Over UCX's TCP alone the owner serves the reads by active message: UCX 1.13's
// emulation of one-sided reads there aborted the owner here (ucp_get_req_handler:
// "Fatal: unexpected error"), so such a server used to serve no UCX over TCP at all.
TEST(UcxTest, ClientKilledMidReadLeaksNothing) {
  SKIP_WITHOUT_UCX();
  Server server(TempDir("ucx_kill_client"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  std::vector<std::string> names, values;
  PutUniform(client.get(), ep, "child/", kChildKeys, kChildValue, 'a', &names, &values);
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> results;

  // The bystander: reads every value, again and again, checking each byte.
  std::atomic<bool> stop{false};
  std::atomic<int> good_batches{0}, bad{0};
  std::string bad_what;
  std::thread bystander([&] {
    std::vector<char> buf(kChildKeys * kChildValue);
    std::vector<Destination> dests;
    for (int i = 0; i < kChildKeys; i++) {
      dests.push_back({MutableSlice(buf.data() + i * kChildValue, kChildValue)});
    }
    while (!stop.load()) {
      std::memset(buf.data(), 0, buf.size());
      std::vector<int64_t> r;
      Status s = client->BatchGet(ep, keys, dests, &r);
      bool exact = s.ok();
      for (int i = 0; exact && i < kChildKeys; i++) {
        exact = r[i] == static_cast<int64_t>(kChildValue) &&
                std::memcmp(buf.data() + i * kChildValue, values[i].data(), kChildValue) == 0;
      }
      if (exact) {
        good_batches++;
      } else if (bad++ == 0) {
        bad_what = s.ToString();
      }
    }
  });
  const int kRounds = 4;
  for (int round = 0; round < kRounds; round++) {
    std::string output;
    const pid_t pid = StartChildUntil("UcxChild.ReadsUntilKilled", ep, "reading", &output);
    ASSERT_GT(pid, 0) << output;
    if (round == 0 && TcpOnly()) {
      EXPECT_GE(Stat(ServerStats(client.get(), ep), "ucx_clients_by_am"), 1u);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + 50 * round));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  // The server notices each closed control connection at once; the leases of the reads
  // cut short lapse within their time to live (2 s).
  std::string stats;
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_clients_released") >= kRounds && Stat(stats, "ucx_clients") <= 1 &&
        Stat(stats, "leases_held") == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop.store(true);
  bystander.join();
  EXPECT_GE(Stat(stats, "ucx_clients_released"), static_cast<uint64_t>(kRounds)) << stats;
  EXPECT_EQ(Stat(stats, "ucx_clients"), 1u) << stats;  // the bystander's
  EXPECT_EQ(Stat(stats, "ucx_clients_by_am"), TcpOnly() ? 1u : 0u) << stats;
  EXPECT_EQ(Stat(stats, "leases_held"), 0u) << stats;
  EXPECT_EQ(bad.load(), 0) << bad_what;
  EXPECT_GT(good_batches.load(), 0);
  // The server still serves.
  std::vector<char> buf(kChildValue);
  std::vector<Slice> one = {keys[0]};
  std::vector<Destination> d = {{MutableSlice(buf.data(), buf.size())}};
  ASSERT_TRUE(client->BatchGet(ep, one, d, &results).ok());
  EXPECT_EQ(results[0], static_cast<int64_t>(kChildValue));
  EXPECT_TRUE(server.Alive());
}

// The client side of the next test, run in a child process: connects, reads once, then
// leaves the owner's shared-memory receive FIFOs it reaches as a sender killed in the
// middle of an active message leaves them, and waits to be killed.  UCX 1.13's sm
// transports (uct/sm/mm) take a FIFO slot by compare-and-swap of the FIFO's head and
// only then write the element and flip its owner bit; a sender killed between the two
// leaves a slot that never fills, and the receiving worker can never read past it.  The
// FIFOs are found by the layout of 1.13's uct_mm_fifo_ctl_t (head at byte 0, the
// owner's pid at byte 136) among this process's shared mappings of UCX segments; prints
// "fifos N" (N taken), then "wedged".
TEST(UcxChild, WedgesOwnersFifos) {
  const char* peer = std::getenv("KV_UCX_CHILD_PEER");
  const char* owner = std::getenv("KV_UCX_CHILD_OWNER_PID");
  if (peer == nullptr || owner == nullptr) {
    GTEST_SKIP() << "the child of UcxTest.ClientDeadMidMessageStallsNoOtherClient";
  }
  UseUcx();
  Endpoint ep;
  ASSERT_TRUE(Endpoint::Parse(peer, &ep).ok());
  auto client = NewClient();
  std::vector<char> buf(kChildValue);
  std::vector<Slice> keys = {"child/0"};
  std::vector<Destination> dests = {{MutableSlice(buf.data(), buf.size())}};
  std::vector<int64_t> r;
  ASSERT_TRUE(client->BatchGet(ep, keys, dests, &r).ok());
  const pid_t owner_pid = static_cast<pid_t>(std::atoi(owner));
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::set<std::string> seen;  // a segment may be mapped more than once
  int taken = 0;
  while (std::getline(maps, line)) {
    unsigned long start = 0, end = 0;  // NOLINT(runtime/int): sscanf's %lx
    char perms[8] = {0};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &start, &end, perms) != 3) continue;
    const bool ucx_segment = line.find("/SYSV") != std::string::npos ||
                             line.find("/dev/shm/ucx_shm_posix_") != std::string::npos;
    if (!ucx_segment || std::string(perms).substr(0, 2) != "rw" || end - start < 192 ||
        end - start > (1 << 20)) {
      continue;
    }
    std::istringstream fields(line);
    std::string range, p, offset, dev, ino;
    fields >> range >> p >> offset >> dev >> ino;
    if (!seen.insert(dev + ":" + ino).second) continue;
    auto* ctl = reinterpret_cast<char*>(start);
    int32_t pid = 0;
    std::memcpy(&pid, ctl + 136, sizeof(pid));
    if (pid != owner_pid) continue;
    auto* head = reinterpret_cast<std::atomic<uint64_t>*>(ctl);
    uint64_t h = head->load();
    // What uct_mm_ep_get_remote_elem does before writing the element: take the slot.
    while (!head->compare_exchange_weak(h, (h + 1) & ~(1ull << 63))) {
    }
    taken++;
  }
  std::printf("fifos %d\nwedged\n", taken);
  std::fflush(stdout);
  for (;;) pause();
}

// A client that dies in the middle of sending an active message over shared memory
// stalls nobody else.  It leaves a slot of the owner's receive FIFO that never fills
// (UCX 1.13's sm transports, above), and a UCP worker never reads past such a slot: with
// one worker serving every client, every later lease op of every client went unanswered
// and the owner's progress thread spun, holding the lock that UCX_CONNECT needs (seen
// as a hang of ClientKilledMidReadLeaksNothing, 2 in 22 runs).  Each client now has a
// worker of its own on the owner, destroyed when its connection closes, so the slot
// wedges only the dead client's worker.
TEST(UcxTest, ClientDeadMidMessageStallsNoOtherClient) {
  SKIP_WITHOUT_UCX();
  if (TcpOnly()) GTEST_SKIP() << "shared memory's FIFOs: run with UCX_TLS=sm";
  Server server(TempDir("ucx_wedge"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  std::vector<std::string> names, values;
  PutUniform(client.get(), ep, "child/", 4, kChildValue, 'a', &names, &values);
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<char> buf(keys.size() * kChildValue);
  std::vector<Destination> dests;
  for (size_t i = 0; i < keys.size(); i++) {
    dests.push_back({MutableSlice(buf.data() + i * kChildValue, kChildValue)});
  }
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchGet(ep, keys, dests, &results).ok());  // connected before

  setenv("KV_UCX_CHILD_OWNER_PID", std::to_string(server.pid()).c_str(), 1);
  std::string output;
  const pid_t pid = StartChildUntil("UcxChild.WedgesOwnersFifos", ep, "wedged", &output);
  unsetenv("KV_UCX_CHILD_OWNER_PID");
  ASSERT_GT(pid, 0) << output;
  struct Reaper {  // the child goes on every path out (it holds this test's stderr)
    pid_t pid;
    ~Reaper() {
      if (pid > 0 && kill(pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
    }
  } reaper{pid};
  if (output.find("fifos 0\n") != std::string::npos) {
    GTEST_SKIP() << "no FIFO of UCX 1.13's layout found: " << output;
  }

  // The client connected before, and one that connects now, read on, bit exact, each
  // batch well within the timeout (3 s), while the dead client's slot stays unfilled.
  auto late = NewClient();
  for (Transport* t : {client.get(), late.get()}) {
    for (int round = 0; round < 10; round++) {
      std::memset(buf.data(), 0, buf.size());
      const auto start = std::chrono::steady_clock::now();
      Status s = t->BatchGet(ep, keys, dests, &results);
      const auto took = std::chrono::steady_clock::now() - start;
      ASSERT_TRUE(s.ok()) << s.ToString() << " " << t->StatsText();
      EXPECT_LT(took, std::chrono::seconds(1));
      for (size_t i = 0; i < keys.size(); i++) {
        ASSERT_EQ(results[i], static_cast<int64_t>(kChildValue));
        ASSERT_EQ(std::memcmp(buf.data() + i * kChildValue, values[i].data(), kChildValue), 0);
      }
    }
    // Read one-sided, over UCX: not by the TCP fallback.
    EXPECT_EQ(Stat(t->StatsText(), "ucx_tcp_batches"), 0u) << t->StatsText();
    EXPECT_GE(Stat(t->StatsText(), "ucx_gets"), 40u) << t->StatsText();
  }
  // The dead client's worker goes with its connection.
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  reaper.pid = -1;
  std::string stats;
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_clients_released") >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Stat(stats, "ucx_clients_released"), 1u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_clients"), 2u) << stats;
  ASSERT_TRUE(client->BatchGet(ep, keys, dests, &results).ok());
  EXPECT_TRUE(server.Alive());
}

// A tenant bound to namespaces is refused one-sided reads (they reach every namespace's
// values): its gets go by TCP, and still succeed.
TEST(UcxTest, TenantBoundToNamespacesReadsOverTcp) {
  SKIP_WITHOUT_UCX();
  const std::string dir = TempDir("ucx_tenant");
  const std::string tokens = dir + "/tokens";
  {
    std::ofstream f(tokens);
    f << "kvengine-tokens 1\ntenant ops opstoken0123456789 *\ntenant alpha alphatoken0123456 "
         "default\n";
  }
  Server server(dir + "/db", FreePort(), {"--auth_token_file=" + tokens});
  ASSERT_TRUE(server.Start());
  auto alpha = NewClient("alphatoken0123456", 3000, "alpha");
  auto ops = NewClient("opstoken0123456789", 3000, "ops");
  const Endpoint ep = server.endpoint();
  const std::string v = Uniform(100 << 10, 'q');
  std::vector<Slice> keys = {"plain-key"};
  std::vector<ValueParts> parts = {{Slice(v)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(alpha->BatchPut(ep, keys, parts, &results).ok());
  std::vector<char> buf(v.size());
  std::vector<Destination> d = {{MutableSlice(buf.data(), buf.size())}};
  ASSERT_TRUE(alpha->BatchGet(ep, keys, d, &results).ok());
  ASSERT_EQ(results[0], static_cast<int64_t>(v.size()));
  EXPECT_EQ(std::string(buf.begin(), buf.end()), v);
  EXPECT_EQ(Stat(alpha->StatsText(), "ucx_tcp_batches"), 1u);
  EXPECT_EQ(Stat(alpha->StatsText(), "ucx_gets"), 0u);
  // Nor may it write one-sidedly: its put went by TCP PUT.
  EXPECT_EQ(Stat(alpha->StatsText(), "ucx_puts"), 0u);
  EXPECT_EQ(Stat(alpha->StatsText(), "ucx_tcp_put_keys"), 1u);
  // The operator's tenant reads one-sided.
  std::fill(buf.begin(), buf.end(), 0);
  ASSERT_TRUE(ops->BatchGet(ep, keys, d, &results).ok());
  EXPECT_EQ(std::string(buf.begin(), buf.end()), v);
  EXPECT_EQ(Stat(ops->StatsText(), "ucx_gets"), 1u);
}

#ifdef KV_WITH_UCX
// A hand-made UCP worker that speaks the lease ops by active message as a client would,
// so that the test can send what no client sends.
class AmProbe {
 public:
  AmProbe() {
    ucp_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
    if (ucp_init(&params, nullptr, &context_) != UCS_OK) return;
    ucp_worker_params_t wp;
    std::memset(&wp, 0, sizeof(wp));
    if (ucp_worker_create(context_, &wp, &worker_) != UCS_OK) return;
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    if (ucp_worker_get_address(worker_, &addr, &len) != UCS_OK) return;
    address_.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker_, addr);
    const ucp_am_handler_param_t h = UcpAmHandlerParams(
        kUcxAmAnswer,
        [](void* arg, const void* header, size_t header_length, void* data, size_t length,
           const ucp_am_recv_param_t*) -> ucs_status_t {
          auto* self = static_cast<AmProbe*>(arg);
          if (header_length == 8) {
            self->answers_[DecodeFixed64(static_cast<const char*>(header))] =
                std::string(static_cast<const char*>(data), length);
          }
          return UCS_OK;
        },
        this);
    const ucp_am_handler_param_t r = UcpAmHandlerParams(
        kUcxAmReadData,
        [](void* arg, const void* header, size_t header_length, void* data, size_t length,
           const ucp_am_recv_param_t*) -> ucs_status_t {
          auto* self = static_cast<AmProbe*>(arg);
          if (header_length == kUcxAmReadDataHeader) {
            const char* h = static_cast<const char*>(header);
            self->read_answers_[DecodeFixed64(h)] =
                std::string(1, h[12]) + std::string(static_cast<const char*>(data), length);
          }
          return UCS_OK;
        },
        this);
    ok_ = ucp_worker_set_am_recv_handler(worker_, &h) == UCS_OK &&
          ucp_worker_set_am_recv_handler(worker_, &r) == UCS_OK;
  }
  ~AmProbe() {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    if (ep_ != nullptr) CloseUcpEndpointNow(worker_, ep_);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }
  bool ok() const { return ok_; }
  const std::string& address() const { return address_; }
  bool UnpackRkey(const std::string& rkey) {
    return ucp_ep_rkey_unpack(ep_, rkey.data(), &rkey_) == UCS_OK;
  }
  // Writes [data, data+n) at `addr` of the peer's memory one-sidedly, flushed.
  bool Put(uint64_t addr, const char* data, size_t n) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    void* req = ucp_put_nbx(ep_, data, n, addr, rkey_, &p);
    if (!Wait(req)) return false;
    return Wait(ucp_ep_flush_nbx(ep_, &p));
  }
  bool Connect(const std::string& server_address) {
    ucp_ep_params_t p;
    std::memset(&p, 0, sizeof(p));
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(server_address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // as the client's (where the transports allow)
    if (ucp_ep_create(worker_, &p, &ep_) == UCS_OK) return true;
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    return ucp_ep_create(worker_, &p, &ep_) == UCS_OK;
  }
  // Asks for one read of `length` bytes at `offset` in the arena (kUcxAmRead) under
  // `token` as request `id`; waits up to wait_ms for its answer: the status byte, then
  // the bytes.
  bool Read(uint64_t token, uint64_t id, uint64_t offset, uint64_t length, int wait_ms,
            std::string* answer) {
    std::string asked;
    PutFixed64(&asked, offset);
    PutFixed64(&asked, length);
    return Call(0, token, id, asked, wait_ms, answer, kUcxAmRead);
  }
  // Sends lease op `op` under `token` as request `id`; waits up to wait_ms for its answer.
  bool Call(uint8_t op, uint64_t token, uint64_t id, const std::string& meta, int wait_ms,
            std::string* answer, unsigned am_id = kUcxAmRequest) {
    std::map<uint64_t, std::string>& answers = am_id == kUcxAmRead ? read_answers_ : answers_;
    const std::string header = LeaseHeader(op, token, id);  // UCX reads it until done
    void* req = Send(am_id, header, meta);
    if (UCS_PTR_IS_ERR(req)) return false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_);
      if (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) != UCS_INPROGRESS) {
        ucp_request_free(req);
        req = nullptr;
      }
      if (answers.count(id) > 0 && req == nullptr) {
        *answer = answers[id];
        return true;
      }
    }
    return false;
  }

  // Sends lease op `op` as Call does, and neither waits nor progresses: its answer stays
  // unread (the send, if it could not go at once, is left to UCX).
  bool Post(uint8_t op, uint64_t token, uint64_t id, const std::string& meta) {
    // Held past this call: UCX may read the header until the send completes.
    posted_headers_.push_back(LeaseHeader(op, token, id));
    void* req = Send(kUcxAmRequest, posted_headers_.back(), meta);
    if (UCS_PTR_IS_ERR(req)) return false;
    if (req != nullptr) ucp_request_free(req);  // released by UCX once it completes
    return true;
  }

 private:
  // A lease op's active-message header: version 1, the op, the token, the request id.
  static std::string LeaseHeader(uint8_t op, uint64_t token, uint64_t id) {
    std::string header;
    header.push_back(1);
    header.push_back(static_cast<char>(op));
    PutFixed64(&header, token);
    PutFixed64(&header, id);
    return header;
  }
  // Sends `header` and `meta` eagerly as active message am_id; both must outlive the
  // returned request.
  void* Send(unsigned am_id, const std::string& header, const std::string& meta) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    return ucp_am_send_nbx(ep_, am_id, header.data(), header.size(), meta.data(), meta.size(), &p);
  }

  bool Wait(void* req) {
    if (UCS_PTR_IS_ERR(req)) return false;
    if (req == nullptr) return true;
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    ucp_request_free(req);
    return st == UCS_OK;
  }
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  std::string address_;
  std::map<uint64_t, std::string> answers_, read_answers_;
  std::deque<std::string> posted_headers_;  // Post's, kept while their sends may be pending
  bool ok_ = false;
};

// Lease ops by active message are served only under the token the server handed to an
// authenticated connection's kUcxConnect, and only while that connection lives: a
// wrong token, or the token of a closed connection, is dropped and counted.
TEST(UcxTest, LeaseOpsByActiveMessageNeedALiveClientsToken) {
  SKIP_WITHOUT_UCX();
  Server server(TempDir("ucx_am"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  const std::string value = Uniform(100000, 'v');
  std::vector<Slice> keys = {"am/k"};
  std::vector<ValueParts> parts = {{Slice(value)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());

  AmProbe probe;
  ASSERT_TRUE(probe.ok());
  auto conn = std::make_unique<RawConn>(ep);
  ASSERT_TRUE(conn->ok());
  std::string meta;
  UcxConnectRequest{probe.address()}.EncodeTo(&meta);
  ASSERT_TRUE(conn->Send(wire::kUcxConnect, meta));
  wire::FrameHeader h;
  std::string answer_meta;
  ASSERT_TRUE(conn->Read(&h, &answer_meta));
  std::string_view in(answer_meta);
  Status verdict;
  std::string_view theirs;
  ASSERT_TRUE(wire::GetBatchStatus(&in, &verdict) && GetLengthPrefixed(&in, &theirs));
  ASSERT_TRUE(verdict.ok()) << verdict.ToString();
  UcxConnectAnswer a;
  ASSERT_TRUE(UcxConnectAnswer::DecodeFrom(theirs, &a).ok());
  ASSERT_NE(a.token, 0u);
  EXPECT_EQ(a.lease_ttl_ms, 2000u);
  // The fresh private arena was placed in memory UCX allocated (read one-sided over
  // shared memory, not emulated); over TCP alone it is read by active message.
  EXPECT_EQ(a.reads_by_am, TcpOnly());
  EXPECT_EQ(Stat(ServerStats(client.get(), ep), "ucx_arena_placed"), TcpOnly() ? 0u : 1u);
  ASSERT_TRUE(probe.Connect(a.worker_address));

  std::string lookup, answer;
  EncodeLookupRequest(keys, &lookup);
  const uint64_t refused_before = Stat(ServerStats(client.get(), ep), "ucx_lease_ops_refused");
  // The server's count of refusals reaches `n` (it counts after the probe's call gave up).
  auto refused_reaches = [&](uint64_t n) {
    for (int i = 0; i < 250; i++) {
      if (Stat(ServerStats(client.get(), ep), "ucx_lease_ops_refused") >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  EXPECT_FALSE(probe.Call(wire::kLookup, a.token ^ 1, 1, lookup, 500, &answer));
  EXPECT_TRUE(refused_reaches(refused_before + 1));

  ASSERT_TRUE(probe.Call(wire::kLookup, a.token, 2, lookup, 5000, &answer));
  std::vector<int64_t> found;
  std::vector<RemoteLocation> where;
  ASSERT_TRUE(DecodeLookupAnswer(answer, 1, a.arena_len, &found, &where).ok());
  ASSERT_EQ(found[0], kLookupPinned);
  EXPECT_EQ(where[0].size, value.size());
  std::string release;
  const uint64_t lease = where[0].lease;
  EncodeReleaseRequest({&lease, 1}, &release);
  ASSERT_TRUE(probe.Call(wire::kRelease, a.token, 3, release, 5000, &answer));
  std::vector<uint8_t> held;
  ASSERT_TRUE(DecodeReleaseAnswer(answer, 1, &held).ok());
  EXPECT_EQ(held[0], 1);
  // Reads by active message: under the right token, inside the arena only.
  const uint64_t am_refused = Stat(ServerStats(client.get(), ep), "ucx_am_reads_refused");
  ASSERT_TRUE(probe.Read(a.token, 10, where[0].offset, 1000, 5000, &answer));
  EXPECT_EQ(answer, std::string(1, '\0') + value.substr(0, 1000));
  ASSERT_TRUE(probe.Read(a.token, 11, a.arena_len - 10, 11, 5000, &answer));
  EXPECT_EQ(answer, std::string(1, '\1'));  // refused: past the arena's end
  ASSERT_TRUE(probe.Read(a.token, 12, ~0ull - 5, 10, 5000, &answer));
  EXPECT_EQ(answer, std::string(1, '\1'));                         // refused: wraps around
  EXPECT_FALSE(probe.Read(a.token ^ 1, 13, 0, 10, 500, &answer));  // no such client
  EXPECT_FALSE(probe.Call(0, a.token, 14, "odd", 500, &answer, kUcxAmRead));  // malformed
  for (int i = 0; i < 100; i++) {
    if (Stat(ServerStats(client.get(), ep), "ucx_am_reads_refused") >= am_refused + 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Stat(ServerStats(client.get(), ep), "ucx_am_reads_refused"), am_refused + 4);
  // Garbage under the right token is answered Corruption, and serves nothing.
  ASSERT_TRUE(probe.Call(wire::kLookup, a.token, 4, "\xff\xff", 5000, &answer));
  EXPECT_TRUE(DecodeLookupAnswer(answer, 1, a.arena_len, &found, &where).IsCorruption());

  // The connection goes: its token with it.
  const uint64_t released = Stat(ServerStats(client.get(), ep), "ucx_clients_released");
  conn.reset();
  std::string stats;
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_clients_released") > released) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(Stat(stats, "ucx_clients_released"), released) << stats;
  EXPECT_FALSE(probe.Call(wire::kLookup, a.token, 5, lookup, 500, &answer));
  if (a.reads_by_am) {
    // Over UCX's TCP its worker serves every client: the op is dropped there, counted.
    EXPECT_TRUE(refused_reaches(refused_before + 2));
  } else {
    // A client read one-sided had a worker of its own on the server, gone with its
    // connection: nothing is left there to take the op.
    EXPECT_EQ(Stat(ServerStats(client.get(), ep), "ucx_lease_ops_refused"), refused_before + 1);
  }
  EXPECT_EQ(Stat(ServerStats(client.get(), ep), "leases_held"), 0u);

  // And the real client's gets went by active message.
  std::vector<char> buf(value.size());
  std::vector<Destination> d = {{MutableSlice(buf.data(), buf.size())}};
  ASSERT_TRUE(client->BatchGet(ep, keys, d, &results).ok());
  ASSERT_EQ(results[0], static_cast<int64_t>(value.size()));
  EXPECT_EQ(std::string(buf.begin(), buf.end()), value);
  EXPECT_GE(Stat(client->StatsText(), "ucx_lease_calls"), 1u) << client->StatsText();
  // Its reads took far less than half the lease's time to live: the RELEASE went one
  // way, and the server served it (no lease left behind).
  EXPECT_GE(Stat(client->StatsText(), "ucx_releases_by_age"), 1u) << client->StatsText();
  for (int i = 0; i < 100 && Stat(ServerStats(client.get(), ep), "leases_held") > 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Stat(ServerStats(client.get(), ep), "leases_held"), 0u);
}
// A probe connected to a server as an authenticated client would be: its control
// connection, its UCP endpoint, the arena's rkey, and the server's connect answer.
struct ProbeClient {
  std::unique_ptr<RawConn> conn;
  AmProbe probe;
  UcxConnectAnswer a;
  uint64_t next_call = 1;

  bool Connect(const Endpoint& ep) {
    conn = std::make_unique<RawConn>(ep);
    if (!conn->ok() || !probe.ok()) return false;
    std::string meta;
    UcxConnectRequest{probe.address()}.EncodeTo(&meta);
    wire::FrameHeader h;
    std::string answer;
    if (!conn->Send(wire::kUcxConnect, meta) || !conn->Read(&h, &answer)) return false;
    std::string_view in(answer);
    Status verdict;
    std::string_view theirs;
    if (!wire::GetBatchStatus(&in, &verdict) || !GetLengthPrefixed(&in, &theirs) || !verdict.ok() ||
        !UcxConnectAnswer::DecodeFrom(theirs, &a).ok()) {
      return false;
    }
    return probe.Connect(a.worker_address) && (a.reads_by_am || probe.UnpackRkey(a.rkey));
  }
  // RESERVE of one key of `size` bytes, under `token` (0: this probe's own).
  bool Reserve(const std::string& key, uint64_t size, UcxReserved* out) {
    std::string meta, answer;
    Slice k(key);
    EncodeUcxReserveRequest({&k, 1}, {&size, 1}, &meta);
    std::vector<UcxReserved> r;
    if (!probe.Call(wire::kReserve, a.token, next_call++, meta, 5000, &answer) ||
        !DecodeUcxReserveAnswer(answer, 1, &r).ok()) {
      return false;
    }
    *out = r[0];
    return true;
  }
  // COMMIT (publish) of reservation `id`: its result in *result.
  bool Commit(uint64_t id, int64_t* result) {
    std::string meta, answer;
    const uint8_t publish = 1;
    EncodeUcxCommitRequest({&id, 1}, {&publish, 1}, &meta);
    std::vector<int64_t> r;
    if (!probe.Call(wire::kCommit, a.token, next_call++, meta, 5000, &answer) ||
        !DecodeUcxCommitAnswer(answer, 1, &r).ok()) {
      return false;
    }
    *result = r[0];
    return true;
  }
};

// A client that asks and never reads the answers stalls nothing on the owner: the
// answers fill its receive FIFO (or socket) and the owner's further sends wait on its
// worker, which ucp_worker_arm then calls busy for as long.  The owner neither spins on
// it holding its lock (other clients read on, and connect) nor hangs closing that
// client's endpoint when its connection goes.
TEST(UcxTest, ClientThatNeverReadsItsAnswersStallsNothing) {
  SKIP_WITHOUT_UCX();
  Server server(TempDir("ucx_deaf"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  std::vector<std::string> names, values;
  PutUniform(client.get(), ep, "deaf/", 4, 64 << 10, 'a', &names, &values);
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<char> buf(keys.size() << 16);
  std::vector<Destination> dests;
  for (size_t i = 0; i < keys.size(); i++) {
    dests.push_back({MutableSlice(buf.data() + (i << 16), 1 << 16)});
  }
  std::vector<int64_t> results;
  // Reads every key with `t`, bit exact and well within the timeout (3 s).
  auto reads_on = [&](Transport* t) {
    for (int round = 0; round < 5; round++) {
      std::memset(buf.data(), 0, buf.size());
      const auto start = std::chrono::steady_clock::now();
      Status s = t->BatchGet(ep, keys, dests, &results);
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
      if (!s.ok()) return ::testing::AssertionFailure() << s.ToString() << t->StatsText();
      for (size_t i = 0; i < keys.size(); i++) {
        if (results[i] != 1 << 16 ||
            std::memcmp(buf.data() + (i << 16), values[i].data(), 1 << 16)) {
          return ::testing::AssertionFailure() << "key " << i << " read wrong";
        }
      }
    }
    return ::testing::AssertionSuccess();
  };
  ASSERT_TRUE(reads_on(client.get()));

  ProbeClient deaf;
  ASSERT_TRUE(deaf.Connect(ep));
  std::string lookup;
  EncodeLookupRequest({keys.data(), 1}, &lookup);
  std::string answer;  // one op answered first: the endpoint is wired up (over TCP too)
  ASSERT_TRUE(deaf.probe.Call(wire::kLookup, deaf.a.token, 1000, lookup, 5000, &answer));
  const uint64_t served_before = Stat(ServerStats(client.get(), ep), "ucx_lease_ops");
  // Far more answers than a FIFO holds (64 here), paced so that the owner has taken in
  // each 8 before the next go: a send the owner's FIFO has no room for would wait for
  // this client's progress, which never comes, and so would every later one.
  auto served = [&] { return Stat(ServerStats(client.get(), ep), "ucx_lease_ops"); };
  for (uint64_t id = 1; id <= 400; id++) {
    ASSERT_TRUE(deaf.probe.Post(wire::kLookup, deaf.a.token, id, lookup));
    if (id % 8 != 0) continue;
    for (int i = 0; i < 500 && served() < served_before + id; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  EXPECT_GE(Stat(ServerStats(client.get(), ep), "ucx_lease_ops"), served_before + 200);
  EXPECT_TRUE(reads_on(client.get()));
  auto late = NewClient();
  EXPECT_TRUE(reads_on(late.get()));

  // Its connection goes: its endpoint is closed, answers still waiting and all.
  const uint64_t released = Stat(ServerStats(client.get(), ep), "ucx_clients_released");
  deaf.conn.reset();
  std::string stats;
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_clients_released") > released) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Stat(stats, "ucx_clients_released"), released + 1) << stats;
  EXPECT_TRUE(reads_on(client.get()));
  auto after = NewClient();
  EXPECT_TRUE(reads_on(after.get()));
  EXPECT_TRUE(server.Alive());
}

// Over UCX's TCP alone clients are read by active message and put by TCP PUT, never
// one-sidedly (UcxConnectAnswer::reads_by_am): the one-sided put tests run elsewhere
// (ucx_sm.*), and UcxPutTest.ClientsReadByActiveMessagePutOverTcp runs here instead.
#define SKIP_WITHOUT_ONE_SIDED_PUTS()                                             \
  do {                                                                            \
    SKIP_WITHOUT_UCX();                                                           \
    if (TcpOnly()) GTEST_SKIP() << "over UCX's TCP alone puts are not one-sided"; \
  } while (0)

// Reads keys[i] into a buffer registered with the client; its bytes in (*got)[i]
// (empty with a negative result: the result's code as a string).
void ReadBack(Transport* client, const Endpoint& ep, const std::vector<Slice>& keys,
              size_t capacity, std::vector<std::string>* got) {
  std::vector<char> buf(capacity * keys.size() + 1);
  ASSERT_TRUE(client->RegisterMemory(buf.data(), buf.size(), "test buffer").ok());
  std::vector<Destination> dests;
  for (size_t i = 0; i < keys.size(); i++) {
    dests.push_back({MutableSlice(buf.data() + i * capacity, capacity)});
  }
  std::vector<int64_t> results;
  Status s = client->BatchGet(ep, keys, dests, &results);
  client->UnregisterMemory(buf.data(), buf.size());
  ASSERT_TRUE(s.ok()) << s.ToString();
  got->clear();
  for (size_t i = 0; i < keys.size(); i++) {
    got->push_back(results[i] < 0 ? "error " + std::to_string(results[i])
                                  : std::string(buf.data() + i * capacity, results[i]));
  }
}

// Puts are written one-sidedly into room the owner reserved, and committed: every size
// (empty, small, 64 KiB, several MiB, a value in parts), a batch, and overwrites, all
// bit-exact; no key goes by TCP.
TEST(UcxPutTest, PutsAreOneSidedAndBitExact) {
  SKIP_WITHOUT_ONE_SIDED_PUTS();
  Server server(TempDir("ucx_puts"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient("", 10000);
  const Endpoint ep = server.endpoint();
  std::mt19937_64 rng(11);
  const std::vector<size_t> sizes = {0, 1, 4095, 64 << 10, 1 << 20, (5 << 20) + 7};
  std::vector<std::string> names, values;
  for (size_t i = 0; i < sizes.size(); i++) {
    names.push_back("put/k" + std::to_string(i));
    values.push_back(RandomValue(&rng, sizes[i]));
  }
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<ValueParts> parts;
  for (const auto& v : values) parts.push_back({Slice(v)});
  // The last value in three parts.
  const std::string& last = values.back();
  parts.back() = {Slice(last.data(), 10), Slice(last.data() + 10, 1 << 20),
                  Slice(last.data() + 10 + (1 << 20), last.size() - 10 - (1 << 20))};
  std::vector<int64_t> results;
  Status s = client->BatchPut(ep, keys, parts, &results);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < keys.size(); i++) ASSERT_EQ(results[i], 0) << i;
  std::string stats = client->StatsText();
  EXPECT_EQ(Stat(stats, "ucx_puts"), sizes.size()) << stats;
  EXPECT_EQ(Stat(stats, "ucx_tcp_put_keys"), 0u) << stats;
  std::string server_stats = ServerStats(client.get(), ep);
  EXPECT_EQ(Stat(server_stats, "ucx_puts_served"), sizes.size()) << server_stats;
  EXPECT_EQ(Stat(server_stats, "ucx_reservations"), 0u) << server_stats;
  std::vector<std::string> got;
  ReadBack(client.get(), ep, keys, 6 << 20, &got);
  for (size_t i = 0; i < keys.size(); i++) EXPECT_TRUE(got[i] == values[i]) << i;

  // A batch of 64 values of 64 KiB.
  std::vector<std::string> bn, bv;
  for (int i = 0; i < 64; i++) {
    bn.push_back("put/batch" + std::to_string(i));
    bv.push_back(RandomValue(&rng, 64 << 10));
  }
  std::vector<Slice> bk(bn.begin(), bn.end());
  std::vector<ValueParts> bp;
  for (const auto& v : bv) bp.push_back({Slice(v)});
  ASSERT_TRUE(client->BatchPut(ep, bk, bp, &results).ok());
  for (int64_t r : results) ASSERT_EQ(r, 0);
  ReadBack(client.get(), ep, bk, 64 << 10, &got);
  for (size_t i = 0; i < bk.size(); i++) EXPECT_TRUE(got[i] == bv[i]) << i;

  // Overwrites, to other sizes.
  for (size_t i = 0; i < values.size(); i++) {
    values[i] = RandomValue(&rng, (i * 37 << 10) + 3);
    parts[i] = {Slice(values[i])};
  }
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  for (int64_t r : results) ASSERT_EQ(r, 0);
  ReadBack(client.get(), ep, keys, 6 << 20, &got);
  for (size_t i = 0; i < keys.size(); i++) EXPECT_TRUE(got[i] == values[i]) << i;
  stats = client->StatsText();
  EXPECT_EQ(Stat(stats, "ucx_puts"), 2 * sizes.size() + 64) << stats;
  EXPECT_EQ(Stat(stats, "ucx_tcp_put_keys"), 0u) << stats;
}

// A put's bytes come straight from a buffer registered with the transport; from any
// other memory they go through the transport's bounce buffer (a value larger than it
// in rounds), counted.
TEST(UcxPutTest, RegisteredSourcesAreWrittenDirectlyOthersBounced) {
  SKIP_WITHOUT_ONE_SIDED_PUTS();
  Server server(TempDir("ucx_put_bounce"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient("", 10000);
  const Endpoint ep = server.endpoint();
  std::mt19937_64 rng(5);
  std::string registered = RandomValue(&rng, 1 << 20);
  ASSERT_TRUE(client->RegisterMemory(registered.data(), registered.size(), "values").ok());
  std::vector<Slice> keys = {"bounce/direct"};
  std::vector<ValueParts> parts = {{Slice(registered)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  ASSERT_EQ(results[0], 0);
  std::string stats = client->StatsText();
  EXPECT_EQ(Stat(stats, "ucx_direct_ops"), 1u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_direct_bytes"), 1u << 20) << stats;
  EXPECT_EQ(Stat(stats, "ucx_bounce_ops"), 0u) << stats;

  const std::string plain = RandomValue(&rng, (9 << 20) + 1);  // over two bounce rounds
  keys = {"bounce/plain"};
  parts = {{Slice(plain)}};
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  ASSERT_EQ(results[0], 0);
  stats = client->StatsText();
  EXPECT_EQ(Stat(stats, "ucx_direct_ops"), 1u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_bounce_ops"), 1u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_bounce_bytes"), plain.size()) << stats;

  std::vector<Slice> both = {"bounce/direct", "bounce/plain"};
  std::vector<std::string> got;
  ReadBack(client.get(), ep, both, 10 << 20, &got);
  EXPECT_TRUE(got[0] == registered);
  EXPECT_TRUE(got[1] == plain);
  client->UnregisterMemory(registered.data(), registered.size());
}

// A put racing gets of the same key: every get sees one whole value (each is one
// repeated byte), never a mix, never a half-written one.
TEST(UcxPutTest, PutsRacingGetsAreNeverSeenHalfWritten) {
  SKIP_WITHOUT_ONE_SIDED_PUTS();
  Server server(TempDir("ucx_put_race"), FreePort());
  ASSERT_TRUE(server.Start());
  auto writer = NewClient("", 10000);
  auto reader = NewClient("", 10000);
  const Endpoint ep = server.endpoint();
  const size_t kSize = 1 << 20;
  const std::string va = Uniform(kSize, 'a'), vb = Uniform(kSize, 'b');
  std::vector<Slice> keys = {"race/k"};
  std::vector<int64_t> results;
  std::vector<ValueParts> parts = {{Slice(va)}};
  ASSERT_TRUE(writer->BatchPut(ep, keys, parts, &results).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, reads{0}, puts{0};
  std::thread w([&] {
    for (int i = 0; !stop.load(); i++) {
      std::vector<ValueParts> p = {{Slice(i % 2 == 0 ? vb : va)}};
      std::vector<int64_t> r;
      if (writer->BatchPut(ep, keys, p, &r).ok() && r[0] == 0) puts++;
    }
  });
  std::vector<char> buf(kSize);
  ASSERT_TRUE(reader->RegisterMemory(buf.data(), buf.size(), "test buffer").ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    std::vector<Destination> d = {{MutableSlice(buf.data(), buf.size())}};
    std::vector<int64_t> r;
    if (!reader->BatchGet(ep, keys, d, &r).ok() || r[0] < 0) continue;
    reads++;
    if (r[0] != static_cast<int64_t>(kSize) ||
        std::count(buf.begin(), buf.end(), buf[0]) != static_cast<long>(kSize) ||
        (buf[0] != 'a' && buf[0] != 'b')) {
      torn++;
    }
  }
  stop.store(true);
  w.join();
  reader->UnregisterMemory(buf.data(), buf.size());
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_GT(puts.load(), 1);
  EXPECT_EQ(Stat(writer->StatsText(), "ucx_tcp_put_keys"), 0u) << writer->StatsText();
}

TEST(UcxChild, ReservesAndDies) {
  const char* peer = std::getenv("KV_UCX_CHILD_PEER");
  if (peer == nullptr)
    GTEST_SKIP() << "the child of UcxPutTest.ClientKilledBetweenReserveAndCommit";
  UseUcx();
  Endpoint ep;
  ASSERT_TRUE(Endpoint::Parse(peer, &ep).ok());
  ProbeClient c;
  ASSERT_TRUE(c.Connect(ep));
  UcxReserved r;
  ASSERT_TRUE(c.Reserve("kill/k", 1 << 20, &r));
  ASSERT_EQ(r.result, 0);
  // Half of the new value written, then killed before the commit.
  const std::string half = Uniform(512 << 10, 'z');
  ASSERT_TRUE(c.probe.Put(c.a.arena_addr + r.offset, half.data(), half.size()));
  std::printf("reserved\n");
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// A client killed between RESERVE and COMMIT leaks nothing on the owner (its room is
// taken back when its connection drops, counted) and publishes nothing: the key keeps
// its old value, whole.
TEST(UcxPutTest, ClientKilledBetweenReserveAndCommitLeaksNothing) {
  SKIP_WITHOUT_ONE_SIDED_PUTS();
  Server server(TempDir("ucx_put_kill"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  const std::string old = Uniform(1 << 20, 'o');
  std::vector<Slice> keys = {"kill/k"};
  std::vector<ValueParts> parts = {{Slice(old)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  ASSERT_EQ(results[0], 0);
  std::string all;
  const pid_t pid = StartChildUntil("UcxChild.ReservesAndDies", ep, "reserved", &all);
  ASSERT_GT(pid, 0) << all;
  std::string stats = ServerStats(client.get(), ep);
  EXPECT_EQ(Stat(stats, "ucx_reservations"), 1u) << stats;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_reservations") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Stat(stats, "ucx_reservations"), 0u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_reservations_reclaimed"), 1u) << stats;
  std::vector<std::string> got;
  ReadBack(client.get(), ep, keys, 1 << 20, &got);
  EXPECT_TRUE(got[0] == old) << got[0].substr(0, 16);
  // The room was given back: the owner still takes puts of the key, and serves.
  const std::string fresh = Uniform(1 << 20, 'f');
  parts = {{Slice(fresh)}};
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  ASSERT_EQ(results[0], 0);
  ReadBack(client.get(), ep, keys, 1 << 20, &got);
  EXPECT_TRUE(got[0] == fresh);
  EXPECT_TRUE(server.Alive());
}

// A reservation is its client's alone, and lives only its time to live: a COMMIT of
// another client's reservation, or of one expired, is refused (Aborted, counted), and
// publishes nothing; an expired one's room is taken back.
TEST(UcxPutTest, ReservationsExpireAndBelongToTheirClient) {
  SKIP_WITHOUT_ONE_SIDED_PUTS();
  setenv("KVENGINE_UCX_PUT_TTL_MS", "400", 1);
  Server server(TempDir("ucx_put_ttl"), FreePort());
  const bool started = server.Start();
  unsetenv("KVENGINE_UCX_PUT_TTL_MS");
  ASSERT_TRUE(started);
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  ProbeClient a, b;
  ASSERT_TRUE(a.Connect(ep));
  ASSERT_TRUE(b.Connect(ep));
  EXPECT_EQ(a.a.put_ttl_ms, 400u);
  const int64_t aborted = Status::Aborted("").ErrorCode();

  // Written and committed in time: published.
  const std::string v = Uniform(100, 'p');
  UcxReserved r;
  ASSERT_TRUE(a.Reserve("ttl/ok", v.size(), &r));
  ASSERT_EQ(r.result, 0);
  ASSERT_TRUE(a.probe.Put(a.a.arena_addr + r.offset, v.data(), v.size()));
  int64_t result = -1;
  ASSERT_TRUE(a.Commit(r.id, &result));
  EXPECT_EQ(result, 0);

  // Another client's commit of a's reservation is refused; a's own still works after.
  ASSERT_TRUE(a.Reserve("ttl/theirs", v.size(), &r));
  ASSERT_EQ(r.result, 0);
  ASSERT_TRUE(a.probe.Put(a.a.arena_addr + r.offset, v.data(), v.size()));
  ASSERT_TRUE(b.Commit(r.id, &result));
  EXPECT_EQ(result, aborted);
  ASSERT_TRUE(a.Commit(r.id, &result));
  EXPECT_EQ(result, 0);
  // Committed once only.
  ASSERT_TRUE(a.Commit(r.id, &result));
  EXPECT_EQ(result, aborted);

  // Not committed in time: ended (quarantined: see the test below), and its late commit
  // refused.
  ASSERT_TRUE(a.Reserve("ttl/late", v.size(), &r));
  ASSERT_EQ(r.result, 0);
  std::string stats;
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_reservations_quarantined") >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Stat(stats, "ucx_reservations_quarantined"), 1u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_reservations"), 0u) << stats;
  ASSERT_TRUE(a.Commit(r.id, &result));
  EXPECT_EQ(result, aborted);
  stats = ServerStats(client.get(), ep);
  EXPECT_EQ(Stat(stats, "ucx_commits_refused"), 3u) << stats;

  std::vector<Slice> keys = {"ttl/ok", "ttl/theirs", "ttl/late"};
  std::vector<std::string> got;
  ReadBack(client.get(), ep, keys, 4096, &got);
  EXPECT_EQ(got[0], v);
  EXPECT_EQ(got[1], v);
  EXPECT_EQ(got[2], "error " + std::to_string(Status::NotFound("").ErrorCode()));
}

// A live client's put that lands after its reservation expired must not overwrite
// another value: the expired room is quarantined with its client -- a COMMIT of it
// refused, the room kept from the allocator (and charged as before) -- until the
// client's connection closes, and only then given back.  Before, the owner gave the
// room back at expiry and the next put of the same size was handed it: the late bytes
// then replaced that value's.
TEST(UcxPutTest, ExpiredRoomIsQuarantinedUntilItsClientLeaves) {
  SKIP_WITHOUT_ONE_SIDED_PUTS();
  setenv("KVENGINE_UCX_PUT_TTL_MS", "300", 1);
  Server server(TempDir("ucx_put_quarantine"), FreePort());
  const bool started = server.Start();
  unsetenv("KVENGINE_UCX_PUT_TTL_MS");
  ASSERT_TRUE(started);
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  auto late = std::make_unique<ProbeClient>();
  ASSERT_TRUE(late->Connect(ep));
  const size_t kSize = 4096;
  const int kRooms = 8;
  // A value in the same slab keeps it live, so that room given back would be the
  // slab's next handed out (db/slab_allocator.cc).
  std::vector<std::string> anchor_names, anchor_values;
  PutUniform(client.get(), ep, "anchor/", 1, kSize, 'a', &anchor_names, &anchor_values);
  std::vector<UcxReserved> rooms(kRooms);
  for (int i = 0; i < kRooms; i++) {
    ASSERT_TRUE(late->Reserve("late/k" + std::to_string(i), kSize, &rooms[i]));
    ASSERT_EQ(rooms[i].result, 0);
  }
  std::string stats;
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_reservations_quarantined") >= kRooms) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(Stat(stats, "ucx_reservations_quarantined"), static_cast<uint64_t>(kRooms)) << stats;
  EXPECT_EQ(Stat(stats, "ucx_reservations_reclaimed"), 0u) << stats;

  // Others put values of the same size meanwhile: none gets the quarantined room.
  std::vector<std::string> names, values;
  PutUniform(client.get(), ep, "other/", 2 * kRooms, kSize, 'A', &names, &values);
  // The late client's bytes land now, into the rooms it was granted.
  const std::string junk = Uniform(kSize, '!');
  for (const UcxReserved& r : rooms) {
    ASSERT_TRUE(late->probe.Put(late->a.arena_addr + r.offset, junk.data(), junk.size()));
  }
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<std::string> got;
  ReadBack(client.get(), ep, keys, kSize, &got);
  for (size_t i = 0; i < keys.size(); i++) EXPECT_TRUE(got[i] == values[i]) << names[i];
  int64_t result = 0;
  ASSERT_TRUE(late->Commit(rooms[0].id, &result));
  EXPECT_EQ(result, Status::Aborted("").ErrorCode());

  // Its connection closes: the room goes back, counted.
  late.reset();
  for (int i = 0; i < 100; i++) {
    stats = ServerStats(client.get(), ep);
    if (Stat(stats, "ucx_reservations_quarantined") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Stat(stats, "ucx_reservations_quarantined"), 0u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_reservations_reclaimed"), static_cast<uint64_t>(kRooms)) << stats;
  ReadBack(client.get(), ep, keys, kSize, &got);
  for (size_t i = 0; i < keys.size(); i++) EXPECT_TRUE(got[i] == values[i]) << names[i];
  EXPECT_TRUE(server.Alive());
}

// A client read by active message (UCX's TCP alone) is offered no one-sided puts
// (put_ttl_ms 0): UCX emulates ucp_put_nbx there from inside the owner's progress, as it
// does gets, and a client dying mid-put would abort the owner.  Its puts go by TCP PUT,
// bit exact; and the owner refuses such a client's RESERVE even when sent anyway.
TEST(UcxPutTest, ClientsReadByActiveMessagePutOverTcp) {
  SKIP_WITHOUT_UCX();
  if (!TcpOnly()) GTEST_SKIP() << "reads by active message are UCX's TCP's alone";
  Server server(TempDir("ucx_put_by_am"), FreePort());
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  std::mt19937_64 rng(13);
  std::vector<std::string> names, values;
  for (int i = 0; i < 4; i++) {
    names.push_back("byam/k" + std::to_string(i));
    values.push_back(RandomValue(&rng, (256 << 10) * i + 5));
  }
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<ValueParts> parts;
  for (const auto& v : values) parts.push_back({Slice(v)});
  std::vector<int64_t> results;
  for (int round = 0; round < 2; round++) {  // on a fresh connection, then a kept one
    ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
    for (int64_t r : results) ASSERT_EQ(r, 0);
    std::vector<std::string> got;
    ReadBack(client.get(), ep, keys, 1 << 20, &got);
    for (size_t i = 0; i < keys.size(); i++) EXPECT_TRUE(got[i] == values[i]) << i;
  }
  std::string stats = client->StatsText();
  EXPECT_EQ(Stat(stats, "ucx_puts"), 0u) << stats;
  EXPECT_EQ(Stat(stats, "ucx_tcp_put_keys"), 2 * keys.size()) << stats;
  EXPECT_GE(Stat(stats, "ucx_reads_by_am"), 2 * keys.size()) << stats;

  ProbeClient probe;
  ASSERT_TRUE(probe.Connect(ep));
  EXPECT_TRUE(probe.a.reads_by_am);
  EXPECT_EQ(probe.a.put_ttl_ms, 0u);
  std::string meta, answer;
  Slice k("byam/probe");
  const uint64_t size = 4096;
  EncodeUcxReserveRequest({&k, 1}, {&size, 1}, &meta);
  ASSERT_TRUE(probe.probe.Call(wire::kReserve, probe.a.token, 1, meta, 5000, &answer));
  std::vector<UcxReserved> r;
  EXPECT_TRUE(DecodeUcxReserveAnswer(answer, 1, &r).IsNotSupported());
  std::string server_stats = ServerStats(client.get(), ep);
  EXPECT_EQ(Stat(server_stats, "ucx_puts_served"), 0u) << server_stats;
  EXPECT_EQ(Stat(server_stats, "ucx_reservations"), 0u) << server_stats;
  EXPECT_TRUE(server.Alive());
}
#endif  // KV_WITH_UCX

// An arena attached clients map (a memfd: the server also listens locally) is not placed:
// UCX reads it by emulation, and the values still come back bit-exact.
TEST(UcxTest, ASharedArenaIsNotPlacedAndStillServes) {
  SKIP_WITHOUT_UCX();
  const std::string dir = TempDir("ucx_shared_arena");
  Server server(dir + "/db", FreePort(), {"--local_listen=" + dir + "/attach.sock"});
  ASSERT_TRUE(server.Start());
  auto client = NewClient();
  const Endpoint ep = server.endpoint();
  const std::string value = Uniform(300000, 's');
  std::vector<Slice> keys = {"shared/k"};
  std::vector<ValueParts> parts = {{Slice(value)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(client->BatchPut(ep, keys, parts, &results).ok());
  std::vector<char> buf(value.size());
  ASSERT_TRUE(client->RegisterMemory(buf.data(), buf.size(), "user buffer").ok());
  std::vector<Destination> d = {{MutableSlice(buf.data(), buf.size())}};
  ASSERT_TRUE(client->BatchGet(ep, keys, d, &results).ok());
  ASSERT_EQ(results[0], static_cast<int64_t>(value.size()));
  EXPECT_EQ(std::string(buf.begin(), buf.end()), value);
  EXPECT_GE(Stat(client->StatsText(), "ucx_gets"), 1u) << client->StatsText();
  EXPECT_EQ(Stat(ServerStats(client.get(), ep), "ucx_arena_placed"), 0u);
  // Puts into an unplaced arena would be emulated by the owner's thread: they go by TCP.
  EXPECT_EQ(Stat(client->StatsText(), "ucx_puts"), 0u) << client->StatsText();
  EXPECT_EQ(Stat(client->StatsText(), "ucx_tcp_put_keys"), 1u) << client->StatsText();
  client->UnregisterMemory(buf.data(), buf.size());
}

// A client without the token never gets the worker address nor the rkey: a hand-driven
// kUcxConnect before authentication closes the connection.
TEST(UcxTest, NoRkeyBeforeAuthentication) {
  SKIP_WITHOUT_UCX();
  const std::string dir = TempDir("ucx_auth");
  const std::string tokens = dir + "/token";
  {
    std::ofstream f(tokens);
    f << "secret-token-0123456789\n";
  }
  Server server(dir + "/db", FreePort(), {"--auth_token_file=" + tokens});
  ASSERT_TRUE(server.Start());
  RawConn wrong(server.endpoint(), 2000, "not-the-token");
  EXPECT_FALSE(wrong.ok());
  int fd = -1;
  ASSERT_TRUE(ConnectTcp(server.endpoint(), DeadlineIn(2000), &fd).ok());
  std::string meta;
  UcxConnectRequest{"whatever"}.EncodeTo(&meta);
  std::vector<Slice> no_body;
  // Read the challenge, then send the connect request instead of AUTH.
  char challenge[256];
  ASSERT_TRUE(WaitReadable(fd, DeadlineIn(2000)).ok());
  ASSERT_GT(recv(fd, challenge, sizeof(challenge), 0), 0);
  ASSERT_TRUE(SendFrame(fd, wire::kUcxConnect, 0, 1, meta, no_body, DeadlineIn(2000)).ok());
  char byte;
  ASSERT_TRUE(WaitReadable(fd, DeadlineIn(2000)).ok());
  EXPECT_LE(recv(fd, &byte, 1, 0), 0);  // closed, nothing answered
  close(fd);
  auto good = NewClient("secret-token-0123456789");
  EXPECT_EQ(Stat(ServerStats(good.get(), server.endpoint()), "ucx_clients"), 0u);
}

}  // namespace
}  // namespace kvengine
