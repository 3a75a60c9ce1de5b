#include "db/map_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <thread>

#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the map checkpoint stores SsdIndex slots as they lie in memory");

constexpr uint64_t kMagic = 0x50414d445353564bull;  // "KVSSDMAP" read little-endian
// Version 2: slot offsets count 512-byte units (version 1: 4096-byte units), the table
// follows the shards and a footer ends the file (a writer streams it), flags.  Version
// 3: each bucket record ends with its tally per namespace.  An older checkpoint is not
// used: the next Open scans the buckets (once).
constexpr uint32_t kFormatVersion = 3;
constexpr size_t kHeaderSize = 48;
constexpr size_t kFooterSize = 40;
constexpr size_t kBucketRecordWords = 12;
constexpr size_t kShardHeaderSize = 24;

Status ReadExactly(const RandomAccessFile& file, uint64_t offset, size_t n, char* dst) {
  size_t got = 0;
  Status s = file.Read(offset, n, dst, &got);
  if (s.ok() && got != n) return Status::Corruption("truncated");
  return s;
}

std::string TmpPath(const std::string& dir) {
  return dir + "/" + MapCheckpoint::kFileName + ".tmp";
}

}  // namespace

MapCheckpoint::Writer::~Writer() {
  if (file_ != nullptr || (shards_ > 0 && !finished_)) {
    file_.reset();
    env_->RemoveFile(TmpPath(dir_));
  }
}

Status MapCheckpoint::Writer::Begin(const Contents& contents) {
  Status s = env_->NewWritableFile(TmpPath(dir_), FileOptions(), &file_);
  if (!s.ok()) return s;
  std::string header;
  PutFixed64(&header, kMagic);
  PutFixed32(&header, kFormatVersion);
  PutFixed32(&header, SsdIndex::kSlotBytes);
  PutFixed32(&header, SsdIndex::kShardCount);
  PutFixed32(&header, contents.flags);
  PutFixed64(&header, contents.next_bucket_id);
  PutFixed64(&header, contents.max_version);
  PutFixed64(&header, Hash64(header));
  return file_->Append(Slice(header));
}

Status MapCheckpoint::Writer::AddShard(const SsdIndex::ShardImage& image) {
  if (file_ == nullptr || shards_ >= SsdIndex::kShardCount) {
    return Status::InvalidArgument("map checkpoint: shard out of order");
  }
  const size_t bytes = image.capacity * SsdIndex::kSlotBytes;
  std::string shard_header;
  PutFixed64(&shard_header, image.capacity);
  PutFixed64(&shard_header, image.count);
  PutFixed64(&shard_header, Hash64(image.slots, bytes));
  Status s = file_->Append(Slice(shard_header));
  if (s.ok() && bytes > 0) s = file_->Append(Slice(image.slots, bytes));
  shards_++;
  keys_ += image.count;
  return s;
}

Status MapCheckpoint::Writer::Finish(const std::vector<Bucket>& buckets) {
  if (file_ == nullptr || shards_ != SsdIndex::kShardCount) {
    return Status::InvalidArgument("map checkpoint: shards missing");
  }
  std::string table;
  for (const Bucket& b : buckets) {
    for (uint64_t v : {b.id, b.file_size, b.created_micros, b.format_version, b.keys, b.live_keys,
                       b.total_bytes, b.deleted_bytes, b.punched_bytes, b.punched_value_bytes,
                       static_cast<uint64_t>(b.dead_extents.size()),
                       static_cast<uint64_t>(b.namespaces.size())}) {
      PutFixed64(&table, v);
    }
    for (const Extent& e : b.dead_extents) {
      PutFixed64(&table, e.offset);
      PutFixed64(&table, e.length);
      PutFixed64(&table, e.value_size);
    }
    for (const NamespaceTally& t : b.namespaces) {
      PutFixed64(&table, t.id);
      PutFixed64(&table, t.bytes);
      PutFixed64(&table, t.items);
    }
  }
  PutFixed64(&table, Hash64(table));
  std::string footer;
  PutFixed64(&footer, buckets.size());
  PutFixed64(&footer, table.size());
  PutFixed64(&footer, keys_);
  PutFixed64(&footer, Hash64(footer));
  PutFixed64(&footer, kMagic);
  Status s = file_->Append(Slice(table));
  if (s.ok()) s = file_->Append(Slice(footer));
  if (s.ok()) s = file_->Close();
  file_.reset();
  if (s.ok()) s = env_->RenameFile(TmpPath(dir_), dir_ + "/" + kFileName);
  finished_ = s.ok();
  return s;
}

Status MapCheckpoint::Write(Env* env, const std::string& dir, const Contents& contents,
                            const SsdIndex& map) {
  Writer writer(env, dir);
  Status s = writer.Begin(contents);
  for (size_t i = 0; s.ok() && i < SsdIndex::kShardCount; i++) {
    s = writer.AddShard(map.GetShardImage(i));
  }
  if (s.ok()) s = writer.Finish(contents.buckets);
  return s;
}

Status MapCheckpoint::Read(Env* env, const std::string& dir, int threads, Contents* contents,
                           SsdIndex* map) {
  map->Clear();
  *contents = Contents();
  const std::string path = dir + "/" + kFileName;
  if (!env->FileExists(path)) return Status::NotFound(path);
  std::unique_ptr<RandomAccessFile> file;
  Status s = env->NewRandomAccessFile(path, FileOptions(), &file);
  if (!s.ok()) return s;
  const uint64_t file_size = file->Size();
  auto corrupt = [&](const std::string& why) {
    map->Clear();
    return Status::Corruption(path, why);
  };

  char header[kHeaderSize];
  if (file_size < kHeaderSize + kFooterSize || !ReadExactly(*file, 0, kHeaderSize, header).ok()) {
    return corrupt("shorter than its header and footer");
  }
  if (DecodeFixed64(header) != kMagic) return corrupt("bad magic");
  if (DecodeFixed32(header + 8) != kFormatVersion) {
    return Status::NotSupported(
        path, "map checkpoint format version " + std::to_string(DecodeFixed32(header + 8)));
  }
  if (Hash64(header, kHeaderSize - 8) != DecodeFixed64(header + kHeaderSize - 8)) {
    return corrupt("header checksum mismatch");
  }
  if (DecodeFixed32(header + 12) != SsdIndex::kSlotBytes ||
      DecodeFixed32(header + 16) != SsdIndex::kShardCount) {
    return Status::NotSupported(path, "another slot layout");
  }
  contents->flags = DecodeFixed32(header + 20);
  contents->next_bucket_id = DecodeFixed64(header + 24);
  contents->max_version = DecodeFixed64(header + 32);

  char footer[kFooterSize];
  if (!ReadExactly(*file, file_size - kFooterSize, kFooterSize, footer).ok() ||
      DecodeFixed64(footer + 32) != kMagic) {
    return corrupt("bad footer (torn?)");
  }
  if (Hash64(footer, 24) != DecodeFixed64(footer + 24)) return corrupt("footer checksum mismatch");
  const uint64_t buckets = DecodeFixed64(footer);
  const uint64_t table_bytes = DecodeFixed64(footer + 8);
  const uint64_t keys = DecodeFixed64(footer + 16);
  if (table_bytes < 8 || table_bytes > file_size - kHeaderSize - kFooterSize) {
    return corrupt("bad table size");
  }
  const uint64_t table_offset = file_size - kFooterSize - table_bytes;

  std::string table(table_bytes, '\0');
  s = ReadExactly(*file, table_offset, table_bytes, table.data());
  if (!s.ok()) return corrupt("bucket table: " + s.ToString());
  if (Hash64(table.data(), table_bytes - 8) != DecodeFixed64(table.data() + table_bytes - 8)) {
    return corrupt("bucket table checksum mismatch");
  }
  std::string_view in(table.data(), table_bytes - 8);
  for (uint64_t i = 0; i < buckets; i++) {
    uint64_t w[kBucketRecordWords];
    for (uint64_t& v : w) {
      if (!GetFixed64(&in, &v)) return corrupt("bucket table truncated");
    }
    Bucket b{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9], {}, {}};
    // Counts no bucket can have (a table written wrong, yet checksummed): the SSD tier
    // subtracts one from the other (dead values, live bytes), and would wrap.
    if (b.live_keys > b.keys || b.deleted_bytes > b.total_bytes || b.punched_bytes > b.file_size) {
      return corrupt("bucket " + std::to_string(b.id) +
                     "'s counts contradict each other (more live values than values, more "
                     "deleted bytes than value bytes, or more punched bytes than the file)");
    }
    if (w[10] > in.size() / 24) return corrupt("bucket table truncated");
    b.dead_extents.resize(w[10]);
    for (Extent& e : b.dead_extents) {
      GetFixed64(&in, &e.offset);
      GetFixed64(&in, &e.length);
      GetFixed64(&in, &e.value_size);
    }
    if (w[11] > in.size() / 24) return corrupt("bucket table truncated");
    b.namespaces.resize(w[11]);
    // A table that passed its checksum yet counts more than its bucket holds was
    // written wrong: not trusted.  What is left of the counts is tracked rather than
    // the tallies summed, so that no sum can wrap past 2^64 and look small.
    uint64_t bytes_left = b.total_bytes, items_left = b.keys;
    for (NamespaceTally& t : b.namespaces) {
      GetFixed64(&in, &t.id);
      GetFixed64(&in, &t.bytes);
      GetFixed64(&in, &t.items);
      if (t.bytes > bytes_left || t.items > items_left) {
        return corrupt("bucket " + std::to_string(b.id) + "'s namespace tally exceeds its counts");
      }
      bytes_left -= t.bytes;
      items_left -= t.items;
    }
    contents->buckets.push_back(std::move(b));
  }
  if (!in.empty()) return corrupt("bucket table has trailing bytes");
  // A bucket listed twice would be loaded twice (its tallies counted twice).
  std::vector<uint64_t> ids;
  ids.reserve(contents->buckets.size());
  for (const Bucket& b : contents->buckets) ids.push_back(b.id);
  std::sort(ids.begin(), ids.end());
  if (auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end()) {
    return corrupt("bucket " + std::to_string(*twice) + " listed twice");
  }

  // The shards' places, then their slots read and verified in parallel.
  struct ShardPlace {
    uint64_t offset, capacity, count, checksum;
  };
  std::vector<ShardPlace> places(SsdIndex::kShardCount);
  uint64_t offset = kHeaderSize;
  uint64_t total = 0;
  for (ShardPlace& p : places) {
    char h[kShardHeaderSize];
    if (offset > table_offset || table_offset - offset < kShardHeaderSize ||
        !ReadExactly(*file, offset, kShardHeaderSize, h).ok()) {
      return corrupt("shard header truncated");
    }
    p.capacity = DecodeFixed64(h);
    p.count = DecodeFixed64(h + 8);
    p.checksum = DecodeFixed64(h + 16);
    p.offset = offset + kShardHeaderSize;
    if (p.capacity > (table_offset - p.offset) / SsdIndex::kSlotBytes || p.count > p.capacity) {
      return corrupt("shard larger than the file");
    }
    offset = p.offset + p.capacity * SsdIndex::kSlotBytes;
    total += p.count;
  }
  if (offset != table_offset) return corrupt("shards and table do not meet");
  if (total != keys) return corrupt("shard counts disagree with the footer");
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < places.size() && !failed.load();) {
      const ShardPlace& p = places[i];
      char* slots = map->ResetShard(i, p.capacity);
      const size_t bytes = p.capacity * SsdIndex::kSlotBytes;
      if ((bytes > 0 && !ReadExactly(*file, p.offset, bytes, slots).ok()) ||
          Hash64(slots, bytes) != p.checksum || !map->AdoptShard(i, p.count)) {
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; t++) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  map->RecountSize();
  if (failed) return corrupt("shard checksum mismatch");
  return Status::OK();
}

Status MapCheckpoint::Remove(Env* env, const std::string& dir) {
  const std::string path = dir + "/" + kFileName;
  if (!env->FileExists(path)) return Status::OK();
  return env->RemoveFile(path);
}

}  // namespace kvengine
