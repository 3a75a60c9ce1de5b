#include "metrics/http_request.h"

#include <algorithm>
#include <cctype>

namespace kvengine {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// True when the comma-separated `list` holds `token` (Connection: keep-alive, close).
bool ListHas(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    if (EqualsNoCase(Trim(list.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
}

}  // namespace

HttpRequestHead::Result HttpRequestHead::Parse(std::string_view bytes, const Limits& limits,
                                               size_t* consumed) {
  auto refuse = [this](int code, std::string why) {
    status = code;
    reason = std::move(why);
    return Result::kRefused;
  };
  // The request line, judged before its end arrives when it is already too long (its
  // length so far is then all the bytes).
  const size_t line_end = bytes.find('\n');
  if (std::min(line_end, bytes.size()) > limits.max_request_line) {
    return refuse(414,
                  "request line longer than " + std::to_string(limits.max_request_line) + " bytes");
  }
  if (line_end == std::string_view::npos) return Result::kIncomplete;
  // Headers, up to the blank line, judged as they come.
  size_t at = line_end + 1;
  size_t headers = 0;
  size_t head_end = std::string_view::npos;
  size_t blank_line = 0;  // where the blank line that ends the head starts
  while (at < bytes.size()) {
    const size_t end = bytes.find('\n', at);
    if (end == std::string_view::npos) break;
    if (end == at || (end == at + 1 && bytes[at] == '\r')) {
      blank_line = at;
      head_end = end + 1;
      break;
    }
    if (++headers > limits.max_headers) {
      return refuse(431, "more than " + std::to_string(limits.max_headers) + " header lines");
    }
    at = end + 1;
  }
  if (std::min(head_end, bytes.size()) > limits.max_head_bytes) {
    return refuse(431,
                  "request head longer than " + std::to_string(limits.max_head_bytes) + " bytes");
  }
  if (head_end == std::string_view::npos) return Result::kIncomplete;

  // "METHOD SP TARGET SP HTTP/1.x"
  const std::string_view line = Trim(bytes.substr(0, line_end));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return refuse(400, "malformed request line");
  }
  const std::string_view m = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(m) || target.empty()) return refuse(400, "malformed request line");
  if (version == "HTTP/1.1") {
    http11 = true;
  } else if (version == "HTTP/1.0") {
    http11 = false;
  } else if (version.starts_with("HTTP/")) {
    return refuse(505, "only HTTP/1.0 and HTTP/1.1");
  } else {
    return refuse(400, "malformed request line");
  }
  method.assign(m);
  path.assign(target.substr(0, target.find('?')));

  bool close = false;
  bool ask_keep_alive = false;
  has_body = false;
  for (size_t pos = line_end + 1; pos < blank_line;) {
    const size_t end = bytes.find('\n', pos);
    const std::string_view header = bytes.substr(pos, end - pos);
    pos = end + 1;
    const size_t colon = header.find(':');
    if (colon == std::string_view::npos || !IsToken(header.substr(0, colon))) {
      return refuse(400, "malformed header line");
    }
    const std::string_view name = header.substr(0, colon);
    const std::string_view value = Trim(header.substr(colon + 1));
    if (EqualsNoCase(name, "Connection")) {
      close = close || ListHas(value, "close");
      ask_keep_alive = ask_keep_alive || ListHas(value, "keep-alive");
    } else if (EqualsNoCase(name, "Transfer-Encoding")) {
      has_body = true;
    } else if (EqualsNoCase(name, "Content-Length")) {
      if (value.empty() || value.find_first_not_of("0123456789") != std::string_view::npos) {
        return refuse(400, "malformed Content-Length");
      }
      if (value.find_first_not_of('0') != std::string_view::npos) has_body = true;
    }
  }
  keep_alive = !close && (http11 || ask_keep_alive);
  *consumed = head_end;
  return Result::kComplete;
}

}  // namespace kvengine
