#include "db/tombstone_log.h"

#include "util/coding.h"
#include "util/hash.h"
#include "util/mutex.h"

namespace kvengine {

namespace {
// DO NOT CHANGE: embedded in the log file.
constexpr uint64_t kLogMagic = 0x31424d4f5456564bull;  // "KVVTOMB1"
constexpr uint32_t kLogFormatVersion = 1;
constexpr size_t kLogHeaderSize = 16;
constexpr uint32_t kMaxPayload = 1u << 24;

std::string Header() {
  std::string h;
  PutFixed64(&h, kLogMagic);
  PutFixed32(&h, kLogFormatVersion);
  PutFixed32(&h, 0);
  return h;
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
  if (in.size() < kLogHeaderSize) {  // a crash while creating it: nothing was in it
    report->torn_bytes = in.size();
    return Status::OK();
  }
  if (DecodeFixed64(in.data()) != kLogMagic) {
    return Status::Corruption(path, "not a tombstone log (bad magic; see docs/tombstone_log.md)");
  }
  const uint32_t version = DecodeFixed32(in.data() + 8);
  if (version != kLogFormatVersion) {
    return Status::NotSupported(
        path, "tombstone log format " + std::to_string(version) + " (see docs/tombstone_log.md)");
  }
  size_t pos = kLogHeaderSize;
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
    pos = next;
  }
  return Status::OK();
}

Status TombstoneLog::Read(Env* env, const std::string& dir, std::vector<Record>* records,
                          ReadReport* report) {
  records->clear();
  *report = ReadReport();
  const std::string path = dir + "/" + kFileName;
  if (!env->FileExists(path)) return Status::OK();
  std::unique_ptr<RandomAccessFile> file;
  Status s = env->NewRandomAccessFile(path, FileOptions(), &file);
  if (!s.ok()) return s;
  std::string data(file->Size(), '\0');
  size_t n = 0;
  s = file->Read(0, data.size(), data.data(), &n);
  if (!s.ok()) return s;
  data.resize(n);
  return Parse(data, path, records, report);
}

Status TombstoneLog::Read(Env* env, const std::string& dir, std::vector<Record>* records,
                          uint64_t* torn_bytes) {
  ReadReport report;
  Status s = Read(env, dir, records, &report);
  *torn_bytes = report.torn_bytes + report.damaged_bytes;
  return s;
}

Status TombstoneLog::Create(Env* env, const std::string& dir, const std::vector<Record>& records,
                            std::unique_ptr<TombstoneLog>* result) {
  result->reset();
  std::unique_ptr<TombstoneLog> log(new TombstoneLog(env, dir));
  MutexLock lock(&log->mu_);
  Status s = log->OpenLocked(records);
  if (!s.ok()) return s;
  result->reset(log.release());
  return Status::OK();
}

Status TombstoneLog::OpenLocked(const std::vector<Record>& records) {
  const std::string path = dir_ + "/" + kFileName;
  const std::string tmp = path + ".tmp";
  std::string data = Header();
  for (const Record& r : records) Encode(r, &data);
  std::unique_ptr<WritableFile> file;
  Status s = env_->NewWritableFile(tmp, FileOptions(), &file);
  if (s.ok()) s = file->Append(Slice(data));
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  if (s.ok()) s = env_->RenameFile(tmp, path);
  if (s.ok()) s = env_->SyncDir(dir_);
  if (s.ok()) s = env_->NewAppendableFile(path, &file);
  if (!s.ok()) return s;
  file_ = std::move(file);
  pending_.clear();
  return Status::OK();
}

void TombstoneLog::Add(const Record& record) {
  MutexLock lock(&mu_);
  Encode(record, &pending_);
}

Status TombstoneLog::Sync() {
  MutexLock lock(&mu_);
  if (file_ == nullptr) return Status::IOError("tombstone log is not open");
  if (!pending_.empty()) {
    Status s = file_->Append(Slice(pending_));
    if (!s.ok()) return s;
    pending_.clear();
  }
  return file_->Sync();
}

Status TombstoneLog::Rewrite(const std::vector<Record>& records) {
  MutexLock lock(&mu_);
  if (file_ != nullptr) file_->Close();
  file_.reset();
  return OpenLocked(records);
}

}  // namespace kvengine
