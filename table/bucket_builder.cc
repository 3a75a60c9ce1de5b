#include "table/bucket_builder.h"

#include <algorithm>
#include <cstring>

namespace kvengine {

Status BucketBuilder::Create(uint64_t id, uint64_t capacity, uint64_t created_micros,
                             std::unique_ptr<BucketBuilder>* result) {
  result->reset();
  AlignedBuffer image;
  if (!image.TryAllocate(std::max<uint64_t>(capacity, kBucketHeaderSize + kBucketAlignment))) {
    return Status::NoSpace("cannot allocate a bucket image of " + std::to_string(capacity) +
                           " bytes");
  }
  result->reset(new BucketBuilder(id, std::move(image), created_micros));
  return Status::OK();
}

std::unique_ptr<BucketBuilder> BucketBuilder::CreateIn(uint64_t id, AlignedBuffer image,
                                                       uint64_t created_micros) {
  return std::unique_ptr<BucketBuilder>(new BucketBuilder(id, std::move(image), created_micros));
}

BucketBuilder::BucketBuilder(uint64_t id, AlignedBuffer image, uint64_t created_micros)
    : id_(id), image_(std::move(image)) {
  BucketHeader header;
  header.bucket_id = id;
  header.created_micros = created_micros;
  header.EncodeTo(image_.data());
}

uint64_t BucketBuilder::NextOffset(uint64_t size) const {
  return RoundUpTo(used_, ValueStartAlignment(size));
}

uint64_t BucketBuilder::MaxSpace(uint64_t size) {
  return ValueStartAlignment(size) - kValueUnit + PaddedValueSize(kBucketFormatVersion, size);
}

bool BucketBuilder::Fits(uint64_t size) const {
  const uint64_t start = NextOffset(size);
  const uint64_t padded = PaddedValueSize(kBucketFormatVersion, size);
  // The values region ends on a page, so the page the value ends in must fit whole.
  return start <= image_.capacity() && padded <= image_.capacity() - start &&
         RoundUpTo(start + padded, kBucketAlignment) <= image_.capacity();
}

bool BucketBuilder::Reserve(uint64_t size, uint64_t* offset) {
  if (!Fits(size)) return false;
  const uint64_t start = NextOffset(size);
  const uint64_t end = start + PaddedValueSize(kBucketFormatVersion, size);
  // Everything of the image that reaches the disk and is not the value must be zeros,
  // not stale heap bytes: the gap before an aligned value, the padding after it, and the
  // rest of its page (the gap before the index if it is the last).  Each page's tail is
  // zeroed once, not once per small value placed in it.
  char* image = image_.data();
  if (start > zeroed_to_) std::memset(image + zeroed_to_, 0, start - zeroed_to_);
  const uint64_t pad_from = std::max(start + size, zeroed_to_);
  if (end > pad_from) std::memset(image + pad_from, 0, end - pad_from);
  const uint64_t page_end = RoundUpTo(end, kBucketAlignment);
  const uint64_t tail_from = std::max(end, zeroed_to_);
  if (page_end > tail_from) std::memset(image + tail_from, 0, page_end - tail_from);
  zeroed_to_ = std::max(zeroed_to_, page_end);
  *offset = start;
  used_ = end;
  return true;
}

Status BucketBuilder::WriteTo(WritableFile* file, const std::vector<BucketEntry>& entries,
                              uint64_t* file_size) const {
  Status s = file->Append(Slice(image_.data(), values_end()));
  if (!s.ok()) return s;
  return WriteIndex(file, entries, file_size);
}

Status BucketBuilder::WriteIndex(WritableFile* file, const std::vector<BucketEntry>& entries,
                                 uint64_t* file_size) const {
  const std::string index = EncodeBucketIndex(kBucketFormatVersion, entries);
  const uint64_t tail_size = RoundUpTo(index.size() + kBucketFooterSize, kBucketAlignment);
  AlignedBuffer tail;
  if (!tail.TryAllocate(tail_size)) return Status::NoSpace("cannot allocate a bucket index");
  std::memset(tail.data(), 0, tail_size);
  std::memcpy(tail.data(), index.data(), index.size());
  BucketFooter footer;
  footer.index_offset = values_end();
  footer.index_size = index.size();
  footer.entry_count = entries.size();
  footer.bucket_id = id_;
  footer.EncodeTo(tail.data() + tail_size - kBucketFooterSize);

  Status s = file->Append(Slice(tail.data(), tail_size));
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  *file_size = values_end() + tail_size;
  return s;
}

}  // namespace kvengine
