// LocalServer: serves a DB to the other processes of this host (DB::Attach), on a Unix
// domain socket, with value bytes moving through the shared arena (docs/attach.md).
//
// At connect the peer's credentials (SO_PEERCRED, SO_PEERGROUPS) are checked against
// Options::local_allowed_uids (attach/local_access.h): a client no entry names (and not
// the owner's uid or root) is refused, told why and logged; an admitted one gets the
// grant of the entries that name it -- the namespaces it may use, and whether it may
// create and drop them.  An accepted one receives the arena's memfd once (SCM_RIGHTS), usually
// asks for a shared channel (OPEN_CHANNEL: every later frame goes through rings in
// shared memory, transport/shm_channel.h) and then sends requests, answered in order
// (frames of the peer protocol, wire.h; a client may pipeline them):
//   RESERVE keys+sizes  -> arena offsets of fresh, invisible slots; the client copies in
//   COMMIT  slot ids    -> each slot published exactly as a local put
//   COMMIT_RESERVE      -> a COMMIT that also reserves "spare" slots for the client's
//                          next put (its sizes), so that a put takes one round trip
//   PIN     keys        -> arena offsets of the values, pinned; the client copies out.
//                          A value not in memory is read through the DB into the
//                          connection's staging window (OPEN_STAGING, asked for before
//                          the channel; attach/staging_window.h) -- "later" when the
//                          window is full of the round's values
//   PIN_GROUPS keys in groups -> PIN's answer, one frame per group in group order, each
//                          sent as the owner's own layer-wise load (DB::BatchGetIntoGroups:
//                          pipelined over the peers in a cluster) reports the group
//   UNPIN   lease ids   (one-way)
// and plain requests for the rest (exists, deletes, value sizes, properties, Flush,
// CompactBuckets).  A connection's requests are in the default namespace until it sends
// USE_NAMESPACE, which binds it to a namespace of its grant: from then on the owner maps
// its keys into that namespace (its NamespaceView: the client's own mapping is never
// trusted), and DeleteAll, DeleteByRegex and READ_REMOVALS see that namespace only.
// CREATE/DROP/LIST_NAMESPACES are checked against the grant alike.  A request outside
// the grant -- any request with keys on a connection whose grant lacks the default
// namespace, USE/CREATE/DROP of a namespace the grant does not name, CREATE/DROP without
// '@admin' -- fails PermissionDenied naming the namespace, changes nothing, and is
// counted (local.namespace_refusals) and logged at most once per kRefusalLogInterval.
// Flush, CompactBuckets and properties are the whole DB's, from any connection.  Every connection
// owns its reservations and pins: when it closes (the client exits or is killed) they are given
// back, so a dead client never leaks arena space and never leaves a partial value visible.
//
// A slot reserved and not committed within Options::local_reservation_timeout_ms is
// given back; the client's later COMMIT of it fails with Aborted.  A spare is given back
// silently after spare_lifetime_ms(): it holds arena room on speculation.
//
// One thread per connection, its handshake included: a client that stops reading stalls
// only its own thread (and gives up after peer_timeout_ms), and one that sends garbage,
// stalls in the middle of a frame or dies in its handshake delays nobody else's.  Such
// a connection is closed, counted (local.clients_malformed) and logged at most once per
// kRefusalLogInterval, however many there are (docs/attach.md, "Misbehaving clients").
//
// The connections served at once are capped (Options::local_max_connections, sized by
// default from the descriptor budget, env/descriptor_budget.h): past the cap a new
// connection is greeted with Busy, naming the cap, and closed at once by the acceptor,
// which waits for nobody; counted (local.clients_over_budget) and logged at most once
// per kRefusalLogInterval.  So the owner never runs out of descriptors for the clients
// it serves, its bucket files and its own calls.
//
// Thread-safety: Start and Stop from the DB's Open and Close only.
#ifndef KVENGINE_ATTACH_LOCAL_SERVER_H_
#define KVENGINE_ATTACH_LOCAL_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "attach/local_access.h"
#include "attach/local_counters.h"
#include "kvengine/options.h"
#include "kvengine/status.h"
#include "transport/socket_util.h"
#include "util/log_limiter.h"
#include "util/mutex.h"

namespace kvengine {

class DB;
class Logger;
class SharedArena;

class LocalServer {
 public:
  // Listens on options.local_listen and serves `db`, the top of the owner's stack of
  // DB layers, whose memory tier's arena `arena` is (both must outlive the server):
  // clients' puts and the gets of values in memory go through the arena, every other
  // call -- a value read from SSD or a peer included -- through `db`.
  static Status Start(const Options& options, DB* db, SharedArena* arena, Logger* logger,
                      LocalServerCounters* counters, std::unique_ptr<LocalServer>* result);
  ~LocalServer();
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  // Stops accepting, closes every connection (giving back their reservations and pins)
  // and removes the socket file.  Idempotent.
  void Stop();

  const std::string& path() const { return path_; }
  // How long a spare slot is held for its client: a second, or
  // local_reservation_timeout_ms when that is shorter.
  uint64_t spare_lifetime_ms() const {
    const uint64_t timeout = options_.local_reservation_timeout_ms;
    return timeout == 0 || timeout > kSpareLifetimeMs ? kSpareLifetimeMs : timeout;
  }
  static constexpr uint64_t kSpareLifetimeMs = 1000;
  // How often a flood of refused connections may log a line.
  static constexpr std::chrono::seconds kRefusalLogInterval{10};
  // What one connection costs the owner: its socket, and a memfd while its shared
  // channel or its staging window is set up (one at a time).
  static constexpr uint64_t kDescriptorsPerConnection = 2;
  // Longest the acceptor waits to greet a connection it refuses.
  static constexpr uint64_t kOverBudgetGreetingMs = 50;
  // The most connections served at once.
  uint64_t max_connections() const { return max_connections_; }

  // Tests only: the owners of this process greet their later clients without the
  // features in `bits` (wire::kFeature*), as an owner built before them does, so that a
  // client's fallback to the older protocol is tested against a real owner.
  static void WithholdFeaturesForTesting(uint64_t bits) { withheld_features_.store(bits); }

 private:
  struct Connection;
  class Session;

  LocalServer(const Options& options, DB* db, SharedArena* arena, Logger* logger,
              LocalServerCounters* counters);
  void AcceptLoop();
  // Accepts every connection waiting and hands each to a thread of its own, doing no
  // I/O on any: a client that sends garbage, stalls or dies in its handshake delays no
  // other, and the listener's queue empties as fast as clients fill it.
  void AcceptAll();
  // Sorts a connection just accepted without waiting for it: false when its client
  // hung up already or spoke before its greeting (garbage: refused), true for one to
  // admit.  Keeps a flood of such connections as cheap to accept as it is to make.
  bool Triage(int fd);
  void Admit(int fd);
  // False when the connections served fill the cap.
  bool HasRoom();
  // Greets a connection past the cap with Busy and counts it; the caller closes it.
  void RefuseOverBudget(int fd);
  // Sends the attach greeting: `s`, and when it is OK the arena's memfd and size.
  // The greeting: `s`, and with an OK one the memfd of the default arena (part 0) when
  // `grant` includes a namespace in it.
  Status SendGreeting(int fd, const Status& s, const LocalGrant* grant, Deadline deadline);
  // Whether `grant` lets a client use some namespace whose values are in arena part 0.
  bool ReachesDefaultArena(const LocalGrant& grant) const;
  // On the connection's thread: checks the client's uid and greets it (the arena's
  // memfd and the attach frame).  False: refused, or gone before its greeting.
  bool Greet(Connection* conn);
  // Logs `line` at warn, at most once per `limiter`'s interval, with the count of the
  // `events` held back since the last line.
  void LogLimited(LogLimiter* limiter, const std::string& line, const char* events);
  // Counts and logs (at most once per kRefusalLogInterval) a request refused for its
  // namespace: `why` is the PermissionDenied the client is answered.
  void Deny(const std::string& who, const Status& why);
  // Counts a connection closed for bytes that are not the attach protocol (garbage, a
  // malformed request, a frame begun and not finished in peer_timeout_ms) and logs it,
  // at most once per kRefusalLogInterval.
  void Refuse(const std::string& who, const Status& why);
  // Joins the threads of connections that ended.
  void ReapLocked() REQUIRES(mu_);

  const Options options_;
  DB* const db_;
  SharedArena* const arena_;
  Logger* const logger_;
  LocalServerCounters* const counters_;
  const std::string path_;
  LocalAccess access_;  // Options::local_allowed_uids
  int listen_fd_ = -1;
  uint64_t max_connections_ = 0;  // set by Start
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  LogLimiter malformed_log_{kRefusalLogInterval};
  LogLimiter accept_log_{kRefusalLogInterval};
  LogLimiter over_budget_log_{kRefusalLogInterval};
  LogLimiter denied_log_{kRefusalLogInterval};

  static std::atomic<uint64_t> withheld_features_;

  Mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
};

}  // namespace kvengine

#endif  // KVENGINE_ATTACH_LOCAL_SERVER_H_
