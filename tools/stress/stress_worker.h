// StressWorker: one thread of kv_stress's mixed operations, and the Verifier that reads
// every key back after a restart.
//
// A worker writes only its own keys (KeySpace) and reads any key.  Before each write it
// marks the versions it is about to write in the ExpectedState, and after the DB's
// acknowledgement it records them as acknowledged; every read is judged by the oracle
// at once (a failure is counted and printed on stderr with the key and the oracle's
// state).  Operations, by weight (WorkloadConfig): put, batch put (values from 1-3
// buffers), get (into a registered buffer), batch get (into slices of a registered
// buffer), exists, delete, delete by pattern (ten keys of the worker's own range) and
// flush (every key's acknowledged version becomes durable once Flush() returns OK).
//
// Thread-safety: a StressWorker is used by one thread; workers share the DB and the
// ExpectedState, both thread-safe.
#ifndef KVENGINE_TOOLS_STRESS_STRESS_WORKER_H_
#define KVENGINE_TOOLS_STRESS_STRESS_WORKER_H_

#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvengine/db.h"
#include "tools/stress/expected_state.h"
#include "tools/stress/key_space.h"
#include "tools/stress/keyspaces.h"

namespace kvengine::stress {

enum class OpKind : int {
  kPut = 0,
  kBatchPut,
  kGet,
  kBatchGet,
  kExists,
  kDelete,
  kDeleteMatching,
  kFlush,
  kCount
};

struct WorkloadConfig {
  // Relative weights of the operations, indexed by OpKind.
  uint32_t weights[static_cast<int>(OpKind::kCount)] = {25, 10, 25, 15, 8, 10, 1, 1};
  bool zipf = false;
  size_t value_min = 512;  // sizes are log-uniform in [value_min, value_max]
  size_t value_max = 4 << 20;
  uint32_t batch_max = 4;  // keys per batch call, 2..batch_max
  bool may_drop = false;   // the DB may evict (SSD eviction on): absence allowed
  int max_reports = 50;    // failures printed per process; all are counted
  // Per key (indexed like the expected state), whether this process leaves it alone: a
  // restarted client's keys whose last operation was in doubt when its predecessor was
  // killed, with the rest of their ten-key group.  That operation may still land on the
  // owner at any time (a request the dead client sent; a DeleteByRegex walks every key and
  // can take seconds), and no fixed wait fences it: writing such a key again would let
  // the late request undo an acknowledged write.  Empty: every key is used.
  std::vector<bool> left_alone;
};

// Prints a failure (up to a limit per process) and counts it.
class FailureLog {
 public:
  FailureLog(ExpectedState* state, const KeySpace* space, int limit)
      : state_(state), space_(space), limit_(limit) {}
  // Counts verdict `v` of a read of `key` (nothing when kOk); prints the failures.
  void Record(Verdict v, uint32_t key, uint32_t floor, const Observation& seen, const char* op);
  // An operation failed with a status the contract does not allow.
  void Error(const Status& s, const std::string& what);

 private:
  bool Take();
  ExpectedState* state_;
  const KeySpace* space_;
  int limit_;
  std::atomic<int> printed_{0};
};

class StressWorker {
 public:
  // None owned; all outlive the worker.
  StressWorker(const Keyspaces* keyspaces, ExpectedState* state, const KeySpace* space,
               FailureLog* log, uint32_t worker, const WorkloadConfig& config, uint64_t seed);
  ~StressWorker();
  // Allocates the worker's buffers and registers the read buffer with the DB.
  Status Prepare();
  // Runs operations until *stop.
  void Run(const std::atomic<bool>* stop);

 private:
  OpKind PickOp();
  uint32_t OwnKey();
  bool LeftAlone(uint32_t key) const;
  uint32_t AnyKey();
  // The keys of a batch read: each own or any (one keyspace), or all of one worker, own
  // or any (several keyspaces: a batch call goes to one of them).
  std::vector<uint32_t> BatchReadKeys(uint32_t n);
  // With several keyspaces, now and then: `key` read and deleted by its pattern through
  // another keyspace must find nothing there.
  void ProbeIsolation(uint32_t key);
  size_t PickSize();
  void Put();
  void BatchPut();
  void Get();
  void BatchGet();
  void Exists();
  void Delete();
  void DeleteMatching();
  void Flush();
  // Acknowledges a write that returned `s` (NotFound counts as done for deletes).
  void FinishWrite(uint32_t key, uint32_t version, const Status& s, bool is_delete, const char* op);

  const Keyspaces* ks_;
  DB* mine_;  // the keyspace of this worker's keys
  ExpectedState* state_;
  const KeySpace* space_;
  FailureLog* log_;
  uint32_t worker_;
  WorkloadConfig config_;
  std::mt19937_64 rng_;
  KeyChooser own_;
  KeyChooser any_worker_;
  std::vector<char> write_buf_;
  std::vector<char> read_buf_;
  bool registered_ = false;
  uint32_t weight_total_ = 0;
};

// Reads keys [begin, end) once each and judges them against the floor: the durable
// floor after a crash of the DB (`after_crash`), else the acknowledged one (a client
// restarted beside a live owner).  Then makes each observation the key's state
// (ExpectedState::Resolve).  Returns the number of failures (also counted and printed).
uint64_t VerifyAndResolve(const Keyspaces& keyspaces, ExpectedState* state, const KeySpace& space, FailureLog* log,
                          uint32_t begin, uint32_t end, bool after_crash, bool may_drop,
                          size_t value_max);

}  // namespace kvengine::stress

#endif  // KVENGINE_TOOLS_STRESS_STRESS_WORKER_H_
