// make_fuzz_seeds: writes the seed corpora of the fuzz targets (test/fuzz/corpus/) with
// the project's own writers, so that a format change is one command away from new seeds:
//   test/fuzz/run_fuzz.sh seeds
// Usage: make_fuzz_seeds CORPUS_DIR  (replaces the files of CORPUS_DIR/<target>/).
// Each seed starts with the mode byte its target reads first (see the targets' comments).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "db/map_checkpoint.h"
#include "db/ssd_index.h"
#include "db/tombstone_log.h"
#include "kvengine/options.h"
#include "table/bucket_builder.h"
#include "table/bucket_format.h"
#include "test/fuzz/memory_env.h"
#include "transport/read_validation.h"
#include "transport/ucx.h"
#include "transport/wire.h"
#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {
namespace {

namespace fs = std::filesystem;

class SeedWriter {
 public:
  SeedWriter(const fs::path& root, const std::string& target) : dir_(root / target) {
    fs::create_directories(dir_);
    // Seeds named *_format_vN were written by earlier versions of the writers, which
    // cannot make them any more: they stay, for the readers' old-format paths.
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.path().filename().string().find("_format_v") == std::string::npos) {
        fs::remove(entry.path());
      }
    }
  }
  void Write(const std::string& name, char mode, const std::string& bytes) {
    std::ofstream out(dir_ / name, std::ios::binary);
    out.put(mode);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "make_fuzz_seeds: cannot write %s\n", (dir_ / name).c_str());
      std::exit(1);
    }
  }

 private:
  const fs::path dir_;
};

void Check(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "make_fuzz_seeds: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// Deterministic filler bytes, so that the seeds only change when a writer does.
std::string Filler(size_t n, uint64_t seed) {
  std::string out(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (char& c : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return out;
}

// A bucket file holding values of `sizes`, as the SSD tier writes it.
std::string MakeBucket(const std::vector<size_t>& sizes) {
  std::unique_ptr<BucketBuilder> builder;
  Check(BucketBuilder::Create(1, 1 << 20, 1700000000000000, &builder), "bucket builder");
  std::vector<BucketEntry> entries;
  for (size_t i = 0; i < sizes.size(); i++) {
    const std::string value = Filler(sizes[i], i);
    BucketEntry e;
    e.key = "llama@tp0/layer." + std::to_string(i);
    if (!builder->Reserve(value.size(), &e.offset)) Check(Status::NoSpace("seed"), "reserve");
    std::memcpy(builder->MutableData(e.offset), value.data(), value.size());
    e.size = value.size();
    e.version = 10 + i;
    e.checksum = Hash64(value.data(), value.size());
    entries.push_back(e);
  }
  fuzz::MemoryEnv env;
  std::unique_ptr<WritableFile> file;
  Check(env.NewWritableFile("bucket", FileOptions(), &file), "bucket file");
  uint64_t size = 0;
  Check(builder->WriteTo(file.get(), entries, &size), "bucket write");
  return *env.GetFile("bucket");
}

void BucketSeeds(const fs::path& root) {
  SeedWriter out(root, "bucket_reader");
  const std::string empty = MakeBucket({});
  const std::string three = MakeBucket({1, 4096, 5000});
  out.Write("empty_bucket", 0, empty);
  out.Write("three_values", 0, three);
  out.Write("three_values_direct", 2, three);
  out.Write("three_values_split_reads", 4, three + Filler(200, 7));
  out.Write("three_values_split_reads_direct", 6, three + Filler(200, 8));
  out.Write("structured", 1, Filler(512, 1));
  out.Write("structured_direct", 3, Filler(512, 2));
}

std::string MakeTombstoneLog(size_t created, size_t added) {
  std::vector<TombstoneLog::Record> records;
  for (size_t i = 0; i < created + added; i++) {
    records.push_back({"llama@tp0/layer." + std::to_string(i), 100 + i, i / 2});
  }
  fuzz::MemoryEnv env;
  std::unique_ptr<TombstoneLog> log;
  Check(TombstoneLog::Create(
            &env, "/db",
            std::vector<TombstoneLog::Record>(records.begin(), records.begin() + created), &log),
        "tombstone log");
  for (size_t i = created; i < records.size(); i++) log->Add(records[i]);
  Check(log->Sync(), "tombstone sync");
  return *env.GetFile(std::string("/db/") + TombstoneLog::kFileName);
}

void TombstoneSeeds(const fs::path& root) {
  SeedWriter out(root, "tombstone_log");
  out.Write("empty_log", 0, MakeTombstoneLog(0, 0));
  out.Write("five_records", 0, MakeTombstoneLog(3, 2));
  out.Write("structured", 1, Filler(256, 3));
}

std::string WriteMapCheckpoint(const MapCheckpoint::Contents& contents, const SsdIndex& map) {
  fuzz::MemoryEnv env;
  Check(MapCheckpoint::Write(&env, "/db", contents, map), "map checkpoint");
  return *env.GetFile(std::string("/db/") + MapCheckpoint::kFileName);
}

// A map checkpoint as the SSD tier writes it at Close (or, kPartial, while it runs): `keys`
// keys spread over `buckets` buckets, each bucket with a dead extent per two keys and its
// live values split between the default namespace and a named one.
std::string MakeMapCheckpoint(size_t keys, size_t buckets, uint32_t flags) {
  MapCheckpoint::Contents contents;
  contents.flags = flags;
  contents.next_bucket_id = buckets + 1;
  contents.max_version = 100 + keys;
  SsdIndex map;
  for (size_t i = 0; i < keys; i++) {
    const uint64_t bucket = 1 + i % buckets;
    map.Put(KeyFingerprint::Of("llama@tp0/layer." + std::to_string(i)),
            SsdLocation{bucket, kBucketHeaderSize + (i / buckets) * 8192, 5000, 100 + i,
                        Hash64(Filler(16, i))});
  }
  for (size_t id = 1; id <= buckets; id++) {
    MapCheckpoint::Bucket b;
    b.id = id;
    b.created_micros = 1700000000000000 + id;
    b.format_version = 2;
    b.keys = (keys + buckets - id) / buckets;
    b.live_keys = b.keys;
    b.total_bytes = b.keys * 5000;
    b.file_size = kBucketHeaderSize + b.keys * 8192 + 4096;
    for (uint64_t e = 0; e < b.keys / 2; e++) {
      b.dead_extents.push_back({kBucketHeaderSize + e * 8192, 8192, 5000});
      b.deleted_bytes += 5000;
      b.live_keys--;
    }
    const uint64_t named = b.live_keys / 2;
    b.namespaces.push_back({0, (b.live_keys - named) * 5000, b.live_keys - named});
    if (named > 0) b.namespaces.push_back({0x6c6c616d61000001ull, named * 5000, named});
    contents.buckets.push_back(b);
  }
  return WriteMapCheckpoint(contents, map);
}

// One bucket whose counts are at the top of their range, its tallies adding up to them:
// a tally changed upwards tests that their sum cannot wrap.
std::string MakeMapCheckpointOfHugeCounts() {
  MapCheckpoint::Contents contents;
  MapCheckpoint::Bucket b;
  b.id = 1;
  b.keys = b.live_keys = b.total_bytes = UINT64_MAX;
  b.namespaces.push_back({0, uint64_t{1} << 63, uint64_t{1} << 62});
  b.namespaces.push_back({7, (uint64_t{1} << 63) - 1, (uint64_t{3} << 62) - 1});
  contents.buckets.push_back(b);
  return WriteMapCheckpoint(contents, SsdIndex());
}

void MapCheckpointSeeds(const fs::path& root) {
  SeedWriter out(root, "map_checkpoint");
  const std::string empty = MakeMapCheckpoint(0, 0, 0);
  const std::string ten = MakeMapCheckpoint(10, 3, 0);
  const std::string partial = MakeMapCheckpoint(6, 2, MapCheckpoint::kPartial);
  out.Write("empty_map", 0, empty);
  out.Write("ten_keys_three_buckets", 0, ten);
  out.Write("partial_six_keys", 0, partial);
  // Bit 1: resealed, so that changed fields reach the checks behind the checksums.
  out.Write("ten_keys_three_buckets_resealed", 2, ten);
  out.Write("partial_six_keys_resealed_threads", 6, partial);
  out.Write("huge_counts_resealed", 2, MakeMapCheckpointOfHugeCounts());
  out.Write("structured", 1, Filler(512, 4));
  out.Write("structured_threads", 5, Filler(1024, 5));
}

std::string Header(uint8_t op, uint16_t flags, const std::string& meta, uint64_t body_len) {
  wire::FrameHeader h;
  h.op = op;
  h.flags = flags;
  h.request_id = 7;
  h.meta_len = static_cast<uint32_t>(meta.size());
  h.body_len = body_len;
  std::string out(wire::kHeaderSize, '\0');
  h.EncodeTo(out.data());
  h.checksum = wire::FrameChecksum(out.data(), meta, {});
  h.EncodeTo(out.data());
  return out;
}

void WireSeeds(const fs::path& root) {
  SeedWriter out(root, "wire");
  const std::vector<Slice> keys = {Slice("llama@tp0/layer.0"), Slice("llama@tp0/layer.1")};
  const uint64_t sizes[] = {65536, 4096};
  std::string keys_with_sizes, keys_alone;
  wire::PutKeys(&keys_with_sizes, keys, sizes);
  wire::PutKeys(&keys_alone, keys, nullptr);
  for (uint8_t op = wire::kChallenge; op <= wire::kDeleteMatching; op++) {
    const bool with_sizes = op == wire::kGet || op == wire::kPut;
    out.Write("header_op" + std::to_string(op), 0,
              Header(op, 0, with_sizes ? keys_with_sizes : keys_alone,
                     op == wire::kPut ? sizes[0] + sizes[1] : 0));
  }
  out.Write("header_response", 0, Header(wire::kGet, wire::kFlagResponse, "", 4096));
  out.Write("keys_with_sizes", 1, keys_with_sizes);
  out.Write("keys", 2, keys_alone);
  std::string results;
  wire::PutResults(&results, std::vector<int64_t>{65536, -1, 0});
  out.Write("results", 3, results);
  std::string ok, error;
  wire::PutBatchStatus(&ok, Status::OK());
  wire::PutBatchStatus(&error, Status::InvalidArgument("authentication refused", "wrong token"));
  out.Write("status_ok", 4, ok);
  out.Write("status_error", 4, error);
  std::string all, regex;
  wire::PutDeleteMatching(&all, wire::kMatchAll, "");
  wire::PutDeleteMatching(&regex, wire::kMatchRegex, "llama@tp0/layer\\.[0-9]+");
  out.Write("delete_all", 5, all);
  out.Write("delete_regex", 5, regex);
  std::string locations;
  EncodeLocations(&locations, std::vector<int64_t>{kLookupPinned, kLookupNotPinned, -1},
                  std::vector<RemoteLocation>{{4096, 65536, 3, 1}, {}, {}});
  out.Write("locations", 6, locations);
  UcxConnectAnswer ucx;
  ucx.worker_address = "worker";
  ucx.arena_addr = 1ull << 30;
  ucx.arena_len = 1ull << 30;
  ucx.rkey = "rkey";
  ucx.token = 0x99;
  ucx.lease_ttl_ms = 2000;
  std::string ucx_bytes;
  ucx.EncodeTo(&ucx_bytes);
  out.Write("ucx_answer", 7, ucx_bytes);
  ucx.rkey.clear();
  ucx.reads_by_am = true;
  ucx_bytes.clear();
  ucx.EncodeTo(&ucx_bytes);
  out.Write("ucx_answer_by_am", 7, ucx_bytes);
  std::string request;
  UcxConnectRequest{"worker"}.EncodeTo(&request);
  out.Write("ucx_request", 7, request);
}

// The server target reads its input through FuzzedDataProvider: any bytes are requests.
void ServerSeeds(const fs::path& root) {
  SeedWriter out(root, "server");
  for (uint64_t i = 0; i < 4; i++) out.Write("requests" + std::to_string(i), 0, Filler(96, 40 + i));
}

void OptionSeeds(const fs::path& root) {
  SeedWriter out(root, "options");
  // Every option at its default, as ToString prints it ("name=value"); the mode byte of
  // this target is the line's first character, so the line is written whole.
  std::string lines = Options().ToString();
  size_t start = 0;
  while (start < lines.size()) {
    const size_t end = lines.find('\n', start);
    const std::string line = lines.substr(start, end - start);
    out.Write(line.substr(0, line.find('=')), line[0], line.substr(1));
    start = end + 1;
  }
  const std::vector<std::string> more = {
      "memory_capacity_bytes=1.5GiB",
      "bucket_size_limit=64MB",
      "gc_deleted_ratio=0.25",
      "offload_policy=WRITE_THROUGH",
      "peers=127.0.0.1:7400, [::1]:80,localhost:1",
      "use_direct_io= yes ",
      "namespace_arenas=tenantA=4MiB;tenantB+tenantC=8MiB",
  };
  for (size_t i = 0; i < more.size(); i++) {
    out.Write("example" + std::to_string(i), more[i][0], more[i].substr(1));
  }
}

// The key_pattern target: a pattern and keys as FuzzedDataProvider's strings (a
// backslash doubled, "\\n" ending each), behind the mode byte.
void KeyPatternSeeds(const fs::path& root) {
  SeedWriter out(root, "key_pattern");
  auto provided = [](const std::string& s) {
    std::string bytes;
    for (char c : s) bytes += c == '\\' ? std::string("\\\\") : std::string(1, c);
    return bytes + "\\n";
  };
  const std::vector<std::vector<std::string>> seeds = {
      {"layer\\.[0-9]+", "layer.17", "layer.x", "xlayer.1"},
      {"[\\x00-\\xff]*k[12]", "k1", "\xfe\x01k2", "k3"},
      {"kvbench-model@[^/]*/L[0-9]+/.*", "kvbench-model@tp0/L3/ab", "other"},
      {"^(a|b)*c$", "ababc", "abab"},
      {"(?:a?){16000}", "aaaa"},
      {"[[:alpha:]]+\\Qa.b\\E", "xa.b", "xaxb"},
  };
  for (size_t i = 0; i < seeds.size(); i++) {
    std::string bytes;
    for (const std::string& s : seeds[i]) bytes += provided(s);
    out.Write("pattern" + std::to_string(i), static_cast<char>(i % 4), bytes);
  }
}

}  // namespace
}  // namespace kvengine

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root(argv[1]);
  kvengine::BucketSeeds(root);
  kvengine::TombstoneSeeds(root);
  kvengine::MapCheckpointSeeds(root);
  kvengine::WireSeeds(root);
  kvengine::ServerSeeds(root);
  kvengine::OptionSeeds(root);
  kvengine::KeyPatternSeeds(root);
  return 0;
}
