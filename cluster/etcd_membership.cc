#include "cluster/etcd_membership.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include "cluster/etcd_client.h"
#include "util/mutex.h"

namespace kvengine {

namespace {

constexpr uint64_t kFirstBackoffMs = 100;
constexpr uint64_t kMaxBackoffMs = 2000;

class EtcdMembership final : public MembershipSource {
 public:
  EtcdMembership(std::string cluster, std::vector<std::string> endpoints, std::string prefix,
                 uint64_t lease_ttl_ms, MembershipLog log)
      : cluster_(std::move(cluster)),
        members_prefix_(prefix + "/members/"),
        lease_ttl_ms_(std::max<uint64_t>(1000, lease_ttl_ms)),
        log_(std::move(log)) {
    client_options_.endpoints = std::move(endpoints);
    // A call must not outlive the lease it may be renewing.
    client_options_.timeout_ms = std::min<uint64_t>(2000, lease_ttl_ms_ / 3);
  }
  ~EtcdMembership() override { Stop(); }

  Status Start(const std::string& self, Listener listener) override {
    listener_ = std::move(listener);
    self_ = self;
    Status s = EtcdClient::Open(client_options_, &watch_client_);
    if (s.ok()) s = EtcdClient::Open(client_options_, &lease_client_);
    if (!s.ok()) return s;
    // Register and list once here, so that a DB opened while etcd is up starts with the
    // cluster's members (and is one of them); failures are retried in the background.
    if (!self_.empty()) Register();
    const bool listed = List();
    watcher_ = std::thread([this, listed] { WatchLoop(listed); });
    if (!self_.empty()) keeper_ = std::thread([this] { LeaseLoop(); });
    return Status::OK();
  }

  void Stop() override {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    wake_.NotifyAll();
    if (watch_client_ != nullptr) watch_client_->Interrupt();
    if (lease_client_ != nullptr) lease_client_->Interrupt();
    if (watcher_.joinable()) watcher_.join();
    if (keeper_.joinable()) keeper_.join();
    // Leave at once: revoking the lease deletes the member key (a fresh client, the
    // others refuse calls once interrupted).
    int64_t lease = 0;
    {
      MutexLock lock(&mu_);
      lease = lease_;
      lease_ = 0;
    }
    if (lease == 0) return;
    std::unique_ptr<EtcdClient> client;
    Status s = EtcdClient::Open(client_options_, &client);
    if (s.ok()) s = client->LeaseRevoke(lease);
    if (s.ok()) {
      Log(LogLevel::kInfo,
          "cluster " + cluster_ + ": left (lease " + std::to_string(lease) + " revoked)");
    } else {
      Log(LogLevel::kWarn, "cluster " + cluster_ + ": revoking lease " + std::to_string(lease) +
                               ": " + s.ToString() + " (the member goes when it expires)");
    }
  }

  std::string Readiness() const override {
    MutexLock lock(&mu_);
    if (self_.empty()) return "cluster_member: ok\n";  // not serving: nothing to register
    if (etcd_down_) return "cluster_member: not ready: etcd " + cluster_ + " unreachable\n";
    if (lease_ == 0) return "cluster_member: not ready: registering " + self_ + " with etcd\n";
    return "cluster_member: ok\n";
  }

  std::string StatsText() const override {
    MutexLock lock(&mu_);
    std::ostringstream out;
    out << "membership: etcd\n"
        << "cluster: " << cluster_ << "\n"
        << "etcd: " << (etcd_down_ ? "unreachable" : "connected") << "\n";
    if (self_.empty()) {
      out << "lease: none (not serving)\n";
    } else if (lease_ == 0) {
      out << "lease: none (registering)\n";
    } else {
      out << "lease: " << lease_ << " ttl_ms " << lease_ttl_ms_ << "\n";
    }
    out << "revision: " << revision_ << "\n"
        << "registered: " << members_.size() << "\n"
        << "ignored_values: " << ignored_values_ << "\n";
    return out.str();
  }

 private:
  void Log(LogLevel level, const std::string& line) const {
    if (log_) log_(level, line);
  }

  // Records a failed call: logged when etcd was thought up, silent while it stays down.
  void Failed(const char* what, const Status& s) {
    bool first;
    {
      MutexLock lock(&mu_);
      first = !etcd_down_;
      etcd_down_ = true;
    }
    if (first) {
      Log(LogLevel::kWarn, "cluster " + cluster_ + ": etcd " + what + ": " + s.ToString() +
                               "; keeping the last membership and retrying");
    }
  }
  void Succeeded() {
    bool recovered;
    {
      MutexLock lock(&mu_);
      recovered = etcd_down_;
      etcd_down_ = false;
    }
    if (recovered) Log(LogLevel::kInfo, "cluster " + cluster_ + ": etcd reachable again");
  }

  // Sleeps up to ms; false when Stop was called.
  bool Sleep(uint64_t ms) {
    MutexLock lock(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!stopping_ && wake_.WaitUntil(&mu_, deadline)) {
    }
    return !stopping_;
  }
  bool stopping() {
    MutexLock lock(&mu_);
    return stopping_;
  }

  // Grants a lease (when none is held) and puts this host's key under it.
  bool Register() {
    int64_t lease;
    {
      MutexLock lock(&mu_);
      lease = lease_;
    }
    Status s;
    if (lease == 0) {
      const int64_t ttl_s = static_cast<int64_t>((lease_ttl_ms_ + 999) / 1000);
      s = lease_client_->LeaseGrant(ttl_s, &lease);
      if (!s.ok()) {
        if (!s.IsAborted()) Failed("lease grant", s);
        return false;
      }
    }
    s = lease_client_->Put(members_prefix_ + self_, self_, lease);
    {
      MutexLock lock(&mu_);
      lease_ = lease;  // kept even when the put failed: the next try reuses it
    }
    if (!s.ok()) {
      if (s.IsNotFound()) {  // the lease expired between grant and put
        MutexLock lock(&mu_);
        lease_ = 0;
      }
      if (!s.IsAborted()) Failed("register", s);
      return false;
    }
    Succeeded();
    Log(LogLevel::kInfo,
        "cluster " + cluster_ + ": registered " + self_ + " under lease " + std::to_string(lease));
    return true;
  }

  void LeaseLoop() {
    bool registered = true;
    {
      MutexLock lock(&mu_);
      registered = lease_ != 0 && !etcd_down_;
    }
    uint64_t backoff = kFirstBackoffMs;
    while (!stopping()) {
      if (!registered) {
        registered = Register();
        if (!registered) {
          if (!Sleep(backoff)) return;
          backoff = std::min(backoff * 2, kMaxBackoffMs);
          continue;
        }
        backoff = kFirstBackoffMs;
      }
      if (!Sleep(lease_ttl_ms_ / 3)) return;
      int64_t lease, ttl = 0;
      {
        MutexLock lock(&mu_);
        lease = lease_;
      }
      Status s = lease_client_->LeaseKeepAlive(lease, &ttl);
      if (s.IsAborted()) return;
      if (s.ok()) {
        Succeeded();
        continue;
      }
      if (s.IsNotFound()) {
        // Expired (etcd was away longer than the TTL): a new lease, the key again.
        Log(LogLevel::kWarn, "cluster " + cluster_ + ": lease " + std::to_string(lease) +
                                 " expired; registering again");
        MutexLock lock(&mu_);
        lease_ = 0;
      } else {
        Failed("lease keepalive", s);
      }
      registered = false;
    }
  }

  // Reads every member; true when etcd answered.
  bool List() {
    std::vector<EtcdKeyValue> kvs;
    int64_t revision = 0;
    Status s = watch_client_->Range(members_prefix_, &kvs, &revision);
    if (!s.ok()) {
      if (!s.IsAborted()) Failed("list", s);
      return false;
    }
    Succeeded();
    std::map<std::string, Endpoint> members;
    for (const EtcdKeyValue& kv : kvs) Apply(false, kv, &members);
    {
      MutexLock lock(&mu_);
      members_ = members;
      revision_ = revision;
    }
    Publish(members);
    return true;
  }

  // Applies one put or delete to `members`.
  void Apply(bool deleted, const EtcdKeyValue& kv, std::map<std::string, Endpoint>* members) {
    if (deleted) {
      members->erase(kv.key);
      return;
    }
    Endpoint e;
    Status s = Endpoint::Parse(kv.value, &e);
    if (!s.ok() || e.port == 0) {
      members->erase(kv.key);
      {
        MutexLock lock(&mu_);
        ignored_values_++;
      }
      Log(LogLevel::kWarn, "cluster " + cluster_ + ": ignoring " + kv.key +
                               ": its value is not a host:port endpoint (" +
                               (s.ok() ? "port 0" : s.ToString()) + ")");
      return;
    }
    (*members)[kv.key] = e;
  }

  void Publish(const std::map<std::string, Endpoint>& members) {
    std::vector<Endpoint> list;
    for (const auto& [key, e] : members) {
      if (std::find(list.begin(), list.end(), e) == list.end()) list.push_back(e);
    }
    listener_(std::move(list));
  }

  void WatchLoop(bool listed) {
    uint64_t backoff = kFirstBackoffMs;
    bool need_list = !listed;
    while (!stopping()) {
      if (need_list) {
        if (!List()) {
          if (!Sleep(backoff)) return;
          backoff = std::min(backoff * 2, kMaxBackoffMs);
          continue;
        }
        need_list = false;
      }
      int64_t from;
      std::map<std::string, Endpoint> members;
      {
        MutexLock lock(&mu_);
        from = revision_ + 1;
        members = members_;
      }
      int64_t compacted = 0;
      bool connected = false;
      Status s = watch_client_->Watch(
          members_prefix_, from,
          [&](const std::vector<EtcdEvent>& events) {
            if (!connected) {
              connected = true;
              Succeeded();
              backoff = kFirstBackoffMs;
            }
            if (events.empty()) return !stopping();
            int64_t last = 0;
            for (const EtcdEvent& e : events) {
              Apply(e.deleted, e.kv, &members);
              last = std::max(last, e.kv.mod_revision);
            }
            {
              MutexLock lock(&mu_);
              members_ = members;
              revision_ = std::max(revision_, last);
            }
            Publish(members);
            return !stopping();
          },
          &compacted);
      if (stopping() || s.IsAborted()) return;
      if (s.IsNotFound() && compacted > 0) {
        Log(LogLevel::kInfo, "cluster " + cluster_ + ": " + s.ToString() + "; listing again");
        need_list = true;
        continue;
      }
      // Broken or ended: watch again from the revision after the last one seen, so the
      // events of the gap arrive then (none is missed).
      if (!s.ok()) Failed("watch", s);
      if (!Sleep(backoff)) return;
      backoff = std::min(backoff * 2, kMaxBackoffMs);
    }
  }

  const std::string cluster_;
  const std::string members_prefix_;
  const uint64_t lease_ttl_ms_;
  const MembershipLog log_;
  EtcdClientOptions client_options_;
  std::string self_;
  Listener listener_;
  std::unique_ptr<EtcdClient> watch_client_, lease_client_;
  std::thread watcher_, keeper_;

  mutable Mutex mu_;
  CondVar wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool etcd_down_ GUARDED_BY(mu_) = false;
  int64_t lease_ GUARDED_BY(mu_) = 0;
  int64_t revision_ GUARDED_BY(mu_) = 0;  // the last one seen
  std::map<std::string, Endpoint> members_ GUARDED_BY(mu_);
  uint64_t ignored_values_ GUARDED_BY(mu_) = 0;
};

}  // namespace

Status NewEtcdMembership(const std::string& cluster, uint64_t lease_ttl_ms, MembershipLog log,
                         std::unique_ptr<MembershipSource>* result) {
  std::vector<std::string> endpoints;
  std::string prefix;
  Status s = ParseClusterUrl(cluster, &endpoints, &prefix);
  if (!s.ok()) return s;
#if !KV_WITH_ETCD
  return Status::NotSupported("option cluster", "this build has no etcd client (libcurl)");
#else
  *result = std::make_unique<EtcdMembership>(cluster, std::move(endpoints), std::move(prefix),
                                             lease_ttl_ms, std::move(log));
  return Status::OK();
#endif
}

}  // namespace kvengine
