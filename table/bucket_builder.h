// BucketBuilder: assembles one bucket in memory, then writes it as a file.
//
// The image is one aligned buffer of fixed capacity: the header, then the values, each
// placed as the current format version says (bucket_format.h) and zero-padded.  Values are placed
// by Reserve() and copied in by the caller, possibly from several threads at once into distinct
// reserved regions; the image never moves, so readers may read committed values from it while it is
// pending. WriteTo() appends the index block and the footer and writes the whole file; a caller
// that fills the image piece by piece may instead append the pieces itself as they are
// ready and finish with WriteIndex().
//
// Thread-safety: Reserve() and the writes need external synchronization; writing into
// distinct reserved regions and reading committed ones may happen concurrently.
#ifndef KVENGINE_TABLE_BUCKET_BUILDER_H_
#define KVENGINE_TABLE_BUCKET_BUILDER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kvengine/env.h"
#include "table/bucket_format.h"
#include "util/aligned_buffer.h"

namespace kvengine {

class BucketBuilder {
 public:
  // Allocates an image of `capacity` bytes (header included).  NoSpace when the memory
  // cannot be had.
  static Status Create(uint64_t id, uint64_t capacity, uint64_t created_micros,
                       std::unique_ptr<BucketBuilder>* result);
  // As above, in an image the caller already has (recycled from an earlier bucket, so
  // its pages are already faulted in).  REQUIRES: image.capacity() > kBucketHeaderSize.
  static std::unique_ptr<BucketBuilder> CreateIn(uint64_t id, AlignedBuffer image,
                                                 uint64_t created_micros);
  // Gives the image up, for reuse; the builder is empty afterwards.
  AlignedBuffer TakeImage() { return std::move(image_); }

  // Places a value of `size` bytes; stores its file offset in *offset and zeroes its
  // padding.  Returns false when it does not fit in the remaining capacity.
  bool Reserve(uint64_t size, uint64_t* offset);
  // Whether Reserve(size) would succeed now.
  bool Fits(uint64_t size) const;
  // The most image bytes Reserve(size) can take, alignment gap included: a capacity of
  // kBucketHeaderSize + kBucketAlignment + the sum of this over some values holds them.
  static uint64_t MaxSpace(uint64_t size);

  char* MutableData(uint64_t offset) { return image_.data() + offset; }
  const char* Data(uint64_t offset) const { return image_.data() + offset; }
  uint64_t id() const { return id_; }
  // The end of the last value placed.
  uint64_t used() const { return used_; }
  // Where the values region ends in the file: used() rounded up to kBucketAlignment.
  // The image bytes up to there are the file's (zeros past used()).
  uint64_t values_end() const { return RoundUpTo(used_, kBucketAlignment); }
  uint64_t capacity() const { return image_.capacity(); }

  // Writes the image, then an index of `entries` and the footer, through `file`, and
  // syncs it.  Stores the file size in *file_size.
  Status WriteTo(WritableFile* file, const std::vector<BucketEntry>& entries,
                 uint64_t* file_size) const;
  // The second half of WriteTo, for a caller that appended the image's values_end()
  // bytes itself: appends the index of `entries` and the footer, syncs and closes the file.
  Status WriteIndex(WritableFile* file, const std::vector<BucketEntry>& entries,
                    uint64_t* file_size) const;

 private:
  BucketBuilder(uint64_t id, AlignedBuffer image, uint64_t created_micros);

  // Placement of the next value at or after used_, per the current format.
  uint64_t NextOffset(uint64_t size) const;

  const uint64_t id_;
  AlignedBuffer image_;
  uint64_t used_ = kBucketHeaderSize;
  // The image bytes in [used_, zeroed_to_) are zero: the tail of the last value's page,
  // which reaches the disk as the gap before the index.
  uint64_t zeroed_to_ = kBucketHeaderSize;
};

}  // namespace kvengine

#endif  // KVENGINE_TABLE_BUCKET_BUILDER_H_
