// Strict parsing of option values given as strings (environment variables, Options::Set,
// the Python module, kv_bench flags).  Every parser accepts the whole string or fails
// with InvalidArgument describing what was expected; none ever falls back to a default.
#ifndef KVENGINE_UTIL_CONFIG_PARSE_H_
#define KVENGINE_UTIL_CONFIG_PARSE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/status.h"

namespace kvengine {

// "4096", "64KiB", "1.5GiB", "10MB" (decimal units), "0".  Surrounding blanks allowed.
Status ParseSize(std::string_view text, uint64_t* out);
// A base-10 integer that fits in int64.
Status ParseInt(std::string_view text, int64_t* out);
// A non-negative base-10 integer that fits in uint64.
Status ParseUInt(std::string_view text, uint64_t* out);
// A finite floating point number ("0.25", "1e-3").
Status ParseDouble(std::string_view text, double* out);
// A fraction in [0, 1].
Status ParseRatio(std::string_view text, double* out);
// 1/0, true/false, yes/no, on/off, any case.
Status ParseBool(std::string_view text, bool* out);
// One of `names` (any case); stores its index.
Status ParseEnum(std::string_view text, const std::vector<std::string>& names, int* out);

// "64 MiB" style rendering for messages and stats.
std::string FormatSize(uint64_t bytes);

}  // namespace kvengine

#endif  // KVENGINE_UTIL_CONFIG_PARSE_H_
