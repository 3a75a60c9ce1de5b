// Linked instead of rocksdb_engine.cc when kv_bench is built without RocksDB.
#include "db_bench/engine.h"

namespace kvbench {

std::unique_ptr<Engine> NewRocksDBEngine() { return nullptr; }
bool HaveRocksDB() { return false; }

}  // namespace kvbench
