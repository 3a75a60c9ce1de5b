// LocalServerCounters: what the owner's side of DB::Attach counts, declared once in the
// table below, from which every output is made: the lines "local.<name>: N" of
// "kvengine.stats", the object "local" of "kvengine.stats.json" and the Prometheus
// families kvengine_local_<name>_total (docs/observability.md).  A counter added to
// the table appears in all three.
//
// Kept by the OwnerDB (attach/owner_db.h), whose stats properties report them, so that
// they outlive its server.  Thread-safety: counters are atomic; the Append* methods may
// run while the server counts.
#ifndef KVENGINE_ATTACH_LOCAL_COUNTERS_H_
#define KVENGINE_ATTACH_LOCAL_COUNTERS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kvengine/status.h"

namespace kvengine {

// X(name, Prometheus help), in the order the outputs list them.
#define KV_LOCAL_SERVER_COUNTERS(X)                                                           \
  X(clients_accepted, "Connections of attached processes admitted.")                          \
  X(clients_refused, "Connections of attached processes refused (uid not allowed).")          \
  X(clients_over_budget,                                                                      \
    "Connections of attached processes refused past local_max_connections (the owner's "      \
    "descriptor budget).")                                                                    \
  X(clients_malformed,                                                                        \
    "Connections closed for bytes that are not the attach protocol (garbage, a malformed or " \
    "unfinished frame).")                                                                     \
  X(reservations_expired,                                                                     \
    "Slots attached clients reserved and held past local_reservation_timeout_ms.")            \
  X(reserve_requests, "RESERVE round trips of attached clients' puts.")                       \
  X(spare_commits, "Values attached clients put into spare slots (a put in one round trip).") \
  X(shared_channels,                                                                          \
    "Connections of attached processes that carry their frames through shared memory.")       \
  X(staging_windows,                                                                          \
    "Connections of attached processes given a staging window for values not in memory.")     \
  X(window_staged_values,                                                                     \
    "Values read from SSD or a peer into attached clients' staging windows.")                 \
  X(window_deferred_keys,                                                                     \
    "Keys of attached reads answered in a later round: their staging window was full.")       \
  X(group_loads,                                                                              \
    "PIN_GROUPS requests of attached clients' layer-wise loads (a round each: every group "   \
    "it holds is read at once and answered as soon as it is in).")                            \
  X(namespace_refusals,                                                                       \
    "Requests of attached processes refused (PermissionDenied) for a namespace their "        \
    "credentials do not grant (local_allowed_uids).")

struct LocalServerCounters {
#define KV_LOCAL_COUNTER_FIELD(name, help) std::atomic<uint64_t> name{0};
  KV_LOCAL_SERVER_COUNTERS(KV_LOCAL_COUNTER_FIELD)
#undef KV_LOCAL_COUNTER_FIELD

  // Appends the lines "local.<name>: N" ("kvengine.stats").
  void AppendText(std::string* out) const;
  // Adds ,"local":{"<name>":N,...} inside the JSON object *out ("kvengine.stats.json"),
  // before its closing brace; an *out that is not an object is left alone.
  void AddToJson(std::string* out) const;
  // Appends one counter family kvengine_local_<name>_total each (the Prometheus text
  // exposition format 0.0.4, "kvengine.stats.prometheus").
  void AppendPrometheus(std::string* out) const;
};

// What an attached client counts of its own calls (AttachedDB), declared once: its
// process's metrics endpoint (Options::metrics_listen) reports them as the families
// kvengine_client_<name>_total of the "kvengine.metrics" property, beside the process's
// perf histograms, while the owner's endpoint covers the store.
// X(name, Prometheus help), in the order the exposition lists them.
#define KV_ATTACHED_CLIENT_COUNTERS(X)                                                  \
  X(puts, "Keys this attached client stored.")                                          \
  X(put_bytes, "Value bytes this attached client stored.")                              \
  X(put_failures, "Keys this attached client failed to store (or whole failed calls).") \
  X(gets, "Keys this attached client read (Get, GetInto, BatchGetInto).")               \
  X(get_bytes, "Value bytes this attached client read.")                                \
  X(misses, "Keys this attached client read that the store did not hold.")              \
  X(get_failures, "Keys this attached client failed to read for another reason.")       \
  X(exists_queries, "Keys this attached client asked about (BatchExists).")             \
  X(deletes, "Keys this attached client removed.")

struct AttachedClientCounters {
#define KV_CLIENT_COUNTER_FIELD(name, help) std::atomic<uint64_t> name{0};
  KV_ATTACHED_CLIENT_COUNTERS(KV_CLIENT_COUNTER_FIELD)
#undef KV_CLIENT_COUNTER_FIELD

  // Counts a batch's per-key results (>= 0: done, with that many bytes for reads; a
  // negative code: failed) into `done`, `bytes`, and `failed` (NotFound into `missing`
  // when given).  A call that failed as a whole counts every key failed.
  static void CountResults(const Status& call, size_t keys, const std::vector<int64_t>& results,
                           std::atomic<uint64_t>* done, std::atomic<uint64_t>* bytes,
                           std::atomic<uint64_t>* failed, std::atomic<uint64_t>* missing);

  // Appends one counter family kvengine_client_<name>_total each.
  void AppendPrometheus(std::string* out) const;
};

}  // namespace kvengine

#endif  // KVENGINE_ATTACH_LOCAL_COUNTERS_H_
