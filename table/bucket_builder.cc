#include "table/bucket_builder.h"

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

bool BucketBuilder::Reserve(uint64_t size, uint64_t* offset) {
  const uint64_t padded = PaddedValueSize(size);
  if (padded > image_.capacity() - used_) return false;
  *offset = used_;
  // Zero the padding now: it reaches the disk, and must not carry stale heap bytes.
  std::memset(image_.data() + used_ + size, 0, padded - size);
  used_ += padded;
  return true;
}

Status BucketBuilder::WriteTo(WritableFile* file, const std::vector<BucketEntry>& entries,
                              uint64_t* file_size) const {
  Status s = file->Append(Slice(image_.data(), used_));
  if (!s.ok()) return s;
  return WriteIndex(file, entries, file_size);
}

Status BucketBuilder::WriteIndex(WritableFile* file, const std::vector<BucketEntry>& entries,
                                 uint64_t* file_size) const {
  const std::string index = EncodeBucketIndex(entries);
  const uint64_t tail_size = RoundUpTo(index.size() + kBucketFooterSize, kBucketAlignment);
  AlignedBuffer tail;
  if (!tail.TryAllocate(tail_size)) return Status::NoSpace("cannot allocate a bucket index");
  std::memset(tail.data(), 0, tail_size);
  std::memcpy(tail.data(), index.data(), index.size());
  BucketFooter footer;
  footer.index_offset = used_;
  footer.index_size = index.size();
  footer.entry_count = entries.size();
  footer.bucket_id = id_;
  footer.EncodeTo(tail.data() + tail_size - kBucketFooterSize);

  Status s = file->Append(Slice(tail.data(), tail_size));
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  *file_size = used_ + tail_size;
  return s;
}

}  // namespace kvengine
