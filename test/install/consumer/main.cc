// A user's program: opens a DB, writes a value, reads it back.
#include <kvengine/db.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  kvengine::Options options;
  options.memory_capacity_bytes = 16 << 20;
  std::unique_ptr<kvengine::DB> db;
  kvengine::Status s = kvengine::DB::Open(options, argv[1], &db);
  if (!s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.ToString().c_str());
    return 1;
  }
  s = db->Put(kvengine::WriteOptions(), "hello", "world");
  std::string value;
  if (s.ok()) s = db->Get(kvengine::ReadOptions(), "hello", &value);
  if (!s.ok() || value != "world") {
    std::fprintf(stderr, "put/get: %s '%s'\n", s.ToString().c_str(), value.c_str());
    return 1;
  }
  return db->Close().ok() ? 0 : 1;
}
