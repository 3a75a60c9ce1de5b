// DeleteByRegex's patterns (issue #45 item 1; util/key_pattern.h): one check in one
// place, RE2's linear-time matcher, and no lock held while keys are matched.
//
// The attacks of the issue run as real processes: a kv_server owner, a tenant's client
// under uid 1001 that sends the patterns that crashed or stalled it (200,000 'a's,
// `(?:a?){16000}`, the 27-byte `[\x00-\xff]{9}(?:a?){16000}`), and a neighbour under uid
// 1002 whose BatchExists calls must stay within their deadline meanwhile.  The children
// are this binary re-executed; the tests that need other uids skip when not run as root.
#include "util/key_pattern.h"

#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"
#include "util/namespace_key.h"
#ifdef KV_SERVER_PATH
#include "test/peer_harness.h"
#endif

namespace kvengine {
namespace {

// The patterns of the issue that crashed (the first) or stalled (the others) an owner.
std::vector<std::string> HostilePatterns() {
  return {std::string(200000, 'a'), "(?:a?){16000}", "[\\x00-\\xff]{9}(?:a?){16000}",
          "((((((((((a{1000}){1000}){1000}){1000}){1000}){1000}){1000}){1000}){1000}){1000})",
          "(?:[\\x00-\\xff]{0,1000}a)(?:[\\x00-\\xff]{0,1000}a)(?:[\\x00-\\xff]{0,1000}a)"};
}

// ------------------------------------------------------------------ the pattern alone

TEST(KeyPatternTest, RefusalsAreInvalidArgumentNamingThePatternShortenedAndWhy) {
  const struct {
    std::string pattern;
    const char* why;
  } cases[] = {
      {"", "is empty"},
      {std::string(200000, 'a'), "longer than the limit of 4096 bytes"},
      {"(", "malformed"},
      {"a)|(b", "malformed"},
      {"(a)\\1", "malformed"},
      {"a\\Qb)", "its \\Q quote is not ended by \\E"},
      {"a(?=b)", "lookaheads and lookbehinds are not supported"},
      {"(?=a)a", "lookaheads and lookbehinds are not supported"},
      {"(?:a?){16000}", "invalid repetition size"},
      {"((a{1000}){1000}){1000}", "invalid repetition size"},
      {"(?:[\\x00-\\xff]{0,1000}a)(?:[\\x00-\\xff]{0,1000}a)(?:[\\x00-\\xff]{0,1000}a)",
       "instructions, over the limit of 4096"},
  };
  for (const auto& c : cases) {
    Status s = KeyPattern::Check(c.pattern);
    ASSERT_TRUE(s.IsInvalidArgument()) << c.pattern.substr(0, 80) << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.why), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("pattern '" + c.pattern.substr(0, 20)), std::string::npos)
        << s.ToString();
    EXPECT_LT(s.message().size(), 400u) << "the pattern is shortened: " << s.ToString().size();
  }
  Status s = KeyPattern::Check(std::string(5000, 'a'));
  EXPECT_NE(s.message().find("(5000 bytes)"), std::string::npos) << s.ToString();
  // A layer's scoped pattern may be longer than a user's, up to the wire's limit.
  KeyPattern p;
  std::string escaped;  // 8000 bytes, 2000 instructions
  for (int i = 0; i < 2000; i++) escaped += "\\x61";
  EXPECT_TRUE(p.Compile(escaped).ok());
  EXPECT_TRUE(p.Compile(std::string(KeyPattern::kMaxScopedLength + 1, 'a')).IsInvalidArgument());
}

TEST(KeyPatternTest, NoPatternOfAnyLengthCrashesTheCompiler) {
  // std::regex recursed once per character: these overflowed the stack.
  for (const std::string& pattern : {std::string(KeyPattern::kMaxScopedLength, 'a'),
                                     std::string(KeyPattern::kMaxScopedLength / 2, '(') +
                                         std::string(KeyPattern::kMaxScopedLength / 2, ')'),
                                     std::string(KeyPattern::kMaxScopedLength / 3, '(') + "a" +
                                         std::string(KeyPattern::kMaxScopedLength / 3, ')'),
                                     [] {
                                       std::string alternatives;
                                       for (int i = 0; i < 3000; i++) alternatives += "a|";
                                       return alternatives + "b";
                                     }()}) {
    KeyPattern p;
    Status s = p.Compile(pattern);
    if (s.ok()) p.Matches(std::string(4096, 'a'));
    EXPECT_TRUE(s.ok() || s.IsInvalidArgument()) << s.ToString();
  }
  for (const std::string& pattern : HostilePatterns()) {
    KeyPattern p;
    EXPECT_TRUE(p.Compile(pattern).IsInvalidArgument()) << pattern.substr(0, 80);
  }
}

TEST(KeyPatternTest, MatchesWholeKeysByteByByte) {
  KeyPattern p;
  ASSERT_TRUE(p.Compile("layer\\.[0-9]+").ok());
  EXPECT_TRUE(p.Matches("layer.17"));
  EXPECT_FALSE(p.Matches("layer.17x"));
  EXPECT_FALSE(p.Matches("xlayer.17"));
  ASSERT_TRUE(p.Compile("[\\x80-\\xff]+").ok());
  EXPECT_TRUE(p.Matches("\x80\xff\xfe"));
  EXPECT_FALSE(p.Matches("\x7f"));
  ASSERT_TRUE(p.Compile("[\\x00-\\xff]*").ok());
  EXPECT_TRUE(p.Matches(std::string("a\0b\n\xfe", 5)));
  ASSERT_TRUE(p.Compile("a.c").ok());
  EXPECT_TRUE(
      p.Matches("a\xe9"
                "c"));  // a byte is one character (Latin-1), not UTF-8
  EXPECT_FALSE(p.Matches("a\nc"));
  // A 1 MiB key against a pattern that backtracking matchers take exponential time on.
  ASSERT_TRUE(p.Compile("(a*)*b").ok());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(p.Matches(std::string(1 << 20, 'a')));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// The layers scope a pattern with a leading lookahead: the key begins with a match of
// the scope, and the whole key matches the rest.
TEST(KeyPatternTest, ALeadingLookaheadScopesTheRest) {
  KeyPattern p;
  ASSERT_TRUE(p.Compile("(?=ab|x)(?:[a-z]+)").ok());
  EXPECT_TRUE(p.Matches("abc"));
  EXPECT_TRUE(p.Matches("xyz"));
  EXPECT_FALSE(p.Matches("ba"));
  EXPECT_FALSE(p.Matches("ab1"));
  ASSERT_TRUE(p.Compile("(?=[^\\xfe])(?:.*)").ok());  // the default namespace's scope
  EXPECT_TRUE(p.Matches("k"));
  EXPECT_FALSE(
      p.Matches("\xfe"
                "k"));
  ASSERT_TRUE(p.Compile("(?=[)(]|\\))(?:.*)").ok());  // a class and an escape in the scope
  EXPECT_TRUE(p.Matches(")x"));
  EXPECT_FALSE(p.Matches("x)"));
  EXPECT_TRUE(p.Compile("(?=a").IsInvalidArgument());
  EXPECT_TRUE(p.Compile("(?=a)b(?=c)").IsInvalidArgument());  // only the leading one
  // Scoped to a namespace, a pattern matches that namespace's keys only.
  const uint64_t id = ns::IdOf("tenantA");
  std::string scoped;
  ASSERT_TRUE(ns::PatternInNamespace(id, "[\\x00-\\xff]*k", &scoped).ok());
  ASSERT_TRUE(p.Compile(scoped).ok());
  EXPECT_TRUE(p.Matches(ns::Prefix(id) + "k"));
  EXPECT_FALSE(p.Matches(ns::Prefix(ns::IdOf("tenantB")) + "k"));
  EXPECT_FALSE(p.Matches("k"));
  ASSERT_TRUE(p.Compile(ns::PatternInDefault("[\\x00-\\xff]*k")).ok());
  EXPECT_TRUE(p.Matches("k"));
  EXPECT_FALSE(p.Matches(ns::Prefix(id) + "k"));
  EXPECT_TRUE(ns::PatternInNamespace(id, "\\Ak", &scoped).IsInvalidArgument());
  // A leading '^' a quantifier applies to (found by the fuzz target): it still compiles
  // in the namespace, meaning what it means alone.
  ASSERT_TRUE(ns::PatternInNamespace(id, "^*ab|z", &scoped).ok());
  ASSERT_TRUE(p.Compile(scoped).ok());
  EXPECT_TRUE(p.Matches(ns::Prefix(id) + "ab"));
  EXPECT_FALSE(p.Matches(ns::Prefix(id) + "b"));
}

// ------------------------------------------------------------------ through a DB

Status OpenMemoryOnly(const test::TempDir& dir, uint64_t capacity, std::unique_ptr<DB>* db) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = capacity;
  o.ssd_capacity_bytes = 0;
  o.prefault_memory = false;
  std::filesystem::create_directories(dir.path());
  return DB::Open(o, dir.Sub("db"), db);
}

TEST(KeyPatternDBTest, EveryDoorRefusesTheHostilePatternsAndChangesNothing) {
  test::TempDir dir;
  std::unique_ptr<DB> db, ns;
  ASSERT_TRUE(OpenMemoryOnly(dir, 64ull << 20, &db).ok());
  ASSERT_TRUE(db->CreateNamespace("tenantA", NamespaceOptions(), &ns).ok());
  ASSERT_TRUE(db->Put(WriteOptions(), "aaaa", "v").ok());
  ASSERT_TRUE(ns->Put(WriteOptions(), "aaaa", "v").ok());
  for (const std::string& pattern : HostilePatterns()) {
    for (DB* door : {db.get(), ns.get()}) {
      uint64_t deleted = 7;
      Status s = door->DeleteByRegex(pattern, &deleted);
      EXPECT_TRUE(s.IsInvalidArgument()) << pattern.substr(0, 40) << ": " << s.ToString();
    }
  }
  std::vector<Slice> keys{"aaaa"};
  std::vector<int64_t> r;
  for (DB* door : {db.get(), ns.get()}) {
    ASSERT_TRUE(door->BatchExists(keys, &r).ok());
    EXPECT_EQ(r, std::vector<int64_t>{1});
  }
  uint64_t deleted = 0;
  ASSERT_TRUE(ns->DeleteByRegex("a+", &deleted).ok());
  EXPECT_EQ(deleted, 1u);
  ASSERT_TRUE(db->DeleteByRegex("a+", &deleted).ok());
  EXPECT_EQ(deleted, 1u);
}

// Keys written and deleted while a DeleteByRegex runs over many keys: the ones it
// should remove are removed, the others kept, and every other call goes on meanwhile.
TEST(KeyPatternDBTest, ADeleteByRegexOverManyKeysRacesOtherCallsCleanly) {
  test::TempDir dir;
  std::unique_ptr<DB> db;
  ASSERT_TRUE(OpenMemoryOnly(dir, 256ull << 20, &db).ok());
  constexpr int kKeys = 200000;
  for (int i = 0; i < kKeys; i++) {
    ASSERT_TRUE(db->Put(WriteOptions(), (i % 2 ? "odd/" : "even/") + std::to_string(i), "v").ok());
  }
  std::atomic<bool> done{false};
  std::thread other([&] {
    int i = 0;
    while (!done.load()) {
      const std::string key = "other/" + std::to_string(i++);
      EXPECT_TRUE(db->Put(WriteOptions(), key, "w").ok());
      std::string v;
      EXPECT_TRUE(db->Get(ReadOptions(), key, &v).ok());
      EXPECT_EQ(v, "w");
    }
  });
  uint64_t deleted = 0;
  ASSERT_TRUE(db->DeleteByRegex("odd/[0-9]+", &deleted).ok());
  done = true;
  other.join();
  EXPECT_EQ(deleted, static_cast<uint64_t>(kKeys / 2));
  std::vector<std::string> names{"odd/1", "even/0", "odd/199999", "even/199998"};
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> r;
  ASSERT_TRUE(db->BatchExists(keys, &r).ok());
  EXPECT_EQ(r, (std::vector<int64_t>{0, 1, 0, 1}));
}

// ------------------------------------------------------------------ real processes

#ifdef KV_SERVER_PATH
constexpr char kGrants[] = "uid:1001=tenantA;uid:1002=tenantB";  // ';' as ',' in --options

bool DropTo(uid_t uid) {
  return setgroups(0, nullptr) == 0 && setgid(uid) == 0 && setuid(uid) == 0;
}

void Report(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// uid 1001, tenantA: every hostile pattern through attach, each refused InvalidArgument.
int AttackerMain(const std::string& socket, const std::string& out) {
  if (!DropTo(1001)) return 3;
  std::unique_ptr<DB> db, h;
  Status s = DB::Attach(test::AttachClientOptions(), socket, &db);
  if (s.ok()) s = db->OpenNamespace("tenantA", &h);
  if (!s.ok()) {
    Report(out, "attach: " + s.ToString());
    return 2;
  }
  for (int round = 0; round < 3; round++) {
    for (const std::string& pattern : HostilePatterns()) {
      uint64_t deleted = 0;
      s = h->DeleteByRegex(pattern, &deleted);
      if (!s.IsInvalidArgument()) {
        Report(out, "pattern " + pattern.substr(0, 40) + ": " + s.ToString());
        return 1;
      }
    }
  }
  Report(out, "ok");
  return 0;
}

// uid 1002, tenantB: BatchExists of its keys until `stop` exists; every call answered
// within its 2 s deadline, all present.  Writes its slowest call (microseconds).
int NeighbourMain(const std::string& socket, const std::string& stop, const std::string& out) {
  if (!DropTo(1002)) return 3;
  std::unique_ptr<DB> db, h;
  Status s = DB::Attach(test::AttachClientOptions(), socket, &db);
  if (s.ok()) s = db->OpenNamespace("tenantB", &h);
  if (!s.ok()) {
    Report(out, "attach: " + s.ToString());
    return 2;
  }
  std::vector<std::string> names;
  for (int i = 0; i < 64; i++) names.push_back("b/" + std::to_string(i));
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> r;
  double slowest = 0;
  while (!std::filesystem::exists(stop)) {
    const auto start = std::chrono::steady_clock::now();
    s = h->BatchExists(keys, &r);
    slowest = std::max(
        slowest, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                     .count());
    if (!s.ok() || r != std::vector<int64_t>(64, 1)) {
      Report(out, "BatchExists: " + s.ToString());
      return 1;
    }
  }
  Report(out, "ok " + std::to_string(static_cast<uint64_t>(slowest)));
  return 0;
}

TEST(KeyPatternProcessTest, AHostileTenantsPatternsNeitherCrashNorStallTheOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
  test::TempDir dir;
  std::filesystem::create_directories(dir.path());
  chmod(dir.path().c_str(), 0755);
  const std::string socket = dir.Sub("kv.sock");
  {  // the namespaces, made before the owner opens the directory
    std::unique_ptr<DB> db, h;
    Options o = test::AttachOwnerOptions("");
    o.local_listen.clear();
    ASSERT_TRUE(DB::Open(o, dir.Sub("db"), &db).ok());
    ASSERT_TRUE(db->CreateNamespace("tenantA", NamespaceOptions(), &h).ok());
    ASSERT_TRUE(db->CreateNamespace("tenantB", NamespaceOptions(), &h).ok());
  }
  Server server(dir.Sub("db"), test::FreePort(), {"--local_listen=" + socket});
  server.set_options(
      std::string(",ssd_capacity_bytes=0,local_listen_mode=0666,local_allowed_uids=") + kGrants);
  ASSERT_TRUE(server.Start());
  std::unique_ptr<DB> admin, b;
  ASSERT_TRUE(DB::Attach(test::AttachClientOptions(), socket, &admin).ok());
  ASSERT_TRUE(admin->OpenNamespace("tenantB", &b).ok());
  std::vector<std::string> values;
  for (int i = 0; i < 64; i++) {
    values.push_back(std::string(4096, static_cast<char>('a' + i % 26)) + std::to_string(i));
    ASSERT_TRUE(b->Put(WriteOptions(), "b/" + std::to_string(i), values.back()).ok());
  }
  const std::string stop = dir.Sub("stop"), attacker = dir.Sub("attacker"),
                    neighbour = dir.Sub("neighbour");
  for (const std::string& f : {attacker, neighbour}) {
    std::ofstream(f).close();
    chmod(f.c_str(), 0666);
  }
  const pid_t n = test::SpawnSelf({"--neighbour", socket, stop, neighbour});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const pid_t a = test::SpawnSelf({"--attacker", socket, attacker});
  EXPECT_EQ(test::WaitExit(a), 0);
  std::ofstream(stop).close();
  EXPECT_EQ(test::WaitExit(n), 0);
  std::string text;
  std::getline(std::ifstream(attacker), text);
  EXPECT_EQ(text, "ok");
  std::getline(std::ifstream(neighbour), text);
  ASSERT_EQ(text.rfind("ok ", 0), 0u) << text;
  EXPECT_LT(std::stoull(text.substr(3)), 2000000u) << "the neighbour's slowest BatchExists (us)";
  // The owner is up, and B's values are there, bit-exact.
  EXPECT_EQ(kill(server.pid(), 0), 0);
  for (int i = 0; i < 64; i++) {
    std::string v;
    ASSERT_TRUE(b->Get(ReadOptions(), "b/" + std::to_string(i), &v).ok()) << i;
    EXPECT_EQ(v, values[i]);
  }
}
#endif  // KV_SERVER_PATH

}  // namespace
}  // namespace kvengine

int main(int argc, char** argv) {
#ifdef KV_SERVER_PATH
  if (argc > 1) {
    const std::string mode = argv[1];
    if (mode == "--attacker" && argc == 4) return kvengine::AttackerMain(argv[2], argv[3]);
    if (mode == "--neighbour" && argc == 5) {
      return kvengine::NeighbourMain(argv[2], argv[3], argv[4]);
    }
  }
#endif
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
