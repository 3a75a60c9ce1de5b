// The requests every server answers alike -- the peer server (transport/server.h) and
// the owner's local server for attached processes (attach/local_server.h) -- decoded,
// run and answered here, once.  Their metadata are the peer protocol's (wire.h,
// docs/transport.md):
//   EXISTS           keys                     -> batch status, a result per key (1/0/error)
//   DELETE           keys                     -> batch status, a result per key
//   VALUE_SIZE       keys                     -> OK, per key the value's size or an error
//   PROPERTY         a name                   -> OK and the value, or NotFound and ""
//   DELETE_MATCHING  match mode and a pattern -> status, the count of keys removed (even
//                                                when the status is an error: what the
//                                                hosts that succeeded removed)
//   PREFETCH         keys                     -> batch status, a result per key (1: its
//                                                read up from SSD started, 0: not)
// A request the target does not admit (DbOpsTarget::Admit) is answered with the refusal
// as its batch status and no results (PROPERTY: the refusal and "").  A PROPERTY's
// answer is cut to the target's FigureScope (transport/figure_scope.h): what the
// client's grant or tenant may see of the DB.
// A server hands a request of one of these ops to ServeDbOp and sends the answer back;
// its own ops (puts, gets, pins, leases) it decodes itself.
#ifndef KVENGINE_TRANSPORT_DB_OPS_H_
#define KVENGINE_TRANSPORT_DB_OPS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "transport/figure_scope.h"

namespace kvengine {

// What the ops run against: the calls of a DB they make, with a DB's contracts
// (include/kvengine/db.h).  Thread-safety: called from the server's threads at once.
class DbOpsTarget {
 public:
  virtual ~DbOpsTarget() = default;
  virtual Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) = 0;
  virtual Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) = 0;
  virtual Status GetValueSize(const Slice& key, uint64_t* size) = 0;
  virtual Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) = 0;
  virtual Status DeleteAll(uint64_t* deleted) = 0;
  virtual bool GetProperty(const std::string& name, std::string* value) = 0;
  // DB::Prefetch.  By default nothing is prefetched (0 for every key): the peer server
  // serves reads of what it holds and does not promote for its clients.
  virtual Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) {
    results->assign(keys.size(), 0);
    return Status::OK();
  }
  // Whether the caller may name `keys` (EXISTS, DELETE, VALUE_SIZE, PREFETCH).  A refusal
  // (PermissionDenied) is the request's answer, and nothing runs.  By default everything
  // is admitted.
  virtual Status Admit(std::span<const Slice> /*keys*/) { return Status::OK(); }
  // What the caller may see of the DB's figures: a property outside it is refused
  // (AdmitProperty: figures().Admit by default), one inside it cut to it.  By default the
  // whole DB's.
  virtual const FigureScope& figures() const;
  virtual Status AdmitProperty(const std::string& name) { return figures().Admit(name); }
};

// The ops run against a kvengine::DB, which must outlive it (deletes with the default
// WriteOptions).
class DbOpsOverDB final : public DbOpsTarget {
 public:
  // `figures` (not owned, outlives it): what the caller may see; null: the whole DB.
  explicit DbOpsOverDB(DB* db, const FigureScope* figures = nullptr) : db_(db), figures_(figures) {}
  Status BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  Status GetValueSize(const Slice& key, uint64_t* size) override;
  Status DeleteByRegex(const std::string& pattern, uint64_t* deleted) override;
  Status DeleteAll(uint64_t* deleted) override;
  bool GetProperty(const std::string& name, std::string* value) override;
  Status Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) override;
  const FigureScope& figures() const override;

 private:
  DB* const db_;
  const FigureScope* const figures_;
};

// Whether `op` (wire::Op) is one ServeDbOp answers.
bool IsDbOp(uint8_t op);

// The name of such an op in messages: "exists", "delete", "value-size", "property",
// "delete-matching", "prefetch".
const char* DbOpName(uint8_t op);

// Decodes `meta`, the metadata of a request of `op` (IsDbOp(op)), runs it against
// *target and stores the answer's metadata in *answer.  Returns false, *answer
// unspecified, when `meta` is malformed: the stream is not to be trusted any further
// (close the connection).  A well-formed request that fails is answered with its error.
bool ServeDbOp(DbOpsTarget* target, uint8_t op, std::string_view meta, std::string* answer);

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_DB_OPS_H_
