#include "db_bench/trace.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kvbench {

using kvengine::Status;

namespace {

// A cursor over one line of JSON: just what a trace line needs (an object of numbers,
// arrays of numbers, and members to skip of any JSON type).
class LineReader {
 public:
  explicit LineReader(std::string_view s) : s_(s) {}

  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) pos_++;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ >= s_.size();
  }
  bool Take(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      pos_++;
      return true;
    }
    return false;
  }
  char Peek() {
    SkipSpace();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  size_t column() const { return pos_ + 1; }

  // A JSON string (escapes kept as written: member names need none).
  bool String(std::string* out) {
    if (!Take('"')) return false;
    out->clear();
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\') {
        if (++pos_ >= s_.size()) return false;
      }
      out->push_back(s_[pos_++]);
    }
    return Take('"');
  }
  // A JSON number, as a double (exact for integers below 2^53).
  bool Number(double* out) {
    SkipSpace();
    const size_t start = pos_;
    while (pos_ < s_.size() && std::strchr("+-0123456789.eE", s_[pos_]) != nullptr) pos_++;
    if (pos_ == start) return false;
    const std::string text(s_.substr(start, pos_ - start));
    char* end = nullptr;
    errno = 0;
    *out = std::strtod(text.c_str(), &end);
    return errno == 0 && end == text.c_str() + text.size() && std::isfinite(*out);
  }
  // Any JSON value, skipped; false when it is not one.
  bool SkipValue(int depth = 0) {
    if (depth > 64) return false;
    const char c = Peek();
    std::string ignored;
    double number;
    if (c == '"') return String(&ignored);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      Take(c);
      if (Take(close)) return true;
      do {
        if (c == '{' && (!String(&ignored) || !Take(':'))) return false;
        if (!SkipValue(depth + 1)) return false;
      } while (Take(','));
      return Take(close);
    }
    for (const char* word : {"true", "false", "null"}) {
      if (s_.substr(pos_).starts_with(word)) {
        pos_ += std::strlen(word);
        return true;
      }
    }
    return Number(&number);
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

Status Bad(const LineReader& in, const std::string& what) {
  return Status::InvalidArgument(what + " at column " + std::to_string(in.column()));
}

// A whole number in [0, 2^53]: lengths and ids.
bool WholeNumber(double v, uint64_t* out) {
  if (!(v >= 0) || v > 9007199254740992.0 || std::floor(v) != v) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

Status ParseCount(LineReader* in, const std::string& name, uint64_t* out) {
  double v;
  if (!in->Number(&v)) return Bad(*in, "\"" + name + "\" is not a number");
  if (!WholeNumber(v, out)) return Bad(*in, "\"" + name + "\" is not a whole number >= 0");
  return Status::OK();
}

Status ParseHashIds(LineReader* in, std::vector<uint64_t>* ids) {
  ids->clear();
  if (!in->Take('[')) return Bad(*in, "\"hash_ids\" is not an array");
  if (in->Take(']')) return Status::OK();
  do {
    uint64_t id;
    Status s = ParseCount(in, "hash_ids[" + std::to_string(ids->size()) + "]", &id);
    if (!s.ok()) return s;
    ids->push_back(id);
  } while (in->Take(','));
  if (!in->Take(']')) return Bad(*in, "\"hash_ids\" is not closed by ']'");
  return Status::OK();
}

}  // namespace

Status ParseTraceLine(std::string_view line, TraceRequest* out) {
  LineReader in(line);
  if (!in.Take('{')) return Bad(in, "not a JSON object");
  enum { kTimestamp = 1, kInput = 2, kOutput = 4, kHashIds = 8 };
  int seen = 0;
  if (!in.Take('}')) {
    do {
      std::string name;
      if (!in.String(&name)) return Bad(in, "expected a member name in quotes");
      if (!in.Take(':')) return Bad(in, "expected ':' after \"" + name + "\"");
      Status s;
      if (name == "timestamp") {
        double v;
        if (!in.Number(&v) || !(v >= 0)) return Bad(in, "\"timestamp\" is not a number >= 0");
        out->timestamp_ms = v;
        seen |= kTimestamp;
      } else if (name == "input_length") {
        s = ParseCount(&in, name, &out->input_length);
        seen |= kInput;
      } else if (name == "output_length") {
        s = ParseCount(&in, name, &out->output_length);
        seen |= kOutput;
      } else if (name == "hash_ids") {
        s = ParseHashIds(&in, &out->hash_ids);
        seen |= kHashIds;
      } else if (!in.SkipValue()) {
        return Bad(in, "the value of \"" + name + "\" is not JSON");
      }
      if (!s.ok()) return s;
    } while (in.Take(','));
    if (!in.Take('}')) return Bad(in, "expected ',' or '}'");
  }
  if (!in.AtEnd()) return Bad(in, "text after the object");
  static const struct {
    int bit;
    const char* name;
  } kRequired[] = {{kTimestamp, "timestamp"},
                   {kInput, "input_length"},
                   {kOutput, "output_length"},
                   {kHashIds, "hash_ids"}};
  for (const auto& r : kRequired) {
    if ((seen & r.bit) == 0) {
      return Status::InvalidArgument(std::string("no \"") + r.name + "\" member");
    }
  }
  return Status::OK();
}

std::string FormatTraceLine(const TraceRequest& r) {
  std::string s = "{\"timestamp\": ";
  char number[64];
  if (std::floor(r.timestamp_ms) == r.timestamp_ms && r.timestamp_ms < 9e15) {
    std::snprintf(number, sizeof(number), "%.0f", r.timestamp_ms);
  } else {
    std::snprintf(number, sizeof(number), "%.17g", r.timestamp_ms);
  }
  s += number;
  s += ", \"input_length\": " + std::to_string(r.input_length);
  s += ", \"output_length\": " + std::to_string(r.output_length);
  s += ", \"hash_ids\": [";
  for (size_t i = 0; i < r.hash_ids.size(); i++) {
    if (i > 0) s += ", ";
    s += std::to_string(r.hash_ids[i]);
  }
  return s + "]}";
}

Status ParseTrace(std::string_view text, const std::string& name, std::vector<TraceRequest>* out) {
  out->clear();
  uint64_t line_number = 0;
  double previous_ms = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    line_number++;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    TraceRequest r;
    Status s = ParseTraceLine(line, &r);
    const std::string where = name + ":" + std::to_string(line_number) + ": ";
    if (!s.ok()) return Status::InvalidArgument(where + s.message());
    if (!out->empty() && r.timestamp_ms < previous_ms) {
      std::ostringstream why;
      why << where << "timestamp " << r.timestamp_ms << " is earlier than the line before's "
          << previous_ms << " (a trace is in arrival order)";
      return Status::InvalidArgument(why.str());
    }
    previous_ms = r.timestamp_ms;
    out->push_back(std::move(r));
  }
  if (out->empty()) return Status::InvalidArgument(name + ": no request in the trace");
  return Status::OK();
}

Status ReadTrace(const std::string& path, std::vector<TraceRequest>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError("cannot open trace " + path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IOError("cannot read trace " + path);
  return ParseTrace(text.str(), path, out);
}

Status WriteTrace(const std::string& path, const std::vector<TraceRequest>& requests) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IOError("cannot create trace " + path, std::strerror(errno));
  for (const TraceRequest& r : requests) out << FormatTraceLine(r) << '\n';
  out.flush();
  if (!out) return Status::IOError("cannot write trace " + path);
  return Status::OK();
}

}  // namespace kvbench
