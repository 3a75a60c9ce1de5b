// kv_server: serves a kvengine DB to peers.
//
//   kv_server --db=PATH --listen=HOST:PORT [--transport=auto|tcp|ucx|rdma]
//             [--local_listen=SOCKET] [--auth_token_file=F] [--options=name=value,...]
//             [--cluster=etcd://HOST:PORT[,HOST:PORT...]/PREFIX]
//   kv_server --stats=HOST:PORT [--auth_token_file=F]     print a server's stats
//
// It listens on loopback by default (127.0.0.1:7400); any other address requires an
// auth token file.  It prints "kv_server: serving PATH on HOST:PORT over T" once ready.
// --local_listen=SOCKET also serves processes of this host that attach (DB::Attach,
// docs/attach.md) on that Unix socket; given without --listen, only them, and it prints
// "kv_server: serving PATH to local clients on SOCKET".
// --cluster registers the server with etcd under a lease (docs/cluster.md) and routes
// over the cluster's live members.
// --metrics_listen=HOST:PORT (or PORT, on loopback) serves GET /metrics (Prometheus),
// /health, /ready and /stats.json (docs/observability.md) and prints
// "kv_server: metrics on HOST:PORT"; port 0 picks a free port.  With it, entry calls are
// timed by default (perf_level "auto"), so the latency histogram has samples.
// SIGTERM (or SIGINT) leaves the cluster (revokes the lease), stops accepting, drains
// requests in flight, flushes and exits 0.
//
// Several trust domains (docs/attach.md, "Namespaces and credentials"): every further
// --db=PATH starts another DB this server serves to local clients only, with its own
// directory, arena and socket; the --local_listen (required) and --options that follow it
// are that DB's, so each has its own local_allowed_uids and memory budget:
//   kv_server --db=/data/a --local_listen=/run/kv/a.sock --options=local_allowed_uids=1001
//             --db=/data/b --local_listen=/run/kv/b.sock --options=local_allowed_uids=1002
// A client of one socket never receives another's arena.  --listen, --cluster and
// --metrics_listen belong to the first DB.  (Separate processes under separate uids are
// the stronger separation: one process holds every domain's arena.)
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/transport.h"
#include "tools/option_list.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: kv_server --db=PATH [--listen=HOST:PORT] [--transport=auto|tcp|ucx|rdma]\n"
               "                 [--local_listen=SOCKET] [--auth_token_file=F]\n"
               "                 [--options=name=value,...] [--cluster=etcd://H:P/PREFIX]\n"
               "                 [--metrics_listen=HOST:PORT]\n"
               "                 [--db=PATH --local_listen=SOCKET [--options=...]]...\n"
               "       kv_server --stats=HOST:PORT [--auth_token_file=F]\n");
}

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

int PrintStats(const std::string& where, const std::string& token_file) {
  kvengine::Endpoint ep;
  kvengine::Status s = kvengine::Endpoint::Parse(where, &ep);
  kvengine::TransportOptions t;
  if (s.ok() && !token_file.empty()) s = kvengine::ReadAuthTokenFile(token_file, &t.auth_token, &t.auth_tenant);
  std::unique_ptr<kvengine::Transport> transport;
  if (s.ok()) s = kvengine::Transport::Create("tcp", t, &transport);
  std::string text;
  if (s.ok()) {
    // The Prometheus text when the server's build has it, else the plain stats.
    s = transport->GetProperty(ep, "kvengine.stats.prometheus", &text);
    if (s.IsNotFound()) s = transport->GetProperty(ep, "kvengine.stats", &text);
    std::string peers;
    if (s.ok() && transport->GetProperty(ep, "kvengine.peers", &peers).ok()) text += peers;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kv_server --stats: %s\n", s.ToString().c_str());
    return 1;
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// One DB the server serves: its directory, and the flags that are its own.
struct Served {
  std::string path, local_listen, options_text;
  std::unique_ptr<kvengine::DB> db;
};

// The DBs after the first: local clients only, each on its own socket.
kvengine::Status OpenLocalOnly(Served* served) {
  kvengine::Options options;
  kvengine::Status s = kvengine::SetOptionList(served->options_text, &options);
  if (s.ok() && served->local_listen.empty()) {
    s = kvengine::Status::InvalidArgument("--db=" + served->path +
                                          " (not the first) needs its own --local_listen");
  }
  if (s.ok()) s = options.Set("listen", "");
  if (s.ok()) s = options.Set("local_listen", served->local_listen);
  if (s.ok()) s = kvengine::DB::Open(options, served->path, &served->db);
  if (s.ok()) {
    std::printf("kv_server: serving %s to local clients on %s\n", served->path.c_str(),
                served->local_listen.c_str());
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:7400", transport = "auto", token_file, stats, cluster,
              metrics_listen, path;
  bool listen_given = false;
  std::vector<Served> served(1);  // --local_listen and --options go to the last --db's
  for (int i = 1; i < argc; i++) {
    if (Flag(argv[i], "--listen", &listen)) {
      listen_given = true;
      continue;
    }
    if (Flag(argv[i], "--db", &path)) {
      if (!served.back().path.empty()) served.emplace_back();
      served.back().path = path;
      continue;
    }
    if (Flag(argv[i], "--local_listen", &served.back().local_listen) ||
        Flag(argv[i], "--transport", &transport) ||
        Flag(argv[i], "--auth_token_file", &token_file) ||
        Flag(argv[i], "--options", &served.back().options_text) ||
        Flag(argv[i], "--stats", &stats) || Flag(argv[i], "--cluster", &cluster) ||
        Flag(argv[i], "--metrics_listen", &metrics_listen)) {
      continue;
    }
    if (std::strcmp(argv[i], "--help") == 0) {
      Usage();
      return 0;
    }
    std::fprintf(stderr, "kv_server: unknown argument %s\n", argv[i]);
    Usage();
    return 2;
  }
  if (!stats.empty()) return PrintStats(stats, token_file);
  if (served[0].path.empty()) {
    Usage();
    return 2;
  }
  const std::string& db_path = served[0].path;
  const std::string& local_listen = served[0].local_listen;

  kvengine::Options options;
  kvengine::Status s = kvengine::SetOptionList(served[0].options_text, &options);
  // --local_listen alone serves local clients only.
  if (!local_listen.empty() && !listen_given) listen.clear();
  if (s.ok()) s = options.Set("listen", listen);
  if (s.ok() && !local_listen.empty()) s = options.Set("local_listen", local_listen);
  if (s.ok()) s = options.Set("peer_transport", transport);
  if (s.ok() && !token_file.empty()) s = options.Set("peer_auth_token_file", token_file);
  if (s.ok() && !cluster.empty()) s = options.Set("cluster", cluster);
  if (s.ok() && !metrics_listen.empty()) s = options.Set("metrics_listen", metrics_listen);
  if (!s.ok()) {
    std::fprintf(stderr, "kv_server: %s\n", s.ToString().c_str());
    return 2;
  }

  // Every thread the DB starts inherits this mask: only sigwait below sees SIGTERM.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<kvengine::DB>& db = served[0].db;
  s = kvengine::DB::Open(options, db_path, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "kv_server: cannot open %s: %s\n", db_path.c_str(), s.ToString().c_str());
    return 1;
  }
  std::string peers;
  db->GetProperty("kvengine.peers", &peers);
  std::string bound = listen, via = transport;
  for (size_t pos = 0; pos < peers.size();) {
    const size_t eol = peers.find('\n', pos);
    const std::string line = peers.substr(pos, eol - pos);
    if (line.rfind("listen: ", 0) == 0) bound = line.substr(8);
    if (line.rfind("transport: ", 0) == 0) via = line.substr(11);
    if (eol == std::string::npos) break;
    pos = eol + 1;
  }
  if (!listen.empty()) {
    std::printf("kv_server: serving %s on %s over %s\n", db_path.c_str(), bound.c_str(),
                via.c_str());
  }
  if (!local_listen.empty()) {
    std::printf("kv_server: serving %s to local clients on %s\n", db_path.c_str(),
                local_listen.c_str());
  }
  std::string metrics_at;
  if (db->GetProperty("kvengine.metrics_listen", &metrics_at)) {
    std::printf("kv_server: metrics on %s\n", metrics_at.c_str());
  }
  for (size_t i = 1; i < served.size(); i++) {
    s = OpenLocalOnly(&served[i]);
    if (!s.ok()) {
      std::fprintf(stderr, "kv_server: cannot open %s: %s\n", served[i].path.c_str(),
                   s.ToString().c_str());
      return 1;  // the DBs opened before close as the process exits
    }
  }
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "kv_server: signal %d: draining\n", sig);
  int rc = 0;
  for (auto it = served.rbegin(); it != served.rend(); ++it) {
    s = it->db->Close();  // stops accepting, drains requests in flight, flushes the SSD tier
    if (!s.ok()) {
      std::fprintf(stderr, "kv_server: close %s: %s\n", it->path.c_str(), s.ToString().c_str());
      rc = 1;
    }
  }
  if (rc != 0) return rc;
  std::fprintf(stderr, "kv_server: stopped\n");
  return 0;
}
