// The bucket file format and the tombstone log: round trips, and corruption of every
// region detected as Corruption (never a crash, never wrong bytes).
#include <filesystem>
#include <fstream>
#include <random>

#include "db/tombstone_log.h"
#include "gtest/gtest.h"
#include "kvengine/env.h"
#include "table/bucket_builder.h"
#include "table/bucket_reader.h"
#include "test/bucket_test_util.h"
#include "test/fuzz/memory_env.h"
#include "test/test_util.h"
#include "util/hash.h"

namespace kvengine {
namespace {

class BucketTest : public ::testing::TestWithParam<bool> {  // param: O_DIRECT
 protected:
  void SetUp() override {
    env_ = Env::Default();
    ASSERT_TRUE(env_->CreateDirIfMissing(dir_.path()).ok());
    path_ = dir_.Sub("bucket-000007.kvb");
    options_.use_direct_io = GetParam();
  }

  // Writes a bucket of `sizes.size()` values; returns their entries.
  std::vector<BucketEntry> WriteBucket(const std::vector<size_t>& sizes) {
    std::unique_ptr<BucketBuilder> b;
    EXPECT_TRUE(BucketBuilder::Create(7, 1 << 20, 42, &b).ok());
    std::vector<BucketEntry> entries;
    for (size_t i = 0; i < sizes.size(); i++) {
      std::string v = test::MakeValue(i, sizes[i]);
      BucketEntry e;
      e.key = "key." + std::to_string(i);
      EXPECT_TRUE(b->Reserve(v.size(), &e.offset));
      std::memcpy(b->MutableData(e.offset), v.data(), v.size());
      e.size = v.size();
      e.version = 100 + i;
      e.checksum = BucketEntryChecksum(kBucketFormatVersion, e.key, v.data(), v.size());
      entries.push_back(e);
      values_.push_back(v);
    }
    std::unique_ptr<WritableFile> f;
    EXPECT_TRUE(env_->NewWritableFile(path_, options_, &f).ok());
    uint64_t size = 0;
    Status s = b->WriteTo(f.get(), entries, &size);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(size % kBucketAlignment, 0u);
    return entries;
  }

  void Corrupt(uint64_t offset) {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }

  test::TempDir dir_;
  Env* env_;
  std::string path_;
  FileOptions options_;
  std::vector<std::string> values_;
};

TEST_P(BucketTest, RoundTripIntoAlignedUnalignedAndSplitBuffers) {
  auto written = WriteBucket({1, 4096, 5000, 65536, 0, 100000});
  std::unique_ptr<BucketReader> r;
  ASSERT_TRUE(BucketReader::Open(env_, path_, options_, &r).ok());
  EXPECT_EQ(r->header().bucket_id, 7u);
  ASSERT_EQ(r->entries().size(), written.size());
  for (size_t i = 0; i < written.size(); i++) {
    const BucketEntry& e = r->entries()[i];
    EXPECT_EQ(e.key, written[i].key);
    EXPECT_EQ(e.version, written[i].version);
    // 1) one aligned buffer  2) one unaligned buffer  3) an aligned part + an odd part
    AlignedBuffer aligned(e.size + 8192);
    std::string unaligned(e.size + 1, '\0');
    AlignedBuffer part1(8192);
    std::string part2(e.size + 1, '\0');
    std::vector<std::vector<MutableSlice>> dests = {
        {MutableSlice(aligned.data(), aligned.capacity())},
        {MutableSlice(unaligned.data() + 1, e.size)},
        {MutableSlice(part1.data(), std::min<size_t>(4096, e.size)),
         MutableSlice(part2.data(), e.size)}};
    for (auto& d : dests) {
      ValueRead read{e.offset, e.size, e.checksum, d, Status(), e.key};
      r->ReadValues(env_, std::span<ValueRead>(&read, 1), true);
      ASSERT_TRUE(read.status.ok()) << read.status.ToString();
      std::string got;
      uint64_t left = e.size;
      for (auto& p : d) {
        uint64_t n = std::min<uint64_t>(left, p.size());
        got.append(p.data(), n);
        left -= n;
      }
      EXPECT_TRUE(got == values_[i]) << "value " << i;
    }
  }
}

TEST_P(BucketTest, CorruptionAnywhereInMetadataFailsOpen) {
  WriteBucket({3000, 9000});
  uint64_t size = 0;
  ASSERT_TRUE(env_->GetFileSize(path_, &size).ok());
  std::unique_ptr<BucketReader> r;
  ASSERT_TRUE(BucketReader::Open(env_, path_, options_, &r).ok());
  const uint64_t index_offset = r->footer().index_offset;
  const uint64_t index_size = r->footer().index_size;
  r.reset();
  // Header bytes, index bytes, footer bytes: each flip must be caught.
  std::vector<uint64_t> spots = {0,
                                 9,
                                 17,
                                 33,
                                 index_offset,
                                 index_offset + index_size / 2,
                                 index_offset + index_size - 1,
                                 size - 64,
                                 size - 40,
                                 size - 1};
  for (uint64_t spot : spots) {
    Corrupt(spot);
    Status s = BucketReader::Open(env_, path_, options_, &r);
    EXPECT_TRUE(s.IsCorruption()) << "offset " << spot << ": " << s.ToString();
    Corrupt(spot);  // restore
  }
  ASSERT_TRUE(BucketReader::Open(env_, path_, options_, &r).ok());
  // A truncated (torn) file is refused too.
  std::filesystem::resize_file(path_, size - 4096);
  EXPECT_TRUE(BucketReader::Open(env_, path_, options_, &r).IsCorruption());
  std::filesystem::resize_file(path_, size - 100);
  EXPECT_TRUE(BucketReader::Open(env_, path_, options_, &r).IsCorruption());
}

TEST_P(BucketTest, CorruptValueFailsThatKeyOnly) {
  auto written = WriteBucket({3000, 9000, 4096});
  Corrupt(written[1].offset + 77);
  std::unique_ptr<BucketReader> r;
  ASSERT_TRUE(BucketReader::Open(env_, path_, options_, &r).ok());
  std::vector<AlignedBuffer> bufs;
  std::vector<std::vector<MutableSlice>> dests(3);
  std::vector<ValueRead> reads;
  for (size_t i = 0; i < 3; i++) {
    bufs.emplace_back(16384);
    dests[i] = {MutableSlice(bufs[i].data(), 16384)};
  }
  for (size_t i = 0; i < 3; i++) {
    reads.push_back(ValueRead{written[i].offset, written[i].size, written[i].checksum, dests[i],
                              Status(), written[i].key});
  }
  r->ReadValues(env_, reads, true);
  EXPECT_TRUE(reads[0].status.ok());
  EXPECT_TRUE(reads[1].status.IsCorruption()) << reads[1].status.ToString();
  EXPECT_TRUE(reads[2].status.ok());
  EXPECT_EQ(std::string(bufs[2].data(), 4096), values_[2]);
}

// Reads entry `e` of the bucket at path_ whole, verified.
Status ReadEntry(Env* env, const BucketReader& r, const BucketEntry& e, std::string* value) {
  value->assign(e.size, '\0');
  MutableSlice d(value->data(), value->size());
  ValueRead read{e.offset, e.size, e.checksum, std::span<const MutableSlice>(&d, 1),
                 Status(), e.key};
  r.ReadValues(env, std::span<ValueRead>(&read, 1), /*verify=*/true);
  return read.status;
}

// An index rewritten with one key byte changed (index checksum recomputed) made one key
// return another's bytes: the entry checksum now covers the key.
TEST_P(BucketTest, EntryChecksumBindsTheKeyToItsValue) {
  WriteBucket({5000, 5000, 5000, 5000});
  ASSERT_TRUE(test::RewriteBucket(path_, [](const std::string&, std::vector<BucketEntry>* e) {
    std::swap((*e)[2].key, (*e)[3].key);  // "key.2" <-> "key.3": one byte each
  }));
  std::unique_ptr<BucketReader> r;
  Status s = BucketReader::Open(env_, path_, options_, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();  // the index itself is consistent
  EXPECT_EQ(r->header().format_version, kBucketFormatVersion);
  std::string value;
  for (size_t i = 0; i < 4; i++) {
    const BucketEntry& e = r->entries()[i];
    s = ReadEntry(env_, *r, e, &value);
    if (i < 2) {
      EXPECT_TRUE(s.ok() && value == values_[i]) << i << ": " << s.ToString();
    } else {
      EXPECT_TRUE(s.IsCorruption()) << e.key << " read as another key's value: " << s.ToString();
    }
  }
}

// The SSD tier's map keeps a key's fingerprint and the low 32 bits of its entry checksum:
// a read that reaches another key's value (two keys with one fingerprint) is refused on
// those bits, since the checksum covers the key asked for.
TEST_P(BucketTest, ReadWithAnotherKeyFailsOnTheLow32ChecksumBits) {
  WriteBucket({5000, 5000});
  std::unique_ptr<BucketReader> r;
  ASSERT_TRUE(BucketReader::Open(env_, path_, options_, &r).ok());
  const BucketEntry& e = r->entries()[0];
  for (const std::string& key : {e.key, r->entries()[1].key}) {
    std::string value(e.size, '\0');
    MutableSlice d(value.data(), value.size());
    ValueRead read{e.offset,
                   e.size,
                   e.checksum & 0xffffffffull,
                   std::span<const MutableSlice>(&d, 1),
                   Status(),
                   key,
                   0xffffffffull};
    r->ReadValues(env_, std::span<ValueRead>(&read, 1), /*verify=*/true);
    EXPECT_EQ(read.status.ok(), key == e.key) << key << ": " << read.status.ToString();
  }
}

// Buckets written before the key was checksummed (format version 1) stay readable, and
// their values are still verified.
TEST_P(BucketTest, Version1BucketsStayReadable) {
  auto written = WriteBucket({1, 4096, 70000});
  ASSERT_TRUE(test::ConvertBucketToVersion1(path_));
  std::unique_ptr<BucketReader> r;
  Status s = BucketReader::Open(env_, path_, options_, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r->header().format_version, 1u);
  EXPECT_EQ(r->footer().format_version, 1u);
  std::string value;
  for (size_t i = 0; i < written.size(); i++) {
    const BucketEntry& e = r->entries()[i];
    EXPECT_EQ(e.checksum, Hash64(values_[i]));
    s = ReadEntry(env_, *r, e, &value);
    EXPECT_TRUE(s.ok() && value == values_[i]) << i << ": " << s.ToString();
  }
  r.reset();
  Corrupt(written[2].offset + 7);
  ASSERT_TRUE(BucketReader::Open(env_, path_, options_, &r).ok());
  EXPECT_TRUE(ReadEntry(env_, *r, r->entries()[2], &value).IsCorruption());
  EXPECT_TRUE(ReadEntry(env_, *r, r->entries()[1], &value).ok());
}

// Buckets of format version 2 (values 4096-aligned, fixed-width index fields) stay
// readable after the upgrade to packed values.
TEST_P(BucketTest, Version2BucketsStayReadable) {
  WriteBucket({1, 512, 4097, 70000});
  ASSERT_TRUE(test::ConvertBucketToOldVersion(path_, kBucketFormatVersionKeyChecksum));
  std::unique_ptr<BucketReader> r;
  Status s = BucketReader::Open(env_, path_, options_, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r->header().format_version, 2u);
  std::string value;
  for (size_t i = 0; i < values_.size(); i++) {
    const BucketEntry& e = r->entries()[i];
    EXPECT_EQ(e.offset % kBucketAlignment, 0u);
    s = ReadEntry(env_, *r, e, &value);
    EXPECT_TRUE(s.ok() && value == values_[i]) << i << ": " << s.ToString();
  }
}

// Values under 64 KiB are packed on 512-byte units, so a 512-byte value costs 512 bytes
// of file (it cost 4096 when every value was page-aligned) and a 4097-byte one 4608;
// larger values start and end on a page.  All of them read back bit-exact.
TEST_P(BucketTest, SmallValuesArePackedOn512ByteUnits) {
  std::vector<size_t> sizes(64, 512);
  sizes.insert(sizes.end(), 16, 4097);
  sizes.push_back(1);
  sizes.push_back(65536 + 1);  // page-aligned, padded to a page
  sizes.push_back(700);
  auto written = WriteBucket(sizes);
  for (size_t i = 1; i < 64; i++) EXPECT_EQ(written[i].offset, written[i - 1].offset + 512);
  for (size_t i = 65; i < 80; i++) EXPECT_EQ(written[i].offset, written[i - 1].offset + 4608);
  EXPECT_EQ(written[81].offset % kBucketAlignment, 0u);
  EXPECT_EQ(written[82].offset, written[81].offset + 69632);
  uint64_t value_bytes = 0;
  for (size_t n : sizes) value_bytes += n;
  const uint64_t file_size = std::filesystem::file_size(path_);
  // Header, index (about 40 bytes an entry) and footer pages aside, the values take what
  // their units do.
  EXPECT_LE(file_size, value_bytes * 115 / 100 + 3 * kBucketAlignment) << file_size;
  std::unique_ptr<BucketReader> r;
  ASSERT_TRUE(BucketReader::Open(env_, path_, options_, &r).ok());
  std::string value;
  for (size_t i = 0; i < sizes.size(); i++) {
    Status s = ReadEntry(env_, *r, r->entries()[i], &value);
    EXPECT_TRUE(s.ok() && value == values_[i]) << i << ": " << s.ToString();
  }
}

// MaxSpace bounds what Reserve takes: an image of the header, a page and the values'
// MaxSpace holds them all, whatever their order (the GC sizes its images so), and Fits
// says exactly whether the next one fits.
TEST(BucketPackingTest, ImagesSizedByMaxSpaceHoldTheirValues) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 200; round++) {
    std::vector<uint64_t> sizes(1 + rng() % 40);
    uint64_t capacity = kBucketHeaderSize + kBucketAlignment;
    for (uint64_t& n : sizes) {
      n = rng() % 3 == 0 ? 1 + rng() % 200000 : 1 + rng() % 5000;
      capacity += BucketBuilder::MaxSpace(n);
    }
    std::unique_ptr<BucketBuilder> b;
    ASSERT_TRUE(BucketBuilder::Create(1, capacity, 1, &b).ok());
    for (uint64_t n : sizes) {
      uint64_t offset = 0;
      ASSERT_TRUE(b->Fits(n));
      ASSERT_TRUE(b->Reserve(n, &offset)) << round;
      EXPECT_EQ(offset % kValueUnit, 0u);
      if (n >= kPageAlignedValueSize) {
        EXPECT_EQ(offset % kBucketAlignment, 0u);
      }
    }
    EXPECT_LE(b->values_end(), b->capacity());
    // Fill to the brim: Fits agrees with Reserve to the last value.
    while (b->Fits(700)) {
      uint64_t offset = 0;
      ASSERT_TRUE(b->Reserve(700, &offset));
    }
    uint64_t offset = 0;
    EXPECT_FALSE(b->Reserve(700, &offset));
    EXPECT_LE(b->values_end(), b->capacity());
  }
}

// A device whose O_DIRECT reads need 4096-byte alignment (4Kn drives) still reads packed
// values: the reader reads the pages around them.  MemoryEnv aborts on any misaligned
// direct read.
TEST(BucketPackingTest, PackedValuesReadOnADeviceThatNeedsPageAlignedReads) {
  std::unique_ptr<BucketBuilder> b;
  ASSERT_TRUE(BucketBuilder::Create(3, 1 << 20, 1, &b).ok());
  std::vector<BucketEntry> entries;
  std::vector<std::string> values;
  for (size_t i = 0; i < 40; i++) {
    const std::string v = test::MakeValue(i, i % 3 == 0 ? 4097 : 100 + 300 * i);
    BucketEntry e;
    e.key = "k" + std::to_string(i);
    ASSERT_TRUE(b->Reserve(v.size(), &e.offset));
    std::memcpy(b->MutableData(e.offset), v.data(), v.size());
    e.size = v.size();
    e.checksum = BucketEntryChecksum(kBucketFormatVersion, e.key, v.data(), v.size());
    entries.push_back(e);
    values.push_back(v);
  }
  fuzz::MemoryEnv env;
  std::unique_ptr<WritableFile> f;
  ASSERT_TRUE(env.NewWritableFile("/b/bucket-000003.kvb", FileOptions(), &f).ok());
  uint64_t size = 0;
  ASSERT_TRUE(b->WriteTo(f.get(), entries, &size).ok());
  env.SetFile("/b/bucket-000003.kvb", *env.GetFile("/b/bucket-000003.kvb"), /*direct=*/true);
  FileOptions direct;
  direct.use_direct_io = true;
  std::unique_ptr<BucketReader> r;
  ASSERT_TRUE(BucketReader::Open(&env, "/b/bucket-000003.kvb", direct, &r).ok());
  std::vector<AlignedBuffer> bufs(values.size());
  std::vector<MutableSlice> dests(values.size());
  std::vector<ValueRead> reads;
  for (size_t i = 0; i < values.size(); i++) {
    bufs[i].TryAllocate(RoundUpTo(values[i].size(), kBucketAlignment));
    dests[i] = MutableSlice(bufs[i].data(), bufs[i].capacity());
    reads.push_back(ValueRead{entries[i].offset, entries[i].size, entries[i].checksum,
                              std::span<const MutableSlice>(&dests[i], 1), Status(),
                              entries[i].key});
  }
  r->ReadValues(&env, reads, /*verify=*/true);
  for (size_t i = 0; i < values.size(); i++) {
    ASSERT_TRUE(reads[i].status.ok()) << i << ": " << reads[i].status.ToString();
    EXPECT_EQ(std::string(bufs[i].data(), values[i].size()), values[i]) << i;
  }
}

TEST(BucketFormatTest, UnknownFormatVersionsAreNotSupported) {
  for (uint32_t version : {0u, kBucketFormatVersion + 1}) {
    std::string block(kBucketHeaderSize, '\0');
    BucketHeader h;
    h.format_version = version;
    h.EncodeTo(block.data());
    EXPECT_TRUE(BucketHeader().DecodeFrom(block).IsNotSupported()) << version;
    BucketFooter f;
    f.format_version = version;
    f.EncodeTo(block.data());
    EXPECT_TRUE(BucketFooter().DecodeFrom(block.substr(0, kBucketFooterSize)).IsNotSupported());
  }
}

// The log's header: magic, format version 2, generation (docs/tombstone_log.md).
constexpr size_t kLogHeader = 24;

TEST(TombstoneLogTest, TornTailIsNormalDamageBeforeValidRecordsIsReported) {
  test::TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirIfMissing(dir.path()).ok());
  std::unique_ptr<TombstoneLog> log;
  ASSERT_TRUE(TombstoneLog::Create(env, dir.path(), {}, &log).ok());
  for (uint64_t i = 1; i <= 6; i++) log->Add({"key." + std::to_string(i), 10 * i, i});
  ASSERT_TRUE(log->Sync().ok());
  log.reset();
  const std::string path = dir.Sub(TombstoneLog::kFileName);
  std::ifstream f(path, std::ios::binary);
  const std::string good(std::istreambuf_iterator<char>(f), {});
  const size_t record = (good.size() - kLogHeader) / 6;  // keys of one length: records of one size

  std::vector<TombstoneLog::Record> records;
  TombstoneLog::ReadReport report;
  auto parse = [&](const std::string& image) {
    Status s = TombstoneLog::Parse(image, path, &records, &report);
    ASSERT_TRUE(s.ok()) << s.ToString();
  };
  parse(good);
  EXPECT_EQ(records.size(), 6u);
  EXPECT_EQ(report.torn_bytes + report.damaged_bytes, 0u);

  parse(good.substr(0, good.size() - 5));  // torn: the last record cut short
  EXPECT_EQ(records.size(), 5u);
  EXPECT_EQ(report.torn_bytes, record - 5);
  EXPECT_EQ(report.damaged_bytes, 0u);

  for (size_t victim : {size_t{0}, size_t{2}, size_t{5}}) {  // one bad record
    for (size_t byte = 0; byte < record; byte += 3) {
      std::string image = good;
      image[kLogHeader + victim * record + byte] ^= 0x10;
      parse(image);
      SCOPED_TRACE("record " + std::to_string(victim) + " byte " + std::to_string(byte));
      ASSERT_EQ(records.size(), 5u);
      for (const auto& r : records) EXPECT_NE(r.key, "key." + std::to_string(victim + 1));
      if (victim == 5) {
        EXPECT_EQ(report.torn_bytes, record);  // nothing valid after it: a torn tail
      } else {
        EXPECT_EQ(report.damaged_bytes, record);
        EXPECT_EQ(report.damaged_stretches, 1u);
      }
    }
  }
  std::string zeroed = good;  // a stretch of zeros (a lost block) in the middle
  std::fill(zeroed.begin() + kLogHeader + record, zeroed.begin() + kLogHeader + 3 * record, '\0');
  parse(zeroed);
  EXPECT_EQ(records.size(), 4u);
  EXPECT_EQ(report.damaged_bytes, 2 * record);

  // Not a log at all: refused, naming the file.
  Status s = TombstoneLog::Parse(std::string(good.size(), 'x'), path, &records, &report);
  EXPECT_TRUE(s.IsCorruption() && s.ToString().find(path) != std::string::npos) << s.ToString();
}

// The guard (TOMBSTONES.guard) holds what each sync made durable: a log that lost
// synced records is reported lost, with the highest version they may have named; a torn
// tail past the last sync is not.
TEST(TombstoneLogTest, GuardReportsWhatTheLogLost) {
  test::TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirIfMissing(dir.path()).ok());
  std::unique_ptr<TombstoneLog> log;
  ASSERT_TRUE(TombstoneLog::Create(env, dir.path(), {}, &log).ok());
  log->Add({"a", 10, 1});
  ASSERT_TRUE(log->Sync().ok());
  const std::string path = dir.Sub(TombstoneLog::kFileName);
  auto read_file = [&] {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string first = read_file();
  log->Add({"b", 30, 1});
  log->Add({"c", 20, 2});
  ASSERT_TRUE(log->Sync().ok());
  ASSERT_TRUE(log->Sync().ok());  // nothing new: no guard record either
  log.reset();
  const std::string good = read_file();
  std::vector<TombstoneLog::Record> records;
  TombstoneLog::ReadReport report;
  auto read = [&](const std::string& image) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << image;
    ASSERT_TRUE(TombstoneLog::Read(env, dir.path(), &records, &report).ok());
  };
  read(good);
  EXPECT_FALSE(report.lost) << report.lost_why;
  EXPECT_EQ(records.size(), 3u);
  read(good + std::string(7, 'x'));  // a torn append past the last sync
  EXPECT_FALSE(report.lost) << report.lost_why;
  EXPECT_EQ(report.torn_bytes, 7u);
  read(first);  // an older copy: it lost "b" and "c"
  EXPECT_TRUE(report.lost);
  EXPECT_EQ(report.lost_through_version, 30u);
  read(good.substr(0, good.size() - 1));  // its last record cut (reads as a torn tail)
  EXPECT_TRUE(report.lost);
  std::filesystem::remove(path);
  ASSERT_TRUE(TombstoneLog::Read(env, dir.path(), &records, &report).ok());
  EXPECT_TRUE(report.lost) << "a missing log";
  read(good);
  std::filesystem::remove(dir.Sub(TombstoneGuard::kFileName));
  ASSERT_TRUE(TombstoneLog::Read(env, dir.path(), &records, &report).ok());
  EXPECT_TRUE(report.lost) << "a missing guard";
  EXPECT_EQ(report.lost_through_version, TombstoneLog::kAllVersions);
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, BucketTest, ::testing::Bool());

TEST(BucketFileNameTest, Parse) {
  uint64_t id = 0;
  EXPECT_TRUE(ParseBucketFileName(BucketFileName(42), &id));
  EXPECT_EQ(id, 42u);
  EXPECT_FALSE(ParseBucketFileName("bucket-.kvb", &id));
  EXPECT_FALSE(ParseBucketFileName("bucket-12x.kvb", &id));
  EXPECT_FALSE(ParseBucketFileName("bucket-000042.kvb.tmp", &id));
  // Other spellings of an id name no bucket of the DB (recovery quarantines them).
  id = 7;
  EXPECT_FALSE(ParseBucketFileName("bucket-42.kvb", &id));
  EXPECT_FALSE(ParseBucketFileName("bucket-0000042.kvb", &id));
  EXPECT_FALSE(ParseBucketFileName("bucket-+00042.kvb", &id));
  EXPECT_FALSE(ParseBucketFileName("bucket-99999999999999999999999.kvb", &id));
  EXPECT_EQ(id, 7u);
  EXPECT_TRUE(LooksLikeBucketFileName("bucket-42.kvb"));
  EXPECT_FALSE(LooksLikeBucketFileName("bucket-000042.kvb.tmp"));
  // Ids past six digits are written with as many as they need.
  EXPECT_TRUE(ParseBucketFileName(BucketFileName(12345678), &id));
  EXPECT_EQ(id, 12345678u);
  EXPECT_EQ(BucketFileName(12345678), "bucket-12345678.kvb");
}

TEST(TombstoneLogTest, RoundTripAndTornTail) {
  test::TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirIfMissing(dir.path()).ok());
  std::unique_ptr<TombstoneLog> log;
  ASSERT_TRUE(TombstoneLog::Create(env, dir.path(), {{"a", 1, 1}}, &log).ok());
  log->Add({"b", 2, 1});
  log->Add({std::string("c\0d", 3), 3, 2});
  ASSERT_TRUE(log->Sync().ok());
  log->Add({"never-synced", 4, 2});
  log.reset();
  std::vector<TombstoneLog::Record> records;
  uint64_t torn = 0;
  ASSERT_TRUE(TombstoneLog::Read(env, dir.path(), &records, &torn).ok());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2].key, std::string("c\0d", 3));
  EXPECT_EQ(torn, 0u);
  // Tear the last record: it is ignored, the earlier ones survive.
  const std::string path = dir.Sub(TombstoneLog::kFileName);
  uint64_t size = std::filesystem::file_size(path);
  for (uint64_t cut = 1; cut < 20; cut++) {
    std::filesystem::resize_file(path, size - cut);
    ASSERT_TRUE(TombstoneLog::Read(env, dir.path(), &records, &torn).ok());
    EXPECT_EQ(records.size(), 2u) << cut;
    EXPECT_GT(torn, 0u);
  }
}

}  // namespace
}  // namespace kvengine
