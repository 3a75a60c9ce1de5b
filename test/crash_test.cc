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
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
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
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    started->store(-1);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      RunChild(options, dir.path(), round_seed, fds[1], started);
    }
    close(fds[1]);
    // Kill at a random moment after the child's first acknowledged Flush (or after 3 s
    // without one), so that a loaded machine still tests crashes past a flush.
    int64_t acked = -1;
    uint32_t idx;
    pollfd pfd{fds[0], POLLIN, 0};
    if (poll(&pfd, 1, 3000) > 0 && read(fds[0], &idx, sizeof(idx)) == sizeof(idx)) acked = idx;
    std::this_thread::sleep_for(std::chrono::milliseconds(master() % 100));
    kill(pid, SIGKILL);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    ASSERT_TRUE(WIFSIGNALED(wstatus))
        << "child exited early with status " << (WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1);
    while (read(fds[0], &idx, sizeof(idx)) == sizeof(idx)) acked = idx;
    close(fds[0]);
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

INSTANTIATE_TEST_SUITE_P(BothPolicies, CrashTest,
                         ::testing::Values(OffloadPolicy::kWriteThrough, OffloadPolicy::kWriteBack),
                         [](const ::testing::TestParamInfo<OffloadPolicy>& info) {
                           return std::string(info.param == OffloadPolicy::kWriteBack
                                                  ? "WriteBack"
                                                  : "WriteThrough");
                         });

}  // namespace
}  // namespace kvengine
