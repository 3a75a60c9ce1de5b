// TombstoneLog: the durable record of deleted (or superseded) SSD values.
//
// A tombstone (key, version, bucket) says "the value of `key` written with `version` is
// dead", wherever a copy of it lies (compaction may have copied it into another bucket
// before the delete won).  `bucket` names the bucket whose lifetime bounds the
// tombstone's: once no bucket that may hold (key, version) is left, the tombstone is
// dropped when the log is rewritten.
//
// File format (docs/tombstone_log.md): a 24-byte header (magic, format version 2, the
// log's generation), then records of [payload length: fixed32][payload][XXH3-64 of
// payload: fixed64], payload = [key length: varint][key][version: fixed64][bucket:
// fixed64].  Format 1 (16-byte header, no generation) is still read.
//
// What the log must hold is kept outside it, in its guard (db/tombstone_guard.h): each
// Sync appends the log's generation, synced length, their XXH3 and the highest version
// named.  Every rewrite starts a new generation.
//
// Reading: an incomplete or bad record with no valid record after it is a torn tail (a
// crash while appending: it loses at most the records not yet synced).  A bad record
// followed by valid ones is damage: reading resynchronises at the next valid record, so
// that the damage loses at most the records it covers, and reports the bytes skipped.
// Then the log is checked against its guard: a log shorter than the guard says, of
// another generation, missing, or damaged has lost deletes, and ReadReport says which
// versions they may have covered (ReadReport::lost_through_version); the caller must not
// serve those values.
//
// Thread-safety: Add and Sync are thread-safe.
#ifndef KVENGINE_DB_TOMBSTONE_LOG_H_
#define KVENGINE_DB_TOMBSTONE_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "db/tombstone_guard.h"
#include "kvengine/env.h"
#include "util/hash.h"
#include "util/mutex.h"

namespace kvengine {

class TombstoneLog {
 public:
  struct Record {
    std::string key;
    uint64_t version = 0;
    uint64_t bucket = 0;
  };

  // The highest version there is: "every version" in ReadReport::lost_through_version.
  static constexpr uint64_t kAllVersions = UINT64_MAX;

  // What reading a log skipped, and whether it holds what its guard says.
  struct ReadReport {
    uint64_t torn_bytes = 0;     // past the last valid record: a torn tail (normal)
    uint64_t damaged_bytes = 0;  // in bad stretches followed by valid records (damage)
    uint64_t damaged_stretches = 0;
    uint64_t damage_end = 0;  // the offset where the last damaged stretch ends
    bool log_exists = false;
    uint32_t format_version = 0;  // the log's (0: no log, or too short to say)
    uint64_t generation = 0;      // the log's (0: format 1, or no log)
    bool guard_exists = false;
    // Records lost beyond what a crash may lose: the log is shorter than its guard says,
    // of another generation, missing, damaged, or its guard is.  Every value of version
    // lost_through_version or lower may have lost its delete (kAllVersions: any).
    bool lost = false;
    uint64_t lost_through_version = 0;
    std::string lost_why;
    // For Create: the generation the rewritten log takes, and the guard states that vouch
    // for the log on disk (kept until the new one is renamed into place; none when lost).
    uint64_t next_generation = 1;
    std::vector<TombstoneGuard::State> vouched;
  };

  static constexpr const char* kFileName = "TOMBSTONES";

  // Reads every valid record of the log in `dir` (none when there is no log), and checks
  // the log against its guard (*report).  Fails (naming the file) when the file is not a
  // tombstone log of a known format version.
  static Status Read(Env* env, const std::string& dir, std::vector<Record>* records,
                     ReadReport* report);
  // As above; *torn_bytes counts every byte skipped, damaged or torn.
  static Status Read(Env* env, const std::string& dir, std::vector<Record>* records,
                     uint64_t* torn_bytes);
  // Parses a whole log image (header included); `path` names it in errors.  Does not
  // look at the guard.
  static Status Parse(std::string_view image, const std::string& path, std::vector<Record>* records,
                      ReadReport* report);
  // Checks a parsed log image (`report` from Parse, `exists`: whether there was a file)
  // against the guard's contents: sets the report's lost*, next_generation and vouched.
  static void CheckAgainstGuard(std::string_view image, bool exists,
                                const TombstoneGuard::Contents& guard, ReadReport* report);

  // Replaces the log in `dir` by one holding exactly `records` (written to a temporary
  // name, synced, renamed, directory synced), with a new guard, and opens it for
  // appending.  `from`: the ReadReport of the log on disk (its generation and the guard
  // states that vouch for it, kept until the rename); null for a new log.
  static Status Create(Env* env, const std::string& dir, const std::vector<Record>& records,
                       std::unique_ptr<TombstoneLog>* result, const ReadReport* from = nullptr);

  // Buffers one record; it becomes durable at the next Sync.
  void Add(const Record& record);
  // Writes the buffered records, syncs the file, and records in the guard what it holds
  // now.  Does nothing when nothing was added since the last Sync.
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
  // Writes a new generation holding `records` and renames it into place; the guard
  // vouches for `vouched` (the log on disk) and the new log until the rename is done.
  Status OpenLocked(const std::vector<Record>& records,
                    const std::vector<TombstoneGuard::State>& vouched) REQUIRES(mu_);
  // What the file holds now, as the guard records it.
  TombstoneGuard::State StateLocked() const REQUIRES(mu_);
  // Records StateLocked() in the guard (a new guard file when it has grown, or when the
  // last append failed and may have left a partial record).
  Status GuardLocked() REQUIRES(mu_);

  Env* const env_;
  const std::string dir_;
  Mutex mu_;
  std::unique_ptr<WritableFile> file_ GUARDED_BY(mu_);
  std::string pending_ GUARDED_BY(mu_);
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  uint64_t size_ GUARDED_BY(mu_) = 0;  // bytes in the file
  std::unique_ptr<Hasher64> hash_ GUARDED_BY(mu_);  // of those bytes
  uint64_t max_version_ GUARDED_BY(mu_) = 0;  // of every record written or pending
  std::unique_ptr<TombstoneGuard> guard_ GUARDED_BY(mu_);  // null after a failed append
  uint64_t guarded_length_ GUARDED_BY(mu_) = 0;  // what the guard's last State says
};

}  // namespace kvengine

#endif  // KVENGINE_DB_TOMBSTONE_LOG_H_
