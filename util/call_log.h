// CallLog: the structured log lines of one DB call, and its errors by kind.
//
// A call logs one summary line, then one line per key, each with only the fields known:
//
//   [batch_get_into] elapsed_us=158 num_keys=8 total_bytes=8388608
//   success=1 key=layer.0.req_0 size=1048576 tier=memory
//   success=0 key=layer.2.req_0 error=not_found
//
// Levels: the summary and the lines of failed keys print at kInfo, the lines of keys
// that succeeded at kDebug.  Nothing is formatted or stored for a line the logger will
// not print: with the default level (warn) a call costs a few predictable branches.
// The lines of one call reach the sink together (Logger::WriteGroup), in order.
//
// Keys print as their bytes, with bytes outside printable ASCII, space, '=' and '\'
// escaped as \xNN, so a line always splits on spaces into name=value fields; a key
// longer than 64 bytes prints its first 64 and "...", then its length and hash as fields
// of their own: key=aaaa... key_bytes=70000 key_hash=0f1e2d3c4b5a6978.
//
// Only the innermost layer that knows every field logs a call, so a call is never
// logged twice: DBImpl for the keys it serves; ClusterDB for the calls it routes to
// other hosts (their local keys are logged again by DBImpl, as a call of their own).
//
// Thread-safety: a CallLog belongs to one call (one thread).
#ifndef KVENGINE_UTIL_CALL_LOG_H_
#define KVENGINE_UTIL_CALL_LOG_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/logging.h"

namespace kvengine {

// Failed key operations by Status code (errors by kind, for the statistics).
class ErrorCounters {
 public:
  static constexpr int kNumCodes = static_cast<int>(Status::kLastCode) + 1;
  // `error_code` is a negative batch result (Status::ErrorCode()); others are ignored.
  void Add(int64_t error_code) {
    if (error_code < 0 && -error_code < kNumCodes) {
      counts_[-error_code].fetch_add(1, std::memory_order_relaxed);
    }
  }
  uint64_t Get(Status::Code code) const {
    return counts_[static_cast<int>(code)].load(std::memory_order_relaxed);
  }
  // "errors.<kind>: N" lines, one per kind (zeros included), for "kvengine.stats".
  std::string ToText() const;
  // {"not_found":N,...}, every kind.
  std::string ToJson() const;

 private:
  std::array<std::atomic<uint64_t>, kNumCodes> counts_{};
};

class CallLog {
 public:
  // `op` names the call in the summary ("batch_put"); a string literal.  `errors` (may
  // be nullptr) counts the failed keys by kind.
  CallLog(Logger* logger, const char* op, ErrorCounters* errors);
  // As above, for a call that began at `start_nanos` (perf_internal::NowNanos()).
  CallLog(Logger* logger, const char* op, ErrorCounters* errors, uint64_t start_nanos);
  CallLog(const CallLog&) = delete;
  CallLog& operator=(const CallLog&) = delete;

  // True when the summary line will print; callers compute summary-only figures (such as
  // total bytes) only then.
  bool active() const { return summary_; }

  // Adds a numeric field to the summary, after elapsed_us, in call order (at most 6).
  void Add(const char* name, uint64_t value) {
    if (summary_ && num_fields_ < fields_.size()) fields_[num_fields_++] = {name, value};
  }

  // The outcome of keys[index]: `error_code` 0 (or positive) on success, else negative;
  // `size` the value size when known, else -1; `tier` where it was found or stored, when
  // known, else nullptr; `exists` 1/0 for existence queries, else -1.
  void Key(size_t index, int64_t error_code, int64_t size, const char* tier, int exists = -1) {
    if (error_code < 0 && errors_ != nullptr) errors_->Add(error_code);
    if (WantsKey(error_code)) keys_.push_back({index, error_code, size, tier, exists});
  }
  // Whether Key() would keep a line for this outcome (to skip computing its fields).
  bool WantsKey(int64_t error_code) const { return error_code < 0 ? failed_keys_ : all_keys_; }

  // Ends the call with status `s` and returns it: writes the summary (with
  // error=<code name> when `s` failed; the failure is counted) and the key lines kept
  // (`keys` must be the call's keys, in the order Key() indexes them).  Call once.
  Status Finish(Status s, std::span<const Slice> keys = {});
  // Ends a single-key call: the key's line (size and tier when known: >= 0, non-null)
  // after a summary with num_keys=1.  Returns `s`.
  Status FinishKey(Status s, const Slice& key, int64_t size, const char* tier);

  // Renders a key for a log line (escaping as described above).
  static std::string PrintableKey(const Slice& key);

 private:
  struct KeyRecord {
    size_t index;
    int64_t code;
    int64_t size;
    const char* tier;
    int exists;
  };
  struct Field {
    const char* name;
    uint64_t value;
  };

  Logger* const logger_;
  const char* const op_;
  ErrorCounters* const errors_;
  const bool summary_;      // the summary prints (kInfo)
  const bool failed_keys_;  // lines of failed keys print (kInfo)
  const bool all_keys_;     // lines of every key print (kDebug)
  uint64_t start_nanos_ = 0;
  std::array<Field, 6> fields_{};
  size_t num_fields_ = 0;
  std::vector<KeyRecord> keys_;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_CALL_LOG_H_
