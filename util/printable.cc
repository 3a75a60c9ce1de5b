#include "util/printable.h"

#include <algorithm>

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
  // Every read that misses names its key in its NotFound, and a namespace's keys begin
  // with nine unprintable bytes: escaped by table, not by snprintf (which cost a
  // namespace's readrandom at 37% misses about a tenth of its CPU time).
  static constexpr char kHex[] = "0123456789abcdef";
  const size_t shown = std::min<size_t>(key.size(), 64);
  std::string out;
  out.reserve(shown * 4 + 5);
  out += '\'';
  for (size_t i = 0; i < shown; i++) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      const char escaped[4] = {'\\', 'x', kHex[c >> 4], kHex[c & 0xf]};
      out.append(escaped, sizeof(escaped));
    }
  }
  if (key.size() > 64) out += "...";
  out += '\'';
  return out;
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
