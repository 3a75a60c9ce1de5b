#include "tools/stress/stress_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "tools/stress/stress_value.h"

namespace kvengine::stress {
namespace {

Status ResultStatus(int64_t r) {
  return r >= 0 ? Status::OK() : Status::FromErrorCode(static_cast<int>(r));
}

// A read refused with NoSpace.  Counted apart from the writes refused for room: a read
// never needs room -- an attached client's read of a value not in memory is staged in
// its connection's own window, in rounds (docs/attach.md) -- so the runs allow none
// (scripts/kv_crashtest.py); it is not judged, since it saw nothing.
bool ReadRefused(int64_t r) { return r == Status::NoSpace("").ErrorCode(); }

}  // namespace

// ------------------------------------------------------------------ FailureLog

bool FailureLog::Take() { return printed_.fetch_add(1) < limit_; }

void FailureLog::Record(Verdict v, uint32_t key, uint32_t floor, const Observation& seen,
                        const char* op) {
  switch (v) {
    case Verdict::kOk:
      return;
    case Verdict::kDropped:
      state_->Add(Counter::kDropped);
      return;
    case Verdict::kLost:
      state_->Add(Counter::kLost);
      break;
    case Verdict::kWrong:
      state_->Add(Counter::kWrong);
      break;
    case Verdict::kResurrected:
      state_->Add(Counter::kResurrected);
      break;
  }
  if (!Take()) return;
  const char* what = seen.kind == Observation::kAbsent    ? "absent"
                     : seen.kind == Observation::kCorrupt ? "bytes of no version"
                                                          : "version";
  std::fprintf(stderr, "kv_stress: FAIL %s: %s of key %s (index %u): saw %s %u; floor %u, %s\n",
               VerdictName(v), op, space_->Name(key).c_str(), key, what, seen.version, floor,
               state_->Describe(key).c_str());
}

void FailureLog::Error(const Status& s, const std::string& what) {
  state_->Add(Counter::kErrors);
  if (Take()) std::fprintf(stderr, "kv_stress: ERROR %s: %s\n", what.c_str(), s.ToString().c_str());
}

// ------------------------------------------------------------------ StressWorker

StressWorker::StressWorker(const Keyspaces* keyspaces, ExpectedState* state,
                           const KeySpace* space, FailureLog* log, uint32_t worker,
                           const WorkloadConfig& config, uint64_t seed)
    : ks_(keyspaces),
      mine_(keyspaces->OfWorker(worker)),
      state_(state),
      space_(space),
      log_(log),
      worker_(worker),
      config_(config),
      rng_(seed),
      own_(space->End(worker) - space->Begin(worker), config.zipf),
      any_worker_(space->End(0) - space->Begin(0), config.zipf) {
  for (uint32_t w : config_.weights) weight_total_ += w;
}

StressWorker::~StressWorker() {
  if (registered_) ks_->db()->UnregisterBuffer(read_buf_.data());
}

Status StressWorker::Prepare() {
  if (weight_total_ == 0) return Status::InvalidArgument("every operation weight is 0");
  write_buf_.resize(config_.batch_max * config_.value_max);
  read_buf_.resize(config_.batch_max * config_.value_max);
  Status s = ks_->db()->RegisterBuffer(read_buf_.data(), read_buf_.size());
  registered_ = s.ok();
  return s;
}

void StressWorker::Run(const std::atomic<bool>* stop) {
  while (!stop->load(std::memory_order_relaxed)) {
    switch (PickOp()) {
      case OpKind::kPut:
        Put();
        break;
      case OpKind::kBatchPut:
        BatchPut();
        break;
      case OpKind::kGet:
        Get();
        break;
      case OpKind::kBatchGet:
        BatchGet();
        break;
      case OpKind::kExists:
        Exists();
        break;
      case OpKind::kDelete:
        Delete();
        break;
      case OpKind::kDeleteMatching:
        DeleteMatching();
        break;
      case OpKind::kFlush:
      case OpKind::kCount:
        Flush();
        break;
    }
  }
}

OpKind StressWorker::PickOp() {
  uint32_t dice = static_cast<uint32_t>(rng_() % weight_total_);
  for (int i = 0; i < static_cast<int>(OpKind::kCount); i++) {
    if (dice < config_.weights[i]) return static_cast<OpKind>(i);
    dice -= config_.weights[i];
  }
  return OpKind::kGet;
}

uint32_t StressWorker::OwnKey() {
  uint32_t key = space_->Begin(worker_) + own_.Next(rng_);
  // Keys left alone (WorkloadConfig::left_alone) are skipped; a few tries, then any key
  // of the worker that is not left alone, else the first choice.
  for (int tries = 0; tries < 16 && LeftAlone(key); tries++) {
    key = space_->Begin(worker_) + own_.Next(rng_);
  }
  for (uint32_t k = space_->Begin(worker_); LeftAlone(key) && k < space_->End(worker_); k++) {
    if (!LeftAlone(k)) key = k;
  }
  return key;
}

bool StressWorker::LeftAlone(uint32_t key) const {
  return key < config_.left_alone.size() && config_.left_alone[key];
}

uint32_t StressWorker::AnyKey() {
  const auto w = static_cast<uint32_t>(rng_() % space_->workers());
  const uint32_t n = space_->End(w) - space_->Begin(w);
  return space_->Begin(w) + any_worker_.Next(rng_) % n;
}

std::vector<uint32_t> StressWorker::BatchReadKeys(uint32_t n) {
  std::vector<uint32_t> keys;
  if (ks_->count() == 1) {
    for (uint32_t i = 0; i < n; i++) keys.push_back(rng_() % 2 == 0 ? OwnKey() : AnyKey());
    return keys;
  }
  const bool own = rng_() % 2 == 0;
  const uint32_t w = own ? worker_ : static_cast<uint32_t>(rng_() % space_->workers());
  const uint32_t width = space_->End(w) - space_->Begin(w);
  for (uint32_t i = 0; i < n; i++) {
    keys.push_back(own ? OwnKey() : space_->Begin(w) + any_worker_.Next(rng_) % width);
  }
  return keys;
}

void StressWorker::ProbeIsolation(uint32_t key) {
  const uint32_t owner = space_->WorkerOf(key);
  DB* const other = ks_->Other(owner, rng_());
  const std::string where = "key " + space_->Name(key) + " of keyspace " +
                            ks_->NameOf(ks_->OfKey(key)) + " through keyspace " +
                            ks_->NameOf(other);
  std::string value;
  Status s = other->Get(ReadOptions(), space_->Name(key), &value);
  if (!s.IsNotFound()) {
    log_->Error(s.ok() ? Status::Corruption("found a value of " + std::to_string(value.size()) +
                                            " bytes")
                       : s,
                "isolation: read of " + where);
  }
  if (owner != worker_) return;  // a delete only of this worker's own keys' names
  std::vector<uint32_t> group;
  const uint32_t first = key - space_->Begin(owner);
  const std::string pattern = space_->TenKeyPattern(owner, first - first % 10, &group);
  uint64_t deleted = 0;
  s = other->DeleteByRegex(pattern, &deleted);
  if (!s.ok() || deleted != 0) {
    log_->Error(s.ok() ? Status::Corruption("deleted " + std::to_string(deleted) + " keys") : s,
                "isolation: delete by pattern " + pattern + " of " + where);
  }
}

size_t StressWorker::PickSize() {
  // Log-uniform: as many values of 1-4 KiB as of 1-4 MiB.
  const double lo = std::log(static_cast<double>(config_.value_min));
  const double hi = std::log(static_cast<double>(config_.value_max));
  const double x = std::uniform_real_distribution<double>(lo, hi)(rng_);
  const auto size = static_cast<size_t>(std::exp(x));
  return std::clamp(size, config_.value_min, config_.value_max);
}

void StressWorker::FinishWrite(uint32_t key, uint32_t version, const Status& s, bool is_delete,
                               const char* op) {
  state_->Add(Counter::kOps);
  if (s.ok() || (is_delete && s.IsNotFound())) {
    state_->Acknowledge(key, version);
  } else if (s.IsNoSpace()) {
    state_->Add(Counter::kRefused);  // left in doubt: the oracle allows either outcome
  } else {
    log_->Error(s, std::string(op) + " " + space_->Name(key));
  }
}

void StressWorker::Put() {
  const uint32_t key = OwnKey();
  const size_t size = PickSize();
  const uint32_t version = state_->BeginPut(key);
  FillValue(key, version, size, write_buf_.data());
  const Status s = mine_->Put(WriteOptions(), space_->Name(key), Slice(write_buf_.data(), size));
  FinishWrite(key, version, s, false, "put");
}

void StressWorker::BatchPut() {
  const uint32_t n = 2 + static_cast<uint32_t>(rng_() % (config_.batch_max - 1));
  std::vector<uint32_t> keys;
  for (uint32_t tries = 0; keys.size() < n && tries < 4 * n; tries++) {
    const uint32_t k = OwnKey();
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  }
  std::vector<std::string> names;
  std::vector<Slice> key_slices;
  std::vector<ValueParts> values;
  std::vector<uint32_t> versions;
  for (size_t i = 0; i < keys.size(); i++) {
    const size_t size = PickSize();
    char* value = write_buf_.data() + i * config_.value_max;
    versions.push_back(state_->BeginPut(keys[i]));
    FillValue(keys[i], versions.back(), size, value);
    names.push_back(space_->Name(keys[i]));
    // One to three parts, cut at random points.
    ValueParts parts;
    size_t at = 0;
    const int pieces = 1 + static_cast<int>(rng_() % 3);
    for (int p = 1; p < pieces; p++) {
      const size_t cut = at + rng_() % (size - at + 1);
      parts.emplace_back(value + at, cut - at);
      at = cut;
    }
    parts.emplace_back(value + at, size - at);
    values.push_back(std::move(parts));
  }
  for (const auto& name : names) key_slices.emplace_back(name);
  std::vector<int64_t> results;
  const Status s = mine_->BatchPut(WriteOptions(), key_slices, values, &results);
  for (size_t i = 0; i < keys.size(); i++) {
    FinishWrite(keys[i], versions[i], s.ok() ? ResultStatus(results[i]) : s, false, "batch put");
  }
}

void StressWorker::Get() {
  const uint32_t key = rng_() % 2 == 0 ? OwnKey() : AnyKey();
  if (ks_->count() > 1 && rng_() % 8 == 0) ProbeIsolation(key);
  DB* const db = ks_->OfKey(key);
  const uint32_t floor = state_->Lo(key);
  Observation seen;
  Status s;
  if (rng_() % 2 == 0) {
    size_t size = 0;
    s = db->GetInto(ReadOptions(), space_->Name(key),
                     MutableSlice(read_buf_.data(), config_.value_max), &size);
    if (s.ok()) seen = ReadValue(key, read_buf_.data(), size);
  } else {
    std::string value;
    s = db->Get(ReadOptions(), space_->Name(key), &value);
    if (s.ok()) seen = ReadValue(key, value.data(), value.size());
  }
  state_->Add(Counter::kOps);
  if (s.IsNoSpace()) return state_->Add(Counter::kReadRefused);  // see ReadRefused
  if (!s.ok() && !s.IsNotFound()) {
    if (s.IsBufferTooSmall()) seen.kind = Observation::kCorrupt;  // no value is that large
    if (!s.IsBufferTooSmall()) return log_->Error(s, "get " + space_->Name(key));
  }
  state_->Add(Counter::kVerifiedReads);
  log_->Record(state_->Judge(key, {floor, false, config_.may_drop}, seen), key, floor, seen, "get");
}

void StressWorker::BatchGet() {
  const uint32_t n = 2 + static_cast<uint32_t>(rng_() % (config_.batch_max - 1));
  std::vector<uint32_t> keys, floors;
  std::vector<std::string> names;
  std::vector<Destination> dest;
  keys = BatchReadKeys(n);
  for (uint32_t i = 0; i < n; i++) {
    names.push_back(space_->Name(keys[i]));
    char* at = read_buf_.data() + i * config_.value_max;
    const size_t cut = rng_() % (config_.value_max + 1);  // two adjacent slices
    dest.push_back({MutableSlice(at, cut), MutableSlice(at + cut, config_.value_max - cut)});
  }
  for (uint32_t k : keys) floors.push_back(state_->Lo(k));
  std::vector<Slice> key_slices(names.begin(), names.end());
  std::vector<int64_t> results;
  const Status s = ks_->OfKey(keys[0])->BatchGetInto(ReadOptions(), key_slices, dest, &results);
  state_->Add(Counter::kOps, n);
  if (!s.ok()) return log_->Error(s, "batch get");
  for (uint32_t i = 0; i < n; i++) {
    Observation seen;
    if (results[i] >= 0) {
      seen = ReadValue(keys[i], read_buf_.data() + i * config_.value_max,
                       static_cast<size_t>(results[i]));
    } else if (ReadRefused(results[i])) {
      state_->Add(Counter::kReadRefused);
      continue;
    } else if (results[i] != Status::NotFound("").ErrorCode()) {
      log_->Error(ResultStatus(results[i]), "batch get " + names[i]);
      continue;
    }
    state_->Add(Counter::kVerifiedReads);
    log_->Record(state_->Judge(keys[i], {floors[i], false, config_.may_drop}, seen), keys[i],
                 floors[i], seen, "batch get");
  }
}

void StressWorker::Exists() {
  const uint32_t n = 1 + static_cast<uint32_t>(rng_() % config_.batch_max);
  std::vector<uint32_t> keys, floors;
  std::vector<std::string> names;
  keys = BatchReadKeys(n);
  for (uint32_t i = 0; i < n; i++) {
    names.push_back(space_->Name(keys[i]));
    floors.push_back(state_->Lo(keys[i]));
  }
  std::vector<Slice> key_slices(names.begin(), names.end());
  std::vector<int64_t> results;
  const Status s = ks_->OfKey(keys[0])->BatchExists(key_slices, &results);
  state_->Add(Counter::kOps, n);
  if (!s.ok()) return log_->Error(s, "exists");
  for (uint32_t i = 0; i < n; i++) {
    if (results[i] < 0) {
      log_->Error(ResultStatus(results[i]), "exists " + names[i]);
      continue;
    }
    state_->Add(Counter::kVerifiedReads);
    const bool present = results[i] == 1;
    const Observation seen{present ? Observation::kValue : Observation::kAbsent, 0};
    log_->Record(state_->JudgeExists(keys[i], {floors[i], false, config_.may_drop}, present),
                 keys[i], floors[i], seen, "exists");
  }
}

void StressWorker::Delete() {
  const uint32_t key = OwnKey();
  const uint32_t version = state_->BeginDelete(key);
  if (rng_() % 2 == 0) {
    FinishWrite(key, version, mine_->Delete(WriteOptions(), space_->Name(key)), true, "delete");
    return;
  }
  const std::string name = space_->Name(key);
  const Slice k(name);
  std::vector<int64_t> results;
  const Status s = mine_->BatchDelete(WriteOptions(), std::span<const Slice>(&k, 1), &results);
  FinishWrite(key, version, s.ok() ? ResultStatus(results[0]) : s, true, "batch delete");
}

void StressWorker::DeleteMatching() {
  const uint32_t first = OwnKey() - space_->Begin(worker_);
  std::vector<uint32_t> keys;
  const std::string pattern = space_->TenKeyPattern(worker_, first - first % 10, &keys);
  std::vector<uint32_t> versions;
  for (uint32_t k : keys) versions.push_back(state_->BeginDelete(k));
  uint64_t deleted = 0;
  const Status s = mine_->DeleteByRegex(pattern, &deleted);
  for (size_t i = 0; i < keys.size(); i++) {
    FinishWrite(keys[i], versions[i], s, true, "delete matching");
  }
  if (deleted > keys.size()) {
    log_->Error(Status::Corruption("deleted " + std::to_string(deleted) + " keys"),
                "delete matching " + pattern + " (at most " + std::to_string(keys.size()) + ")");
  }
}

void StressWorker::Flush() {
  const std::vector<uint32_t> snapshot = state_->SnapshotLo();
  const Status s = ks_->db()->Flush();
  state_->Add(Counter::kOps);
  if (s.ok()) {
    state_->CommitFlush(snapshot);
    state_->Add(Counter::kFlushes);
  } else if (s.IsNoSpace()) {
    state_->Add(Counter::kRefused);
  } else {
    log_->Error(s, "flush");
  }
}

// ------------------------------------------------------------------ VerifyAndResolve

uint64_t VerifyAndResolve(const Keyspaces& keyspaces, ExpectedState* state, const KeySpace& space,
                          FailureLog* log,
                          uint32_t begin, uint32_t end, bool after_crash, bool may_drop,
                          size_t value_max) {
  std::vector<char> buf(value_max);
  uint64_t failures = 0;
  for (uint32_t key = begin; key < end; key++) {
    const uint32_t floor = after_crash ? state->Durable(key) : state->Lo(key);
    size_t size = 0;
    Status s;
    for (int attempt = 0; attempt < 100; attempt++) {  // NoSpace: see ReadRefused
      s = keyspaces.OfKey(key)->GetInto(ReadOptions(), space.Name(key),
                                        MutableSlice(buf.data(), buf.size()), &size);
      if (!s.IsNoSpace()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Observation seen;
    if (s.IsNoSpace()) {
      state->Add(Counter::kReadRefused);  // left in doubt, unverified
      continue;
    } else if (s.ok()) {
      seen = ReadValue(key, buf.data(), size);
    } else if (s.IsBufferTooSmall()) {
      seen.kind = Observation::kCorrupt;
    } else if (!s.IsNotFound()) {
      log->Error(s, "verify " + space.Name(key));
      failures++;
      continue;
    }
    state->Add(Counter::kVerifiedReads);
    const Verdict v = state->Judge(key, {floor, after_crash, may_drop}, seen);
    if (v != Verdict::kOk && v != Verdict::kDropped) failures++;
    log->Record(v, key, floor, seen, after_crash ? "recovery read" : "restart read");
    state->Resolve(key, seen, after_crash);
  }
  return failures;
}

}  // namespace kvengine::stress
