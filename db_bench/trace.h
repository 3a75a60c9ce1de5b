// Request traces in Mooncake's published format (kvcache-ai/Mooncake, FAST25-release/traces):
// JSON lines, one request per line,
//
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}
//
// timestamp: arrival in milliseconds since the first request (not decreasing from line to
// line); input_length and output_length: tokens; hash_ids: one id per block of the prompt
// (512 tokens in the published traces), an id standing for the whole prefix up to and
// including its block, so two requests that share their first k ids share a k-block prefix.
// Other members of a line (a converter's "session_id") are skipped; blank lines too.
//
// Thread-safety: plain functions and values.
#ifndef KVENGINE_DB_BENCH_TRACE_H_
#define KVENGINE_DB_BENCH_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/status.h"

namespace kvbench {

struct TraceRequest {
  double timestamp_ms = 0;
  uint64_t input_length = 0;   // tokens
  uint64_t output_length = 0;  // tokens
  std::vector<uint64_t> hash_ids;

  bool operator==(const TraceRequest&) const = default;
};

// Parses one line.  On a malformed line (not one JSON object, a member missing or of the
// wrong type, a negative or fractional length or id) returns InvalidArgument saying what
// is wrong and where in the line, and leaves *out unspecified.
kvengine::Status ParseTraceLine(std::string_view line, TraceRequest* out);

// The line ParseTraceLine reads back as `r` (no newline), members in the published order.
std::string FormatTraceLine(const TraceRequest& r);

// Reads a whole trace.  An error names the file and the line ("trace.jsonl:17: ...");
// a timestamp earlier than the line before's is one.  An empty trace is one too.
kvengine::Status ReadTrace(const std::string& path, std::vector<TraceRequest>* out);
// Parses a whole trace held in memory; `name` stands for the file in messages.
kvengine::Status ParseTrace(std::string_view text, const std::string& name,
                            std::vector<TraceRequest>* out);

// Writes `requests` one line each (replaces the file).
kvengine::Status WriteTrace(const std::string& path, const std::vector<TraceRequest>& requests);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_TRACE_H_
