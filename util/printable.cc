#include "util/printable.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "util/hash.h"
#include "util/input_check.h"

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

// Writes how Printable shows byte c -- itself, or \xNN for an unprintable byte, a quote
// or a backslash (by table: one load a byte instead of four compares) -- to out, and
// returns how many characters that is (1 or 4).
inline size_t ShowByte(unsigned char c, char* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  static constexpr std::array<bool, 256> kPlain = [] {
    std::array<bool, 256> plain{};
    for (int b = 0x20; b < 0x7f; b++) plain[b] = b != '\\' && b != '\'';
    return plain;
  }();
  if (kPlain[c]) {
    out[0] = static_cast<char>(c);
    return 1;
  }
  out[0] = '\\';
  out[1] = 'x';
  out[2] = kHex[c >> 4];
  out[3] = kHex[c & 0xf];
  return 4;
}

// The most KeyDigest writes: 20 digits, " bytes, hash ", 16 hex digits.
constexpr size_t kMaxDigest = 20 + 13 + 16;
// The most Printable writes: a quote, 64 bytes of 4 characters, "..." and a quote, then
// " (", the digest and ")".
constexpr size_t kMaxPrintable = 1 + kPrintableKeyBytes * 4 + 3 + 1 + 2 + kMaxDigest + 1;

// Writes KeyDigest(key) at out (room for kMaxDigest bytes); returns its end.
char* DigestTo(const Slice& key, char* out) {
  const int n = std::snprintf(out, kMaxDigest + 1, "%zu bytes, hash %016llx", key.size(),
                              static_cast<unsigned long long>(Hash64(key.view())));
  return out + std::min<size_t>(static_cast<size_t>(n), kMaxDigest);
}

// Writes Printable(key) at out (room for kMaxPrintable bytes); returns its end.
char* PrintTo(const Slice& key, char* out) {
  *out++ = '\'';
  const size_t shown = std::min<size_t>(key.size(), kPrintableKeyBytes);
  for (size_t i = 0; i < shown; i++) out += ShowByte(static_cast<unsigned char>(key[i]), out);
  if (key.size() <= kPrintableKeyBytes) {
    *out++ = '\'';
    return out;
  }
  std::memcpy(out, "...' (", 6);
  out = DigestTo(key, out + 6);
  *out++ = ')';
  return out;
}

}  // namespace

std::string Printable(const Slice& key) {
  // Every read that misses names its key in its NotFound, and a namespace's keys begin
  // with nine unprintable bytes: escaped by table into a buffer on the stack, then copied
  // once (snprintf cost a namespace's readrandom at 37% misses about a tenth of its CPU
  // time; appending byte by byte, a few hundred instructions a key).
  char text[kMaxPrintable];
  return std::string(text, PrintTo(key, text));
}

std::string KeyDigest(const Slice& key) {
  char text[kMaxDigest + 1];
  return std::string(text, DigestTo(key, text));
}

Status KeyNotFound(const Slice& key, std::string_view namespace_name) {
  // A third of readrandom's gets end here: the message is written on the stack and
  // copied once, into the status (no string per piece).
  constexpr std::string_view kKey = "key ", kIn = " (namespace ", kOut = ")";
  char text[kKey.size() + kMaxPrintable + kIn.size() + input::kMaxNameBytes + kOut.size()];
  char* end = text;
  end = std::copy(kKey.begin(), kKey.end(), end);
  end = PrintTo(key, end);
  if (!namespace_name.empty()) {
    namespace_name = namespace_name.substr(0, input::kMaxNameBytes);  // names are 1 to 64 bytes
    end = std::copy(kIn.begin(), kIn.end(), end);
    end = std::copy(namespace_name.begin(), namespace_name.end(), end);
    end = std::copy(kOut.begin(), kOut.end(), end);
  }
  return Status::NotFound(std::string_view(text, static_cast<size_t>(end - text)));
}

bool ShowsWholeKey(std::string_view shown, const Slice& key) {
  if (key.size() > kPrintableKeyBytes) return false;
  size_t at = 0;
  for (size_t i = 0; i < key.size(); i++) {
    char byte[4];
    const size_t n = ShowByte(static_cast<unsigned char>(key[i]), byte);
    if (shown.size() - at < n) return false;
    for (size_t j = 0; j < n; j++) {
      if (shown[at + j] != byte[j]) return false;
    }
    at += n;
  }
  return at == shown.size();
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
