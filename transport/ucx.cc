#include "transport/ucx.h"

#include <cstring>

#include "transport/wire.h"
#include "util/coding.h"

#ifdef KV_WITH_UCX
#include <poll.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "db/shared_arena.h"
#include "transport/lease_calls.h"
#include "transport/mr_table.h"
#include "transport/pending_get.h"
#include "transport/read_validation.h"
#include "transport/tcp_transport.h"
#include "transport/ucp_helpers.h"
#include "transport/wire.h"
#include "util/mutex.h"
#include "util/region_map.h"
#endif

namespace kvengine {

// ---------------------------------------------------------------- the wire
void UcxConnectRequest::EncodeTo(std::string* dst) const {
  dst->push_back(2);
  PutLengthPrefixed(dst, worker_address);
  dst->push_back(reads_by_am ? 1 : 0);
}

Status UcxConnectRequest::DecodeFrom(std::string_view in, UcxConnectRequest* out) {
  if (in.empty() || (in[0] != 1 && in[0] != 2)) {
    return Status::Corruption("UCX connect request of unknown version");
  }
  const bool with_flags = in[0] == 2;
  in.remove_prefix(1);
  std::string_view addr;
  if (!GetLengthPrefixed(&in, &addr) || in.size() != (with_flags ? 1u : 0u)) {
    return Status::Corruption("malformed UCX connect request");
  }
  if (addr.empty() || addr.size() > kUcxMaxBlob) {
    return Status::Corruption("UCX worker address of " + std::to_string(addr.size()) + " bytes");
  }
  out->worker_address.assign(addr);
  out->reads_by_am = with_flags && (in[0] & 1) != 0;
  return Status::OK();
}

void UcxConnectAnswer::EncodeTo(std::string* dst) const {
  dst->push_back(3);
  PutLengthPrefixed(dst, worker_address);
  PutFixed64(dst, arena_addr);
  PutFixed64(dst, arena_len);
  PutLengthPrefixed(dst, rkey);
  PutFixed64(dst, token);
  PutFixed64(dst, lease_ttl_ms);
  PutFixed64(dst, put_ttl_ms);
  dst->push_back(reads_by_am ? 1 : 0);
}

Status UcxConnectAnswer::DecodeFrom(std::string_view in, UcxConnectAnswer* out) {
  if (in.empty() || in[0] < 1 || in[0] > 3) {
    return Status::Corruption("UCX connect answer of unknown version");
  }
  const bool with_token = in[0] >= 2, with_v3 = in[0] >= 3;
  in.remove_prefix(1);
  std::string_view addr, rkey;
  UcxConnectAnswer a;
  if (!GetLengthPrefixed(&in, &addr) || !GetFixed64(&in, &a.arena_addr) ||
      !GetFixed64(&in, &a.arena_len) || !GetLengthPrefixed(&in, &rkey) ||
      (with_token &&
       (!GetFixed64(&in, &a.token) || a.token == 0 || !GetFixed64(&in, &a.lease_ttl_ms))) ||
      (with_v3 && (!GetFixed64(&in, &a.put_ttl_ms) || in.size() != 1 || (in[0] & ~1) != 0)) ||
      (!with_v3 && !in.empty())) {
    return Status::Corruption("malformed UCX connect answer");
  }
  const bool by_am = with_v3 && in[0] == 1;  // the flags byte, all that is left of a v3
  if (addr.empty() || addr.size() > kUcxMaxBlob || (rkey.empty() && !by_am) ||
      rkey.size() > kUcxMaxBlob) {
    return Status::Corruption("UCX connect answer with a worker address of " +
                              std::to_string(addr.size()) + " bytes and an rkey of " +
                              std::to_string(rkey.size()));
  }
  if (a.arena_len == 0 || a.arena_addr + a.arena_len < a.arena_addr) {
    return Status::Corruption("UCX connect answer names an empty or wrapping arena");
  }
  a.worker_address.assign(addr);
  a.rkey.assign(rkey);
  a.reads_by_am = by_am;
  *out = std::move(a);
  return Status::OK();
}

bool UcxConnectAnswer::operator==(const UcxConnectAnswer& o) const {
  return worker_address == o.worker_address && arena_addr == o.arena_addr &&
         arena_len == o.arena_len && rkey == o.rkey && token == o.token &&
         lease_ttl_ms == o.lease_ttl_ms && put_ttl_ms == o.put_ttl_ms &&
         reads_by_am == o.reads_by_am;
}

void EncodeUcxReserveRequest(std::span<const Slice> keys, std::span<const uint64_t> sizes,
                             std::string* meta) {
  PutVarint64(meta, keys.size());
  for (size_t i = 0; i < keys.size(); i++) {
    PutLengthPrefixed(meta, std::string_view(keys[i].data(), keys[i].size()));
    PutVarint64(meta, sizes[i]);
  }
}

Status DecodeUcxReserveAnswer(std::string_view in, size_t n, std::vector<UcxReserved>* out) {
  Status batch;
  if (!wire::GetBatchStatus(&in, &batch)) return Status::Corruption("malformed RESERVE answer");
  if (!batch.ok()) return batch;
  out->assign(n, UcxReserved());
  for (UcxReserved& r : *out) {
    uint64_t result = 0;
    if (!GetFixed64(&in, &result) || !GetFixed64(&in, &r.id) || !GetFixed64(&in, &r.offset)) {
      return Status::Corruption("malformed RESERVE answer");
    }
    r.result = static_cast<int64_t>(result);
  }
  return in.empty() ? Status::OK() : Status::Corruption("malformed RESERVE answer");
}

void EncodeUcxCommitRequest(std::span<const uint64_t> ids, std::span<const uint8_t> publish,
                            std::string* meta) {
  PutVarint64(meta, ids.size());
  for (size_t i = 0; i < ids.size(); i++) {
    PutFixed64(meta, ids[i]);
    meta->push_back(static_cast<char>(publish[i] != 0));
  }
}

Status DecodeUcxCommitAnswer(std::string_view in, size_t n, std::vector<int64_t>* results) {
  Status batch;
  if (!wire::GetBatchStatus(&in, &batch)) return Status::Corruption("malformed COMMIT answer");
  if (!batch.ok()) return batch;
  results->assign(n, 0);
  for (int64_t& r : *results) {
    uint64_t v = 0;
    if (!GetFixed64(&in, &v)) return Status::Corruption("malformed COMMIT answer");
    r = static_cast<int64_t>(v);
  }
  return in.empty() ? Status::OK() : Status::Corruption("malformed COMMIT answer");
}

#ifndef KV_WITH_UCX

namespace {
constexpr const char* kNoUcx =
    "kvengine was built without UCX (KV_WITH_UCX off): install libucx-dev (Debian) and "
    "rebuild";
}  // namespace

bool UcxAvailable(std::string* why, UcxInfo*) {
  *why = kNoUcx;
  return false;
}

bool UcxCudaMemory(uint64_t) { return false; }

Status NewUcxTransport(const TransportOptions&, std::unique_ptr<Transport>*, const std::string&) {
  return Status::NotSupported("UCX transport", kNoUcx);
}

Status UcxServer::Create(std::function<void(LogLevel, const std::string&)>,
                         std::unique_ptr<UcxServer>*) {
  return Status::NotSupported("UCX server", kNoUcx);
}

#else  // KV_WITH_UCX

namespace {

using Clock = std::chrono::steady_clock;

constexpr unsigned kAmRequest = kUcxAmRequest;
constexpr unsigned kAmAnswer = kUcxAmAnswer;
constexpr size_t kAmRequestHeader = kUcxAmRequestHeader;

std::string AmRequestHeader(uint8_t op, uint64_t token, uint64_t request_id) {
  std::string header;
  header.push_back(1);
  header.push_back(static_cast<char>(op));
  PutFixed64(&header, token);
  PutFixed64(&header, request_id);
  return header;
}

Status UcsError(const std::string& what, ucs_status_t st) {
  return Status::IOError(what + ": " + ucs_status_string(st));
}

// Set on a thread while it asks UCX for an endpoint with peer-failure handling that it
// may not get: UCX logs an ERROR for each transport without it ("no peer failure
// handler": UCX 1.13's shared-memory transports, by default) before it answers
// UNREACHABLE, and the caller then makes the endpoint without.  Those lines are
// expected, on every connect over shared memory, and are dropped.
thread_local bool t_probing_peer_mode = false;

ucs_log_func_rc_t QuietWhileProbing(const char*, unsigned, const char*, ucs_log_level_t,
                                    const ucs_log_component_config_t*, const char*, va_list) {
  return t_probing_peer_mode ? UCS_LOG_FUNC_RC_STOP : UCS_LOG_FUNC_RC_CONTINUE;
}

// A UCP context and one worker.  Every call on the worker, its endpoints and rkeys is
// made under mu (the worker is UCS_THREAD_MODE_SERIALIZED): calling threads and the
// server's progress thread take turns.
class Worker {
 public:
  ~Worker() {
    for (const auto& [start, m] : regions_) ucp_mem_unmap(context_, m.second);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr && owns_context_) ucp_cleanup(context_);
    // keep_ goes now, after the last completion could touch it.
  }

  // `tls`: UCX_TLS for this context (empty: UCX's own, from the environment).  `rma`:
  // one-sided operations (UCP_FEATURE_RMA); a worker without them answers no one-sided
  // read, emulated or not.  `mu`: the lock its calls are made under (its own when null),
  // shared by the workers of one server.  `shared`: the context takes more workers
  // (CreateSharing), made and destroyed by other threads while this one is in use.
  static Status Create(std::unique_ptr<Worker>* result, const std::string& tls = "",
                       bool rma = true, Mutex* mu = nullptr, bool shared = false) {
    static std::once_flag quiet;
    std::call_once(quiet, [] { ucs_log_push_handler(&QuietWhileProbing); });
    auto w = std::unique_ptr<Worker>(new Worker);
    if (mu != nullptr) w->mu_ = mu;
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return UcsError("ucp_config_read", st);
    if (!tls.empty() && (st = ucp_config_modify(config, "TLS", tls.c_str())) != UCS_OK) {
      ucp_config_release(config);
      return UcsError("UCX_TLS=" + tls, st);
    }
    ucp_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = (rma ? UCP_FEATURE_RMA : 0) | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    if (shared) {
      params.field_mask |= UCP_PARAM_FIELD_MT_WORKERS_SHARED;
      params.mt_workers_shared = 1;
    }
    st = ucp_init(&params, config, &w->context_);
    ucp_config_release(config);
    if (st != UCS_OK) return UcsError("ucp_init", st);
    MutexLock lock(w->mu_);  // another worker of the server may be in use
    Status s = w->Init();
    if (!s.ok()) return s;
    *result = std::move(w);
    return Status::OK();
  }

  // Another worker on owner's context (made with `shared`), that shares owner's mappings
  // and rkeys (they are the context's): the server's worker of one client.  Its calls
  // are made under owner's lock once another thread may reach it; until then, and as
  // it is destroyed once no other thread can, they need no lock (making and destroying
  // a worker took 6-67 ms over sm on this loaded VM: under the lock, every other
  // client's progress would wait as long).
  static Status CreateSharing(Worker* owner, std::unique_ptr<Worker>* result) {
    auto w = std::unique_ptr<Worker>(new Worker);
    w->mu_ = owner->mu_;
    w->context_ = owner->context_;
    w->owns_context_ = false;
    Status s = w->Init();
    if (!s.ok()) return s;
    *result = std::move(w);
    return Status::OK();
  }

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::string& address() const { return address_; }
  Mutex* mu() { return mu_; }
  // Whether this context maps device (CUDA) memory, as ucp_context_query says.
  bool cuda_memory() const { return cuda_memory_; }

  // Maps [addr, addr+length) for one-sided access; *memh is unmapped with Unmap.
  Status Map(void* addr, size_t length, ucp_mem_h* memh) EXCLUDES(mu_) {
    const ucp_mem_map_params_t p = UcpMapParams(addr, length, 0);
    MutexLock lock(mu_);
    const ucs_status_t st = ucp_mem_map(context_, &p, memh);
    return st == UCS_OK ? Status::OK()
                        : UcsError("ucp_mem_map of " + std::to_string(length) + " bytes", st);
  }
  void Unmap(ucp_mem_h memh) {
    MutexLock lock(mu_);
    ucp_mem_unmap(context_, memh);
  }
  // Replaces [addr, addr+length) -- whose bytes are lost -- by memory UCX allocates at
  // the same address, mapped; *memh is unmapped with Unmap, which unmaps the range.
  Status Place(void* addr, size_t length, ucp_mem_h* memh) EXCLUDES(mu_) {
    const ucp_mem_map_params_t p =
        UcpMapParams(addr, length, UCP_MEM_MAP_ALLOCATE | UCP_MEM_MAP_FIXED);
    MutexLock lock(mu_);
    const ucs_status_t st = ucp_mem_map(context_, &p, memh);
    if (st != UCS_OK) return UcsError("ucp_mem_map (allocate, fixed)", st);
    ucp_mem_attr_t attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    if (ucp_mem_query(*memh, &attr) != UCS_OK || attr.address != addr) {
      ucp_mem_unmap(context_, *memh);
      return Status::IOError("UCX did not allocate at the arena's address");
    }
    return Status::OK();
  }

  // An endpoint to the worker at `address` that reports a failed peer to on_error (from
  // inside progress, under mu) instead of aborting.  REQUIRES: mu held.
  Status Connect(const std::string& address, ucp_err_handler_cb_t on_error, void* arg,
                 ucp_ep_h* ep) {
    ucp_ep_params_t p;
    std::memset(&p, 0, sizeof(p));
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = on_error;
    p.err_handler.arg = arg;
    t_probing_peer_mode = true;
    ucs_status_t st = ucp_ep_create(worker_, &p, ep);
    t_probing_peer_mode = false;
    if (st == UCS_ERR_UNREACHABLE) {
      // UCX 1.13's shared-memory transports posix and sysv offer no peer-failure
      // handling unless UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING say so (off
      // by default): with them alone, an endpoint is made without it.  A client then
      // learns of a dead owner from the control connection (UcxPeer::control), and
      // one that hangs runs into the caller's timeout.
      p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(worker_, &p, ep);
    }
    return st == UCS_OK ? Status::OK() : UcsError("ucp_ep_create", st);
  }

  // Closes ep at once (outstanding operations complete with an error).  REQUIRES: mu held.
  void Close(ucp_ep_h ep) { CloseUcpEndpointNow(worker_, ep); }

  // Progresses until done() (called under mu) or the deadline: spins for up to
  // kSpinBeforeSleep without progress, then sleeps on the worker's event descriptor.
  // False at the deadline.  (A 1 ms spin made 64 KiB batches 50 times slower on this
  // 2-core host: the spinning client took the core the owner's progress thread needed
  // to answer its LOOKUP.)
  //
  // `watch` (when >= 0): a descriptor that becomes readable or hung up when the peer
  // waited on is gone (its control connection); then *watch_fired is set and false
  // returned at once.  Looked at while asleep, and every kWatchEvery while busy.
  bool ProgressUntil(const std::function<bool()>& done, Clock::time_point deadline, int watch = -1,
                     bool* watch_fired = nullptr) {
    Clock::time_point idle_since = Clock::now(), watched = idle_since;
    auto fired = [&](int timeout_ms) {
      pollfd pfd[2] = {{efd_, POLLIN, 0}, {watch, POLLIN | POLLRDHUP, 0}};
      const bool watching = watch >= 0;
      if (timeout_ms == 0 && !watching) return false;
      if (timeout_ms == 0) {
        if (poll(&pfd[1], 1, 0) <= 0) return false;
      } else if (poll(pfd, watching ? 2 : 1, timeout_ms) <= 0 || pfd[1].revents == 0) {
        return false;
      }
      if (watch_fired != nullptr) *watch_fired = true;
      return true;
    };
    for (;;) {
      bool progressed = false;
      {
        MutexLock lock(mu_);
        while (ucp_worker_progress(worker_) != 0) progressed = true;
        if (done()) return true;
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return false;
      if (now - watched >= kWatchEvery) {
        watched = now;
        if (fired(0)) return false;
      }
      if (progressed) idle_since = now;
      if (now - idle_since < kSpinBeforeSleep) continue;
      ucs_status_t st;
      {
        MutexLock lock(mu_);
        st = ucp_worker_arm(worker_);
      }
      // Busy (events not consumed yet): progress again -- but not for ever: a send
      // waiting for room in a dead owner's shared-memory FIFO keeps the worker busy
      // with nothing to progress, and spinning here would hold mu from the threads
      // that take turns on it until the deadline.
      if (st == UCS_ERR_BUSY && now - idle_since < kBusyBeforeSleep) continue;
      // Another thread may take the event: never sleep long.
      if (fired(1)) return false;
    }
  }

  // Calls cb(arg, ...) for each active message `id` that arrives, from inside progress
  // (under mu).
  Status SetAmHandler(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
    MutexLock lock(mu_);
    return SetAmHandlerHeld(id, cb, arg);
  }
  // As SetAmHandler.  REQUIRES: mu held.
  Status SetAmHandlerHeld(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
    const ucp_am_handler_param_t p = UcpAmHandlerParams(id, cb, arg);
    const ucs_status_t st = ucp_worker_set_am_recv_handler(worker_, &p);
    return st == UCS_OK ? Status::OK() : UcsError("ucp_worker_set_am_recv_handler", st);
  }

  // Sends active message `id` on ep, eagerly (the receiver finds the bytes in its
  // handler; a rendezvous would need a receive of its own).  header and data are kept
  // until the send completes.  REQUIRES: mu held.
  Status SendAm(ucp_ep_h ep, unsigned id, std::string header, std::string data) {
    auto* msg = new Message{std::move(header), std::move(data)};
    return Post(ep, id, msg, msg->data.data(), msg->data.size());
  }

  // As SendAm, its data the `length` bytes at `data`, by reference: they must stay put
  // until the send completes or fails.  REQUIRES: mu held.
  Status SendAmFrom(ucp_ep_h ep, unsigned id, std::string header, const void* data, size_t length) {
    return Post(ep, id, new Message{std::move(header), {}}, data, length);
  }

  // An answer awaited (by AmCall): filled in from inside progress, under mu.
  struct AmWait {
    bool done = false;
    std::string answer;
  };
  // Registers *wait for the answer to a new request id, returned.  REQUIRES: mu held.
  uint64_t Await(AmWait* wait) {
    const uint64_t id = next_request_++;
    awaited_[id] = wait;
    return id;
  }
  // REQUIRES: mu held.
  void StopAwaiting(uint64_t id) { awaited_.erase(id); }

  // A batch of reads the owner serves by active message (kUcxAmReadData), each read's
  // bytes copied into its destination from inside progress, under mu.
  struct ReadWait {
    explicit ReadWait(std::span<RemoteRead> r) : reads(r), done(r.size()), remaining(r.size()) {}
    std::span<RemoteRead> reads;
    std::vector<uint8_t> done;
    size_t remaining;
    uint64_t refused = 0;  // reads the owner refused, or answered with the wrong length
  };
  // Registers *wait for the reads of a new request id, returned.  REQUIRES: mu held.
  uint64_t AwaitReads(ReadWait* wait) {
    const uint64_t id = next_request_++;
    reads_[id] = wait;
    return id;
  }
  // REQUIRES: mu held.
  void StopAwaitingReads(uint64_t id) { reads_.erase(id); }

  // Wakes a thread asleep in poll on the event descriptor.
  void Signal() { ucp_worker_signal(worker_); }
  int efd() const { return efd_; }
  static constexpr std::chrono::microseconds kSpinBeforeSleep{50};
  static constexpr std::chrono::milliseconds kWatchEvery{1};
  // How long a worker busy with nothing to progress is progressed without a pause.
  static constexpr std::chrono::microseconds kBusyBeforeSleep{1000};

  // A client's regions, mapped on this worker's context and found by address.
  Status MapRegion(void* addr, size_t length) {
    ucp_mem_h memh = nullptr;
    Status s = Map(addr, length, &memh);
    if (!s.ok()) return s;
    MutexLock lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(addr)] = {length, memh};
    return Status::OK();
  }
  void UnmapRegion(void* addr) {
    ucp_mem_h memh = nullptr;
    {
      MutexLock lock(mu_);
      auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
      if (it == regions_.end()) return;
      memh = it->second.second;
      regions_.erase(it);
    }
    Unmap(memh);
  }
  // The mapping holding all of [addr, addr+length), or null.  REQUIRES: mu held.
  ucp_mem_h FindRegion(const void* addr, size_t length) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return nullptr;
    --it;
    if (a + length < a || a + length > it->first + it->second.first) return nullptr;
    return it->second.second;
  }
  // Keeps `o` until the worker is destroyed (a batch whose completions may still come).
  // REQUIRES: mu held.
  void Keep(std::shared_ptr<void> o) { keep_.push_back(std::move(o)); }

 private:
  Worker() = default;

  // Makes the worker on context_.  REQUIRES: mu held, or the worker unseen by others.
  Status Init() {
    ucp_worker_params_t wp;
    std::memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs_status_t st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) return UcsError("ucp_worker_create", st);
    st = ucp_worker_get_efd(worker_, &efd_);
    if (st != UCS_OK) return UcsError("ucp_worker_get_efd", st);
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    st = ucp_worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) return UcsError("ucp_worker_get_address", st);
    address_.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker_, addr);
    ucp_context_attr_t attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    cuda_memory_ = ucp_context_query(context_, &attr) == UCS_OK && UcxCudaMemory(attr.memory_types);
    Status s = SetAmHandlerHeld(kAmAnswer, &Worker::OnAnswer, this);
    if (s.ok()) s = SetAmHandlerHeld(kUcxAmReadData, &Worker::OnReadData, this);
    return s;
  }

  // An active message's header and (when copied) data, kept until its send completes.
  struct Message {
    std::string header, data;
  };
  // Sends msg->header and [data, data+length) eagerly; msg is deleted once sent.
  Status Post(ucp_ep_h ep, unsigned id, Message* msg, const void* data, size_t length) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = [](void* request, ucs_status_t, void* user_data) {
      delete static_cast<Message*>(user_data);
      ucp_request_free(request);
    };
    p.user_data = msg;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(ep, id, msg->header.data(), msg->header.size(), data, length, &p);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) delete msg;
    return UCS_PTR_IS_ERR(req) ? UcsError("ucp_am_send_nbx", UCS_PTR_STATUS(req)) : Status::OK();
  }

  // An answer (kAmAnswer): header the request id, data the answer.  Answers nobody awaits
  // any more (past their caller's deadline) are dropped.
  static ucs_status_t OnAnswer(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
    auto* w = static_cast<Worker*>(arg);
    if (header_length != 8 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_OK;
    auto it = w->awaited_.find(DecodeFixed64(static_cast<const char*>(header)));
    if (it == w->awaited_.end()) return UCS_OK;
    it->second->answer.assign(static_cast<const char*>(data), length);
    it->second->done = true;
    return UCS_OK;
  }

  // A read's bytes (kUcxAmReadData).  Answers nobody awaits any more, naming a read
  // already answered or of another length than asked are dropped; a refusal fails the
  // read.
  static ucs_status_t OnReadData(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
    auto* w = static_cast<Worker*>(arg);
    if (header_length != kUcxAmReadDataHeader) return UCS_OK;
    const char* h = static_cast<const char*>(header);
    auto it = w->reads_.find(DecodeFixed64(h));
    if (it == w->reads_.end()) return UCS_OK;
    ReadWait* wait = it->second;
    const uint32_t index = DecodeFixed32(h + 8);
    if (index >= wait->reads.size() || wait->done[index]) return UCS_OK;
    RemoteRead& r = wait->reads[index];
    wait->done[index] = 1;
    wait->remaining--;
    if (h[12] != 0 || length != r.length || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      r.status = Status::IOError("the owner refused a read by active message");
      wait->refused++;
      return UCS_OK;
    }
    if (length > 0) std::memcpy(r.local, data, length);
    return UCS_OK;
  }

  std::map<uint64_t, AmWait*> awaited_;                         // under mu_
  std::map<uint64_t, ReadWait*> reads_;                         // under mu_
  uint64_t next_request_ = 1;                                   // under mu_
  std::map<uintptr_t, std::pair<size_t, ucp_mem_h> > regions_;  // under mu_
  std::vector<std::shared_ptr<void> > keep_;                    // under mu_
  Mutex own_mu_;
  Mutex* mu_ = &own_mu_;
  ucp_context_h context_ = nullptr;
  bool owns_context_ = true;  // false: CreateSharing's, on another worker's context
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string address_;
  bool cuda_memory_ = false;
};

// Forwards a DB's regions to ucp_mem_map (with no worker: records them only, for a
// server whose reads are all served by active message); `arena` is told of the region
// named "arena".
//
// The arena is placed, where it can be: UCX 1.13 reads one-sidedly over shared memory
// only memory it allocated itself (its shared-memory RMA transports, posix and sysv,
// reach segments they made; cma is no RMA transport), and emulates reads of any other
// memory with messages the owner's progress thread answers -- a hundred times slower
// here.  So a fresh arena that is a private anonymous mapping (nobody else maps it, and
// it holds no value yet: the DB registers it as it opens) is replaced in place, at the
// same address and length, by memory UCX allocates (ucp_mem_map ALLOCATE|FIXED).  A
// shared arena (a memfd attached clients map) or one of explicit huge pages is mapped
// as it is.  KVENGINE_UCX_PLACE_ARENA=0 turns placing off.
class MapRegistrar final : public MemoryRegistrar {
 public:
  // on_arena(region, true) when the arena is mapped, (region, false) before any region
  // is unmapped.
  MapRegistrar(Worker* w, MrTable* table,
               std::function<void(const MrTable::Region&, bool mapped)> on_arena,
               std::function<void(LogLevel, const std::string&)> log)
      : w_(w), table_(table), arena_(std::move(on_arena)), log_(std::move(log)) {
    const char* e = std::getenv("KVENGINE_UCX_PLACE_ARENA");
    place_ = e == nullptr || std::string(e) != "0";
  }
  Status Register(void* addr, size_t length, const char* what) override {
    ucp_mem_h memh = nullptr;
    Status s;
    const bool arena = std::strcmp(what, "arena") == 0;
    bool placed = false;
    if (arena && place_ && w_ != nullptr && PrivateAnonymous(addr, length)) {
      placed = w_->Place(addr, length, &memh).ok();
      if (!placed) Reclaim(addr, length);  // had UCX let the range go, it is ours again
      if (log_) {
        log_(LogLevel::kInfo, placed ? "UCX: the arena placed in memory UCX allocated"
                                     : "UCX: the arena could not be placed; mapped as it is");
      }
    }
    if (!placed && w_ != nullptr) s = w_->Map(addr, length, &memh);
    if (!s.ok()) return Status::IOError(std::string("mapping ") + what, s.message());
    MrTable::Region r;
    r.start = reinterpret_cast<uintptr_t>(addr);
    r.length = length;
    r.handle = memh;
    s = table_->Add(r);
    if (!s.ok()) {
      Unmap(memh, addr, length, placed);
      return s;
    }
    if (placed) {
      MutexLock lock(&mu_);
      placed_.insert(r.start);
    }
    if (arena) arena_placed_.store(placed);
    if (arena_ && arena) arena_(r, true);
    return Status::OK();
  }
  void Unregister(void* addr, size_t) override {
    MrTable::Region r;
    if (!table_->Remove(addr, &r)) return;
    if (arena_) arena_(r, false);
    bool placed;
    {
      MutexLock lock(&mu_);
      placed = placed_.erase(r.start) > 0;
    }
    Unmap(static_cast<ucp_mem_h>(r.handle), addr, r.length, placed);
  }

 private:
  // Unmaps memh; a placed region's range is given back to its owner as a private
  // anonymous mapping again (the owner unmaps the range itself when it is done with it).
  void Unmap(ucp_mem_h memh, void* addr, size_t length, bool placed) {
    if (memh != nullptr) w_->Unmap(memh);
    if (placed) Reclaim(addr, length);
  }
  // Maps [addr, addr+length) private and anonymous where nothing is mapped there.
  void Reclaim(void* addr, size_t length) {
    void* back = mmap(addr, length, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (back != MAP_FAILED && back != addr) munmap(back, length);  // an old kernel's hint
  }

  // Whether every mapping of [addr, addr+length) is private and anonymous (no file, no
  // explicit huge pages), per /proc/self/maps.
  static bool PrivateAnonymous(void* addr, size_t length) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(addr), end = begin + length;
    std::ifstream maps("/proc/self/maps");
    uintptr_t covered = begin;
    for (std::string line; std::getline(maps, line);) {
      unsigned long lo = 0, hi = 0, offset = 0, inode = 0;
      char perms[8] = {0}, dev[16] = {0};
      int path_at = 0;
      if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %15s %lu %n", &lo, &hi, perms, &offset, dev,
                      &inode, &path_at) < 6) {
        continue;
      }
      if (hi <= covered || lo >= end) continue;
      if (lo > covered || perms[3] != 'p' || inode != 0) return false;
      if (path_at > 0 && static_cast<size_t>(path_at) < line.size() && line[path_at] != '[') {
        return false;
      }
      covered = hi;
      if (covered >= end) return true;
    }
    return false;
  }

  Worker* const w_;
  MrTable* const table_;
  std::function<void(const MrTable::Region&, bool)> arena_;
  std::function<void(LogLevel, const std::string&)> log_;
  bool place_ = true;

 public:
  std::atomic<bool> arena_placed_{false};  // for stats

 private:
  Mutex mu_;
  std::set<uintptr_t> placed_ GUARDED_BY(mu_);
};

// ---------------------------------------------------------------- the server
// Whether UCX_TLS `tls` (empty: UCX's default, every transport) admits UCX's TCP.
bool AdmitsTcp(const std::string& tls) {
  if (tls.empty() || tls == "all") return true;
  const bool negated = tls[0] == '^';
  bool listed = false;
  for (size_t pos = negated ? 1 : 0; pos <= tls.size();) {
    size_t comma = tls.find(',', pos);
    if (comma == std::string::npos) comma = tls.size();
    if (tls.compare(pos, comma - pos, "tcp") == 0) listed = true;
    pos = comma + 1;
  }
  return listed != negated;
}

// UCX_TLS `tls` without UCX's TCP (empty when it names nothing else).
std::string WithoutTcp(const std::string& tls) {
  if (tls.empty() || tls == "all") return "^tcp";
  if (tls[0] == '^') return AdmitsTcp(tls) ? tls + ",tcp" : tls;
  std::string kept;
  for (size_t pos = 0; pos <= tls.size();) {
    size_t comma = tls.find(',', pos);
    if (comma == std::string::npos) comma = tls.size();
    const std::string item = tls.substr(pos, comma - pos);
    if (!item.empty() && item != "tcp") kept += (kept.empty() ? "" : ",") + item;
    pos = comma + 1;
  }
  return kept;
}

// The server has up to two contexts, all their workers progressed by one thread under
// one lock:
//
// - rma_, with one-sided operations, over every transport UCX_TLS admits but TCP:
//   clients it reaches (shared memory, RC/DC verbs) read one-sided, by ucp_get_nbx.
//   Each such client has a worker of its own on rma_'s context (Client::own), made at
//   its UCX_CONNECT and destroyed when its connection closes; rma_'s own worker serves
//   nobody.  Why: UCX 1.13's shared-memory transports (uct/sm/mm) deliver active
//   messages through one receive FIFO per worker, shared by every sender, and a sender
//   takes a slot (compare-and-swap of the head) before it writes the element; one killed
//   between the two leaves a slot that never fills, past which that worker never reads
//   again.  With one worker for all, a client killed mid-LOOKUP left every other
//   client's lease ops unanswered and this thread spinning (ucp_worker_arm busy for
//   ever).  With a worker per client, the slot wedges only the dead client's worker.
// - am_, without one-sided operations (no UCP_FEATURE_RMA), over UCX's TCP: clients
//   only it reaches read by kvengine's own active messages (kUcxAmRead), the owner
//   sending each value's bytes from the arena with ucp_am_send_nbx.
//
// Why not one-sided over TCP: UCX emulates them there with messages the owner answers
// from inside progress (rma_sw.c: ucp_get_req_handler), and sends the answer with
// ucp_request_send, which aborts the process (ucs_fatal "unexpected error") on any
// error but "no resource" -- the error a TCP send to a peer that died returns.  UCX
// 1.13 (and master) have no option that changes it: error handling modes, keepalive and
// force-closing endpoints only decide when the failure is noticed.  A worker without
// UCP_FEATURE_RMA installs no handler for those messages, so no client can make it
// answer one, and active message sends complete with an error instead.
class UcxServerImpl final : public UcxServer {
 public:
  explicit UcxServerImpl(std::function<void(LogLevel, const std::string&)> log)
      : log_(std::move(log)) {}

  // Makes the workers for UCX_TLS `tls` (see above) and starts serving.  Not served (no
  // worker: clients are answered NotSupported and read by GET) when neither can be made.
  void Start(const std::string& tls) {
    Status rs = Status::NotSupported("UCX_TLS names no transport but tcp");
    const std::string rma_tls = WithoutTcp(tls);
    if (!rma_tls.empty()) rs = Worker::Create(&rma_, rma_tls, /*rma=*/true, &mu_, /*shared=*/true);
    Status as = Status::NotSupported("UCX_TLS leaves tcp out");
    if (AdmitsTcp(tls)) as = Worker::Create(&am_, "tcp", /*rma=*/false, &mu_);
    if (!rs.ok()) Log(LogLevel::kInfo, "UCX: no one-sided reads served: " + rs.ToString());
    if (!as.ok()) Log(LogLevel::kInfo, "UCX: no reads by active message: " + as.ToString());
    if (rma_ == nullptr && am_ == nullptr) {
      Log(LogLevel::kWarn, "UCX not served");
      registrar_ = std::make_shared<NoRegistrar>();
      return;
    }
    auto on_arena = [this](const MrTable::Region& r, bool mapped) {
      MutexLock lock(&mu_);
      if (!mapped && r.start != arena_.start) return;  // not the arena
      if (rkey_ != nullptr) ucp_rkey_buffer_release(rkey_);
      rkey_ = nullptr;
      rkey_len_ = 0;
      arena_ = MrTable::Region();
      if (!mapped) return;
      arena_ = r;
      if (rma_ == nullptr) return;
      const ucs_status_t st =
          ucp_rkey_pack(rma_->context(), static_cast<ucp_mem_h>(r.handle), &rkey_, &rkey_len_);
      if (st != UCS_OK) {
        rkey_ = nullptr;
        Log(LogLevel::kError, std::string("ucp_rkey_pack of the arena: ") + ucs_status_string(st));
      }
    };
    auto registrar = std::make_shared<MapRegistrar>(rma_.get(), &maps_, on_arena, log_);
    placing_ = registrar.get();
    registrar_ = std::move(registrar);
    for (Worker* w : Workers()) {
      Status s = w->SetAmHandler(kAmRequest, &UcxServerImpl::OnRequest, this);
      if (s.ok()) s = w->SetAmHandler(kUcxAmRead, &UcxServerImpl::OnRead, this);
      if (!s.ok()) Log(LogLevel::kError, "UCX active messages: " + s.ToString());
    }
    progress_ = std::thread([this] { Run(); });
  }

  ~UcxServerImpl() override {
    if (!progress_.joinable()) return;
    stop_.store(true);
    for (Worker* w : Workers()) w->Signal();
    progress_.join();
    {
      MutexLock lock(&mu_);
      if (rkey_ != nullptr) ucp_rkey_buffer_release(rkey_);
      rkey_ = nullptr;
    }
    for (const MrTable::Region& r : maps_.All()) {
      registrar_->Unregister(reinterpret_cast<void*>(r.start), r.length);
    }
  }

  std::shared_ptr<MemoryRegistrar> registrar() override { return registrar_; }

  void ServePuts(SharedArena* arena) override {
    MutexLock serving(&serve_mu_);
    arena_db_ = arena;
  }

  Status Connect(std::string_view request, std::string* answer, std::shared_ptr<void>* client,
                 LeaseOpFn serve, uint64_t lease_ttl_ms) override {
    if (rma_ == nullptr && am_ == nullptr) {
      return Status::NotSupported("this server does not serve UCX");
    }
    UcxConnectRequest req;
    Status s = UcxConnectRequest::DecodeFrom(request, &req);
    if (!s.ok()) return s;
    UcxConnectAnswer a;
    auto rec = std::make_unique<Client>();
    rec->server = this;
    rec->serve = std::move(serve);
    bool one_sided = false;
    {
      MutexLock lock(&mu_);
      if (arena_.length == 0) return Status::NotSupported("the arena is not mapped for UCX");
      one_sided = rma_ != nullptr && rkey_ != nullptr;
    }
    // One-sided where a transport reaches the client with them, on a worker of its own,
    // made without the lock (no other thread sees it yet); else by active message (if
    // the client can), over TCP.
    s = Status::NotSupported("no UCX transport reaches the client");
    if (one_sided) {
      s = Worker::CreateSharing(rma_.get(), &rec->own);
      if (s.ok()) s = rec->own->SetAmHandlerHeld(kAmRequest, &UcxServerImpl::OnRequest, this);
      if (s.ok()) s = rec->own->SetAmHandlerHeld(kUcxAmRead, &UcxServerImpl::OnRead, this);
      if (s.ok()) {
        s = rec->own->Connect(req.worker_address, &UcxServerImpl::OnError, rec.get(), &rec->ep);
      }
      rec->w = rec->own.get();
      if (!s.ok()) {
        rec->ep = nullptr;
        rec->own.reset();
        rec->w = nullptr;
      }
    }
    {
      MutexLock lock(&mu_);
      if (arena_.length == 0 || (rec->own != nullptr && rkey_ == nullptr)) {
        // The arena went while the worker was made (the DB closing).
        if (rec->own != nullptr) rec->w->Close(rec->ep);
        rec->ep = nullptr;
        rec->own.reset();
        rec->w = nullptr;
        s = Status::NotSupported("the arena is not mapped for UCX");
      }
      if ((!s.ok() || rec->ep == nullptr) && am_ != nullptr && req.reads_by_am) {
        s = am_->Connect(req.worker_address, &UcxServerImpl::OnError, rec.get(), &rec->ep);
        rec->w = am_.get();
        rec->by_am = true;
      }
      if (!s.ok()) {
        // No transport in common: NotSupported, and the client reads by GET.
        return s.ToString().find(ucs_status_string(UCS_ERR_UNREACHABLE)) != std::string::npos
                   ? Status::NotSupported("UCX", s.ToString())
                   : s;
      }
      if (!rec->by_am) a.rkey.assign(static_cast<const char*>(rkey_), rkey_len_);
      a.reads_by_am = rec->by_am;
      a.arena_addr = arena_.start;
      a.arena_len = arena_.length;
      while (rec->token == 0 || by_token_.count(rec->token) > 0) {
        rec->token = (static_cast<uint64_t>(random_()) << 32) | random_();
      }
      by_token_[rec->token] = rec.get();
      a.token = rec->token;
      a.lease_ttl_ms = lease_ttl_ms;
    }
    {
      // Puts one-sided only into a placed arena: into any other UCX emulates them with
      // messages this server's progress thread applies, which buys nothing over a TCP
      // PUT, and a shared (memfd) arena's cluster runs lost values that way over sm.
      // Never to a client read by active message: it reaches us over UCX's TCP, whose
      // emulation of ucp_put_nbx is answered from inside progress like a get's and
      // aborts this process (ucs_fatal) when the client dies mid-put; it puts by TCP.
      MutexLock serving(&serve_mu_);
      if (arena_db_ != nullptr && placing_->arena_placed_.load() && !rec->by_am) {
        a.put_ttl_ms = static_cast<uint64_t>(put_ttl_.count());
      }
    }
    a.worker_address = rec->w->address();
    a.EncodeTo(answer);
    clients_.fetch_add(1);
    if (rec->by_am) clients_by_am_.fetch_add(1);
    Worker* const wake = rec->own != nullptr ? rma_.get() : rec->w;
    *client = std::shared_ptr<void>(rec.release(), [](void* p) {
      auto* c = static_cast<Client*>(p);
      c->server->Release(c);
    });
    // The progress thread makes the new endpoint's wire-up progress (and takes a new
    // worker into those it progresses and sleeps on).
    wake->Signal();
    return Status::OK();
  }

  std::string StatsText() const override {
    return "ucx_clients: " + std::to_string(clients_.load()) +
           "\nucx_clients_released: " + std::to_string(released_.load()) +
           "\nucx_endpoint_errors: " + std::to_string(endpoint_errors_.load()) +
           "\nucx_lease_ops: " + std::to_string(lease_ops_.load()) +
           "\nucx_lease_ops_refused: " + std::to_string(lease_ops_refused_.load()) +
           "\nucx_arena_placed: " +
           std::to_string(placing_ != nullptr && placing_->arena_placed_.load()) +
           "\nucx_clients_by_am: " + std::to_string(clients_by_am_.load()) +
           "\nucx_am_reads: " + std::to_string(am_reads_.load()) +
           "\nucx_am_read_bytes: " + std::to_string(am_read_bytes_.load()) +
           "\nucx_am_reads_refused: " + std::to_string(am_reads_refused_.load()) +
           "\nucx_puts_served: " + std::to_string(puts_.load()) +
           "\nucx_put_bytes_served: " + std::to_string(put_bytes_.load()) +
           "\nucx_reservations: " + std::to_string(reservations_.load()) +
           "\nucx_reservations_quarantined: " + std::to_string(quarantined_.load()) +
           "\nucx_reservations_reclaimed: " + std::to_string(reclaimed_.load()) +
           "\nucx_commits_refused: " + std::to_string(commits_refused_.load()) + "\n";
  }

 private:
  class NoRegistrar final : public MemoryRegistrar {
   public:
    Status Register(void*, size_t, const char*) override { return Status::OK(); }
    void Unregister(void*, size_t) override {}
  };

  // Room a client reserved for a one-sided put, until it commits it or it expires.
  struct Held {
    std::string key;
    MemoryTier::Reservation room;
    Clock::time_point expires;
  };

  // A connected client: its endpoint, closed when the control connection drops it.
  struct Client {
    UcxServerImpl* server = nullptr;
    Worker* w = nullptr;  // own, or am_
    // Its worker on rma_'s context, when it reads one-sided: made before the client is
    // published in by_token_, taken out (under mu_) as it leaves it, and only then
    // destroyed, without the locks.
    std::unique_ptr<Worker> own;
    bool by_am = false;     // its reads are served by active message (w is am_)
    ucp_ep_h ep = nullptr;  // under mu_
    bool failed = false;    // under mu_
    uint64_t token = 0;
    LeaseOpFn serve;
    // Under serve_mu_: its reservations by id (ids never reused on a connection).
    std::map<uint64_t, Held> held;
    // Under serve_mu_: its reservations that expired uncommitted while it stayed
    // connected.  Their room is not given back until its connection closes: a late
    // ucp_put_nbx of this client may still land there, and must never land in room
    // since reused for another value.  Charged to it as the reservations were.
    std::vector<Held> quarantined;
    uint64_t next_id = 1;
  };

  // A client may hold this many reservations at once; more are refused with Busy.
  static constexpr size_t kMaxHeld = 1 << 16;

  // RESERVE (ucx.h): room for each value, answered with where it is.  False when the
  // request is undecodable.  REQUIRES: serve_mu_ held.
  bool ServeReserve(Client* c, std::string_view in, std::string* answer) REQUIRES(serve_mu_) {
    uint64_t n = 0;
    if (!GetVarint64(&in, &n) || n > wire::kMaxKeysPerRequest) return false;
    std::vector<std::pair<std::string_view, uint64_t> > wanted(n);
    for (auto& [key, size] : wanted) {
      if (!GetLengthPrefixed(&in, &key) || !GetVarint64(&in, &size)) return false;
    }
    if (!in.empty()) return false;
    // A client read by active message reaches us over UCX's TCP, where a one-sided put
    // is emulated from inside our progress and aborts this process if the client dies
    // mid-put (see Connect): it never gets room, whatever it sends.
    if (c->by_am || arena_db_ == nullptr || !placing_->arena_placed_.load()) {
      wire::PutBatchStatus(answer, Status::NotSupported("this server takes no one-sided puts"));
      return true;
    }
    uintptr_t base = 0, end = 0;
    {
      MutexLock lock(&mu_);
      base = arena_.start;
      end = arena_.start + arena_.length;
    }
    wire::PutBatchStatus(answer, Status::OK());
    const Clock::time_point expires = Clock::now() + put_ttl_;
    for (const auto& [key, size] : wanted) {
      Held h;
      Status s = c->held.size() + c->quarantined.size() >= kMaxHeld
                     ? Status::Busy("too many one-sided puts reserved and not committed")
                     : arena_db_->Reserve(Slice(key.data(), key.size()), size, &h.room);
      const uintptr_t at = s.ok() ? reinterpret_cast<uintptr_t>(h.room.data()) : 0;
      if (s.ok() && (at < base || at + size > end)) {
        // Not in the mapped arena (no client can reach it): the client puts it by TCP.
        s = Status::NotSupported("the room reserved is outside the mapped arena");
      }
      uint64_t id = 0;
      if (s.ok()) {
        id = c->next_id++;
        h.key.assign(key);
        h.expires = expires;
        c->held.emplace(id, std::move(h));
        reservations_.fetch_add(1);
      }
      PutFixed64(answer, static_cast<uint64_t>(s.ok() ? 0 : s.ErrorCode()));
      PutFixed64(answer, id);
      PutFixed64(answer, s.ok() ? at - base : 0);
    }
    return true;
  }

  // COMMIT (ucx.h): publishes the client's reservations it names, or gives them back.
  // REQUIRES: serve_mu_ held.
  bool ServeCommit(Client* c, std::string_view in, std::string* answer) REQUIRES(serve_mu_) {
    uint64_t n = 0;
    if (!GetVarint64(&in, &n) || n > wire::kMaxKeysPerRequest || in.size() != n * 9) return false;
    std::vector<int64_t> results(n, 0);
    std::vector<Held> taken;
    std::vector<size_t> taken_at;
    taken.reserve(n);
    for (size_t i = 0; i < n; i++) {
      const uint64_t id = DecodeFixed64(in.data() + i * 9);
      const bool publish = in[i * 9 + 8] != 0;
      auto it = c->held.find(id);
      if (it != c->held.end() && it->second.expires <= Clock::now()) {
        // Expired, not yet reaped: refused, and its room quarantined as ReapExpired does.
        c->quarantined.push_back(std::move(it->second));
        c->held.erase(it);
        reservations_.fetch_sub(1);
        quarantined_.fetch_add(1);
        it = c->held.end();
      }
      if (it == c->held.end()) {
        results[i] = Status::Aborted("").ErrorCode();
        commits_refused_.fetch_add(1);
        continue;
      }
      if (publish) {
        taken.push_back(std::move(it->second));
        taken_at.push_back(i);
      }
      c->held.erase(it);  // given back, unless taken
      reservations_.fetch_sub(1);
    }
    if (!taken.empty()) {
      std::vector<Slice> keys;
      std::vector<MemoryTier::Reservation*> slots;
      uint64_t bytes = 0;
      for (Held& h : taken) {
        keys.emplace_back(h.key);
        slots.push_back(&h.room);
        bytes += h.room.size();
      }
      std::vector<int64_t> published;
      arena_db_->Commit(keys, slots, &published);
      for (size_t j = 0; j < taken.size(); j++) {
        results[taken_at[j]] = published[j];
        if (published[j] >= 0) puts_.fetch_add(1);
      }
      put_bytes_.fetch_add(bytes);
    }
    wire::PutBatchStatus(answer, Status::OK());
    for (int64_t r : results) PutFixed64(answer, static_cast<uint64_t>(r));
    return true;  // `taken` goes: rooms not consumed are given back
  }

  // Ends the reservations past their time to live: a COMMIT of one is refused from
  // now.  Their room is quarantined with their client (Client::quarantined), every
  // client here being connected still, and given back when its connection closes.
  void ReapExpired() {
    if (reservations_.load() == 0) return;
    size_t expired = 0;
    MutexLock serving(&serve_mu_);
    const Clock::time_point now = Clock::now();
    {
      MutexLock lock(&mu_);
      for (auto& [token, c] : by_token_) {
        for (auto it = c->held.begin(); it != c->held.end();) {
          if (it->second.expires > now) {
            ++it;
            continue;
          }
          c->quarantined.push_back(std::move(it->second));
          it = c->held.erase(it);
          expired++;
        }
      }
    }
    reservations_.fetch_sub(expired);
    quarantined_.fetch_add(expired);
    if (expired > 0) {
      Log(LogLevel::kWarn, std::to_string(expired) +
                               " one-sided put reservation(s) expired uncommitted: room "
                               "quarantined until the client disconnects");
    }
  }

  // A lease op, or reads, received by active message, served after progress returns
  // (the handler runs inside it, where nothing may wait).
  struct LeaseOp {
    uint64_t token = 0, request_id = 0;
    uint8_t op = 0;
    std::string meta;
  };

  // The contexts' first workers.
  std::vector<Worker*> Workers() const {
    std::vector<Worker*> all;
    if (rma_ != nullptr) all.push_back(rma_.get());
    if (am_ != nullptr) all.push_back(am_.get());
    return all;
  }
  // Every worker: those and the clients'.
  std::vector<Worker*> AllWorkers() const REQUIRES(mu_) {
    std::vector<Worker*> all = Workers();
    for (const auto& [token, c] : by_token_) {
      if (c->own != nullptr) all.push_back(c->own.get());
    }
    return all;
  }

  // kAmRequest or kUcxAmRead (their header: see kAmRequest), queued for Serve or
  // ServeReads.  Under mu_.
  static bool Queue(const void* header, size_t header_length, void* data, size_t length,
                    const ucp_am_recv_param_t* param, std::vector<LeaseOp>* queue) {
    const char* h = static_cast<const char*>(header);
    if (header_length != kAmRequestHeader || h[0] != 1 ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      return false;
    }
    LeaseOp op;
    op.op = static_cast<uint8_t>(h[1]);
    op.token = DecodeFixed64(h + 2);
    op.request_id = DecodeFixed64(h + 10);
    op.meta.assign(static_cast<const char*>(data), length);
    queue->push_back(std::move(op));
    return true;
  }
  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxServerImpl*>(arg);
    if (!Queue(header, header_length, data, length, param, &self->queued_)) {
      self->lease_ops_refused_.fetch_add(1);
    }
    return UCS_OK;
  }
  static ucs_status_t OnRead(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxServerImpl*>(arg);
    if (length % 16 != 0 || length / 16 > kUcxMaxAmReads ||
        !Queue(header, header_length, data, length, param, &self->reads_queued_)) {
      self->am_reads_refused_.fetch_add(1);
    }
    return UCS_OK;
  }

  // Serves the queued lease ops of clients still connected and sends their answers; an
  // op naming no client (a token never handed out, or one whose connection closed) is
  // dropped, counted.  Release waits on serve_mu_ while an op of its client is served.
  void Serve(std::vector<LeaseOp>* ops) {
    MutexLock serving(&serve_mu_);
    for (LeaseOp& op : *ops) {
      Client* client = nullptr;
      {
        MutexLock lock(&mu_);
        auto it = by_token_.find(op.token);
        if (it != by_token_.end() && !it->second->failed) client = it->second;
      }
      const bool put_op = op.op == wire::kReserve || op.op == wire::kCommit;
      if (client == nullptr || (!put_op && !client->serve)) {
        lease_ops_refused_.fetch_add(1);
        continue;
      }
      std::string answer;
      const bool served = op.op == wire::kReserve  ? ServeReserve(client, op.meta, &answer)
                          : op.op == wire::kCommit ? ServeCommit(client, op.meta, &answer)
                                                   : client->serve(op.op, op.meta, &answer);
      lease_ops_.fetch_add(1);
      if (op.request_id == 0) continue;  // sent one way: no answer wanted
      if (!served) {
        answer.clear();
        wire::PutBatchStatus(&answer, Status::Corruption("undecodable lease op by active message"));
      }
      std::string header;
      PutFixed64(&header, op.request_id);
      MutexLock lock(&mu_);
      Client* c = by_token_.at(op.token);  // still there: Release waits for serve_mu_
      Status s = c->w->SendAm(c->ep, kAmAnswer, std::move(header), std::move(answer));
      if (!s.ok()) endpoint_errors_.fetch_add(1);
    }
  }

  // Sends each queued read's bytes from the arena to the client that asked, which must
  // still be connected; a read out of the arena is refused (status byte 1, no data).
  // The bytes are sent from where they lie: the lease the client holds on the value
  // keeps them there until its RELEASE, which it sends once every read's bytes came.
  void ServeReads(std::vector<LeaseOp>* ops) REQUIRES(mu_) {
    for (LeaseOp& op : *ops) {
      auto it = by_token_.find(op.token);
      if (it == by_token_.end() || it->second->failed) {
        am_reads_refused_.fetch_add(1);
        continue;
      }
      Client* c = it->second;
      const size_t n = op.meta.size() / 16;
      for (size_t i = 0; i < n; i++) {
        const uint64_t offset = DecodeFixed64(op.meta.data() + 16 * i);
        const uint64_t length = DecodeFixed64(op.meta.data() + 16 * i + 8);
        const bool inside = offset <= arena_.length && length <= arena_.length - offset;
        std::string header;
        PutFixed64(&header, op.request_id);
        PutFixed32(&header, static_cast<uint32_t>(i));
        header.push_back(inside ? 0 : 1);
        const char* bytes = reinterpret_cast<const char*>(arena_.start) + (inside ? offset : 0);
        Status s =
            c->w->SendAmFrom(c->ep, kUcxAmReadData, std::move(header), bytes, inside ? length : 0);
        if (!s.ok()) {
          endpoint_errors_.fetch_add(1);
          break;
        }
        if (!inside) {
          am_reads_refused_.fetch_add(1);
          continue;
        }
        am_reads_.fetch_add(1);
        am_read_bytes_.fetch_add(length);
      }
    }
  }

  static void OnError(void* arg, ucp_ep_h, ucs_status_t) {
    auto* c = static_cast<Client*>(arg);  // under mu_ (inside progress)
    c->failed = true;
    c->server->endpoint_errors_.fetch_add(1);
  }

  void Release(Client* c) {
    // Its own worker, taken out under the locks and destroyed after them: no other
    // thread reaches it once its token is gone (the progress thread finds workers, and
    // Serve clients, by token, under mu_), and destroying one takes milliseconds.
    std::unique_ptr<Worker> own;
    ucp_ep_h own_ep = nullptr;
    {
      MutexLock serving(&serve_mu_);
      {
        MutexLock lock(&mu_);
        by_token_.erase(c->token);
        if (c->own != nullptr) {
          own = std::move(c->own);
          own_ep = c->ep;
        } else if (c->ep != nullptr) {
          c->w->Close(c->ep);
        }
        c->ep = nullptr;
      }
      // Its reservations never committed (the client died or dropped the connection
      // between RESERVE and COMMIT): their room goes back, and nothing was published.
      // The room of those that expired before is free of its late writes now too.
      reservations_.fetch_sub(c->held.size());
      quarantined_.fetch_sub(c->quarantined.size());
      reclaimed_.fetch_add(c->held.size() + c->quarantined.size());
      c->held.clear();
      c->quarantined.clear();
    }
    if (own_ep != nullptr) own->Close(own_ep);
    own.reset();  // with any FIFO slot the client left unfilled as it died
    if (c->by_am) clients_by_am_.fetch_sub(1);
    delete c;
    clients_.fetch_sub(1);
    released_.fetch_add(1);
  }

  // Serves lease ops and reads, and what needs the owner's side, asleep on the workers'
  // event descriptors whenever there is nothing to do.  Polling on after work lost on
  // this 2-core host with more runnable threads than cores: a thread that spun is the
  // last to run when the next LOOKUP comes (2 ms of polling: 1 MiB batches of 4 read at
  // 150-990 MB/s, LOOKUPs taking 1-34 ms; none: 5950 MB/s, and 64 KiB batches' P50 65 us
  // against 118).  Nor does it spin on a worker that stays busy with nothing to do (a
  // send waiting for room in a dead client's FIFO, a FIFO slot a killed client never
  // wrote): it would hold mu_ from UCX_CONNECT and from connections closing, a lock
  // that a thread taking it again at once keeps from the others.
  void Run() {
    std::vector<LeaseOp> ops, reads;
    std::vector<pollfd> pfds;
    Clock::time_point next_reap = Clock::now(), last_work = Clock::now();
    int busy_idle = 0;  // passes in a row that found a worker busy and did nothing
    while (!stop_.load()) {
      if (Clock::now() >= next_reap) {
        ReapExpired();
        next_reap = Clock::now() + kReapEvery;
      }
      bool worked = false;
      {
        MutexLock lock(&mu_);
        const std::vector<Worker*> workers = AllWorkers();
        // Bounded, so that the lock is let go now and then however busy the workers.
        for (int pass = 0; pass < kProgressPasses; pass++) {
          bool more = false;
          for (Worker* w : workers) more |= ucp_worker_progress(w->worker()) != 0;
          if (!more) break;
          worked = true;
        }
        ops.swap(queued_);
        reads.swap(reads_queued_);
        worked |= !ops.empty() || !reads.empty();
        ServeReads(&reads);
        reads.clear();
      }
      if (!ops.empty()) {
        Serve(&ops);
        ops.clear();
      }
      const Clock::time_point now = Clock::now();
      if (worked) {  // the answers sent may have brought more
        last_work = now;
        busy_idle = 0;
        continue;
      }
      bool busy = false;
      pfds.clear();
      {
        MutexLock lock(&mu_);
        busy = !queued_.empty() || !reads_queued_.empty();
        // Every worker is armed, a busy one not stopping the rest: each then wakes us.
        for (Worker* w : AllWorkers()) {
          if (ucp_worker_arm(w->worker()) == UCS_ERR_BUSY) busy = true;
          pfds.push_back({w->efd(), POLLIN, 0});
        }
      }
      if (busy && (++busy_idle <= 2 || now - last_work < Worker::kSpinBeforeSleep)) continue;
      // Still busy with nothing done: a pause with the lock free, on the descriptors of
      // the workers that could be armed.  Otherwise asleep until an event, or the next
      // reaping.
      poll(pfds.data(), pfds.size(), busy ? 1 : 100);
    }
  }

  void Log(LogLevel level, const std::string& line) {
    if (log_) log_(level, line);
  }

  std::function<void(LogLevel, const std::string&)> log_;
  Mutex mu_;  // every call on the workers, their endpoints; after serve_mu_
  std::unique_ptr<Worker> rma_, am_;
  MrTable maps_;
  std::shared_ptr<MemoryRegistrar> registrar_;
  MapRegistrar* placing_ = nullptr;  // registrar_, when UCX is served
  MrTable::Region arena_ GUARDED_BY(mu_);
  void* rkey_ GUARDED_BY(mu_) = nullptr;
  size_t rkey_len_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Client*> by_token_ GUARDED_BY(mu_);
  std::vector<LeaseOp> queued_ GUARDED_BY(mu_);
  std::vector<LeaseOp> reads_queued_ GUARDED_BY(mu_);
  std::mt19937 random_ GUARDED_BY(mu_){std::random_device{}()};
  Mutex serve_mu_;  // held while lease ops are served; before mu_
  SharedArena* arena_db_ GUARDED_BY(serve_mu_) = nullptr;  // takes one-sided puts when set
  const std::chrono::milliseconds put_ttl_{PutTtlMs()};
  static constexpr std::chrono::milliseconds kReapEvery{50};
  static constexpr int kProgressPasses = 64;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  std::atomic<uint64_t> clients_{0}, released_{0}, endpoint_errors_{0}, lease_ops_{0},
      lease_ops_refused_{0}, clients_by_am_{0}, am_reads_{0}, am_read_bytes_{0},
      am_reads_refused_{0}, puts_{0}, put_bytes_{0}, reservations_{0}, quarantined_{0},
      reclaimed_{0}, commits_refused_{0};
  static uint64_t PutTtlMs() {
    const char* e = std::getenv("KVENGINE_UCX_PUT_TTL_MS");
    const uint64_t v = e != nullptr ? std::strtoull(e, nullptr, 10) : 0;
    return v > 0 ? v : 10000;
  }
};

// ---------------------------------------------------------------- the client
// One peer reached over UCP: an endpoint and the peer's arena's rkey, and the control
// connection that set them up.  Dropped (closed) when the last batch using it lets go.
//
// The control connection is the client's own (TcpTransport::OwnConnection), kept open
// and idle for as long as the endpoint: the owner keeps the client's record exactly as
// long (closing it releases the record there), and it tells the client at once when
// the owner's process is gone, whatever the UCX transport: the kernel closes a dead
// process's sockets, so the connection reads end-of-file or a reset.  UCX itself cannot
// tell over its shared-memory transports (no peer-failure handling in 1.13 by default:
// a request to a dead owner waits for its timeout), and a connection to an owner that
// restarted at the same address would fail its next request only then.
struct UcxPeer {
  std::shared_ptr<Worker> w;
  ucp_ep_h ep = nullptr;      // under w->mu(); null once closed
  ucp_rkey_h rkey = nullptr;  // under w->mu()
  uint64_t arena_addr = 0, arena_len = 0;
  uint64_t token = 0;                      // names us in lease ops by active message; 0: over TCP
  std::chrono::milliseconds lease_ttl{0};  // 0: every lease is asked about
  std::chrono::milliseconds put_ttl{0};    // 0: the peer takes no one-sided puts
  bool failed = false;                     // under w->mu(): the endpoint reported an error
  std::string error;
  bool by_am = false;  // reads by the owner's active messages (no rkey): ReadByAm
  std::shared_ptr<TcpConnection> control;  // released after the endpoint is closed
  int control_fd = -1;

  ~UcxPeer() {
    MutexLock lock(w->mu());
    Close();
  }
  // Whether the owner is gone: its endpoint failed, or it closed the control connection.
  bool Gone() {
    {
      MutexLock lock(w->mu());
      if (failed) return true;
    }
    if (control == nullptr || !TcpTransport::ClosedByPeer(control.get())) return false;
    MutexLock lock(w->mu());
    Lost();
    return true;
  }
  // The control connection closed: the owner exited or was killed.  REQUIRES: w->mu().
  void Lost() {
    if (failed) return;
    failed = true;
    error = "the owner closed its control connection (it exited or was killed)";
  }
  // REQUIRES: w->mu() held.
  void Close() {
    if (rkey != nullptr) ucp_rkey_destroy(rkey);
    rkey = nullptr;
    if (ep != nullptr) w->Close(ep);
    ep = nullptr;
  }
  static void OnError(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* p = static_cast<UcxPeer*>(arg);
    p->failed = true;
    p->error = ucs_status_string(st);
  }
};

// A batch's reads in flight, counted down by their completions (inside progress, under
// the worker's mu).  Owned by the batch's caller, or -- when its reads could not be
// made to complete (a dead peer's, on an endpoint without peer-failure handling) -- by
// the worker, until it is destroyed, so that a late completion never writes freed
// memory.
struct InFlight {
  struct Slot {
    InFlight* batch = nullptr;
    ucs_status_t status = UCS_OK;
  };
  explicit InFlight(size_t n) : slots(n) {
    for (Slot& s : slots) s.batch = this;
  }
  size_t remaining = 0;
  std::vector<Slot> slots;
};

void OnOpDone(void* request, ucs_status_t st, void* user_data) {
  auto* slot = static_cast<InFlight::Slot*>(user_data);
  slot->status = st;
  slot->batch->remaining--;
  ucp_request_free(request);
}

class UcxTransport final : public TcpTransport {
 public:
  UcxTransport(const TransportOptions& options, std::unique_ptr<Worker> w, std::string tls)
      : TcpTransport(options),
        tls_(std::move(tls)),
        cuda_memory_(w->cuda_memory()),
        w_(std::move(w)) {
    registrar_ = std::make_shared<Registrar>(this);
    Log(LogLevel::kInfo, cuda_memory_ ? "UCX maps device (CUDA) memory: device buffers can be "
                                        "read into directly"
                                      : "UCX has no CUDA memory type (built without CUDA): "
                                        "device buffers go through the GPU staging path");
  }
  ~UcxTransport() override {
    {
      MutexLock lock(&peers_mu_);
      peers_.clear();  // closes the endpoints while their workers live
    }
    MutexLock lock(&bounce_mu_);
    if (bounce_ != nullptr) UnregisterMemory(bounce_->base, bounce_->size);
    bounce_.reset();
  }

  const char* Name() const override { return "ucx"; }
  Status RegisterMemory(void* addr, size_t length, const char* what) override {
    MutexLock lock(&w_mu_);
    Status s = mapped_.Add(addr, length, what);
    if (!s.ok()) return s;
    s = w_->MapRegion(addr, length);
    if (!s.ok()) {
      mapped_.Remove(addr);
      return Status::IOError(std::string("mapping ") + what, s.message());
    }
    return Status::OK();
  }
  void UnregisterMemory(void* addr, size_t) override {
    MutexLock lock(&w_mu_);
    if (mapped_.Remove(addr) > 0) w_->UnmapRegion(addr);
  }
  std::shared_ptr<MemoryRegistrar> registrar() override { return registrar_; }

  std::string StatsText() const override {
    return "ucx_gets: " + std::to_string(gets_.load()) +
           "\nucx_get_bytes: " + std::to_string(get_bytes_.load()) +
           "\nucx_direct_ops: " + std::to_string(direct_ops_.load()) +
           "\nucx_direct_bytes: " + std::to_string(direct_bytes_.load()) +
           "\nucx_bounce_ops: " + std::to_string(bounce_ops_.load()) +
           "\nucx_bounce_bytes: " + std::to_string(bounce_bytes_.load()) +
           "\nucx_puts: " + std::to_string(puts_.load()) +
           "\nucx_put_bytes: " + std::to_string(put_bytes_.load()) +
           "\nucx_tcp_put_keys: " + std::to_string(tcp_put_keys_.load()) +
           "\nucx_late_puts: " + std::to_string(late_puts_.load()) +
           "\nucx_stale_peer_retries: " + std::to_string(stale_retries_.load()) +
           "\nucx_peers_gone: " + std::to_string(stale_peers_.load()) +
           "\nucx_tcp_batches: " + std::to_string(tcp_batches_.load()) +
           "\nucx_connects: " + std::to_string(connects_.load()) +
           "\nucx_abandoned_batches: " + std::to_string(abandoned_.load()) +
           "\nucx_workers_replaced: " + std::to_string(replaced_.load()) +
           "\nucx_lease_calls: " + std::to_string(am_calls_.load()) +
           "\nucx_releases_by_age: " + std::to_string(releases_by_age_.load()) +
           "\nucx_reads_by_am: " + std::to_string(am_reads_.load()) +
           "\nucx_cuda_memory: " + std::to_string(cuda_memory_) + "\n";
  }

  // Puts go one-sidedly into room the owner reserved (PutOneSided), where the owner
  // takes them: it serves UCX to this client (a tenant bound to namespaces is refused
  // UCX, so its puts go by TCP) and answers with a put time to live.  Keys that path
  // cannot take go by TCP PUT.
  Status BatchPut(const Endpoint& peer, std::span<const Slice> keys,
                  std::span<const ValueParts> values, std::vector<int64_t>* results) override {
    std::shared_ptr<UcxPeer> p;
    bool use_tcp = false;
    Status s = PeerFor(peer, &p, &use_tcp);
    if (!s.ok()) return FailAll(s, keys.size(), results);
    if (use_tcp || p->token == 0 || p->put_ttl.count() == 0) {
      // The connection is kept for the gets to come, even where the peer takes no
      // one-sided puts: should its owner restart meanwhile, PeerFor finds it gone
      // (UcxPeer::Gone) before it is used.
      tcp_put_keys_.fetch_add(keys.size());
      return TcpTransport::BatchPut(peer, keys, values, results);
    }
    results->assign(keys.size(), 0);
    std::vector<size_t> over_tcp;
    s = PutOneSided(p.get(), keys, values, results, &over_tcp);
    if (!s.ok()) {
      Drop(peer, p);
      Log(LogLevel::kWarn, "one-sided puts to " + peer.ToString() + " failed (" + s.ToString() +
                               "): " + std::to_string(over_tcp.size()) + " key(s) go by TCP");
    }
    if (over_tcp.empty()) return Status::OK();
    tcp_put_keys_.fetch_add(over_tcp.size());
    std::vector<Slice> k;
    std::vector<ValueParts> v;
    for (size_t i : over_tcp) {
      k.push_back(keys[i]);
      v.push_back(values[i]);
    }
    std::vector<int64_t> r;
    s = TcpTransport::BatchPut(peer, k, v, &r);
    if (!s.ok()) return FailAll(s, keys.size(), results);
    for (size_t j = 0; j < over_tcp.size(); j++) (*results)[over_tcp[j]] = r[j];
    return Status::OK();
  }

  // One-sided reads are not pipelined over TCP frames: a started get runs at once
  // (the default), through BatchGet below.
  std::unique_ptr<PendingGet> StartBatchGet(const Endpoint& peer, std::span<const Slice> keys,
                                            std::span<const Destination> dests,
                                            std::vector<int64_t>* results) override {
    return Transport::StartBatchGet(peer, keys, dests, results);
  }
  // Grouped ones (a layer-wise load's layers for this peer) are read group by group,
  // each through BatchGet (not GET_GROUPS), on a thread of their own: the call returns
  // at once, so the load's other members are read meanwhile and layer g is reported
  // while layer g+1 is on its way.
  void StartBatchGetGroups(const Endpoint& peer, std::span<const GetGroup> groups,
                           std::vector<std::unique_ptr<PendingGet> >* calls) override {
    StartGroupsInTurnOnAThread(this, peer, groups, calls);
  }

  Status BatchGet(const Endpoint& peer, std::span<const Slice> keys,
                  std::span<const Destination> dests, std::vector<int64_t>* results) override {
    // A peer connected earlier may be gone since (its owner restarted at the same
    // address): a batch that breaks on such a peer is read once more over a fresh
    // connection.  Reads are idempotent; a dead owner fails the new connect at once.
    for (int attempt = 0;; attempt++) {
      std::shared_ptr<UcxPeer> p;
      bool use_tcp = false, fresh = false;
      Status s = PeerFor(peer, &p, &use_tcp, &fresh);
      if (!s.ok()) return FailAll(s, keys.size(), results);
      if (use_tcp) {
        tcp_batches_.fetch_add(1);
        return TcpTransport::BatchGet(peer, keys, dests, results);
      }
      Remote remote(this, peer, p.get());
      ValidatedReader reader(&remote);
      s = reader.BatchGet(keys, dests, results);
      if (!s.ok() || remote.broken) Drop(peer, p);
      if (remote.broken && !fresh && attempt == 0) {
        stale_retries_.fetch_add(1);
        continue;
      }
      if (!s.ok()) return s;
      GetUnpinnedOverTcp(this, peer, keys, dests, results);
      return Status::OK();
    }
  }

 private:
  class Registrar final : public MemoryRegistrar {
   public:
    explicit Registrar(UcxTransport* t) : t_(t) {}
    Status Register(void* addr, size_t length, const char* what) override {
      return t_->RegisterMemory(addr, length, what);
    }
    void Unregister(void* addr, size_t length) override { t_->UnregisterMemory(addr, length); }

   private:
    UcxTransport* const t_;
  };

  class Remote final : public RemoteMemory {
   public:
    Remote(UcxTransport* t, const Endpoint& peer, UcxPeer* p) : t_(t), peer_(peer), p_(p) {}
    Status Lookup(std::span<const Slice> keys, std::vector<int64_t>* results,
                  std::vector<RemoteLocation>* locations) override {
      if (p_->token == 0) return CallLookup(t_, peer_, keys, p_->arena_len, results, locations);
      std::string meta, answer;
      EncodeLookupRequest(keys, &meta);
      lookup_sent_ = Clock::now();
      Status s = Call(wire::kLookup, std::move(meta), &answer);
      if (!s.ok()) return s;
      return DecodeLookupAnswer(answer, keys.size(), p_->arena_len, results, locations);
    }
    Status Release(std::span<const uint64_t> leases, std::vector<uint8_t>* held) override {
      if (p_->token == 0) return CallRelease(t_, peer_, leases, held);
      std::string meta, answer;
      EncodeReleaseRequest(leases, &meta);
      // The server granted the leases after we sent the LOOKUP and keeps each for its
      // time to live: reads that all completed within half of it from then were covered
      // (the other half is the margin for two hosts' clocks and a late grant).
      if (p_->lease_ttl.count() > 0 && read_done_ - lookup_sent_ < p_->lease_ttl / 2) {
        Status s = t_->AmSend(p_, wire::kRelease, std::move(meta));
        if (!s.ok()) broken = true;
        held->assign(leases.size(), 1);
        t_->releases_by_age_.fetch_add(1);
        return Status::OK();
      }
      Status s = Call(wire::kRelease, std::move(meta), &answer);
      if (!s.ok()) return s;
      return DecodeReleaseAnswer(answer, leases.size(), held);
    }
    Status Read(std::span<RemoteRead> reads) override {
      Status s = t_->Read(p_, reads);
      read_done_ = Clock::now();
      if (!s.ok()) broken = true;
      return s;
    }
    bool broken = false;

   private:
    Status Call(uint8_t op, std::string meta, std::string* answer) {
      Status s = t_->AmCall(p_, op, std::move(meta), answer);
      if (!s.ok()) broken = true;
      return s;
    }

    UcxTransport* const t_;
    const Endpoint peer_;
    UcxPeer* const p_;
    Clock::time_point lookup_sent_{}, read_done_{};
  };

  // Progresses p's worker until done() (called under its mu) or the deadline, watching
  // p's control connection: when the owner closes it, p fails at once (UcxPeer::Lost)
  // instead of at the deadline.  False unless done().
  bool Progress(UcxPeer* p, const std::function<bool()>& done, Clock::time_point deadline) {
    bool lost = false;
    if (p->w->ProgressUntil(done, deadline, p->control_fd, &lost)) return true;
    if (lost) {
      MutexLock lock(p->w->mu());
      p->Lost();
    }
    return false;
  }

  // Sends lease op `op` one way (request id 0: the server answers nothing).
  Status AmSend(UcxPeer* p, uint8_t op, std::string meta) {
    Worker* const w = p->w.get();
    MutexLock lock(w->mu());
    if (p->ep == nullptr || p->failed) return Status::IOError("UCX endpoint failed: " + p->error);
    return w->SendAm(p->ep, kAmRequest, AmRequestHeader(op, p->token, 0), std::move(meta));
  }

  // Sends lease op `op` to the peer's server by active message and progresses until its
  // answer came, the endpoint failed or the timeout passed.
  Status AmCall(UcxPeer* p, uint8_t op, std::string meta, std::string* answer) {
    Worker* const w = p->w.get();
    Worker::AmWait wait;
    uint64_t id = 0;
    {
      MutexLock lock(w->mu());
      if (p->ep == nullptr || p->failed) return Status::IOError("UCX endpoint failed: " + p->error);
      id = w->Await(&wait);
      Status s = w->SendAm(p->ep, kAmRequest, AmRequestHeader(op, p->token, id), std::move(meta));
      if (!s.ok()) {
        w->StopAwaiting(id);
        return s;
      }
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    Progress(
        p, [&] { return wait.done || p->failed; }, deadline);
    MutexLock lock(w->mu());
    w->StopAwaiting(id);
    if (wait.done) {
      *answer = std::move(wait.answer);
      am_calls_.fetch_add(1);
      return Status::OK();
    }
    return Status::IOError(p->failed ? "UCX endpoint failed: " + p->error
                                     : std::string("UCX lease op timed out"));
  }

  // One transfer of a batch: `length` bytes between `local` and the peer's arena at
  // `remote` (an offset in it), by ucp_get_nbx or ucp_put_nbx.
  struct Op {
    char* local = nullptr;
    uint64_t length = 0;
    uint64_t remote = 0;
    ucp_mem_h memh = nullptr;  // local's mapping, when it has one
    ucs_status_t status = UCS_OK;
  };

  // Posts every op at once (puts followed by a flush of the endpoint: a put is done
  // only once it is flushed, and a put's bytes must be in the owner's memory before
  // its COMMIT), then progresses until all completed.  On a failed endpoint or past
  // the timeout the endpoint is closed (its ops complete with an error) and every op
  // not done fails.  Ops that even so do not complete within kAbandonAfter (an endpoint
  // without peer-failure handling to a dead peer: UCX keeps them pending, and its
  // worker is stuck behind them) fail, the worker is replaced, and *abandoned is set:
  // their local memory may still be written (the caller must never reuse it).
  Status Transfer(UcxPeer* p, std::span<Op> ops, bool put, bool* abandoned) {
    Worker* const w = p->w.get();
    const size_t n = ops.size() + (put ? 1 : 0);
    auto batch = std::make_shared<InFlight>(n);
    InFlight* b = batch.get();
    Status failed;
    *abandoned = false;
    {
      MutexLock lock(w->mu());
      if (p->ep == nullptr || p->failed) {
        failed = Status::IOError("UCX endpoint failed: " + p->error);
      }
      for (size_t i = 0; i < n && failed.ok(); i++) {
        ucp_request_param_t param;
        std::memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.send = OnOpDone;
        param.user_data = &b->slots[i];
        const char* what = "ucp_ep_flush_nbx";
        ucs_status_ptr_t req;
        if (i == ops.size()) {
          req = ucp_ep_flush_nbx(p->ep, &param);
        } else {
          Op& op = ops[i];
          if (op.length == 0) continue;
          if (op.memh != nullptr) {
            param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            param.memh = op.memh;
          }
          const uint64_t at = p->arena_addr + op.remote;
          what = put ? "ucp_put_nbx" : "ucp_get_nbx";
          req = put ? ucp_put_nbx(p->ep, op.local, op.length, at, p->rkey, &param)
                    : ucp_get_nbx(p->ep, op.local, op.length, at, p->rkey, &param);
        }
        if (req == nullptr) continue;  // done at once
        if (UCS_PTR_IS_ERR(req)) {
          b->slots[i].status = UCS_PTR_STATUS(req);
          failed = UcsError(what, UCS_PTR_STATUS(req));
          continue;
        }
        b->remaining++;
      }
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    bool done = Progress(
        p, [&] { return b->remaining == 0 || p->failed; }, deadline);
    if (!done || p->failed) {
      {
        MutexLock lock(w->mu());
        if (failed.ok()) {
          failed = Status::IOError(p->failed ? "UCX endpoint failed: " + p->error
                                             : std::string("UCX transfers timed out"));
        }
        p->Close();  // completes what is in flight, with an error, where UCX can
      }
      done = w->ProgressUntil([&] { return b->remaining == 0; }, Clock::now() + kAbandonAfter);
      if (!done) {
        MutexLock lock(w->mu());
        *abandoned = b->remaining > 0;
        if (*abandoned) w->Keep(batch);
      }
    }
    for (size_t i = 0; i < ops.size(); i++) {
      ops[i].status = b->slots[i].status;
      if (put && b->slots[ops.size()].status != UCS_OK) ops[i].status = b->slots[ops.size()].status;
      if (!failed.ok() && ops[i].status == UCS_OK) ops[i].status = UCS_ERR_CANCELED;
    }
    if (*abandoned) {
      abandoned_.fetch_add(1);
      Replace(p->w);
    }
    return failed;
  }

  // Asks the owner for every read in one active message (kUcxAmRead; a batch over
  // kUcxMaxAmReads in several), and progresses until each read's bytes came
  // (kUcxAmReadData, copied into place from inside progress), the endpoint failed or the
  // timeout passed: then every read not done fails.  Once the wait is withdrawn a late
  // answer is dropped, never written.
  Status ReadByAm(UcxPeer* p, std::span<RemoteRead> reads) {
    if (reads.size() > kUcxMaxAmReads) {
      Status a = ReadByAm(p, reads.first(kUcxMaxAmReads));
      Status b = ReadByAm(p, reads.subspan(kUcxMaxAmReads));
      return a.ok() ? b : a;
    }
    Worker* const w = p->w.get();
    Worker::ReadWait wait(reads);
    std::string asked;
    uint64_t bytes = 0;
    for (const RemoteRead& r : reads) {
      PutFixed64(&asked, r.remote_offset);
      PutFixed64(&asked, r.length);
      bytes += r.length;
    }
    Status failed;
    uint64_t id = 0;
    {
      MutexLock lock(w->mu());
      if (p->ep == nullptr || p->failed) {
        failed = Status::IOError("UCX endpoint failed: " + p->error);
      } else {
        id = w->AwaitReads(&wait);
        failed = w->SendAm(p->ep, kUcxAmRead, AmRequestHeader(0, p->token, id), std::move(asked));
      }
    }
    if (failed.ok()) {
      const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
      Progress(
          p, [&] { return wait.remaining == 0 || p->failed; }, deadline);
    }
    {
      MutexLock lock(w->mu());
      if (id != 0) w->StopAwaitingReads(id);
      if (failed.ok() && wait.remaining > 0) {
        failed = Status::IOError(p->failed ? "UCX endpoint failed: " + p->error
                                           : std::string("UCX reads by active message timed out"));
      }
    }
    // A batch cut short fails whole: without its RELEASE, even the bytes that came are
    // not known to be the values asked for.
    for (size_t i = 0; i < reads.size() && !failed.ok(); i++) {
      if (reads[i].status.ok()) reads[i].status = failed;
    }
    gets_.fetch_add(reads.size());
    get_bytes_.fetch_add(bytes);
    am_reads_.fetch_add(reads.size());
    return failed;
  }

  // The transport's bounce buffer: registered memory that transfers from and into
  // memory the caller did not register go through, a round of kBounceBytes at a time.
  // One batch uses it at a time (bounce_mu_).  Made and registered at first use; one
  // whose transfers were abandoned (still writable by a dead peer's late completions)
  // is left to its old worker and a fresh one made.
  struct Bounce {
    explicit Bounce(size_t n) : size(n) {
      void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      base = m == MAP_FAILED ? nullptr : static_cast<char*>(m);
    }
    ~Bounce() {
      if (base != nullptr) munmap(base, size);
    }
    char* base = nullptr;
    const size_t size;
  };

  // The bounce buffer, made and registered when there is none.  REQUIRES: bounce_mu_.
  Status BounceBuffer(Bounce** out) REQUIRES(bounce_mu_) {
    if (bounce_ == nullptr) {
      auto b = std::make_shared<Bounce>(kBounceBytes);
      if (b->base == nullptr) return Status::IOError("no memory for the UCX bounce buffer");
      Status s = RegisterMemory(b->base, b->size, "UCX bounce buffer");
      if (!s.ok()) return s;
      bounce_ = std::move(b);
    }
    *out = bounce_.get();
    return Status::OK();
  }
  // Leaves the bounce buffer to the worker its transfers were abandoned on (which maps
  // it until it is destroyed).  REQUIRES: bounce_mu_.
  void RetireBounce(const std::shared_ptr<Worker>& old) REQUIRES(bounce_mu_) {
    if (bounce_ == nullptr) return;
    UnregisterMemory(bounce_->base, bounce_->size);  // from the fresh worker
    MutexLock lock(old->mu());
    old->Keep(std::move(bounce_));
  }

  // A piece of a transfer that goes through the bounce buffer: `length` bytes at `at`
  // of the caller's memory, op `index` of the caller's list.
  struct Piece {
    size_t index = 0;
    char* at = nullptr;
    uint64_t length = 0;
    uint64_t remote = 0;
  };

  // Runs `direct` (ops on registered memory) and `pieces` (on memory that is not: each
  // piece of at most kBounceBytes) in rounds through the bounce buffer: a put's bytes
  // are copied into it before the round, a get's out of it after.  (*status)[index]
  // of each piece is its first failure.  Counted: direct and bounced ops and bytes.
  Status TransferAll(UcxPeer* p, std::vector<Op> direct, const std::vector<Piece>& pieces, bool put,
                     std::vector<ucs_status_t>* status) {
    for (const Op& op : direct) direct_bytes_.fetch_add(op.length);
    Status failed;
    bool abandoned = false;
    if (pieces.empty()) {
      failed = Transfer(p, direct, put, &abandoned);
      for (size_t i = 0; i < direct.size(); i++) (*status)[i] = direct[i].status;
      return failed;
    }
    MutexLock lock(&bounce_mu_);
    Bounce* bounce = nullptr;
    failed = BounceBuffer(&bounce);
    size_t next = 0;
    std::vector<Op> round = std::move(direct);
    const size_t n_direct = round.size();
    bool first = true;
    while (failed.ok() && (first || next < pieces.size())) {
      const size_t round_start = next;
      uint64_t used = 0;
      std::vector<Op> ops;
      if (first) ops = std::move(round);
      ucp_mem_h memh = nullptr;
      {
        MutexLock wl(p->w->mu());
        memh = p->w->FindRegion(bounce->base, bounce->size);
      }
      for (; next < pieces.size() && used + pieces[next].length <= bounce->size; next++) {
        const Piece& pc = pieces[next];
        Op op;
        op.local = bounce->base + used;
        op.length = pc.length;
        op.remote = pc.remote;
        op.memh = memh;
        if (put && pc.length > 0) std::memcpy(op.local, pc.at, pc.length);
        used += pc.length;
        ops.push_back(op);
      }
      failed = Transfer(p, ops, put, &abandoned);
      const size_t skip = first ? n_direct : 0;
      for (size_t i = 0; i < skip; i++) (*status)[i] = ops[i].status;
      for (size_t j = round_start; j < next; j++) {
        const Op& op = ops[skip + j - round_start];
        const Piece& pc = pieces[j];
        if ((*status)[pc.index] == UCS_OK) (*status)[pc.index] = op.status;
        if (!put && op.status == UCS_OK && pc.length > 0) std::memcpy(pc.at, op.local, pc.length);
        bounce_bytes_.fetch_add(pc.length);
      }
      first = false;
      if (abandoned) RetireBounce(p->w);
    }
    for (size_t j = next; j < pieces.size(); j++) {
      if ((*status)[pieces[j].index] == UCS_OK) (*status)[pieces[j].index] = UCS_ERR_CANCELED;
    }
    if (first) {  // no round ran (no bounce buffer): the direct ops were never posted
      for (size_t i = 0; i < n_direct; i++) (*status)[i] = UCS_ERR_NO_MEMORY;
    }
    return failed;
  }

  // Cuts [at, at+length) -> remote into pieces of at most kBounceBytes.
  static void AddPieces(size_t index, char* at, uint64_t length, uint64_t remote,
                        std::vector<Piece>* pieces) {
    uint64_t done = 0;
    do {
      const uint64_t n = std::min<uint64_t>(length - done, kBounceBytes);
      pieces->push_back({index, at + done, n, remote + done});
      done += n;
    } while (done < length);
  }

  // The reads of a batch (RemoteMemory::Read): by the owner's active messages from a
  // peer that serves them so (ReadByAm: copied into place, registered or not); else
  // one-sided, into registered memory directly, into any other through the bounce buffer.
  Status Read(UcxPeer* p, std::span<RemoteRead> reads) {
    if (p->by_am) return ReadByAm(p, reads);
    std::vector<Op> direct;
    std::vector<Piece> pieces;
    std::vector<size_t> direct_of;  // direct[k] serves reads[direct_of[k]]
    std::vector<bool> is_direct(reads.size(), false);
    uint64_t bytes = 0, bounced = 0;
    {
      MutexLock lock(p->w->mu());
      for (size_t i = 0; i < reads.size(); i++) {
        RemoteRead& r = reads[i];
        bytes += r.length;
        if (ucp_mem_h memh = p->w->FindRegion(r.local, r.length); memh != nullptr) {
          direct.push_back({r.local, r.length, r.remote_offset, memh});
          direct_of.push_back(i);
          is_direct[i] = true;
        } else {
          bounced++;
        }
      }
    }
    // Pieces name their read by its index in `reads`, after the direct ops' statuses.
    std::vector<ucs_status_t> status(direct.size() + reads.size(), UCS_OK);
    for (size_t i = 0; i < reads.size(); i++) {
      RemoteRead& r = reads[i];
      if (is_direct[i]) continue;
      AddPieces(direct.size() + i, r.local, r.length, r.remote_offset, &pieces);
    }
    const size_t n_direct = direct.size();
    direct_ops_.fetch_add(n_direct);
    bounce_ops_.fetch_add(bounced);
    Status failed = TransferAll(p, std::move(direct), pieces, false, &status);
    for (size_t k = 0; k < n_direct; k++) status[n_direct + direct_of[k]] = status[k];
    for (size_t i = 0; i < reads.size(); i++) {
      const ucs_status_t st = status[n_direct + i];
      if (st != UCS_OK) reads[i].status = UcsError("ucp_get_nbx", st);
      if (!failed.ok() && reads[i].status.ok()) reads[i].status = failed;
    }
    gets_.fetch_add(reads.size());
    get_bytes_.fetch_add(bytes);
    return failed;
  }

  // A batch of puts written one-sidedly: RESERVE, the bytes by ucp_put_nbx (through
  // the bounce buffer from memory the caller did not register), flush, COMMIT.  The
  // keys this path could not take (the owner answered NotSupported for them, or UCX
  // failed before their COMMIT was answered) are left in *over_tcp for a TCP PUT;
  // every other key's result is in (*results)[i].
  Status PutOneSided(UcxPeer* p, std::span<const Slice> keys, std::span<const ValueParts> values,
                     std::vector<int64_t>* results, std::vector<size_t>* over_tcp) {
    std::vector<uint64_t> sizes(keys.size(), 0);
    for (size_t i = 0; i < keys.size(); i++) {
      for (const Slice& part : values[i]) sizes[i] += part.size();
    }
    std::string meta, answer;
    EncodeUcxReserveRequest(keys, sizes, &meta);
    const Clock::time_point sent = Clock::now();
    std::vector<UcxReserved> room;
    Status s = AmCall(p, wire::kReserve, std::move(meta), &answer);
    if (s.ok()) s = DecodeUcxReserveAnswer(answer, keys.size(), &room);
    if (!s.ok()) {
      for (size_t i = 0; i < keys.size(); i++) over_tcp->push_back(i);
      return s;
    }
    // The bytes, of every key the owner made room for.
    std::vector<size_t> reserved;  // indexes of keys
    std::vector<Op> direct;
    std::vector<size_t> direct_key;  // direct[j] writes the key reserved[direct_key[j]]
    std::vector<Piece> pieces;
    uint64_t bounced = 0;
    {
      MutexLock lock(p->w->mu());
      for (size_t i = 0; i < keys.size(); i++) {
        if (room[i].result == Status::NotSupported("").ErrorCode()) {
          over_tcp->push_back(i);
          continue;
        }
        (*results)[i] = room[i].result;
        if (room[i].result < 0) continue;
        reserved.push_back(i);
        uint64_t off = room[i].offset;
        for (const Slice& part : values[i]) {
          if (part.empty()) continue;
          char* at = const_cast<char*>(part.data());  // only read: a put's source
          if (ucp_mem_h memh = p->w->FindRegion(at, part.size()); memh != nullptr) {
            direct.push_back({at, part.size(), off, memh});
            direct_key.push_back(reserved.size() - 1);
          } else {
            pieces.push_back({reserved.size() - 1, at, part.size(), off});
            bounced++;
          }
          off += part.size();
        }
      }
    }
    if (reserved.empty()) return Status::OK();
    // Split pieces to the bounce buffer's size; a piece's index names its key in
    // `reserved`, after the direct ops' statuses.
    std::vector<Piece> cut;
    const size_t n_direct = direct.size();
    for (const Piece& pc : pieces)
      AddPieces(n_direct + pc.index, pc.at, pc.length, pc.remote, &cut);
    std::vector<ucs_status_t> status(n_direct + reserved.size(), UCS_OK);
    direct_ops_.fetch_add(n_direct);
    bounce_ops_.fetch_add(bounced);
    s = TransferAll(p, std::move(direct), cut, true, &status);
    for (size_t j = 0; j < n_direct; j++) {
      if (status[n_direct + direct_key[j]] == UCS_OK) status[n_direct + direct_key[j]] = status[j];
    }
    // Publish only what was written whole, and while the reservation surely lives: its
    // owner keeps it put_ttl from granting it, after `sent`.
    const bool in_time = Clock::now() - sent < p->put_ttl / 2;
    if (!in_time) late_puts_.fetch_add(1);
    std::vector<uint64_t> ids;
    std::vector<uint8_t> publish;
    for (size_t k = 0; k < reserved.size(); k++) {
      ids.push_back(room[reserved[k]].id);
      publish.push_back(s.ok() && in_time && status[n_direct + k] == UCS_OK);
    }
    if (!s.ok()) {
      // The endpoint is gone, and the reservations with it when the owner notices; the
      // TCP PUT writes the values.
      for (size_t i : reserved) over_tcp->push_back(i);
      return s;
    }
    meta.clear();
    EncodeUcxCommitRequest(ids, publish, &meta);
    std::vector<int64_t> committed;
    s = AmCall(p, wire::kCommit, std::move(meta), &answer);
    if (s.ok()) s = DecodeUcxCommitAnswer(answer, ids.size(), &committed);
    for (size_t k = 0; k < reserved.size(); k++) {
      const size_t i = reserved[k];
      if (!s.ok() || !publish[k]) {
        over_tcp->push_back(i);  // an overwrite of the same bytes, if it was published
        continue;
      }
      (*results)[i] = committed[k];
      if (committed[k] >= 0) {
        puts_.fetch_add(1);
        put_bytes_.fetch_add(sizes[i]);
      }
    }
    return s;
  }

  // Puts a fresh worker (and context) in place of `old`, with every region mapped
  // again, and drops the peers reached through `old`; `old` lives on, unused, until the
  // transport goes (its abandoned reads may still complete into it).
  void Replace(const std::shared_ptr<Worker>& old) {
    {
      MutexLock lock(&w_mu_);
      if (w_ != old) return;  // another thread did it
      std::unique_ptr<Worker> fresh;
      Status s = Worker::Create(&fresh, tls_);
      for (const auto& [addr, length] : mapped_.All()) {
        if (s.ok()) s = fresh->MapRegion(addr, length);
      }
      if (!s.ok()) {
        Log(LogLevel::kWarn, "UCX worker not replaced: " + s.ToString());
        return;
      }
      retired_.push_back(std::move(w_));
      w_ = std::move(fresh);
    }
    replaced_.fetch_add(1);
    Log(LogLevel::kWarn, "UCX reads to a dead peer never completed: worker replaced");
    MutexLock lock(&peers_mu_);
    for (auto& [name, slot] : peers_) {
      if (slot.peer != nullptr && slot.peer->w == old) slot.peer.reset();
    }
  }

  // The peer's UCX state, connecting when there is none.  *use_tcp when the peer does
  // not serve UCX (an older or TCP-only server, or a tenant bound to namespaces): then
  // gets go by TCP, and UCX is asked again after kRetryUcxAfter.
  // *fresh (when given) is set when the connection was made by this call.
  Status PeerFor(const Endpoint& peer, std::shared_ptr<UcxPeer>* out, bool* use_tcp,
                 bool* fresh = nullptr) {
    const std::string name = peer.ToString();
    MutexLock lock(&peers_mu_);
    Slot& slot = peers_[name];
    if (slot.peer != nullptr) {
      if (!slot.peer->Gone()) {
        *out = slot.peer;
        return Status::OK();
      }
      // Its owner exited, or restarted at the same address: connect afresh now rather
      // than fail a request on the dead endpoint first.
      stale_peers_.fetch_add(1);
      Log(LogLevel::kInfo,
          "peer " + name + ": UCX connection gone (" + slot.peer->error + "); connecting again");
      slot.peer.reset();
    }
    if (Clock::now() < slot.tcp_until) {
      *use_tcp = true;
      return Status::OK();
    }
    if (Clock::now() < slot.connect_after) return slot.connect_error;
    auto p = std::make_shared<UcxPeer>();
    {
      MutexLock wl(&w_mu_);
      p->w = w_;
    }
    std::string meta;
    UcxConnectRequest{p->w->address()}.EncodeTo(&meta);
    MetaSink sink;
    Status s = OwnConnection(peer, &p->control);
    if (s.ok()) s = CallOn(p->control.get(), peer, wire::kUcxConnect, meta, {}, &sink);
    if (!s.ok()) {
      // As the TCP transport's pool does: a peer that cannot be reached is not tried
      // again by every request, but after a backoff that doubles.
      slot.backoff_ms = slot.backoff_ms == 0
                            ? options_.reconnect_backoff_min_ms
                            : std::min(slot.backoff_ms * 2, options_.reconnect_backoff_max_ms);
      slot.connect_after = Clock::now() + std::chrono::milliseconds(slot.backoff_ms);
      slot.connect_error = s;
      return s;
    }
    slot.backoff_ms = 0;
    p->control_fd = FdOf(*p->control);
    std::string_view in(sink.meta);
    Status batch;
    std::string_view theirs;
    if (!wire::GetBatchStatus(&in, &batch) || !GetLengthPrefixed(&in, &theirs)) {
      return Status::Corruption("peer " + name + ": malformed UCX connect answer");
    }
    if (batch.IsNotSupported() || batch.IsPermissionDenied()) {
      Log(LogLevel::kInfo, "peer " + name + " reads over TCP: " + batch.ToString());
      slot.tcp_until = Clock::now() + kRetryUcxAfter;
      *use_tcp = true;
      return Status::OK();
    }
    if (!batch.ok()) return batch;
    UcxConnectAnswer a;
    s = UcxConnectAnswer::DecodeFrom(theirs, &a);
    if (!s.ok()) return Status::Corruption("peer " + name, s.message());
    {
      MutexLock wl(p->w->mu());
      s = p->w->Connect(a.worker_address, &UcxPeer::OnError, p.get(), &p->ep);
      if (s.ok() && !a.reads_by_am) {
        const ucs_status_t st = ucp_ep_rkey_unpack(p->ep, a.rkey.data(), &p->rkey);
        if (st != UCS_OK) s = UcsError("ucp_ep_rkey_unpack", st);
      }
    }
    if (!s.ok() && s.ToString().find(ucs_status_string(UCS_ERR_UNREACHABLE)) != std::string::npos) {
      // No transport in common (the owner left TCP out, and we have only TCP).
      Log(LogLevel::kInfo, "peer " + name + " reads over TCP: " + s.ToString());
      slot.tcp_until = Clock::now() + kRetryUcxAfter;
      *use_tcp = true;
      return Status::OK();
    }
    if (!s.ok()) return Status::IOError("peer " + name, s.message());
    p->arena_addr = a.arena_addr;
    p->arena_len = a.arena_len;
    p->token = a.token;
    p->lease_ttl = std::chrono::milliseconds(a.lease_ttl_ms);
    p->by_am = a.reads_by_am;
    // One-sided puts go over the same emulation as one-sided gets where reads come by
    // active message (UCX's TCP), which a client dying mid-put would make abort the
    // owner: such a peer's puts go by TCP PUT even if a server offered otherwise.
    if (!a.reads_by_am) p->put_ttl = std::chrono::milliseconds(a.put_ttl_ms);
    connects_.fetch_add(1);
    if (fresh != nullptr) *fresh = true;
    slot.peer = p;
    *out = std::move(p);
    return Status::OK();
  }

  void Drop(const Endpoint& peer, const std::shared_ptr<UcxPeer>& p) {
    MutexLock lock(&peers_mu_);
    auto it = peers_.find(peer.ToString());
    if (it != peers_.end() && it->second.peer == p) it->second.peer.reset();
  }

  static constexpr std::chrono::seconds kRetryUcxAfter{10};
  static constexpr std::chrono::milliseconds kAbandonAfter{100};

  struct Slot {
    std::shared_ptr<UcxPeer> peer;
    Clock::time_point connect_after{};  // the last connect failed: connect_error until then
    Status connect_error;
    uint64_t backoff_ms = 0;
    Clock::time_point tcp_until{};
  };

  // The caller's regions: every worker maps them all.
  class Regions {
   public:
    Status Add(void* addr, size_t length, const char* what) {
      Status s = map_.Add(addr, length, what);
      if (s.ok()) all_[addr] = length;
      return s;
    }
    size_t Remove(void* addr) {
      all_.erase(addr);
      return map_.Remove(addr);
    }
    const std::map<void*, size_t>& All() const { return all_; }

   private:
    RegionMap map_;  // refuses overlaps
    std::map<void*, size_t> all_;
  };

  const std::string tls_;    // the transports every worker of ours may use
  const bool cuda_memory_;  // our contexts map device memory (ucp_context_query)
  std::shared_ptr<MemoryRegistrar> registrar_;
  Mutex w_mu_;
  std::shared_ptr<Worker> w_ GUARDED_BY(w_mu_);  // the worker new peers use
  Regions mapped_ GUARDED_BY(w_mu_);
  std::vector<std::shared_ptr<Worker> > retired_ GUARDED_BY(w_mu_);
  Mutex peers_mu_;  // held while connecting: one connect per peer at a time
  std::map<std::string, Slot> peers_ GUARDED_BY(peers_mu_);
  Mutex bounce_mu_;  // held by the batch using the bounce buffer; before a worker's mu
  std::shared_ptr<Bounce> bounce_ GUARDED_BY(bounce_mu_);
  static constexpr size_t kBounceBytes = 4 << 20;
  std::atomic<uint64_t> gets_{0}, get_bytes_{0}, tcp_batches_{0}, connects_{0}, abandoned_{0},
      replaced_{0}, am_calls_{0}, releases_by_age_{0}, direct_ops_{0}, direct_bytes_{0},
      bounce_ops_{0}, bounce_bytes_{0}, puts_{0}, put_bytes_{0}, tcp_put_keys_{0}, late_puts_{0},
      stale_retries_{0}, am_reads_{0}, stale_peers_{0};
};

}  // namespace

bool UcxCudaMemory(uint64_t memory_types) {
  return (memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

bool UcxAvailable(std::string* why, UcxInfo* info) {
  std::unique_ptr<Worker> w;
  Status s = Worker::Create(&w);
  if (!s.ok()) {
    *why = s.ToString();
    return false;
  }
  if (info != nullptr) {
    info->version = ucp_get_version_string();
    info->cuda_memory = w->cuda_memory();
  }
  return true;
}

Status NewUcxTransport(const TransportOptions& options, std::unique_ptr<Transport>* result,
                       const std::string& tls) {
  std::unique_ptr<Worker> w;
  Status s = Worker::Create(&w, tls);
  if (!s.ok()) {
    return Status::NotSupported("UCX transport" + (tls.empty() ? "" : " over " + tls),
                                s.ToString());
  }
  *result = std::make_unique<UcxTransport>(options, std::move(w), tls);
  return Status::OK();
}

Status UcxServer::Create(std::function<void(LogLevel, const std::string&)> log,
                         std::unique_ptr<UcxServer>* result) {
  const char* tls = std::getenv("UCX_TLS");
  auto server = std::make_unique<UcxServerImpl>(std::move(log));
  server->Start(tls != nullptr ? tls : "");
  *result = std::move(server);
  return Status::OK();
}

#endif  // KV_WITH_UCX

}  // namespace kvengine
