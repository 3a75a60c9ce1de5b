// The trace benchmark's pieces without the engine: the parser of Mooncake's trace format
// (good and bad lines), the generator (deterministic by seed, in the format, shaped as
// documented) and the ideal caches (a hand-checked trace).
#include "db_bench/trace.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "db_bench/prefix_cache_model.h"
#include "db_bench/trace_generator.h"

namespace kvbench {
namespace {

using kvengine::Status;

TraceRequest Parsed(const std::string& line) {
  TraceRequest r;
  Status s = ParseTraceLine(line, &r);
  EXPECT_TRUE(s.ok()) << line << ": " << s.ToString();
  return r;
}

std::string ErrorOf(const std::string& line) {
  TraceRequest r;
  Status s = ParseTraceLine(line, &r);
  EXPECT_TRUE(s.IsInvalidArgument()) << line << " parsed";
  return s.ToString();
}

TEST(TraceParseTest, PublishedLine) {
  const TraceRequest r = Parsed(
      R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353, 2354]})");
  EXPECT_EQ(r.timestamp_ms, 27482);
  EXPECT_EQ(r.input_length, 6955u);
  EXPECT_EQ(r.output_length, 52u);
  EXPECT_EQ(r.hash_ids, (std::vector<uint64_t>{46, 47, 2353, 2354}));
}

TEST(TraceParseTest, OtherShapesOfGoodLines) {
  // Members in any order, no blanks, a fractional timestamp, CR LF endings.
  TraceRequest r = Parsed(
      "{\"hash_ids\":[0],\"output_length\":1,\"timestamp\":3.5,"
      "\"input_length\":100}\r");
  EXPECT_EQ(r.timestamp_ms, 3.5);
  EXPECT_EQ(r.hash_ids, (std::vector<uint64_t>{0}));
  // Members a converter adds are skipped, whatever their JSON type.
  r = Parsed(
      R"({"session_id": "conv_0", "timestamp": 0, "meta": {"a": [1, {"b": null}], "c": true},)"
      R"( "input_length": 0, "output_length": 0, "hash_ids": [], "x": -1.5e3})");
  EXPECT_TRUE(r.hash_ids.empty());
  EXPECT_EQ(r.input_length, 0u);
}

TEST(TraceParseTest, BadLinesSayWhatIsWrong) {
  const std::string good_tail = R"("output_length": 1, "hash_ids": [1]})";
  struct Case {
    std::string line;
    std::string says;
  } cases[] = {
      {"", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {R"({"timestamp": 0, "input_length": 5, "output_length": 1})", "no \"hash_ids\" member"},
      {R"({"input_length": 5, )" + good_tail, "no \"timestamp\" member"},
      {R"({"timestamp": -1, "input_length": 5, )" + good_tail,
       "\"timestamp\" is not a number >= 0"},
      {R"({"timestamp": 0, "input_length": -5, )" + good_tail, "\"input_length\" is not a whole"},
      {R"({"timestamp": 0, "input_length": 5.5, )" + good_tail, "\"input_length\" is not a whole"},
      {R"({"timestamp": 0, "input_length": "5", )" + good_tail, "\"input_length\" is not a number"},
      {R"({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "2"]})",
       "\"hash_ids[1]\" is not a number"},
      {R"({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2.5]})",
       "\"hash_ids[1]\" is not a whole number"},
      {R"({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": 7})",
       "\"hash_ids\" is not an array"},
      {R"({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2})",
       "not closed"},
      {R"({"timestamp": 0, "input_length": 5, )" + good_tail + " trailing",
       "text after the object"},
      {R"({"timestamp": 0 "input_length": 5})", "expected ',' or '}'"},
      {R"({"timestamp": 0, "x": tru, )" + good_tail, "the value of \"x\" is not JSON"},
      {R"({timestamp: 0})", "expected a member name"},
  };
  for (const Case& c : cases) {
    const std::string error = ErrorOf(c.line);
    EXPECT_NE(error.find(c.says), std::string::npos) << c.line << " gave: " << error;
  }
}

TEST(TraceParseTest, TraceNamesTheBadLine) {
  const std::string good =
      R"({"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": [1]})";
  std::vector<TraceRequest> out;
  // Blank lines are skipped but counted.
  Status s = ParseTrace(good + "\n\n" + good + "\n{\"timestamp\": 11}\n", "t.jsonl", &out);
  ASSERT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.ToString().find("t.jsonl:4: no \"input_length\" member"), std::string::npos)
      << s.ToString();
  const std::string earlier =
      R"({"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [1]})";
  s = ParseTrace(good + "\n" + earlier + "\n", "t.jsonl", &out);
  ASSERT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.ToString().find("t.jsonl:2: timestamp 9 is earlier than the line before's 10"),
            std::string::npos)
      << s.ToString();
  EXPECT_TRUE(ParseTrace("\n \n", "empty.jsonl", &out).IsInvalidArgument());
  ASSERT_TRUE(ParseTrace(good + "\n\n" + good, "t.jsonl", &out).ok());  // no final newline
  EXPECT_EQ(out.size(), 2u);
}

TEST(TraceParseTest, WriteThenReadIsTheSameTrace) {
  const char* tmp = std::getenv("KV_TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / "trace_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "roundtrip.jsonl").string();
  std::vector<TraceRequest> in = {{0, 600, 5, {0, 1}}, {1.25, 10, 0, {}}, {3000, 513, 7, {0, 9}}};
  ASSERT_TRUE(WriteTrace(path, in).ok());
  std::vector<TraceRequest> out;
  ASSERT_TRUE(ReadTrace(path, &out).ok());
  EXPECT_EQ(out, in);
  std::ifstream text(path);
  std::string first;
  std::getline(text, first);
  EXPECT_EQ(first,
            R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]})");
  Status s = ReadTrace((dir / "absent.jsonl").string(), &out);
  EXPECT_TRUE(s.IsIOError());
  EXPECT_NE(s.ToString().find("absent.jsonl"), std::string::npos);
}

// ---------------------------------------------------------------- generator

std::vector<TraceRequest> Generated(TraceKind kind, uint64_t seed, uint64_t requests = 2000) {
  TraceGeneratorOptions o;
  o.kind = kind;
  o.seed = seed;
  o.requests = requests;
  std::vector<TraceRequest> out;
  EXPECT_TRUE(GenerateTrace(o, &out).ok());
  return out;
}

TEST(TraceGeneratorTest, DeterministicBySeed) {
  for (TraceKind kind : {TraceKind::kConversation, TraceKind::kAgent, TraceKind::kSynthetic}) {
    const auto a = Generated(kind, 7), b = Generated(kind, 7), c = Generated(kind, 8);
    EXPECT_EQ(a, b) << TraceKindName(kind);
    EXPECT_NE(a, c) << TraceKindName(kind);
  }
}

TEST(TraceGeneratorTest, InTheFormatAndShapedAsDocumented) {
  for (TraceKind kind : {TraceKind::kConversation, TraceKind::kAgent, TraceKind::kSynthetic}) {
    SCOPED_TRACE(TraceKindName(kind));
    const auto trace = Generated(kind, 3);
    ASSERT_EQ(trace.size(), 2000u);
    // What it writes parses back the same (the published format, line by line).
    std::string text;
    for (const auto& r : trace) text += FormatTraceLine(r) + "\n";
    std::vector<TraceRequest> parsed;
    ASSERT_TRUE(ParseTrace(text, "generated", &parsed).ok());
    EXPECT_EQ(parsed, trace);
    uint64_t next_new = 0, extends = 0, max_input = 0;
    std::set<uint64_t> first_blocks;
    for (size_t i = 0; i < trace.size(); i++) {
      const TraceRequest& r = trace[i];
      // One id per 512-token block, as in Mooncake's traces.
      EXPECT_EQ(r.hash_ids.size(), (r.input_length + 511) / 512);
      if (i > 0) {
        EXPECT_GE(r.timestamp_ms, trace[i - 1].timestamp_ms);
      }
      // New ids are handed out in order: an id never seen is the next integer.
      for (uint64_t id : r.hash_ids) {
        ASSERT_LE(id, next_new);
        if (id == next_new) next_new++;
      }
      first_blocks.insert(r.hash_ids.front());
      // A turn that extends an earlier request: its prefix holds all but that request's
      // last (partly filled) block, and its prompt holds that request's prompt and answer.
      for (size_t j = i; j-- > 0 && j + 50 > i;) {
        const TraceRequest& p = trace[j];
        if (p.hash_ids.size() >= 2 && r.hash_ids.size() > p.hash_ids.size() &&
            r.input_length >= p.input_length + p.output_length &&
            std::equal(p.hash_ids.begin(), p.hash_ids.end() - 1, r.hash_ids.begin())) {
          extends++;
          break;
        }
      }
      max_input = std::max(max_input, r.input_length);
    }
    // Shared prefixes: at most 8 distinct first blocks (the default shared_prefixes).
    EXPECT_LE(first_blocks.size(), 8u);
    if (kind == TraceKind::kSynthetic) {
      EXPECT_LE(max_input, 16000u + 500u);  // no sessions: a document and a question
    } else {
      EXPECT_GT(extends, trace.size() / 4);  // multi-turn sessions
    }
    // Poisson arrivals at 4 per second: the mean gap is 250 ms (within 10% over 2000).
    const double mean_gap_ms = trace.back().timestamp_ms / static_cast<double>(trace.size() - 1);
    EXPECT_NEAR(mean_gap_ms, 250.0, 25.0);
  }
}

TEST(TraceGeneratorTest, BadOptionsAreRefused) {
  std::vector<TraceRequest> out;
  TraceGeneratorOptions o;
  o.requests = 0;
  EXPECT_TRUE(GenerateTrace(o, &out).IsInvalidArgument());
  o = {};
  o.rate_per_s = 0;
  EXPECT_TRUE(GenerateTrace(o, &out).IsInvalidArgument());
  o = {};
  o.zipf = std::nan("");
  EXPECT_TRUE(GenerateTrace(o, &out).IsInvalidArgument());
  TraceKind kind;
  Status s = ParseTraceKind("chat", &kind);
  ASSERT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.ToString().find("conversation, agent, synthetic"), std::string::npos);
}

// ---------------------------------------------------------------- ideal caches

TEST(PrefixCacheModelTest, HandCheckedTrace) {
  // Block ids; 100 tokens per block, every request's input is its blocks' tokens.
  const std::vector<std::vector<uint64_t>> ids = {{1, 2}, {1, 2, 3}, {4},
                                                  {1, 2}, {1, 2, 5}, {1, 9, 2}};
  std::vector<TraceRequest> trace;
  for (const auto& r : ids) trace.push_back({0, 100 * r.size(), 1, r});
  // LRU of 3 blocks, most recent first after each request:
  //   {1,2}    0 hits  -> 2 1
  //   {1,2,3}  2 hits  -> 3 2 1
  //   {4}      0 hits  -> 4 3 2      (1 evicted)
  //   {1,2}    0 hits  -> 2 1 4      (1 is gone, so 2 cannot count: a prefix)
  //   {1,2,5}  2 hits  -> 5 2 1
  //   {1,9,2}  1 hit   -> 2 9 1      (9 missing ends the prefix)
  BlockLruCache lru(3);
  std::vector<uint64_t> hits;
  for (const auto& r : trace) hits.push_back(lru.Access(r.hash_ids));
  EXPECT_EQ(hits, (std::vector<uint64_t>{0, 2, 0, 0, 2, 1}));
  EXPECT_EQ(lru.size(), 3u);
  const PrefixHits l = SimulatePrefixCache(trace, 3, 100);
  EXPECT_EQ(l.blocks, 14u);
  EXPECT_EQ(l.hit_blocks, 5u);
  EXPECT_EQ(l.hit_tokens, 500u);
  // Infinite: 0, 2, 0, 2, 2, 1.
  const PrefixHits inf = SimulatePrefixCache(trace, std::numeric_limits<uint64_t>::max(), 100);
  EXPECT_EQ(inf.hit_blocks, 7u);
  EXPECT_DOUBLE_EQ(inf.Ratio(), 7.0 / 14.0);
  // Nothing held, nothing hit.
  EXPECT_EQ(SimulatePrefixCache(trace, 0, 100).hit_blocks, 0u);
}

TEST(PrefixCacheModelTest, HitTokensStopAtTheInput) {
  // A last block partly filled: 2 blocks of 512 for 700 tokens.
  std::vector<TraceRequest> trace = {{0, 700, 1, {1, 2}}, {0, 700, 1, {1, 2}}};
  const PrefixHits h = SimulatePrefixCache(trace, 10, 512);
  EXPECT_EQ(h.hit_blocks, 2u);
  EXPECT_EQ(h.hit_tokens, 700u);
  EXPECT_EQ(h.tokens, 1400u);
}

TEST(PrefixCacheModelTest, RequestLongerThanTheCacheKeepsItsTail) {
  BlockLruCache lru(2);
  EXPECT_EQ(lru.Access({1, 2, 3}), 0u);
  EXPECT_EQ(lru.size(), 2u);
  EXPECT_EQ(lru.Access({2, 3}), 2u);
  EXPECT_EQ(lru.Access({1}), 0u);
}

}  // namespace
}  // namespace kvbench
