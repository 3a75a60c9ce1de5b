// An offline model of a kvengine DB directory, for kv_ldb.
//
// The model is built by reading the files directly (bucket files through table/, the
// tombstone log through db/tombstone_log), never through DB::Open, so that it works on a
// damaged DB and never modifies anything.  It replays the buckets and the tombstones the
// way SSD recovery does (db/ssd_recovery.cc):
//   - a bucket file that fails to open (header, footer, index checksums) or whose header
//     names another bucket is "corrupt" and takes no part in the replay;
//   - an entry whose (key, version) has a tombstone is dead ("tombstoned");
//   - otherwise the highest version of a key wins; an older one is dead ("superseded");
//     two copies of one version (a crash in a compaction) keep the higher bucket's.
// Files in quarantine/ are listed but are not part of the DB; nor are files named like
// buckets but not exactly as the DB names them (stray_files()).
//
// Thread-safety: none; kv_ldb is single-threaded.
#ifndef KVENGINE_TOOLS_LDB_MODEL_H_
#define KVENGINE_TOOLS_LDB_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "db/tombstone_log.h"
#include "kvengine/env.h"
#include "kvengine/status.h"
#include "table/bucket_format.h"
#include "table/bucket_reader.h"

namespace kvengine {
namespace ldb {

// What a bucket file's parts decode to, each part on its own, so that a damaged file
// can still be described (dump_bucket on a corrupt file).
struct BucketFileParts {
  uint64_t file_size = 0;
  Status file_status;  // opening / size of the file
  Status header_status;
  BucketHeader header;
  Status footer_status;
  BucketFooter footer;
  Status index_status;
  std::vector<BucketEntry> entries;
};

// Decodes header, footer and index independently.  Never fails: every problem is
// recorded in the part's status.
BucketFileParts InspectBucketFile(Env* env, const std::string& path);

// The fate of one index entry in the replay.
enum class EntryState { kLive, kTombstoned, kSuperseded, kDuplicate };
const char* EntryStateName(EntryState state);

struct BucketModel {
  uint64_t id = 0;
  std::string name;  // file name
  std::string path;
  bool quarantined = false;  // lies in quarantine/: not part of the DB
  uint64_t file_size = 0;
  Status status;                         // OK, or why the file is unusable (corrupt, unreadable)
  std::unique_ptr<BucketReader> reader;  // set when status is OK
  // Filled by the replay (only for usable, non-quarantined buckets):
  uint64_t keys = 0, live_keys = 0;
  uint64_t total_bytes = 0, live_bytes = 0, deleted_bytes = 0;
  std::vector<EntryState> entry_states;  // parallel to reader->entries()

  bool ok() const { return status.ok(); }
  double deleted_ratio() const {
    return total_bytes == 0 ? 0.0 : static_cast<double>(deleted_bytes) / total_bytes;
  }
};

// Where a live key's value is.
struct KeyLocation {
  const BucketModel* bucket = nullptr;
  const BucketEntry* entry = nullptr;
};

class DbModel {
 public:
  // Loads the model of the DB in `dir`.  Fails (without a model) only when the
  // directory cannot be listed or does not look like a kvengine DB (no IDENTITY and no
  // bucket files).  Damaged files are part of the model, with their status.
  static Status Load(Env* env, const std::string& dir, std::unique_ptr<DbModel>* result);

  const std::string& dir() const { return dir_; }
  // Every bucket file: the DB's in id order, then the quarantined ones.
  const std::vector<std::unique_ptr<BucketModel>>& buckets() const { return buckets_; }
  const BucketModel* FindBucket(uint64_t id) const;  // not quarantined; nullptr if none

  const std::vector<TombstoneLog::Record>& tombstones() const { return tombstones_; }
  const Status& tombstone_status() const { return tombstone_status_; }
  uint64_t torn_tombstone_bytes() const { return log_report_.torn_bytes; }
  // Bad stretches before valid records: damage (the deletes there are lost).
  uint64_t damaged_tombstone_bytes() const { return log_report_.damaged_bytes; }
  uint64_t damaged_tombstone_stretches() const { return log_report_.damaged_stretches; }
  // The log holds less than its guard says (TOMBSTONES.guard): Open will drop every value
  // a lost delete may have covered.  Why, when so.
  bool tombstone_log_lost() const { return log_report_.lost; }
  const std::string& tombstone_log_lost_why() const { return log_report_.lost_why; }
  bool has_tombstone_log() const { return has_tombstone_log_; }
  // Whether a usable bucket of the DB still holds (key, version).
  bool TombstoneCovers(const TombstoneLog::Record& record) const;

  // The live keys, ordered by key.
  const std::map<std::string, KeyLocation>& live() const { return live_; }

  // Names of files left by an interrupted write ("*.tmp").
  const std::vector<std::string>& temp_files() const { return temp_files_; }
  // Names shaped like bucket files but not spelled as the DB names one ("bucket-12.kvb"):
  // not part of the DB; recovery moves them to quarantine/.
  const std::vector<std::string>& stray_files() const { return stray_files_; }

 private:
  DbModel() = default;
  void Replay();

  std::string dir_;
  std::vector<std::unique_ptr<BucketModel>> buckets_;
  std::vector<TombstoneLog::Record> tombstones_;
  Status tombstone_status_;
  TombstoneLog::ReadReport log_report_;
  bool has_tombstone_log_ = false;
  std::map<std::string, KeyLocation> live_;
  // (key, version) -> buckets holding it, for TombstoneCovers.
  std::unordered_map<std::string, std::vector<uint64_t>> versions_;
  std::vector<std::string> temp_files_;
  std::vector<std::string> stray_files_;
};

// Reads one value whole into *value (without checksum verification) and stores in
// *checksum_ok whether it matches the index's checksum.  Non-OK when it cannot be read.
Status ReadValue(Env* env, const BucketReader& reader, const BucketEntry& entry, std::string* value,
                 bool* checksum_ok);
// True for what a dead value at `offset` reads as once the GC has punched a hole over
// it: zeros over the 4 KiB blocks punched (all of them, or those it did not share with a
// live value), which its checksum does not match.  Such a value is reclaimed, not
// damaged.
bool IsReclaimed(EntryState state, uint64_t offset, const std::string& value, bool checksum_ok);

// 'key' with bytes outside printable ASCII (and ' and \) written as \xNN.
std::string PrintableKey(std::string_view key);
// Lower-case hex of the first `limit` bytes ("..." appended when cut).
std::string HexPreview(std::string_view bytes, size_t limit);
// A JSON string literal (bytes outside printable ASCII as \u00NN).
std::string JsonString(std::string_view s);

}  // namespace ldb
}  // namespace kvengine

#endif  // KVENGINE_TOOLS_LDB_MODEL_H_
