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

// Decodes the bucket file at `path`, lets `edit` change its index entries (keys of the
// same length only: the index must keep its size) and, when `format_version` is not 0,
// rewrites header and footer in that format version.  Every checksum but the entries'
// is recomputed, as a careful forger would.  Returns false when the file does not decode.
inline bool RewriteBucket(
    const std::string& path,
    const std::function<void(const std::string& file, std::vector<BucketEntry>* entries)>& edit,
    uint32_t format_version = 0) {
  std::string file;
  {
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  if (file.size() < kBucketHeaderSize + kBucketFooterSize) return false;
  BucketHeader header;
  BucketFooter footer;
  char* footer_at = file.data() + file.size() - kBucketFooterSize;
  if (!header.DecodeFrom(std::string_view(file.data(), kBucketHeaderSize)).ok() ||
      !footer.DecodeFrom(std::string_view(footer_at, kBucketFooterSize)).ok()) {
    return false;
  }
  std::vector<BucketEntry> entries;
  if (!DecodeBucketIndex(std::string_view(file.data() + footer.index_offset, footer.index_size),
                         footer.index_offset, &entries)
           .ok()) {
    return false;
  }
  edit(file, &entries);
  const std::string index = EncodeBucketIndex(entries);
  if (index.size() != footer.index_size) return false;
  file.replace(footer.index_offset, index.size(), index);
  if (format_version != 0) {
    header.format_version = footer.format_version = format_version;
    header.EncodeTo(file.data());
    footer.EncodeTo(footer_at);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(file.data(), static_cast<std::streamsize>(file.size()));
  return out.good();
}

// Rewrites a bucket file as format version 1 wrote it: entry checksums of the value alone.
inline bool ConvertBucketToVersion1(const std::string& path) {
  return RewriteBucket(
      path,
      [](const std::string& file, std::vector<BucketEntry>* entries) {
        for (BucketEntry& e : *entries) e.checksum = Hash64(file.data() + e.offset, e.size);
      },
      kBucketFormatVersionValueChecksum);
}

}  // namespace test
}  // namespace kvengine

#endif  // KVENGINE_TEST_BUCKET_TEST_UTIL_H_
