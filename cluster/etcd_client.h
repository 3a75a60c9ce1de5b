// EtcdClient: the few calls of etcd's v3 API that cluster membership needs, through
// etcd's JSON gateway (HTTP POST of JSON to /v3/..., keys and values in base64) with
// libcurl.  No state beyond the endpoints: every call is one HTTP request, tried on each
// endpoint in turn, starting with the one that answered last.
//
//   Range        every key under a prefix, and the store's revision at the read.
//   Put          a key bound to a lease (0: none).
//   LeaseGrant / LeaseKeepAlive / LeaseRevoke.
//   Watch        the events under a prefix from a revision on, streamed until the
//                callback says stop, Interrupt() is called, or the stream breaks.
//
// Interrupt() makes the call in progress (and every later one) return Aborted at once;
// it is how an owner stops a thread blocked in Watch.
//
// Thread-safety: calls may run from several threads at once; Interrupt from any.
#ifndef KVENGINE_CLUSTER_ETCD_CLIENT_H_
#define KVENGINE_CLUSTER_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kvengine/status.h"
#include "util/mutex.h"

namespace kvengine {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdEvent {
  bool deleted = false;  // a DELETE (or a lease's expiry); else a PUT
  EtcdKeyValue kv;
};

struct EtcdClientOptions {
  // "host:port" of each etcd member, in the order to try them.
  std::vector<std::string> endpoints;
  // Longest one unary request may take on one endpoint (connect included).
  // Default: 2000
  uint64_t timeout_ms = 2000;
};

class EtcdClient {
 public:
  // InvalidArgument when no endpoint is named; NotSupported in a build without libcurl.
  static Status Open(const EtcdClientOptions& options, std::unique_ptr<EtcdClient>* result);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Every key under `prefix` (in key order) and the revision the read saw.
  Status Range(const std::string& prefix, std::vector<EtcdKeyValue>* kvs, int64_t* revision);
  Status Put(const std::string& key, const std::string& value, int64_t lease);
  Status LeaseGrant(int64_t ttl_seconds, int64_t* id);
  // Renews the lease once; *ttl gets the seconds it now has.  NotFound when the lease
  // has expired or was revoked.
  Status LeaseKeepAlive(int64_t id, int64_t* ttl);
  // Ends the lease and removes every key bound to it.  NotFound when it was gone.
  Status LeaseRevoke(int64_t id);

  // Receives each batch of events (an empty one first, once the watch is established);
  // returns false to stop watching.
  using EventsFn = std::function<bool(const std::vector<EtcdEvent>& events)>;
  // Watches the keys under `prefix` from `start_revision` on.  Returns OK when `fn`
  // asked to stop, Aborted after Interrupt(), IOError when the stream broke or no
  // endpoint answered.  When etcd has compacted start_revision away the watch is
  // cancelled: *compact_revision gets the oldest revision it still has and the
  // status is NotFound (the caller re-lists with Range).
  Status Watch(const std::string& prefix, int64_t start_revision, const EventsFn& fn,
               int64_t* compact_revision);

  // Aborts the calls in progress and refuses later ones.  Idempotent.
  void Interrupt();

  // Base64 of RFC 4648 (the gateway's encoding of bytes).  Exposed for the tests.
  static std::string Base64Encode(const std::string& in);
  static bool Base64Decode(const std::string& in, std::string* out);

 private:
  struct Request;
  explicit EtcdClient(const EtcdClientOptions& options);
  // POSTs `body` to `path` on each endpoint in turn until one answers; *answer gets the
  // response body.  `on_data`, when set, receives a streamed body instead (false from
  // it ends the request, which then returns OK).
  Status Post(const std::string& path, const std::string& body, uint64_t timeout_ms,
              std::string* answer, const std::function<bool(const char*, size_t)>& on_data);
  Status PostOnce(const std::string& endpoint, const std::string& path, const std::string& body,
                  uint64_t timeout_ms, std::string* answer,
                  const std::function<bool(const char*, size_t)>& on_data);
  // Calls a unary method and parses its JSON answer into *json (an nlohmann::json, kept
  // out of this header); an answer carrying {"error": ...} becomes a Status.
  Status Call(const std::string& path, const std::string& body, void* json);

  const EtcdClientOptions options_;
  std::atomic<bool> interrupted_{false};
  Mutex mu_;
  size_t current_ GUARDED_BY(mu_) = 0;      // index of the endpoint that answered last
  std::set<void*> active_ GUARDED_BY(mu_);  // the multi handles of calls in progress
};

// Splits "etcd://HOST:PORT[,HOST:PORT...]/PREFIX" into its endpoints and its prefix
// (without the trailing '/'; "/" alone is the empty prefix).  InvalidArgument naming
// what is wrong.
Status ParseClusterUrl(const std::string& url, std::vector<std::string>* endpoints,
                       std::string* prefix);

}  // namespace kvengine

#endif  // KVENGINE_CLUSTER_ETCD_CLIENT_H_
