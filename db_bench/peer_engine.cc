// The peer adapter: kv_bench's Engine calls sent to a kvengine peer (kv_server, or any DB
// opened with Options::listen) through kvengine::Transport, so that peer_put and peer_get
// run the same workload code as fillseq and readrandom, with the network in the path.
//
// Without --peer it serves a fresh memory-only kvengine DB on 127.0.0.1 in this process
// (its own server threads) and talks to it over the same loopback TCP a separate
// kv_server would be reached through.
#include <algorithm>
#include <map>
#include <sstream>

#include "db_bench/engine.h"
#include "kvengine/db.h"
#include "kvengine/transport.h"
#include "util/mutex.h"

namespace kvbench {
namespace {

using kvengine::Endpoint;

// The "listen: HOST:PORT" line of the kvengine.peers property: where a DB opened with
// listen=...:0 actually serves.
Status ListenAddress(kvengine::DB* db, Endpoint* out) {
  std::string text;
  if (!db->GetProperty("kvengine.peers", &text)) {
    return Status::IOError("the in-process peer DB reports no kvengine.peers property");
  }
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("listen: ", 0) == 0) return Endpoint::Parse(line.substr(8), out);
  }
  return Status::IOError("the in-process peer DB does not say where it listens", text);
}

class PeerEngine : public Engine {
 public:
  ~PeerEngine() override { Close(); }

  const char* Name() const override { return "peer"; }

  Status Open(const EngineConfig& config) override {
    kvengine::TransportOptions to;
    Status s;
    if (!config.auth_token_file.empty()) {
      s = kvengine::ReadAuthTokenFile(config.auth_token_file, &to.auth_token, &to.auth_tenant);
    }
    if (s.ok()) {
      s = config.peer.empty() ? StartServer(config) : Endpoint::Parse(config.peer, &endpoint_);
    }
    if (s.ok()) s = kvengine::Transport::Create(config.peer_transport, to, &transport_);
    if (!s.ok()) return s;
    // Reach the peer once now: a wrong address, a peer that is down or a refused token
    // then stops the run with one clear message instead of failing every call.
    std::string stats;
    s = transport_->GetProperty(endpoint_, "kvengine.stats", &stats);
    if (!s.ok()) {
      return Status::IOError("cannot reach the peer", s.ToString());
    }
    notes_.push_back("peer: " +
                     (server_ ? "in-process kvengine server on " + endpoint_.ToString() + " (" +
                                    server_note_ + ")"
                              : endpoint_.ToString()) +
                     ", reached over " + transport_->Name());
    return Status::OK();
  }

  Status Close() override {
    transport_.reset();  // its connections go before the server they talk to
    if (!server_) return Status::OK();
    Status s = server_->Close();
    server_.reset();
    return s;
  }

  Status Put(const Slice& key, const Slice& value) override {
    const ValueParts parts = {value};
    std::vector<int64_t> results;
    Status s = BatchPut({&key, 1}, {&parts, 1}, &results);
    return s.ok() ? KeyStatus(key, results[0]) : s;
  }
  Status GetInto(const Slice& key, MutableSlice buffer, size_t* size) override {
    const Destination dest = {buffer};
    std::vector<int64_t> results;
    Status s = BatchGetInto({&key, 1}, {&dest, 1}, &results);
    if (s.ok()) s = KeyStatus(key, results[0]);
    if (s.ok()) *size = static_cast<size_t>(results[0]);
    return s;
  }
  Status Delete(const Slice& key) override {
    std::vector<int64_t> results;
    Status s = BatchDelete({&key, 1}, &results);
    return s.ok() ? KeyStatus(key, results[0]) : s;
  }

  Status BatchPut(std::span<const Slice> keys, std::span<const ValueParts> values,
                  std::vector<int64_t>* results) override {
    return transport_->BatchPut(endpoint_, keys, values, results);
  }
  Status BatchGetInto(std::span<const Slice> keys, std::span<const Destination> destinations,
                      std::vector<int64_t>* results) override {
    return transport_->BatchGet(endpoint_, keys, destinations, results);
  }
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return transport_->BatchExists(endpoint_, keys, results);
  }
  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override {
    return transport_->BatchDelete(endpoint_, keys, results);
  }
  bool DeleteReportsAbsent() const override { return true; }

  // The protocol has no flush; a peer makes its writes durable on its own schedule.
  Status Flush() override { return Status::OK(); }
  Status Compact(uint64_t*, uint64_t*) override {
    return Status::NotSupported("the peer protocol has no compaction request");
  }

  // The peer's statistics, then this client's transport's (over UCX: ucx_direct_ops
  // against ucx_bounce_ops, whether the buffers registered were used directly).
  std::string StatisticsText() override {
    std::string text;
    Status s = transport_->GetProperty(endpoint_, "kvengine.stats", &text);
    text = s.ok() ? "peer " + endpoint_.ToString() + ":\n" + text : "peer stats: " + s.ToString();
    return text + "\nclient transport (" + transport_->Name() + "):\n" + transport_->StatsText();
  }
  std::optional<uint64_t> ReclaimedBytes() override { return std::nullopt; }
  std::vector<std::string> Notes() const override { return notes_; }
  // Registered with the transport (UCX maps them: its gets land in them directly).
  Status RegisterBuffer(void* addr, size_t length) override {
    Status s = transport_->RegisterMemory(addr, length, "kv_bench buffer");
    kvengine::MutexLock lock(&registered_mu_);
    if (s.ok()) registered_[addr] = length;
    return s;
  }
  Status UnregisterBuffer(void* addr) override {
    kvengine::MutexLock lock(&registered_mu_);
    auto it = registered_.find(addr);
    if (it == registered_.end()) return Status::NotFound("no buffer registered there");
    transport_->UnregisterMemory(addr, it->second);
    registered_.erase(it);
    return Status::OK();
  }

 private:
  // A per-key result of a one-key batch as a Status.
  static Status KeyStatus(const Slice& key, int64_t result) {
    if (result >= 0) return Status::OK();
    return Status::FromErrorCode(static_cast<int>(result), "key '" + key.ToString() + "'");
  }

  // Opens a fresh kvengine DB at config.path serving on 127.0.0.1 (any free port).
  Status StartServer(const EngineConfig& config) {
    kvengine::Options options;
    // Memory only: peer_get should measure the transport, not this machine's disk.  The
    // arena holds the data set with room for slab rounding.
    options.ssd_capacity_bytes = 0;
    options.memory_capacity_bytes = std::max<uint64_t>(
        64ull << 20, config.data_set_bytes + config.data_set_bytes / 4 + (32ull << 20));
    Status s;
    for (const auto& [name, value] : config.kvengine_options) {
      if (s.ok()) s = options.Set(name, value);  // --options win, as for the local engine
    }
    if (s.ok()) s = options.Set("listen", "127.0.0.1:0");
    if (s.ok()) s = options.Set("peer_transport", config.peer_transport);
    if (s.ok()) options.peer_auth_token_file = config.auth_token_file;
    if (s.ok()) s = kvengine::DB::Open(options, config.path, &server_);
    if (s.ok()) s = ListenAddress(server_.get(), &endpoint_);
    if (!s.ok()) {
      server_.reset();
      return Status::IOError("cannot start the in-process peer", s.ToString());
    }
    server_note_ = "a fresh memory-only DB in " + config.path +
                   ", memory_capacity_bytes=" + std::to_string(options.memory_capacity_bytes) +
                   (config.kvengine_options.empty() ? "" : " plus --options");
    return Status::OK();
  }

  Endpoint endpoint_;
  std::unique_ptr<kvengine::Transport> transport_;
  std::unique_ptr<kvengine::DB> server_;  // the in-process peer, when there is no --peer
  std::string server_note_;
  std::vector<std::string> notes_;
  kvengine::Mutex registered_mu_;  // RunRead's threads register at once
  std::map<void*, size_t> registered_ GUARDED_BY(registered_mu_);
};

}  // namespace

std::unique_ptr<Engine> NewPeerEngine() { return std::make_unique<PeerEngine>(); }

}  // namespace kvbench
