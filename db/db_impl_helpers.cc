#include "db/db_impl_helpers.h"

#include <cstdio>

namespace kvengine {
namespace db_impl {


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

Status ForKey(const Slice& key, const Status& s) {
  return Status::FromErrorCode(s.ErrorCode(), "key " + Printable(key) + ": " + s.message());
}

uint64_t PartsSize(std::span<const Slice> parts) {
  uint64_t size = 0;
  for (const Slice& part : parts) size += part.size();
  return size;
}

Status TooSmall(const Slice& key, uint64_t size, uint64_t capacity) {
  return Status::BufferTooSmall("value of key " + Printable(key) + " is " + std::to_string(size) +
                                " bytes; buffers hold " + std::to_string(capacity));
}

}  // namespace db_impl
}  // namespace kvengine
