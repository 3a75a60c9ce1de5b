#include "namespaces/namespace_registry.h"

#include <algorithm>
#include <memory>
#include <set>
#include <tuple>

#include "util/coding.h"
#include "util/hash.h"
#include "util/input_check.h"

namespace kvengine {

namespace {

// DO NOT CHANGE: part of the on-disk format (docs/namespace_format.md).
constexpr uint64_t kRegistryMagic = 0x31474552534e564bull;  // "KVNSREG1" read as bytes
// Format 2 added each record's stamp and the tombstones (state 2); format 1 is still read.
constexpr uint32_t kRegistryFormatVersion = 2;
constexpr uint32_t kFirstFormatVersion = 1;
enum RecordState : uint8_t { kLive = 0, kDropping = 1, kDropped = 2 };
constexpr size_t kHeaderSize = 8 + 4 + 4;  // magic, version, count
constexpr size_t kChecksumSize = 8;
constexpr uint32_t kMaxWeight = 1000;

uint8_t StateOf(const NamespaceRecord& r) {
  return r.dropped ? kDropped : r.info.dropping ? kDropping : kLive;
}

// Decodes one record of a file of format `version`; a message naming the problem when it
// does not parse.
bool DecodeRecord(std::string_view* in, uint32_t version, NamespaceRecord* record,
                  std::string* problem) {
  NamespaceInfo* info = &record->info;
  std::string_view name;
  uint64_t memory_quota, ssd_quota;
  uint32_t weight;
  if (!GetLengthPrefixed(in, &name) || !GetFixed64(in, &info->id) ||
      !GetFixed64(in, &memory_quota) || !GetFixed64(in, &ssd_quota) || !GetFixed32(in, &weight) ||
      in->empty()) {
    *problem = "truncated record";
    return false;
  }
  const auto state = static_cast<uint8_t>(in->front());
  in->remove_prefix(1);
  if (version >= 2 && !GetFixed64(in, &record->stamp)) {
    *problem = "truncated record";
    return false;
  }
  info->name.assign(name);
  info->options.memory_quota_bytes = memory_quota;
  info->options.ssd_quota_bytes = ssd_quota;
  info->options.weight = weight;
  info->dropping = state == kDropping;
  record->dropped = state == kDropped;
  Status s = input::CheckNamespaceName(info->name);
  if (s.ok()) s = CheckNamespaceOptions(info->options);
  if (!s.ok()) {
    *problem = s.ToString();
    return false;
  }
  if (state != kLive && state != kDropping && (state != kDropped || version < 2)) {
    *problem = "namespace '" + info->name + "' has unknown state " + std::to_string(state);
    return false;
  }
  return true;
}

// The records' names and ids are each unique, and there are no more than a registry
// holds; a message naming the first problem.
bool CheckUnique(const NamespaceRecords& records, std::string* problem) {
  std::set<std::string> names;
  std::set<uint64_t> ids;
  size_t tombstones = 0;
  for (const NamespaceRecord& r : records) {
    tombstones += r.dropped ? 1 : 0;
    if (!names.insert(r.info.name).second) {
      *problem = "namespace '" + r.info.name + "' appears twice";
      return false;
    }
    if (!ids.insert(r.info.id).second) {
      *problem = "namespace '" + r.info.name + "' repeats the id of another";
      return false;
    }
  }
  if (records.size() - tombstones > kMaxNamespaces || tombstones > kMaxNamespaceTombstones) {
    *problem = std::to_string(records.size() - tombstones) + " namespaces and " +
               std::to_string(tombstones) + " tombstones";
    return false;
  }
  return true;
}

}  // namespace

bool Supersedes(const NamespaceRecord& a, const NamespaceRecord& b) {
  if (a.stamp != b.stamp) return a.stamp > b.stamp;
  if (StateOf(a) != StateOf(b)) return StateOf(a) > StateOf(b);
  const NamespaceOptions& x = a.info.options;
  const NamespaceOptions& y = b.info.options;
  return std::tie(x.memory_quota_bytes, x.ssd_quota_bytes, x.weight) >
         std::tie(y.memory_quota_bytes, y.ssd_quota_bytes, y.weight);
}

Status CheckNamespaceOptions(const NamespaceOptions& options) {
  if (options.weight < 1 || options.weight > kMaxWeight) {
    return Status::InvalidArgument("namespace weight " + std::to_string(options.weight) +
                                   ": a weight is 1 to " + std::to_string(kMaxWeight));
  }
  return Status::OK();
}

std::string EncodeNamespaceRegistry(const NamespaceRecords& records) {
  std::string data;
  PutFixed64(&data, kRegistryMagic);
  PutFixed32(&data, kRegistryFormatVersion);
  PutFixed32(&data, static_cast<uint32_t>(records.size()));
  for (const NamespaceRecord& r : records) {
    PutLengthPrefixed(&data, r.info.name);
    PutFixed64(&data, r.info.id);
    PutFixed64(&data, r.info.options.memory_quota_bytes);
    PutFixed64(&data, r.info.options.ssd_quota_bytes);
    PutFixed32(&data, r.info.options.weight);
    data.push_back(static_cast<char>(StateOf(r)));
    PutFixed64(&data, r.stamp);
  }
  PutFixed64(&data, Hash64(data));
  return data;
}

Status DecodeNamespaceRegistry(std::string_view data, const std::string& what,
                               NamespaceRecords* records) {
  records->clear();
  const auto damaged = [&what](const std::string& problem) {
    return Status::Corruption(
        "namespace registry " + what + " is damaged: " + problem,
        "the DB refuses to open rather than guess which keys belong to which namespace; "
        "restore the file from a backup (docs/namespace_format.md)");
  };
  if (data.size() < kHeaderSize + kChecksumSize) {
    return damaged("only " + std::to_string(data.size()) + " bytes");
  }
  std::string_view in = data;
  uint64_t magic, checksum;
  uint32_t version, count;
  GetFixed64(&in, &magic);
  GetFixed32(&in, &version);
  GetFixed32(&in, &count);
  if (magic != kRegistryMagic) return damaged("bad magic");
  if (version < kFirstFormatVersion || version > kRegistryFormatVersion) {
    return damaged("format version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kFirstFormatVersion) + " to " +
                   std::to_string(kRegistryFormatVersion));
  }
  std::string_view tail = data.substr(data.size() - kChecksumSize);
  GetFixed64(&tail, &checksum);
  if (checksum != Hash64(data.substr(0, data.size() - kChecksumSize))) {
    return damaged("checksum mismatch");
  }
  if (count > kMaxNamespaces + kMaxNamespaceTombstones) {
    return damaged(std::to_string(count) + " records");
  }
  in.remove_suffix(kChecksumSize);
  NamespaceRecords parsed(count);
  std::string problem;
  for (NamespaceRecord& r : parsed) {
    if (!DecodeRecord(&in, version, &r, &problem)) return damaged(problem);
  }
  if (!in.empty()) return damaged(std::to_string(in.size()) + " bytes after the last record");
  if (!CheckUnique(parsed, &problem)) return damaged(problem);
  *records = std::move(parsed);
  return Status::OK();
}

Status LoadNamespaceRegistry(Env* env, const std::string& dir, NamespaceRecords* records) {
  records->clear();
  const std::string path = dir + "/" + kNamespaceRegistryFile;
  if (!env->FileExists(path)) return Status::OK();
  std::string data;
  Status s = ReadFileToString(env, path, &data);
  if (!s.ok()) return Status::IOError("cannot read namespace registry " + path, s.ToString());
  return DecodeNamespaceRegistry(data, path, records);
}

Status SaveNamespaceRegistry(Env* env, const std::string& dir, const NamespaceRecords& records) {
  Status s =
      ReplaceFileAtomically(env, dir, kNamespaceRegistryFile, EncodeNamespaceRegistry(records));
  if (!s.ok()) {
    return Status::IOError("cannot write namespace registry " + dir + "/" + kNamespaceRegistryFile,
                           s.ToString());
  }
  return Status::OK();
}

}  // namespace kvengine
