// Fuzz target: BucketReader::Open and ReadValues over an arbitrary bucket file.
//
// The first input byte says how the file is made from the rest of the input:
//   bit 0 clear: the rest is the file, byte for byte (the seeds are real buckets);
//   bit 0 set:   the rest drives a writer that uses the format's own encoders, so the
//                header, index and footer carry valid checksums while their fields
//                (offsets, sizes, counts, ids) are the fuzzer's: the checks that stand
//                behind the checksums are reached too.
//   bit 1:       the file is direct; every read must then respect O_DIRECT alignment.
//   bit 2:       (raw files) the file is the input's whole blocks; the bytes past them
//                are left to choose how the values are read.
// Whenever Open accepts the file, every entry is read in one ReadValues batch into
// destinations split in fuzzer-chosen parts; a read that succeeds must have delivered
// exactly the file's bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <string>
#include <vector>

#include "table/bucket_format.h"
#include "table/bucket_reader.h"
#include "test/fuzz/fuzz_check.h"
#include "test/fuzz/memory_env.h"
#include "util/aligned_buffer.h"
#include "util/hash.h"

namespace kvengine {
namespace {

constexpr const char* kPath = "/fuzz/bucket-000001.kvb";

// A value's offset: usually one of the file's value units, sometimes anything.
uint64_t PickOffset(FuzzedDataProvider& in, size_t blocks) {
  if (in.ConsumeBool()) return in.ConsumeIntegral<uint64_t>();
  const uint64_t units_per_block = kBucketAlignment / kValueUnit;
  return kBucketHeaderSize +
         in.ConsumeIntegralInRange<uint64_t>(0, blocks * units_per_block) * kValueUnit;
}

std::string MakeStructuredBucket(FuzzedDataProvider& in) {
  BucketHeader header;
  header.bucket_id = in.ConsumeIntegralInRange<uint64_t>(0, 2);
  header.created_micros = in.ConsumeIntegral<uint64_t>();
  header.format_version =
      in.ConsumeIntegralInRange<uint32_t>(kOldestBucketFormatVersion, kBucketFormatVersion);
  const size_t blocks = in.ConsumeIntegralInRange<size_t>(0, 4);
  std::string file(kBucketHeaderSize + blocks * kBucketAlignment, '\0');
  header.EncodeTo(file.data());
  const std::string values = in.ConsumeBytesAsString(blocks * kBucketAlignment);
  std::memcpy(file.data() + kBucketHeaderSize, values.data(), values.size());

  std::vector<BucketEntry> entries(in.ConsumeIntegralInRange<size_t>(0, 6));
  for (BucketEntry& e : entries) {
    e.key = in.ConsumeRandomLengthString(24);
    e.offset = PickOffset(in, blocks);
    e.size = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                              : in.ConsumeIntegralInRange<uint64_t>(0, 2 * kBucketAlignment + 1);
    e.version = in.ConsumeIntegral<uint64_t>();
    const bool inside = e.offset <= file.size() && e.size <= file.size() - e.offset;
    e.checksum = inside && in.ConsumeBool() ? Hash64(file.data() + e.offset, e.size)
                                            : in.ConsumeIntegral<uint64_t>();
  }
  const std::string index = EncodeBucketIndex(header.format_version, entries);

  BucketFooter footer;
  footer.index_offset = in.ConsumeBool() ? file.size() : PickOffset(in, blocks + 1);
  footer.index_size = in.ConsumeBool() ? index.size() : in.ConsumeIntegral<uint64_t>();
  footer.entry_count =
      in.ConsumeBool() ? entries.size() : in.ConsumeIntegralInRange<uint64_t>(0, 8);
  footer.bucket_id = in.ConsumeBool() ? header.bucket_id : in.ConsumeIntegral<uint64_t>();
  footer.format_version = header.format_version;
  file += index;
  file.resize(RoundUpTo(file.size() + kBucketFooterSize, kBucketAlignment) - kBucketFooterSize);
  std::string block(kBucketFooterSize, '\0');
  footer.EncodeTo(block.data());
  file += block;
  if (in.ConsumeBool()) file.resize(in.ConsumeIntegralInRange<size_t>(0, file.size() * 2));
  return file;
}

// One value's destination: parts cut one after another out of an aligned buffer, from a
// fuzzer-chosen start, of fuzzer-chosen sizes (their total may fall short of the value).
struct Destination {
  AlignedBuffer buffer;
  std::vector<MutableSlice> parts;
};

void CutDestination(FuzzedDataProvider& in, uint64_t value_size, Destination* d) {
  const size_t skew = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<size_t>(0, 64);
  const size_t slack = in.ConsumeIntegralInRange<size_t>(0, 2 * kBucketAlignment);
  d->buffer.TryAllocate(skew + value_size + slack);
  FUZZ_CHECK(d->buffer.data() != nullptr, "no memory for a destination");
  char* p = d->buffer.data() + skew;
  size_t left = value_size + slack;
  const int parts = in.ConsumeIntegralInRange(1, 3);
  for (int i = 0; i < parts; i++) {
    const size_t n = i + 1 == parts ? left : in.ConsumeIntegralInRange<size_t>(0, left);
    d->parts.emplace_back(p, i + 1 == parts && in.ConsumeBool() && n > 0 ? n - 1 : n);
    p += n;
    left -= n;
  }
}

std::string Gather(const std::vector<MutableSlice>& parts, uint64_t size) {
  std::string out;
  for (const MutableSlice& p : parts) {
    const uint64_t n = std::min<uint64_t>(size - out.size(), p.size());
    out.append(p.data(), n);
  }
  return out;
}

void ReadEveryValue(FuzzedDataProvider& in, Env* env, const BucketReader& reader,
                    const std::string& file) {
  const std::vector<BucketEntry>& entries = reader.entries();
  std::vector<Destination> dests(entries.size());
  std::vector<ValueRead> reads(entries.size());
  for (size_t i = 0; i < entries.size(); i++) {
    CutDestination(in, entries[i].size, &dests[i]);
    reads[i].offset = entries[i].offset;
    reads[i].size = entries[i].size;
    reads[i].checksum = entries[i].checksum;
    reads[i].dest = dests[i].parts;
  }
  const bool verify = in.ConsumeBool();
  reader.ReadValues(env, reads, verify);
  for (const ValueRead& r : reads) {
    if (!r.status.ok()) continue;
    FUZZ_CHECK(r.offset <= file.size() && r.size <= file.size() - r.offset,
               "a read past the end of the file succeeded");
    FUZZ_CHECK(Gather({r.dest.begin(), r.dest.end()}, r.size) == file.substr(r.offset, r.size),
               "a successful read delivered other bytes than the file's");
    if (verify) FUZZ_CHECK(Hash64(file.data() + r.offset, r.size) == r.checksum, "checksum");
  }
}

}  // namespace
}  // namespace kvengine

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvengine;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  FuzzedDataProvider in(data + 1, size - 1);
  std::string file;
  if ((mode & 1) != 0) {
    file = MakeStructuredBucket(in);
  } else if ((mode & 4) != 0) {
    file = in.ConsumeBytesAsString(in.remaining_bytes() / kBucketAlignment * kBucketAlignment);
  } else {
    file = in.ConsumeBytesAsString(in.remaining_bytes());
  }
  fuzz::MemoryEnv env;
  env.SetFile(kPath, file, /*direct=*/(mode & 2) != 0);
  std::unique_ptr<BucketReader> reader;
  FileOptions options;
  options.use_direct_io = (mode & 2) != 0;
  Status s = BucketReader::Open(&env, kPath, options, &reader);
  FUZZ_CHECK(s.ok() == (reader != nullptr), "Open's status and result disagree");
  if (!s.ok()) return 0;
  FUZZ_CHECK(reader->entries().size() == reader->footer().entry_count, "entry count");
  for (const BucketEntry& e : reader->entries()) {
    FUZZ_CHECK(!e.key.empty(), "an entry with an empty key");
    FUZZ_CHECK(e.offset % ValueOffsetAlignment(reader->header().format_version) == 0 &&
                   e.offset >= kBucketHeaderSize,
               "an entry's offset is not a value unit");
  }
  ReadEveryValue(in, &env, *reader, file);
  return 0;
}
