// Namespaces of attached clients bound by their credentials (Options::local_allowed_uids,
// docs/attach.md "Namespaces and credentials"): the owner is this process, the clients
// are this binary re-executed, each dropping to a uid (and groups) of its own before it
// attaches, so that the owner sees real SO_PEERCRED / SO_PEERGROUPS credentials over a
// real Unix socket.  The tests that need other uids skip when not run as root.
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attach/local_access.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/json_check.h"
#include "test/raw_attach_client.h"
#include "test/test_util.h"
#ifdef KV_SERVER_PATH
#include "test/peer_harness.h"
#endif
#include "util/namespace_key.h"

namespace kvengine {
namespace {

// uid 1001: tenantA only; uid 1002: tenantB and the default namespace; group 3000 (a
// supplementary group of uid 1003): tenantE, with admin; uid 1004: a plain entry, as
// before maps existed: everything, admin.  (';' separates entries as ',' does.)
constexpr char kGrants[] = "uid:1001=tenantA,uid:1002=tenantB+default;gid:3000=tenantE+@admin,1004";

// An owner serving `socket`, granting kGrants.
Options OwnerOptions(const std::string& socket) {
  Options o = test::AttachOwnerOptions(socket);
  o.local_allowed_uids = kGrants;
  return o;
}

Options ClientOptions() { return test::AttachClientOptions(); }

// ------------------------------------------------------------------ children

// What a child checks, and how many refusals it provoked (each one request to the owner).
class Checks {
 public:
  void Expect(bool ok, const std::string& what) {
    if (!ok && failure_.empty()) failure_ = what;
  }
  void ExpectOk(const Status& s, const std::string& what) {
    Expect(s.ok(), what + ": " + s.ToString());
  }
  // `s` must be PermissionDenied naming `named` (counted: the owner must count it too).
  void ExpectDenied(const Status& s, const std::string& what, const std::string& named) {
    refusals_++;
    Expect(s.IsPermissionDenied() && s.message().find(named) != std::string::npos,
           what + " should be PermissionDenied naming " + named + ", is " + s.ToString());
  }
  // Writes "ok N" or the first failure to `path`; the exit code.
  int Report(const std::string& path) const {
    std::ofstream out(path);
    if (failure_.empty()) {
      out << "ok " << refusals_ << "\n";
      return 0;
    }
    out << failure_ << "\n";
    std::fprintf(stderr, "child: %s\n", failure_.c_str());
    return 1;
  }

 private:
  std::string failure_;
  int refusals_ = 0;
};

// Drops to uid `uid`, primary group `uid`, supplementary groups `groups`.
bool DropTo(uid_t uid, const std::vector<gid_t>& groups) {
  return setgroups(groups.size(), groups.data()) == 0 && setgid(uid) == 0 && setuid(uid) == 0;
}

std::string Value(const std::string& ns, const std::string& key) { return ns + ":" + key; }

// Every call of the DB API on the handle of namespace `mine`: each sees `mine`'s keys
// only, whatever `other` holds under the same names.  The owner stored k1, shared and
// only-<ns> in both namespaces.
void UseOwnNamespace(DB* h, const std::string& mine, const std::string& other, Checks* c) {
  std::string v;
  c->ExpectOk(h->Get(ReadOptions(), "k1", &v), "Get k1");
  c->Expect(v == Value(mine, "k1"), "Get k1 read " + v);
  c->Expect(h->Get(ReadOptions(), "only-" + other, &v).IsNotFound(), "Get of only-other");
  // A key spelled as the other namespace's internal key is just a key of this one.
  const std::string forged = ns::Prefix(ns::IdOf(other)) + "k1";
  c->Expect(h->Get(ReadOptions(), forged, &v).IsNotFound(), "Get of a forged key");
  uint64_t size = 0;
  c->ExpectOk(h->GetValueSize("shared", &size), "GetValueSize");
  c->Expect(size == Value(mine, "shared").size(), "GetValueSize size");

  const std::string only_other = "only-" + other;  // the slices below point into it
  const std::vector<Slice> keys{"k1", "shared", only_other};
  char b[3][64];
  std::vector<Destination> dests;
  for (auto& buf : b) dests.push_back({MutableSlice(buf, sizeof(buf))});
  std::vector<int64_t> r;
  c->ExpectOk(h->BatchGetInto(ReadOptions(), keys, dests, &r), "BatchGetInto");
  c->Expect(r.size() == 3 && r[0] == static_cast<int64_t>(Value(mine, "k1").size()) &&
                std::string(b[0], r[0]) == Value(mine, "k1") &&
                std::string(b[1], r[1]) == Value(mine, "shared") &&
                r[2] == Status::NotFound("").ErrorCode(),
            "BatchGetInto results");
  c->ExpectOk(h->BatchExists(keys, &r), "BatchExists");
  c->Expect(r == std::vector<int64_t>{1, 1, 0}, "BatchExists results");
  c->ExpectOk(h->BatchLocate(keys, &r), "BatchLocate");
  c->Expect(r.size() == 3 && r[0] == kLocatedMemory && r[2] == kLocatedAbsent,
            "BatchLocate results");
  c->ExpectOk(h->Prefetch(keys, &r), "Prefetch");

  c->ExpectOk(h->Put(WriteOptions(), "new-" + mine, "v"), "Put");
  const std::vector<Slice> put_keys{"b1", "b2"};
  const std::vector<ValueParts> values{{"x", "y"}, {"z"}};
  c->ExpectOk(h->BatchPut(WriteOptions(), put_keys, values, &r), "BatchPut");
  c->Expect(r == std::vector<int64_t>{0, 0}, "BatchPut results");
  c->ExpectOk(h->Delete(WriteOptions(), "k1"), "Delete k1");
  const std::vector<Slice> gone{only_other};
  c->ExpectOk(h->BatchDelete(WriteOptions(), gone, &r), "BatchDelete");
  c->Expect(r.size() == 1 && r[0] == Status::NotFound("").ErrorCode(), "BatchDelete of only-other");
  uint64_t deleted = 0;
  c->ExpectOk(h->DeleteByRegex("shared|only-.*", &deleted), "DeleteByRegex");
  c->Expect(deleted == 2, "DeleteByRegex removed " + std::to_string(deleted) + ", not 2");

  RemovalBatch feed;
  c->ExpectOk(h->ReadRemovals(0, 1000, &feed), "ReadRemovals");
  std::set<std::string> removed;
  for (const RemovalEvent& e : feed.events) removed.insert(e.key);
  c->Expect(removed == std::set<std::string>{"k1", "shared", "only-" + mine},
            "ReadRemovals reported " + std::to_string(removed.size()) + " keys, not its 3");

  c->ExpectOk(h->DeleteAll(&deleted), "DeleteAll");
  c->Expect(deleted == 3, "DeleteAll removed " + std::to_string(deleted) + ", not its 3");
  std::string name;
  c->Expect(h->GetProperty("kvengine.namespace", &name) && name == mine, "kvengine.namespace");
}

// Every call of the default namespace, from a client whose grant lacks it.
void RefusedInDefault(DB* db, Checks* c) {
  const std::string named = "the default namespace";
  std::string v;
  std::vector<int64_t> r;
  const std::vector<Slice> keys{"d"};
  char buf[16];
  const std::vector<Destination> dests{{MutableSlice(buf, sizeof(buf))}};
  const std::vector<ValueParts> values{{"v"}};
  uint64_t n = 0;
  RemovalBatch feed;
  c->ExpectDenied(db->Get(ReadOptions(), "d", &v), "Get", named);
  c->ExpectDenied(db->Put(WriteOptions(), "d", "v"), "Put", named);
  c->ExpectDenied(db->Delete(WriteOptions(), "d"), "Delete", named);
  c->ExpectDenied(db->GetValueSize("d", &n), "GetValueSize", named);
  c->ExpectDenied(db->BatchGetInto(ReadOptions(), keys, dests, &r), "BatchGetInto", named);
  c->ExpectDenied(db->BatchPut(WriteOptions(), keys, values, &r), "BatchPut", named);
  c->ExpectDenied(db->BatchExists(keys, &r), "BatchExists", named);
  c->ExpectDenied(db->BatchDelete(WriteOptions(), keys, &r), "BatchDelete", named);
  c->ExpectDenied(db->BatchLocate(keys, &r), "BatchLocate", named);
  c->ExpectDenied(db->Prefetch(keys, &r), "Prefetch", named);
  c->ExpectDenied(db->DeleteByRegex(".*", &n), "DeleteByRegex", named);
  c->ExpectDenied(db->DeleteAll(&n), "DeleteAll", named);
  c->ExpectDenied(db->ReadRemovals(0, 100, &feed), "ReadRemovals", named);
}

// A tenant: uid `uid`, namespace `mine`; `other` is a namespace it may not name.
int TenantMain(const std::string& socket, uid_t uid, const std::string& mine,
               const std::string& other, const std::string& out) {
  if (!DropTo(uid, {})) return 3;
  Checks c;
  std::unique_ptr<DB> db, h, refused;
  Status s = DB::Attach(ClientOptions(), socket, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "tenant: attach: %s\n", s.ToString().c_str());
    return 2;
  }
  c.ExpectOk(db->OpenNamespace(mine, &h), "OpenNamespace " + mine);
  if (h != nullptr) UseOwnNamespace(h.get(), mine, other, &c);
  c.ExpectDenied(db->OpenNamespace(other, &refused), "OpenNamespace " + other, "'" + other + "'");
  c.Expect(refused == nullptr, "a refused OpenNamespace left a handle");
  c.ExpectDenied(db->CreateNamespace(mine, NamespaceOptions(), &refused), "CreateNamespace " + mine,
                 "'" + mine + "'");
  c.ExpectDenied(db->CreateNamespace("tenantZ", NamespaceOptions(), &refused),
                 "CreateNamespace tenantZ", "'tenantZ'");
  c.ExpectDenied(db->DropNamespace(other, nullptr), "DropNamespace " + other, "'" + other + "'");
  c.ExpectDenied(db->DropNamespace(mine, nullptr), "DropNamespace " + mine, "'" + mine + "'");
  std::vector<NamespaceInfo> listed;
  c.ExpectOk(db->ListNamespaces(&listed), "ListNamespaces");
  c.Expect(listed.size() == 1 && listed[0].name == mine, "ListNamespaces shows another's");
  std::string v;
  if (mine == "tenantA") {  // uid 1001: no default namespace
    RefusedInDefault(db.get(), &c);
  } else {  // uid 1002: the default namespace too, whose DeleteAll spares every namespace
    c.ExpectOk(db->Get(ReadOptions(), "d", &v), "Get d");
    c.Expect(v == Value("default", "d"), "Get d read " + v);
    uint64_t deleted = 0;
    c.ExpectOk(db->DeleteAll(&deleted), "DeleteAll of the default namespace");
    c.Expect(deleted == 2, "DeleteAll of default removed " + std::to_string(deleted) + ", not 2");
  }
  return c.Report(out);
}

// uid 1003 in supplementary group 3000, which grants tenantE with admin.
int GroupAdminMain(const std::string& socket, const std::string& out) {
  if (!DropTo(1003, {3000})) return 3;
  Checks c;
  std::unique_ptr<DB> db, h, refused;
  Status s = DB::Attach(ClientOptions(), socket, &db);
  if (!s.ok()) return 2;
  c.ExpectOk(db->CreateNamespace("tenantE", NamespaceOptions(), &h), "CreateNamespace tenantE");
  if (h == nullptr) return c.Report(out);
  c.ExpectOk(h->Put(WriteOptions(), "e", "ee"), "Put in tenantE");
  std::string v;
  c.ExpectOk(h->Get(ReadOptions(), "e", &v), "Get in tenantE");
  c.ExpectDenied(db->CreateNamespace("tenantF", NamespaceOptions(), &refused),
                 "CreateNamespace tenantF", "'tenantF'");
  c.ExpectDenied(db->DropNamespace("tenantA", nullptr), "DropNamespace tenantA", "'tenantA'");
  c.ExpectDenied(db->OpenNamespace("tenantA", &refused), "OpenNamespace tenantA", "'tenantA'");
  std::vector<NamespaceInfo> listed;
  c.ExpectOk(db->ListNamespaces(&listed), "ListNamespaces");
  c.Expect(listed.size() == 1 && listed[0].name == "tenantE", "ListNamespaces");
  uint64_t deleted = 0;
  c.ExpectOk(db->DropNamespace("tenantE", &deleted), "DropNamespace tenantE");
  c.Expect(deleted == 1, "DropNamespace removed " + std::to_string(deleted) + ", not 1");
  c.Expect(h->Get(ReadOptions(), "e", &v).IsAborted(), "a dropped namespace's handle");
  return c.Report(out);
}

// uid 1004, a plain entry: every namespace and admin, as a plain list always meant.
int PlainMain(const std::string& socket, const std::string& out) {
  if (!DropTo(1004, {})) return 3;
  Checks c;
  std::unique_ptr<DB> db, h;
  Status s = DB::Attach(ClientOptions(), socket, &db);
  if (!s.ok()) return 2;
  c.ExpectOk(db->Put(WriteOptions(), "plain", "p"), "Put in default");
  c.ExpectOk(db->CreateNamespace("tenantP", NamespaceOptions(), &h), "CreateNamespace");
  c.ExpectOk(db->OpenNamespace("tenantA", &h), "OpenNamespace tenantA");
  std::vector<NamespaceInfo> listed;
  c.ExpectOk(db->ListNamespaces(&listed), "ListNamespaces");
  c.Expect(listed.size() == 2, "ListNamespaces lists " + std::to_string(listed.size()));
  c.ExpectOk(db->DropNamespace("tenantP", nullptr), "DropNamespace");
  return c.Report(out);
}

// uid 1005, which no entry names: refused at connect.
int UnnamedMain(const std::string& socket, const std::string& out) {
  if (!DropTo(1005, {})) return 3;
  Checks c;
  std::unique_ptr<DB> db;
  Status s = DB::Attach(ClientOptions(), socket, &db);
  c.Expect(!s.ok() && s.message().find("refused: uid 1005") != std::string::npos,
           "attach of an unnamed uid: " + s.ToString());
  return c.Report(out);
}

// uid 1001 against one kv_server's two trust domains: refused on `a` (no grant there),
// served on `b`.
int DomainsMain(const std::string& a, const std::string& b, const std::string& out) {
  if (!DropTo(1001, {})) return 3;
  Checks c;
  std::unique_ptr<DB> db;
  Status s = DB::Attach(ClientOptions(), a, &db);
  c.Expect(!s.ok() && s.message().find("refused: uid 1001") != std::string::npos,
           "attach to the other domain: " + s.ToString());
  c.ExpectOk(DB::Attach(ClientOptions(), b, &db), "attach to its domain");
  if (db != nullptr) c.ExpectOk(db->Put(WriteOptions(), "from-1001", "v"), "Put");
  return c.Report(out);
}

// ------------------------------------------------------------------ quotas bound reservations

// Issue #45 item 3: tenant B's values, and what tenant A (memory quota kQuotaA) sends.
constexpr uint64_t kQuotaA = 16 << 20;
constexpr int kBValues = 24;
constexpr uint64_t kMiB = 1 << 20;

// B's value i: sizes 16 KiB to 512 KiB (5 MiB in all), every byte derived from i.
std::string BValue(int i) {
  static const size_t kSizes[] = {16 << 10, 64 << 10, 256 << 10, 512 << 10};
  std::string v(kSizes[i % 4], '\0');
  for (size_t j = 0; j < v.size(); j++) v[j] = static_cast<char>((j * 131 + i * 7) >> 3);
  return v;
}

// uid 1002: puts B's values into tenantB.
int QuotaFillBMain(const std::string& socket, const std::string& out) {
  if (!DropTo(1002, {})) return 3;
  Checks c;
  std::unique_ptr<DB> db, b;
  if (!DB::Attach(ClientOptions(), socket, &db).ok()) return 2;
  c.ExpectOk(db->OpenNamespace("tenantB", &b), "OpenNamespace tenantB");
  for (int i = 0; b != nullptr && i < kBValues; i++) {
    c.ExpectOk(b->Put(WriteOptions(), "b" + std::to_string(i), BValue(i)),
               "Put b" + std::to_string(i));
  }
  return c.Report(out);
}

// `results` are OK for the first `ok` keys and NoSpace for the rest.
void ExpectFirstFit(const std::vector<int64_t>& results, size_t ok, const std::string& what,
                    Checks* c) {
  size_t fit = 0, refused = 0;
  for (size_t i = 0; i < results.size(); i++) {
    if (results[i] == 0 && i == fit) fit++;
    if (results[i] == Status::NoSpace("").ErrorCode() && i >= ok) refused++;
  }
  c->Expect(fit == ok && fit + refused == results.size(),
            what + ": " + std::to_string(fit) + " keys in before the first refusal and " +
                std::to_string(refused) + " refused NoSpace past the quota, of " +
                std::to_string(results.size()) + " (expected " + std::to_string(ok) + " in)");
}

// A stats figure seen from an attached client (the stats are the whole DB's).
uint64_t ClientStat(DB* db, const std::string& name) {
  std::string text;
  if (!db->GetProperty("kvengine.stats", &text)) return ~0ull;
  const size_t at = text.find("\n" + name + ": ");
  return at == std::string::npos ? ~0ull : std::stoull(text.substr(at + name.size() + 3));
}

// uid 1001, bound to tenantA (quota kQuotaA), tries `scenario` on the owner.
int QuotaAttackMain(const std::string& socket, const std::string& scenario,
                    const std::string& out) {
  if (!DropTo(1001, {})) return 3;
  Checks c;
  std::unique_ptr<DB> db, a;
  if (!DB::Attach(ClientOptions(), socket, &db).ok()) return 2;
  c.ExpectOk(db->OpenNamespace("tenantA", &a), "OpenNamespace tenantA");
  if (a == nullptr) return c.Report(out);
  auto batch = [&](const std::string& prefix, int n, size_t size, std::vector<int64_t>* r) {
    std::vector<std::string> names;
    for (int i = 0; i < n; i++) names.push_back(prefix + std::to_string(i));
    const std::vector<Slice> keys(names.begin(), names.end());
    const std::string value(size, prefix[0]);
    const std::vector<ValueParts> values(n, ValueParts{value});
    c.ExpectOk(a->BatchPut(WriteOptions(), keys, values, r), "BatchPut " + prefix);
  };
  std::vector<int64_t> r;
  if (scenario == "batch") {
    // One batch of 90 x 1 MiB over a 16 MiB quota: 16 in, 74 refused.  Again, at its
    // quota: its own values make room for 16 more.
    batch("x", 90, kMiB, &r);
    ExpectFirstFit(r, kQuotaA / kMiB, "the first 90 x 1 MiB batch", &c);
    batch("y", 90, kMiB, &r);
    ExpectFirstFit(r, kQuotaA / kMiB, "the second 90 x 1 MiB batch", &c);
  } else if (scenario == "reserve") {
    // 90 RESERVEs of 1 MiB held uncommitted: 16 charged to tenantA, 74 refused.
    test::RawClient raw;
    c.ExpectOk(raw.Connect(socket), "raw connect");
    c.ExpectOk(raw.Use("tenantA"), "raw USE tenantA");
    std::vector<int64_t> reserved;
    for (int i = 0; i < 90; i++) {
      char* slot = nullptr;
      uint64_t id = 0;
      reserved.push_back(raw.Reserve("r" + std::to_string(i), kMiB, &slot, &id).ErrorCode());
    }
    ExpectFirstFit(reserved, kQuotaA / kMiB, "90 reservations of 1 MiB", &c);
    const uint64_t charged = ClientStat(db.get(), "namespace.tenantA.memory_reserved_bytes");
    c.Expect(charged == kQuotaA, "tenantA's reservations charged " + std::to_string(charged));
    // While they are held, a put of tenantA has no room either, and says whose.
    const Status full = a->Put(WriteOptions(), "p", std::string(kMiB, 'p'));
    c.Expect(full.IsNoSpace() && full.ToString().find("namespace 'tenantA'") != std::string::npos &&
                 full.ToString().find("quota") != std::string::npos,
             "a put while tenantA's reservations fill its quota: " + full.ToString());
  } else if (scenario == "single") {
    // Single 1 MiB puts: each in, by evicting tenantA's own; then 300 x 64 KiB: the 256
    // that fit 16 MiB in, the rest refused.
    for (int i = 0; i < 40; i++) {
      c.ExpectOk(a->Put(WriteOptions(), "s" + std::to_string(i), std::string(kMiB, 's')),
                 "Put s" + std::to_string(i));
    }
    batch("t", 300, 64 << 10, &r);
    ExpectFirstFit(r, kQuotaA / (64 << 10), "the 300 x 64 KiB batch", &c);
  } else {
    return 4;
  }
  const uint64_t held = ClientStat(db.get(), "namespace.tenantA.memory_bytes") +
                        ClientStat(db.get(), "namespace.tenantA.memory_reserved_bytes");
  c.Expect(held <= kQuotaA, "tenantA holds " + std::to_string(held) + " bytes");
  return c.Report(out);
}

// uid 1001 (tenantA only, no '@admin'): every property, its JSON and Prometheus forms,
// ListNamespaces and its namespace's removal feed show its own namespace and nothing of
// the others' (issue #45): no name, figure or count of tenantB or tenantC, no DB-wide
// totals, and no option naming who may connect.  The owner removed one key of tenantA
// and `others` keys of the other namespaces.
int FiguresMain(const std::string& socket, int others, const std::string& out) {
  if (!DropTo(1001, {})) return 3;
  Checks c;
  std::unique_ptr<DB> db, h;
  Status s = DB::Attach(ClientOptions(), socket, &db);
  if (!s.ok()) return 2;
  auto shows_nothing_else = [&c](const std::string& what, const std::string& text) {
    for (const char* leak :
         {"tenantB", "tenantC", "local_allowed_uids", "uid:100", "1002", "memory.items",
          "kvengine_memory_items", "local.", "kvengine_local", "\"memory\"", "\"local\""}) {
      c.Expect(text.find(leak) == std::string::npos, what + " shows " + leak + ": " + text);
    }
  };
  std::string text;
  c.Expect(db->GetProperty("kvengine.stats", &text), "kvengine.stats");
  shows_nothing_else("kvengine.stats", text);
  c.Expect(text.find("namespace.tenantA.memory_items: 2\n") != std::string::npos,
           "kvengine.stats lacks tenantA's figures: " + text);
  c.Expect(db->GetProperty("kvengine.stats.json", &text), "kvengine.stats.json");
  shows_nothing_else("kvengine.stats.json", text);
  std::string error;
  c.Expect(test::JsonChecker::Valid(text, &error), "kvengine.stats.json: " + error + ": " + text);
  c.Expect(text.find("{\"namespaces\":{\"tenantA\":{") == 0, "kvengine.stats.json: " + text);
  for (const char* prom :
       {"kvengine.stats.prometheus", "kvengine.prometheus", "kvengine.metrics"}) {
    c.Expect(db->GetProperty(prom, &text), prom);
    shows_nothing_else(prom, text);
    // kvengine.metrics is the client's own counters (answered by the client itself).
    if (std::string(prom) != "kvengine.metrics") {
      c.Expect(text.find("kvengine_namespace_memory_items{namespace=\"tenantA\"} 2\n") !=
                   std::string::npos,
               std::string(prom) + " lacks tenantA's figures: " + text);
    }
  }
  c.Expect(db->GetProperty("kvengine.options", &text), "kvengine.options");
  shows_nothing_else("kvengine.options", text);
  c.Expect(text.find("memory_capacity_bytes=") != std::string::npos, "kvengine.options: " + text);
  c.Expect(db->GetProperty("kvengine.readiness", &text), "kvengine.readiness");
  // The perf histograms and the peers' state count every tenant's calls.
  for (const char* whole : {"kvengine.perf", "kvengine.perf.json", "kvengine.peers"}) {
    c.Expect(!db->GetProperty(whole, &text), std::string(whole) + " answered: " + text);
  }
  std::vector<NamespaceInfo> listed;
  c.ExpectOk(db->ListNamespaces(&listed), "ListNamespaces");
  c.Expect(listed.size() == 1 && listed[0].name == "tenantA", "ListNamespaces shows another's");
  c.ExpectOk(db->OpenNamespace("tenantA", &h), "OpenNamespace tenantA");
  if (h != nullptr) {
    RemovalBatch feed;
    c.ExpectOk(h->ReadRemovals(0, 100, &feed), "ReadRemovals");
    c.Expect(feed.last_sequence == 1 && feed.missed == 0 && feed.events.size() == 1 &&
                 feed.events[0].sequence == 1 && feed.events[0].key == "k1",
             "tenantA's feed counts the others' " + std::to_string(others) +
                 " removals: last_sequence " + std::to_string(feed.last_sequence));
    c.Expect(h->GetProperty("kvengine.stats", &text), "kvengine.stats of the handle");
    shows_nothing_else("kvengine.stats of the handle", text);
  }
  return c.Report(out);
}

// The child's report: its refusals, or -1 (and the failure in *text).
int Refusals(const std::string& path, std::string* text) {
  std::ifstream in(path);
  std::getline(in, *text);
  if (text->rfind("ok ", 0) != 0) return -1;
  return std::stoi(text->substr(3));
}

uint64_t Stat(DB* db, const std::string& name) { return test::StatOf(db, name); }

// ------------------------------------------------------------------ tests

// An owner's directory, socket and log lines, for the fixtures whose clients run under
// other uids.
struct TenantOwner {
  // The owner's options: its directory reachable by the clients' uids (the grant, not
  // the file mode, is what is tested), a socket any uid may connect to, every log line
  // at `level` or above kept.
  Options MakeOptions(LogLevel level) {
    std::filesystem::create_directories(dir.Sub("db"));
    chmod(dir.path().c_str(), 0755);
    chmod(dir.Sub("db").c_str(), 0755);
    Options o = OwnerOptions(socket);
    o.local_listen_mode = "0666";
    o.log_level = level;
    o.log_callback = [this](LogLevel, const std::string& line) {
      std::lock_guard<std::mutex> lock(lines_mu);
      lines.push_back(line);
    };
    return o;
  }
  // The lines logged so far that contain `part`.
  int LogLines(const std::string& part) {
    std::lock_guard<std::mutex> lock(lines_mu);
    return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.find(part) != std::string::npos;
    }));
  }

  test::TempDir dir;
  const std::string socket = dir.Sub("db") + "/kv.sock";
  std::mutex lines_mu;
  std::vector<std::string> lines;
};

class AttachNamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
    Options o = host_.MakeOptions(LogLevel::kInfo);
    Status s = DB::Open(o, host_.dir.Sub("db"), &owner_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    if (owner_ != nullptr) {
      EXPECT_TRUE(owner_->Close().ok());
    }
  }
  // Puts k1, shared and only-<name> into namespace `name` (created).
  void Fill(const std::string& name, std::unique_ptr<DB>* h) {
    ASSERT_TRUE(owner_->CreateNamespace(name, NamespaceOptions(), h).ok());
    for (const std::string& k : {std::string("k1"), std::string("shared"), "only-" + name}) {
      ASSERT_TRUE((*h)->Put(WriteOptions(), k, Value(name, k)).ok());
    }
  }
  // Runs the children at once; their refusals added up, or a failure.
  void RunChildren(const std::vector<std::vector<std::string>>& children, int* refusals) {
    std::vector<pid_t> pids;
    for (size_t i = 0; i < children.size(); i++) {
      std::vector<std::string> args = children[i];
      const std::string report = host_.dir.Sub("child" + std::to_string(i));
      std::ofstream(report).close();
      chmod(report.c_str(), 0666);  // written by the child's uid
      args.push_back(report);
      pids.push_back(test::SpawnSelf(args));
    }
    *refusals = 0;
    for (size_t i = 0; i < pids.size(); i++) {
      EXPECT_EQ(test::WaitExit(pids[i]), 0) << children[i][0];
      std::string text;
      const int n = Refusals(host_.dir.Sub("child" + std::to_string(i)), &text);
      EXPECT_GE(n, 0) << children[i][0] << ": " << text;
      *refusals += std::max(n, 0);
    }
  }

  TenantOwner host_;
  std::unique_ptr<DB> owner_;
};

// Two tenants with different credentials at once on one owner with two namespaces (and a
// third neither may use, and the default one): each reads and deletes only its own keys
// whatever call it makes; every refusal is PermissionDenied naming the namespace,
// counted once by the owner and logged.
TEST_F(AttachNamespaceTest, TenantsReachOnlyTheirOwnKeysWhateverTheCall) {
  std::unique_ptr<DB> a, b, c;
  Fill("tenantA", &a);
  Fill("tenantB", &b);
  Fill("tenantC", &c);
  for (const std::string k : {"d", "k1"}) {
    ASSERT_TRUE(owner_->Put(WriteOptions(), k, Value("default", k)).ok());
  }
  RemovalBatch feed;
  ASSERT_TRUE(owner_->ReadRemovals(0, 0, &feed).ok());  // the feed records from here on
  int refusals = 0;
  RunChildren({{"--tenant", host_.socket, "1001", "tenantA", "tenantB"},
               {"--tenant", host_.socket, "1002", "tenantB", "tenantA"}},
              &refusals);
  EXPECT_GT(refusals, 13);  // A: every call of the default namespace, and admin
  EXPECT_EQ(Stat(owner_.get(), "local.namespace_refusals"), static_cast<uint64_t>(refusals));
  EXPECT_GE(host_.LogLines("refused a request of attached client"), 1);
  EXPECT_GE(host_.LogLines("PermissionDenied: uid 100"), 1);
  // Each tenant emptied its own namespace and (B) the default one; tenantC is untouched.
  std::vector<Slice> keys{"k1", "shared", "only-tenantC"};
  std::vector<int64_t> r;
  ASSERT_TRUE(c->BatchExists(keys, &r).ok());
  EXPECT_EQ(r, (std::vector<int64_t>{1, 1, 1}));
  std::string v;
  ASSERT_TRUE(c->Get(ReadOptions(), "k1", &v).ok());
  EXPECT_EQ(v, Value("tenantC", "k1"));
  for (DB* db : {a.get(), b.get(), owner_.get()}) {
    uint64_t left = 1;
    ASSERT_TRUE(db->DeleteAll(&left).ok());
    EXPECT_EQ(left, 0u);
  }
  std::string prom;
  ASSERT_TRUE(owner_->GetProperty("kvengine.prometheus", &prom));
  EXPECT_NE(
      prom.find("\nkvengine_local_namespace_refusals_total " + std::to_string(refusals) + "\n"),
      std::string::npos);
}

// A client without '@admin' reads its own namespace's figures only, in every form a
// property has, and its namespace's removal feed numbers its own events (issue #45);
// the owner still sees the whole DB.
TEST_F(AttachNamespaceTest, AClientSeesOnlyItsOwnNamespacesFigures) {
  std::unique_ptr<DB> a, b, c;
  Fill("tenantA", &a);
  Fill("tenantB", &b);
  Fill("tenantC", &c);
  RemovalBatch feed;
  ASSERT_TRUE(a->ReadRemovals(0, 0, &feed).ok());  // the feed records from here on
  ASSERT_TRUE(b->Delete(WriteOptions(), "k1").ok());
  ASSERT_TRUE(b->Delete(WriteOptions(), "shared").ok());
  ASSERT_TRUE(c->Delete(WriteOptions(), "k1").ok());
  ASSERT_TRUE(a->Delete(WriteOptions(), "k1").ok());
  int refusals = 0;
  RunChildren({{"--figures", host_.socket, "3"}}, &refusals);
  EXPECT_EQ(refusals, 0);
  std::string text;
  ASSERT_TRUE(owner_->GetProperty("kvengine.stats", &text));
  EXPECT_NE(text.find("namespace.tenantB.memory_items: 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("local.clients_accepted: "), std::string::npos) << text;
  ASSERT_TRUE(owner_->GetProperty("kvengine.options", &text));
  EXPECT_NE(text.find(std::string("local_allowed_uids=") + kGrants), std::string::npos) << text;
}

// A supplementary group's grant, with admin: the client creates, uses and drops its own
// namespace and nothing else; a plain uid entry still allows everything.
TEST_F(AttachNamespaceTest, AGroupGrantsItsNamespacesAndAPlainUidEverything) {
  std::unique_ptr<DB> a;
  Fill("tenantA", &a);
  int refusals = 0;
  RunChildren({{"--group-admin", host_.socket}}, &refusals);
  EXPECT_EQ(refusals, 3);
  EXPECT_EQ(Stat(owner_.get(), "local.namespace_refusals"), 3u);
  std::unique_ptr<DB> h;
  EXPECT_TRUE(owner_->OpenNamespace("tenantE", &h).IsNotFound());  // dropped by the client
  RunChildren({{"--plain", host_.socket}}, &refusals);
  EXPECT_EQ(refusals, 0);
  std::string v;
  ASSERT_TRUE(owner_->Get(ReadOptions(), "plain", &v).ok());
  ASSERT_TRUE(a->Get(ReadOptions(), "k1", &v).ok());
}

// A uid that no entry names (nor a group of it) cannot attach at all.
TEST_F(AttachNamespaceTest, AnUnnamedUidIsRefused) {
  int refusals = 0;
  RunChildren({{"--unnamed", host_.socket}}, &refusals);
  EXPECT_EQ(Stat(owner_.get(), "local.clients_refused"), 1u);
  EXPECT_EQ(host_.LogLines("local_allowed_uids names neither its uid nor its groups"), 1);
}

// A namespace's value only on SSD reaches an attached handle through the owner's staging
// read, which goes through the namespace too: each namespace reads its own "k".
TEST(AttachNamespaceSsdTest, AValueOnSsdIsReadThroughItsNamespace) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.Sub("db"));
  Options o = OwnerOptions(dir.Sub("db") + "/kv.sock");
  o.memory_capacity_bytes = 8 << 20;
  o.ssd_capacity_bytes = 64 << 20;
  o.offload_policy = OffloadPolicy::kWriteThrough;
  o.log_level = LogLevel::kError;
  std::unique_ptr<DB> owner, a;
  ASSERT_TRUE(DB::Open(o, dir.Sub("db"), &owner).ok());
  ASSERT_TRUE(owner->CreateNamespace("a", NamespaceOptions(), &a).ok());
  ASSERT_TRUE(a->Put(WriteOptions(), "k", "a's").ok());
  ASSERT_TRUE(owner->Put(WriteOptions(), "k", "default's").ok());
  ASSERT_TRUE(owner->Flush().ok());
  a.reset();
  ASSERT_TRUE(owner->Close().ok());
  ASSERT_TRUE(DB::Open(o, dir.Sub("db"), &owner).ok());  // the memory tier starts empty
  std::unique_ptr<DB> client, h;
  ASSERT_TRUE(DB::Attach(ClientOptions(), o.local_listen, &client).ok());
  ASSERT_TRUE(client->OpenNamespace("a", &h).ok());
  std::vector<Slice> keys{"k"};
  std::vector<int64_t> r;
  ASSERT_TRUE(h->BatchLocate(keys, &r).ok());
  EXPECT_EQ(r[0], kLocatedSsd);
  std::string v;
  ASSERT_TRUE(h->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "a's");
  ASSERT_TRUE(client->Get(ReadOptions(), "k", &v).ok());
  EXPECT_EQ(v, "default's");
  ASSERT_TRUE(owner->Close().ok());
}

// An attached handle's puts are charged to its namespace (the owner maps their keys
// before it reserves and commits): its memory quota holds, by evicting its own values,
// and the default namespace's value stays.
TEST(AttachNamespaceQuotaTest, AnAttachedHandlesPutsKeepToItsQuota) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.Sub("db"));
  Options o = OwnerOptions(dir.Sub("db") + "/kv.sock");
  std::unique_ptr<DB> owner, client, h;
  ASSERT_TRUE(DB::Open(o, dir.Sub("db"), &owner).ok());
  ASSERT_TRUE(owner->Put(WriteOptions(), "keep", std::string(256 << 10, 'd')).ok());
  NamespaceOptions quota;
  quota.memory_quota_bytes = 1 << 20;
  ASSERT_TRUE(DB::Attach(ClientOptions(), o.local_listen, &client).ok());
  ASSERT_TRUE(client->CreateNamespace("q", quota, &h).ok());
  const std::string value(256 << 10, 'q');
  for (int i = 0; i < 16; i++) {
    ASSERT_TRUE(h->Put(WriteOptions(), "v" + std::to_string(i), value).ok()) << i;
  }
  EXPECT_LE(Stat(owner.get(), "namespace.q.memory_bytes"), 1u << 20);
  EXPECT_GT(Stat(owner.get(), "namespace.q.memory_bytes"), 0u);
  EXPECT_GT(Stat(owner.get(), "namespace.q.quota_evictions"), 0u);
  std::string v;
  EXPECT_TRUE(h->Get(ReadOptions(), "v15", &v).ok());
  EXPECT_TRUE(owner->Get(ReadOptions(), "keep", &v).ok());
  ASSERT_TRUE(owner->Close().ok());
}

// Issue #45 item 3, "quotas bound reservations", with real clients under two uids: tenant
// B (uid 1002) holds 24 values, 5 MiB, well within its share; the default namespace fills
// the rest of a 96 MiB tier (most over its share).  Tenant A (uid 1001, a 16 MiB memory
// quota) then sends a scenario: whatever it is, every value of B stays in memory,
// bit-exact, and A's keys past its quota fail NoSpace, which the owner logs naming
// tenantA and its quota.  With and without an SSD tier (memory only: an eviction
// deletes for good).
class AttachQuotaTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
    Options o = host_.MakeOptions(LogLevel::kWarn);
    o.memory_capacity_bytes = 96 << 20;
    if (GetParam()) {
      o.ssd_capacity_bytes = 512 << 20;
      o.offload_policy = OffloadPolicy::kWriteBack;
    }
    ASSERT_TRUE(DB::Open(o, host_.dir.Sub("db"), &owner_).ok());
    NamespaceOptions quota;
    quota.memory_quota_bytes = kQuotaA;
    std::unique_ptr<DB> h;
    ASSERT_TRUE(owner_->CreateNamespace("tenantA", quota, &h).ok());
    ASSERT_TRUE(owner_->CreateNamespace("tenantB", NamespaceOptions(), &b_).ok());
    ASSERT_EQ(RunChild({"--quota-fill-b", host_.socket}), "ok 0");
    // The default namespace's values, newer than B's, fill the tier but for 2 MiB.
    const std::string filler(kMiB, 'f');
    for (int i = 0;
         Stat(owner_.get(), "memory.allocated_bytes") + 3 * kMiB <= o.memory_capacity_bytes; i++) {
      ASSERT_TRUE(owner_->Put(WriteOptions(), "f" + std::to_string(i), filler).ok());
    }
    ExpectBInMemory("after the filler");
  }
  void TearDown() override {
    b_.reset();
    if (owner_ != nullptr) {
      EXPECT_TRUE(owner_->Close().ok());
    }
  }
  // Runs this binary as a child with `args` and a report file; its report.
  std::string RunChild(std::vector<std::string> args) {
    const std::string report = host_.dir.Sub("report" + std::to_string(children_++));
    std::ofstream(report).close();
    chmod(report.c_str(), 0666);
    args.push_back(report);
    EXPECT_EQ(test::WaitExit(test::SpawnSelf(args)), 0) << args[0];
    std::ifstream in(report);
    std::string text;
    std::getline(in, text);
    return text;
  }
  // Every value of B is in the memory tier, bit-exact.
  void ExpectBInMemory(const std::string& when) {
    std::vector<std::string> names;
    for (int i = 0; i < kBValues; i++) names.push_back("b" + std::to_string(i));
    const std::vector<Slice> keys(names.begin(), names.end());
    std::vector<int64_t> where;
    ASSERT_TRUE(b_->BatchLocate(keys, &where).ok());
    int in_memory = 0;
    for (int i = 0; i < kBValues; i++) {
      in_memory += where[i] == kLocatedMemory;
      std::string v;
      Status s = b_->Get(ReadOptions(), names[i], &v);
      EXPECT_TRUE(s.ok() && v == BValue(i)) << when << ": b" << i << ": " << s.ToString();
    }
    EXPECT_EQ(in_memory, kBValues) << when;
    EXPECT_EQ(Stat(owner_.get(), "namespace.tenantB.memory_evictions"), 0u) << when;
  }
  void Attack(const std::string& scenario) {
    EXPECT_EQ(RunChild({"--quota-attack", host_.socket, scenario}), "ok 0") << scenario;
    ExpectBInMemory("after tenantA's " + scenario);
    EXPECT_LE(Stat(owner_.get(), "namespace.tenantA.memory_bytes"), kQuotaA);
    EXPECT_GT(Stat(owner_.get(), "namespace.tenantA.quota_rejections"), 0u);
    EXPECT_GE(host_.LogLines("namespace tenantA is at its memory quota"), 1) << scenario;
  }

  TenantOwner host_;
  std::unique_ptr<DB> owner_, b_;
  int children_ = 0;
};

// (a) One batch of 90 x 1 MiB over the 16 MiB quota, twice.
TEST_P(AttachQuotaTest, ABatchPastTheQuotaFailsForItsKeysPastItAlone) { Attack("batch"); }

// (b) 90 RESERVEs of 1 MiB held uncommitted: charged to tenantA as they are made
// (memory_reserved_bytes), refused past its quota, given back with the connection.
TEST_P(AttachQuotaTest, HeldReservationsAreChargedToTheirNamespace) {
  Attack("reserve");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Stat(owner_.get(), "namespace.tenantA.memory_reserved_bytes") != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Stat(owner_.get(), "namespace.tenantA.memory_reserved_bytes"), 0u);
}

// (c) Single 1 MiB puts (each in: tenantA's own values make room), then one batch of
// 300 x 64 KiB (the 256 that fit the quota in).
TEST_P(AttachQuotaTest, SinglePutsAndSmallValuesKeepToTheQuota) { Attack("single"); }

INSTANTIATE_TEST_SUITE_P(Tiers, AttachQuotaTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "WithSsd" : "MemoryOnly");
                         });

// ------------------------------------------------------------------ trust domains

#ifdef KV_SERVER_PATH
// One kv_server serving two trust domains (docs/attach.md): two directories, arenas and
// sockets, each with its own options and grant.  A client of one socket sees nothing of
// the other's store; uid 1001, granted on one only, is refused by the other.
TEST(KvServerDomainsTest, TwoArenas) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  chmod(dir.path().c_str(), 0755);
  const std::string sa = dir.Sub("a.sock"), sb = dir.Sub("b.sock");
  Server server(dir.Sub("a"), test::FreePort(),
                {"--local_listen=" + sa, "--db=" + dir.Sub("b"), "--local_listen=" + sb,
                 "--options=memory_capacity_bytes=32MiB,prefault_memory=false,ssd_capacity_"
                 "bytes=0,log_level=error,local_listen_mode=0666,local_allowed_uids=uid:1001=*"});
  server.set_options(",ssd_capacity_bytes=0,local_listen_mode=0666");
  ASSERT_TRUE(server.Start());
  std::unique_ptr<DB> a, b;
  ASSERT_TRUE(DB::Attach(ClientOptions(), sa, &a).ok());
  // The second DB opens after the first's "serving" line.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!DB::Attach(ClientOptions(), sb, &b).ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Put(WriteOptions(), "k", "in a").ok());
  std::string v;
  EXPECT_TRUE(b->Get(ReadOptions(), "k", &v).IsNotFound());
  EXPECT_EQ(Stat(a.get(), "memory.capacity_bytes"), 64ull << 20);
  EXPECT_EQ(Stat(b.get(), "memory.capacity_bytes"), 32ull << 20);
  if (geteuid() == 0) {
    const std::string report = dir.Sub("report");
    std::ofstream(report).close();
    chmod(report.c_str(), 0666);
    EXPECT_EQ(test::WaitExit(test::SpawnSelf({"--domains", sa, sb, report})), 0);
    std::string text;
    EXPECT_EQ(Refusals(report, &text), 0) << text;
    EXPECT_TRUE(b->Get(ReadOptions(), "from-1001", &v).ok());
    EXPECT_TRUE(a->Get(ReadOptions(), "from-1001", &v).IsNotFound());
  }
  a.reset();
  b.reset();
  kill(server.pid(), SIGTERM);  // both DBs drain and close
  int status = -1;
  ASSERT_TRUE(server.Wait(&status));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}
#endif  // KV_SERVER_PATH

// ------------------------------------------------------------------ the grammar

TEST(LocalAccessTest, BadEntriesFailOpenNamingTheEntry) {
  for (const char* bad : {"uid:abc", "uid:1001=", "uid:1001=te$t", "gid:5=tenantA+@root", "user:5",
                          "1001,uid:-1", "uid:99999999999", "uid:1001=a++b"}) {
    test::TempDir dir;
    std::filesystem::create_directories(dir.Sub("db"));
    Options o = OwnerOptions(dir.Sub("db") + "/kv.sock");
    o.local_allowed_uids = bad;
    std::unique_ptr<DB> db;
    Status s = DB::Open(o, dir.Sub("db"), &db);
    EXPECT_TRUE(s.IsInvalidArgument()) << bad << ": " << s.ToString();
    // The entry named is the bad one.
    std::string entry(bad);
    if (entry.find(',') != std::string::npos) entry = entry.substr(entry.find(',') + 1);
    EXPECT_NE(s.message().find("entry '" + entry + "'"), std::string::npos) << s.ToString();
    EXPECT_FALSE(std::filesystem::exists(o.local_listen)) << bad;
  }
}

TEST(LocalAccessTest, GrantsAddUpAndThePlainListMeansEverything) {
  LocalAccess access;
  ASSERT_TRUE(LocalAccess::Parse(" ", 500, &access).IsInvalidArgument());
  ASSERT_TRUE(
      LocalAccess::Parse("1001,uid:1002=a+b,gid:7=c+default,gid:8=@admin,uid:1002=d", 500, &access)
          .ok());
  LocalGrant g;
  LocalPeer peer;
  peer.uid = 1001;
  ASSERT_TRUE(access.Admit(peer, &g));
  EXPECT_TRUE(g.every && g.admin);
  peer.uid = 1002;
  peer.gid = 7;
  ASSERT_TRUE(access.Admit(peer, &g));
  EXPECT_EQ(g.ToString(), "default+a+b+c+d");
  EXPECT_TRUE(g.Allows("") && g.Allows("a") && !g.Allows("e") && !g.admin);
  peer.groups = {9, 8};
  ASSERT_TRUE(access.Admit(peer, &g));
  EXPECT_TRUE(g.admin);
  peer = LocalPeer();
  peer.uid = 1003;
  peer.gid = 1003;
  EXPECT_FALSE(access.Admit(peer, &g));
  peer.groups = {7};
  ASSERT_TRUE(access.Admit(peer, &g));
  EXPECT_EQ(g.ToString(), "default+c");
  for (uid_t always : {0u, 500u}) {
    peer = LocalPeer();
    peer.uid = always;
    ASSERT_TRUE(access.Admit(peer, &g));
    EXPECT_TRUE(g.every && g.admin);
  }
}

}  // namespace
}  // namespace kvengine

int main(int argc, char** argv) {
  if (argc >= 2) {
    const std::string mode = argv[1];
    if (mode == "--tenant" && argc == 7) {
      return kvengine::TenantMain(argv[2], static_cast<uid_t>(std::stoul(argv[3])), argv[4],
                                  argv[5], argv[6]);
    }
    if (mode == "--group-admin" && argc == 4) return kvengine::GroupAdminMain(argv[2], argv[3]);
    if (mode == "--plain" && argc == 4) return kvengine::PlainMain(argv[2], argv[3]);
    if (mode == "--figures" && argc == 5) {
      return kvengine::FiguresMain(argv[2], std::stoi(argv[3]), argv[4]);
    }
    if (mode == "--unnamed" && argc == 4) return kvengine::UnnamedMain(argv[2], argv[3]);
    if (mode == "--domains" && argc == 5) return kvengine::DomainsMain(argv[2], argv[3], argv[4]);
    if (mode == "--quota-fill-b" && argc == 4) return kvengine::QuotaFillBMain(argv[2], argv[3]);
    if (mode == "--quota-attack" && argc == 5) {
      return kvengine::QuotaAttackMain(argv[2], argv[3], argv[4]);
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
