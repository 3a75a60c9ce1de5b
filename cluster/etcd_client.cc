#include "cluster/etcd_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#if KV_WITH_ETCD
#include <curl/curl.h>

#include <nlohmann/json.hpp>
#endif

namespace kvengine {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string EtcdClient::Base64Encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

bool EtcdClient::Base64Decode(const std::string& in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (size_t i = 0; i < in.size(); i++) {
    const char c = in[i];
    if (c == '=') {
      // Padding only at the end, at most two.
      if (i + 2 < in.size()) return false;
      pad++;
      continue;
    }
    if (pad > 0) return false;
    const char* p = std::strchr(kAlphabet, c);
    if (p == nullptr || c == '\0') return false;
    acc = (acc << 6) | static_cast<uint32_t>(p - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return pad <= 2;
}

Status ParseClusterUrl(const std::string& url, std::vector<std::string>* endpoints,
                       std::string* prefix) {
  const std::string scheme = "etcd://";
  if (url.rfind(scheme, 0) != 0) {
    return Status::InvalidArgument("cluster '" + url + "' does not start with etcd://");
  }
  const size_t slash = url.find('/', scheme.size());
  if (slash == std::string::npos) {
    return Status::InvalidArgument("cluster '" + url + "' names no /PREFIX after the endpoints");
  }
  endpoints->clear();
  const std::string hosts = url.substr(scheme.size(), slash - scheme.size());
  for (size_t pos = 0; pos <= hosts.size();) {
    size_t comma = hosts.find(',', pos);
    if (comma == std::string::npos) comma = hosts.size();
    const std::string item = hosts.substr(pos, comma - pos);
    const size_t colon = item.rfind(':');
    if (item.empty() || colon == std::string::npos || colon == 0 || colon + 1 == item.size() ||
        item.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return Status::InvalidArgument("cluster '" + url + "': endpoint '" + item +
                                     "' is not HOST:PORT");
    }
    endpoints->push_back(item);
    pos = comma + 1;
  }
  *prefix = url.substr(slash);
  while (!prefix->empty() && prefix->back() == '/') prefix->pop_back();
  return Status::OK();
}

EtcdClient::EtcdClient(const EtcdClientOptions& options) : options_(options) {}

EtcdClient::~EtcdClient() = default;

#if !KV_WITH_ETCD

Status EtcdClient::Open(const EtcdClientOptions&, std::unique_ptr<EtcdClient>*) {
  return Status::NotSupported("etcd cluster membership", "this build has no libcurl");
}
Status EtcdClient::Range(const std::string&, std::vector<EtcdKeyValue>*, int64_t*) {
  return Status::NotSupported("etcd");
}
Status EtcdClient::Put(const std::string&, const std::string&, int64_t) {
  return Status::NotSupported("etcd");
}
Status EtcdClient::LeaseGrant(int64_t, int64_t*) { return Status::NotSupported("etcd"); }
Status EtcdClient::LeaseKeepAlive(int64_t, int64_t*) { return Status::NotSupported("etcd"); }
Status EtcdClient::LeaseRevoke(int64_t) { return Status::NotSupported("etcd"); }
Status EtcdClient::Watch(const std::string&, int64_t, const EventsFn&, int64_t*) {
  return Status::NotSupported("etcd");
}
void EtcdClient::Interrupt() {}

#else  // KV_WITH_ETCD

namespace {

using nlohmann::json;

// The gateway writes int64 fields as JSON strings and leaves out zero values.
int64_t Int(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  try {
    return std::stoll(it->get<std::string>());
  } catch (...) {
    return 0;
  }
}

std::string Str(const json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The end of the range of every key that starts with `prefix` (etcd's "prefix end").
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) != 0xff) {
      prefix.back() = static_cast<char>(static_cast<uint8_t>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

bool ParseKeyValue(const json& j, EtcdKeyValue* kv) {
  if (!j.is_object()) return false;
  if (!EtcdClient::Base64Decode(Str(j, "key"), &kv->key)) return false;
  if (!EtcdClient::Base64Decode(Str(j, "value"), &kv->value)) return false;
  kv->mod_revision = Int(j, "mod_revision");
  kv->lease = Int(j, "lease");
  return true;
}

Status ErrorOf(const json& j, const std::string& what) {
  const auto it = j.find("error");
  if (it == j.end()) return Status::OK();
  const std::string message = it->is_string() ? it->get<std::string>() : it->dump();
  // gRPC code 5 is NOT_FOUND (a lease that expired or was revoked).
  if (Int(j, "code") == 5) return Status::NotFound(what, message);
  return Status::IOError(what, message);
}

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

size_t OnData(char* data, size_t size, size_t n, void* user) {
  auto* fn = static_cast<std::function<bool(const char*, size_t)>*>(user);
  return (*fn)(data, size * n) ? size * n : 0;  // 0 aborts the transfer
}

}  // namespace

Status EtcdClient::Open(const EtcdClientOptions& options, std::unique_ptr<EtcdClient>* result) {
  static CurlGlobal global;  // once per process, before any handle
  if (options.endpoints.empty()) return Status::InvalidArgument("etcd: no endpoint named");
  result->reset(new EtcdClient(options));
  return Status::OK();
}

void EtcdClient::Interrupt() {
  interrupted_.store(true);
  MutexLock lock(&mu_);
  for (void* multi : active_) curl_multi_wakeup(static_cast<CURLM*>(multi));
}

Status EtcdClient::PostOnce(const std::string& endpoint, const std::string& path,
                            const std::string& body, uint64_t timeout_ms, std::string* answer,
                            const std::function<bool(const char*, size_t)>& on_data) {
  // A streamed answer ends when on_data says so; a whole one is collected.
  bool stopped_by_reader = false;
  std::function<bool(const char*, size_t)> sink = [&](const char* p, size_t n) {
    if (on_data) {
      if (on_data(p, n)) return true;
      stopped_by_reader = true;
      return false;
    }
    answer->append(p, n);
    return true;
  };
  CURL* easy = curl_easy_init();
  CURLM* multi = curl_multi_init();
  if (easy == nullptr || multi == nullptr) {
    if (easy != nullptr) curl_easy_cleanup(easy);
    if (multi != nullptr) curl_multi_cleanup(multi);
    return Status::IOError("etcd: cannot create a libcurl handle");
  }
  const std::string url = "http://" + endpoint + path;
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, OnData);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(easy, CURLOPT_PROXY, "");  // etcd is reached directly, never via a proxy
  // A watch has no deadline; keepalive probes find a peer that vanished without a reset.
  if (!on_data) curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 5L);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 2L);
  curl_multi_add_handle(multi, easy);
  {
    MutexLock lock(&mu_);
    active_.insert(multi);
  }
  int running = 1;
  while (running > 0 && !interrupted_.load()) {
    if (curl_multi_perform(multi, &running) != CURLM_OK) break;
    if (running > 0) curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  CURLcode code = CURLE_OK;
  bool done = false;
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
    if (msg->msg == CURLMSG_DONE) {
      code = msg->data.result;
      done = true;
    }
  }
  long http = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http);
  {
    MutexLock lock(&mu_);
    active_.erase(multi);
  }
  curl_multi_remove_handle(multi, easy);
  curl_multi_cleanup(multi);
  curl_easy_cleanup(easy);
  curl_slist_free_all(headers);
  if (interrupted_.load()) return Status::Aborted("etcd: interrupted");
  if (stopped_by_reader) return Status::OK();
  if (!done || code != CURLE_OK) {
    return Status::IOError("etcd " + endpoint + path, done ? curl_easy_strerror(code) : "stopped");
  }
  // The gateway answers errors with a JSON body too (and a 4xx/5xx code): let the
  // caller read it, unless there is none.
  if (http != 200 && answer != nullptr && answer->empty()) {
    return Status::IOError("etcd " + endpoint + path, "HTTP " + std::to_string(http));
  }
  return Status::OK();
}

Status EtcdClient::Post(const std::string& path, const std::string& body, uint64_t timeout_ms,
                        std::string* answer,
                        const std::function<bool(const char*, size_t)>& on_data) {
  size_t first;
  {
    MutexLock lock(&mu_);
    first = current_;
  }
  Status last;
  const size_t n = options_.endpoints.size();
  for (size_t k = 0; k < n; k++) {
    const size_t i = (first + k) % n;
    if (answer != nullptr) answer->clear();
    last = PostOnce(options_.endpoints[i], path, body, timeout_ms, answer, on_data);
    if (last.ok()) {
      MutexLock lock(&mu_);
      current_ = i;
      return last;
    }
    if (last.IsAborted()) return last;
  }
  return last;
}

Status EtcdClient::Call(const std::string& path, const std::string& body, void* out) {
  std::string answer;
  Status s = Post(path, body, options_.timeout_ms, &answer, nullptr);
  if (!s.ok()) return s;
  json& j = *static_cast<json*>(out);
  j = json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::IOError("etcd " + path, "answer is not a JSON object");
  }
  return ErrorOf(j, "etcd " + path);
}

Status EtcdClient::Range(const std::string& prefix, std::vector<EtcdKeyValue>* kvs,
                         int64_t* revision) {
  const json request = {{"key", Base64Encode(prefix)},
                        {"range_end", Base64Encode(PrefixEnd(prefix))}};
  json j;
  Status s = Call("/v3/kv/range", request.dump(), &j);
  if (!s.ok()) return s;
  kvs->clear();
  const auto it = j.find("kvs");
  if (it != j.end() && it->is_array()) {
    for (const json& item : *it) {
      EtcdKeyValue kv;
      if (ParseKeyValue(item, &kv)) kvs->push_back(std::move(kv));
    }
  }
  const auto header = j.find("header");
  *revision = header != j.end() ? Int(*header, "revision") : 0;
  return Status::OK();
}

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  json request = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) request["lease"] = std::to_string(lease);
  json j;
  return Call("/v3/kv/put", request.dump(), &j);
}

Status EtcdClient::LeaseGrant(int64_t ttl_seconds, int64_t* id) {
  const json request = {{"TTL", std::to_string(ttl_seconds)}};
  json j;
  Status s = Call("/v3/lease/grant", request.dump(), &j);
  if (!s.ok()) return s;
  *id = Int(j, "ID");
  if (*id == 0) return Status::IOError("etcd lease grant", Str(j, "error") + " (no lease ID)");
  return Status::OK();
}

Status EtcdClient::LeaseKeepAlive(int64_t id, int64_t* ttl) {
  const json request = {{"ID", std::to_string(id)}};
  json j;
  Status s = Call("/v3/lease/keepalive", request.dump(), &j);
  if (!s.ok()) return s;
  // One answer of the stream: {"result": {"ID", "TTL"}}; no TTL means the lease is gone.
  const auto result = j.find("result");
  *ttl = result != j.end() ? Int(*result, "TTL") : 0;
  if (*ttl <= 0) return Status::NotFound("etcd lease " + std::to_string(id), "expired");
  return Status::OK();
}

Status EtcdClient::LeaseRevoke(int64_t id) {
  const json request = {{"ID", std::to_string(id)}};
  json j;
  return Call("/v3/lease/revoke", request.dump(), &j);
}

Status EtcdClient::Watch(const std::string& prefix, int64_t start_revision, const EventsFn& fn,
                         int64_t* compact_revision) {
  *compact_revision = 0;
  const json request = {{"create_request",
                         {{"key", Base64Encode(prefix)},
                          {"range_end", Base64Encode(PrefixEnd(prefix))},
                          {"start_revision", std::to_string(start_revision)}}}};
  // The gateway streams one JSON object per line: {"result": WatchResponse}.
  std::string pending;
  bool cancelled = false;
  std::string failure;
  auto on_data = [&](const char* p, size_t n) {
    pending.append(p, n);
    size_t eol;
    while ((eol = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, eol);
      pending.erase(0, eol + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        failure = "a line of the watch stream is not JSON";
        return false;
      }
      if (j.contains("error")) {
        failure = ErrorOf(j, "etcd watch").ToString();
        return false;
      }
      const auto result = j.find("result");
      if (result == j.end() || !result->is_object()) continue;
      if (result->value("canceled", false)) {
        *compact_revision = Int(*result, "compact_revision");
        cancelled = true;
        return false;
      }
      if (result->value("created", false) && !fn({})) return false;
      const auto events = result->find("events");
      if (events == result->end() || !events->is_array() || events->empty()) continue;
      std::vector<EtcdEvent> batch;
      for (const json& e : *events) {
        EtcdEvent event;
        event.deleted = Str(e, "type") == "DELETE";
        const auto kv = e.find("kv");
        if (kv == e.end() || !ParseKeyValue(*kv, &event.kv)) continue;
        batch.push_back(std::move(event));
      }
      if (!batch.empty() && !fn(batch)) return false;
    }
    return true;
  };
  Status s = Post("/v3/watch", request.dump(), options_.timeout_ms, nullptr, on_data);
  if (!s.ok()) return s;
  if (cancelled) {
    if (*compact_revision > 0) {
      return Status::NotFound("etcd watch", "revision " + std::to_string(start_revision) +
                                                " compacted (oldest kept " +
                                                std::to_string(*compact_revision) + ")");
    }
    return Status::IOError("etcd watch", "cancelled by the server");
  }
  if (!failure.empty()) return Status::IOError("etcd watch", failure);
  // The stream ended without the callback asking: the server closed it.
  return Status::OK();
}

#endif  // KV_WITH_ETCD

}  // namespace kvengine
