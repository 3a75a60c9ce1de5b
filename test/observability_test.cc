// The DB's observability: structured call logs through the callback sink, perf levels
// chosen by option and environment, the perf / stats / Prometheus properties, reset.
#include <cstdlib>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "kvengine/perf.h"
#include "test/json_check.h"
#include "test/test_util.h"
#include "util/perf_point.h"

namespace kvengine {
namespace {

// One log line split into its tag ("[batch_put]", or "" for a key line) and its
// name=value fields, in order.
struct LogLine {
  LogLevel level;
  std::string tag;
  std::vector<std::pair<std::string, std::string>> fields;
};

LogLine Parse(LogLevel level, const std::string& text) {
  LogLine line{level, "", {}};
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    if (word.front() == '[' && line.fields.empty() && line.tag.empty()) {
      line.tag = word;
      continue;
    }
    const size_t eq = word.find('=');
    if (eq == std::string::npos) {
      line.fields.emplace_back(word, "<no '='>");
    } else {
      line.fields.emplace_back(word.substr(0, eq), word.substr(eq + 1));
    }
  }
  return line;
}

using Fields = std::vector<std::pair<std::string, std::string>>;

class ObservabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.memory_capacity_bytes = 8 << 20;
    options_.memory_slab_size = 1 << 20;
    options_.apply_environment = false;
    options_.log_level = LogLevel::kDebug;
    options_.log_callback = [this](LogLevel level, const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(Parse(level, line));
    };
    ResetPerf();
  }
  void TearDown() override {
    if (db_) db_->Close();
    SetPerfLevel(PerfLevel::kOff);
    ResetPerf();
  }
  void Open() {
    Status s = DB::Open(options_, dir_.path(), &db_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::vector<LogLine> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(lines_, {});
  }
  // Checks one summary line: tag, then elapsed_us (any number), then `rest` exactly.
  static void ExpectSummary(const LogLine& line, const std::string& tag, const Fields& rest) {
    EXPECT_EQ(line.tag, tag);
    EXPECT_EQ(line.level, LogLevel::kInfo);
    ASSERT_GE(line.fields.size(), 1u) << tag;
    EXPECT_EQ(line.fields[0].first, "elapsed_us");
    EXPECT_TRUE(std::regex_match(line.fields[0].second, std::regex("[0-9]+")))
        << line.fields[0].second;
    Fields tail(line.fields.begin() + 1, line.fields.end());
    EXPECT_EQ(tail, rest) << tag;
  }
  static void ExpectKeyLine(const LogLine& line, LogLevel level, const Fields& fields) {
    EXPECT_EQ(line.tag, "");
    EXPECT_EQ(line.level, level);
    EXPECT_EQ(line.fields, fields);
  }
  static std::vector<Slice> Slices(const std::vector<std::string>& v) {
    return std::vector<Slice>(v.begin(), v.end());
  }

  test::TempDir dir_;
  Options options_;
  std::unique_ptr<DB> db_;
  std::mutex mu_;
  std::vector<LogLine> lines_;
};

TEST_F(ObservabilityTest, BatchPutAndGetLogExactlyTheKnownFields) {
  Open();
  Take();
  const std::vector<std::string> keys = {"layer.0.req_0", "layer.1.req_0"};
  const std::string v0(1000, 'a'), v1(3000, 'b');
  std::vector<ValueParts> values = {{Slice(v0)}, {Slice(v1.data(), 1000), Slice(v1.data(), 2000)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), Slices(keys), values, &results).ok());
  auto lines = Take();
  ASSERT_EQ(lines.size(), 3u);
  ExpectSummary(lines[0], "[batch_put]", {{"num_keys", "2"}, {"total_bytes", "4000"}});
  ExpectKeyLine(lines[1], LogLevel::kDebug,
                {{"success", "1"}, {"key", "layer.0.req_0"}, {"size", "1000"}});
  ExpectKeyLine(lines[2], LogLevel::kDebug,
                {{"success", "1"}, {"key", "layer.1.req_0"}, {"size", "3000"}});

  // A get of one present and one absent key, and one whose buffer is too small.
  const std::vector<std::string> get_keys = {"layer.0.req_0", "layer.2.req_0", "layer.1.req_0"};
  std::vector<char> b0(1000), b1(1000), b2(10);
  std::vector<Destination> dests = {{MutableSlice(b0.data(), b0.size())},
                                    {MutableSlice(b1.data(), b1.size())},
                                    {MutableSlice(b2.data(), b2.size())}};
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), Slices(get_keys), dests, &results).ok());
  lines = Take();
  ASSERT_EQ(lines.size(), 4u);
  ExpectSummary(lines[0], "[batch_get_into]", {{"num_keys", "3"}, {"total_bytes", "1000"}});
  ExpectKeyLine(lines[1], LogLevel::kDebug,
                {{"success", "1"}, {"key", "layer.0.req_0"}, {"size", "1000"}, {"tier", "memory"}});
  ExpectKeyLine(lines[2], LogLevel::kInfo,
                {{"success", "0"}, {"key", "layer.2.req_0"}, {"error", "not_found"}});
  ExpectKeyLine(lines[3], LogLevel::kInfo,
                {{"success", "0"},
                 {"key", "layer.1.req_0"},
                 {"size", "3000"},
                 {"error", "buffer_too_small"}});
}

TEST_F(ObservabilityTest, ExistsAndDeleteLines) {
  Open();
  ASSERT_TRUE(db_->Put(WriteOptions(), "a", "x").ok());
  Take();
  const std::vector<std::string> keys = {"a", "b"};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchExists(Slices(keys), &results).ok());
  auto lines = Take();
  ASSERT_EQ(lines.size(), 3u);
  ExpectSummary(lines[0], "[batch_exists]", {{"num_keys", "2"}});
  ExpectKeyLine(lines[1], LogLevel::kDebug,
                {{"success", "1"}, {"key", "a"}, {"exists", "1"}, {"tier", "memory"}});
  ExpectKeyLine(lines[2], LogLevel::kDebug, {{"success", "1"}, {"key", "b"}, {"exists", "0"}});
  ASSERT_TRUE(db_->BatchDelete(WriteOptions(), Slices(keys), &results).ok());
  lines = Take();
  ASSERT_EQ(lines.size(), 3u);
  ExpectSummary(lines[0], "[batch_delete]", {{"num_keys", "2"}});
  ExpectKeyLine(lines[1], LogLevel::kDebug, {{"success", "1"}, {"key", "a"}});
  ExpectKeyLine(lines[2], LogLevel::kInfo,
                {{"success", "0"}, {"key", "b"}, {"error", "not_found"}});
}

TEST_F(ObservabilityTest, InfoLevelPrintsSummariesAndFailedKeysOnly) {
  options_.log_level = LogLevel::kInfo;
  Open();
  Take();
  const std::vector<std::string> keys = {"k0", "k1"};
  std::vector<ValueParts> values = {{Slice("v")}, {Slice("w")}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), Slices(keys), values, &results).ok());
  auto lines = Take();
  ASSERT_EQ(lines.size(), 1u);
  ExpectSummary(lines[0], "[batch_put]", {{"num_keys", "2"}, {"total_bytes", "2"}});
  const std::vector<std::string> get_keys = {"k0", "nope"};
  std::vector<char> b0(8), b1(8);
  std::vector<Destination> dests = {{MutableSlice(b0.data(), 8)}, {MutableSlice(b1.data(), 8)}};
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), Slices(get_keys), dests, &results).ok());
  lines = Take();
  ASSERT_EQ(lines.size(), 2u);
  ExpectSummary(lines[0], "[batch_get_into]", {{"num_keys", "2"}, {"total_bytes", "1"}});
  ExpectKeyLine(lines[1], LogLevel::kInfo,
                {{"success", "0"}, {"key", "nope"}, {"error", "not_found"}});
}

TEST_F(ObservabilityTest, WarnLevelPrintsNothingPerCall) {
  options_.log_level = LogLevel::kWarn;
  Open();
  const std::vector<std::string> keys = {"k0"};
  std::vector<ValueParts> values = {{Slice("v")}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), Slices(keys), values, &results).ok());
  const std::vector<std::string> missing = {"zz"};
  ASSERT_TRUE(db_->BatchExists(Slices(missing), &results).ok());
  ASSERT_TRUE(db_->BatchDelete(WriteOptions(), Slices(missing), &results).ok());
  EXPECT_TRUE(Take().empty());
}

TEST_F(ObservabilityTest, MalformedBatchAndOddKeys) {
  Open();
  Take();
  const std::vector<std::string> keys = {"a", "b"};
  std::vector<ValueParts> values = {{Slice("v")}};
  std::vector<int64_t> results;
  EXPECT_TRUE(db_->BatchPut(WriteOptions(), Slices(keys), values, &results).IsInvalidArgument());
  auto lines = Take();
  ASSERT_EQ(lines.size(), 1u);
  ExpectSummary(lines[0], "[batch_put]", {{"num_keys", "2"}, {"error", "invalid_argument"}});
  // Spaces, '=' and non-printable bytes are escaped so fields still split on spaces.
  const std::string odd("a b=c\x01\\", 7);
  const std::vector<std::string> odd_keys = {odd, ""};
  std::vector<ValueParts> two = {{Slice("v")}, {Slice("w")}};
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), Slices(odd_keys), two, &results).ok());
  lines = Take();
  ASSERT_EQ(lines.size(), 3u);
  ExpectSummary(lines[0], "[batch_put]", {{"num_keys", "2"}, {"total_bytes", "1"}});
  ExpectKeyLine(lines[1], LogLevel::kDebug,
                {{"success", "1"}, {"key", "a\\x20b\\x3dc\\x01\\x5c"}, {"size", "1"}});
  ExpectKeyLine(lines[2], LogLevel::kInfo,
                {{"success", "0"}, {"key", ""}, {"size", "1"}, {"error", "invalid_argument"}});
}

TEST_F(ObservabilityTest, EntryCallsGetASummaryWithElapsedTime) {
  Open();
  auto lines = Take();
  bool saw_open = false;
  for (const LogLine& l : lines) {
    if (l.tag == "[open]") {
      ExpectSummary(l, "[open]", {});
      saw_open = true;
    }
  }
  EXPECT_TRUE(saw_open);
  std::vector<char> buffer(4096);
  ASSERT_TRUE(db_->RegisterBuffer(buffer.data(), buffer.size()).ok());
  lines = Take();
  ASSERT_EQ(lines.size(), 1u);
  ExpectSummary(lines[0], "[register_buffer]", {{"length", "4096"}});
  ASSERT_TRUE(db_->Put(WriteOptions(), "x", "1").ok());
  Take();
  uint64_t deleted = 0;
  ASSERT_TRUE(db_->DeleteAll(&deleted).ok());
  lines = Take();
  ASSERT_EQ(lines.size(), 1u);
  ExpectSummary(lines[0], "[delete_all]", {{"deleted", "1"}});
  ASSERT_TRUE(db_->Close().ok());
  lines = Take();
  // Close's phases are timed at debug level (the SSD tier's, the teardown's).
  std::erase_if(lines, [](const LogLine& l) { return l.level == LogLevel::kDebug; });
  ASSERT_EQ(lines.size(), 1u);
  ExpectSummary(lines[0], "[close]", {});
  ASSERT_TRUE(db_->Close().ok());  // a second Close is no close: no line
  EXPECT_TRUE(Take().empty());
}

TEST_F(ObservabilityTest, PerfLevelOptionSelectsWhatIsTimed) {
  const std::vector<std::string> keys = {"a", "b"};
  std::vector<ValueParts> values = {{Slice("v")}, {Slice("w")}};
  std::vector<int64_t> results;
  for (PerfLevel level : {PerfLevel::kOff, PerfLevel::kEntry, PerfLevel::kAll}) {
    options_.perf_level = level;
    Open();
    db_->ResetPerf();
    ASSERT_TRUE(db_->BatchPut(WriteOptions(), Slices(keys), values, &results).ok());
    const uint64_t want_entry = level >= PerfLevel::kEntry ? 1 : 0;
    const uint64_t want_inner = level >= PerfLevel::kAll ? 2 : 0;
    EXPECT_EQ(PerfSnapshot(PerfKey::db_batch_put).count, want_entry);
    EXPECT_EQ(PerfSnapshot(PerfKey::db_put_one).count, want_inner);
    EXPECT_EQ(PerfSnapshot(PerfKey::memory_put).count, want_inner);
    EXPECT_EQ(PerfSnapshot(PerfKey::memory_allocate).count, want_inner);
    ASSERT_TRUE(db_->Close().ok());
    db_.reset();
  }
}

TEST_F(ObservabilityTest, OpenAndEnvFileIoAreTimed) {
  options_.perf_level = PerfLevel::kAll;
  Open();  // a new DB: writes and syncs its IDENTITY file, syncs the directory
  EXPECT_EQ(PerfSnapshot(PerfKey::db_open).count, 1u);
  EXPECT_GE(PerfSnapshot(PerfKey::env_file_write).count, 1u);
  EXPECT_GE(PerfSnapshot(PerfKey::env_file_sync).count, 2u);
  ASSERT_TRUE(db_->Close().ok());
  EXPECT_EQ(PerfSnapshot(PerfKey::db_close).count, 1u);
  ASSERT_TRUE(db_->Close().ok());  // a second Close is not timed
  EXPECT_EQ(PerfSnapshot(PerfKey::db_close).count, 1u);
}

TEST_F(ObservabilityTest, PerfLevelFromEnvironment) {
  options_.apply_environment = true;
  ::setenv("KVENGINE_PERF_LEVEL", "entry", 1);
  Open();
  ::unsetenv("KVENGINE_PERF_LEVEL");
  EXPECT_EQ(GetPerfLevel(), PerfLevel::kEntry);
  std::string opts;
  ASSERT_TRUE(db_->GetProperty("kvengine.options", &opts));
  EXPECT_NE(opts.find("perf_level=entry\n"), std::string::npos) << opts;
  db_->ResetPerf();
  std::vector<int64_t> results;
  const std::vector<std::string> keys = {"a"};
  ASSERT_TRUE(db_->BatchExists(Slices(keys), &results).ok());
  EXPECT_EQ(PerfSnapshot(PerfKey::db_batch_exists).count, 1u);
  EXPECT_EQ(PerfSnapshot(PerfKey::memory_batch_contains).count, 0u);
  ASSERT_TRUE(db_->Close().ok());
  db_.reset();
  ::setenv("KVENGINE_PERF_LEVEL", "sometimes", 1);
  Status s = DB::Open(options_, dir_.path(), &db_);
  ::unsetenv("KVENGINE_PERF_LEVEL");
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.ToString().find("KVENGINE_PERF_LEVEL"), std::string::npos);
}

TEST_F(ObservabilityTest, PropertiesParseAndReset) {
  options_.perf_level = PerfLevel::kAll;
  options_.log_level = LogLevel::kOff;
  Open();
  const std::vector<std::string> keys = {"a", "b"};
  std::vector<ValueParts> values = {{Slice("v")}, {Slice("w")}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), Slices(keys), values, &results).ok());
  const std::vector<std::string> get_keys = {"a", "missing"};
  std::vector<char> b0(8), b1(8);
  std::vector<Destination> dests = {{MutableSlice(b0.data(), 8)}, {MutableSlice(b1.data(), 8)}};
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), Slices(get_keys), dests, &results).ok());

  std::string text, json, stats, stats_json, prom, prom_alias;
  ASSERT_TRUE(db_->GetProperty("kvengine.perf", &text));
  ASSERT_TRUE(db_->GetProperty("kvengine.perf.json", &json));
  ASSERT_TRUE(db_->GetProperty("kvengine.stats", &stats));
  ASSERT_TRUE(db_->GetProperty("kvengine.stats.json", &stats_json));
  ASSERT_TRUE(db_->GetProperty("kvengine.stats.prometheus", &prom));
  ASSERT_TRUE(db_->GetProperty("kvengine.prometheus", &prom_alias));
  std::string error;
  EXPECT_TRUE(test::JsonChecker::Valid(json, &error)) << error;
  EXPECT_TRUE(test::JsonChecker::Valid(stats_json, &error)) << error << "\n" << stats_json;
  EXPECT_NE(json.find("\"db_batch_put\":{\"layer\":\"db\",\"level\":\"entry\",\"count\":1,"),
            std::string::npos);
  EXPECT_NE(json.find("\"memory_batch_lookup\":{\"layer\":\"memory\",\"level\":\"inner\","
                      "\"count\":1,"),
            std::string::npos);
  for (const PerfKeyInfo& info : kPerfKeys) {
    EXPECT_NE(text.find(std::string("\n") + info.name + " "), std::string::npos) << info.name;
  }
  EXPECT_NE(stats.find("errors.not_found: 1\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("memory.lookup_hits: 1\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("memory.lookup_misses: 1\n"), std::string::npos) << stats;
  EXPECT_NE(stats_json.find("\"errors\":{\"not_found\":1,"), std::string::npos) << stats_json;

  // Prometheus text format: comments, or `name{labels} value`.
  const std::regex sample(R"([a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+-]+(inf)?)");
  std::istringstream lines(prom);
  int samples = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << line;
    samples++;
  }
  EXPECT_GT(samples, 20);
  EXPECT_NE(prom.find("kvengine_memory_items 2\n"), std::string::npos) << prom;
  EXPECT_NE(prom.find("kvengine_errors_total{kind=\"not_found\"} 1\n"), std::string::npos);
  EXPECT_NE(prom.find("kvengine_tier_hits_total{tier=\"memory\"} 1\n"), std::string::npos);
  EXPECT_NE(prom.find("kvengine_perf_latency_seconds_count{key=\"db_batch_put\",layer=\"db\"} 1\n"),
            std::string::npos)
      << prom;
  EXPECT_NE(prom.find("kvengine_perf_latency_seconds{key=\"db_batch_put\",layer=\"db\","
                      "quantile=\"0.99\"}"),
            std::string::npos);
  EXPECT_NE(prom_alias.find("# TYPE kvengine_memory_items gauge"), std::string::npos);

  db_->ResetPerf();
  ASSERT_TRUE(db_->GetProperty("kvengine.perf.json", &json));
  EXPECT_NE(json.find("\"db_batch_put\":{\"layer\":\"db\",\"level\":\"entry\",\"count\":0,"),
            std::string::npos);
  ASSERT_TRUE(db_->GetProperty("kvengine.stats.prometheus", &prom));
  EXPECT_EQ(prom.find("kvengine_perf_latency_seconds_count{"), std::string::npos);
}

}  // namespace
}  // namespace kvengine
