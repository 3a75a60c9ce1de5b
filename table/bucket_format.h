// The bucket file format: one immutable segment file holding many values.
// The layout is written down byte by byte in docs/bucket_format.md.
//
//   [header: 4096 bytes]
//   [value 0] [value 1] ...   each on a 512-byte unit; 64 KiB and larger ones on a page
//   [zero padding to 4096] [index block] [zero padding] [footer: 64 bytes]
//   (file size: a multiple of 4096)
//
// Values are packed on 512-byte units so that a small value costs about its size on
// disk (a 512-byte value took 4 KiB when every value was 4096-aligned); large values
// start on a page so that O_DIRECT reads them straight into aligned caller buffers.  A
// reader on a device whose O_DIRECT alignment is larger than a value's reads the blocks
// around it.  The header, the index block and the footer each carry their own XXH3
// checksum, and every index entry carries the XXH3 of its key and value, so a torn
// footer, a corrupt index and a corrupt value are told apart, and an entry whose key was
// changed does not vouch for its value.
#ifndef KVENGINE_TABLE_BUCKET_FORMAT_H_
#define KVENGINE_TABLE_BUCKET_FORMAT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine {

// DO NOT CHANGE THESE VALUES: they are embedded in bucket files on disk.
inline constexpr uint64_t kBucketMagic = 0x31424b56474e454bull;  // "KENGVKB1"
// Version 1: values 4096-aligned, an entry's checksum covers the value only (so an
// index entry whose key was changed still vouched for the value).
// Version 2: the checksum covers the key and the value.
// Version 3: values packed on 512-byte units, index entries with varint fields.
// New buckets are written in kBucketFormatVersion; every version is read.
inline constexpr uint32_t kBucketFormatVersion = 3;
inline constexpr uint32_t kBucketFormatVersionKeyChecksum = 2;
inline constexpr uint32_t kBucketFormatVersionValueChecksum = 1;
inline constexpr uint32_t kOldestBucketFormatVersion = kBucketFormatVersionValueChecksum;
inline constexpr size_t kBucketHeaderSize = 4096;
inline constexpr size_t kBucketFooterSize = 64;
// The header, the values region's end, the index and the file size are multiples of it.
inline constexpr size_t kBucketAlignment = 4096;
// Version 3: every value starts on a multiple of this and is zero-padded to one.
inline constexpr uint64_t kValueUnit = 512;
// Version 3: values of at least this size start 4096-aligned and are padded to 4096
// (their padding costs at most 6%; a direct read lands in an aligned caller buffer
// without a bounce, and a hole over a deleted one frees all its pages).
inline constexpr uint64_t kPageAlignedValueSize = 64 << 10;

struct BucketHeader {
  uint64_t bucket_id = 0;
  uint64_t created_micros = 0;
  uint32_t format_version = kBucketFormatVersion;  // decoded; written as is

  // Writes exactly kBucketHeaderSize bytes to dst.
  void EncodeTo(char* dst) const;
  Status DecodeFrom(std::string_view src);
};

// One value of the bucket, as recorded in its index.
struct BucketEntry {
  std::string key;
  uint64_t offset = 0;  // from the start of the file; see ValueOffsetAlignment
  uint64_t size = 0;    // value bytes (the padding is not counted)
  uint64_t version = 0;
  uint64_t checksum = 0;  // BucketEntryChecksum of key and value
};

// The checksum an index entry stores for (key, value) in a bucket of `format_version`:
// XXH3-64 of the key bytes followed by the value bytes (version 1: of the value bytes).
// The value may lie in several parts; its first `size` bytes count.
uint64_t BucketEntryChecksum(uint32_t format_version, std::string_view key,
                             std::span<const MutableSlice> value, uint64_t size);
inline uint64_t BucketEntryChecksum(uint32_t format_version, std::string_view key,
                                    const char* value, uint64_t size) {
  const MutableSlice part(const_cast<char*>(value), size);
  return BucketEntryChecksum(format_version, key, std::span<const MutableSlice>(&part, 1), size);
}

struct BucketFooter {
  uint64_t index_offset = 0;
  uint64_t index_size = 0;  // including the index checksum
  uint64_t entry_count = 0;
  uint64_t bucket_id = 0;
  uint32_t format_version = kBucketFormatVersion;  // decoded; written as is

  // Writes exactly kBucketFooterSize bytes to dst.
  void EncodeTo(char* dst) const;
  Status DecodeFrom(std::string_view src);
};

// The index block of a bucket of `format_version`: entry count, the entries, then the
// XXH3 of everything before it.
std::string EncodeBucketIndex(uint32_t format_version, const std::vector<BucketEntry>& entries);
// Parses and verifies an index block.  `file_size` bounds the offsets it may name.
Status DecodeBucketIndex(uint32_t format_version, std::string_view block, uint64_t file_size,
                         std::vector<BucketEntry>* entries);

// The unit a value's offset is a multiple of, in a bucket of `format_version`.
inline uint64_t ValueOffsetAlignment(uint32_t format_version) {
  return format_version >= 3 ? kValueUnit : kBucketAlignment;
}
// Version 3: the alignment a value of `size` bytes starts on and is padded to.  A large
// value owns its pages outright, so deleting it frees all of them.
inline uint64_t ValueStartAlignment(uint64_t size) {
  return size >= kPageAlignedValueSize ? kBucketAlignment : kValueUnit;
}
// Where a value of `size` bytes lies in a bucket of `format_version`: the file bytes
// [offset, offset + PaddedValueSize(...)), its own bytes then zeros.
inline uint64_t PaddedValueSize(uint32_t format_version, uint64_t size) {
  const uint64_t unit = format_version >= 3 ? ValueStartAlignment(size) : kBucketAlignment;
  return (size + unit - 1) / unit * unit;
}

// The file name of bucket `id` ("bucket-000042.kvb") and the parse of one.  Only that
// exact spelling parses: another ("bucket-42.kvb") is not a bucket of the DB.
std::string BucketFileName(uint64_t id);
bool ParseBucketFileName(std::string_view name, uint64_t* id);
// Whether `name` is shaped like a bucket file name ("bucket-*.kvb"), canonical or not:
// recovery moves a file so named that does not parse to quarantine/.
bool LooksLikeBucketFileName(std::string_view name);
inline constexpr std::string_view kBucketFilePrefix = "bucket-";
inline constexpr std::string_view kBucketFileSuffix = ".kvb";

}  // namespace kvengine

#endif  // KVENGINE_TABLE_BUCKET_FORMAT_H_
