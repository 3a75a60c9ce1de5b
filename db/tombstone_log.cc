#include "db/tombstone_log.h"

#include <algorithm>

#include "util/coding.h"
#include "util/hash.h"
#include "util/mutex.h"

namespace kvengine {

namespace {
// DO NOT CHANGE: embedded in the log file.
constexpr uint64_t kLogMagic = 0x31424d4f5456564bull;  // "KVVTOMB1"
constexpr uint32_t kLogFormatVersion = 2;
constexpr uint32_t kLogFormatVersion1 = 1;  // 16-byte header, no generation; still read
constexpr size_t kLogHeaderSize = 24;
constexpr size_t kLogHeaderSize1 = 16;
constexpr uint32_t kMaxPayload = 1u << 24;
// A guard file past this size is replaced by one holding its last State.
constexpr uint64_t kGuardRewriteBytes = 64 << 10;

std::string Header(uint64_t generation) {
  std::string h;
  PutFixed64(&h, kLogMagic);
  PutFixed32(&h, kLogFormatVersion);
  PutFixed32(&h, 0);
  PutFixed64(&h, generation);
  return h;
}

uint64_t MaxVersion(const std::vector<TombstoneLog::Record>& records) {
  uint64_t v = 0;
  for (const TombstoneLog::Record& r : records) v = std::max(v, r.version);
  return v;
}
}  // namespace

void TombstoneLog::Encode(const Record& record, std::string* out) {
  std::string payload;
  PutLengthPrefixed(&payload, record.key);
  PutFixed64(&payload, record.version);
  PutFixed64(&payload, record.bucket);
  PutFixed32(out, static_cast<uint32_t>(payload.size()));
  out->append(payload);
  PutFixed64(out, Hash64(payload.data(), payload.size()));
}

bool TombstoneLog::DecodeAt(std::string_view in, size_t pos, Record* record, size_t* length) {
  std::string_view rec = in.substr(pos);
  uint32_t len;
  if (!GetFixed32(&rec, &len) || len > kMaxPayload || rec.size() < len + 8ull) return false;
  std::string_view payload = rec.substr(0, len);
  // The layout is checked before the checksum, so that scanning damaged bytes for the
  // next record hashes almost nothing.
  std::string_view key;
  uint64_t version, bucket;
  if (!GetLengthPrefixed(&payload, &key) || key.empty() || !GetFixed64(&payload, &version) ||
      !GetFixed64(&payload, &bucket) || !payload.empty()) {
    return false;
  }
  if (DecodeFixed64(rec.data() + len) != Hash64(rec.data(), len)) return false;
  record->key.assign(key);
  record->version = version;
  record->bucket = bucket;
  *length = 4 + len + 8;
  return true;
}

Status TombstoneLog::Parse(std::string_view in, const std::string& path,
                           std::vector<Record>* records, ReadReport* report) {
  records->clear();
  *report = ReadReport();
  if (in.size() < kLogHeaderSize1) {  // a crash while creating it: nothing was in it
    report->torn_bytes = in.size();
    return Status::OK();
  }
  if (DecodeFixed64(in.data()) != kLogMagic) {
    return Status::Corruption(path, "not a tombstone log (bad magic; see docs/tombstone_log.md)");
  }
  const uint32_t version = DecodeFixed32(in.data() + 8);
  if (version != kLogFormatVersion && version != kLogFormatVersion1) {
    return Status::NotSupported(
        path, "tombstone log format " + std::to_string(version) + " (see docs/tombstone_log.md)");
  }
  size_t pos = kLogHeaderSize1;
  report->format_version = version;
  if (version == kLogFormatVersion) {
    if (in.size() < kLogHeaderSize) {  // its header cut short: damage (written by rename)
      report->torn_bytes = in.size();
      report->format_version = 0;
      return Status::OK();
    }
    report->generation = DecodeFixed64(in.data() + 16);
    pos = kLogHeaderSize;
  }
  Record r;
  size_t length;
  while (pos < in.size()) {
    if (DecodeAt(in, pos, &r, &length)) {
      records->push_back(std::move(r));
      pos += length;
      continue;
    }
    size_t next = pos + 1;
    while (next < in.size() && !DecodeAt(in, next, &r, &length)) next++;
    if (next == in.size()) {
      report->torn_bytes = in.size() - pos;
      break;
    }
    report->damaged_bytes += next - pos;
    report->damaged_stretches++;
    report->damage_end = next;
    pos = next;
  }
  return Status::OK();
}

Status TombstoneLog::Read(Env* env, const std::string& dir, std::vector<Record>* records,
                          ReadReport* report) {
  records->clear();
  *report = ReadReport();
  const std::string path = dir + "/" + kFileName;
  TombstoneGuard::Contents guard;
  Status s = TombstoneGuard::Read(env, dir, &guard);
  if (!s.ok()) return s;
  std::string data;
  const bool exists = env->FileExists(path);
  if (exists) {
    s = ReadFileToString(env, path, &data);
    if (s.ok()) s = Parse(data, path, records, report);
    if (!s.ok()) return s;
  }
  CheckAgainstGuard(data, exists, guard, report);
  return Status::OK();
}

void TombstoneLog::CheckAgainstGuard(std::string_view image, bool exists,
                                     const TombstoneGuard::Contents& guard, ReadReport* r) {
  r->log_exists = exists;
  r->guard_exists = guard.exists;
  r->vouched.clear();
  r->next_generation = r->generation + 1;
  auto lose = [r](uint64_t through, std::string why) {
    r->lost = true;
    r->lost_through_version = std::max(r->lost_through_version, through);
    if (!r->lost_why.empty()) r->lost_why += "; ";
    r->lost_why += why;
  };
  // A damaged stretch past what the guard vouches for lost records appended after its
  // last State: no bound on what they deleted.
  auto check_damage = [&](uint64_t guarded) {
    if (r->damaged_bytes > 0 && r->damage_end > guarded) {
      lose(kAllVersions, "damaged records past its last guarded sync");
    }
  };
  if (!guard.exists) {
    // A log of format 1, or none: written before logs had guards, trusted as before.
    // (A DB with buckets but neither file is the SSD tier's to judge.)  A log too short
    // to have a header was cut: logs are written whole and renamed into place.
    if (!exists || r->format_version == 1) {
      r->vouched.push_back(TombstoneGuard::State());
      check_damage(0);
      return;
    }
    lose(kAllVersions, std::string("its guard ") + TombstoneGuard::kFileName + " is missing");
    return;
  }
  if (guard.damaged || guard.states.empty()) {
    lose(kAllVersions, std::string("its guard ") + TombstoneGuard::kFileName + " is damaged (" +
                           (guard.damaged ? guard.damage : "empty") + ")");
    return;
  }
  const std::vector<TombstoneGuard::State>& states = guard.states;
  const TombstoneGuard::State& newest = states.back();
  r->next_generation = std::max(r->generation, newest.generation) + 1;
  const TombstoneGuard::State* want = nullptr;
  if (exists && r->generation == newest.generation) {
    want = &newest;
  } else if (states.size() >= 2 && states[states.size() - 2].generation == r->generation &&
             newest.generation == r->generation + 1) {
    want = &states[states.size() - 2];  // a rewrite cut short before its rename
  }
  if (want == nullptr) {
    lose(newest.max_version,
         exists ? "it is generation " + std::to_string(r->generation) + ", its guard says " +
                      std::to_string(newest.generation) + " (an older or foreign copy)"
                : "it is missing");
    return;
  }
  if (want->generation == 0 && (!exists || r->format_version == 1)) {
    // Format 1 or none, before the first guarded rewrite: trusted as before.
    r->vouched.push_back(*want);
    check_damage(0);
    return;
  }
  if (want->generation == 0) {
    lose(kAllVersions, "it is not the log its guard vouches for (format 1 or none)");
    return;
  }
  if (image.size() < want->length) {
    lose(want->max_version, std::to_string(image.size()) + " bytes, its guard says " +
                                std::to_string(want->length) + " were synced");
    return;
  }
  if (Hash64(image.data(), want->length) != want->hash) {
    lose(want->max_version, "its first " + std::to_string(want->length) +
                                " bytes differ from what was synced (checksum)");
    return;
  }
  r->vouched.push_back(*want);
  check_damage(want->length);
}

Status TombstoneLog::Read(Env* env, const std::string& dir, std::vector<Record>* records,
                          uint64_t* torn_bytes) {
  ReadReport report;
  Status s = Read(env, dir, records, &report);
  *torn_bytes = report.torn_bytes + report.damaged_bytes;
  return s;
}

Status TombstoneLog::Create(Env* env, const std::string& dir, const std::vector<Record>& records,
                            std::unique_ptr<TombstoneLog>* result, const ReadReport* from) {
  result->reset();
  std::unique_ptr<TombstoneLog> log(new TombstoneLog(env, dir));
  MutexLock lock(&log->mu_);
  log->generation_ = from != nullptr ? from->next_generation - 1 : 0;
  Status s = log->OpenLocked(records, from != nullptr ? from->vouched
                                                      : std::vector<TombstoneGuard::State>());
  if (!s.ok()) return s;
  result->reset(log.release());
  return Status::OK();
}

Status TombstoneLog::OpenLocked(const std::vector<Record>& records,
                                const std::vector<TombstoneGuard::State>& vouched) {
  const std::string path = dir_ + "/" + kFileName;
  const std::string tmp = path + ".tmp";
  const uint64_t generation = generation_ + 1;
  std::string data = Header(generation);
  for (const Record& r : records) Encode(r, &data);
  std::unique_ptr<WritableFile> file;
  Status s = env_->NewWritableFile(tmp, FileOptions(), &file);
  if (s.ok()) s = file->Append(Slice(data));
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  if (!s.ok()) return s;
  const TombstoneGuard::State next{generation, data.size(), Hash64(data), MaxVersion(records)};
  // Until the rename is durable either log may be found: the guard vouches for both.  A
  // running log's guard already ends with the State of the log on disk.
  if (guard_ != nullptr) {
    s = guard_->Append(next);
  } else {
    std::vector<TombstoneGuard::State> states = vouched;
    states.push_back(next);
    s = TombstoneGuard::Create(env_, dir_, states, &guard_);
  }
  if (!s.ok()) {
    guard_.reset();
    return s;
  }
  s = env_->RenameFile(tmp, path);
  if (s.ok()) s = env_->SyncDir(dir_);
  // From here on only the new log is vouched for: an older copy put back is found.
  if (s.ok()) s = TombstoneGuard::Create(env_, dir_, {next}, &guard_);
  if (s.ok()) s = env_->NewAppendableFile(path, &file);
  if (!s.ok()) {
    guard_.reset();
    return s;
  }
  file_ = std::move(file);
  pending_.clear();
  generation_ = generation;
  size_ = data.size();
  hash_ = std::make_unique<Hasher64>();
  hash_->Update(data.data(), data.size());
  max_version_ = next.max_version;
  guarded_length_ = size_;
  return Status::OK();
}

void TombstoneLog::Add(const Record& record) {
  MutexLock lock(&mu_);
  Encode(record, &pending_);
  max_version_ = std::max(max_version_, record.version);
}

TombstoneGuard::State TombstoneLog::StateLocked() const {
  return {generation_, size_, hash_->Digest(), max_version_};
}

Status TombstoneLog::GuardLocked() {
  Status s;
  if (guard_ == nullptr || guard_->size() > kGuardRewriteBytes) {
    s = TombstoneGuard::Create(env_, dir_, {StateLocked()}, &guard_);
  } else {
    s = guard_->Append(StateLocked());
  }
  if (!s.ok()) {
    guard_.reset();  // a partial record may be left: the next Sync starts a new file
    return s;
  }
  guarded_length_ = size_;
  return Status::OK();
}

Status TombstoneLog::Sync() {
  MutexLock lock(&mu_);
  if (file_ == nullptr) return Status::IOError("tombstone log is not open");
  if (pending_.empty() && guard_ != nullptr && guarded_length_ == size_) return Status::OK();
  if (!pending_.empty()) {
    Status s = file_->Append(Slice(pending_));
    if (!s.ok()) return s;
    hash_->Update(pending_.data(), pending_.size());
    size_ += pending_.size();
    pending_.clear();
  }
  Status s = file_->Sync();
  if (!s.ok()) return s;
  return GuardLocked();
}

Status TombstoneLog::Rewrite(const std::vector<Record>& records) {
  MutexLock lock(&mu_);
  if (file_ != nullptr) file_->Close();
  file_.reset();
  return OpenLocked(records, {});
}

}  // namespace kvengine
