#include "util/byte_regex.h"

namespace kvengine {

namespace {
// Each byte becomes the character of its unsigned value (wchar_t holds 0..255 as is).
std::wstring Widen(std::string_view bytes) {
  std::wstring out(bytes.size(), L'\0');
  for (size_t i = 0; i < bytes.size(); i++) {
    out[i] = static_cast<wchar_t>(static_cast<unsigned char>(bytes[i]));
  }
  return out;
}
}  // namespace

Status ByteRegex::Compile(std::string_view pattern) {
  try {
    re_ = std::wregex(Widen(pattern), std::regex::ECMAScript | std::regex::optimize |
                                          std::regex_constants::__polynomial);
  } catch (const std::regex_error& e) {
    return Status::InvalidArgument("malformed regex '" + std::string(pattern) + "'", e.what());
  }
  return Status::OK();
}

bool ByteRegex::Matches(std::string_view key) const {
  const std::wstring wide = Widen(key);
  return std::regex_match(wide, re_);
}

}  // namespace kvengine
