// ExpectedState: kv_stress's oracle, one memory-mapped file beside the DB.
//
// The file holds, per key, what the DB may hold for it, and the run's counters.  It is
// mapped MAP_SHARED, so every store lands in the page cache at once: it survives a
// SIGKILL of the process that wrote it (not a power loss, which kv_stress does not
// simulate), and every process of an attach run (owner and clients) maps the same file
// and sees the others' stores.
//
// Versions.  Every operation on a key takes the key's next version number (never
// reused), and a value's bytes are a function of (key, version, size) (see
// stress_value.h), so a value read back names the version that wrote it.  Per key:
//   next     the next version to hand out
//   hi       the newest version that may be in the DB: set BEFORE the operation is issued
//            (RocksDB's "pending" mark), so a kill in the middle leaves it covered
//   lo       the newest version whose operation was acknowledged: a read that starts
//            after the acknowledgement must see lo or newer
//   durable  the newest version covered by a completed Flush(): after a crash the DB
//            holds durable or newer
//   del      the newest version that was (or may have been) a delete; 0 is the state of
//            a key never written (absent)
// So a read that begins when the key's floor is F (lo live, durable after a crash) may
// return a value of a version in [F, hi], or nothing when del >= F (some delete at or
// after the floor); anything else is a failure.  One more absence is allowed after a
// crash: a key written again after its durable version (hi > durable).  A put retires
// the key's older SSD copy (it is tombstoned: the engine never serves a superseded
// version), so until the new value is durable a crash may leave the key absent
// (test/crash_test.cc allows the same); never an older version.  A key has one writer at a time
// (keys are partitioned among the workers of all processes), so lo == hi whenever no operation of
// the key is in flight or in doubt.
//
// Format (all little-endian, see docs/kv_stress.md): a 4 KiB header -- magic, format
// version, key and worker counts, a checksum of those, then the counters -- and 32 bytes
// per key.  The per-key words change all the time and carry no checksum; the header's
// fixed part does, so a file of another run or format is refused.
//
// Thread-safety: every accessor is an atomic load or store (std::atomic_ref) on the
// mapping; the per-key protocol relies on one writer per key.
#ifndef KVENGINE_TOOLS_STRESS_EXPECTED_STATE_H_
#define KVENGINE_TOOLS_STRESS_EXPECTED_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/status.h"

namespace kvengine::stress {

// The run's counters, kept in the file so that they add up across killed processes.
// DO NOT REORDER: their positions are part of the file format.
enum class Counter : int {
  kOps = 0,        // operations issued (each key of a batch counts once)
  kVerifiedReads,  // reads (get, batch get, exists, recovery) checked against the oracle
  kLost,           // absent where the oracle forbids absence
  kWrong,          // bytes that are no value of the key, or a version outside the allowed range
  kResurrected,    // a value older than a delete the oracle knows happened
  kErrors,         // operations that failed with an error the contract does not allow
  kRefused,        // writes (puts, flushes) refused with NoSpace (allowed under pressure)
  kDropped,        // absences allowed only because the SSD tier may evict
  kFlushes,        // completed Flush() calls
  kRounds,         // recoveries verified (one per restart after a kill)
  kReadRefused,    // reads refused with NoSpace: none allowed (a read never needs room)
  kCount
};
const char* CounterName(Counter c);

// What one read observed of a key.
struct Observation {
  enum Kind { kAbsent, kValue, kCorrupt } kind = kAbsent;
  uint32_t version = 0;  // of kValue
};

enum class Verdict { kOk, kDropped, kLost, kWrong, kResurrected };
const char* VerdictName(Verdict v);

class ExpectedState {
 public:
  // Creates the file (replacing any) for `keys` keys and `workers` workers, every key
  // absent.  On failure returns non-OK and *state is null.
  static Status Create(const std::string& path, uint32_t keys, uint32_t workers,
                       std::unique_ptr<ExpectedState>* state);
  // Maps an existing file; Corruption when it is not one (magic, version, checksum, size).
  static Status Open(const std::string& path, std::unique_ptr<ExpectedState>* state);
  ~ExpectedState();
  ExpectedState(const ExpectedState&) = delete;
  ExpectedState& operator=(const ExpectedState&) = delete;

  uint32_t keys() const { return keys_; }
  uint32_t workers() const { return workers_; }

  // ---- the writer of a key (one at a time)
  // Takes the key's next version and marks it possibly present (and, for a delete,
  // possibly deleted) before the operation is issued.  Returns the version.
  uint32_t BeginPut(uint32_t key);
  uint32_t BeginDelete(uint32_t key);
  // The operation of `version` was acknowledged: reads must now see it (or newer).
  void Acknowledge(uint32_t key, uint32_t version);

  // ---- readers
  uint32_t Lo(uint32_t key) const { return Load(key, kLo); }
  uint32_t Hi(uint32_t key) const { return Load(key, kHi); }
  uint32_t Durable(uint32_t key) const { return Load(key, kDurable); }
  // "lo L hi H durable D del X" of a key, for failure messages.
  std::string Describe(uint32_t key) const;
  // How a read is judged: the floor it began with (Lo() read before it, or Durable()
  // after a crash), whether the DB crashed since the floor, and whether the DB may
  // evict (absence then allowed, counted as dropped).
  struct Rule {
    uint32_t floor = 0;
    bool after_crash = false;
    bool may_drop = false;
  };
  Verdict Judge(uint32_t key, const Rule& rule, const Observation& seen) const;
  // Whether BatchExists answering `present` is allowed (the same rule as Judge, without
  // the bytes: present needs some put possible in [floor, hi]).
  Verdict JudgeExists(uint32_t key, const Rule& rule, bool present) const;

  // ---- flush
  // Every key's lo, taken before Flush() is called ...
  std::vector<uint32_t> SnapshotLo() const;
  // ... becomes its durable floor once that Flush() returned OK.
  void CommitFlush(const std::vector<uint32_t>& snapshot);

  // ---- after a restart
  // Makes what a verified read saw the key's state.  After a crash of the DB
  // (`after_crash`) nothing is in flight any more: the value's version (or a new delete
  // version when absent) becomes lo and hi, so versions lost with the crash can never be
  // accepted again.  After a restart of a client beside a live DB, a request the killed
  // client sent may still land: hi stays, and lo rises to what was seen (to the newest
  // delete when absent).  The durable floor moves only with the next Flush().
  void Resolve(uint32_t key, const Observation& seen, bool after_crash);

  void Add(Counter c, uint64_t n = 1);
  uint64_t Get(Counter c) const;
  // "rounds=.. ops=.. verified_reads=.. lost=.. wrong=.. resurrected=.. errors=.. ..."
  std::string Summary() const;

 private:
  enum Field { kLo = 0, kHi, kDurable, kDel, kNext, kFieldCount };
  ExpectedState(int fd, void* base, size_t size, uint32_t keys, uint32_t workers);
  static Status Map(const std::string& path, int fd, size_t size, void** base);
  uint32_t* Word(uint32_t key, Field f) const;
  uint32_t Load(uint32_t key, Field f) const;
  void Store(uint32_t key, Field f, uint32_t v);
  uint64_t* CounterWord(Counter c) const;

  int fd_;
  void* base_;
  size_t size_;
  uint32_t keys_;
  uint32_t workers_;
};

}  // namespace kvengine::stress

#endif  // KVENGINE_TOOLS_STRESS_EXPECTED_STATE_H_
