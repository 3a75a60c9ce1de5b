#include "util/printable.h"

#include <cstdio>

namespace kvengine {

std::string Printable(const Slice& key) {
  std::string out;
  for (size_t i = 0; i < key.size() && i < 64; i++) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (key.size() > 64) out += "...";
  return "'" + out + "'";
}

}  // namespace kvengine
