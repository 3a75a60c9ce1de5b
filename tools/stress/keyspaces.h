// Keyspaces: the DB handles kv_stress's keys are read and written through.
//
// With --namespaces=N (N >= 1), worker w's keys live in keyspace w % (N + 1): keyspace 0
// is the default namespace (the DB itself), keyspace i >= 1 the namespace "stress-i",
// created by the first process that opens the DB (solo or owner role) and opened by the
// others.  Every call about a key goes through its keyspace's handle; the keys' names
// spell their worker (KeySpace), so a key's name exists in its own keyspace only, and
// a read or a delete of it through another keyspace must find nothing -- the workers
// probe that (StressWorker::ProbeIsolation).  N = 0: one keyspace, the DB itself.
//
// Thread-safety: handles are DBs, usable from every thread; the set does not change
// after Open.
#ifndef KVENGINE_TOOLS_STRESS_KEYSPACES_H_
#define KVENGINE_TOOLS_STRESS_KEYSPACES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/db.h"
#include "tools/stress/key_space.h"

namespace kvengine::stress {

class Keyspaces {
 public:
  // Opens the handles over `db` (not owned; outlives the set): creates the namespaces
  // that do not exist yet when `create`, else fails on a missing one.
  static Status Open(DB* db, const KeySpace* space, uint32_t namespaces, bool create,
                     std::unique_ptr<Keyspaces>* result);

  // The DB as a whole: Flush, RegisterBuffer.
  DB* db() const { return handles_[0]; }
  size_t count() const { return handles_.size(); }
  // The keyspace of `worker`'s keys.
  DB* OfWorker(uint32_t worker) const { return handles_[worker % handles_.size()]; }
  DB* OfKey(uint32_t key) const { return OfWorker(space_->WorkerOf(key)); }
  // A keyspace other than `worker`'s, picked by `pick`; null when there is one keyspace.
  DB* Other(uint32_t worker, uint64_t pick) const;
  // The keyspace's name as failures print it.
  std::string NameOf(const DB* handle) const;

 private:
  Keyspaces(const KeySpace* space) : space_(space) {}

  const KeySpace* space_;
  std::vector<std::unique_ptr<DB>> owned_;  // the namespaces' handles
  std::vector<DB*> handles_;                // [0] the DB, then owned_'s
};

}  // namespace kvengine::stress

#endif  // KVENGINE_TOOLS_STRESS_KEYSPACES_H_
