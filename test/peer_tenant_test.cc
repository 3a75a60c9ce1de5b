// Tenant tokens (issue #29, item 3): a kv_server whose token file binds each tenant to
// namespaces, reached by real clients over loopback -- Transports, hand-driven
// connections and a ClusterDB with its namespaces -- and the token file's parser.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/transport.h"
#include "test/peer_harness.h"
#include "transport/figure_scope.h"
#include "transport/tenant_tokens.h"
#include "transport/wire.h"
#include "util/key_pattern.h"
#include "util/namespace_key.h"

namespace kvengine {
namespace {

// Two tenants bound to one namespace each (beta to the default namespace too), and an
// operator's token for every namespace.
const std::string kTenants =
    "kvengine-tokens 1\n"
    "# tenants of the test\n"
    "tenant alpha tok-alpha-0123456789 ns-a\n"
    "\n"
    "tenant beta\ttok-beta-0123456789 ns-b default\n"
    "tenant ops tok-ops-0123456789 *\n"
    "tenant " +
    std::string(64, 'L') + " tok-long-0123456789 ns-a\n";
constexpr char kAlpha[] = "tok-alpha-0123456789";
constexpr char kBeta[] = "tok-beta-0123456789";
constexpr char kOps[] = "tok-ops-0123456789";

std::string InNamespace(const std::string& ns_name, const std::string& key) {
  return ns::Prefix(ns::IdOf(ns_name)) + key;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A DB directory holding namespaces ns-a and ns-b, for a kv_server to open.
void MakeDbWithTwoNamespaces(const std::string& path) {
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(ClientOptions("", PeerMode::kReadThrough), path, &db).ok());
  for (const char* name : {"ns-a", "ns-b"}) {
    std::unique_ptr<DB> handle;
    ASSERT_TRUE(db->CreateNamespace(name, NamespaceOptions(), &handle).ok()) << name;
  }
}

// A kv_server over a DB with two namespaces, requiring the tenants' tokens, logging
// its warnings to log().
class TenantServer {
 public:
  explicit TenantServer(const std::string& name) : dir_(TempDir(name)) {
    WriteFile(dir_ + "/tokens", kTenants);
    MakeDbWithTwoNamespaces(dir_ + "/db");
    server_ =
        std::make_unique<Server>(dir_ + "/db", FreePort(),
                                 std::vector<std::string>{"--auth_token_file=" + dir_ + "/tokens"});
    server_->set_options(",ssd_capacity_bytes=0,log_level=warn,log_file=" + dir_ + "/log");
  }
  Server& server() { return *server_; }
  Endpoint endpoint() const { return server_->endpoint(); }
  const std::string& dir() const { return dir_; }
  std::string log() const { return ReadFile(dir_ + "/log"); }

 private:
  const std::string dir_;
  std::unique_ptr<Server> server_;
};

std::vector<Slice> Slices(const std::vector<std::string>& keys) {
  return std::vector<Slice>(keys.begin(), keys.end());
}

void PutAll(Transport* t, const Endpoint& ep, const std::vector<std::string>& keys,
            const std::string& value) {
  const std::vector<Slice> k = Slices(keys);
  std::vector<ValueParts> parts(keys.size(), ValueParts{Slice(value)});
  std::vector<int64_t> r;
  ASSERT_TRUE(t->BatchPut(ep, k, parts, &r).ok());
  for (int64_t x : r) ASSERT_EQ(x, 0);
}

// The keys of `keys` that `t` finds on the server (1/0 each).
std::vector<int64_t> Exists(Transport* t, const Endpoint& ep,
                            const std::vector<std::string>& keys) {
  std::vector<int64_t> r;
  Status s = t->BatchExists(ep, Slices(keys), &r);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

// Checks a refusal: PermissionDenied naming the tenant and the namespace, every key's
// result its code.
void ExpectDenied(const Status& s, const std::vector<int64_t>& results, const std::string& tenant,
                  const std::string& what) {
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  EXPECT_NE(s.message().find("tenant '" + tenant + "'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
  for (int64_t r : results) EXPECT_EQ(r, Status::PermissionDenied("").ErrorCode());
}

// The value of "name: N" in the server's kvengine.peers text.
uint64_t PeersStat(Transport* ops, const Endpoint& ep, const std::string& name) {
  std::string text;
  EXPECT_TRUE(ops->GetProperty(ep, "kvengine.peers", &text).ok());
  const std::string tag = "\n" + name + ": ";
  const size_t at = text.find(tag);
  if (at == std::string::npos) {
    ADD_FAILURE() << name << " not in " << text;
    return 0;
  }
  return std::stoull(text.substr(at + tag.size()));
}

// What `t`, a tenant of namespace `mine`, reads of the server's properties: `mine`'s
// figures, nothing of `others` (nor the DB's totals, nor the token file or the tenants'
// tokens).
void ExpectOnlyItsOwnFigures(Transport* t, const Endpoint& ep, const std::string& mine,
                             const std::vector<std::string>& others) {
  for (const char* name : {"kvengine.stats", "kvengine.stats.json", "kvengine.prometheus",
                           "kvengine.metrics", "kvengine.options"}) {
    std::string text;
    Status s = t->GetProperty(ep, name, &text);
    ASSERT_TRUE(s.ok()) << name << ": " << s.ToString();
    for (const std::string& other : others) {
      EXPECT_EQ(text.find("\"" + other + "\""), std::string::npos) << name << ": " << text;
      EXPECT_EQ(text.find("namespace." + other + "."), std::string::npos) << name << ": " << text;
    }
    for (const char* leak : {"tok-", "tokens", "peer_auth_token_file", "memory.items",
                             "kvengine_memory_items", "permission_denied"}) {
      EXPECT_EQ(text.find(leak), std::string::npos) << name << " shows " << leak << ": " << text;
    }
    if (std::string(name) != "kvengine.options") {
      EXPECT_NE(text.find(mine), std::string::npos) << name << ": " << text;
    }
  }
}

TEST(PeerTenantTest, EachTenantReadsAndDeletesOnlyItsOwnKeys) {
  TenantServer ts("tenants");
  ASSERT_TRUE(ts.server().Start());
  const Endpoint ep = ts.endpoint();
  auto ops = NewClient(kOps, 3000, "ops");
  auto alpha = NewClient(kAlpha, 3000, "alpha");
  // Beta presents its token without a name (a client of the old form): the server finds
  // whose it is.
  auto beta = NewClient(kBeta);
  const std::string a1 = InNamespace("ns-a", "k1"), a2 = InNamespace("ns-a", "k2");
  const std::string b1 = InNamespace("ns-b", "k1"), d1 = "k1";
  PutAll(ops.get(), ep, {a1, a2}, "alpha's");
  PutAll(ops.get(), ep, {b1, d1}, "beta's");

  // Reads: its own keys, never another's, whatever the call.
  std::vector<std::string> values;
  std::vector<int64_t> r;
  ASSERT_TRUE(alpha->BatchGetOwned(ep, Slices({a1, a2}), &values, &r).ok());
  EXPECT_EQ(values, (std::vector<std::string>{"alpha's", "alpha's"}));
  Status s = alpha->BatchGetOwned(ep, Slices({a1, b1}), &values, &r);
  ExpectDenied(s, r, "alpha", "namespace 'ns-b'");
  std::string buf(64, '\0');
  std::vector<Destination> dests = {{MutableSlice(buf.data(), buf.size())}};
  s = alpha->BatchGet(ep, Slices({d1}), dests, &r);
  ExpectDenied(s, r, "alpha", "the default namespace");
  EXPECT_EQ(buf, std::string(64, '\0'));  // nothing of the value arrived
  ExpectDenied(alpha->BatchExists(ep, Slices({b1}), &r), r, "alpha", "'ns-b'");
  ExpectDenied(alpha->BatchValueSize(ep, Slices({a1, b1}), &r), r, "alpha", "'ns-b'");
  EXPECT_EQ(Exists(alpha.get(), ep, {a1, a2}), (std::vector<int64_t>{1, 1}));
  ASSERT_TRUE(beta->BatchGetOwned(ep, Slices({b1, d1}), &values, &r).ok());
  EXPECT_EQ(values, (std::vector<std::string>{"beta's", "beta's"}));
  ExpectDenied(beta->BatchGetOwned(ep, Slices({a1}), &values, &r), r, "beta", "'ns-a'");

  // Writes: refused whole, nothing changed.
  std::vector<ValueParts> evil(2, ValueParts{Slice("evil")});
  const std::string a3 = InNamespace("ns-a", "k3");
  ExpectDenied(alpha->BatchPut(ep, Slices({a3, b1}), evil, &r), r, "alpha", "'ns-b'");
  ExpectDenied(alpha->BatchDelete(ep, Slices({b1}), &r), r, "alpha", "'ns-b'");
  ExpectDenied(alpha->BatchDelete(ep, Slices({d1}), &r), r, "alpha", "default");
  ASSERT_TRUE(ops->BatchGetOwned(ep, Slices({b1, d1, a3}), &values, &r).ok());
  EXPECT_EQ(values[0], "beta's");
  EXPECT_EQ(values[1], "beta's");
  EXPECT_EQ(r[2], Status::NotFound("").ErrorCode());  // not even alpha's own key of that batch
  PutAll(alpha.get(), ep, {a3}, "alpha's");

  // A tenant's properties show its namespaces' figures only (the same cut as an attached
  // client's, transport/figure_scope.h); one that describes the whole DB is refused.
  std::string text;
  ExpectOnlyItsOwnFigures(alpha.get(), ep, "ns-a", {"ns-b", "default"});
  ExpectOnlyItsOwnFigures(beta.get(), ep, "ns-b", {"ns-a"});
  s = alpha->GetProperty(ep, "kvengine.perf", &text);
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  EXPECT_NE(s.message().find("tenant 'alpha'"), std::string::npos) << s.ToString();
  // The operator's token reads the whole DB.
  ASSERT_TRUE(ops->GetProperty(ep, "kvengine.stats", &text).ok());
  EXPECT_NE(text.find("namespace.ns-b.memory_items: 1\n"), std::string::npos) << text;
  ASSERT_TRUE(ops->GetProperty(ep, "kvengine.options", &text).ok());
  EXPECT_NE(text.find("peer_auth_token_file="), std::string::npos) << text;

  // Deletes by pattern and DeleteAll touch the tenant's namespaces only.
  uint64_t deleted = 0;
  ASSERT_TRUE(alpha->DeleteByRegex(ep, "[\\x00-\\xff]*k[12]", &deleted).ok());
  EXPECT_EQ(deleted, 2u);  // a1, a2; not b1 or d1, which match too
  ASSERT_TRUE(alpha->DeleteAll(ep, &deleted).ok());
  EXPECT_EQ(deleted, 1u);  // a3
  EXPECT_EQ(Exists(ops.get(), ep, {a1, a2, a3, b1, d1}), (std::vector<int64_t>{0, 0, 0, 1, 1}));
  // A pattern that would close the group it is put in is refused, nothing removed.
  s = alpha->DeleteByRegex(ep, ")|(.*", &deleted);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(Exists(ops.get(), ep, {b1, d1}), (std::vector<int64_t>{1, 1}));
  PutAll(ops.get(), ep, {a1}, "alpha's");
  ASSERT_TRUE(beta->DeleteAll(ep, &deleted).ok());
  EXPECT_EQ(deleted, 2u);  // b1 and d1
  EXPECT_EQ(Exists(ops.get(), ep, {a1, b1, d1}), (std::vector<int64_t>{1, 0, 0}));
  // The operator's token is the DB's as a whole.
  ASSERT_TRUE(ops->DeleteAll(ep, &deleted).ok());
  EXPECT_EQ(deleted, 1u);

  // Every refusal counted, per tenant, in kvengine.peers and Prometheus; and logged.
  EXPECT_EQ(PeersStat(ops.get(), ep, "permission_denied.alpha"), 8u);
  EXPECT_EQ(PeersStat(ops.get(), ep, "permission_denied.beta"), 1u);
  EXPECT_EQ(PeersStat(ops.get(), ep, "permission_denied"), 9u);
  ASSERT_TRUE(ops->GetProperty(ep, "kvengine.metrics", &text).ok());
  EXPECT_NE(text.find("kvengine_peer_permission_denied_total{tenant=\"alpha\"} 8\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvengine_peer_permission_denied_total{tenant=\"beta\"} 1\n"),
            std::string::npos);
  const std::string log = ts.log();
  EXPECT_NE(log.find("refused a request of 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("tenant 'alpha' may not use namespace 'ns-b'"), std::string::npos) << log;
  // Rate-limited: one line per 10 s, however many refusals.
  size_t lines = 0;
  for (size_t at = log.find("refused a request"); at != std::string::npos;
       at = log.find("refused a request", at + 1)) {
    lines++;
  }
  EXPECT_EQ(lines, 1u) << log;
}

// The bits of the challenge `ep` sends at connect (its last byte), or -1.
int ChallengeBits(const Endpoint& ep) {
  int fd = -1;
  if (!ConnectTcp(ep, DeadlineIn(3000), &fd).ok()) return -1;
  char header[wire::kHeaderSize];
  std::vector<iovec> iov{{header, sizeof(header)}};
  wire::FrameHeader h;
  std::string meta;
  int bits = -1;
  if (ReadFully(fd, &iov, DeadlineIn(3000), nullptr).ok() &&
      wire::FrameHeader::DecodeFrom(header, &h).ok() && h.op == wire::kChallenge &&
      h.meta_len == wire::kNonceSize + 1) {
    meta.resize(h.meta_len);
    iov = {{meta.data(), meta.size()}};
    if (ReadFully(fd, &iov, DeadlineIn(3000), nullptr).ok()) bits = meta.back();
  }
  close(fd);
  return bits;
}

TEST(PeerTenantTest, HandDrivenRequestsAndTokensAreChecked) {
  TenantServer ts("raw");
  ASSERT_TRUE(ts.server().Start());
  const Endpoint ep = ts.endpoint();
  // A token required, and a tenant's name read.  (A server without a token sends 0:
  // clients built before tenants take any bit for "required";
  // TheOldSingleTokenFileStillMeansEveryNamespace checks it.)
  EXPECT_EQ(ChallengeBits(ep), wire::kChallengeTokenRequired | wire::kChallengeTakesTenant);
  // A token proves only its own tenant; an unknown name reads as a wrong token.
  EXPECT_TRUE(RawConn(ep, 3000, kAlpha, "alpha").ok());
  EXPECT_TRUE(RawConn(ep, 3000, kAlpha).ok());
  // The longest name fits the AUTH frame a server takes before authentication.
  EXPECT_TRUE(RawConn(ep, 3000, "tok-long-0123456789", std::string(64, 'L')).ok());
  EXPECT_FALSE(RawConn(ep, 3000, kBeta, "alpha").ok());
  EXPECT_FALSE(RawConn(ep, 3000, kAlpha, "gamma").ok());
  EXPECT_FALSE(RawConn(ep, 3000, "guess").ok());
  EXPECT_FALSE(RawConn(ep).ok());  // no token
  std::vector<int64_t> r;
  Status s = NewClient(kAlpha, 3000, "beta")->BatchExists(ep, Slices({"k"}), &r);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("authentication refused: wrong token"), std::string::npos)
      << s.ToString();
  auto ops = NewClient(kOps, 3000, "ops");
  EXPECT_EQ(PeersStat(ops.get(), ep, "refused_auth"), 5u);

  // The requests of the protocol that no Transport call makes alone.
  RawConn alpha(ep, 3000, kAlpha, "alpha");
  ASSERT_TRUE(alpha.ok());
  std::string b1 = InNamespace("ns-b", "k1");
  std::string keys;
  const std::vector<Slice> one = {Slice(b1)};
  wire::PutKeys(&keys, one, nullptr);
  for (uint8_t op : {wire::kLookup, wire::kPrefetch, wire::kExists}) {
    ASSERT_TRUE(alpha.Ask(op, keys, &s)) << int(op);
    EXPECT_TRUE(s.IsPermissionDenied()) << int(op) << " " << s.ToString();
    EXPECT_NE(s.message().find("'ns-b'"), std::string::npos) << s.ToString();
  }
  // One-sided reads would reach every namespace's values.
  ASSERT_TRUE(alpha.Ask(wire::kUcxConnect, "", &s));
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  // The attached clients' calls are not the peer protocol's: no tenant reaches them; and
  // the retired verbs transport's connect reaches nobody.
  for (uint8_t op : {wire::kLocate, wire::kReadRemovals, wire::kRdmaConnect}) {
    ASSERT_TRUE(alpha.Ask(op, keys, &s)) << int(op);
    EXPECT_TRUE(s.IsNotSupported()) << int(op) << " " << s.ToString();
  }
  EXPECT_EQ(PeersStat(ops.get(), ep, "permission_denied.alpha"), 4u);
}

// Issue #45 item 6: a tenant token's requests are bounded as an attached tenant's are.
// Alpha (ns-a, a 4 MiB memory quota) sends the patterns that crashed or stalled an owner
// -- through the client and raw on the wire -- and one batch of 40 x 1 MiB; beta's 24
// values in ns-b stay in memory, bit-exact, and the server stays up.
TEST(PeerTenantTest, ATenantsPatternsAndPutsAreBoundedAsAnAttachedOnesAre) {
  const std::string dir = TempDir("bounded");
  WriteFile(dir + "/tokens", kTenants);
  {
    std::unique_ptr<DB> db, handle;
    ASSERT_TRUE(DB::Open(ClientOptions("", PeerMode::kReadThrough), dir + "/db", &db).ok());
    NamespaceOptions quota;
    quota.memory_quota_bytes = 4 << 20;
    ASSERT_TRUE(db->CreateNamespace("ns-a", quota, &handle).ok());
    ASSERT_TRUE(db->CreateNamespace("ns-b", NamespaceOptions(), &handle).ok());
  }
  Server server(dir + "/db", FreePort(), {"--auth_token_file=" + dir + "/tokens"});
  server.set_options(",ssd_capacity_bytes=0");
  ASSERT_TRUE(server.Start());
  const Endpoint ep = server.endpoint();
  auto alpha = NewClient(kAlpha, 10000, "alpha");
  auto beta = NewClient(kBeta, 10000, "beta");
  std::vector<std::string> b_keys, b_values;
  std::mt19937_64 rng(45);
  for (int i = 0; i < 24; i++) {
    b_keys.push_back(InNamespace("ns-b", "b" + std::to_string(i)));
    b_values.push_back(RandomValue(&rng, 256 << 10));
  }
  std::vector<ValueParts> b_parts;
  for (const std::string& v : b_values) b_parts.push_back({Slice(v)});
  std::vector<int64_t> r;
  ASSERT_TRUE(beta->BatchPut(ep, Slices(b_keys), b_parts, &r).ok());
  ASSERT_EQ(r, std::vector<int64_t>(24, 0));

  for (const std::string& pattern : {std::string("[\\x00-\\xff]{9}(?:a?){16000}"),
                                     std::string("(?:a?){16000}"), std::string(10000, 'a')}) {
    uint64_t deleted = 0;
    Status s = alpha->DeleteByRegex(ep, pattern, &deleted);
    EXPECT_TRUE(s.IsInvalidArgument()) << pattern.substr(0, 40) << ": " << s.ToString();
  }
  RawConn raw(ep, 10000, kAlpha, "alpha");  // past the client's own length check
  ASSERT_TRUE(raw.ok());
  std::string meta;
  wire::PutDeleteMatching(&meta, wire::kMatchRegex, std::string(200000, 'a'));
  Status s;
  ASSERT_TRUE(raw.Ask(wire::kDeleteMatching, meta, &s));
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();

  std::vector<std::string> a_keys;
  for (int i = 0; i < 40; i++) a_keys.push_back(InNamespace("ns-a", "a" + std::to_string(i)));
  const std::string mib(1 << 20, 'a');
  std::vector<ValueParts> a_parts(40, ValueParts{Slice(mib)});
  alpha->BatchPut(ep, Slices(a_keys), a_parts, &r);
  ASSERT_EQ(r.size(), 40u);
  // A peer's batch is stored key by key: past the quota each key makes room by evicting
  // the namespace's own older values (attached batches reserve first and refuse the keys
  // past it); either way the namespace holds no more than its quota.
  for (int64_t x : r) EXPECT_TRUE(x == 0 || x == Status::NoSpace("").ErrorCode()) << x;
  std::string a_stats;
  ASSERT_TRUE(alpha->GetProperty(ep, "kvengine.stats", &a_stats).ok());
  const std::string held = "namespace.ns-a.memory_bytes: ";
  const size_t at = a_stats.find(held);
  ASSERT_NE(at, std::string::npos) << a_stats;
  EXPECT_LE(std::stoull(a_stats.substr(at + held.size())), 4u << 20) << a_stats;

  EXPECT_EQ(kill(server.pid(), 0), 0);
  std::vector<std::string> values;
  ASSERT_TRUE(beta->BatchGetOwned(ep, Slices(b_keys), &values, &r).ok());
  EXPECT_EQ(values, b_values);
  std::string text;
  ASSERT_TRUE(beta->GetProperty(ep, "kvengine.stats", &text).ok());
  EXPECT_NE(text.find("namespace.ns-b.memory_evictions: 0\n"), std::string::npos) << text;
}

TEST(PeerTenantTest, AClusterDBPresentsItsTenant) {
  TenantServer ts("cluster");
  ASSERT_TRUE(ts.server().Start());
  const std::string client_tokens = ts.dir() + "/alpha_tokens";
  WriteFile(client_tokens, "kvengine-tokens 1\ntenant alpha tok-alpha-0123456789 ns-a\n");
  // Sharded over the server alone: every key lives there.
  Options o = ClientOptions(ts.server().address(), PeerMode::kSharded);
  o.peer_timeout_ms = 2000;
  o.peer_auth_token_file = client_tokens;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(DB::Open(o, ts.dir() + "/cli", &db).ok());
  // The server's namespaces are the client's as far as its tenant goes (docs/cluster.md,
  // "Namespaces across the cluster"): ns-a, never ns-b; and it may not create any.
  std::unique_ptr<DB> a, b;
  ASSERT_TRUE(db->OpenNamespace("ns-a", &a).ok());
  EXPECT_TRUE(db->OpenNamespace("ns-b", &b).IsNotFound());
  Status s = db->CreateNamespace("ns-c", NamespaceOptions(), &b);
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  ASSERT_TRUE(a->Put(WriteOptions(), "x", "alpha's").ok());
  std::string v;
  ASSERT_TRUE(a->Get(ReadOptions(), "x", &v).ok());
  EXPECT_EQ(v, "alpha's");
  s = db->Put(WriteOptions(), "x", "not alpha's");
  EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
  EXPECT_NE(s.message().find("the default namespace"), std::string::npos) << s.ToString();
  std::vector<int64_t> r;
  // A batch routed to its owners fails each key with its owner's refusal.
  s = db->BatchExists(Slices({"x"}), &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r, std::vector<int64_t>{Status::PermissionDenied("").ErrorCode()});

  auto ops = NewClient(kOps, 3000, "ops");
  const std::string ax = InNamespace("ns-a", "x"), bx = InNamespace("ns-b", "x");
  PutAll(ops.get(), ts.endpoint(), {bx}, "beta's");
  uint64_t deleted = 0;
  ASSERT_TRUE(a->DeleteAll(&deleted).ok());
  EXPECT_EQ(deleted, 1u);
  EXPECT_EQ(Exists(ops.get(), ts.endpoint(), {ax, bx}), (std::vector<int64_t>{0, 1}));
}

// Runs kv_server with `token_file`; its exit status in *status, its output returned.
std::string RunServer(const std::string& dir, const std::string& token_file, int* status) {
  const std::string cmd = std::string(KV_SERVER_PATH) + " --db=" + dir +
                          "/db --listen=127.0.0.1:" + std::to_string(FreePort()) +
                          " --transport=tcp --options=memory_capacity_bytes=64MiB,"
                          "prefault_memory=false,ssd_capacity_bytes=0 --auth_token_file=" +
                          token_file + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(PeerTenantTest, ADamagedTokenFileStopsTheServerNamingTheLine) {
  const std::string dir = TempDir("damaged");
  const std::string file = dir + "/tokens";
  struct Case {
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"kvengine-tokens 1\ntenant a tok ns-a\ntenant b\n", "line 3"},
      {"kvengine-tokens 1\n\ntenant a tok bad/name\n", "line 3: namespace name"},
      {"kvengine-tokens 1\ntenant a tok ns-a\ntenant a tok2 ns-b\n",
       "named again (first on line 2)"},
      {"kvengine-tokens 1\ntenant a tok ns-a\n# c\ntenant b tok ns-b\n",
       "line 4: tenant 'b' has the token"},
      {"kvengine-tokens 1\nuser a tok ns-a\n", "line 2: 'user'"},
      {"kvengine-tokens 2\ntenant a tok ns-a\n", "line 1"},
      {"kvengine-tokens 1\n# nobody\n", "names no tenant"},
  };
  for (const Case& c : cases) {
    WriteFile(file, c.text);
    int status = 0;
    const std::string out = RunServer(dir, file, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << c.text;
    EXPECT_NE(out.find(c.want), std::string::npos) << c.text << "\n--\n" << out;
    EXPECT_NE(out.find(file), std::string::npos) << out;
  }
}

TEST(PeerTenantTest, TheOldSingleTokenFileStillMeansEveryNamespace) {
  const std::string dir = TempDir("oldform");
  WriteFile(dir + "/token", "s3cret-token\n");
  MakeDbWithTwoNamespaces(dir + "/db");
  Server server(dir + "/db", FreePort(), {"--auth_token_file=" + dir + "/token"});
  ASSERT_TRUE(server.Start());
  const Endpoint ep = server.endpoint();
  // A client of the old form, and one that names a tenant (the server ignores the name).
  for (const std::string& tenant : {std::string(), std::string("anyone")}) {
    auto c = NewClient("s3cret-token", 3000, tenant);
    const std::vector<std::string> keys = {InNamespace("ns-a", "k"), InNamespace("ns-b", "k"), "k"};
    PutAll(c.get(), ep, keys, "v");
    std::string text;
    EXPECT_TRUE(c->GetProperty(ep, "kvengine.stats", &text).ok());
    uint64_t deleted = 0;
    ASSERT_TRUE(c->DeleteAll(ep, &deleted).ok());
    EXPECT_EQ(deleted, 3u) << tenant;
  }
  std::vector<int64_t> r;
  EXPECT_FALSE(NewClient("guess")->BatchExists(ep, Slices({"k"}), &r).ok());
  EXPECT_EQ(ChallengeBits(ep), wire::kChallengeTokenRequired | wire::kChallengeTakesTenant);
  Server open(dir + "/open", FreePort());
  ASSERT_TRUE(open.Start());
  EXPECT_EQ(ChallengeBits(open.endpoint()), 0);
}

// ---------------------------------------------------------------- the parser

// The cut itself, on answers shaped as the DB gives them: names with dots, a namespace
// only a peer's keys named (id:<hex>), the default one, and every form of a property.
TEST(FigureScopeTest, CutsEachFormToTheScopesNamespaces) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(ns::IdOf("x.y")));
  const std::string foreign = std::string("id:") + hex;
  const FigureScope scope = FigureScope::Of("uid 7", false, {"a.b", "x.y", ""});
  EXPECT_TRUE(scope.Shows("a.b") && scope.Shows("default") && scope.Shows(foreign));
  EXPECT_FALSE(scope.Shows("a") || scope.Shows("id:0000000000000001") || scope.Shows("id:"));
  std::string text =
      "** kvengine stats **\nmemory.items: 9\nnamespace.a.b.hits: 1\n"
      "namespace.a.hits: 2\nnamespace.default.hits: 3\nnamespace." +
      foreign + ".hits: 4\nnamespace.id:0000000000000001.hits: 5\nlocal.x: 6\n";
  ASSERT_TRUE(scope.Admit("kvengine.stats").ok());
  scope.Filter("kvengine.stats", &text);
  EXPECT_EQ(text,
            "** kvengine stats **\nnamespace.a.b.hits: 1\nnamespace.default.hits: 3\n"
            "namespace." +
                foreign + ".hits: 4\n");
  text =
      "{\"memory\":{\"items\":9},\"namespaces\":{\"a\":{\"hits\":2},\"a.b\":{\"hits\":1,"
      "\"misses\":0},\"default\":{\"hits\":3}},\"local\":{\"x\":6}}";
  scope.Filter("kvengine.stats.json", &text);
  EXPECT_EQ(text, "{\"namespaces\":{\"a.b\":{\"hits\":1,\"misses\":0},\"default\":{\"hits\":3}}}");
  text = "{\"memory\":{\"items\":9}}";  // a DB without namespaces
  scope.Filter("kvengine.stats.json", &text);
  EXPECT_EQ(text, "{}");
  text =
      "# HELP kvengine_memory_items Items.\n# TYPE kvengine_memory_items gauge\n"
      "kvengine_memory_items 9\n# HELP kvengine_namespace_hits_total Hits.\n"
      "# TYPE kvengine_namespace_hits_total counter\n"
      "kvengine_namespace_hits_total{namespace=\"a\"} 2\n"
      "kvengine_namespace_hits_total{namespace=\"a.b\"} 1\n";
  scope.Filter("kvengine.prometheus", &text);
  EXPECT_EQ(text,
            "# HELP kvengine_namespace_hits_total Hits.\n"
            "# TYPE kvengine_namespace_hits_total counter\n"
            "kvengine_namespace_hits_total{namespace=\"a.b\"} 1\n");
  text =
      "memory_capacity_bytes=1\nlocal_allowed_uids=uid:1=a\npeer_auth_token_file=/t\n"
      "peers=h:1\ncluster=etcd://u:p@h\nlisten=h:2\nmetrics_listen=3\nlog_file=/l\n"
      "local_listen_group=g\nmax_key_size=4";
  scope.Filter("kvengine.options", &text);
  EXPECT_EQ(text, "memory_capacity_bytes=1\nmax_key_size=4\n");
  const Status s = scope.Admit("kvengine.perf");
  EXPECT_TRUE(s.IsPermissionDenied());
  EXPECT_NE(s.message().find("uid 7"), std::string::npos) << s.ToString();
  EXPECT_TRUE(scope.Admit("kvengine.some_future_property").IsPermissionDenied());
  // The whole DB's scope reads everything as it is.
  const FigureScope whole;
  text = "local_allowed_uids=uid:1=a\n";
  ASSERT_TRUE(whole.Admit("kvengine.perf").ok());
  whole.Filter("kvengine.options", &text);
  EXPECT_EQ(text, "local_allowed_uids=uid:1=a\n");
  // Every namespace without the whole DB: every namespace's figures, no totals.
  const FigureScope every = FigureScope::Of("uid 8", true, {});
  text = "memory.items: 9\nnamespace.a.hits: 2\n";
  every.Filter("kvengine.stats", &text);
  EXPECT_EQ(text, "namespace.a.hits: 2\n");
}

TEST(TenantTokensTest, ParsesTenantsAndTheOldForm) {
  std::vector<TenantEntry> e;
  ASSERT_TRUE(ParseTenantTokens(kTenants, "f", &e).ok());
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].name, "alpha");
  EXPECT_EQ(e[0].token, kAlpha);
  EXPECT_EQ(e[0].namespaces, std::vector<std::string>{"ns-a"});
  EXPECT_FALSE(e[0].default_namespace);
  EXPECT_EQ(e[1].line, 5);
  EXPECT_TRUE(e[1].default_namespace);
  EXPECT_TRUE(e[2].every_namespace);
  // The old form: the whole file, trailing newlines and spaces dropped.
  ASSERT_TRUE(ParseTenantTokens("one token \r\n\n", "f", &e).ok());
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].token, "one token");
  EXPECT_EQ(e[0].name, "");
  EXPECT_TRUE(e[0].every_namespace);
  Status s = ParseTenantTokens(" \n", "f", &e);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_EQ(e.size(), 1u);  // unchanged
  // What a client presents: the first tenant.
  const std::string dir = TempDir("parse");
  WriteFile(dir + "/t", kTenants);
  std::string token, tenant;
  ASSERT_TRUE(ReadAuthTokenFile(dir + "/t", &token, &tenant).ok());
  EXPECT_EQ(token, kAlpha);
  EXPECT_EQ(tenant, "alpha");
  EXPECT_TRUE(ReadAuthTokenFile(dir + "/missing", &token).IsInvalidArgument());
}

TEST(TenantTokensTest, PermitAndRestrictKeepToTheTenantsNamespaces) {
  std::vector<TenantEntry> e;
  ASSERT_TRUE(ParseTenantTokens(kTenants, "f", &e).ok());
  TenantTable table(e);
  const Tenant* alpha = table.tenants()[0].get();
  const Tenant* beta = table.tenants()[1].get();
  const std::string a = InNamespace("ns-a", "k"), b = InNamespace("ns-b", "k");
  const std::string other = InNamespace("ns-z", "k");
  std::vector<Slice> keys = {Slice(a)};
  EXPECT_TRUE(alpha->Permit(keys).ok());
  keys = {Slice(a), Slice(other)};
  Status s = alpha->Permit(keys);
  EXPECT_TRUE(s.IsPermissionDenied());
  EXPECT_NE(s.message().find("namespace of id 0x"), std::string::npos) << s.ToString();
  const std::string short_key("\xfe\x01", 2);
  keys = {Slice(short_key)};
  EXPECT_TRUE(alpha->Permit(keys).IsPermissionDenied());
  EXPECT_TRUE(beta->Permit(keys).IsPermissionDenied());
  keys = {Slice("plain")};
  EXPECT_TRUE(beta->Permit(keys).ok());
  EXPECT_TRUE(table.tenants()[2]->Permit(keys).ok());

  // Restrict: the pattern's keys within the tenant's namespaces only.
  for (const auto& [tenant, key, want] :
       std::vector<std::tuple<const Tenant*, std::string, bool>>{{alpha, a, true},
                                                                 {alpha, b, false},
                                                                 {alpha, "k", false},
                                                                 {alpha, other, false},
                                                                 {beta, b, true},
                                                                 {beta, "k", true},
                                                                 {beta, a, false}}) {
    KeyPattern re;
    ASSERT_TRUE(re.Compile(tenant->Restrict("[\\x00-\\xff]*k")).ok());
    EXPECT_EQ(re.Matches(key), want) << tenant->name() << " " << key;
  }
  // The nonce's proof finds the tenant, by name or by trying each.
  const std::string nonce(wire::kNonceSize, 'n');
  EXPECT_EQ(table.Authenticate(nonce, "beta", wire::AuthProof(nonce, kBeta)), beta);
  EXPECT_EQ(table.Authenticate(nonce, "", wire::AuthProof(nonce, kBeta)), beta);
  EXPECT_EQ(table.Authenticate(nonce, "alpha", wire::AuthProof(nonce, kBeta)), nullptr);
  EXPECT_EQ(table.Authenticate(nonce, "nobody", wire::AuthProof(nonce, "")), nullptr);
  // The AUTH request's forms: none, a proof, a proof and a name; anything else malformed.
  bool has_proof = true;
  uint64_t proof = 0;
  std::string_view name;
  EXPECT_TRUE(wire::GetAuth("", &has_proof, &proof, &name) && !has_proof);
  std::string auth;
  wire::PutAuth(&auth, 42, "beta");
  ASSERT_TRUE(wire::GetAuth(auth, &has_proof, &proof, &name));
  EXPECT_TRUE(has_proof);
  EXPECT_EQ(proof, 42u);
  EXPECT_EQ(name, "beta");
  EXPECT_FALSE(
      wire::GetAuth(std::string_view(auth).substr(0, auth.size() - 1), &has_proof, &proof, &name));
  EXPECT_FALSE(wire::GetAuth(auth + "x", &has_proof, &proof, &name));
  EXPECT_FALSE(wire::GetAuth("1234", &has_proof, &proof, &name));
}

}  // namespace
}  // namespace kvengine
