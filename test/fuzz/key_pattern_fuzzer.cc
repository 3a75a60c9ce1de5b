// Fuzz target: DeleteByRegex's patterns (util/key_pattern.h) and their scoping to a
// namespace (util/namespace_key.h), as every door hands them over.
//
// Input: a mode byte, then (FuzzedDataProvider) a pattern and up to 8 keys, each ended
// by a backslash and another character (a backslash itself is written twice).  Mode bit 0
// repeats the pattern (up to 64 KiB: the long patterns that crashed std::regex's
// recursive compiler); bit 1 appends the rest of the input as a long key.  Properties
// checked beyond "no crash, no ASan/UBSan report, no stall past libFuzzer's timeout":
//   - Check refuses every pattern over KeyPattern::kMaxLength, and the empty one, with
//     InvalidArgument; Compile refuses past kMaxScopedLength;
//   - a pattern Check accepts, scoped to namespace N, matches prefix(N)+k exactly when
//     the pattern matches k, and never a key outside N; scoped to the default
//     namespace, it matches exactly the keys it matches that are not namespaced.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "test/fuzz/fuzz_check.h"
#include "util/key_pattern.h"
#include "util/namespace_key.h"

namespace kvengine {
namespace {

void CheckScopes(const std::string& pattern, const KeyPattern& alone,
                 const std::vector<std::string>& keys) {
  const uint64_t id = ns::IdOf("fuzz");
  const std::string prefix = ns::Prefix(id);
  std::string in_namespace;
  if (ns::PatternInNamespace(id, pattern, &in_namespace).ok()) {
    KeyPattern scoped;
    Status s = scoped.Compile(in_namespace);
    FUZZ_CHECK(s.ok(), "a checked pattern scoped to a namespace does not compile: " + s.ToString());
    for (const std::string& k : keys) {
      FUZZ_CHECK(scoped.Matches(prefix + k) == alone.Matches(k),
                 "the namespace's pattern and the user's disagree on key " + k);
      if (!k.starts_with(prefix)) {
        FUZZ_CHECK(!scoped.Matches(k), "a namespace's pattern matched a key outside it: " + k);
      }
    }
  }
  KeyPattern in_default;
  Status s = in_default.Compile(ns::PatternInDefault(pattern));
  FUZZ_CHECK(s.ok(),
             "a checked pattern scoped to the default namespace does not compile: " + s.ToString());
  for (const std::string& k : keys) {
    if (k.empty()) continue;  // no key is: the scope needs a first byte
    FUZZ_CHECK(in_default.Matches(k) == (alone.Matches(k) && !ns::IsNamespaced(k)),
               "the default namespace's pattern and the user's disagree on key " + k);
    FUZZ_CHECK(!in_default.Matches(prefix + k), "the default namespace's pattern matched " + k);
  }
}

}  // namespace
}  // namespace kvengine

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvengine::KeyPattern;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  FuzzedDataProvider in(data + 1, size - 1);
  std::string pattern = in.ConsumeRandomLengthString(8192);
  if ((mode & 1) != 0 && !pattern.empty()) {
    const size_t times = 1 + (65536 / pattern.size()) * in.ConsumeIntegralInRange(0, 255) / 255;
    std::string repeated;
    for (size_t i = 0; i < times; i++) repeated += pattern;
    pattern = std::move(repeated);
  }
  std::vector<std::string> keys;
  const int n = in.ConsumeIntegralInRange(0, 8);
  for (int i = 0; i < n; i++) keys.push_back(in.ConsumeRandomLengthString(256));
  if ((mode & 2) != 0) keys.push_back(in.ConsumeRemainingBytesAsString());

  kvengine::Status checked = KeyPattern::Check(pattern);
  if (pattern.empty() || pattern.size() > KeyPattern::kMaxLength) {
    FUZZ_CHECK(checked.IsInvalidArgument(), "Check accepted an empty or over-long pattern");
  }
  KeyPattern compiled;
  kvengine::Status s = compiled.Compile(pattern);
  if (pattern.size() > KeyPattern::kMaxScopedLength) {
    FUZZ_CHECK(s.IsInvalidArgument(), "Compile accepted an over-long pattern");
  }
  if (!s.ok()) {
    FUZZ_CHECK(s.IsInvalidArgument(), "a refusal that is not InvalidArgument: " + s.ToString());
    FUZZ_CHECK(!checked.ok(), "Check accepted what Compile refuses");
    return 0;
  }
  for (const std::string& k : keys) compiled.Matches(k);
  // A leading lookahead is the layers' scope: scoped again, it would not be at the front.
  if (checked.ok() && !pattern.starts_with("(?=")) kvengine::CheckScopes(pattern, compiled, keys);
  return 0;
}
