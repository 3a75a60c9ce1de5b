// Synthetic request traces in Mooncake's format (db_bench/trace.h), so that the trace
// benchmark runs on a fresh machine with nothing downloaded.  Three shapes:
//
//   conversation  chat sessions: each opens with one of a few shared system prompts
//                 (chosen by Zipf), and every later turn re-sends the whole conversation
//                 so far (its earlier prompt, the model's answer) plus a new user message,
//                 so a turn's blocks extend the previous turn's.  A turn continues one of
//                 the live sessions, the recently active ones most likely (Zipf over
//                 recency), or opens a new one.
//   agent         tool-using agents: long shared tool definitions, many short turns, each
//                 appending a tool's output to the context (longer sessions, more reuse).
//   synthetic     question answering over shared documents: each request is one document
//                 of a pool (Zipf) followed by a question of its own; no sessions.
//
// Arrivals are a Poisson process at rate_per_s.  Block ids are handed out as Mooncake's
// traces do: a new block (a prefix never seen) takes the next integer; a block is the same
// id wherever the same prefix recurs.  A request's last, partly filled block is always
// new: the next turn extends it, which changes its content.
//
// Deterministic: the same options give the same trace, on every machine (the random
// streams are std::mt19937_64 and the draws are computed here, not by <random>'s
// distributions, whose results the standard leaves to the library).
#ifndef KVENGINE_DB_BENCH_TRACE_GENERATOR_H_
#define KVENGINE_DB_BENCH_TRACE_GENERATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "db_bench/trace.h"
#include "kvengine/status.h"

namespace kvbench {

enum class TraceKind { kConversation, kAgent, kSynthetic };

// "conversation", "agent", "synthetic"; InvalidArgument naming the three otherwise.
kvengine::Status ParseTraceKind(const std::string& name, TraceKind* kind);
const char* TraceKindName(TraceKind kind);

struct TraceGeneratorOptions {
  TraceKind kind = TraceKind::kConversation;
  // Requests in the trace.  Default: 1000
  uint64_t requests = 1000;
  // Seed of every draw.  Default: 1
  uint64_t seed = 1;
  // Mean arrivals per second (Poisson).  Default: 4
  double rate_per_s = 4;
  // Tokens per block id (Mooncake's traces: 512).  Default: 512
  uint64_t block_tokens = 512;
  // Shared prefixes: system prompts (conversation), tool sets (agent) or documents
  // (synthetic).  Default: 8
  uint64_t shared_prefixes = 8;
  // Zipf exponent of the choice of a shared prefix and of the session a turn continues
  // (0: uniform).  Default: 1.0
  double zipf = 1.0;
};

// The trace; InvalidArgument (naming the option) when an option is out of range:
// requests 1..10^7, rate_per_s > 0, block_tokens 1..2^20, shared_prefixes 1..10^6,
// zipf 0..10.
kvengine::Status GenerateTrace(const TraceGeneratorOptions& options,
                               std::vector<TraceRequest>* out);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_TRACE_GENERATOR_H_
