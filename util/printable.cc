#include "util/printable.h"

#include <cstdio>

namespace kvengine {

namespace {

template <typename Buffer>
Status FirstNullBuffer(const Slice& key, std::span<const Buffer> buffers, const char* what) {
  for (size_t i = 0; i < buffers.size(); i++) {
    if (buffers[i].data() == nullptr && buffers[i].size() != 0) {
      return Status::InvalidArgument(std::string(what) + " buffer " + std::to_string(i) +
                                     " of key " + Printable(key) + " is null with length " +
                                     std::to_string(buffers[i].size()));
    }
  }
  return Status::OK();
}

}  // namespace

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

Status CheckNoNullBuffer(const Slice& key, std::span<const Slice> buffers, const char* what) {
  return FirstNullBuffer(key, buffers, what);
}

Status CheckNoNullBuffer(const Slice& key, std::span<const MutableSlice> buffers,
                         const char* what) {
  return FirstNullBuffer(key, buffers, what);
}

Status TooSmall(const Slice& key, uint64_t size, uint64_t capacity) {
  return Status::BufferTooSmall("value of key " + Printable(key) + " is " + std::to_string(size) +
                                " bytes; buffers hold " + std::to_string(capacity));
}

}  // namespace kvengine
