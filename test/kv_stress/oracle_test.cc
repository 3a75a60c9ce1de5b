// kv_stress's oracle on its own: what the expected state allows and refuses, and that a
// value read back names its write and fails on any damage.  The crash rounds
// (kv_crashtest_*) rely on both to tell lost, wrong and resurrected keys apart.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test/test_util.h"
#include "tools/stress/expected_state.h"
#include "tools/stress/key_space.h"
#include "tools/stress/stress_value.h"

namespace kvengine::stress {
namespace {

class OracleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + ".state";
    ASSERT_TRUE(ExpectedState::Create(path_, 20, 2, &state_).ok());
  }
  void TearDown() override { unlink(path_.c_str()); }
  static Observation Value(uint32_t v) { return Observation{Observation::kValue, v}; }
  static Observation Absent() { return Observation{Observation::kAbsent, 0}; }

  test::TempDir dir_;
  std::string path_;
  std::unique_ptr<ExpectedState> state_;
};

TEST_F(OracleTest, LiveReadsMustSeeTheAcknowledgedVersion) {
  EXPECT_EQ(state_->Judge(3, {0, false, false}, Absent()), Verdict::kOk);  // never written
  const uint32_t v1 = state_->BeginPut(3);
  // In flight: the old state or the new one.
  EXPECT_EQ(state_->Judge(3, {0, false, false}, Absent()), Verdict::kOk);
  EXPECT_EQ(state_->Judge(3, {0, false, false}, Value(v1)), Verdict::kOk);
  state_->Acknowledge(3, v1);
  const uint32_t floor = state_->Lo(3);
  EXPECT_EQ(state_->Judge(3, {floor, false, false}, Value(v1)), Verdict::kOk);
  EXPECT_EQ(state_->Judge(3, {floor, false, false}, Absent()), Verdict::kLost);
  EXPECT_EQ(state_->Judge(3, {floor, false, true}, Absent()), Verdict::kDropped);
  EXPECT_EQ(state_->Judge(3, {floor, false, false}, Value(v1 + 1)), Verdict::kWrong);
  EXPECT_EQ(state_->Judge(3, {floor, false, false}, Observation{Observation::kCorrupt, 0}),
            Verdict::kWrong);
  const uint32_t v2 = state_->BeginPut(3);
  state_->Acknowledge(3, v2);
  EXPECT_EQ(state_->Judge(3, {state_->Lo(3), false, false}, Value(v1)), Verdict::kWrong);
}

TEST_F(OracleTest, AfterACrashTheDurableFloorRules) {
  const uint32_t v1 = state_->BeginPut(5);
  state_->Acknowledge(5, v1);
  state_->CommitFlush(state_->SnapshotLo());
  const uint32_t d = state_->BeginDelete(5);
  state_->Acknowledge(5, d);
  state_->CommitFlush(state_->SnapshotLo());
  const ExpectedState::Rule crash{state_->Durable(5), true, false};
  EXPECT_EQ(state_->Judge(5, crash, Absent()), Verdict::kOk);
  EXPECT_EQ(state_->Judge(5, crash, Value(v1)), Verdict::kResurrected);
  EXPECT_EQ(state_->JudgeExists(5, crash, true), Verdict::kResurrected);

  // A flushed put, untouched since: absent is lost; rewritten since: absent is allowed
  // (the newer write retired the flushed copy), an older version never.
  const uint32_t v3 = state_->BeginPut(6);
  state_->Acknowledge(6, v3);
  state_->CommitFlush(state_->SnapshotLo());
  EXPECT_EQ(state_->Judge(6, {state_->Durable(6), true, false}, Absent()), Verdict::kLost);
  const uint32_t v4 = state_->BeginPut(6);
  state_->Acknowledge(6, v4);
  EXPECT_EQ(state_->Judge(6, {state_->Durable(6), true, false}, Absent()), Verdict::kOk);
  EXPECT_EQ(state_->Judge(6, {state_->Durable(6), true, false}, Value(v4)), Verdict::kOk);
  // Resolved after the crash as absent: the lost write is never accepted again.
  state_->Resolve(6, Absent(), true);
  state_->CommitFlush(state_->SnapshotLo());
  EXPECT_EQ(state_->Judge(6, {state_->Durable(6), true, false}, Value(v4)), Verdict::kResurrected);
}

TEST_F(OracleTest, TheStateSurvivesReopeningAndRefusesAnotherFile) {
  const uint32_t v = state_->BeginPut(1);
  state_->Acknowledge(1, v);
  state_->Add(Counter::kOps, 7);
  state_.reset();
  ASSERT_TRUE(ExpectedState::Open(path_, &state_).ok());
  EXPECT_EQ(state_->Lo(1), v);
  EXPECT_EQ(state_->Get(Counter::kOps), 7u);
  EXPECT_EQ(state_->keys(), 20u);
  ASSERT_EQ(truncate(path_.c_str(), 100), 0);
  std::unique_ptr<ExpectedState> other;
  EXPECT_TRUE(ExpectedState::Open(path_, &other).IsCorruption());
}

TEST(StressValueTest, AValueNamesItsWriteAndFailsOnAnyDamage) {
  std::string v(4099, '\0');
  FillValue(12, 34, v.size(), v.data());
  Observation seen = ReadValue(12, v.data(), v.size());
  EXPECT_EQ(seen.kind, Observation::kValue);
  EXPECT_EQ(seen.version, 34u);
  EXPECT_EQ(ReadValue(13, v.data(), v.size()).kind, Observation::kCorrupt);      // another key's
  EXPECT_EQ(ReadValue(12, v.data(), v.size() - 1).kind, Observation::kCorrupt);  // short
  for (size_t at : {size_t{0}, size_t{13}, size_t{24}, size_t{4098}}) {
    std::string bad = v;
    bad[at] ^= 1;
    EXPECT_EQ(ReadValue(12, bad.data(), bad.size()).kind, Observation::kCorrupt) << at;
  }
}

TEST(KeySpaceTest, WorkersOwnDisjointRangesAndPatternsNameTheirOwnKeys) {
  const KeySpace space(1000, 3);
  uint32_t total = 0;
  for (uint32_t w = 0; w < 3; w++) {
    total += space.End(w) - space.Begin(w);
    for (uint32_t k = space.Begin(w); k < space.End(w); k++) ASSERT_EQ(space.WorkerOf(k), w);
  }
  EXPECT_EQ(total, 1000u);
  std::vector<uint32_t> keys;
  EXPECT_EQ(space.TenKeyPattern(1, 120, &keys), "stress\\.w001\\.000012[0-9]");
  ASSERT_EQ(keys.size(), 10u);
  EXPECT_EQ(space.Name(keys[0]), "stress.w001.0000120");
}

}  // namespace
}  // namespace kvengine::stress
