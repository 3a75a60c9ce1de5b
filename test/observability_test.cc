// The DB's observability: structured call logs through the callback sink, perf levels
// chosen by option and environment, the perf / stats / Prometheus properties, reset.
#include <algorithm>
#include <cstdio>
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
#include "util/hash.h"
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

// A key longer than 64 bytes prints its first 64 and its length and hash as fields of
// their own (issue #49 item 4: a 64 KiB key filled a log line); every line, the error's
// message included, stays short.
TEST_F(ObservabilityTest, ALongKeyLogsItsFirstBytesLengthAndHash) {
  options_.max_key_size = 1 << 20;
  Open();
  Take();
  const std::string key = std::string(65536, 'k') + "=x";
  std::string v;
  EXPECT_TRUE(db_->Get(ReadOptions(), key, &v).IsNotFound());
  auto lines = Take();
  ASSERT_EQ(lines.size(), 2u);
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(Hash64(key)));
  ExpectKeyLine(lines[1], LogLevel::kInfo,
                {{"success", "0"},
                 {"key", std::string(64, 'k') + "..."},
                 {"key_bytes", "65538"},
                 {"key_hash", hash},
                 {"error", "not_found"}});
}

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

// The default, "auto": entry calls are timed in a DB that serves metrics (so its
// latency histogram has samples), nothing in one that does not; an explicit level wins.
TEST_F(ObservabilityTest, PerfLevelAutoTimesEntryCallsOnlyWhereMetricsAreServed) {
  ASSERT_EQ(Options().perf_level, PerfLevel::kAuto);
  struct Case {
    PerfLevel asked;
    const char* metrics_listen;
    PerfLevel in_force;
  };
  for (const Case& c : {Case{PerfLevel::kAuto, "", PerfLevel::kOff},
                        Case{PerfLevel::kAuto, "127.0.0.1:0", PerfLevel::kEntry},
                        Case{PerfLevel::kOff, "127.0.0.1:0", PerfLevel::kOff},
                        Case{PerfLevel::kAll, "", PerfLevel::kAll}}) {
    SetPerfLevel(PerfLevel::kAll);
    options_.perf_level = c.asked;
    options_.metrics_listen = c.metrics_listen;
    Open();
    EXPECT_EQ(GetPerfLevel(), c.in_force) << c.metrics_listen;
    std::string opts;
    ASSERT_TRUE(db_->GetProperty("kvengine.options", &opts));
    EXPECT_EQ(opts.find("perf_level=auto"), std::string::npos) << opts;  // resolved
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

// ---------------------------------------------------------------- the stats' names
// "kvengine.stats", "kvengine.stats.json" and the Prometheus exposition are parsed by
// users, tools and tests: each name, its place and (Prometheus) its HELP, TYPE and labels
// are fixed here, with and without the SSD tier, after a known sequence of calls; and
// the values those calls make certain.

// "name: value" lines after the header, in order.
std::vector<std::pair<std::string, std::string>> TextStats(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "** kvengine stats **");
  while (std::getline(in, line)) {
    const size_t colon = line.find(": ");
    EXPECT_NE(colon, std::string::npos) << line;
    if (colon == std::string::npos) continue;
    out.emplace_back(line.substr(0, colon), line.substr(colon + 2));
  }
  return out;
}

// The leaves of a JSON object of objects, numbers and literals, as ("a.b", "value") in
// document order.
class JsonLeaves {
 public:
  static std::vector<std::pair<std::string, std::string>> Of(const std::string& json) {
    JsonLeaves p(json);
    p.Object("");
    EXPECT_EQ(p.pos_, json.size()) << json;
    return std::move(p.out_);
  }

 private:
  explicit JsonLeaves(const std::string& t) : t_(t) {}
  void Object(const std::string& prefix) {
    if (!Eat('{') || Eat('}')) return;
    do {
      const size_t end = t_.find('"', pos_ + 1);
      if (t_[pos_] != '"' || end == std::string::npos) break;
      const std::string path = prefix + t_.substr(pos_ + 1, end - pos_ - 1);
      pos_ = end + 1;
      if (!Eat(':')) break;
      if (pos_ < t_.size() && t_[pos_] == '{') {
        Object(path + ".");
      } else {
        const size_t stop = t_.find_first_of(",}", pos_);
        out_.emplace_back(path, t_.substr(pos_, stop - pos_));
        pos_ = stop;
      }
    } while (Eat(','));
    EXPECT_TRUE(Eat('}')) << "at " << pos_ << " of " << t_;
  }
  bool Eat(char c) {
    if (pos_ < t_.size() && t_[pos_] == c) {
      pos_++;
      return true;
    }
    return false;
  }
  const std::string& t_;
  size_t pos_ = 0;
  std::vector<std::pair<std::string, std::string>> out_;
};

// Prometheus: each "# HELP" / "# TYPE" line whole, each sample as "name{labels}" with
// its value apart.
std::vector<std::pair<std::string, std::string>> PromLines(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.rfind(' ');
    if (line.rfind("# ", 0) == 0 || space == std::string::npos) {
      out.emplace_back(line, "");
    } else {
      out.emplace_back(line.substr(0, space), line.substr(space + 1));
    }
  }
  return out;
}

std::vector<std::string> Names(const std::vector<std::pair<std::string, std::string>>& v) {
  std::vector<std::string> names;
  for (const auto& [name, value] : v) names.push_back(name);
  return names;
}

// Checks the value of each name in `expected` (every name listed must be there).
void ExpectValues(const std::vector<std::pair<std::string, std::string>>& got,
                  const std::map<std::string, std::string>& expected, const std::string& what) {
  const std::map<std::string, std::string> values(got.begin(), got.end());
  for (const auto& [name, value] : expected) {
    auto it = values.find(name);
    ASSERT_NE(it, values.end()) << what << ": no " << name;
    EXPECT_EQ(it->second, value) << what << ": " << name;
  }
}

class StatsNamesTest : public ObservabilityTest {
 protected:
  void SetUp() override {
    ObservabilityTest::SetUp();
    options_.log_level = LogLevel::kOff;
    options_.ssd_capacity_bytes = 64 << 20;
    options_.gc_interval_ms = 0;  // no GC round between the calls and the stats
  }
  // Puts three keys, deletes one and flushes; then (with the SSD tier, in a second
  // session, so that only SSD has them) reads one key twice (an SSD hit and a promotion,
  // then a memory hit) and a missing one, deletes one, puts one, asks BatchExists, and
  // flushes.
  void RunCalls() {
    Open();
    ASSERT_TRUE(db_->Put(WriteOptions(), "a", "alpha").ok());
    ASSERT_TRUE(db_->Put(WriteOptions(), "b", "bravo!").ok());
    ASSERT_TRUE(db_->Put(WriteOptions(), "c", "charlie").ok());
    ASSERT_TRUE(db_->Delete(WriteOptions(), "c").ok());
    ASSERT_TRUE(db_->Flush().ok());
    if (options_.ssd_capacity_bytes != 0) {
      ASSERT_TRUE(db_->Close().ok());
      db_.reset();
      Open();
    }
    std::string value;
    ASSERT_TRUE(db_->Get(ReadOptions(), "a", &value).ok());
    ASSERT_EQ(value, "alpha");
    ASSERT_TRUE(db_->Get(ReadOptions(), "a", &value).ok());
    EXPECT_TRUE(db_->Get(ReadOptions(), "missing", &value).IsNotFound());
    ASSERT_TRUE(db_->Delete(WriteOptions(), "b").ok());
    ASSERT_TRUE(db_->Put(WriteOptions(), "d", "delta-delta").ok());
    const std::vector<std::string> keys = {"a", "zz"};
    std::vector<int64_t> results;
    ASSERT_TRUE(db_->BatchExists(Slices(keys), &results).ok());
    ASSERT_TRUE(db_->Flush().ok());
  }
};

// "kvengine.stats": the names without the SSD tier, in order ...
const std::vector<std::string> kTextNames = {
    "memory.items",
    "memory.value_bytes",
    "memory.allocated_bytes",
    "memory.capacity_bytes",
    "memory.hits",
    "memory.evictions",
    "memory.evicted_bytes",
    "memory.rejected_puts",
    "ssd.hits",
    "promotions",
    "memory.eviction_refusals",
    "memory.lookup_hits",
    "memory.lookup_misses",
    "memory.index_bytes",
    "memory.index_bytes_per_key",
    "memory.key_arena_bytes",
    "misses",
    "puts",
    "put_bytes",
    "put_failures",
    "gets",
    "get_bytes",
    "exists_queries",
    "deletes",
    "batch_calls",
    "prefetch_requested",
    "prefetch_queued",
    "prefetched",
    "prefetch_hits",
    "prefetch_wasted",
    "prefetch_dropped",
    "removal_feed_read",
    "removal_feed_missed",
    "errors.not_found",
    "errors.invalid_argument",
    "errors.corruption",
    "errors.io_error",
    "errors.no_space",
    "errors.busy",
    "errors.aborted",
    "errors.not_supported",
    "errors.buffer_too_small",
    "errors.permission_denied",
};
// ... and the SSD tier's, after them when it is there.
const std::vector<std::string> kTextSsdNames = {
    "ssd.keys",
    "ssd.live_bytes",
    "ssd.used_bytes",
    "ssd.capacity_bytes",
    "ssd.buckets",
    "ssd.pending_buckets",
    "ssd.deleted_bytes",
    "ssd.deleted_ratio",
    "ssd.offloads",
    "ssd.offload_bytes",
    "ssd.offload_failures",
    "ssd.reads",
    "ssd.read_bytes",
    "ssd.read_errors",
    "ssd.bucket_writes",
    "ssd.bucket_write_errors",
    "ssd.tombstones",
    "ssd.evicted_buckets",
    "ssd.evicted_keys",
    "ssd.gc_rounds",
    "ssd.gc_buckets_compacted",
    "ssd.gc_bytes_reclaimed",
    "ssd.gc_bytes_punched",
    "ssd.gc_bytes_rewritten",
    "ssd.gc_keys_lost_race",
    "ssd.quarantined_buckets",
    "ssd.recovered_keys",
    "ssd.torn_tombstone_bytes",
    "ssd.damaged_tombstone_bytes",
    "ssd.lost_tombstone_logs",
    "ssd.lost_delete_drops",
    "ssd.io_uring",
    "ssd.direct_io",
    "ssd.index_bytes",
    "ssd.index_bytes_per_key",
    "ssd.open_files",
    "ssd.file_opens",
    "ssd.max_open_files",
    "ssd.descriptor_limit",
    "ssd.descriptor_budget",
    "ssd.open_micros",
    "ssd.checkpoint_keys",
    "ssd.checkpoint_rejected",
    "ssd.checkpoint_writes",
    "ssd.checkpoint_backlog",
};
// "kvengine.stats.json", its leaves as "object.name": without the SSD tier ...
const std::vector<std::string> kJsonNames = {
    "memory.items",
    "memory.value_bytes",
    "memory.allocated_bytes",
    "memory.capacity_bytes",
    "memory.hits",
    "memory.evictions",
    "memory.evicted_bytes",
    "memory.rejected_puts",
    "memory.eviction_refusals",
    "memory.lookup_hits",
    "memory.lookup_misses",
    "memory.index_bytes",
    "memory.index_bytes_per_key",
    "memory.key_arena_bytes",
    "misses",
    "puts",
    "put_bytes",
    "put_failures",
    "gets",
    "get_bytes",
    "exists_queries",
    "deletes",
    "batch_calls",
    "prefetch_requested",
    "prefetch_queued",
    "prefetched",
    "prefetch_hits",
    "prefetch_wasted",
    "prefetch_dropped",
    "removal_feed_read",
    "removal_feed_missed",
    "errors.not_found",
    "errors.invalid_argument",
    "errors.corruption",
    "errors.io_error",
    "errors.no_space",
    "errors.busy",
    "errors.aborted",
    "errors.not_supported",
    "errors.buffer_too_small",
    "errors.permission_denied",
    "ssd_hits",
    "promotions",
};
// ... and the "ssd" object, last when the SSD tier is there.
const std::vector<std::string> kJsonSsdNames = {
    "ssd.keys",
    "ssd.live_bytes",
    "ssd.used_bytes",
    "ssd.capacity_bytes",
    "ssd.buckets",
    "ssd.pending_buckets",
    "ssd.deleted_bytes",
    "ssd.offloads",
    "ssd.offload_bytes",
    "ssd.offload_failures",
    "ssd.reads",
    "ssd.read_bytes",
    "ssd.read_errors",
    "ssd.bucket_writes",
    "ssd.bucket_write_errors",
    "ssd.tombstones",
    "ssd.evicted_buckets",
    "ssd.evicted_keys",
    "ssd.gc_rounds",
    "ssd.gc_buckets_compacted",
    "ssd.gc_bytes_reclaimed",
    "ssd.gc_bytes_punched",
    "ssd.gc_bytes_rewritten",
    "ssd.gc_keys_lost_race",
    "ssd.quarantined_buckets",
    "ssd.recovered_keys",
    "ssd.torn_tombstone_bytes",
    "ssd.damaged_tombstone_bytes",
    "ssd.lost_tombstone_logs",
    "ssd.lost_delete_drops",
    "ssd.io_uring",
    "ssd.direct_io",
    "ssd.index_bytes",
    "ssd.open_files",
    "ssd.file_opens",
    "ssd.max_open_files",
    "ssd.descriptor_limit",
    "ssd.descriptor_budget",
    "ssd.open_micros",
    "ssd.checkpoint_keys",
    "ssd.checkpoint_rejected",
    "ssd.checkpoint_writes",
    "ssd.checkpoint_backlog",
};
// "kvengine.stats.prometheus" without the SSD tier, no perf samples; with it, the
// families of kPromSsdLines come before the errors' (kPromSsdAt).
const std::vector<std::string> kPromLines = {
    "# HELP kvengine_memory_items Values held in the memory tier.",
    "# TYPE kvengine_memory_items gauge",
    "kvengine_memory_items",
    "# HELP kvengine_memory_value_bytes Bytes of the values held in the memory tier.",
    "# TYPE kvengine_memory_value_bytes gauge",
    "kvengine_memory_value_bytes",
    "# HELP kvengine_memory_allocated_bytes Arena bytes taken by the memory tier's values "
    "(slab class sizes).",
    "# TYPE kvengine_memory_allocated_bytes gauge",
    "kvengine_memory_allocated_bytes",
    "# HELP kvengine_memory_capacity_bytes Size of the memory tier's arena.",
    "# TYPE kvengine_memory_capacity_bytes gauge",
    "kvengine_memory_capacity_bytes",
    "# HELP kvengine_memory_evictions_total Values evicted from the memory tier.",
    "# TYPE kvengine_memory_evictions_total counter",
    "kvengine_memory_evictions_total",
    "# HELP kvengine_memory_evicted_bytes_total Bytes of the values evicted from the memory "
    "tier.",
    "# TYPE kvengine_memory_evicted_bytes_total counter",
    "kvengine_memory_evicted_bytes_total",
    "# HELP kvengine_memory_eviction_refusals_total Evictions refused by the offload tier (the "
    "value stayed in memory).",
    "# TYPE kvengine_memory_eviction_refusals_total counter",
    "kvengine_memory_eviction_refusals_total",
    "# HELP kvengine_memory_rejected_puts_total Puts the memory tier rejected with NoSpace.",
    "# TYPE kvengine_memory_rejected_puts_total counter",
    "kvengine_memory_rejected_puts_total",
    "# HELP kvengine_memory_lookup_hits_total Memory tier index lookups that found the key.",
    "# TYPE kvengine_memory_lookup_hits_total counter",
    "kvengine_memory_lookup_hits_total",
    "# HELP kvengine_memory_lookup_misses_total Memory tier index lookups that did not find "
    "the key.",
    "# TYPE kvengine_memory_lookup_misses_total counter",
    "kvengine_memory_lookup_misses_total",
    "# HELP kvengine_memory_index_bytes RAM of the memory tier's index beside keys and values "
    "(item arrays, index slots).",
    "# TYPE kvengine_memory_index_bytes gauge",
    "kvengine_memory_index_bytes",
    "# HELP kvengine_memory_key_arena_bytes RAM mapped for the bytes of keys beyond the 16 an "
    "item holds (the key arena).",
    "# TYPE kvengine_memory_key_arena_bytes gauge",
    "kvengine_memory_key_arena_bytes",
    "# HELP kvengine_tier_hits_total Reads served, by the tier that served them.",
    "# TYPE kvengine_tier_hits_total counter",
    "kvengine_tier_hits_total{tier=\"memory\"}",
    "kvengine_tier_hits_total{tier=\"ssd\"}",
    "kvengine_tier_hits_total{tier=\"peer\"}",
    "# HELP kvengine_tier_misses_total Reads a tier was asked and did not hold the key for "
    "(the next tier is asked).",
    "# TYPE kvengine_tier_misses_total counter",
    "kvengine_tier_misses_total{tier=\"memory\"}",
    "kvengine_tier_misses_total{tier=\"ssd\"}",
    "kvengine_tier_misses_total{tier=\"peer\"}",
    "# HELP kvengine_tier_read_bytes_total Value bytes read out of each tier by the reads it "
    "served.",
    "# TYPE kvengine_tier_read_bytes_total counter",
    "kvengine_tier_read_bytes_total{tier=\"memory\"}",
    "kvengine_tier_read_bytes_total{tier=\"ssd\"}",
    "kvengine_tier_read_bytes_total{tier=\"peer\"}",
    "# HELP kvengine_tier_written_bytes_total Value bytes written into each tier: puts and "
    "promotions (memory), offloads (ssd), puts routed to peers (peer).",
    "# TYPE kvengine_tier_written_bytes_total counter",
    "kvengine_tier_written_bytes_total{tier=\"memory\"}",
    "kvengine_tier_written_bytes_total{tier=\"ssd\"}",
    "kvengine_tier_written_bytes_total{tier=\"peer\"}",
    "# HELP kvengine_tier_promotions_total Values read from a tier and copied into the memory "
    "tier.",
    "# TYPE kvengine_tier_promotions_total counter",
    "kvengine_tier_promotions_total{tier=\"ssd\"}",
    "kvengine_tier_promotions_total{tier=\"peer\"}",
    "# HELP kvengine_tier_evictions_total Values that left a tier, by reason: capacity (the "
    "tier was full: memory values go to SSD when it has room, else are dropped; SSD drops "
    "whole buckets), explicit (deletes). No reason watermark: no tier evicts ahead of need "
    "(the SSD GC above gc_high_watermark_ratio reclaims deleted values only).",
    "# TYPE kvengine_tier_evictions_total counter",
    "kvengine_tier_evictions_total{tier=\"memory\",reason=\"capacity\"}",
    "kvengine_tier_evictions_total{tier=\"memory\",reason=\"explicit\"}",
    "kvengine_tier_evictions_total{tier=\"ssd\",reason=\"capacity\"}",
    "kvengine_tier_evictions_total{tier=\"ssd\",reason=\"explicit\"}",
    "# HELP kvengine_read_failures_total Reads that failed, by the tier that answered last and "
    "why: absent, evicted (misses), checksum_mismatch, io_error, timeout, peer_down (present "
    "but unreadable).",
    "# TYPE kvengine_read_failures_total counter",
    "kvengine_read_failures_total{tier=\"memory\",reason=\"absent\"}",
    "kvengine_read_failures_total{tier=\"memory\",reason=\"evicted\"}",
    "kvengine_read_failures_total{tier=\"ssd\",reason=\"absent\"}",
    "kvengine_read_failures_total{tier=\"ssd\",reason=\"evicted\"}",
    "kvengine_read_failures_total{tier=\"ssd\",reason=\"checksum_mismatch\"}",
    "kvengine_read_failures_total{tier=\"ssd\",reason=\"io_error\"}",
    "kvengine_read_failures_total{tier=\"peer\",reason=\"absent\"}",
    "kvengine_read_failures_total{tier=\"peer\",reason=\"checksum_mismatch\"}",
    "kvengine_read_failures_total{tier=\"peer\",reason=\"io_error\"}",
    "kvengine_read_failures_total{tier=\"peer\",reason=\"timeout\"}",
    "kvengine_read_failures_total{tier=\"peer\",reason=\"peer_down\"}",
    "# HELP kvengine_misses_total Reads of keys found in no tier.",
    "# TYPE kvengine_misses_total counter",
    "kvengine_misses_total",
    "# HELP kvengine_puts_total Keys stored.",
    "# TYPE kvengine_puts_total counter",
    "kvengine_puts_total",
    "# HELP kvengine_put_bytes_total Value bytes stored.",
    "# TYPE kvengine_put_bytes_total counter",
    "kvengine_put_bytes_total",
    "# HELP kvengine_put_failures_total Keys whose put failed.",
    "# TYPE kvengine_put_failures_total counter",
    "kvengine_put_failures_total",
    "# HELP kvengine_gets_total Keys read (Get, GetInto, BatchGetInto).",
    "# TYPE kvengine_gets_total counter",
    "kvengine_gets_total",
    "# HELP kvengine_get_bytes_total Value bytes read.",
    "# TYPE kvengine_get_bytes_total counter",
    "kvengine_get_bytes_total",
    "# HELP kvengine_exists_queries_total Keys asked about by BatchExists.",
    "# TYPE kvengine_exists_queries_total counter",
    "kvengine_exists_queries_total",
    "# HELP kvengine_deletes_total Keys removed by deletes.",
    "# TYPE kvengine_deletes_total counter",
    "kvengine_deletes_total",
    "# HELP kvengine_batch_calls_total Batch calls accepted.",
    "# TYPE kvengine_batch_calls_total counter",
    "kvengine_batch_calls_total",
    "# HELP kvengine_prefetch_requested_total Keys asked for by Prefetch.",
    "# TYPE kvengine_prefetch_requested_total counter",
    "kvengine_prefetch_requested_total",
    "# HELP kvengine_prefetch_queued_total Keys whose read up from SSD Prefetch started.",
    "# TYPE kvengine_prefetch_queued_total counter",
    "kvengine_prefetch_queued_total",
    "# HELP kvengine_prefetched_total Values Prefetch brought into the memory tier.",
    "# TYPE kvengine_prefetched_total counter",
    "kvengine_prefetched_total",
    "# HELP kvengine_prefetch_hits_total Prefetched values a later read found in memory (once "
    "each).",
    "# TYPE kvengine_prefetch_hits_total counter",
    "kvengine_prefetch_hits_total",
    "# HELP kvengine_prefetch_wasted_total Prefetched values that left memory unread (evicted or "
    "deleted).",
    "# TYPE kvengine_prefetch_wasted_total counter",
    "kvengine_prefetch_wasted_total",
    "# HELP kvengine_prefetch_dropped_total Prefetches given up: over prefetch_max_bytes, no room "
    "in memory, or unreadable.",
    "# TYPE kvengine_prefetch_dropped_total counter",
    "kvengine_prefetch_dropped_total",
    "# HELP kvengine_removal_feed_read_total Removal events handed to feed readers.",
    "# TYPE kvengine_removal_feed_read_total counter",
    "kvengine_removal_feed_read_total",
    "# HELP kvengine_removal_feed_missed_total Removal events feed readers missed: overwritten in "
    "the ring before they read.",
    "# TYPE kvengine_removal_feed_missed_total counter",
    "kvengine_removal_feed_missed_total",
    "# HELP kvengine_errors_total Failed keys and calls, by kind of error.",
    "# TYPE kvengine_errors_total counter",
    "kvengine_errors_total{kind=\"not_found\"}",
    "kvengine_errors_total{kind=\"invalid_argument\"}",
    "kvengine_errors_total{kind=\"corruption\"}",
    "kvengine_errors_total{kind=\"io_error\"}",
    "kvengine_errors_total{kind=\"no_space\"}",
    "kvengine_errors_total{kind=\"busy\"}",
    "kvengine_errors_total{kind=\"aborted\"}",
    "kvengine_errors_total{kind=\"not_supported\"}",
    "kvengine_errors_total{kind=\"buffer_too_small\"}",
    "kvengine_errors_total{kind=\"permission_denied\"}",
    "# HELP kvengine_perf_latency_seconds Latency of each perf key (see "
    "docs/observability.md), process-wide.",
    "# TYPE kvengine_perf_latency_seconds summary",
    "# HELP kvengine_perf_latency_max_seconds Longest sample of each perf key since the last "
    "reset.",
    "# TYPE kvengine_perf_latency_max_seconds gauge",
    "# HELP kvengine_operation_latency_seconds Latency of each timed operation (a perf key: "
    "the operation label), process-wide, in buckets that sum across processes.",
    "# TYPE kvengine_operation_latency_seconds histogram",
};
const std::vector<std::string> kPromSsdLines = {
    "# HELP kvengine_ssd_keys Keys held in the SSD tier.",
    "# TYPE kvengine_ssd_keys gauge",
    "kvengine_ssd_keys",
    "# HELP kvengine_ssd_live_bytes Bytes of the live values in the SSD tier's buckets.",
    "# TYPE kvengine_ssd_live_bytes gauge",
    "kvengine_ssd_live_bytes",
    "# HELP kvengine_ssd_used_bytes Bytes of bucket files the SSD tier holds (live, deleted "
    "and padding).",
    "# TYPE kvengine_ssd_used_bytes gauge",
    "kvengine_ssd_used_bytes",
    "# HELP kvengine_ssd_capacity_bytes The SSD tier's capacity (ssd_capacity_bytes).",
    "# TYPE kvengine_ssd_capacity_bytes gauge",
    "kvengine_ssd_capacity_bytes",
    "# HELP kvengine_ssd_buckets Bucket files of the SSD tier.",
    "# TYPE kvengine_ssd_buckets gauge",
    "kvengine_ssd_buckets",
    "# HELP kvengine_ssd_pending_buckets Buckets sealed or open but not yet written.",
    "# TYPE kvengine_ssd_pending_buckets gauge",
    "kvengine_ssd_pending_buckets",
    "# HELP kvengine_ssd_deleted_bytes Bytes of deleted values still taking room in buckets.",
    "# TYPE kvengine_ssd_deleted_bytes gauge",
    "kvengine_ssd_deleted_bytes",
    "# HELP kvengine_ssd_offloads_total Values written to the SSD tier.",
    "# TYPE kvengine_ssd_offloads_total counter",
    "kvengine_ssd_offloads_total",
    "# HELP kvengine_ssd_offload_bytes_total Bytes of the values written to the SSD tier.",
    "# TYPE kvengine_ssd_offload_bytes_total counter",
    "kvengine_ssd_offload_bytes_total",
    "# HELP kvengine_ssd_offload_failures_total Values the SSD tier refused (full, or its "
    "writer failing).",
    "# TYPE kvengine_ssd_offload_failures_total counter",
    "kvengine_ssd_offload_failures_total",
    "# HELP kvengine_ssd_reads_total Values read from the SSD tier.",
    "# TYPE kvengine_ssd_reads_total counter",
    "kvengine_ssd_reads_total",
    "# HELP kvengine_ssd_read_bytes_total Bytes read from the SSD tier's values.",
    "# TYPE kvengine_ssd_read_bytes_total counter",
    "kvengine_ssd_read_bytes_total",
    "# HELP kvengine_ssd_read_errors_total Reads from the SSD tier that failed (I/O error or "
    "checksum).",
    "# TYPE kvengine_ssd_read_errors_total counter",
    "kvengine_ssd_read_errors_total",
    "# HELP kvengine_ssd_bucket_writes_total Bucket files written.",
    "# TYPE kvengine_ssd_bucket_writes_total counter",
    "kvengine_ssd_bucket_writes_total",
    "# HELP kvengine_ssd_bucket_write_errors_total Bucket file writes that failed (retried).",
    "# TYPE kvengine_ssd_bucket_write_errors_total counter",
    "kvengine_ssd_bucket_write_errors_total",
    "# HELP kvengine_ssd_tombstones Tombstones in the tombstone log.",
    "# TYPE kvengine_ssd_tombstones gauge",
    "kvengine_ssd_tombstones",
    "# HELP kvengine_ssd_evicted_buckets_total Buckets dropped to make room.",
    "# TYPE kvengine_ssd_evicted_buckets_total counter",
    "kvengine_ssd_evicted_buckets_total",
    "# HELP kvengine_ssd_evicted_keys_total Keys dropped with evicted buckets.",
    "# TYPE kvengine_ssd_evicted_keys_total counter",
    "kvengine_ssd_evicted_keys_total",
    "# HELP kvengine_ssd_gc_rounds_total GC rounds run.",
    "# TYPE kvengine_ssd_gc_rounds_total counter",
    "kvengine_ssd_gc_rounds_total",
    "# HELP kvengine_ssd_gc_buckets_compacted_total Buckets compacted by the GC.",
    "# TYPE kvengine_ssd_gc_buckets_compacted_total counter",
    "kvengine_ssd_gc_buckets_compacted_total",
    "# HELP kvengine_ssd_gc_bytes_reclaimed_total Bytes the GC gave back to the filesystem.",
    "# TYPE kvengine_ssd_gc_bytes_reclaimed_total counter",
    "kvengine_ssd_gc_bytes_reclaimed_total",
    "# HELP kvengine_ssd_gc_bytes_punched_total Bytes of deleted values given back by punched "
    "holes.",
    "# TYPE kvengine_ssd_gc_bytes_punched_total counter",
    "kvengine_ssd_gc_bytes_punched_total",
    "# HELP kvengine_ssd_gc_bytes_rewritten_total Bytes of live values the GC copied into new "
    "buckets.",
    "# TYPE kvengine_ssd_gc_bytes_rewritten_total counter",
    "kvengine_ssd_gc_bytes_rewritten_total",
    "# HELP kvengine_ssd_gc_keys_lost_race_total Keys a compaction left because a write or "
    "delete won the race.",
    "# TYPE kvengine_ssd_gc_keys_lost_race_total counter",
    "kvengine_ssd_gc_keys_lost_race_total",
    "# HELP kvengine_ssd_quarantined_buckets Bucket files recovery would not trust (moved to "
    "quarantine/).",
    "# TYPE kvengine_ssd_quarantined_buckets gauge",
    "kvengine_ssd_quarantined_buckets",
    "# HELP kvengine_ssd_recovered_keys Keys the SSD tier recovered at Open.",
    "# TYPE kvengine_ssd_recovered_keys gauge",
    "kvengine_ssd_recovered_keys",
    "# HELP kvengine_ssd_torn_tombstone_bytes Bytes of a torn tombstone log tail ignored at "
    "Open.",
    "# TYPE kvengine_ssd_torn_tombstone_bytes gauge",
    "kvengine_ssd_torn_tombstone_bytes",
    "# HELP kvengine_ssd_damaged_tombstone_bytes Bytes of damaged tombstone records skipped at "
    "Open.",
    "# TYPE kvengine_ssd_damaged_tombstone_bytes gauge",
    "kvengine_ssd_damaged_tombstone_bytes",
    "# HELP kvengine_ssd_lost_tombstone_logs 1 when the tombstone log at Open was shorter than, or "
    "other than, what its guard recorded (deletes may be lost).",
    "# TYPE kvengine_ssd_lost_tombstone_logs gauge",
    "kvengine_ssd_lost_tombstone_logs",
    "# HELP kvengine_ssd_lost_delete_drops Values dropped at Open because a lost tombstone might "
    "have deleted them.",
    "# TYPE kvengine_ssd_lost_delete_drops gauge",
    "kvengine_ssd_lost_delete_drops",
    "# HELP kvengine_ssd_io_uring 1 when the SSD tier reads and writes through io_uring.",
    "# TYPE kvengine_ssd_io_uring gauge",
    "kvengine_ssd_io_uring",
    "# HELP kvengine_ssd_direct_io 1 when the SSD tier's files are opened with O_DIRECT.",
    "# TYPE kvengine_ssd_direct_io gauge",
    "kvengine_ssd_direct_io",
    "# HELP kvengine_ssd_index_bytes RAM of the SSD tier's object map.",
    "# TYPE kvengine_ssd_index_bytes gauge",
    "kvengine_ssd_index_bytes",
    "# HELP kvengine_ssd_open_files Bucket files open for reads.",
    "# TYPE kvengine_ssd_open_files gauge",
    "kvengine_ssd_open_files",
    "# HELP kvengine_ssd_file_opens_total Bucket file opens (reopens after the open-file cache "
    "closed one).",
    "# TYPE kvengine_ssd_file_opens_total counter",
    "kvengine_ssd_file_opens_total",
    "# HELP kvengine_ssd_max_open_files Bucket files the open-file cache may hold (max_open_files "
    "within the descriptor budget).",
    "# TYPE kvengine_ssd_max_open_files gauge",
    "kvengine_ssd_max_open_files",
    "# HELP kvengine_ssd_descriptor_limit The process's descriptor limit (RLIMIT_NOFILE) at Open.",
    "# TYPE kvengine_ssd_descriptor_limit gauge",
    "kvengine_ssd_descriptor_limit",
    "# HELP kvengine_ssd_descriptor_budget Descriptors the engine allows itself at Open "
    "(docs/reliability.md).",
    "# TYPE kvengine_ssd_descriptor_budget gauge",
    "kvengine_ssd_descriptor_budget",
    "# HELP kvengine_ssd_open_micros Microseconds the last Open spent recovering the SSD tier.",
    "# TYPE kvengine_ssd_open_micros gauge",
    "kvengine_ssd_open_micros",
    "# HELP kvengine_ssd_checkpoint_keys Keys in the map checkpoint (SSDMAP) loaded at Open.",
    "# TYPE kvengine_ssd_checkpoint_keys gauge",
    "kvengine_ssd_checkpoint_keys",
    "# HELP kvengine_ssd_checkpoint_rejected 1 when the map checkpoint found at Open was stale "
    "or damaged and not used.",
    "# TYPE kvengine_ssd_checkpoint_rejected gauge",
    "kvengine_ssd_checkpoint_rejected",
    "# HELP kvengine_ssd_checkpoint_writes_total Map checkpoints written.",
    "# TYPE kvengine_ssd_checkpoint_writes_total counter",
    "kvengine_ssd_checkpoint_writes_total",
    "# HELP kvengine_ssd_checkpoint_backlog Keys written to buckets since the map checkpoint "
    "on disk.",
    "# TYPE kvengine_ssd_checkpoint_backlog gauge",
    "kvengine_ssd_checkpoint_backlog",
};
const std::string kPromSsdAt =
    "# HELP kvengine_errors_total Failed keys and calls, by kind of error.";

// kPromLines with kPromSsdLines in their place.
std::vector<std::string> PromLinesWithSsd() {
  std::vector<std::string> lines = kPromLines;
  auto at = std::find(lines.begin(), lines.end(), kPromSsdAt);
  lines.insert(at, kPromSsdLines.begin(), kPromSsdLines.end());
  return lines;
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Checks the figures the calls of RunCalls() make certain; `ssd`: the SSD tier's too.
void ExpectKnownValues(const std::vector<std::pair<std::string, std::string>>& text, bool ssd) {
  // Memory only, RunCalls makes one session, whose counters count every call.
  ExpectValues(text,
               {{"memory.items", "2"},
                {"memory.value_bytes", "16"},
                {"memory.capacity_bytes", "8388608"},
                {"memory.hits", ssd ? "1" : "2"},
                {"memory.evictions", "0"},
                {"memory.evicted_bytes", "0"},
                {"memory.rejected_puts", "0"},
                {"ssd.hits", ssd ? "1" : "0"},
                {"promotions", ssd ? "1" : "0"},
                {"memory.eviction_refusals", "0"},
                {"misses", "1"},
                {"puts", ssd ? "1" : "4"},
                {"put_bytes", ssd ? "11" : "29"},
                {"put_failures", "0"},
                {"gets", "3"},
                {"get_bytes", "10"},
                {"exists_queries", "2"},
                {"deletes", ssd ? "1" : "2"},
                {"batch_calls", "1"},
                {"prefetch_requested", "0"},
                {"prefetch_queued", "0"},
                {"prefetched", "0"},
                {"prefetch_hits", "0"},
                {"prefetch_wasted", "0"},
                {"prefetch_dropped", "0"},
                {"errors.not_found", "1"},
                {"errors.invalid_argument", "0"}},
               "text");
  const std::map<std::string, std::string> values(text.begin(), text.end());
  // Derived figures.
  EXPECT_EQ(values.at("memory.index_bytes_per_key"),
            std::to_string(std::stoull(values.at("memory.index_bytes")) / 2));
  if (!ssd) return;
  ExpectValues(text,
               {{"ssd.keys", "2"},
                {"ssd.live_bytes", "16"},
                {"ssd.capacity_bytes", "67108864"},
                {"ssd.pending_buckets", "0"},
                {"ssd.deleted_bytes", "6"},
                {"ssd.deleted_ratio", "0.272727"},  // 6 / (16 + 6), six digits
                {"ssd.offloads", "1"},
                {"ssd.offload_bytes", "11"},
                {"ssd.offload_failures", "0"},
                {"ssd.reads", "1"},
                {"ssd.read_bytes", "5"},
                {"ssd.read_errors", "0"},
                {"ssd.tombstones", "1"},
                {"ssd.gc_rounds", "0"},
                {"ssd.recovered_keys", "2"}},
               "text");
  EXPECT_EQ(values.at("ssd.index_bytes_per_key"),
            std::to_string(std::stoull(values.at("ssd.index_bytes")) / 2));
  EXPECT_TRUE(values.at("ssd.io_uring") == "true" || values.at("ssd.io_uring") == "false");
  EXPECT_TRUE(values.at("ssd.direct_io") == "true" || values.at("ssd.direct_io") == "false");
}

// Every JSON leaf has the value of the text's figure of the same name ("errors.x",
// "memory.x", "ssd.x"; "ssd_hits" is the text's "ssd.hits").
void ExpectJsonAsText(const std::vector<std::pair<std::string, std::string>>& json,
                      const std::vector<std::pair<std::string, std::string>>& text) {
  const std::map<std::string, std::string> values(text.begin(), text.end());
  for (const auto& [path, value] : json) {
    const std::string name = path == "ssd_hits" ? "ssd.hits" : path;
    auto it = values.find(name);
    ASSERT_NE(it, values.end()) << name;
    EXPECT_EQ(value, it->second) << path;
  }
}

// Every Prometheus sample of a stat has the value of the text's figure:
// kvengine_memory_x[_total] is memory.x, kvengine_x[_total] is x,
// kvengine_tier_hits_total{tier="memory"} is memory.hits and
// kvengine_errors_total{kind="x"} is errors.x.
void ExpectPromAsText(const std::vector<std::pair<std::string, std::string>>& prom,
                      const std::vector<std::pair<std::string, std::string>>& text) {
  std::map<std::string, std::string> values(text.begin(), text.end());
  values["kvengine_tier_hits_total{tier=\"memory\"}"] = values.at("memory.hits");
  for (const auto& [name, value] : text) {
    if (name.rfind("errors.", 0) == 0) {
      values["kvengine_errors_total{kind=\"" + name.substr(7) + "\"}"] = value;
    }
  }
  int checked = 0;
  for (const auto& [sample, value] : prom) {
    if (sample.rfind("# ", 0) == 0) continue;
    std::string name = sample;
    if (name.find('{') == std::string::npos) {
      name = name.substr(std::string("kvengine_").size());
      if (name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0) {
        name.resize(name.size() - 6);
      }
      if (name.rfind("memory_", 0) == 0) name[6] = '.';
    }
    auto it = values.find(name);
    if (it == values.end()) continue;  // the perf summaries
    EXPECT_EQ(value, it->second) << sample;
    checked++;
  }
  EXPECT_EQ(checked, 40);  // 12 memory, tier hits, 15 DB-wide, 2 removal feed, 10 error kinds
}

// The three properties after RunCalls(), with the SSD tier or without.
void ExpectStats(DB* db, bool ssd) {
  std::string text, json, prom;
  ASSERT_TRUE(db->GetProperty("kvengine.stats", &text));
  ASSERT_TRUE(db->GetProperty("kvengine.stats.json", &json));
  ASSERT_TRUE(db->GetProperty("kvengine.stats.prometheus", &prom));
  const auto text_stats = TextStats(text);
  EXPECT_EQ(Names(text_stats), ssd ? Concat(kTextNames, kTextSsdNames) : kTextNames) << text;
  ExpectKnownValues(text_stats, ssd);
  const auto json_leaves = JsonLeaves::Of(json);
  EXPECT_EQ(Names(json_leaves), ssd ? Concat(kJsonNames, kJsonSsdNames) : kJsonNames) << json;
  ExpectJsonAsText(json_leaves, text_stats);
  const auto prom_lines = PromLines(prom);
  EXPECT_EQ(Names(prom_lines), ssd ? PromLinesWithSsd() : kPromLines) << prom;
  ExpectPromAsText(prom_lines, text_stats);
}

TEST_F(StatsNamesTest, WithBothTiers) {
  RunCalls();
  ExpectStats(db_.get(), /*ssd=*/true);
}

TEST_F(StatsNamesTest, MemoryOnly) {
  options_.ssd_capacity_bytes = 0;
  RunCalls();
  ExpectStats(db_.get(), /*ssd=*/false);
}

}  // namespace
}  // namespace kvengine
