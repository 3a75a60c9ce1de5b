// Transport's default StartBatchGet (the call made at once, answered before it returns)
// and StartBatchGetGroups (StartBatchGet of each group), and the groups read in turn on
// a thread (transport/pending_get.h).
// Apart from Transport::Create, which links every transport, so that code holding only a
// TcpTransport (the fuzz targets) links without UCX or RDMA.
#include "transport/pending_get.h"

#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "kvengine/transport.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

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

// What the thread of StartGroupsInTurnOnAThread shares with the groups' calls.
struct GroupsInTurn {
  Mutex mu;
  CondVar cv;
  std::vector<Status> status GUARDED_BY(mu);
  size_t done GUARDED_BY(mu) = 0;  // groups 0 .. done-1 have been read
};

// Group g of a StartGroupsInTurnOnAThread.
class GroupInTurn final : public PendingGet {
 public:
  GroupInTurn(std::shared_ptr<GroupsInTurn> state, size_t group)
      : state_(std::move(state)), group_(group) {}
  ~GroupInTurn() override { Wait(); }
  bool Ready() override {
    MutexLock lock(&state_->mu);
    return state_->done > group_;
  }
  Status Wait() override {
    MutexLock lock(&state_->mu);
    while (state_->done <= group_) state_->cv.Wait(&state_->mu);
    return state_->status[group_];
  }

 private:
  const std::shared_ptr<GroupsInTurn> state_;
  const size_t group_;
};

}  // namespace

void StartGroupsInTurnOnAThread(Transport* transport, const Endpoint& peer,
                                std::span<const Transport::GetGroup> groups,
                                std::vector<std::unique_ptr<PendingGet>>* calls) {
  calls->clear();
  if (groups.empty()) return;
  // The keys, owned by the thread: the caller's may go once this returns.
  std::vector<std::vector<std::string>> keys(groups.size());
  for (size_t g = 0; g < groups.size(); g++) {
    for (const Slice& k : groups[g].keys) keys[g].emplace_back(k.data(), k.size());
  }
  auto state = std::make_shared<GroupsInTurn>();
  {
    MutexLock lock(&state->mu);
    state->status.resize(groups.size());
  }
  std::vector<Transport::GetGroup> owned(groups.begin(), groups.end());
  auto read_in_turn = std::make_shared<std::function<void()>>(
      [transport, peer, state, keys = std::move(keys), owned = std::move(owned)]() {
        Status unreachable;  // the peer's failure that ends every later group at once
        for (size_t g = 0; g < owned.size(); g++) {
          Status s = unreachable;
          if (s.ok()) {
            const std::vector<Slice> group_keys(keys[g].begin(), keys[g].end());
            s = transport->BatchGet(peer, group_keys, owned[g].destinations, owned[g].results);
            if (!s.ok() && s.message().find(peer.ToString()) == std::string::npos) {
              s = Status::FromErrorCode(s.ErrorCode(), peer.ToString() + ": " + s.message());
            }  // says which peer
            // A peer that did not answer (dead, cut off, timed out) would cost each later
            // group a timeout of its own: they fail with this one's error instead.
            if (s.IsIOError()) unreachable = s;
          } else {
            owned[g].results->assign(keys[g].size(), s.ErrorCode());
          }
          MutexLock lock(&state->mu);
          state->status[g] = std::move(s);
          state->done = g + 1;
          state->cv.NotifyAll();
        }
      });
  for (size_t g = 0; g < groups.size(); g++) {
    calls->push_back(std::make_unique<GroupInTurn>(state, g));
  }
  try {
    std::thread([read_in_turn] { (*read_in_turn)(); }).detach();
  } catch (const std::system_error&) {
    (*read_in_turn)();  // no thread to be had (the process's limit): read them here
  }
}

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
