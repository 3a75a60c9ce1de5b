#include "util/call_log.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "util/hash.h"
#include "util/perf_point.h"
#include "util/printable.h"

namespace kvengine {

std::string ErrorCounters::ToText() const {
  std::string out;
  for (int c = 1; c < kNumCodes; c++) {
    out += "errors.";
    out += Status::CodeName(static_cast<Status::Code>(c));
    out += ": " + std::to_string(counts_[c].load(std::memory_order_relaxed)) + "\n";
  }
  return out;
}

std::string ErrorCounters::ToJson() const {
  std::string out = "{";
  for (int c = 1; c < kNumCodes; c++) {
    if (c > 1) out += ",";
    out += "\"";
    out += Status::CodeName(static_cast<Status::Code>(c));
    out += "\":" + std::to_string(counts_[c].load(std::memory_order_relaxed));
  }
  return out + "}";
}

CallLog::CallLog(Logger* logger, const char* op, ErrorCounters* errors)
    : logger_(logger),
      op_(op),
      errors_(errors),
      summary_(logger != nullptr && logger->Enabled(LogLevel::kInfo)),
      failed_keys_(summary_),
      all_keys_(logger != nullptr && logger->Enabled(LogLevel::kDebug)) {
  if (summary_) start_nanos_ = perf_internal::NowNanos();
}

CallLog::CallLog(Logger* logger, const char* op, ErrorCounters* errors, uint64_t start_nanos)
    : CallLog(logger, op, errors) {
  start_nanos_ = start_nanos;
}

Status CallLog::FinishKey(Status s, const Slice& key, int64_t size, const char* tier) {
  Add("num_keys", 1);
  const int64_t code = s.ErrorCode();
  if (WantsKey(code)) keys_.push_back({0, code, size, tier, -1});
  return Finish(std::move(s), std::span<const Slice>(&key, 1));
}

std::string CallLog::PrintableKey(const Slice& key) {
  // At most the bytes Printable shows, then, for a longer key, its length and hash as
  // fields of their own (a field's value has no space): key=aaaa... key_bytes=70000
  // key_hash=0f1e2d3c4b5a6978.
  std::string out;
  const size_t shown = std::min<size_t>(key.size(), kPrintableKeyBytes);
  out.reserve(shown + 64);
  for (size_t i = 0; i < shown; i++) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c > 0x20 && c < 0x7f && c != '=' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (key.size() > shown) {
    char digest[64];
    std::snprintf(digest, sizeof(digest), "... key_bytes=%zu key_hash=%016llx", key.size(),
                  static_cast<unsigned long long>(Hash64(key.view())));
    out += digest;
  }
  return out;
}

Status CallLog::Finish(Status s, std::span<const Slice> keys) {
  if (!s.ok() && errors_ != nullptr) errors_->Add(s.ErrorCode());
  if (!summary_) return s;
  // Keys may be reported out of order (SSD reads finish after memory hits); print them in
  // the order of the call's keys.
  std::stable_sort(keys_.begin(), keys_.end(),
                   [](const KeyRecord& a, const KeyRecord& b) { return a.index < b.index; });
  const char* error = s.ok() ? nullptr : Status::CodeName(s.code());
  const uint64_t elapsed_us = (perf_internal::NowNanos() - start_nanos_) / 1000;
  std::vector<std::pair<LogLevel, std::string>> lines;
  lines.reserve(1 + keys_.size());
  char buf[64];
  std::string summary = "[";
  summary += op_;
  summary += "] elapsed_us=";
  summary += std::to_string(elapsed_us);
  for (size_t i = 0; i < num_fields_; i++) {
    std::snprintf(buf, sizeof(buf), " %s=%" PRIu64, fields_[i].name, fields_[i].value);
    summary += buf;
  }
  if (error != nullptr) {
    summary += " error=";
    summary += error;
  }
  lines.emplace_back(LogLevel::kInfo, std::move(summary));
  for (const KeyRecord& r : keys_) {
    const bool ok = r.code >= 0;
    std::string line = ok ? "success=1" : "success=0";
    if (r.index < keys.size()) {
      line += " key=";
      line += PrintableKey(keys[r.index]);
    }
    if (r.size >= 0) {
      line += " size=";
      line += std::to_string(r.size);
    }
    if (r.exists >= 0) {
      line += " exists=";
      line += std::to_string(r.exists);
    }
    if (r.tier != nullptr) {
      line += " tier=";
      line += r.tier;
    }
    if (!ok) {
      line += " error=";
      line += r.code >= -static_cast<int64_t>(ErrorCounters::kNumCodes - 1)
                  ? Status::CodeName(static_cast<Status::Code>(-r.code))
                  : "unknown";
    }
    lines.emplace_back(ok ? LogLevel::kDebug : LogLevel::kInfo, std::move(line));
  }
  logger_->WriteGroup(lines);
  return s;
}

}  // namespace kvengine
