#include "db_bench/trace_generator.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <unordered_map>

namespace kvbench {

using kvengine::Status;

Status ParseTraceKind(const std::string& name, TraceKind* kind) {
  if (name == "conversation") {
    *kind = TraceKind::kConversation;
  } else if (name == "agent") {
    *kind = TraceKind::kAgent;
  } else if (name == "synthetic") {
    *kind = TraceKind::kSynthetic;
  } else {
    return Status::InvalidArgument("unknown trace kind '" + name +
                                   "' (known: conversation, agent, synthetic)");
  }
  return Status::OK();
}

const char* TraceKindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kConversation:
      return "conversation";
    case TraceKind::kAgent:
      return "agent";
    case TraceKind::kSynthetic:
      return "synthetic";
  }
  return "?";
}

namespace {

// The sizes of one kind of trace, in tokens (uniform in [lo, hi]).
struct Shape {
  uint64_t prefix_lo, prefix_hi;    // a shared system prompt, tool set or document
  uint64_t message_lo, message_hi;  // what a turn appends: user message, tool output, question
  uint64_t output_lo, output_hi;    // the model's answer
  uint64_t turns_lo, turns_hi;      // turns per session (1: no sessions)
  double new_session;               // chance that an arrival opens a session
};

Shape ShapeOf(TraceKind kind) {
  switch (kind) {
    case TraceKind::kConversation:
      return {1000, 3000, 50, 1500, 50, 800, 1, 12, 0.3};
    case TraceKind::kAgent:
      return {4000, 12000, 100, 2000, 20, 300, 5, 30, 0.15};
    case TraceKind::kSynthetic:
      return {2000, 16000, 50, 500, 50, 500, 1, 1, 1.0};
  }
  return {};
}

// Draws computed here from the raw 64-bit stream, so every platform gets the same trace.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}

  double Unit() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t Between(uint64_t lo, uint64_t hi) { return lo + rng_() % (hi - lo + 1); }
  // Seconds to the next arrival of a Poisson process of `rate` per second.
  double Exponential(double rate) { return -std::log(1.0 - Unit()) / rate; }
  // An index in [0, n), index i with weight 1/(i+1)^s.
  size_t Zipf(size_t n, double s) {
    if (weights_.size() != n || weights_s_ != s) {
      weights_.resize(n);
      double sum = 0;
      for (size_t i = 0; i < n; i++)
        weights_[i] = sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
      weights_s_ = s;
    }
    const double u = Unit() * weights_.back();
    return std::min<size_t>(
        std::upper_bound(weights_.begin(), weights_.end(), u) - weights_.begin(), n - 1);
  }

 private:
  std::mt19937_64 rng_;
  std::vector<double> weights_;  // cumulative, for the last (n, s) asked
  double weights_s_ = -1;
};

// A context that grows: the ids of its full blocks and its length in tokens.
struct Context {
  std::vector<uint64_t> full_ids;
  uint64_t tokens = 0;
  uint64_t turns_left = 0;
};

class Generator {
 public:
  explicit Generator(const TraceGeneratorOptions& o)
      : o_(o), shape_(ShapeOf(o.kind)), draw_(o.seed), session_draw_(o.seed ^ 0x5e551011ull) {
    for (uint64_t i = 0; i < o.shared_prefixes; i++) {
      Context prefix;
      Extend(&prefix, draw_.Between(shape_.prefix_lo, shape_.prefix_hi), nullptr);
      prefixes_.push_back(std::move(prefix));
    }
  }

  void Run(std::vector<TraceRequest>* out) {
    double now_s = 0;
    for (uint64_t i = 0; i < o_.requests; i++) {
      if (i > 0) now_s += draw_.Exponential(o_.rate_per_s);
      TraceRequest r;
      r.timestamp_ms = std::floor(now_s * 1000.0);
      Context* session = PickSession();
      const uint64_t message = draw_.Between(shape_.message_lo, shape_.message_hi);
      Extend(session, message, &r.hash_ids);
      r.input_length = session->tokens;
      r.output_length = draw_.Between(shape_.output_lo, shape_.output_hi);
      session->tokens += r.output_length;  // the answer is part of the next turn's prompt
      if (--session->turns_left == 0) live_.erase(live_.begin());
      out->push_back(std::move(r));
    }
    NumberByFirstUse(out);
  }

  // Renumbers the ids in the order the trace first uses them, as Mooncake's are (the
  // shared prefixes took theirs before any request arrived).
  static void NumberByFirstUse(std::vector<TraceRequest>* trace) {
    std::unordered_map<uint64_t, uint64_t> renumbered;
    for (TraceRequest& r : *trace) {
      for (uint64_t& id : r.hash_ids)
        id = renumbered.try_emplace(id, renumbered.size()).first->second;
    }
  }

 private:
  // Moves the session this arrival continues (or a new one) to the front of live_.
  Context* PickSession() {
    if (live_.empty() || session_draw_.Unit() < shape_.new_session) {
      Context session = prefixes_[draw_.Zipf(prefixes_.size(), o_.zipf)];
      session.turns_left = draw_.Between(shape_.turns_lo, shape_.turns_hi);
      live_.insert(live_.begin(), std::move(session));
      if (live_.size() > kMaxLive) live_.pop_back();  // the least recently active leaves
    } else {
      const size_t at = session_draw_.Zipf(live_.size(), o_.zipf);
      std::rotate(live_.begin(), live_.begin() + static_cast<ptrdiff_t>(at),
                  live_.begin() + static_cast<ptrdiff_t>(at) + 1);
    }
    return &live_.front();
  }

  // Appends `tokens` to *c; when ids is set, stores the ids of every block of the new
  // context in it: the full blocks c already had keep theirs, the rest are new.
  void Extend(Context* c, uint64_t tokens, std::vector<uint64_t>* ids) {
    const uint64_t bt = o_.block_tokens;
    c->tokens += tokens;
    // Blocks that were partly filled before, and the answer's blocks, are new content.
    while (c->full_ids.size() < c->tokens / bt) c->full_ids.push_back(next_id_++);
    if (ids == nullptr) return;
    *ids = c->full_ids;
    if (c->tokens % bt != 0) ids->push_back(next_id_++);  // the partly filled last block
  }

  static constexpr size_t kMaxLive = 256;

  const TraceGeneratorOptions o_;
  const Shape shape_;
  Draw draw_;          // sizes, prefixes, arrivals
  Draw session_draw_;  // which session a turn continues
  std::vector<Context> prefixes_;
  std::vector<Context> live_;  // most recently active first
  uint64_t next_id_ = 0;
};

}  // namespace

Status GenerateTrace(const TraceGeneratorOptions& o, std::vector<TraceRequest>* out) {
  if (o.requests < 1 || o.requests > 10'000'000) {
    return Status::InvalidArgument("trace requests must be in [1, 10000000]");
  }
  if (!(o.rate_per_s > 0) || !std::isfinite(o.rate_per_s)) {
    return Status::InvalidArgument("trace rate must be > 0 requests per second");
  }
  if (o.block_tokens < 1 || o.block_tokens > (1u << 20)) {
    return Status::InvalidArgument("block tokens must be in [1, 1048576]");
  }
  if (o.shared_prefixes < 1 || o.shared_prefixes > 1'000'000) {
    return Status::InvalidArgument("trace shared prefixes must be in [1, 1000000]");
  }
  if (!(o.zipf >= 0 && o.zipf <= 10)) {
    return Status::InvalidArgument("trace zipf exponent must be in [0, 10]");
  }
  out->clear();
  Generator(o).Run(out);
  return Status::OK();
}

}  // namespace kvbench
