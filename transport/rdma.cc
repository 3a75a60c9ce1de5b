#include "transport/rdma.h"

#include <cstring>

#include "transport/lease_calls.h"
#include "transport/tcp_transport.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/mutex.h"

#ifdef KV_WITH_RDMA
#include <infiniband/verbs.h>

#include <chrono>
#include <random>
#endif

namespace kvengine {

// ---------------------------------------------------------------- device-independent
void QpParams::EncodeTo(std::string* dst) const {
  dst->push_back(1);  // version
  PutFixed32(dst, qpn);
  PutFixed32(dst, psn);
  char b[2];
  b[0] = static_cast<char>(lid & 0xff);
  b[1] = static_cast<char>(lid >> 8);
  dst->append(b, 2);
  dst->push_back(static_cast<char>(port));
  dst->push_back(static_cast<char>(mtu));
  dst->append(reinterpret_cast<const char*>(gid), 16);
  dst->push_back(static_cast<char>(gid_index));
  PutFixed32(dst, rkey);
  PutFixed64(dst, arena_addr);
  PutFixed64(dst, arena_len);
}

Status QpParams::DecodeFrom(std::string_view in, QpParams* out) {
  if (in.size() != kEncodedSize) {
    return Status::Corruption("queue pair parameters of " + std::to_string(in.size()) +
                              " bytes, want " + std::to_string(kEncodedSize));
  }
  if (in[0] != 1) return Status::Corruption("queue pair parameters of unknown version");
  in.remove_prefix(1);
  QpParams p;
  GetFixed32(&in, &p.qpn);
  GetFixed32(&in, &p.psn);
  p.lid = static_cast<uint16_t>(static_cast<uint8_t>(in[0]) | (static_cast<uint8_t>(in[1]) << 8));
  p.port = static_cast<uint8_t>(in[2]);
  p.mtu = static_cast<uint8_t>(in[3]);
  std::memcpy(p.gid, in.data() + 4, 16);
  p.gid_index = static_cast<uint8_t>(in[20]);
  in.remove_prefix(21);
  GetFixed32(&in, &p.rkey);
  GetFixed64(&in, &p.arena_addr);
  GetFixed64(&in, &p.arena_len);
  if (p.qpn == 0 || p.qpn > 0xffffff || p.psn > 0xffffff) {
    return Status::Corruption("queue pair number or PSN out of range");
  }
  if (p.mtu < 1 || p.mtu > 5) return Status::Corruption("path MTU out of range");
  if (p.arena_addr + p.arena_len < p.arena_addr) return Status::Corruption("arena wraps around");
  *out = p;
  return Status::OK();
}

bool QpParams::operator==(const QpParams& o) const {
  return qpn == o.qpn && psn == o.psn && lid == o.lid && port == o.port && mtu == o.mtu &&
         std::memcmp(gid, o.gid, 16) == 0 && gid_index == o.gid_index && rkey == o.rkey &&
         arena_addr == o.arena_addr && arena_len == o.arena_len;
}

Status MrTable::Add(const Region& r) {
  if (r.length == 0) return Status::InvalidArgument("memory region is empty");
  MutexLock lock(&mu_);
  auto next = regions_.lower_bound(r.start);
  bool overlaps = next != regions_.end() && next->first < r.start + r.length;
  if (next != regions_.begin()) {
    auto prev = std::prev(next);
    overlaps |= prev->first + prev->second.length > r.start;
  }
  if (overlaps) return Status::InvalidArgument("memory region overlaps a registered one");
  regions_.emplace(r.start, r);
  return Status::OK();
}

bool MrTable::Remove(const void* addr, Region* removed) {
  MutexLock lock(&mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == regions_.end()) return false;
  *removed = it->second;
  regions_.erase(it);
  return true;
}

bool MrTable::Find(const void* addr, size_t length, Region* out) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  MutexLock lock(&mu_);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return false;
  --it;
  if (a + length < a || a + length > it->first + it->second.length) return false;
  *out = it->second;
  return true;
}

size_t MrTable::size() const {
  MutexLock lock(&mu_);
  return regions_.size();
}

std::vector<MrTable::Region> MrTable::All() const {
  MutexLock lock(&mu_);
  std::vector<Region> all;
  for (const auto& [start, r] : regions_) all.push_back(r);
  return all;
}

WrBatchPlan PlanWorkRequests(size_t reads, size_t max_per_post, size_t max_outstanding) {
  WrBatchPlan plan;
  if (max_per_post == 0) max_per_post = 1;
  if (max_outstanding == 0) max_outstanding = 1;
  size_t next = 0;
  while (next < reads) {
    std::vector<WrBatchPlan::Posting> wave;
    size_t in_wave = 0;
    while (next < reads && in_wave < max_outstanding) {
      const size_t n = std::min({max_per_post, max_outstanding - in_wave, reads - next});
      wave.push_back({next, n});
      next += n;
      in_wave += n;
    }
    plan.waves.push_back(std::move(wave));
  }
  return plan;
}

#ifndef KV_WITH_RDMA

bool RdmaAvailable(std::string* why) {
  *why = "kvengine was built without libibverbs (KV_WITH_RDMA off)";
  return false;
}

Status NewRdmaTransport(const TransportOptions&, std::unique_ptr<Transport>*) {
  return Status::NotSupported("RDMA transport", "built without libibverbs");
}

Status RdmaServer::Create(std::unique_ptr<RdmaServer>*) {
  return Status::NotSupported("RDMA server", "built without libibverbs");
}

#else  // KV_WITH_RDMA

namespace {

constexpr int kQueueDepth = 256;      // send queue depth (work requests in flight)
constexpr int kMaxPerPost = 32;       // work requests chained per ibv_post_send
constexpr int kReadAtomicDepth = 16;  // outstanding RDMA READs per QP (responder side)

Status Errno(const std::string& what) {
  return Status::IOError(what + ": " + std::strerror(errno));
}

// An opened device with an active port and a protection domain.
class Device {
 public:
  ~Device() {
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (ctx_ != nullptr) ibv_close_device(ctx_);
  }

  static Status Open(std::unique_ptr<Device>* result) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) {
      if (list != nullptr) ibv_free_device_list(list);
      return Status::NotSupported("no RDMA device");
    }
    Status last = Status::NotSupported("no RDMA device with an active port");
    for (int i = 0; i < n; i++) {
      ibv_context* ctx = ibv_open_device(list[i]);
      if (ctx == nullptr) continue;
      ibv_device_attr dattr;
      if (ibv_query_device(ctx, &dattr) != 0) {
        ibv_close_device(ctx);
        continue;
      }
      for (uint8_t port = 1; port <= dattr.phys_port_cnt; port++) {
        ibv_port_attr pattr;
        if (ibv_query_port(ctx, port, &pattr) != 0 || pattr.state != IBV_PORT_ACTIVE) continue;
        auto dev = std::unique_ptr<Device>(new Device);
        dev->ctx_ = ctx;
        dev->port_ = port;
        dev->port_attr_ = pattr;
        dev->name_ = ibv_get_device_name(list[i]);
        if (ibv_query_gid(ctx, port, 0, &dev->gid_) != 0) std::memset(&dev->gid_, 0, 16);
        dev->pd_ = ibv_alloc_pd(ctx);
        if (dev->pd_ == nullptr) {
          last = Errno("ibv_alloc_pd");
          dev->ctx_ = nullptr;
          break;
        }
        ibv_free_device_list(list);
        *result = std::move(dev);
        return Status::OK();
      }
      ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    return last;
  }

  Status Register(void* addr, size_t length, MrTable::Region* region) {
    ibv_mr* mr = ibv_reg_mr(pd_, addr, length, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    if (mr == nullptr) return Errno("ibv_reg_mr of " + std::to_string(length) + " bytes");
    region->start = reinterpret_cast<uintptr_t>(addr);
    region->length = length;
    region->lkey = mr->lkey;
    region->rkey = mr->rkey;
    region->handle = mr;
    return Status::OK();
  }
  static void Deregister(const MrTable::Region& region) {
    ibv_dereg_mr(static_cast<ibv_mr*>(region.handle));
  }

  ibv_context* ctx() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const ibv_gid& gid() const { return gid_; }
  const std::string& name() const { return name_; }

 private:
  Device() = default;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  ibv_port_attr port_attr_{};
  ibv_gid gid_{};
  std::string name_;
};

// One RC queue pair with its own completion queue.
class QueuePair {
 public:
  ~QueuePair() {
    if (qp_ != nullptr) ibv_destroy_qp(qp_);
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
  }

  static Status Create(Device* dev, std::unique_ptr<QueuePair>* result) {
    auto q = std::unique_ptr<QueuePair>(new QueuePair(dev));
    q->cq_ = ibv_create_cq(dev->ctx(), kQueueDepth, nullptr, nullptr, 0);
    if (q->cq_ == nullptr) return Errno("ibv_create_cq");
    ibv_qp_init_attr init;
    std::memset(&init, 0, sizeof(init));
    init.send_cq = q->cq_;
    init.recv_cq = q->cq_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;  // only the last request of a posting is signaled
    init.cap.max_send_wr = kQueueDepth;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    q->qp_ = ibv_create_qp(dev->pd(), &init);
    if (q->qp_ == nullptr) return Errno("ibv_create_qp");
    std::random_device rd;
    q->psn_ = rd() & 0xffffff;
    ibv_qp_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = dev->port();
    attr.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
    if (ibv_modify_qp(q->qp_, &attr,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
      return Errno("ibv_modify_qp to INIT");
    }
    *result = std::move(q);
    return Status::OK();
  }

  QpParams Local() const {
    QpParams p;
    p.qpn = qp_->qp_num;
    p.psn = psn_;
    p.lid = dev_->port_attr().lid;
    p.port = dev_->port();
    p.mtu = static_cast<uint8_t>(dev_->port_attr().active_mtu);
    std::memcpy(p.gid, dev_->gid().raw, 16);
    p.gid_index = 0;
    return p;
  }

  // INIT -> RTR -> RTS against the remote side's parameters.
  Status Connect(const QpParams& remote) {
    ibv_qp_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(std::min<int>(remote.mtu, dev_->port_attr().active_mtu));
    attr.dest_qp_num = remote.qpn;
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = kReadAtomicDepth;
    attr.min_rnr_timer = 12;
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = 0;
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = dev_->port();
    if (remote.lid == 0) {  // RoCE: route by GID
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, 16);
      attr.ah_attr.grh.sgid_index = 0;
      attr.ah_attr.grh.hop_limit = 1;
    }
    if (ibv_modify_qp(qp_, &attr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
      return Errno("ibv_modify_qp to RTR");
    }
    std::memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = psn_;
    attr.max_rd_atomic = kReadAtomicDepth;
    if (ibv_modify_qp(qp_, &attr,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
      return Errno("ibv_modify_qp to RTS");
    }
    return Status::OK();
  }

  // Posts every read (RDMA READ from remote_base + offset) in planned batches and polls
  // their completions.  Sets each read's status.  A failed completion leaves the queue
  // pair in the error state: the caller drops it.
  Status PostReads(std::span<RemoteRead> reads, uint64_t remote_base, uint32_t rkey,
                   const MrTable& local_mrs, std::chrono::milliseconds timeout) {
    const WrBatchPlan plan = PlanWorkRequests(reads.size(), kMaxPerPost, kQueueDepth);
    std::vector<ibv_sge> sges(reads.size());
    std::vector<ibv_send_wr> wrs(reads.size());
    for (size_t i = 0; i < reads.size(); i++) {
      MrTable::Region mr;
      if (!local_mrs.Find(reads[i].local, reads[i].length, &mr)) {
        reads[i].status = Status::InvalidArgument("destination buffer is not registered");
        return reads[i].status;
      }
      sges[i].addr = reinterpret_cast<uintptr_t>(reads[i].local);
      sges[i].length = static_cast<uint32_t>(reads[i].length);
      sges[i].lkey = mr.lkey;
      std::memset(&wrs[i], 0, sizeof(ibv_send_wr));
      wrs[i].sg_list = &sges[i];
      wrs[i].num_sge = 1;
      wrs[i].opcode = IBV_WR_RDMA_READ;
      wrs[i].wr.rdma.remote_addr = remote_base + reads[i].remote_offset;
      wrs[i].wr.rdma.rkey = rkey;
    }
    for (const auto& wave : plan.waves) {
      for (size_t p = 0; p < wave.size(); p++) {
        const auto& posting = wave[p];
        for (size_t k = 0; k < posting.count; k++) {
          ibv_send_wr& wr = wrs[posting.first + k];
          wr.wr_id = posting.first;  // errors and the completion name the posting
          const bool last = k + 1 == posting.count;
          wr.next = last ? nullptr : &wrs[posting.first + k + 1];
          wr.send_flags = last ? IBV_SEND_SIGNALED : 0;
        }
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(qp_, &wrs[posting.first], &bad) != 0) {
          return Errno("ibv_post_send");
        }
      }
      // One completion per posting (or an error completion for a failed request).
      size_t done = 0;
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      ibv_wc wc[32];
      while (done < wave.size()) {
        const int n = ibv_poll_cq(cq_, 32, wc);
        if (n < 0) return Status::IOError("ibv_poll_cq failed");
        for (int i = 0; i < n; i++) {
          if (wc[i].status == IBV_WC_SUCCESS) {
            done++;  // the signaled last request of a posting: the whole posting is done
            continue;
          }
          // A failed request (its posting's reads fail); the queue pair is now in the
          // error state and the rest are flushed, so the caller drops it.
          const size_t first = wc[i].wr_id;
          const Status err =
              Status::IOError(std::string("RDMA READ: ") + ibv_wc_status_str(wc[i].status));
          for (const auto& posting : wave) {
            if (posting.first != first) continue;
            for (size_t k = 0; k < posting.count; k++) reads[first + k].status = err;
          }
          return err;
        }
        if (n == 0 && std::chrono::steady_clock::now() > deadline) {
          return Status::IOError("RDMA READ completions timed out");
        }
      }
    }
    return Status::OK();
  }

 private:
  explicit QueuePair(Device* dev) : dev_(dev) {}
  Device* const dev_;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
};

// Forwards a DB's regions to a device's memory regions.
class MrRegistrar final : public MemoryRegistrar {
 public:
  MrRegistrar(Device* dev, MrTable* table, std::function<void(const MrTable::Region&, bool)> on)
      : dev_(dev), table_(table), on_(std::move(on)) {}
  Status Register(void* addr, size_t length, const char* what) override {
    MrTable::Region r;
    Status s = dev_->Register(addr, length, &r);
    if (!s.ok()) return Status::IOError(std::string("registering ") + what, s.message());
    s = table_->Add(r);
    if (!s.ok()) {
      Device::Deregister(r);
      return s;
    }
    if (on_) on_(r, std::strcmp(what, "arena") == 0);
    return Status::OK();
  }
  void Unregister(void* addr, size_t) override {
    MrTable::Region r;
    if (table_->Remove(addr, &r)) Device::Deregister(r);
  }

 private:
  Device* const dev_;
  MrTable* const table_;
  std::function<void(const MrTable::Region&, bool)> on_;
};

class RdmaServerImpl final : public RdmaServer {
 public:
  explicit RdmaServerImpl(std::unique_ptr<Device> dev) : dev_(std::move(dev)) {
    registrar_ = std::make_shared<MrRegistrar>(dev_.get(), &mrs_,
                                               [this](const MrTable::Region& r, bool arena) {
                                                 if (!arena) return;
                                                 MutexLock lock(&mu_);
                                                 arena_ = r;
                                               });
  }
  ~RdmaServerImpl() override {
    qps_.clear();
    for (const auto& r : mrs_.All()) Device::Deregister(r);
  }
  std::shared_ptr<MemoryRegistrar> registrar() override { return registrar_; }

  Status Connect(std::string_view client, std::string* server) override {
    QpParams theirs;
    Status s = QpParams::DecodeFrom(client, &theirs);
    if (!s.ok()) return s;
    std::unique_ptr<QueuePair> qp;
    s = QueuePair::Create(dev_.get(), &qp);
    if (s.ok()) s = qp->Connect(theirs);
    if (!s.ok()) return s;
    QpParams mine = qp->Local();
    {
      MutexLock lock(&mu_);
      if (arena_.length == 0) return Status::NotSupported("the arena is not registered");
      mine.rkey = arena_.rkey;
      mine.arena_addr = arena_.start;
      mine.arena_len = arena_.length;
      qps_.push_back(std::move(qp));
    }
    mine.EncodeTo(server);
    return Status::OK();
  }

 private:
  std::unique_ptr<Device> dev_;
  MrTable mrs_;
  std::shared_ptr<MemoryRegistrar> registrar_;
  Mutex mu_;
  MrTable::Region arena_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<QueuePair> > qps_ GUARDED_BY(mu_);
};

// The client: control RPCs over TCP, value bytes by one-sided READ.
class RdmaTransport final : public TcpTransport {
 public:
  RdmaTransport(const TransportOptions& options, std::unique_ptr<Device> dev)
      : TcpTransport(options), dev_(std::move(dev)) {
    registrar_ = std::make_shared<MrRegistrar>(dev_.get(), &mrs_, nullptr);
  }
  ~RdmaTransport() override {
    qps_.clear();
    for (const auto& r : mrs_.All()) Device::Deregister(r);
  }
  const char* Name() const override { return "rdma"; }
  Status RegisterMemory(void* addr, size_t length, const char* what) override {
    return registrar_->Register(addr, length, what);
  }
  void UnregisterMemory(void* addr, size_t length) override {
    registrar_->Unregister(addr, length);
  }
  std::shared_ptr<MemoryRegistrar> registrar() override { return registrar_; }

  // One-sided reads are not pipelined over TCP frames: a started get runs at once
  // (the default), through BatchGet below.
  std::unique_ptr<PendingGet> StartBatchGet(const Endpoint& peer, std::span<const Slice> keys,
                                            std::span<const Destination> dests,
                                            std::vector<int64_t>* results) override {
    return Transport::StartBatchGet(peer, keys, dests, results);
  }
  // And so are grouped ones: group by group, each through BatchGet (not GET_GROUPS).
  void StartBatchGetGroups(const Endpoint& peer, std::span<const GetGroup> groups,
                           std::vector<std::unique_ptr<PendingGet> >* calls) override {
    Transport::StartBatchGetGroups(peer, groups, calls);
  }

  Status BatchGet(const Endpoint& peer, std::span<const Slice> keys,
                  std::span<const Destination> dests, std::vector<int64_t>* results) override {
    // One-sided reads land only in registered memory; otherwise the bytes come by TCP.
    for (const Destination& d : dests) {
      for (const MutableSlice& b : d) {
        MrTable::Region r;
        if (b.size() > 0 && !mrs_.Find(b.data(), b.size(), &r)) {
          return TcpTransport::BatchGet(peer, keys, dests, results);
        }
      }
    }
    std::shared_ptr<PeerQp> pq;
    Status s = QpFor(peer, &pq);
    if (!s.ok()) return FailAll(s, keys.size(), results);
    Remote remote(this, peer, pq.get());
    ValidatedReader reader(&remote);
    s = reader.BatchGet(keys, dests, results);
    if (!s.ok() || remote.broken) DropQp(peer);
    if (!s.ok()) return s;
    // Keys the peer holds only on SSD: ask for their bytes over TCP.
    GetUnpinnedOverTcp(this, peer, keys, dests, results);
    return Status::OK();
  }

 private:
  struct PeerQp {
    Mutex mu;  // one batch of reads on the queue pair at a time
    std::unique_ptr<QueuePair> qp;
    QpParams remote;
  };

  class Remote final : public RemoteMemory {
   public:
    Remote(RdmaTransport* t, const Endpoint& peer, PeerQp* pq) : t_(t), peer_(peer), pq_(pq) {}
    Status Lookup(std::span<const Slice> keys, std::vector<int64_t>* results,
                  std::vector<RemoteLocation>* locations) override {
      return CallLookup(t_, peer_, keys, pq_->remote.arena_len, results, locations);
    }
    Status Read(std::span<RemoteRead> reads) override {
      MutexLock lock(&pq_->mu);
      Status s = pq_->qp->PostReads(reads, pq_->remote.arena_addr, pq_->remote.rkey, t_->mrs_,
                                    std::chrono::milliseconds(t_->options_.timeout_ms));
      if (!s.ok()) {
        broken = true;
        for (RemoteRead& r : reads) {
          if (r.status.ok()) r.status = s;
        }
      }
      return s;
    }
    Status Release(std::span<const uint64_t> leases, std::vector<uint8_t>* held) override {
      return CallRelease(t_, peer_, leases, held);
    }
    bool broken = false;

   private:
    RdmaTransport* const t_;
    const Endpoint peer_;
    PeerQp* const pq_;
  };

  Status QpFor(const Endpoint& peer, std::shared_ptr<PeerQp>* out) {
    MutexLock lock(&qp_mu_);
    auto& slot = qps_[peer.ToString()];
    if (slot != nullptr) {
      *out = slot;
      return Status::OK();
    }
    auto pq = std::make_shared<PeerQp>();
    Status s = QueuePair::Create(dev_.get(), &pq->qp);
    if (!s.ok()) return s;
    std::string meta;
    pq->qp->Local().EncodeTo(&meta);
    MetaSink sink;
    s = Call(peer, wire::kRdmaConnect, meta, {}, &sink);
    if (!s.ok()) return s;
    std::string_view in(sink.meta);
    Status batch;
    std::string_view theirs;
    if (!wire::GetBatchStatus(&in, &batch) || !GetLengthPrefixed(&in, &theirs)) {
      return Status::Corruption("peer " + peer.ToString() + ": malformed RDMA connect answer");
    }
    if (!batch.ok()) return batch;
    s = QpParams::DecodeFrom(theirs, &pq->remote);
    if (s.ok()) s = pq->qp->Connect(pq->remote);
    if (!s.ok()) return s;
    slot = pq;
    *out = std::move(pq);
    return Status::OK();
  }

  void DropQp(const Endpoint& peer) {
    MutexLock lock(&qp_mu_);
    qps_.erase(peer.ToString());
  }

  std::unique_ptr<Device> dev_;
  MrTable mrs_;
  std::shared_ptr<MemoryRegistrar> registrar_;
  Mutex qp_mu_;
  std::map<std::string, std::shared_ptr<PeerQp> > qps_ GUARDED_BY(qp_mu_);
};

}  // namespace

bool RdmaAvailable(std::string* why) {
  std::unique_ptr<Device> dev;
  Status s = Device::Open(&dev);
  if (!s.ok()) *why = s.ToString();
  return s.ok();
}

Status NewRdmaTransport(const TransportOptions& options, std::unique_ptr<Transport>* result) {
  std::unique_ptr<Device> dev;
  Status s = Device::Open(&dev);
  if (!s.ok()) return s;
  *result = std::make_unique<RdmaTransport>(options, std::move(dev));
  return Status::OK();
}

Status RdmaServer::Create(std::unique_ptr<RdmaServer>* result) {
  std::unique_ptr<Device> dev;
  Status s = Device::Open(&dev);
  if (!s.ok()) return s;
  *result = std::make_unique<RdmaServerImpl>(std::move(dev));
  return Status::OK();
}

#endif  // KV_WITH_RDMA

}  // namespace kvengine
