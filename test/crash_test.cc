// Crash consistency with a real process killed by SIGKILL at random points.
//
// Each round forks a child that opens the DB (small buckets, a busy background GC; once
// with write_through and once with write_back, where Flush() itself writes what is only in
// memory) and runs a deterministic random sequence of puts, deletes, flushes and
// compactions, reporting through a pipe the index of each operation whose Flush()
// completed.  The parent kills it after a random delay, reopens the DB and checks:
//   * the DB opens;
//   * every key's value is bit-exact one that was written for it: the one it had at
//     the last acknowledged Flush(), or one written after it;
//   * a key whose delete was flushed (and not re-put later) is absent;
//   * a key untouched since the last flush has exactly its flushed value.
// The rounds share one directory, so each recovery starts from the last one's state.
// KV_CRASH_ROUNDS sets the number of rounds (default 50).
//
// GroupCrashTest does the same with page groups (include/kvengine/db.h, "Page groups"):
// a child puts, deletes and flushes groups of three members (a KV page, an indexer page, a
// state) from three separate buffers under memory pressure and a busy GC, and after each
// kill every group reads back either absent or whole, its three members from one put.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

constexpr int kKeys = 40;

struct Op {
  enum Kind { kPut, kDelete, kFlush, kCompact } kind;
  int key = 0;
  uint64_t seed = 0;  // of the value
  size_t size = 0;
};

// The operation sequence of a round; the child runs it, the parent replays it.
Op MakeOp(std::mt19937_64& rng) {
  Op op;
  const int dice = static_cast<int>(rng() % 100);
  op.kind = dice < 68 ? Op::kPut : dice < 85 ? Op::kDelete : dice < 96 ? Op::kFlush : Op::kCompact;
  op.key = static_cast<int>(rng() % kKeys);
  op.seed = rng();
  op.size = 1 + rng() % (160 << 10);
  return op;
}

std::string KeyName(int k) { return "crash.key." + std::to_string(k); }

Options CrashOptions(OffloadPolicy policy) {
  Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 2 << 20;
  o.memory_slab_size = 256 << 10;
  o.offload_policy = policy;
  o.bucket_keys_limit = 6;
  o.bucket_size_limit = 512 << 10;
  o.bucket_flush_timeout_ms = 20;
  o.gc_interval_ms = 10;
  o.gc_deleted_ratio = 0.3;
  o.tombstone_sync_interval_ms = 0;  // only Flush() makes deletes durable
  o.log_level = LogLevel::kError;
  return o;
}

// `started` (shared with the parent) holds the index of the operation the child is on, so
// the parent knows which ones may have happened: only those count as "changed later".
[[noreturn]] void RunChild(const Options& options, const std::string& path, uint64_t round_seed,
                           int ack_fd, std::atomic<int64_t>* started) {
  std::unique_ptr<DB> db;
  if (!DB::Open(options, path, &db).ok()) _exit(3);
  std::mt19937_64 rng(round_seed);
  for (uint32_t i = 0;; i++) {
    const Op op = MakeOp(rng);
    started->store(i, std::memory_order_release);
    const std::string key = KeyName(op.key);
    Status s;
    switch (op.kind) {
      case Op::kPut:
        s = db->Put(WriteOptions(), key, test::MakeValue(op.seed, op.size));
        break;
      case Op::kDelete:
        s = db->Delete(WriteOptions(), key);
        if (s.IsNotFound()) s = Status::OK();
        break;
      case Op::kFlush:
        s = db->Flush();
        if (s.ok() && write(ack_fd, &i, sizeof(i)) != sizeof(i)) _exit(4);
        break;
      case Op::kCompact:
        s = db->CompactBuckets(nullptr);
        break;
    }
    if (!s.ok()) _exit(5);
  }
}

// How a child run ended: killed by the parent (signaled), else its exit status; and the
// index of the last operation whose Flush() it acknowledged (-1: none).
struct Killed {
  bool signaled = false;
  int exit_status = -1;
  int64_t acked = -1;
};

// Forks a child that runs `child(ack_fd)` (it never returns; it writes the index of each
// acknowledged Flush() to ack_fd) and kills it with SIGKILL at a random moment after its
// first acknowledged Flush (or after 3 s without one), so that a loaded machine still
// tests crashes past a flush.
template <typename Child>
Killed RunAndKill(std::mt19937_64& master, const Child& child) {
  Killed out;
  int fds[2];
  if (pipe(fds) != 0) return out;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    child(fds[1]);
    _exit(7);
  }
  close(fds[1]);
  uint32_t idx;
  pollfd pfd{fds[0], POLLIN, 0};
  if (poll(&pfd, 1, 3000) > 0 && read(fds[0], &idx, sizeof(idx)) == sizeof(idx)) out.acked = idx;
  std::this_thread::sleep_for(std::chrono::milliseconds(master() % 100));
  kill(pid, SIGKILL);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  out.signaled = WIFSIGNALED(wstatus);
  out.exit_status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  while (read(fds[0], &idx, sizeof(idx)) == sizeof(idx)) out.acked = idx;
  close(fds[0]);
  return out;
}

class CrashTest : public ::testing::TestWithParam<OffloadPolicy> {};

TEST_P(CrashTest, SigkillAtRandomPointsKeepsFlushedStateIntact) {
  const Options options = CrashOptions(GetParam());
  const char* env_rounds = std::getenv("KV_CRASH_ROUNDS");
  const int rounds = env_rounds != nullptr ? std::atoi(env_rounds) : 50;
  test::TempDir dir;
  // What the DB held at the start of the round, per key (nullopt: absent).
  std::map<int, std::optional<std::string>> state;
  for (int k = 0; k < kKeys; k++) state[k] = std::nullopt;
  std::mt19937_64 master(20261202);
  int kills_with_acks = 0;
  void* shared = mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* started = new (shared) std::atomic<int64_t>(-1);

  for (int round = 0; round < rounds; round++) {
    const uint64_t round_seed = master();
    started->store(-1);
    const Killed killed = RunAndKill(
        master, [&](int ack_fd) { RunChild(options, dir.path(), round_seed, ack_fd, started); });
    ASSERT_TRUE(killed.signaled) << "child exited early with status " << killed.exit_status;
    const int64_t acked = killed.acked;
    if (acked >= 0) kills_with_acks++;

    // Replay: the state at the last acknowledged flush, and every value written after
    // (as generator seeds: values are made only when compared).
    std::map<int, std::optional<std::string>> at_ack = state;
    std::map<int, std::pair<uint64_t, size_t>> put_at_ack;
    std::map<int, std::vector<std::pair<uint64_t, size_t>>> later_values;
    std::set<int> touched_later;
    std::mt19937_64 rng(round_seed);
    const int64_t horizon = started->load(std::memory_order_acquire);  // the child got no further
    for (int64_t i = 0; i <= horizon; i++) {
      const Op op = MakeOp(rng);
      if (i <= acked) {
        if (op.kind == Op::kPut) put_at_ack[op.key] = {op.seed, op.size};
        if (op.kind == Op::kDelete) {
          put_at_ack.erase(op.key);
          at_ack[op.key] = std::nullopt;
        }
      } else if (op.kind == Op::kPut || op.kind == Op::kDelete) {
        touched_later.insert(op.key);
        if (op.kind == Op::kPut) later_values[op.key].push_back({op.seed, op.size});
      }
    }
    for (const auto& [k, v] : put_at_ack) at_ack[k] = test::MakeValue(v.first, v.second);

    std::unique_ptr<DB> db;
    Status s = DB::Open(options, dir.path(), &db);
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.ToString();
    for (int k = 0; k < kKeys; k++) {
      std::string got;
      Status g = db->Get(ReadOptions(), KeyName(k), &got);
      ASSERT_TRUE(g.ok() || g.IsNotFound())
          << "round " << round << " key " << k << ": " << g.ToString();
      std::optional<std::string> now;
      if (g.ok()) now = got;
      bool allowed = now == at_ack[k];
      if (!allowed && touched_later.count(k) != 0) {
        if (!now.has_value()) {
          allowed = true;  // a later delete (or the put it was before) may have landed
        } else {
          for (const auto& [seed, size] : later_values[k]) {
            allowed |= now->size() == size && *now == test::MakeValue(seed, size);
          }
        }
      }
      ASSERT_TRUE(allowed) << "round " << round << " key " << k << ": "
                           << (now ? "value of " + std::to_string(now->size()) + " bytes"
                                   : "absent")
                           << ", flushed state "
                           << (at_ack[k] ? std::to_string(at_ack[k]->size()) + " bytes" : "absent")
                           << (touched_later.count(k) ? " (changed after the flush)" : "");
      state[k] = now;
    }
    ASSERT_TRUE(db->Close().ok());
  }
  EXPECT_GT(kills_with_acks, rounds / 4) << "too few rounds got past a Flush()";
  munmap(shared, sizeof(std::atomic<int64_t>));
}

std::string PolicyName(const ::testing::TestParamInfo<OffloadPolicy>& info) {
  return info.param == OffloadPolicy::kWriteBack ? "WriteBack" : "WriteThrough";
}

// ------------------------------------------------------------------ page groups

constexpr int kGroups = 24;
// A group's members as SGLang's DSA backend lays them: the KV page, its indexer page,
// and a state; each is its own buffer in the writer and in the reader.
constexpr size_t kMemberSizes[] = {96 << 10, 8 << 10, 24 << 10};
constexpr int kMembers = 3;
constexpr int64_t kGroupBytes = (96 << 10) + (8 << 10) + (24 << 10);

std::string GroupName(int g) { return "crash.group." + std::to_string(g); }

// Member m of the put `generation` of group g: a 24-byte stamp naming all three, then
// bytes that are a function of them, so a member of another put is told apart.
std::string Member(int g, uint64_t generation, int m) {
  std::string bytes(24, '\0');
  const uint64_t words[3] = {static_cast<uint64_t>(g), generation, static_cast<uint64_t>(m)};
  memcpy(bytes.data(), words, sizeof(words));
  bytes += test::MakeValue(generation * 31 + static_cast<uint64_t>(g * kMembers + m),
                           kMemberSizes[m] - 24);
  return bytes;
}

[[noreturn]] void RunGroupChild(const Options& options, const std::string& path,
                                uint64_t round_seed, int ack_fd) {
  std::unique_ptr<DB> db;
  if (!DB::Open(options, path, &db).ok()) _exit(3);
  std::mt19937_64 rng(round_seed);
  for (uint32_t i = 0;; i++) {
    const int dice = static_cast<int>(rng() % 100);
    const int g = static_cast<int>(rng() % kGroups);
    const std::string key = GroupName(g);
    Status s;
    if (dice < 75) {
      const uint64_t generation = rng();
      std::string members[kMembers];
      ValueParts parts;
      for (int m = 0; m < kMembers; m++) {
        members[m] = Member(g, generation, m);
        parts.emplace_back(members[m]);
      }
      std::vector<Slice> keys = {Slice(key)};
      std::vector<ValueParts> values = {parts};
      std::vector<int64_t> results;
      s = db->BatchPut(WriteOptions(), keys, values, &results);
      // NoSpace under pressure leaves the group as it was; that is allowed.
      if (s.ok() && results[0] != 0 && results[0] != Status::NoSpace("").ErrorCode()) _exit(6);
    } else if (dice < 90) {
      s = db->Delete(WriteOptions(), key);
      if (s.IsNotFound()) s = Status::OK();
    } else if (dice < 98) {
      s = db->Flush();
      if (s.ok() && write(ack_fd, &i, sizeof(i)) != sizeof(i)) _exit(4);
    } else {
      s = db->CompactBuckets(nullptr);
    }
    if (!s.ok()) _exit(5);
  }
}

class GroupCrashTest : public ::testing::TestWithParam<OffloadPolicy> {};

TEST_P(GroupCrashTest, SigkillNeverLeavesAHalfGroup) {
  const Options options = CrashOptions(GetParam());
  const char* env_rounds = std::getenv("KV_CRASH_ROUNDS");
  const int rounds = env_rounds != nullptr ? std::atoi(env_rounds) / 2 : 20;
  test::TempDir dir;
  std::mt19937_64 master(20261207);
  int whole = 0, absent = 0, kills_with_acks = 0;
  for (int round = 0; round < rounds; round++) {
    const uint64_t round_seed = master();
    const Killed killed = RunAndKill(
        master, [&](int ack_fd) { RunGroupChild(options, dir.path(), round_seed, ack_fd); });
    ASSERT_TRUE(killed.signaled) << "child exited early with status " << killed.exit_status;
    if (killed.acked >= 0) kills_with_acks++;

    std::unique_ptr<DB> db;
    Status s = DB::Open(options, dir.path(), &db);
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.ToString();
    // Every group, read into three separate member buffers.
    std::vector<std::string> names;
    for (int g = 0; g < kGroups; g++) names.push_back(GroupName(g));
    std::vector<Slice> keys(names.begin(), names.end());
    std::vector<std::vector<std::string>> buffers(kGroups);
    std::vector<Destination> destinations;
    for (int g = 0; g < kGroups; g++) {
      Destination d;
      for (int m = 0; m < kMembers; m++) {
        buffers[g].emplace_back(kMemberSizes[m], '\xEE');
        d.emplace_back(buffers[g][m].data(), buffers[g][m].size());
      }
      destinations.push_back(std::move(d));
    }
    std::vector<int64_t> results, exists;
    ASSERT_TRUE(db->BatchGetInto(ReadOptions(), keys, destinations, &results).ok());
    ASSERT_TRUE(db->BatchExists(keys, &exists).ok());
    for (int g = 0; g < kGroups; g++) {
      if (results[g] == Status::NotFound("").ErrorCode()) {
        ASSERT_EQ(exists[g], 0) << "round " << round << " group " << g;
        absent++;
        continue;
      }
      ASSERT_EQ(results[g], kGroupBytes) << "round " << round << " group " << g;
      ASSERT_EQ(exists[g], 1) << "round " << round << " group " << g;
      uint64_t generation = 0;
      memcpy(&generation, buffers[g][0].data() + 8, sizeof(generation));
      for (int m = 0; m < kMembers; m++) {
        ASSERT_TRUE(buffers[g][m] == Member(g, generation, m))
            << "round " << round << " group " << g << ": member " << m
            << " is not of the put its KV page came from (a half or mixed group)";
      }
      whole++;
    }
    ASSERT_TRUE(db->Close().ok());
  }
  EXPECT_GT(kills_with_acks, rounds / 4) << "too few rounds got past a Flush()";
  EXPECT_GT(whole, 0) << "no group survived any crash: nothing was checked";
  std::printf("group crash rounds: %d, groups read whole %d, absent %d, half 0\n", rounds, whole,
              absent);
}

INSTANTIATE_TEST_SUITE_P(BothPolicies, GroupCrashTest,
                         ::testing::Values(OffloadPolicy::kWriteThrough, OffloadPolicy::kWriteBack),
                         PolicyName);

INSTANTIATE_TEST_SUITE_P(BothPolicies, CrashTest,
                         ::testing::Values(OffloadPolicy::kWriteThrough, OffloadPolicy::kWriteBack),
                         PolicyName);

}  // namespace
}  // namespace kvengine
