#include "transport/db_ops.h"

#include "transport/wire.h"
#include "util/coding.h"

namespace kvengine {

namespace {

void PutResultsAnswer(const Status& s, const std::vector<int64_t>& results, std::string* answer) {
  wire::PutBatchStatus(answer, s);
  wire::PutResults(answer, s.ok() ? results : std::vector<int64_t>());
}

// The keys of an EXISTS, DELETE, VALUE_SIZE or PREFETCH request: its whole metadata.
// False when malformed.  A request the target does not admit is answered here with the
// refusal (*refused set).
bool GetKeysOnly(DbOpsTarget* target, std::string_view meta, std::vector<Slice>* keys,
                 bool* refused, std::string* answer) {
  std::vector<std::string_view> views;
  if (!wire::GetKeys(&meta, &views, nullptr) || !meta.empty()) return false;
  keys->assign(views.begin(), views.end());
  Status s = target->Admit(*keys);
  *refused = !s.ok();
  if (*refused) PutResultsAnswer(s, {}, answer);
  return true;
}

}  // namespace

Status DbOpsOverDB::BatchExists(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return db_->BatchExists(keys, results);
}

Status DbOpsOverDB::BatchDelete(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return db_->BatchDelete(WriteOptions(), keys, results);
}

Status DbOpsOverDB::GetValueSize(const Slice& key, uint64_t* size) {
  return db_->GetValueSize(key, size);
}

Status DbOpsOverDB::DeleteByRegex(const std::string& pattern, uint64_t* deleted) {
  return db_->DeleteByRegex(pattern, deleted);
}

Status DbOpsOverDB::DeleteAll(uint64_t* deleted) { return db_->DeleteAll(deleted); }

const FigureScope& DbOpsTarget::figures() const {
  static const FigureScope* const whole = new FigureScope();
  return *whole;
}

const FigureScope& DbOpsOverDB::figures() const {
  return figures_ != nullptr ? *figures_ : DbOpsTarget::figures();
}

bool DbOpsOverDB::GetProperty(const std::string& name, std::string* value) {
  return db_->GetProperty(name, value);
}

Status DbOpsOverDB::Prefetch(std::span<const Slice> keys, std::vector<int64_t>* results) {
  return db_->Prefetch(keys, results);
}

bool IsDbOp(uint8_t op) {
  switch (op) {
    case wire::kExists:
    case wire::kDelete:
    case wire::kValueSize:
    case wire::kProperty:
    case wire::kDeleteMatching:
    case wire::kPrefetch:
      return true;
    default:
      return false;
  }
}

const char* DbOpName(uint8_t op) {
  switch (op) {
    case wire::kExists:
      return "exists";
    case wire::kDelete:
      return "delete";
    case wire::kValueSize:
      return "value-size";
    case wire::kProperty:
      return "property";
    case wire::kDeleteMatching:
      return "delete-matching";
    case wire::kPrefetch:
      return "prefetch";
    default:
      return "unknown";
  }
}

bool ServeDbOp(DbOpsTarget* target, uint8_t op, std::string_view meta, std::string* answer) {
  std::vector<Slice> keys;
  std::vector<int64_t> results;
  bool refused = false;
  switch (op) {
    case wire::kExists: {
      if (!GetKeysOnly(target, meta, &keys, &refused, answer)) return false;
      if (!refused) PutResultsAnswer(target->BatchExists(keys, &results), results, answer);
      return true;
    }
    case wire::kDelete: {
      if (!GetKeysOnly(target, meta, &keys, &refused, answer)) return false;
      if (!refused) PutResultsAnswer(target->BatchDelete(keys, &results), results, answer);
      return true;
    }
    case wire::kPrefetch: {
      if (!GetKeysOnly(target, meta, &keys, &refused, answer)) return false;
      if (!refused) PutResultsAnswer(target->Prefetch(keys, &results), results, answer);
      return true;
    }
    case wire::kValueSize: {
      if (!GetKeysOnly(target, meta, &keys, &refused, answer)) return false;
      if (refused) return true;
      results.resize(keys.size());
      for (size_t i = 0; i < keys.size(); i++) {
        uint64_t size = 0;
        Status s = target->GetValueSize(keys[i], &size);
        results[i] = s.ok() ? static_cast<int64_t>(size) : s.ErrorCode();
      }
      PutResultsAnswer(Status::OK(), results, answer);
      return true;
    }
    case wire::kProperty: {
      std::string_view name;
      if (!GetLengthPrefixed(&meta, &name) || !meta.empty()) return false;
      std::string value;
      Status s = target->AdmitProperty(std::string(name));
      if (s.ok() && !target->GetProperty(std::string(name), &value)) {
        s = Status::NotFound("unknown property", name);
      }
      if (s.ok()) target->figures().Filter(std::string(name), &value);
      wire::PutBatchStatus(answer, s);
      PutLengthPrefixed(answer, s.ok() ? value : "");
      return true;
    }
    case wire::kDeleteMatching: {
      wire::MatchMode mode;
      std::string_view pattern;
      if (!wire::GetDeleteMatching(&meta, &mode, &pattern)) return false;
      uint64_t deleted = 0;
      Status s = mode == wire::kMatchAll ? target->DeleteAll(&deleted)
                                         : target->DeleteByRegex(std::string(pattern), &deleted);
      wire::PutBatchStatus(answer, s);
      PutFixed64(answer, deleted);
      return true;
    }
    default:
      return false;
  }
}

}  // namespace kvengine
