#include "util/key_pattern.h"

#include <re2/re2.h>

#include <cstdio>

namespace kvengine {

namespace {

constexpr std::string_view kLookahead = "(?=";
constexpr size_t kShownBytes = 64;  // of a pattern, in messages
constexpr char kNoLookarounds[] = "lookaheads and lookbehinds are not supported";

// Where the group that `p` opens (p[0] == '(') closes, or npos when it does not: a scan
// that skips escapes, \Q...\E quoting and character classes, as RE2's parser reads them.
size_t GroupEnd(std::string_view p) {
  int depth = 0;
  for (size_t i = 0; i < p.size(); i++) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 < p.size() && p[i + 1] == 'Q') {
        const size_t end = p.find("\\E", i + 2);
        if (end == std::string_view::npos) return std::string_view::npos;
        i = end + 1;
      } else {
        i++;  // the escaped character
      }
    } else if (c == '[') {
      // A class: a leading '^' and a leading ']' are part of it; "[:name:]" nests.
      size_t j = i + 1;
      if (j < p.size() && p[j] == '^') j++;
      if (j < p.size() && p[j] == ']') j++;
      for (; j < p.size() && p[j] != ']'; j++) {
        if (p[j] == '\\') {
          j++;
        } else if (p[j] == '[' && j + 1 < p.size() && p[j + 1] == ':') {
          const size_t end = p.find(":]", j + 2);
          if (end == std::string_view::npos) return std::string_view::npos;
          j = end + 1;
        }
      }
      if (j >= p.size()) return std::string_view::npos;
      i = j;
    } else if (c == '(') {
      depth++;
    } else if (c == ')') {
      if (--depth == 0) return i;
    }
  }
  return std::string_view::npos;
}

Status Refuse(std::string_view pattern, const std::string& why) {
  return Status::InvalidArgument("pattern " + KeyPattern::Shown(pattern), why);
}

}  // namespace

KeyPattern::KeyPattern() = default;
KeyPattern::~KeyPattern() = default;
KeyPattern::KeyPattern(KeyPattern&&) noexcept = default;
KeyPattern& KeyPattern::operator=(KeyPattern&&) noexcept = default;

std::string KeyPattern::Shown(std::string_view pattern) {
  // As Printable shows a key, but for the backslashes a pattern is full of, kept as
  // they are: `[\x00-\xff]` reads as written.
  std::string shown = "'";
  for (size_t i = 0; i < pattern.size() && i < kShownBytes; i++) {
    const unsigned char c = static_cast<unsigned char>(pattern[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      shown += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      shown += hex;
    }
  }
  shown += pattern.size() > kShownBytes ? "...'" : "'";
  if (pattern.size() > kShownBytes) shown += " (" + std::to_string(pattern.size()) + " bytes)";
  return shown;
}

Status KeyPattern::Check(std::string_view pattern) {
  if (pattern.size() > kMaxLength) {
    return Refuse(pattern, "longer than the limit of " + std::to_string(kMaxLength) + " bytes");
  }
  // The leading lookahead is how the layers scope a pattern; a user's own would no
  // longer lead once scoped, and mean something else in a namespace than outside.
  if (pattern.starts_with(kLookahead)) return Refuse(pattern, kNoLookarounds);
  KeyPattern compiled;
  Status s = compiled.Compile(pattern);
  if (!s.ok()) return s;
  // The layers put a user's pattern in a group, after its scope: the only pattern that
  // compiles alone but not there quotes the group's end (`\Q` without `\E`).
  if (!compiled.Compile("(?:" + std::string(pattern) + ")").ok()) {
    return Refuse(pattern, "its \\Q quote is not ended by \\E");
  }
  return Status::OK();
}

Status KeyPattern::Compile(std::string_view pattern) {
  scope_.reset();
  body_.reset();
  if (pattern.empty()) return Refuse(pattern, "is empty (it would match no key)");
  if (pattern.size() > kMaxScopedLength) {
    return Refuse(pattern,
                  "longer than the limit of " + std::to_string(kMaxScopedLength) + " bytes");
  }
  std::string_view body = pattern;
  if (pattern.starts_with(kLookahead)) {
    const size_t end = GroupEnd(pattern);
    if (end == std::string_view::npos)
      return Refuse(pattern, "its leading lookahead is not closed");
    Status s =
        CompilePart(pattern, pattern.substr(kLookahead.size(), end - kLookahead.size()), &scope_);
    if (!s.ok()) return s;
    body = pattern.substr(end + 1);
  }
  return CompilePart(pattern, body, &body_);
}

Status KeyPattern::CompilePart(std::string_view whole, std::string_view part,
                               std::unique_ptr<re2::RE2>* out) {
  re2::RE2::Options options;
  options.set_encoding(re2::RE2::Options::EncodingLatin1);
  options.set_max_mem(kMaxProgramBytes);
  options.set_log_errors(false);  // the Status says it, once, to the caller
  options.set_never_capture(true);
  auto re = std::make_unique<re2::RE2>(re2::StringPiece(part.data(), part.size()), options);
  if (re->ok() && re->ProgramSize() > kMaxProgramSize) {
    return Refuse(whole, "compiles to " + std::to_string(re->ProgramSize()) +
                             " instructions, over the limit of " + std::to_string(kMaxProgramSize));
  }
  if (re->ok()) {
    *out = std::move(re);
    return Status::OK();
  }
  switch (re->error_code()) {
    case re2::RE2::ErrorPatternTooLarge:
      return Refuse(whole, "compiles to more than the " + std::to_string(kMaxProgramBytes >> 20) +
                               " MiB a pattern may use");
    case re2::RE2::ErrorBadPerlOp:
      return Refuse(whole, re->error() + " (" + kNoLookarounds + ")");
    default:
      return Refuse(whole, "malformed: " + re->error());
  }
}

bool KeyPattern::Matches(std::string_view key) const {
  const re2::StringPiece text(key.data(), key.size());
  if (scope_ != nullptr &&
      !scope_->Match(text, 0, text.size(), re2::RE2::ANCHOR_START, nullptr, 0)) {
    return false;
  }
  return body_->Match(text, 0, text.size(), re2::RE2::ANCHOR_BOTH, nullptr, 0);
}

}  // namespace kvengine
