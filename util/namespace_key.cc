#include "util/namespace_key.h"

#include <cstdio>

#include "util/hash.h"
#include "util/key_pattern.h"

namespace kvengine::ns {

namespace {
// "\xNN" for each byte: the prefix as regex text that matches exactly those bytes.
std::string Escaped(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 4);
  for (char c : bytes) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
    out += buf;
  }
  return out;
}
}  // namespace

uint64_t IdOf(std::string_view name) { return Hash64(name); }

std::string Prefix(uint64_t id) {
  std::string p(kPrefixSize, '\0');
  EncodePrefix(id, p.data());
  return p;
}

Status PatternInNamespace(uint64_t id, std::string_view user_pattern, std::string* pattern) {
  std::string_view p = user_pattern;
  // A leading '^' holds where the user's part begins: an empty group there means the
  // same, and stays something a quantifier after it can apply to (`^*a` compiles).
  const bool anchored = p.starts_with('^');
  if (anchored) p.remove_prefix(1);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); i++) {
    const char c = p[i];
    if (c == '\\') {
      const char next = i + 1 < p.size() ? p[i + 1] : '\0';
      if (!in_class && (next == 'b' || next == 'B' || next == 'A')) {
        return Status::InvalidArgument("pattern " + KeyPattern::Shown(user_pattern),
                                       "\\A, \\b and \\B are not supported in a namespace");
      }
      i++;  // the escaped character
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == '^') {
      return Status::InvalidArgument("pattern " + KeyPattern::Shown(user_pattern),
                                     "'^' is supported in a namespace only at the start");
    }
  }
  *pattern = PrefixPattern(id) + "(?:" + (anchored ? "(?:)" : "") + std::string(p) + ")";
  return Status::OK();
}

std::string PatternInDefault(std::string_view user_pattern) {
  return "(?=[^\\xfe])(?:" + std::string(user_pattern) + ")";
}

std::string AllKeysOfNamespace(uint64_t id) { return PrefixPattern(id) + "[\\x00-\\xff]*"; }

std::string PrefixPattern(uint64_t id) { return Escaped(Prefix(id)); }

}  // namespace kvengine::ns
