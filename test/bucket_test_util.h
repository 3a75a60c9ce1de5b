// Test helpers that edit bucket files in place, as a damaged disk or an older build
// would have left them.  They use the format's own encoders (table/bucket_format.h).
#ifndef KVENGINE_TEST_BUCKET_TEST_UTIL_H_
#define KVENGINE_TEST_BUCKET_TEST_UTIL_H_

#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "table/bucket_format.h"
#include "util/hash.h"

namespace kvengine {
namespace test {

namespace internal {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Appends the index of `entries` in `format_version`, the padding and the footer to
// `file`, which holds the header and the values (a multiple of kBucketAlignment bytes).
inline void AppendIndexAndFooter(std::string* file, uint64_t bucket_id, uint32_t format_version,
                                 const std::vector<BucketEntry>& entries) {
  BucketFooter footer;
  footer.index_offset = file->size();
  const std::string index = EncodeBucketIndex(format_version, entries);
  footer.index_size = index.size();
  footer.entry_count = entries.size();
  footer.bucket_id = bucket_id;
  footer.format_version = format_version;
  *file += index;
  file->resize((file->size() + kBucketFooterSize + kBucketAlignment - 1) / kBucketAlignment *
                   kBucketAlignment -
               kBucketFooterSize);
  std::string block(kBucketFooterSize, '\0');
  footer.EncodeTo(block.data());
  *file += block;
}

// Reads the bucket file at `path` and decodes its header, footer and index.
inline bool DecodeBucketFile(const std::string& path, std::string* file, BucketHeader* header,
                             BucketFooter* footer, std::vector<BucketEntry>* entries) {
  *file = ReadWholeFile(path);
  if (file->size() < kBucketHeaderSize + kBucketFooterSize) return false;
  const std::string_view f(*file);
  return header->DecodeFrom(f.substr(0, kBucketHeaderSize)).ok() &&
         footer->DecodeFrom(f.substr(f.size() - kBucketFooterSize)).ok() &&
         footer->index_offset <= f.size() &&
         DecodeBucketIndex(footer->format_version,
                           f.substr(footer->index_offset, footer->index_size), footer->index_offset,
                           entries)
             .ok();
}

}  // namespace internal

// Decodes the bucket file at `path` and lets `edit` change its index entries (offsets
// and sizes must stay valid), then writes the file again with the new index.  Every
// checksum but the entries' is recomputed, as a careful forger would.  Returns false
// when the file does not decode.
inline bool RewriteBucket(
    const std::string& path,
    const std::function<void(const std::string& file, std::vector<BucketEntry>* entries)>& edit) {
  std::string file;
  BucketHeader header;
  BucketFooter footer;
  std::vector<BucketEntry> entries;
  if (!internal::DecodeBucketFile(path, &file, &header, &footer, &entries)) return false;
  edit(file, &entries);
  file.resize(footer.index_offset);
  internal::AppendIndexAndFooter(&file, header.bucket_id, footer.format_version, entries);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(file.data(), static_cast<std::streamsize>(file.size()));
  return out.good();
}

// Writes the bucket file at `path` again as a build writing `format_version` (1 or 2)
// would have: every value 4096-aligned, fixed-width index fields, and the entry checksums
// that version computes.  Returns false when the file does not decode.
inline bool ConvertBucketToOldVersion(const std::string& path, uint32_t format_version) {
  std::string file;
  BucketHeader header;
  BucketFooter footer;
  std::vector<BucketEntry> entries;
  if (!internal::DecodeBucketFile(path, &file, &header, &footer, &entries)) return false;
  header.format_version = format_version;
  std::string out(kBucketHeaderSize, '\0');
  header.EncodeTo(out.data());
  for (BucketEntry& e : entries) {
    const std::string value = file.substr(e.offset, e.size);
    e.offset = out.size();
    e.checksum = BucketEntryChecksum(format_version, e.key, value.data(), value.size());
    out += value;
    out.resize((out.size() + kBucketAlignment - 1) / kBucketAlignment * kBucketAlignment);
  }
  internal::AppendIndexAndFooter(&out, header.bucket_id, format_version, entries);
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o.write(out.data(), static_cast<std::streamsize>(out.size()));
  return o.good();
}

// Rewrites a bucket file as format version 1 wrote it: entry checksums of the value alone.
inline bool ConvertBucketToVersion1(const std::string& path) {
  return ConvertBucketToOldVersion(path, kBucketFormatVersionValueChecksum);
}

}  // namespace test
}  // namespace kvengine

#endif  // KVENGINE_TEST_BUCKET_TEST_UTIL_H_
