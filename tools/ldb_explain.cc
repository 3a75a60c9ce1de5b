// kv_ldb explain: summarises a file of per-request accounts (one JSON object a line, as
// the vLLM connector writes them with its request_account option; docs/observability.md,
// "The request account"): the hit ratio of each tier, the slowest requests and the reasons
// blocks missed, most frequent first.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/ldb_commands.h"

DECLARE_string(log);
DECLARE_uint64(limit);

namespace kvengine {
namespace ldb {

namespace {

using nlohmann::json;

// What the summary keeps of one request.
struct RequestTimes {
  std::string id;
  double first_layer_ms = 0;
  double last_layer_ms = 0;
  double save_ms = 0;
  uint64_t tokens_asked = 0;
  uint64_t tokens_hit = 0;
};

// The totals of a file.
struct Summary {
  uint64_t requests = 0;
  uint64_t skipped = 0;  // lines that are not an account
  uint64_t tokens_asked = 0;
  uint64_t tokens_hit = 0;
  std::map<std::string, uint64_t> hit_by_tier;
  std::map<std::string, uint64_t> miss_reasons;  // "evicted (capacity, memory)" -> blocks
  std::vector<RequestTimes> requests_times;
};

uint64_t Count(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

double Millis(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string Text(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// A missed block's reason as the summary ranks it: the reason with what tells its kind
// apart ("evicted (capacity, memory)", "unreadable (corruption)",
// "slower_than_recompute (ssd)": the tiers the load planner would have read).
std::string ReasonOf(const json& missed) {
  std::string reason = Text(missed, "reason");
  if (reason.empty()) reason = "unknown";
  if (reason == "evicted")
    return reason + " (" + Text(missed, "by") + ", " + Text(missed, "tier") + ")";
  if (reason == "unreadable") return reason + " (" + Text(missed, "error") + ")";
  auto estimate = missed.find("estimate");
  if (reason == "slower_than_recompute" && estimate != missed.end() && estimate->is_object()) {
    auto tiers = estimate->find("tiers");
    std::string names;
    if (tiers != estimate->end() && tiers->is_array()) {
      for (const auto& t : *tiers) {
        if (t.is_string()) names += (names.empty() ? "" : ", ") + t.get<std::string>();
      }
    }
    if (!names.empty()) return reason + " (" + names + ")";
  }
  return reason;
}

// Adds one line; false when it is not an account (not JSON, or no request_id).
bool AddLine(const std::string& line, Summary* s) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("request_id")) return false;
  RequestTimes t;
  t.id = j["request_id"].is_string() ? j["request_id"].get<std::string>() : j["request_id"].dump();
  t.tokens_asked = Count(j, "tokens_asked");
  t.tokens_hit = Count(j, "tokens_hit");
  t.save_ms = Millis(j, "save_ms");
  auto load = j.find("load_ms");
  if (load != j.end() && load->is_object()) {
    t.first_layer_ms = Millis(*load, "first_layer");
    t.last_layer_ms = Millis(*load, "last_layer");
  }
  auto tiers = j.find("tokens_hit_by_tier");
  if (tiers != j.end() && tiers->is_object()) {
    for (const auto& [tier, tokens] : tiers->items()) {
      if (tokens.is_number_unsigned()) s->hit_by_tier[tier] += tokens.get<uint64_t>();
    }
  }
  auto missed = j.find("missed");
  if (missed != j.end() && missed->is_array()) {
    for (const json& m : *missed) {
      if (m.is_object()) s->miss_reasons[ReasonOf(m)]++;
    }
  }
  s->requests++;
  s->tokens_asked += t.tokens_asked;
  s->tokens_hit += t.tokens_hit;
  s->requests_times.push_back(std::move(t));
  return true;
}

void PrintRatio(const char* tier, uint64_t hit, uint64_t asked) {
  std::printf("hit ratio %s: %.4f (%llu of %llu tokens asked)\n", tier,
              asked ? static_cast<double>(hit) / static_cast<double>(asked) : 0.0,
              static_cast<unsigned long long>(hit), static_cast<unsigned long long>(asked));
}

void Print(Summary* s, size_t slowest) {
  std::printf("requests: %llu\n", static_cast<unsigned long long>(s->requests));
  if (s->skipped) {
    std::printf("skipped lines: %llu (not an account)\n",
                static_cast<unsigned long long>(s->skipped));
  }
  for (const auto& [tier, hit] : s->hit_by_tier) PrintRatio(tier.c_str(), hit, s->tokens_asked);
  PrintRatio("all", s->tokens_hit, s->tokens_asked);
  // The slowest: the last layer ready latest (what the first token waits for), then the
  // longest save.
  std::sort(s->requests_times.begin(), s->requests_times.end(),
            [](const RequestTimes& a, const RequestTimes& b) {
              if (a.last_layer_ms != b.last_layer_ms) return a.last_layer_ms > b.last_layer_ms;
              if (a.save_ms != b.save_ms) return a.save_ms > b.save_ms;
              return a.id < b.id;
            });
  std::printf("slowest requests (by last layer ready, then save):\n");
  for (size_t i = 0; i < s->requests_times.size() && i < slowest; i++) {
    const RequestTimes& t = s->requests_times[i];
    std::printf(
        "  %zu. %s  last_layer_ms=%.3f first_layer_ms=%.3f save_ms=%.3f tokens_hit=%llu of %llu\n",
        i + 1, t.id.c_str(), t.last_layer_ms, t.first_layer_ms, t.save_ms,
        static_cast<unsigned long long>(t.tokens_hit),
        static_cast<unsigned long long>(t.tokens_asked));
  }
  std::vector<std::pair<std::string, uint64_t>> reasons(s->miss_reasons.begin(),
                                                        s->miss_reasons.end());
  std::stable_sort(reasons.begin(), reasons.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::printf("miss reasons (blocks, most first):\n");
  for (const auto& [reason, blocks] : reasons) {
    std::printf("  %s: %llu\n", reason.c_str(), static_cast<unsigned long long>(blocks));
  }
}

class ExplainCommand : public LdbCommand {
 public:
  const char* Name() const override { return "explain"; }
  const char* Help() const override {
    return "explain --log=FILE [--limit=N]\n"
           "  Summarises a file of per-request accounts (the vLLM connector's\n"
           "  request_account): the hit ratio of each tier over the tokens asked, the\n"
           "  slowest requests (last layer ready, then save time; --limit of them, 10 by\n"
           "  default) and why blocks missed, most frequent first. Lines that are not an\n"
           "  account are counted and skipped. No --db.";
  }
  std::vector<std::string> Flags() const override { return {"log", "limit"}; }
  bool NeedsDb() const override { return false; }

  int DoCommand(const std::vector<std::string>&) override {
    if (FLAGS_log.empty()) {
      std::fprintf(stderr, "kv_ldb explain: --log=FILE is required\n");
      return kExitUsage;
    }
    std::ifstream in(FLAGS_log);
    if (!in) {
      std::fprintf(stderr, "kv_ldb explain: cannot open %s\n", FLAGS_log.c_str());
      return kExitFailure;
    }
    Summary s;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (!AddLine(line, &s)) s.skipped++;
    }
    Print(&s, FLAGS_limit == 0 ? 10 : static_cast<size_t>(FLAGS_limit));
    return kExitOk;
  }
};

}  // namespace

std::unique_ptr<LdbCommand> NewExplainCommand() { return std::make_unique<ExplainCommand>(); }

}  // namespace ldb
}  // namespace kvengine
