// KeyPattern: a regular expression matched against whole keys, byte by byte, in time
// linear in the key and with memory bounded whatever the pattern.
//
// Every door that takes a pattern (DB::DeleteByRegex through the C++ API, attach, peers,
// the Python module, kv_ldb, the engine adapters) checks it here, once, and every layer
// that matches keys compiles it here.  The engine is RE2 (Latin-1: a byte is a character
// 0..255, so "[\x80-\xff]" is the high half), not std::regex: libstdc++'s compiler
// recursed once per character of the pattern (200,000 'a's overflowed the owner's stack)
// and its matcher backtracked (`(?:a?){16000}` ran seconds per key).  RE2's parser keeps
// its own stack, its programs are bounded by kMaxProgramBytes and it never backtracks.
//
// Syntax: RE2's (docs/python.md lists what differs from ECMAScript).  The layers below
// a user scope a pattern with one construct RE2 lacks, which Compile accepts and Check
// refuses: a leading lookahead `(?=A)B` means "the key begins with a match of A, and the
// whole key matches B" (util/namespace_key.h, transport/tenant_tokens.h).  Any other
// lookaround, and back-references, are refused.
//
// Thread-safety: Matches() may be called from many threads at once after Compile().
#ifndef KVENGINE_UTIL_KEY_PATTERN_H_
#define KVENGINE_UTIL_KEY_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kvengine/status.h"

namespace re2 {
class RE2;
}

namespace kvengine {

class KeyPattern {
 public:
  // The longest pattern a user may give, in bytes.
  static constexpr size_t kMaxLength = 4096;
  // The longest pattern the layers pass down (and peers accept on the wire): a user's
  // pattern scoped to its namespaces or its tenant's grant is longer than the user's.
  static constexpr size_t kMaxScopedLength = 16384;
  // The most instructions a pattern may compile to.  RE2 is linear in the key, but its
  // worst case (when its DFA gives up, as on `(?:[\x00-\xff]{0,1000}a)` repeated) costs
  // each byte of the key a step per instruction: at this limit ~50-90 ms for a 4 KiB key
  // on the development VM, borne by the caller alone (no lock is held meanwhile).
  static constexpr int kMaxProgramSize = 4096;
  // The memory RE2 may use for one pattern's program and its DFA cache; a pattern whose
  // program does not fit is refused.
  static constexpr int64_t kMaxProgramBytes = 4 << 20;

  KeyPattern();
  ~KeyPattern();
  KeyPattern(KeyPattern&&) noexcept;
  KeyPattern& operator=(KeyPattern&&) noexcept;

  // Whether a user's pattern is one DB::DeleteByRegex takes: at most kMaxLength bytes,
  // not empty, no lookahead, and compiling.  InvalidArgument naming the pattern
  // (shortened) and why.
  static Status Check(std::string_view pattern);

  // Compiles a pattern of at most kMaxScopedLength bytes (a user's, or one a layer
  // scoped).  InvalidArgument naming the pattern (shortened) and why when it does not.
  Status Compile(std::string_view pattern);

  // Whether the whole of `key` matches.  REQUIRES: Compile() succeeded.
  bool Matches(std::string_view key) const;

  // The pattern as messages show it: quoted, at most 64 of its bytes (escaped as
  // Printable escapes a key), and its length when it was longer.
  static std::string Shown(std::string_view pattern);

 private:
  Status CompilePart(std::string_view whole, std::string_view part, std::unique_ptr<re2::RE2>* out);

  std::unique_ptr<re2::RE2> scope_;  // the leading lookahead's pattern, or null
  std::unique_ptr<re2::RE2> body_;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_KEY_PATTERN_H_
