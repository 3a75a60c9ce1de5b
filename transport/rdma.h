// RDMA over rdma-core verbs: the device-independent pieces (queue-pair parameter
// exchange, memory-region bookkeeping, work-request batching) and, when built with
// KV_WITH_RDMA, the verbs objects (device, protection domain, memory regions, RC queue
// pairs, one-sided READs, completion polling) and the RDMA Transport.
//
// Connection set-up runs over the TCP control channel: the client creates an RC queue
// pair, sends its QpParams in a kRdmaConnect request; the server creates its own, moves
// it to RTR/RTS against the client's parameters and answers with its QpParams (which
// carry the arena's address, length and rkey); the client then moves its queue pair to
// RTR/RTS.  Reads follow the validation protocol of read_validation.h.
#ifndef KVENGINE_TRANSPORT_RDMA_H_
#define KVENGINE_TRANSPORT_RDMA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/status.h"
#include "kvengine/transport.h"
#include "transport/read_validation.h"
#include "util/mutex.h"

namespace kvengine {

// What one side tells the other to connect an RC queue pair (and reach its arena).
struct QpParams {
  uint32_t qpn = 0;      // queue pair number
  uint32_t psn = 0;      // initial packet sequence number (24 bits)
  uint16_t lid = 0;      // InfiniBand local id (0 on RoCE)
  uint8_t port = 1;      // HCA port
  uint8_t mtu = 3;       // enum ibv_mtu (3 = 1024)
  uint8_t gid[16] = {};  // RoCE / global address
  uint8_t gid_index = 0;
  uint32_t rkey = 0;  // the arena's remote key (server side; 0 from a client)
  uint64_t arena_addr = 0;
  uint64_t arena_len = 0;

  // DO NOT CHANGE: on the wire.  Version byte, then the fields little-endian, 50 bytes.
  static constexpr size_t kEncodedSize = 50;
  void EncodeTo(std::string* dst) const;
  static Status DecodeFrom(std::string_view in, QpParams* out);
  bool operator==(const QpParams& o) const;
};

// Registered memory regions and their keys, looked up by address range.  Thread-safe.
class MrTable {
 public:
  struct Region {
    uintptr_t start = 0;
    size_t length = 0;
    uint32_t lkey = 0;
    uint32_t rkey = 0;
    void* handle = nullptr;  // struct ibv_mr*, owned by whoever registered it
  };
  // InvalidArgument when it overlaps a region.
  Status Add(const Region& region);
  // Removes the region starting at addr; stores it in *removed.  False when none.
  bool Remove(const void* addr, Region* removed);
  // The region holding all of [addr, addr+length); false when none does.
  bool Find(const void* addr, size_t length, Region* out) const;
  size_t size() const;
  std::vector<Region> All() const;

 private:
  mutable Mutex mu_;
  std::map<uintptr_t, Region> regions_ GUARDED_BY(mu_);
};

// Groups reads into postings: each posting is at most `max_per_post` work requests
// chained in one ibv_post_send, only the last one signaled (one completion per posting),
// and at most `max_outstanding` work requests in flight (the send queue's depth), so a
// batch of any size never overflows the queue pair.
struct WrBatchPlan {
  struct Posting {
    size_t first = 0;  // index into the reads
    size_t count = 0;
  };
  // Postings in order; a "wave" is the postings issued before waiting for completions.
  std::vector<std::vector<Posting>> waves;
};
WrBatchPlan PlanWorkRequests(size_t reads, size_t max_per_post, size_t max_outstanding);

// True when the build has verbs and the machine an active RDMA port; otherwise false
// and *why says what is missing ("no RDMA device", "built without libibverbs", ...).
bool RdmaAvailable(std::string* why);

// The RDMA transport (TCP control channel, one-sided reads).  NotSupported with the
// reason when RdmaAvailable() is false.
Status NewRdmaTransport(const TransportOptions& options, std::unique_ptr<Transport>* result);

// The server's side: owns the device objects, registers regions (the arena) and
// connects a queue pair per client.  NotSupported when no device.
class RdmaServer {
 public:
  static Status Create(std::unique_ptr<RdmaServer>* result);
  virtual ~RdmaServer() = default;
  virtual std::shared_ptr<MemoryRegistrar> registrar() = 0;
  // Answers a client's kRdmaConnect (see ServerOptions::rdma_connect).
  virtual Status Connect(std::string_view client, std::string* server) = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_RDMA_H_
