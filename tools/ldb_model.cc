#include "tools/ldb_model.h"

#include <algorithm>
#include <cstdio>
#include <list>

#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {
namespace ldb {

namespace {

constexpr const char kIdentityFile[] = "IDENTITY";
constexpr const char kQuarantineDir[] = "quarantine";

// Bucket files kv_ldb keeps open at once: a DB may hold more buckets than the process
// may open descriptors, so files are opened when a value is read and the least recently
// read closed first.
constexpr size_t kMaxOpenFiles = 64;

// The open bucket files, by path, most recently read first.  kv_ldb is single-threaded.
class OpenFiles {
 public:
  static OpenFiles& Instance() {
    static OpenFiles files;
    return files;
  }
  Status Get(Env* env, const std::string& path, const RandomAccessFile** file) {
    for (auto it = files_.begin(); it != files_.end(); ++it) {
      if (it->first != path) continue;
      files_.splice(files_.begin(), files_, it);
      *file = files_.front().second.get();
      return Status::OK();
    }
    std::unique_ptr<RandomAccessFile> f;
    Status s = env->NewRandomAccessFile(path, FileOptions(), &f);
    if (IsTooManyOpenFiles(s)) {  // a lower descriptor limit than kMaxOpenFiles allows
      files_.clear();
      s = env->NewRandomAccessFile(path, FileOptions(), &f);
    }
    if (!s.ok()) return s;
    if (files_.size() >= kMaxOpenFiles) files_.pop_back();
    files_.emplace_front(path, std::move(f));
    *file = files_.front().second.get();
    return Status::OK();
  }

 private:
  std::list<std::pair<std::string, std::unique_ptr<RandomAccessFile>>> files_;
};

std::string VersionKey(std::string_view key, uint64_t version) {
  std::string k(key);
  PutFixed64(&k, version);
  return k;
}

// Reads exactly n bytes at offset, or fails.
Status ReadExactly(const RandomAccessFile& file, uint64_t offset, size_t n, std::string* out) {
  out->assign(n, '\0');
  size_t got = 0;
  Status s = file.Read(offset, n, out->data(), &got);
  if (!s.ok()) return s;
  if (got != n) {
    return Status::Corruption("short read: " + std::to_string(got) + " of " + std::to_string(n) +
                              " bytes at offset " + std::to_string(offset));
  }
  return Status::OK();
}

}  // namespace

const char* EntryStateName(EntryState state) {
  switch (state) {
    case EntryState::kLive:
      return "live";
    case EntryState::kTombstoned:
      return "tombstoned";
    case EntryState::kSuperseded:
      return "superseded";
    case EntryState::kDuplicate:
      return "duplicate";
  }
  return "?";
}

BucketFileParts InspectBucketFile(Env* env, const std::string& path) {
  BucketFileParts parts;
  const Status skipped = Status::Aborted("not decoded (an earlier part failed)");
  parts.header_status = parts.footer_status = parts.index_status = skipped;
  std::unique_ptr<RandomAccessFile> file;
  parts.file_status = env->NewRandomAccessFile(path, FileOptions(), &file);
  if (!parts.file_status.ok()) return parts;
  parts.file_size = file->Size();
  const uint64_t size = parts.file_size;

  std::string block;
  if (size < kBucketHeaderSize) {
    parts.header_status = Status::Corruption("file of " + std::to_string(size) +
                                             " bytes is shorter than a bucket header");
  } else {
    parts.header_status = ReadExactly(*file, 0, kBucketHeaderSize, &block);
    if (parts.header_status.ok()) parts.header_status = parts.header.DecodeFrom(block);
  }

  if (size < kBucketHeaderSize + kBucketFooterSize) {
    parts.footer_status = Status::Corruption("file too short to hold a footer");
    return parts;
  }
  parts.footer_status = ReadExactly(*file, size - kBucketFooterSize, kBucketFooterSize, &block);
  if (parts.footer_status.ok()) parts.footer_status = parts.footer.DecodeFrom(block);
  if (!parts.footer_status.ok()) return parts;

  const BucketFooter& f = parts.footer;
  if (f.index_offset < kBucketHeaderSize || f.index_size > size ||
      f.index_offset > size - kBucketFooterSize - f.index_size) {
    parts.index_status =
        Status::Corruption("index block out of range (offset " + std::to_string(f.index_offset) +
                           ", size " + std::to_string(f.index_size) + ")");
    return parts;
  }
  parts.index_status = ReadExactly(*file, f.index_offset, f.index_size, &block);
  if (parts.index_status.ok()) {
    parts.index_status = DecodeBucketIndex(f.format_version, block, f.index_offset, &parts.entries);
  }
  if (parts.index_status.ok() && parts.entries.size() != f.entry_count) {
    parts.index_status =
        Status::Corruption("index holds " + std::to_string(parts.entries.size()) +
                           " entries, footer says " + std::to_string(f.entry_count));
  }
  return parts;
}

Status DbModel::Load(Env* env, const std::string& dir, std::unique_ptr<DbModel>* result) {
  result->reset();
  std::vector<std::string> names;
  Status s = env->GetChildren(dir, &names);
  if (!s.ok()) return Status::InvalidArgument("cannot read DB directory " + dir, s.ToString());
  std::unique_ptr<DbModel> model(new DbModel());
  model->dir_ = dir;
  std::sort(names.begin(), names.end());
  bool identity = false;
  std::vector<std::pair<uint64_t, std::string>> files;  // (id, path), DB's then quarantine's
  for (const std::string& name : names) {
    uint64_t id;
    if (name == kIdentityFile) identity = true;
    if (name.size() > 4 && name.ends_with(".tmp")) model->temp_files_.push_back(name);
    if (ParseBucketFileName(name, &id)) {
      files.emplace_back(id, name);
    } else if (LooksLikeBucketFileName(name)) {
      model->stray_files_.push_back(name);
    }
  }
  std::sort(files.begin(), files.end());
  if (!identity && files.empty()) {
    return Status::InvalidArgument(dir + " is not a kvengine DB", "no IDENTITY file, no buckets");
  }

  auto add_bucket = [&](uint64_t id, const std::string& name, bool quarantined) {
    auto b = std::make_unique<BucketModel>();
    b->id = id;
    b->name = name;
    b->quarantined = quarantined;
    b->path = dir + "/" + (quarantined ? std::string(kQuarantineDir) + "/" : "") + name;
    env->GetFileSize(b->path, &b->file_size);
    b->status = BucketReader::Open(env, b->path, FileOptions(), &b->reader);
    if (b->status.ok() && b->reader->header().bucket_id != id) {
      b->status = Status::Corruption("header names bucket " +
                                     std::to_string(b->reader->header().bucket_id));
      b->reader.reset();
    }
    // Its index is in memory; values are read through OpenFiles when asked for.
    if (b->reader != nullptr) b->reader->TakeFile();
    model->buckets_.push_back(std::move(b));
  };
  for (const auto& [id, name] : files) add_bucket(id, name, false);
  std::vector<std::string> quarantined;
  if (env->GetChildren(dir + "/" + kQuarantineDir, &quarantined).ok()) {
    std::sort(quarantined.begin(), quarantined.end());
    for (const std::string& name : quarantined) {
      uint64_t id;
      if (ParseBucketFileName(name, &id)) add_bucket(id, name, true);
    }
  }

  model->has_tombstone_log_ = env->FileExists(dir + "/" + TombstoneLog::kFileName);
  model->tombstone_status_ = TombstoneLog::Read(env, dir, &model->tombstones_, &model->log_report_);
  if (!model->tombstone_status_.ok()) model->tombstones_.clear();
  model->Replay();
  *result = std::move(model);
  return Status::OK();
}

void DbModel::Replay() {
  std::unordered_map<std::string, bool> dead;  // (key, version) with a tombstone
  for (const auto& r : tombstones_) dead.emplace(VersionKey(r.key, r.version), true);

  // The current holder of each key: bucket and entry index.
  struct Holder {
    BucketModel* bucket;
    size_t index;
  };
  std::unordered_map<std::string, Holder> current;
  for (auto& bp : buckets_) {
    BucketModel* b = bp.get();
    if (b->quarantined || !b->ok()) continue;
    const std::vector<BucketEntry>& entries = b->reader->entries();
    b->entry_states.assign(entries.size(), EntryState::kLive);
    for (size_t i = 0; i < entries.size(); i++) {
      const BucketEntry& e = entries[i];
      versions_[VersionKey(e.key, e.version)].push_back(b->id);
      b->keys++;
      b->total_bytes += e.size;
      if (dead.count(VersionKey(e.key, e.version)) != 0) {
        b->deleted_bytes += e.size;
        b->entry_states[i] = EntryState::kTombstoned;
        continue;
      }
      auto it = current.find(e.key);
      if (it == current.end()) {
        current.emplace(e.key, Holder{b, i});
        b->live_keys++;
        continue;
      }
      Holder& cur = it->second;
      const BucketEntry& ce = cur.bucket->reader->entries()[cur.index];
      if (e.version < ce.version) {
        b->deleted_bytes += e.size;
        b->entry_states[i] = EntryState::kSuperseded;
        continue;
      }
      cur.bucket->deleted_bytes += ce.size;
      cur.bucket->live_keys--;
      cur.bucket->entry_states[cur.index] =
          e.version > ce.version ? EntryState::kSuperseded : EntryState::kDuplicate;
      cur = Holder{b, i};
      b->live_keys++;
    }
  }
  for (auto& bp : buckets_) bp->live_bytes = bp->total_bytes - bp->deleted_bytes;
  for (const auto& [key, h] : current) {
    live_.emplace(key, KeyLocation{h.bucket, &h.bucket->reader->entries()[h.index]});
  }
}

const BucketModel* DbModel::FindBucket(uint64_t id) const {
  for (const auto& b : buckets_) {
    if (!b->quarantined && b->id == id) return b.get();
  }
  return nullptr;
}

bool DbModel::TombstoneCovers(const TombstoneLog::Record& record) const {
  return versions_.count(VersionKey(record.key, record.version)) != 0;
}

Status ReadValue(Env* env, const BucketReader& reader, const BucketEntry& entry, std::string* value,
                 bool* checksum_ok) {
  *checksum_ok = false;
  value->assign(entry.size, '\0');
  MutableSlice dest(value->data(), value->size());
  ValueRead read;
  read.offset = entry.offset;
  read.size = entry.size;
  read.checksum = entry.checksum;
  read.key = entry.key;
  read.dest = std::span<const MutableSlice>(&dest, 1);
  const RandomAccessFile* file = nullptr;
  Status s = OpenFiles::Instance().Get(env, reader.path(), &file);
  if (!s.ok()) return s;
  reader.ReadValues(env, *file, std::span<ValueRead>(&read, 1), /*verify=*/false);
  if (!read.status.ok()) return read.status;
  *checksum_ok = BucketEntryChecksum(reader.header().format_version, entry.key, value->data(),
                                     value->size()) == entry.checksum;
  return Status::OK();
}

bool IsReclaimed(EntryState state, uint64_t offset, const std::string& value, bool checksum_ok) {
  if (checksum_ok || state == EntryState::kLive || state == EntryState::kDuplicate) return false;
  // A hole frees whole 4 KiB blocks; a packed value may share its first and last blocks
  // with values still live (or dead, not yet punched).  Some block of it reading as zeros
  // is the mark of a hole.
  for (uint64_t pos = 0; pos < value.size();) {
    const uint64_t block_end =
        (offset + pos) / kBucketAlignment * kBucketAlignment + kBucketAlignment - offset;
    const uint64_t end = std::min<uint64_t>(block_end, value.size());
    if (std::all_of(value.begin() + pos, value.begin() + end, [](char c) { return c == 0; })) {
      return true;
    }
    pos = end;
  }
  return false;
}

std::string PrintableKey(std::string_view key) {
  std::string out = "'";
  for (unsigned char c : key) {
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  out.push_back('\'');
  return out;
}

std::string HexPreview(std::string_view bytes, size_t limit) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(bytes.size(), limit);
  out.reserve(2 * n + 3);
  for (size_t i = 0; i < n; i++) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  if (n < bytes.size()) out += "...";
  return out;
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace ldb
}  // namespace kvengine
