// TombstoneLog: the durable record of deleted (or superseded) SSD values.
//
// A tombstone (key, version, bucket) says "the value of `key` written with `version` is
// dead", wherever a copy of it lies (compaction may have copied it into another bucket
// before the delete won).  `bucket` names the bucket whose lifetime bounds the
// tombstone's: once no bucket that may hold (key, version) is left, the tombstone is
// dropped when the log is rewritten.
//
// File format (docs/tombstone_log.md): a 16-byte header (magic, format version), then
// records of [payload length: fixed32][payload][XXH3-64 of payload: fixed64], payload =
// [key length: varint][key][version: fixed64][bucket: fixed64].
//
// Reading: an incomplete or bad record with no valid record after it is a torn tail (a
// crash while appending: it loses at most the records not yet synced).  A bad record
// followed by valid ones is damage: reading resynchronises at the next valid record, so
// that the damage loses at most the records it covers, and reports the bytes skipped.
//
// Thread-safety: Add and Sync are thread-safe.
#ifndef KVENGINE_DB_TOMBSTONE_LOG_H_
#define KVENGINE_DB_TOMBSTONE_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/env.h"
#include "util/mutex.h"

namespace kvengine {

class TombstoneLog {
 public:
  struct Record {
    std::string key;
    uint64_t version = 0;
    uint64_t bucket = 0;
  };

  // What reading a log skipped.
  struct ReadReport {
    uint64_t torn_bytes = 0;     // past the last valid record: a torn tail (normal)
    uint64_t damaged_bytes = 0;  // in bad stretches followed by valid records (damage)
    uint64_t damaged_stretches = 0;
  };

  static constexpr const char* kFileName = "TOMBSTONES";

  // Reads every valid record of the log in `dir` (none when there is no log).  Fails
  // (naming the file) when the file is not a tombstone log of a known format version.
  static Status Read(Env* env, const std::string& dir, std::vector<Record>* records,
                     ReadReport* report);
  // As above; *torn_bytes counts every byte skipped, damaged or torn.
  static Status Read(Env* env, const std::string& dir, std::vector<Record>* records,
                     uint64_t* torn_bytes);
  // Parses a whole log image (header included); `path` names it in errors.
  static Status Parse(std::string_view image, const std::string& path, std::vector<Record>* records,
                      ReadReport* report);

  // Replaces the log in `dir` by one holding exactly `records` (written to a temporary
  // name, synced, renamed, directory synced), and opens it for appending.
  static Status Create(Env* env, const std::string& dir, const std::vector<Record>& records,
                       std::unique_ptr<TombstoneLog>* result);

  // Buffers one record; it becomes durable at the next Sync.
  void Add(const Record& record);
  // Writes the buffered records and syncs the file.
  Status Sync();
  // Atomically replaces the whole log by `records` (and drops what is buffered: the
  // caller passes every record that must survive).
  Status Rewrite(const std::vector<Record>& records);

 private:
  TombstoneLog(Env* env, std::string dir) : env_(env), dir_(std::move(dir)) {}
  static void Encode(const Record& record, std::string* out);
  // Decodes the record starting at in[pos] into *record and stores its encoded size in
  // *length; false when no valid record starts there.
  static bool DecodeAt(std::string_view in, size_t pos, Record* record, size_t* length);
  Status OpenLocked(const std::vector<Record>& records) REQUIRES(mu_);

  Env* const env_;
  const std::string dir_;
  Mutex mu_;
  std::unique_ptr<WritableFile> file_ GUARDED_BY(mu_);
  std::string pending_ GUARDED_BY(mu_);
};

}  // namespace kvengine

#endif  // KVENGINE_DB_TOMBSTONE_LOG_H_
