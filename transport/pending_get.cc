// Transport's default StartBatchGet (the call made at once, answered before it returns)
// and StartBatchGetGroups (StartBatchGet of each group).
// Apart from Transport::Create, which links every transport, so that code holding only a
// TcpTransport (the fuzz targets) links without UCX or RDMA.
#include "kvengine/transport.h"

namespace kvengine {

namespace {

// A call that was answered before StartBatchGet returned.
class AnsweredGet final : public PendingGet {
 public:
  explicit AnsweredGet(Status s) : status_(std::move(s)) {}
  bool Ready() override { return true; }
  Status Wait() override { return status_; }

 private:
  const Status status_;
};

}  // namespace

std::unique_ptr<PendingGet> Transport::StartBatchGet(const Endpoint& peer,
                                                     std::span<const Slice> keys,
                                                     std::span<const Destination> destinations,
                                                     std::vector<int64_t>* results) {
  return std::make_unique<AnsweredGet>(BatchGet(peer, keys, destinations, results));
}

void Transport::StartBatchGetGroups(const Endpoint& peer, std::span<const GetGroup> groups,
                                    std::vector<std::unique_ptr<PendingGet>>* calls) {
  calls->clear();
  for (const GetGroup& g : groups) {
    calls->push_back(StartBatchGet(peer, g.keys, g.destinations, g.results));
  }
}

}  // namespace kvengine
