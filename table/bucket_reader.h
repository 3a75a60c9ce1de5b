// BucketReader: opens a sealed bucket file, verifies it, and reads values out of it.
//
// Open() checks the header, the footer and the index checksums, so a torn or corrupt
// file is refused as a whole (Corruption) and never half-used.  Reads verify each
// value's own checksum, so a corrupt value fails that key only.
//
// Reads go straight into the caller's buffers.  With O_DIRECT a buffer part that is
// aligned (address and length, to the file's DirectIOAlignment) of a value that starts
// aligned is read into directly; the rest of the value goes through an aligned bounce
// buffer that covers the blocks around it.
//
// Thread-safety: all methods are thread-safe after Open.
#ifndef KVENGINE_TABLE_BUCKET_READER_H_
#define KVENGINE_TABLE_BUCKET_READER_H_

#include <memory>
#include <span>
#include <vector>

#include "kvengine/env.h"
#include "table/bucket_format.h"
#include "util/aligned_buffer.h"

namespace kvengine {

// One value to read: where it is and where it goes.
struct ValueRead {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::span<const MutableSlice> dest;  // total capacity >= size
  Status status;                       // out
  std::string_view key;                // the entry's key: the checksum covers it too
  // The bits of `checksum` that are known (a caller that keeps part of it, the SSD
  // tier's map, compares those only).
  uint64_t checksum_mask = ~uint64_t{0};
};

class BucketReader {
 public:
  // With read_index false, the index is neither read nor verified (entries() stays
  // empty): for a bucket the caller verified before (the SSD tier's map checkpoint).
  static Status Open(Env* env, const std::string& path, const FileOptions& options,
                     std::unique_ptr<BucketReader>* result, bool read_index = true);

  const BucketHeader& header() const { return header_; }
  const BucketFooter& footer() const { return footer_; }
  // The index as Open read it; empty after DropEntries().
  const std::vector<BucketEntry>& entries() const { return entries_; }
  // Frees the index held since Open: a long-lived owner (the SSD tier, for every bucket
  // for its life) reads it again when it needs it (ReadEntries), rather than keep a copy
  // of every key in RAM.
  void DropEntries() { std::vector<BucketEntry>().swap(entries_); }
  // Reads and verifies the index again from `file` (this bucket's file) into *entries.
  Status ReadEntries(const RandomAccessFile& file, std::vector<BucketEntry>* entries) const {
    return ReadIndex(file, path_, footer_, entries);
  }
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

  // Hands the open file over (to a cache of open files); the reader keeps what it
  // verified, and reads then name their file (the overloads taking one).  REQUIRES: the
  // file was not taken already.
  std::unique_ptr<RandomAccessFile> TakeFile() { return std::move(file_); }

  // Reads the values of `reads`, each into its destination, as one batch through
  // env->MultiRead, and sets each read's status (Corruption on a checksum mismatch when
  // verify is true: the checksum of the read's key and value, as this bucket's format
  // version computes it, must equal read.checksum).
  void ReadValues(Env* env, std::span<ValueRead> reads, bool verify) const {
    ReadValues(env, *file_, reads, verify);
  }
  // The same, from `file`: this bucket's file, opened again (see TakeFile).
  void ReadValues(Env* env, const RandomAccessFile& file, std::span<ValueRead> reads,
                  bool verify) const;

  // A plan for reading one value into its destination: the file reads to issue and
  // the copies from bounce buffers after them.  Exposed so that a caller can batch the
  // reads of many buckets into one submission.
  struct Plan {
    std::vector<ReadRequest> requests;
    AlignedBuffer bounce;
    uint64_t bounce_value_offset = 0;  // value byte at bounce.data()[bounce_skip]
    uint64_t bounce_skip = 0;          // bytes of the neighbours read before it
    size_t first_bounced_part = 0;     // dest parts from here on are filled from bounce
  };
  Status PlanRead(const ValueRead& read, Plan* plan) const { return PlanRead(*file_, read, plan); }
  Status PlanRead(const RandomAccessFile& file, const ValueRead& read, Plan* plan) const;
  // After the plan's requests completed: copies out of the bounce buffer, checks sizes
  // and (with verify) the checksum.
  Status FinishRead(const ValueRead& read, Plan* plan, bool verify) const;

 private:
  // Reads the index block that `footer` locates, checks it and its entry count.
  static Status ReadIndex(const RandomAccessFile& file, const std::string& path,
                          const BucketFooter& footer, std::vector<BucketEntry>* entries);

  BucketReader(std::string path, std::unique_ptr<RandomAccessFile> file)
      : path_(std::move(path)), file_(std::move(file)), file_size_(file_->Size()) {}

  const std::string path_;
  std::unique_ptr<RandomAccessFile> file_;  // null once taken
  const uint64_t file_size_;
  BucketHeader header_;
  BucketFooter footer_;
  std::vector<BucketEntry> entries_;
};

}  // namespace kvengine

#endif  // KVENGINE_TABLE_BUCKET_READER_H_
