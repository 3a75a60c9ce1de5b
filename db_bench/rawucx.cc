// rawucx and rawucx_put: UCX's own one-sided gets and puts of --value_size bytes,
// --batch_size of them in flight per call, between this process and a child (kv_bench
// re-executed with --rawucx_far_end) that maps a region as large as the data set -- what
// ucx_perftest -t ucp_get / ucp_put measures, in peer_get's and peer_put's shape and over
// the same UCX transports (UCX_TLS), with nothing of kvengine in between.
#include "db_bench/rawucx.h"

#include <cstring>
#include <string>

#ifdef KV_WITH_UCX
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "db_bench/runner.h"
#include "db_bench/workload.h"
#include "transport/ucp_helpers.h"
#include "util/coding.h"
#endif

namespace kvbench {

#ifndef KV_WITH_UCX

Result RunRawUcx(const BenchContext&, bool) {
  Result r;
  r.errors = 1;
  r.first_error = "rawucx: kv_bench was built without UCX (install libucx-dev and rebuild)";
  return r;
}

int RawUcxFarEnd(int, char**) { return 2; }

#else  // KV_WITH_UCX

namespace {

// A UCP context and worker for one thread of this process (or the far end).
struct Ucp {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string error;

  Ucp() {
    ucp_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    ucs_status_t st = ucp_init(&params, nullptr, &context);
    if (st != UCS_OK) {
      context = nullptr;
      error = std::string("ucp_init: ") + ucs_status_string(st);
      return;
    }
    ucp_worker_params_t wp;
    std::memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(context, &wp, &worker);
    if (st != UCS_OK) {
      worker = nullptr;
      error = std::string("ucp_worker_create: ") + ucs_status_string(st);
    }
  }
  ~Ucp() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
  bool ok() const { return worker != nullptr; }

  // Maps [addr, addr+length), or -- addr null -- has UCX allocate `length` bytes and
  // map them; null on failure.
  ucp_mem_h Map(void* addr, size_t length) {
    const ucp_mem_map_params_t p =
        kvengine::UcpMapParams(addr, length, addr == nullptr ? UCP_MEM_MAP_ALLOCATE : 0);
    ucp_mem_h memh = nullptr;
    return ucp_mem_map(context, &p, &memh) == UCS_OK ? memh : nullptr;
  }
};

bool WriteAll(int fd, const std::string& s) {
  for (size_t done = 0; done < s.size();) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t k = ::read(fd, p + done, n - done);
    if (k <= 0) return false;
    done += static_cast<size_t>(k);
  }
  return true;
}

// What the far end tells: its worker address, its region and the region's rkey.
struct FarEnd {
  std::string address, rkey;
  uint64_t region = 0, length = 0;
  pid_t pid = -1;
  int fd = -1;  // closing it ends the far end

  ~FarEnd() {
    if (fd >= 0) ::close(fd);
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
};

// Starts the far end with a region of `length` bytes allocated by UCX (ucx_memory) or by
// the far end itself; false and *error on failure.
bool StartFarEnd(uint64_t length, bool ucx_memory, FarEnd* far, std::string* error) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    *error = "socketpair failed";
    return false;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    const int fd = ::dup(sv[1]);  // without CLOEXEC
    const std::string fd_arg = std::to_string(fd), len_arg = std::to_string(length);
    ::execl("/proc/self/exe", "kv_bench", "--rawucx_far_end", fd_arg.c_str(), len_arg.c_str(),
            ucx_memory ? "ucx" : "user", nullptr);
    ::_exit(127);
  }
  ::close(sv[1]);
  far->pid = pid;
  far->fd = sv[0];
  char head[8 * 4];
  if (pid < 0 || !ReadAll(far->fd, head, sizeof(head))) {
    *error = "the far end did not start";
    return false;
  }
  const uint64_t alen = kvengine::DecodeFixed64(head), rlen = kvengine::DecodeFixed64(head + 8);
  far->region = kvengine::DecodeFixed64(head + 16);
  far->length = kvengine::DecodeFixed64(head + 24);
  if (alen == 0 || alen > (1 << 20) || rlen > (1 << 20)) {
    *error = "the far end could not map its region";
    return false;
  }
  far->address.resize(alen);
  far->rkey.resize(rlen);
  if (!ReadAll(far->fd, far->address.data(), alen) || !ReadAll(far->fd, far->rkey.data(), rlen)) {
    *error = "the far end broke off";
    return false;
  }
  return true;
}

// One thread's side: its own worker, an endpoint to the far end, the far end's rkey and
// its batch of local buffers, mapped.
class Near {
 public:
  Near(const FarEnd& far, uint64_t batch, uint64_t value_size) : far_(far) {
    if (!ucp_.ok()) {
      error_ = ucp_.error;
      return;
    }
    ucp_ep_params_t ep;
    std::memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(far.address.data());
    ucs_status_t st = ucp_ep_create(ucp_.worker, &ep, &ep_);
    if (st == UCS_OK) st = ucp_ep_rkey_unpack(ep_, far.rkey.data(), &rkey_);
    if (st != UCS_OK) {
      error_ = std::string("connecting to the far end: ") + ucs_status_string(st);
      return;
    }
    for (uint64_t i = 0; i < batch; i++) {
      buffers_.emplace_back(value_size);
      std::memset(buffers_.back().data(), 0, value_size);
      memh_.push_back(ucp_.Map(buffers_.back().data(), value_size));
      if (memh_.back() == nullptr) error_ = "ucp_mem_map of a local buffer failed";
    }
  }
  ~Near() {
    for (ucp_mem_h m : memh_) {
      if (m != nullptr) ucp_mem_unmap(ucp_.context, m);
    }
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    if (ep_ != nullptr) kvengine::CloseUcpEndpointNow(ucp_.worker, ep_);
  }
  const std::string& error() const { return error_; }

  // A batch's operations in flight, counted down by their completions.
  struct Done {
    int* remaining;
    bool* failed;
    static void Completed(void* request, ucs_status_t st, void* user_data) {
      auto* d = static_cast<Done*>(user_data);
      (*d->remaining)--;
      if (st != UCS_OK) *d->failed = true;
      ucp_request_free(request);
    }
  };

  // Gets (or puts) slot ids[i] of the far end's region into (from) buffer i, all at once,
  // and waits for them all.  False on a failed operation.
  bool Batch(const std::vector<uint64_t>& ids, uint64_t value_size, bool put) {
    int remaining = 0;
    bool failed = false;
    Done done{&remaining, &failed};
    for (size_t i = 0; i < ids.size(); i++) {
      ucp_request_param_t p;
      std::memset(&p, 0, sizeof(p));
      p.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
      p.memh = memh_[i];
      p.user_data = &done;
      p.cb.send = &Done::Completed;
      const uint64_t remote = far_.region + (ids[i] * value_size) % (far_.length - value_size + 1);
      ucs_status_ptr_t req =
          put ? ucp_put_nbx(ep_, buffers_[i].data(), value_size, remote, rkey_, &p)
              : ucp_get_nbx(ep_, buffers_[i].data(), value_size, remote, rkey_, &p);
      if (UCS_PTR_IS_ERR(req)) return false;
      if (req != nullptr) remaining++;
    }
    if (put) {
      // A put completes locally when its source may be reused; the flush makes it
      // visible at the far end, as a peer put must be before it returns.
      ucp_request_param_t p;
      std::memset(&p, 0, sizeof(p));
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.user_data = &done;
      p.cb.send = &Done::Completed;
      ucs_status_ptr_t req = ucp_ep_flush_nbx(ep_, &p);
      if (UCS_PTR_IS_ERR(req)) return false;
      if (req != nullptr) remaining++;
    }
    while (remaining > 0) ucp_worker_progress(ucp_.worker);
    return !failed;
  }

 private:
  const FarEnd& far_;
  Ucp ucp_;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  std::vector<AlignedBuffer> buffers_;
  std::vector<ucp_mem_h> memh_;
  std::string error_;
};

}  // namespace

Result RunRawUcx(const BenchContext& b, bool put) {
  const char* name = put ? "rawucx_put" : "rawucx";
  const uint64_t vs = b.config->value_size;
  const uint64_t batch = std::max<uint64_t>(1, b.config->batch_size);
  auto far = std::make_shared<FarEnd>();
  std::string error;
  const bool ucx_memory = b.config->rawucx_memory == "ucx";
  if (!StartFarEnd(b.config->num * vs, ucx_memory, far.get(), &error)) {
    Result r;
    r.errors = 1;
    r.first_error = std::string(name) + ": " + error;
    return r;
  }
  const uint64_t num = b.config->num;
  Result r = RunParallel(b.Spec(num), [&, far](ThreadContext& ctx) -> OpFn {
    auto near = std::make_shared<Near>(*far, batch, vs);
    if (!near->error().empty()) ctx.Error(std::string(name) + ": " + near->error());
    auto ids = std::make_shared<std::vector<uint64_t> >();
    return [near, ids, vs, batch, num, put, name](ThreadContext& c) {
      const uint64_t n = std::min(batch, c.Remaining());
      DistinctRandom(&c.rng(), num, n, ids.get());
      const auto start = Clock::now();
      const bool ok = near->error().empty() && near->Batch(*ids, vs, put);
      c.Record(start, n, n, ok ? n * vs : 0);
      if (!ok) c.Error(std::string(name) + ": a UCX operation failed");
    };
  });
  r.note = std::to_string(batch) + " one-sided " + (put ? "puts" : "gets") +
           " in flight per call, to another process's memory allocated by " +
           (ucx_memory ? "UCX" : "it");
  return r;
}

int RawUcxFarEnd(int argc, char** argv) {
  if (argc < 5) return 2;
  const int fd = std::atoi(argv[2]);
  const uint64_t length = std::max<uint64_t>(4096, std::strtoull(argv[3], nullptr, 10));
  const bool ucx_memory = std::strcmp(argv[4], "ucx") == 0;
  Ucp ucp;
  std::string out;
  AlignedBuffer own(ucx_memory ? 0 : length);
  ucp_mem_h memh = ucp.ok() ? ucp.Map(ucx_memory ? nullptr : own.data(), length) : nullptr;
  char* region = nullptr;
  if (memh != nullptr) {
    ucp_mem_attr_t attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    if (ucp_mem_query(memh, &attr) == UCS_OK) region = static_cast<char*>(attr.address);
  }
  void* rkey = nullptr;
  size_t rkey_len = 0;
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  if (region != nullptr) {
    std::memset(region, 'r', length);  // every page backed before the clock runs
    if (ucp_rkey_pack(ucp.context, memh, &rkey, &rkey_len) != UCS_OK ||
        ucp_worker_get_address(ucp.worker, &addr, &addr_len) != UCS_OK) {
      addr_len = 0;
    }
  }
  kvengine::PutFixed64(&out, addr_len);
  kvengine::PutFixed64(&out, rkey_len);
  kvengine::PutFixed64(&out, reinterpret_cast<uintptr_t>(region));
  kvengine::PutFixed64(&out, length);
  if (addr_len > 0) {
    out.append(reinterpret_cast<const char*>(addr), addr_len);
    out.append(static_cast<const char*>(rkey), rkey_len);
  }
  if (!WriteAll(fd, out) || addr_len == 0) return 1;
  // Progress until kv_bench closes its end, as kvengine's UCX server does: asleep on the
  // worker's event descriptor whenever there is nothing to do (spinning lost here: on a
  // host with more runnable threads than cores a spinning thread is the last to run when
  // work comes).  UCX 1.13 emulates gets and puts of memory it did not allocate with
  // messages answered here (over TCP, and over shared memory too: its RMA lanes there
  // are posix and sysv, which reach only segments UCX allocated; cma is no RMA lane).
  int efd = -1;
  if (ucp_worker_get_efd(ucp.worker, &efd) != UCS_OK) return 1;
  for (;;) {
    while (ucp_worker_progress(ucp.worker) != 0) {
    }
    if (ucp_worker_arm(ucp.worker) == UCS_ERR_BUSY) continue;
    pollfd pfd[2] = {{efd, POLLIN, 0}, {fd, POLLIN, 0}};
    if (::poll(pfd, 2, 1000) > 0 && pfd[1].revents != 0) break;  // kv_bench is done
  }
  ucp_worker_release_address(ucp.worker, addr);
  ucp_rkey_buffer_release(rkey);
  ucp_mem_unmap(ucp.context, memh);
  return 0;
}

#endif  // KV_WITH_UCX

}  // namespace kvbench
