// Fuzz target: MapCheckpoint::Read over an arbitrary SSDMAP file (db/map_checkpoint.*,
// layout in docs/ssd_tier.md "File format").
//
// The first input byte says how the file is made from the rest of the input:
//   bit 0 clear: the rest is the file, byte for byte (the seeds are real checkpoints).
//     bit 1 set:   the file is resealed first: the header's, every shard's, the table's
//                  and the footer's checksums are computed again where the file's own
//                  sizes place them, so that the checks behind the checksums (shard
//                  sizes, the slots' placement, bucket records, namespace tallies) see
//                  the fuzzer's fields.
//     Whatever Read accepts must be what its contract says (no bucket listed twice,
//     every bucket's tallies add up to at most its total bytes and keys, every key the
//     map lists is found where it lies, no more slots than the file holds) and must be
//     written again by Write byte for byte, reading back to the same contents and map.
//   bit 0 set:   the rest chooses contents (buckets with dead extents and namespace
//                tallies within their counts, flags) and keys put into (and some erased
//                from) an SsdIndex, written by Write or by a Writer, then perhaps cut
//                short or one byte flipped.  Undamaged, Read must return exactly what was
//                written (or refuse it when it lists a bucket twice); damaged, either
//                exactly that or an error, never another map:
//                the header, each shard's slots, the table and the footer have checksums,
//                and the shard counts are checked against the slots and the footer.
//   bit 2:       Read verifies the shards on 3 threads instead of 1.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "db/map_checkpoint.h"
#include "db/ssd_index.h"
#include "table/bucket_format.h"
#include "test/fuzz/damage.h"
#include "test/fuzz/fuzz_check.h"
#include "test/fuzz/memory_env.h"
#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {
namespace {

constexpr const char* kDir = "/fuzz";
// The layout's sizes (docs/ssd_tier.md), for Reseal.
constexpr size_t kHeaderSize = 48;
constexpr size_t kFooterSize = 40;
constexpr size_t kShardHeaderSize = 24;

std::string MapPath() { return std::string(kDir) + "/" + MapCheckpoint::kFileName; }

using Entry = std::pair<KeyFingerprint, SsdLocation>;

// The map's keys in the order its slots hold them.
std::vector<Entry> Entries(const SsdIndex& map) {
  std::vector<Entry> out;
  map.ForEach([&](const KeyFingerprint& k, const SsdLocation& l) { out.emplace_back(k, l); });
  return out;
}

bool SameLocation(const SsdLocation& a, const SsdLocation& b) {
  return a.bucket == b.bucket && a.offset == b.offset && a.size == b.size &&
         a.version == b.version && a.checksum == b.checksum;
}

bool SameEntries(const std::vector<Entry>& a, const std::vector<Entry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++) {
    if (!(a[i].first == b[i].first) || !SameLocation(a[i].second, b[i].second)) return false;
  }
  return true;
}

bool SameBucket(const MapCheckpoint::Bucket& a, const MapCheckpoint::Bucket& b) {
  if (a.id != b.id || a.file_size != b.file_size || a.created_micros != b.created_micros ||
      a.format_version != b.format_version || a.keys != b.keys || a.live_keys != b.live_keys ||
      a.total_bytes != b.total_bytes || a.deleted_bytes != b.deleted_bytes ||
      a.punched_bytes != b.punched_bytes || a.punched_value_bytes != b.punched_value_bytes ||
      a.dead_extents.size() != b.dead_extents.size() ||
      a.namespaces.size() != b.namespaces.size()) {
    return false;
  }
  for (size_t i = 0; i < a.dead_extents.size(); i++) {
    const MapCheckpoint::Extent &x = a.dead_extents[i], &y = b.dead_extents[i];
    if (x.offset != y.offset || x.length != y.length || x.value_size != y.value_size) return false;
  }
  for (size_t i = 0; i < a.namespaces.size(); i++) {
    const MapCheckpoint::NamespaceTally &x = a.namespaces[i], &y = b.namespaces[i];
    if (x.id != y.id || x.bytes != y.bytes || x.items != y.items) return false;
  }
  return true;
}

bool SameContents(const MapCheckpoint::Contents& a, const MapCheckpoint::Contents& b) {
  if (a.next_bucket_id != b.next_bucket_id || a.max_version != b.max_version ||
      a.flags != b.flags || a.buckets.size() != b.buckets.size()) {
    return false;
  }
  for (size_t i = 0; i < a.buckets.size(); i++) {
    if (!SameBucket(a.buckets[i], b.buckets[i])) return false;
  }
  return true;
}

// What Read promises of whatever it accepts.
void CheckAccepted(const MapCheckpoint::Contents& contents, const SsdIndex& map) {
  std::set<uint64_t> ids;
  for (const MapCheckpoint::Bucket& b : contents.buckets) {
    FUZZ_CHECK(ids.insert(b.id).second, "bucket " + std::to_string(b.id) + " listed twice");
    unsigned __int128 bytes = 0, items = 0;  // no wrap: the sums a reader must bound
    for (const MapCheckpoint::NamespaceTally& t : b.namespaces) {
      bytes += t.bytes;
      items += t.items;
    }
    FUZZ_CHECK(bytes <= b.total_bytes && items <= b.keys,
               "bucket " + std::to_string(b.id) + "'s namespace tallies exceed its counts");
  }
  const std::vector<Entry> entries = Entries(map);
  FUZZ_CHECK(entries.size() == map.size(), "the map's size disagrees with its slots");
  for (const auto& [key, location] : entries) {
    SsdLocation found;
    FUZZ_CHECK(map.Find(key, &found), "a key the map lists is not found");
    FUZZ_CHECK(SameLocation(found, location), "a key is found at another location than it lies");
  }
}

// Recomputes the checksums where the file's own fields place them (see bit 1).
void Reseal(std::string* file) {
  const size_t size = file->size();
  if (size < kHeaderSize + kFooterSize) return;
  char* p = file->data();
  EncodeFixed64(p + kHeaderSize - 8, Hash64(p, kHeaderSize - 8));
  char* footer = p + size - kFooterSize;
  EncodeFixed64(footer + 24, Hash64(footer, 24));
  const uint64_t table_bytes = DecodeFixed64(footer + 8);
  if (table_bytes < 8 || table_bytes > size - kHeaderSize - kFooterSize) return;
  const uint64_t table_offset = size - kFooterSize - table_bytes;
  EncodeFixed64(p + table_offset + table_bytes - 8, Hash64(p + table_offset, table_bytes - 8));
  uint64_t offset = kHeaderSize;
  for (size_t i = 0; i < SsdIndex::kShardCount; i++) {
    if (table_offset - offset < kShardHeaderSize) return;
    const uint64_t slots = offset + kShardHeaderSize;
    const uint64_t capacity = DecodeFixed64(p + offset);
    if (capacity > (table_offset - slots) / SsdIndex::kSlotBytes) return;
    EncodeFixed64(p + offset + 16, Hash64(p + slots, capacity * SsdIndex::kSlotBytes));
    offset = slots + capacity * SsdIndex::kSlotBytes;
  }
}

void CheckRawFile(std::string file, bool reseal, int threads) {
  if (reseal) Reseal(&file);
  fuzz::MemoryEnv env;
  env.SetFile(MapPath(), file);
  MapCheckpoint::Contents contents;
  SsdIndex map;
  Status s = MapCheckpoint::Read(&env, kDir, threads, &contents, &map);
  if (!s.ok()) {
    FUZZ_CHECK(map.size() == 0 && Entries(map).empty(), "a rejected checkpoint left keys");
    return;
  }
  // The slots come from the file: never more of them than it holds.
  FUZZ_CHECK(map.MemoryBytes() <= SsdIndex().MemoryBytes() + file.size(),
             "the map takes more memory than the file holds");
  CheckAccepted(contents, map);

  env.Clear();
  s = MapCheckpoint::Write(&env, kDir, contents, map);
  FUZZ_CHECK(s.ok(), "Write: " + s.ToString());
  const std::string* rewritten = env.GetFile(MapPath());
  FUZZ_CHECK(rewritten != nullptr && *rewritten == file,
             "an accepted checkpoint is written back to other bytes");
  MapCheckpoint::Contents again;
  SsdIndex map_again;
  s = MapCheckpoint::Read(&env, kDir, 1, &again, &map_again);
  FUZZ_CHECK(s.ok(), "reading a rewritten checkpoint: " + s.ToString());
  FUZZ_CHECK(SameContents(contents, again), "a rewritten checkpoint reads back other contents");
  FUZZ_CHECK(SameEntries(Entries(map), Entries(map_again)),
             "a rewritten checkpoint reads back another map");
}

// Up to `total` split into parts of the caller's choosing: each tally takes some of
// what is left, so the sum never passes the bucket's count.
uint64_t TakePart(FuzzedDataProvider& in, uint64_t* left) {
  const uint64_t part = in.ConsumeIntegralInRange<uint64_t>(0, *left);
  *left -= part;
  return part;
}

MapCheckpoint::Bucket MakeBucket(FuzzedDataProvider& in) {
  MapCheckpoint::Bucket b;
  b.id = in.ConsumeIntegral<uint64_t>();
  b.file_size = in.ConsumeIntegral<uint64_t>();
  b.created_micros = in.ConsumeIntegral<uint64_t>();
  b.format_version = in.ConsumeIntegralInRange<uint64_t>(0, 3);
  b.keys = in.ConsumeIntegral<uint64_t>();
  b.live_keys = in.ConsumeIntegralInRange<uint64_t>(0, b.keys);
  b.total_bytes = in.ConsumeIntegral<uint64_t>();
  b.deleted_bytes = in.ConsumeIntegralInRange<uint64_t>(0, b.total_bytes);
  b.punched_bytes = in.ConsumeIntegralInRange<uint64_t>(0, b.file_size);
  b.punched_value_bytes = in.ConsumeIntegral<uint64_t>();
  b.dead_extents.resize(in.ConsumeIntegralInRange<size_t>(0, 4));
  for (MapCheckpoint::Extent& e : b.dead_extents) {
    e.offset = in.ConsumeIntegral<uint64_t>();
    e.length = in.ConsumeIntegral<uint64_t>();
    e.value_size = in.ConsumeIntegral<uint64_t>();
  }
  b.namespaces.resize(in.ConsumeIntegralInRange<size_t>(0, 4));
  uint64_t bytes_left = b.total_bytes, items_left = b.keys;
  for (MapCheckpoint::NamespaceTally& t : b.namespaces) {
    t.id = in.ConsumeIntegral<uint64_t>();
    t.bytes = TakePart(in, &bytes_left);
    t.items = TakePart(in, &items_left);
  }
  return b;
}

// Keys with locations SsdIndex can hold; some erased again, so shards shrink too.
void FillMap(FuzzedDataProvider& in, SsdIndex* map) {
  const size_t keys = in.ConsumeIntegralInRange<size_t>(0, 48);
  std::vector<KeyFingerprint> put;
  for (size_t i = 0; i < keys; i++) {
    const KeyFingerprint key = KeyFingerprint::Of(in.ConsumeRandomLengthString(24));
    SsdLocation l;
    l.bucket = in.ConsumeIntegralInRange<uint64_t>(0, UINT32_MAX);
    l.offset = in.ConsumeIntegralInRange<uint64_t>(0, UINT32_MAX) * kValueUnit;
    l.size = in.ConsumeIntegralInRange<uint64_t>(0, UINT32_MAX);
    l.version = in.ConsumeIntegral<uint64_t>();
    l.checksum = in.ConsumeIntegral<uint64_t>();
    map->Put(key, l);
    put.push_back(key);
  }
  for (const KeyFingerprint& key : put) {
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) map->Erase(key);
  }
}

Status WriteWith(FuzzedDataProvider& in, fuzz::MemoryEnv* env,
                 const MapCheckpoint::Contents& contents, const SsdIndex& map) {
  if (in.ConsumeBool()) return MapCheckpoint::Write(env, kDir, contents, map);
  // As the GC thread does while the DB runs: a Writer fed one shard at a time.
  MapCheckpoint::Writer writer(env, kDir);
  Status s = writer.Begin(contents);
  for (size_t i = 0; s.ok() && i < SsdIndex::kShardCount; i++) {
    s = writer.AddShard(map.GetShardImage(i));
  }
  return s.ok() ? writer.Finish(contents.buckets) : s;
}

void CheckWrittenFile(FuzzedDataProvider& in, int threads) {
  MapCheckpoint::Contents written;
  written.next_bucket_id = in.ConsumeIntegral<uint64_t>();
  written.max_version = in.ConsumeIntegral<uint64_t>();
  written.flags = in.ConsumeBool() ? in.ConsumeIntegral<uint32_t>() : MapCheckpoint::kPartial;
  const size_t buckets = in.ConsumeIntegralInRange<size_t>(0, 6);
  std::set<uint64_t> ids;  // a table listing a bucket twice is written wrong: refused
  for (size_t i = 0; i < buckets; i++) {
    written.buckets.push_back(MakeBucket(in));
    ids.insert(written.buckets.back().id);
  }
  const bool listed_twice = ids.size() != written.buckets.size();
  SsdIndex map;
  FillMap(in, &map);
  const std::vector<Entry> entries = Entries(map);

  fuzz::MemoryEnv env;
  Status s = WriteWith(in, &env, written, map);
  FUZZ_CHECK(s.ok(), "writing: " + s.ToString());
  FUZZ_CHECK(env.GetFile(MapPath() + ".tmp") == nullptr, "the temporary file is left");
  std::string file = *env.GetFile(MapPath());
  const std::string whole = file;
  fuzz::TearAndFlip(in, &file);
  env.SetFile(MapPath(), file);

  MapCheckpoint::Contents contents;
  SsdIndex read;
  s = MapCheckpoint::Read(&env, kDir, threads, &contents, &read);
  if (listed_twice) {
    FUZZ_CHECK(!s.ok(), "a table listing a bucket twice is accepted");
    return;
  }
  if (file == whole) FUZZ_CHECK(s.ok(), "an undamaged checkpoint is refused: " + s.ToString());
  if (!s.ok()) {
    FUZZ_CHECK(read.size() == 0 && Entries(read).empty(), "a rejected checkpoint left keys");
    return;
  }
  FUZZ_CHECK(SameContents(written, contents),
             file == whole ? "an undamaged checkpoint reads back other contents"
                           : "a damaged checkpoint is accepted with other contents");
  FUZZ_CHECK(SameEntries(entries, Entries(read)),
             file == whole ? "an undamaged checkpoint reads back another map"
                           : "a damaged checkpoint is accepted with another map");
  CheckAccepted(contents, read);
}

}  // namespace
}  // namespace kvengine

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvengine;
  if (size == 0) return 0;
  const int threads = (data[0] & 4) != 0 ? 3 : 1;
  FuzzedDataProvider in(data + 1, size - 1);
  if ((data[0] & 1) != 0) {
    CheckWrittenFile(in, threads);
  } else {
    CheckRawFile(in.ConsumeBytesAsString(in.remaining_bytes()), (data[0] & 2) != 0, threads);
  }
  return 0;
}
