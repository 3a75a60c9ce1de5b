#include "table/bucket_format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {

namespace {
// Header byte offsets.
constexpr size_t kHeaderChecksummed = 32;
// Footer byte offsets.
constexpr size_t kFooterChecksummed = 48;

bool KnownFormatVersion(uint32_t version) {
  return version >= kOldestBucketFormatVersion && version <= kBucketFormatVersion;
}
}  // namespace

uint64_t BucketEntryChecksum(uint32_t format_version, std::string_view key,
                             std::span<const MutableSlice> value, uint64_t size) {
  const bool with_key = format_version != kBucketFormatVersionValueChecksum;
  if (!with_key && value.size() == 1) return Hash64(value[0].data(), size);
  // Streaming over key then value costs what hashing the value alone does.
  Hasher64 h;
  if (with_key) h.Update(key.data(), key.size());
  for (const MutableSlice& p : value) {
    if (size == 0) break;
    const uint64_t n = std::min<uint64_t>(size, p.size());
    h.Update(p.data(), n);
    size -= n;
  }
  return h.Digest();
}

void BucketHeader::EncodeTo(char* dst) const {
  std::memset(dst, 0, kBucketHeaderSize);
  EncodeFixed64(dst + 0, kBucketMagic);
  EncodeFixed32(dst + 8, format_version);
  EncodeFixed32(dst + 12, static_cast<uint32_t>(kBucketHeaderSize));
  EncodeFixed64(dst + 16, bucket_id);
  EncodeFixed64(dst + 24, created_micros);
  EncodeFixed64(dst + kHeaderChecksummed, Hash64(dst, kHeaderChecksummed));
}

Status BucketHeader::DecodeFrom(std::string_view src) {
  if (src.size() < kBucketHeaderSize) return Status::Corruption("bucket header truncated");
  if (DecodeFixed64(src.data()) != kBucketMagic)
    return Status::Corruption("bad bucket header magic");
  if (DecodeFixed64(src.data() + kHeaderChecksummed) != Hash64(src.data(), kHeaderChecksummed)) {
    return Status::Corruption("bucket header checksum mismatch");
  }
  const uint32_t version = DecodeFixed32(src.data() + 8);
  if (!KnownFormatVersion(version)) {
    return Status::NotSupported("bucket format version " + std::to_string(version));
  }
  format_version = version;
  if (DecodeFixed32(src.data() + 12) != kBucketHeaderSize) {
    return Status::Corruption("bucket header size field");
  }
  bucket_id = DecodeFixed64(src.data() + 16);
  created_micros = DecodeFixed64(src.data() + 24);
  return Status::OK();
}

void BucketFooter::EncodeTo(char* dst) const {
  std::memset(dst, 0, kBucketFooterSize);
  EncodeFixed64(dst + 0, index_offset);
  EncodeFixed64(dst + 8, index_size);
  EncodeFixed64(dst + 16, entry_count);
  EncodeFixed64(dst + 24, bucket_id);
  EncodeFixed32(dst + 32, format_version);
  EncodeFixed64(dst + kFooterChecksummed, Hash64(dst, kFooterChecksummed));
  EncodeFixed64(dst + 56, kBucketMagic);
}

Status BucketFooter::DecodeFrom(std::string_view src) {
  if (src.size() != kBucketFooterSize) return Status::Corruption("bucket footer truncated");
  if (DecodeFixed64(src.data() + 56) != kBucketMagic) {
    return Status::Corruption("bad bucket footer magic (torn or foreign file)");
  }
  if (DecodeFixed64(src.data() + kFooterChecksummed) != Hash64(src.data(), kFooterChecksummed)) {
    return Status::Corruption("bucket footer checksum mismatch");
  }
  const uint32_t version = DecodeFixed32(src.data() + 32);
  if (!KnownFormatVersion(version)) {
    return Status::NotSupported("bucket format version " + std::to_string(version));
  }
  format_version = version;
  index_offset = DecodeFixed64(src.data() + 0);
  index_size = DecodeFixed64(src.data() + 8);
  entry_count = DecodeFixed64(src.data() + 16);
  bucket_id = DecodeFixed64(src.data() + 24);
  return Status::OK();
}

std::string EncodeBucketIndex(uint32_t format_version, const std::vector<BucketEntry>& entries) {
  std::string out;
  PutFixed64(&out, entries.size());
  // Version 3 spends varints where version 2 spent 24 fixed bytes: with small values the
  // index is a tenth of the file, and the offset in units fits in three bytes.
  const bool compact = format_version >= 3;
  for (const BucketEntry& e : entries) {
    PutLengthPrefixed(&out, e.key);
    if (compact) {
      PutVarint64(&out, e.offset / kValueUnit);
      PutVarint64(&out, e.size);
      PutVarint64(&out, e.version);
    } else {
      PutFixed64(&out, e.offset);
      PutFixed64(&out, e.size);
      PutFixed64(&out, e.version);
    }
    PutFixed64(&out, e.checksum);
  }
  PutFixed64(&out, Hash64(out.data(), out.size()));
  return out;
}

Status DecodeBucketIndex(uint32_t format_version, std::string_view block, uint64_t file_size,
                         std::vector<BucketEntry>* entries) {
  entries->clear();
  if (block.size() < 16) return Status::Corruption("bucket index truncated");
  const std::string_view body = block.substr(0, block.size() - 8);
  if (DecodeFixed64(block.data() + body.size()) != Hash64(body.data(), body.size())) {
    return Status::Corruption("bucket index checksum mismatch");
  }
  std::string_view in = body;
  uint64_t count;
  GetFixed64(&in, &count);
  if (count > in.size()) return Status::Corruption("bucket index entry count");
  entries->reserve(count);
  const bool compact = format_version >= 3;
  const uint64_t alignment = ValueOffsetAlignment(format_version);
  for (uint64_t i = 0; i < count; i++) {
    BucketEntry e;
    std::string_view key;
    bool parsed = GetLengthPrefixed(&in, &key);
    if (compact) {
      uint64_t units = 0;
      parsed = parsed && GetVarint64(&in, &units) && units <= UINT64_MAX / kValueUnit &&
               GetVarint64(&in, &e.size) && GetVarint64(&in, &e.version);
      e.offset = units * kValueUnit;
    } else {
      parsed = parsed && GetFixed64(&in, &e.offset) && GetFixed64(&in, &e.size) &&
               GetFixed64(&in, &e.version);
    }
    if (!parsed || !GetFixed64(&in, &e.checksum)) {
      return Status::Corruption("bucket index entry " + std::to_string(i) + " truncated");
    }
    if (key.empty() || e.offset < kBucketHeaderSize || e.offset % alignment != 0 ||
        e.size > file_size || e.offset > file_size - e.size) {
      return Status::Corruption("bucket index entry " + std::to_string(i) + " out of range");
    }
    e.key.assign(key);
    entries->push_back(std::move(e));
  }
  if (!in.empty()) return Status::Corruption("bucket index has trailing bytes");
  return Status::OK();
}

std::string BucketFileName(uint64_t id) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "bucket-%06llu.kvb", static_cast<unsigned long long>(id));
  return buf;
}

bool LooksLikeBucketFileName(std::string_view name) {
  return name.starts_with(kBucketFilePrefix) && name.ends_with(kBucketFileSuffix);
}

bool ParseBucketFileName(std::string_view name, uint64_t* id) {
  if (!LooksLikeBucketFileName(name)) return false;
  std::string_view digits = name.substr(
      kBucketFilePrefix.size(), name.size() - kBucketFilePrefix.size() - kBucketFileSuffix.size());
  if (digits.empty() || digits.size() > 20) return false;
  uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  // Only the name this DB writes for that id: "bucket-12.kvb" or "bucket-0000012.kvb" would
  // name bucket 12 too, and recovery and kv_ldb would disagree about which file it is.
  if (BucketFileName(v) != name) return false;
  *id = v;
  return true;
}

}  // namespace kvengine
