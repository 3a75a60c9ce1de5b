// A helper of the kv_ldb tests: writes a small DB with the SSD tier, or holds one open.
//
//   ldb_make_db create DIR   writes the DB (below), then prints what it should contain:
//                              live KEY SIZE SEED     a key that must be live
//                              deleted KEY            a key that was deleted
//                              superseded KEY         a key whose first version was overwritten
//   ldb_make_db namespaces DIR   a DB with two namespaces besides the default (below)
//   ldb_make_db hold DIR     opens the DB, prints "ready", and keeps it open (holding its
//                            LOCK) until stdin reaches end of file
//
// Value bytes: byte j of a value with seed s is (s * 31 + j * 7) & 0xff.
#include <cstdio>
#include <memory>
#include <string>

#include "kvengine/db.h"
#include "kvengine/options.h"

namespace {

kvengine::Options TestOptions() {
  kvengine::Options o;
  o.apply_environment = false;
  o.memory_capacity_bytes = 4ull << 20;
  o.memory_slab_size = 64ull << 10;
  o.prefault_memory = false;
  o.offload_policy = kvengine::OffloadPolicy::kWriteThrough;
  o.bucket_keys_limit = 8;
  o.bucket_flush_timeout_ms = 60000;  // buckets are sealed by count (and the final Flush)
  o.gc_interval_ms = 0;               // no background GC: the test sees every deleted byte
  o.disable_ssd_eviction = true;
  return o;
}

std::string Value(uint64_t seed, size_t size) {
  std::string v(size, '\0');
  for (size_t j = 0; j < size; j++) v[j] = static_cast<char>((seed * 31 + j * 7) & 0xff);
  return v;
}

std::string Key(int i) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model@tp0/layer.%d/chunk.%03d", i % 4, i);
  return buf;
}

int Check(const kvengine::Status& s, const char* what) {
  if (s.ok()) return 0;
  std::fprintf(stderr, "ldb_make_db: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

int Create(const std::string& dir) {
  std::unique_ptr<kvengine::DB> db;
  if (Check(kvengine::DB::Open(TestOptions(), dir, &db), "open")) return 1;
  const int n = 40;
  kvengine::WriteOptions wo;
  for (int i = 0; i < n; i++) {
    if (Check(db->Put(wo, Key(i), Value(i, 1000 + 997 * i)), "put")) return 1;
  }
  // Every first version on disk before anything dies: a value that dies while its bucket
  // is still pending is left out of the bucket's index, which would make the dead bytes
  // below depend on the writer threads' timing.
  if (Check(db->Flush(), "flush")) return 1;
  // Overwrites: a newer version in a later bucket supersedes the first.
  for (int i = 0; i < 3; i++) {
    if (Check(db->Put(wo, Key(i), Value(100 + i, 3000)), "overwrite")) return 1;
  }
  for (int i = 4; i < n; i += 5) {
    if (Check(db->Delete(wo, Key(i)), "delete")) return 1;
  }
  if (Check(db->Flush(), "flush") || Check(db->Close(), "close")) return 1;
  for (int i = 0; i < n; i++) {
    if (i % 5 == 4) {
      std::printf("deleted %s\n", Key(i).c_str());
    } else if (i < 3) {
      std::printf("superseded %s\n", Key(i).c_str());
      std::printf("live %s %d %d\n", Key(i).c_str(), 3000, 100 + i);
    } else {
      std::printf("live %s %d %d\n", Key(i).c_str(), 1000 + 997 * i, i);
    }
  }
  return 0;
}

// A bucket per value, `n` of them: more bucket files than the test lets kv_ldb open
// descriptors.  Prints "live KEY SIZE SEED" per key.
int CreateMany(const std::string& dir, int n) {
  kvengine::Options o = TestOptions();
  o.bucket_keys_limit = 1;
  o.max_open_files = 16;
  std::unique_ptr<kvengine::DB> db;
  if (Check(kvengine::DB::Open(o, dir, &db), "open")) return 1;
  kvengine::WriteOptions wo;
  for (int i = 0; i < n; i++) {
    if (Check(db->Put(wo, Key(i), Value(i, 100 + i)), "put")) return 1;
  }
  if (Check(db->Flush(), "flush") || Check(db->Close(), "close")) return 1;
  for (int i = 0; i < n; i++) std::printf("live %s %d %d\n", Key(i).c_str(), 100 + i, i);
  return 0;
}

int Hold(const std::string& dir) {
  std::unique_ptr<kvengine::DB> db;
  if (Check(kvengine::DB::Open(TestOptions(), dir, &db), "open")) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  while (std::fgetc(stdin) != EOF) {
  }
  return Check(db->Close(), "close");
}

}  // namespace

// Three keyspaces holding the same keys: the default namespace and "tenant-a" the keys
// ns.0 .. ns.4, "tenant-b" ns.0 .. ns.2 (tenant-a's key i: seed 100 + i; tenant-b's:
// 200 + i; the default's: 300 + i; every value 64 + i bytes); prints them as
//   ns NAMESPACE KEY SIZE SEED
int CreateNamespaces(const std::string& dir) {
  std::unique_ptr<kvengine::DB> db, a, b;
  if (Check(kvengine::DB::Open(TestOptions(), dir, &db), "open")) return 1;
  kvengine::NamespaceOptions quota;
  quota.memory_quota_bytes = 1 << 20;
  quota.weight = 2;
  if (Check(db->CreateNamespace("tenant-a", quota, &a), "create tenant-a")) return 1;
  if (Check(db->CreateNamespace("tenant-b", kvengine::NamespaceOptions(), &b), "create tenant-b"))
    return 1;
  const struct {
    const char* name;
    kvengine::DB* db;
    int keys;
    int seed;
  } spaces[] = {
      {"default", db.get(), 5, 300}, {"tenant-a", a.get(), 5, 100}, {"tenant-b", b.get(), 3, 200}};
  for (const auto& space : spaces) {
    for (int i = 0; i < space.keys; i++) {
      const std::string key = "ns." + std::to_string(i);
      const size_t size = 64 + static_cast<size_t>(i);
      if (Check(space.db->Put(kvengine::WriteOptions(), key, Value(space.seed + i, size)), "put"))
        return 1;
      std::printf("ns %s %s %zu %d\n", space.name, key.c_str(), size, space.seed + i);
    }
  }
  a.reset();
  b.reset();
  return Check(db->Close(), "close");
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: ldb_make_db create|many|namespaces|hold DIR\n");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "create") return Create(argv[2]);
  if (mode == "hold") return Hold(argv[2]);
  if (mode == "many") return CreateMany(argv[2], 300);
  if (mode == "namespaces") return CreateNamespaces(argv[2]);
  std::fprintf(stderr, "ldb_make_db: unknown mode '%s'\n", mode.c_str());
  return 2;
}
