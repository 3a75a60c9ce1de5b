// NamespaceView: the handle of one namespace (DB::CreateNamespace, DB::OpenNamespace), a
// DB whose keys are the namespace's.
//
// Each call maps its keys into the namespace (namespaces/namespace_keys.h) and forwards
// it to the DB below NamespaceDB -- DBImpl, or ClusterDB, which routes the namespaced keys
// like any other -- and maps what comes back (removal events) out of it.  The view holds
// no data and no per-key state.
//
// Thread-safety: every call may come from many threads at once.  Each call is inside
// NamespaceState's gate (util/call_gate.h) until it returns, so that DropNamespace and
// the DB's Close wait for the calls in flight and later calls find the namespace gone
// (Aborted) instead of a DB that no longer exists.
#ifndef KVENGINE_NAMESPACES_NAMESPACE_VIEW_H_
#define KVENGINE_NAMESPACES_NAMESPACE_VIEW_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "db/removal_feed.h"
#include "kvengine/db.h"
#include "namespaces/namespace_keys.h"
#include "util/call_gate.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace kvengine {

// One namespace, shared by NamespaceDB and every handle of it.
struct NamespaceState {
  NamespaceState(std::string name_in, uint64_t id_in, uint64_t max_key_size, DB* base_in,
                 NamespaceRemovals* removals_in)
      : name(std::move(name_in)),
        id(id_in),
        keys(id_in, max_key_size),
        base(base_in),
        removals(removals_in) {}

  // Makes later calls of the handles fail Aborted(why); waits for the calls in flight.
  void Detach(const std::string& why) {
    {
      MutexLock l(&gone_mu);
      gone = why;
    }
    calls.Close();
  }
  // Why calls are refused.  REQUIRES: calls.closed().
  std::string Gone() const {
    MutexLock l(&gone_mu);
    return gone;
  }

  const std::string name;
  const uint64_t id;
  const NamespaceKeys keys;
  // The DB below NamespaceDB, and its engine's removal feed: to be called only by a call
  // inside `calls`.
  DB* const base;
  NamespaceRemovals* const removals;
  CallGate calls;
  mutable Mutex gone_mu;
  std::string gone GUARDED_BY(gone_mu);  // why it was detached
};

class NamespaceView : public DB {
 public:
  explicit NamespaceView(std::shared_ptr<NamespaceState> state) : state_(std::move(state)) {}

  // Releases this handle only: the DB and the namespace stay.
  Status Close() override;

  Status Put(const WriteOptions& options, const Slice& key, const Slice& value) override;
  Status Get(const ReadOptions& options, const Slice& key, std::string* value) override;
  Status GetInto(const ReadOptions& options, const Slice& key, MutableSlice buffer,
                 size_t* value_size) override;
  Status Delete(const WriteOptions& options, const Slice& key) override;
  Status GetValueSize(const Slice& key, uint64_t* size) override;
  Status BatchPut(const WriteOptions& options, std::span<const Slice> keys,
                  std::span<const ValueParts> values, std::vector<int64_t>* results) override;
  Status BatchGetInto(const ReadOptions& options, std::span<const Slice> keys,
                      std::span<const Destination> destinations,
                      std::vector<int64_t>* results) override;
  Status BatchGetIntoGroups(const ReadOptions& options, std::span<const Slice> keys,
                            std::span<const Destination> destinations,
                            std::span<const size_t> group_ends, const GroupReadyFn& on_ready,
                            std::vector<int64_t>* results) override;
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status BatchDelete(const WriteOptions& options, std::span<const Slice> keys,
                     std::vector<int64_t>* results) override;
  Status BatchLocate(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override;
  Status DeleteAll(uint64_t* deleted) override;
  Status ReadRemovals(uint64_t after, size_t max_events, RemovalBatch* batch) override;
  // The namespace's resident keys starting with `prefix`, as its user sees them, with the
  // removal sequence in the numbering of this handle's ReadRemovals.
  Status ReadResident(const Slice& prefix, size_t max_batch, const ResidentFn& batch,
                      ResidentSnapshot* snapshot) override;

  // The whole DB's.
  Status RegisterBuffer(void* addr, size_t length) override;
  Status UnregisterBuffer(void* addr) override;
  Status Flush() override;
  Status CompactBuckets(uint64_t* reclaimed_bytes) override;
  // The whole DB's properties, and "kvengine.namespace": this handle's namespace name.
  bool GetProperty(const std::string& name, std::string* value) override;

  // A namespace has no namespaces of its own: InvalidArgument.
  Status CreateNamespace(const std::string& name, const NamespaceOptions& options,
                         std::unique_ptr<DB>* handle) override;
  Status OpenNamespace(const std::string& name, std::unique_ptr<DB>* handle) override;
  Status DropNamespace(const std::string& name, uint64_t* deleted) override;
  Status ListNamespaces(std::vector<NamespaceInfo>* namespaces) override;

  // Runs fn(the namespace's key rule) as one of this handle's calls runs: the namespace
  // cannot be dropped meanwhile (DropNamespace waits), and fn does not run -- Aborted,
  // as the handle's calls -- once the handle is closed or the namespace gone.  For a
  // caller that reaches the namespace's keys by a path of its own: the owner's shared
  // arena, which an attached client's puts and pins take (attach/local_server.cc).
  // fn must not call this handle.
  Status Guarded(const std::function<Status(const NamespaceKeys&)>& fn);

 private:
  // Why a call is refused: the handle is closed, or the namespace gone.
  Status Refusal() const;
  // Runs fn(base) inside the namespace's gate; Aborted when the handle is closed or the
  // namespace gone.
  template <class Fn>
  Status WithBase(Fn fn);
  // A single-key call: fn(base, internal key).
  template <class Fn>
  Status WithKey(const Slice& key, Fn fn);
  // A batch call of the DB below on the mapped keys.
  template <class T, class Call>
  Status Batch(const char* name, std::span<const Slice> keys, std::span<const T> others,
               bool has_others, std::vector<int64_t>* results, Call call);

  const std::shared_ptr<NamespaceState> state_;
  std::atomic<bool> closed_{false};
};

}  // namespace kvengine

#endif  // KVENGINE_NAMESPACES_NAMESPACE_VIEW_H_
