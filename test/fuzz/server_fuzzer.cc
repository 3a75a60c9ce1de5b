// Fuzz target: the peer server (transport/server.cc) as a peer reaches it, over a
// loopback TCP connection.
//
// One server, over an in-memory service, runs for the whole fuzzing session.  Each input
// opens a connection, takes the challenge, and sends frames the input describes: an
// authentication first (unless the input says not to), then up to six requests of any
// op with metadata that is either well-formed (keys, sizes, lease ids, a pattern) or
// raw bytes, and a body.  Each frame carries its true checksum (over its body too, or
// not: kFlagBodyUnhashed) unless the input asks for a wrong one; lengths are the true
// ones, so the server never waits for bytes that will not come.  The input then closes
// its side and reads whatever the server answers.
// The wire target checks the decoders' results; this one reaches everything the server
// does with them (sizes against the body, release lists, properties, regexes).
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "test/fuzz/fuzz_check.h"
#include "transport/server.h"
#include "transport/socket_util.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/key_pattern.h"
#include "util/mutex.h"

namespace kvengine {
namespace {

// A DB's peer-facing calls over a map, the regex ones as DB::DeleteByRegex does them.
class MemoryService final : public PeerService {
 public:
  bool Pin(const Slice& key, PinnedValue* out) override {
    kvengine::MutexLock lock(&mu_);
    auto it = values_.find(key.ToString());
    if (it == values_.end()) return false;
    auto copy = std::make_shared<std::string>(it->second);
    out->data = copy->data();
    out->size = copy->size();
    out->pin = copy;
    return true;
  }
  bool TryPin(const Slice& key, PinnedValue* out) override { return Pin(key, out); }
  const char* ArenaBase() const override { return nullptr; }
  Status GetValueSize(const Slice& key, uint64_t* size) override {
    kvengine::MutexLock lock(&mu_);
    auto it = values_.find(key.ToString());
    if (it == values_.end()) return Status::NotFound("");
    *size = it->second.size();
    return Status::OK();
  }
  Status BatchGetInto(std::span<const Slice> keys, std::span<const Destination> dests,
                      std::vector<int64_t>* results) override {
    results->assign(keys.size(), Status::NotFound("").ErrorCode());
    kvengine::MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); i++) {
      auto it = values_.find(keys[i].ToString());
      if (it == values_.end()) continue;
      uint64_t capacity = 0;
      for (const MutableSlice& part : dests[i]) capacity += part.size();
      if (capacity < it->second.size()) {
        (*results)[i] = Status::BufferTooSmall("").ErrorCode();
        continue;
      }
      std::memcpy(dests[i][0].data(), it->second.data(), it->second.size());
      (*results)[i] = static_cast<int64_t>(it->second.size());
    }
    return Status::OK();
  }
  Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                  std::vector<int64_t>* results) override {
    kvengine::MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); i++) {
      std::string v;
      for (const Slice& part : values[i]) v.append(part.data(), part.size());
      values_[keys[i].ToString()] = std::move(v);
    }
    results->assign(keys.size(), 0);
    return Status::OK();
  }
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    kvengine::MutexLock lock(&mu_);
    results->clear();
    for (const Slice& k : keys) results->push_back(values_.count(k.ToString()));
    return Status::OK();
  }
  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    kvengine::MutexLock lock(&mu_);
    for (const Slice& k : keys) values_.erase(k.ToString());
    results->assign(keys.size(), 0);
    return Status::OK();
  }
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override {
    kvengine::KeyPattern re;
    Status s = re.Compile(pattern);
    if (!s.ok()) return s;
    kvengine::MutexLock lock(&mu_);
    *deleted = std::erase_if(values_, [&re](const auto& kv) { return re.Matches(kv.first); });
    return Status::OK();
  }
  Status DeleteAll(uint64_t* deleted) override {
    kvengine::MutexLock lock(&mu_);
    *deleted = values_.size();
    values_.clear();
    return Status::OK();
  }
  bool GetProperty(const std::string& name, std::string* value) override {
    if (name != "kvengine.stats") return false;
    *value = "stats";
    return true;
  }

 private:
  kvengine::Mutex mu_;
  std::map<std::string, std::string> values_ GUARDED_BY(mu_);
};

MemoryService* service = nullptr;
TransportServer* server = nullptr;

// One request's metadata and body, as the input describes them.
void MakeRequest(FuzzedDataProvider& in, uint8_t op, std::string* meta, std::string* body) {
  if (in.ConsumeBool()) {  // raw bytes
    *meta = in.ConsumeRandomLengthString(256);
    if (op == wire::kPut) *body = in.ConsumeRandomLengthString(256);
    return;
  }
  switch (op) {
    case wire::kRelease: {
      const uint32_t n = in.ConsumeIntegralInRange<uint32_t>(0, 4);
      PutFixed32(meta, n);
      for (uint32_t i = 0; i < n; i++) PutFixed64(meta, in.ConsumeIntegralInRange<uint64_t>(0, 9));
      return;
    }
    case wire::kProperty:
      PutLengthPrefixed(meta,
                        in.ConsumeBool() ? "kvengine.stats" : in.ConsumeRandomLengthString(32));
      return;
    case wire::kDeleteMatching: {
      const bool all = in.ConsumeBool();
      wire::PutDeleteMatching(meta, all ? wire::kMatchAll : wire::kMatchRegex,
                              all ? "" : in.ConsumeRandomLengthString(64));
      return;
    }
    default: {
      std::vector<std::string> keys(in.ConsumeIntegralInRange<size_t>(0, 4));
      std::vector<uint64_t> extra;
      for (std::string& k : keys) {
        k = in.ConsumeBool() ? "k" + std::to_string(in.ConsumeIntegralInRange(0, 3))
                             : in.ConsumeRandomLengthString(16);
        extra.push_back(in.ConsumeIntegralInRange<uint64_t>(0, 64));
      }
      std::vector<Slice> slices(keys.begin(), keys.end());
      const bool with_extra = op == wire::kGet || op == wire::kPut;
      wire::PutKeys(meta, slices, with_extra ? extra.data() : nullptr);
      if (op == wire::kPut) {
        uint64_t total = 0;
        for (uint64_t n : extra) total += n;
        if (in.ConsumeBool()) total = in.ConsumeIntegralInRange<uint64_t>(0, 300);
        *body = std::string(total, 'v');
      }
    }
  }
}

void AppendFrame(FuzzedDataProvider& in, uint8_t op, const std::string& meta,
                 const std::string& body, std::string* out) {
  wire::FrameHeader h;
  h.op = op;
  // Mostly a plain request; sometimes a response (refused), or a body left out of the
  // checksum (allowed: the connection is loopback), or both.
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      h.flags = wire::kFlagResponse;
      break;
    case 1:
      h.flags = wire::kFlagBodyUnhashed;
      break;
    case 2:
      h.flags = wire::kFlagResponse | wire::kFlagBodyUnhashed;
      break;
    default:
      h.flags = 0;
  }
  h.request_id = in.ConsumeIntegral<uint8_t>();
  h.meta_len = static_cast<uint32_t>(meta.size());
  h.body_len = body.size();
  char header[wire::kHeaderSize];
  h.EncodeTo(header);
  const Slice body_slice(body);
  h.checksum = wire::FrameChecksum(header, meta, {&body_slice, 1});
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) h.checksum ^= 1;
  h.EncodeTo(header);
  out->append(header, sizeof(header));
  *out += meta;
  *out += body;
}

// Reads until the server closes the connection (or a second passes).
void Drain(int fd) {
  char buf[4096];
  const Deadline deadline = DeadlineIn(1000);
  while (WaitReadable(fd, deadline).ok()) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
  }
}

}  // namespace
}  // namespace kvengine

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace kvengine;
  service = new MemoryService;
  ServerOptions options;
  options.workers = 2;
  options.io_timeout_ms = 1000;
  options.log = [](LogLevel, const std::string&) {};
  std::unique_ptr<TransportServer> started;
  Status s = TransportServer::Start(Endpoint{"127.0.0.1", 0}, options, service, &started);
  FUZZ_CHECK(s.ok(), "cannot start the server: " + s.ToString());
  server = started.release();  // serves until the process ends
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvengine;
  FuzzedDataProvider in(data, size);
  int fd = -1;
  Status s = ConnectTcp(Endpoint{"127.0.0.1", server->port()}, DeadlineIn(1000), &fd);
  FUZZ_CHECK(s.ok(), "cannot connect to the server: " + s.ToString());
  std::string frames;
  if (in.ConsumeIntegralInRange<int>(0, 15) != 0) AppendFrame(in, wire::kAuth, "", "", &frames);
  const int requests = in.ConsumeIntegralInRange(1, 6);
  for (int i = 0; i < requests && in.remaining_bytes() > 0; i++) {
    const uint8_t op = in.ConsumeIntegralInRange<uint8_t>(1, wire::kDeleteMatching + 1);
    std::string meta, body;
    MakeRequest(in, op, &meta, &body);
    AppendFrame(in, op, meta, body, &frames);
  }
  std::vector<iovec> iov{{frames.data(), frames.size()}};
  WriteFully(fd, &iov, DeadlineIn(1000));  // the server may close early: that is fine
  ::shutdown(fd, SHUT_WR);
  Drain(fd);
  ::close(fd);
  return 0;
}
