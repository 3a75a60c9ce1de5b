#include "util/config_parse.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace kvengine {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

Status Expected(std::string_view what, std::string_view text) {
  return Status::InvalidArgument("expected " + std::string(what) + ", got '" + std::string(text) +
                                 "'");
}

}  // namespace

Status ParseInt(std::string_view text, int64_t* out) {
  std::string_view s = Trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    return Expected("an integer", text);
  }
  *out = value;
  return Status::OK();
}

Status ParseUInt(std::string_view text, uint64_t* out) {
  std::string_view s = Trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    return Expected("a non-negative integer", text);
  }
  *out = value;
  return Status::OK();
}

Status ParseDouble(std::string_view text, double* out) {
  std::string_view s = Trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value)) {
    return Expected("a number", text);
  }
  *out = value;
  return Status::OK();
}

Status ParseRatio(std::string_view text, double* out) {
  double value = 0;
  if (!ParseDouble(text, &value).ok() || value < 0.0 || value > 1.0) {
    return Expected("a ratio between 0 and 1", text);
  }
  *out = value;
  return Status::OK();
}

Status ParseBool(std::string_view text, bool* out) {
  std::string s = Lower(Trim(text));
  if (s == "1" || s == "true" || s == "yes" || s == "on") {
    *out = true;
  } else if (s == "0" || s == "false" || s == "no" || s == "off") {
    *out = false;
  } else {
    return Expected("a boolean (true/false, 1/0, yes/no, on/off)", text);
  }
  return Status::OK();
}

Status ParseEnum(std::string_view text, const std::vector<std::string>& names, int* out) {
  std::string s = Lower(Trim(text));
  for (size_t i = 0; i < names.size(); i++) {
    if (s == names[i]) {
      *out = static_cast<int>(i);
      return Status::OK();
    }
  }
  std::string choices;
  for (const auto& n : names) choices += (choices.empty() ? "" : "|") + n;
  return Expected("one of " + choices, text);
}

Status ParseSize(std::string_view text, uint64_t* out) {
  std::string_view s = Trim(text);
  size_t split = 0;
  while (split < s.size() && (std::isdigit(static_cast<unsigned char>(s[split])) ||
                              s[split] == '.' || s[split] == '+')) {
    split++;
  }
  std::string_view number = s.substr(0, split);
  std::string unit = Lower(Trim(s.substr(split)));
  static const struct {
    const char* name;
    uint64_t multiplier;
  } kUnits[] = {{"", 1},
                {"b", 1},
                {"k", 1ull << 10},
                {"kib", 1ull << 10},
                {"kb", 1000},
                {"m", 1ull << 20},
                {"mib", 1ull << 20},
                {"mb", 1000000},
                {"g", 1ull << 30},
                {"gib", 1ull << 30},
                {"gb", 1000000000},
                {"t", 1ull << 40},
                {"tib", 1ull << 40},
                {"tb", 1000000000000}};
  const char* kWhat = "a size such as 4096, 64KiB, 1.5GiB";
  uint64_t multiplier = 0;
  for (const auto& u : kUnits) {
    if (unit == u.name) multiplier = u.multiplier;
  }
  if (number.empty() || multiplier == 0) return Expected(kWhat, text);
  if (number.find('.') == std::string_view::npos) {
    uint64_t value = 0;
    if (!ParseUInt(number, &value).ok()) return Expected(kWhat, text);
    if (value > std::numeric_limits<uint64_t>::max() / multiplier) {
      return Status::InvalidArgument("size too large: '" + std::string(text) + "'");
    }
    *out = value * multiplier;
    return Status::OK();
  }
  double value = 0;
  if (!ParseDouble(number, &value).ok()) return Expected(kWhat, text);
  double bytes = value * static_cast<double>(multiplier);
  if (bytes >= 1.8e19)
    return Status::InvalidArgument("size too large: '" + std::string(text) + "'");
  if (bytes != std::floor(bytes)) {
    return Status::InvalidArgument("size is not a whole number of bytes: '" + std::string(text) +
                                   "'");
  }
  *out = static_cast<uint64_t>(bytes);
  return Status::OK();
}

std::string FormatSize(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    unit++;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[unit]);
  }
  return buf;
}

}  // namespace kvengine
