#include "util/printable.h"

#include <algorithm>
#include <array>
#include <cstring>

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

constexpr char kHex[] = "0123456789abcdef";

// Whether Printable shows a byte as itself (else as \xNN), by table: one load a byte
// instead of four compares (a namespace's miss checks its key's bytes this way).
constexpr std::array<bool, 256> kShownPlain = [] {
  std::array<bool, 256> plain{};
  for (int c = 0x20; c < 0x7f; c++) plain[c] = c != '\\' && c != '\'';
  return plain;
}();
bool ShownPlain(unsigned char c) { return kShownPlain[c]; }

}  // namespace

void AppendPrintable(const Slice& key, std::string* out) {
  // Every read that misses names its key in its NotFound, and a namespace's keys begin
  // with nine unprintable bytes: escaped by table into a buffer on the stack, then copied
  // once (snprintf cost a namespace's readrandom at 37% misses about a tenth of its CPU
  // time; appending byte by byte, a few hundred instructions a key).
  char text[kPrintableKeyBytes * 4 + 5];
  char* end = text;
  *end++ = '\'';
  const size_t shown = std::min<size_t>(key.size(), kPrintableKeyBytes);
  for (size_t i = 0; i < shown; i++) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (ShownPlain(c)) {
      *end++ = static_cast<char>(c);
    } else {
      end[0] = '\\';
      end[1] = 'x';
      end[2] = kHex[c >> 4];
      end[3] = kHex[c & 0xf];
      end += 4;
    }
  }
  if (key.size() > kPrintableKeyBytes) {
    std::memcpy(end, "...", 3);
    end += 3;
  }
  *end++ = '\'';
  out->append(text, end);
}

bool ShowsWholeKey(std::string_view shown, const Slice& key) {
  if (key.size() > kPrintableKeyBytes) return false;
  size_t at = 0;
  for (size_t i = 0; i < key.size(); i++) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (ShownPlain(c)) {
      if (at == shown.size() || shown[at] != static_cast<char>(c)) return false;
      at++;
    } else {
      if (shown.size() - at < 4 || shown[at] != '\\' || shown[at + 1] != 'x' ||
          shown[at + 2] != kHex[c >> 4] || shown[at + 3] != kHex[c & 0xf]) {
        return false;
      }
      at += 4;
    }
  }
  return at == shown.size();
}

std::string Printable(const Slice& key) {
  std::string out;
  AppendPrintable(key, &out);
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
