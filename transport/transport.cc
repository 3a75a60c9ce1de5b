// Transport::Create: the choice between TCP and UCX (and UCX over RDMA alone).
#include "kvengine/transport.h"

#include "transport/tcp_transport.h"
#include "transport/tenant_tokens.h"
#include "transport/ucx.h"

namespace kvengine {

Status ReadAuthTokenFile(const std::string& path, std::string* token, std::string* tenant) {
  std::vector<TenantEntry> entries;
  Status s = ReadTenantTokens(path, &entries);
  if (!s.ok()) return s;
  *token = entries[0].token;
  if (tenant != nullptr) *tenant = entries[0].name;
  return Status::OK();
}

Status Transport::Create(const std::string& kind, const TransportOptions& options,
                         std::unique_ptr<Transport>* result) {
  result->reset();
  auto log = [&](LogLevel level, const std::string& line) {
    if (options.log) {
      options.log(level, line);
    } else if (level >= LogLevel::kWarn) {
      std::fprintf(stderr, "[kvengine transport] %s\n", line.c_str());
    }
  };
  if (kind == "tcp") {
    *result = std::make_unique<TcpTransport>(options);
    return Status::OK();
  }
  if (kind != "ucx" && kind != "rdma" && kind != "auto") {
    return Status::InvalidArgument("unknown transport '" + kind +
                                   "' (want tcp, ucx, rdma or auto)");
  }
  if (kind == "ucx") {
    Status s = NewUcxTransport(options, result);
    if (s.ok()) log(LogLevel::kInfo, "transport: ucx");
    return s;
  }
  if (kind == "rdma") {
    // kvengine's own verbs transport was retired: UCX reaches the same devices through
    // its RC, DC and UD transports (docs/transport.md).
    Status s = NewUcxTransport(options, result, kUcxRdmaTransports);
    if (s.ok()) {
      log(LogLevel::kInfo, std::string("transport: rdma (UCX over ") + kUcxRdmaTransports + ")");
      return s;
    }
    return Status::NotSupported(
        "RDMA transport (UCX restricted to its RDMA transports " + std::string(kUcxRdmaTransports) +
            "; no RDMA device, or a UCX built without verbs; 'ucx' or 'auto' use shared memory "
            "and TCP too)",
        s.message());
  }
  // auto: UCX first -- it reaches RDMA devices too, and shared memory and TCP where there
  // are none.
  Status s = NewUcxTransport(options, result);
  if (s.ok()) {
    log(LogLevel::kInfo, "transport: ucx");
    return s;
  }
  log(LogLevel::kInfo, "transport: tcp (UCX unavailable: " + s.ToString() + ")");
  *result = std::make_unique<TcpTransport>(options);
  return Status::OK();
}

}  // namespace kvengine
