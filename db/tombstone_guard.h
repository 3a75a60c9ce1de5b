// TombstoneGuard: what the tombstone log must hold, kept outside the log.
//
// A tombstone log can lose records in ways its own checksums cannot see: truncated at a
// record boundary, removed, replaced by an older copy, a damaged last record that reads
// as a torn tail.  Each lost record is a delete that would come undone.  So every time
// the log is synced, its writer appends to TOMBSTONES.guard a State: the log's
// generation (one per rewrite), how many bytes of it are synced, their XXH3, and the
// highest version any record in them names.  At Open the log is checked against the
// newest State (db/tombstone_log.cc, Check); a log that holds less than it says makes
// every value a lost record could have deleted (version <= max_version) unreadable.
//
// File format (docs/tombstone_log.md): a 16-byte header (magic, format version), then
// 64-byte records: generation, length, hash, max_version, three zero fixed64, XXH3-64
// of the 56 bytes before it.  A last record of all zeros is an append a crash left
// unwritten (the previous State holds); any other bad record, or a record cut short (one
// write of 64 bytes never leaves part of one), is damage, and a damaged guard cannot
// vouch for the log.
//
// Thread-safety: none; the tombstone log calls it under its own mutex.
#ifndef KVENGINE_DB_TOMBSTONE_GUARD_H_
#define KVENGINE_DB_TOMBSTONE_GUARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvengine/env.h"

namespace kvengine {

class TombstoneGuard {
 public:
  struct State {
    uint64_t generation = 0;   // the log's (0: a format-1 log, which has none, or no log)
    uint64_t length = 0;       // bytes of the log synced, its header included
    uint64_t hash = 0;         // XXH3-64 of those bytes
    uint64_t max_version = 0;  // the highest version a record in them names
  };

  // What Read found.
  struct Contents {
    bool exists = false;
    bool damaged = false;       // a bad header or a bad record before the end
    std::string damage;         // what, when damaged
    std::vector<State> states;  // the valid records, oldest first
  };

  static constexpr const char* kFileName = "TOMBSTONES.guard";

  // Reads the guard in `dir` (Contents::exists false when there is none).  Fails only on
  // an I/O error.
  static Status Read(Env* env, const std::string& dir, Contents* contents);

  // Replaces the guard in `dir` by one holding `states` (temporary name, sync, rename,
  // directory sync) and opens it for appending.
  static Status Create(Env* env, const std::string& dir, const std::vector<State>& states,
                       std::unique_ptr<TombstoneGuard>* result);

  // Appends one State and syncs it.
  Status Append(const State& state);

  // Bytes in the file (it is replaced by Create when it grows large).
  uint64_t size() const { return size_; }

 private:
  explicit TombstoneGuard(std::unique_ptr<WritableFile> file, uint64_t size)
      : file_(std::move(file)), size_(size) {}
  static void Encode(const State& state, std::string* out);

  std::unique_ptr<WritableFile> file_;
  uint64_t size_;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_TOMBSTONE_GUARD_H_
