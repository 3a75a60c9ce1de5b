#include "table/bucket_reader.h"

#include <cstring>

#include "util/buffers.h"
#include "util/hash.h"

namespace kvengine {

namespace {
bool Aligned(const void* p, uint64_t n, uint64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0 && n % alignment == 0;
}
}  // namespace

Status BucketReader::Open(Env* env, const std::string& path, const FileOptions& options,
                          std::unique_ptr<BucketReader>* result, bool read_index) {
  result->reset();
  std::unique_ptr<RandomAccessFile> file;
  Status s = env->NewRandomAccessFile(path, options, &file);
  if (!s.ok()) return s;
  std::unique_ptr<BucketReader> reader(new BucketReader(path, std::move(file)));
  const uint64_t size = reader->file_->Size();
  if (size < kBucketHeaderSize + kBucketFooterSize || size % kBucketAlignment != 0) {
    return Status::Corruption(path, "bucket file size " + std::to_string(size) +
                                        " is not a whole number of blocks (torn write?)");
  }
  // Header and the last block (holding the footer) are read aligned, for O_DIRECT.
  AlignedBuffer block(kBucketHeaderSize);
  size_t n = 0;
  s = reader->file_->Read(0, kBucketHeaderSize, block.data(), &n);
  if (s.ok() && n != kBucketHeaderSize) s = Status::Corruption("short header read");
  if (s.ok()) s = reader->header_.DecodeFrom(std::string_view(block.data(), kBucketHeaderSize));
  if (!s.ok()) return Status::Corruption(path, s.ToString());
  s = reader->file_->Read(size - kBucketAlignment, kBucketAlignment, block.data(), &n);
  if (s.ok() && n != kBucketAlignment) s = Status::Corruption("short footer read");
  if (s.ok()) {
    s = reader->footer_.DecodeFrom(
        std::string_view(block.data() + kBucketAlignment - kBucketFooterSize, kBucketFooterSize));
  }
  if (!s.ok()) return Status::Corruption(path, s.ToString());
  const BucketFooter& f = reader->footer_;
  if (f.bucket_id != reader->header_.bucket_id) {
    return Status::Corruption(path, "footer and header name different buckets");
  }
  if (f.format_version != reader->header_.format_version) {
    return Status::Corruption(path, "footer and header name different format versions");
  }
  if (f.index_offset < kBucketHeaderSize || f.index_offset % kBucketAlignment != 0 ||
      f.index_size > size - kBucketFooterSize ||
      f.index_offset > size - kBucketFooterSize - f.index_size) {
    return Status::Corruption(path, "index block out of range");
  }
  if (read_index) {
    s = ReadIndex(*reader->file_, path, f, &reader->entries_);
    if (!s.ok()) return s;
  }
  *result = std::move(reader);
  return Status::OK();
}

Status BucketReader::ReadIndex(const RandomAccessFile& file, const std::string& path,
                               const BucketFooter& f, std::vector<BucketEntry>* entries) {
  entries->clear();
  const uint64_t size = file.Size();
  const uint64_t span = RoundUpTo(f.index_size, kBucketAlignment);
  AlignedBuffer index(span);
  size_t n = 0;
  Status s =
      file.Read(f.index_offset, std::min<uint64_t>(span, size - f.index_offset), index.data(), &n);
  if (s.ok() && n < f.index_size) s = Status::Corruption("short index read");
  if (s.ok()) {
    s = DecodeBucketIndex(f.format_version, std::string_view(index.data(), f.index_size),
                          f.index_offset, entries);
  }
  if (s.ok() && entries->size() != f.entry_count) {
    s = Status::Corruption("index entry count differs from the footer's");
  }
  if (!s.ok()) return Status::Corruption(path, s.ToString());
  return Status::OK();
}

Status BucketReader::PlanRead(const RandomAccessFile& file, const ValueRead& read,
                              Plan* plan) const {
  plan->requests.clear();
  uint64_t capacity = 0;
  for (const MutableSlice& p : read.dest) capacity += p.size();
  if (capacity < read.size) return Status::BufferTooSmall("destination smaller than the value");
  if (read.offset + read.size > footer_.index_offset) {
    return Status::Corruption(path_, "value location beyond the values region");
  }
  const bool direct = file.IsDirect();
  const uint64_t alignment = direct ? file.DirectIOAlignment() : 1;
  uint64_t value_pos = 0;
  size_t part = 0;
  // Parts read in place: all of them without O_DIRECT; with it, the aligned prefix of a
  // value that starts on the file's alignment (a packed value on a device that needs
  // more than 512 bytes does not).
  for (; part < read.dest.size() && value_pos < read.size; part++) {
    const MutableSlice& p = read.dest[part];
    const uint64_t n = std::min<uint64_t>(p.size(), read.size - value_pos);
    if (n == 0) continue;
    if (direct && (read.offset % alignment != 0 || !Aligned(p.data(), n, alignment))) break;
    ReadRequest r;
    r.file = &file;
    r.offset = read.offset + value_pos;
    r.length = n;
    r.scratch = p.data();
    plan->requests.push_back(r);
    value_pos += n;
  }
  plan->first_bounced_part = part;
  if (value_pos < read.size) {
    // The rest goes through one aligned bounce buffer covering the aligned blocks around
    // it: a packed value shares its first and last blocks with its neighbours.
    const uint64_t from = read.offset + value_pos;
    const uint64_t start = RoundDownTo(from, alignment);
    const uint64_t length = RoundUpTo(read.offset + read.size, alignment) - start;
    if (!plan->bounce.TryAllocate(length)) return Status::NoSpace("cannot allocate a read buffer");
    plan->bounce_value_offset = value_pos;
    plan->bounce_skip = from - start;
    ReadRequest r;
    r.file = &file;
    r.offset = start;
    r.length = length;
    r.scratch = plan->bounce.data();
    plan->requests.push_back(r);
  }
  return Status::OK();
}

Status BucketReader::FinishRead(const ValueRead& read, Plan* plan, bool verify) const {
  for (const ReadRequest& r : plan->requests) {
    if (!r.status.ok()) return r.status;
    const bool bounce = r.scratch == plan->bounce.data() && plan->bounce.data() != nullptr;
    const uint64_t needed =
        bounce ? plan->bounce_skip + read.size - plan->bounce_value_offset : r.length;
    if (r.bytes_read < needed) return Status::Corruption(path_, "value extends past end of file");
  }
  if (plan->bounce.data() != nullptr) {
    ScatterCopy(plan->bounce.data() + plan->bounce_skip, read.size - plan->bounce_value_offset,
                read.dest.subspan(plan->first_bounced_part));
  }
  if (verify && ((BucketEntryChecksum(header_.format_version, read.key, read.dest, read.size) ^
                  read.checksum) &
                 read.checksum_mask) != 0) {
    return Status::Corruption(path_,
                              "value checksum mismatch at offset " + std::to_string(read.offset));
  }
  return Status::OK();
}

void BucketReader::ReadValues(Env* env, const RandomAccessFile& file, std::span<ValueRead> reads,
                              bool verify) const {
  std::vector<Plan> plans(reads.size());
  std::vector<ReadRequest> all;
  for (size_t i = 0; i < reads.size(); i++) {
    reads[i].status = PlanRead(file, reads[i], &plans[i]);
    if (reads[i].status.ok()) {
      all.insert(all.end(), plans[i].requests.begin(), plans[i].requests.end());
    }
  }
  env->MultiRead(all.data(), all.size());
  size_t k = 0;
  for (size_t i = 0; i < reads.size(); i++) {
    if (!reads[i].status.ok()) continue;
    for (ReadRequest& r : plans[i].requests) r = std::move(all[k++]);
    reads[i].status = FinishRead(reads[i], &plans[i], verify);
  }
}

}  // namespace kvengine
