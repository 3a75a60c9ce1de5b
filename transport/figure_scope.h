// FigureScope: which of the DB's figures a client may read through a property, and the
// one place a property's answer is cut to them -- for both doors of a server: attached
// clients (attach/local_server.cc, scope from their local_allowed_uids grant) and peers
// (transport/server.cc, scope from their tenant token).  Both hand PROPERTY requests to
// ServeDbOp (transport/db_ops.h), which asks the target's scope (docs/attach.md, "What a
// client sees of the DB").
//
// The whole DB's scope reads every property as the DB answers it.  A scope of some
// namespaces (a tenant) reads only what describes its namespaces:
//   kvengine.stats, .stats.json,   its namespaces' figures (namespace.NAME.*, "namespaces",
//   .stats.prometheus, .prometheus, kvengine_namespace_*{namespace="NAME"}); nothing of
//   .metrics                        the DB as a whole (totals count every tenant's calls)
//   kvengine.options               the options but those that name who may connect and
//                                  with what (local_allowed_uids, the token file, ...)
//   kvengine.readiness             as it is
// and no other property (PermissionDenied): the perf histograms and the peers' state
// describe every tenant's calls.  A new property is refused until it is listed here.
//
// Thread-safety: immutable after construction.
#ifndef KVENGINE_TRANSPORT_FIGURE_SCOPE_H_
#define KVENGINE_TRANSPORT_FIGURE_SCOPE_H_

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "kvengine/status.h"

namespace kvengine {

class FigureScope {
 public:
  // The whole DB's.
  FigureScope() = default;
  // A client of namespaces `names` ("": the default namespace), or of every namespace
  // with `every`, named `who` in refusals ("uid 1001", "tenant 'alpha'").
  static FigureScope Of(std::string who, bool every, const std::set<std::string>& names);

  bool whole() const { return whole_; }
  // Whether the figures of the namespace the stats call `label` are in scope: "default",
  // a registered name, or "id:<16 hex digits>" (a namespace only a peer's keys named).
  bool Shows(std::string_view label) const;
  // OK when property `name` may be read in this scope; else PermissionDenied naming
  // `who` and the property.
  Status Admit(const std::string& name) const;
  // Cuts *value, property `name`'s answer, to what this scope shows.
  // REQUIRES: Admit(name) is OK.
  void Filter(const std::string& name, std::string* value) const;

  // The options a scope of some namespaces is not shown (kvengine.options).
  static bool IsPrivateOption(std::string_view option);

 private:
  bool whole_ = true;
  bool every_ = false;
  std::string who_;
  std::set<std::string> names_;  // "" for the default namespace
  std::set<uint64_t> ids_;       // the named namespaces' ids
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_FIGURE_SCOPE_H_
