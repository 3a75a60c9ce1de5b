// TcpTransport: the Transport over TCP, and the control channel of the UCX transport.
#ifndef KVENGINE_TRANSPORT_TCP_TRANSPORT_H_
#define KVENGINE_TRANSPORT_TCP_TRANSPORT_H_

#include <sys/uio.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/region_map.h"
#include "kvengine/transport.h"
#include "transport/socket_util.h"
#include "util/mutex.h"

namespace kvengine {

// Where a response's body goes.  Called by whichever thread reads the response, while
// the caller waits; the memory it names must stay valid until the call returns.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Given the response's metadata and body length, stores in *iov where the body's
  // bytes go (summing to body_len), or returns an error that fails the call (the body
  // is then discarded).
  virtual Status OnMeta(std::string_view meta, uint64_t body_len, std::vector<iovec>* iov) = 0;
};

// Keeps the response's metadata; the response must have no body.
class MetaSink : public ResponseSink {
 public:
  Status OnMeta(std::string_view meta, uint64_t body_len, std::vector<iovec>*) override;
  std::string meta;
};

class TcpConnection;

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& options);
  ~TcpTransport() override;

  const char* Name() const override { return "tcp"; }
  Status RegisterMemory(void* addr, size_t length, const char* what) override;
  void UnregisterMemory(void* addr, size_t length) override;
  std::shared_ptr<MemoryRegistrar> registrar() override;
  Status BatchGet(const Endpoint& peer, std::span<const Slice> keys,
                  std::span<const Destination> destinations,
                  std::vector<int64_t>* results) override;
  // Writes the GET on one of the peer's connections and returns: the answer is read by
  // whoever waits on that connection, into the destinations.
  std::unique_ptr<PendingGet> StartBatchGet(const Endpoint& peer, std::span<const Slice> keys,
                                            std::span<const Destination> destinations,
                                            std::vector<int64_t>* results) override;
  // One GET_GROUPS request on one connection when the peer serves it (a GET per group
  // otherwise); each group's call is Ready once its own answer frame is in.
  void StartBatchGetGroups(const Endpoint& peer, std::span<const GetGroup> groups,
                           std::vector<std::unique_ptr<PendingGet>>* calls) override;
  Status BatchGetOwned(const Endpoint& peer, std::span<const Slice> keys,
                       std::vector<std::string>* values, std::vector<int64_t>* results) override;
  Status BatchPut(const Endpoint& peer, std::span<const Slice> keys,
                  std::span<const ValueParts> values, std::vector<int64_t>* results) override;
  Status BatchExists(const Endpoint& peer, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override;
  Status BatchDelete(const Endpoint& peer, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override;
  Status BatchValueSize(const Endpoint& peer, std::span<const Slice> keys,
                        std::vector<int64_t>* results) override;
  Status DeleteByRegex(const Endpoint& peer, const std::string& pattern,
                       uint64_t* deleted) override;
  Status DeleteAll(const Endpoint& peer, uint64_t* deleted) override;
  Status GetProperty(const Endpoint& peer, const std::string& name, std::string* value) override;
  Status SyncNamespaces(const Endpoint& peer, const std::string& request,
                        std::string* answer) override;

  // Sends one request to `peer` and waits for its answer, whose body goes where `sink`
  // says.  Errors name the peer.
  Status Call(const Endpoint& peer, uint8_t op, const std::string& meta,
              std::span<const Slice> body, ResponseSink* sink);

  // A connection of the caller's own to `peer`, authenticated, outside the pool: no
  // other call uses it, and it lives as long as the caller holds it.  For state the
  // server keeps for as long as the connection lives (a UCX client's record), and whose
  // end the caller wants to see (the peer's process gone: ClosedByPeer).
  Status OwnConnection(const Endpoint& peer, std::shared_ptr<TcpConnection>* conn);
  // Call, on such a connection.
  Status CallOn(TcpConnection* conn, const Endpoint& peer, uint8_t op, const std::string& meta,
                std::span<const Slice> body, ResponseSink* sink);
  // Whether the peer closed `conn` (its process exited or was killed: the kernel closes
  // its sockets at once), or it failed; seen without reading it.  Only for a connection
  // no call is waiting on.
  static bool ClosedByPeer(TcpConnection* conn);
  // Its socket, to poll for the peer closing it (POLLIN | POLLRDHUP).
  static int FdOf(const TcpConnection& conn);

 protected:
  void Log(LogLevel level, const std::string& line) const;
  const TransportOptions options_;
  RegionMap regions_;

 private:
  struct Peer;
  Peer* PeerFor(const Endpoint& peer) EXCLUDES(peers_mu_);
  Status Connection(const Endpoint& peer, std::shared_ptr<TcpConnection>* conn);
  // A new connection to `peer`, handshake done; no backoff.
  Status Connect(const Endpoint& peer, std::shared_ptr<TcpConnection>* conn);
  // Runs a keys-only request whose answer is batch status + results.
  Status ResultsCall(const Endpoint& peer, uint8_t op, std::span<const Slice> keys,
                     const uint64_t* extra, std::span<const Slice> body,
                     std::vector<int64_t>* results);
  // Runs a DELETE_MATCHING request (mode: wire::MatchMode); its answer is batch status +
  // count.
  Status DeleteMatching(const Endpoint& peer, uint8_t mode, std::string_view pattern,
                        uint64_t* deleted);

  Mutex peers_mu_;
  std::map<std::string, std::unique_ptr<Peer>> peers_ GUARDED_BY(peers_mu_);
  std::shared_ptr<MemoryRegistrar> registrar_;
};

// Fails every result with s and returns s.
Status FailAll(const Status& s, size_t n, std::vector<int64_t>* results);

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_TCP_TRANSPORT_H_
