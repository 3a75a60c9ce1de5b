// ByteRegex: an ECMAScript regular expression matched against whole keys, byte by byte.
//
// Keys are bytes, and a pattern's byte ranges mean byte values: "[\x00-\xff]" is every
// byte, "[\x80-\xff]" the high half.  std::regex over char (signed here) read \xff as -1
// and refused such a range; this matches over characters 0..255 instead.
//
// Compiled without backtracking (libstdc++'s polynomial mode): no exponential patterns and
// no recursion per byte of the key.  Back-references, which need backtracking, are refused.
//
// Thread-safety: Matches() may be called from many threads at once after Compile().
#ifndef KVENGINE_UTIL_BYTE_REGEX_H_
#define KVENGINE_UTIL_BYTE_REGEX_H_

#include <regex>
#include <string>
#include <string_view>

#include "kvengine/status.h"

namespace kvengine {

class ByteRegex {
 public:
  // InvalidArgument naming the pattern and the reason when it does not compile.
  Status Compile(std::string_view pattern);
  // Whether the whole of `key` matches.  REQUIRES: Compile() succeeded.
  bool Matches(std::string_view key) const;

 private:
  std::wregex re_;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_BYTE_REGEX_H_
