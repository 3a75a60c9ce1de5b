// Small UCP helpers for every user of UCP in the tree (the UCX transport,
// kv_bench's rawucx, ucx_test's probe).  Header only; include it where ucp.h is.
#ifndef KVENGINE_TRANSPORT_UCP_HELPERS_H_
#define KVENGINE_TRANSPORT_UCP_HELPERS_H_

#include <ucp/api/ucp.h>

#include <cstring>

namespace kvengine {

// Closes ep with UCP_EP_CLOSE_FLAG_FORCE (what is in flight on it completes with an
// error) and progresses `worker` until the close is done.  The caller must be allowed to
// progress the worker (its lock held where it has one).
inline void CloseUcpEndpointNow(ucp_worker_h worker, ucp_ep_h ep) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(req)) {
    while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(req);
  }
}

// ucp_mem_map's parameters for [addr, addr+length) with `flags` (UCP_MEM_MAP_ALLOCATE,
// UCP_MEM_MAP_FIXED, or 0 to map memory that is there).
inline ucp_mem_map_params_t UcpMapParams(void* addr, size_t length, unsigned flags) {
  ucp_mem_map_params_t p;
  std::memset(&p, 0, sizeof(p));
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                 UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.address = addr;
  p.length = length;
  p.flags = flags;
  return p;
}

// ucp_worker_set_am_recv_handler's parameters: cb(arg, ...) for active message `id`.
inline ucp_am_handler_param_t UcpAmHandlerParams(unsigned id, ucp_am_recv_callback_t cb,
                                                 void* arg) {
  ucp_am_handler_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG;
  p.id = id;
  p.cb = cb;
  p.arg = arg;
  return p;
}

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_UCP_HELPERS_H_
