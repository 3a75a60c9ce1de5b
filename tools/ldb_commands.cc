#include "tools/ldb_commands.h"

#include <gflags/gflags.h>

#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>

#include "kvengine/db.h"
#include "kvengine/env.h"
#include "kvengine/options.h"
#include "namespaces/namespace_keys.h"
#include "namespaces/namespace_registry.h"
#include "tools/ldb_model.h"
#include "util/config_parse.h"
#include "util/key_pattern.h"
#include "util/namespace_key.h"

DEFINE_string(db, "", "The DB directory (required by every command but dump_bucket --file)");
DEFINE_bool(
    read_only, false,
    "Offline commands: do not take the DB's LOCK (inspect a DB that a process has "
    "open; nothing is ever modified either way). Refused by stats, peers, compact and delete");
DEFINE_int64(bucket, -1, "dump_bucket: the id of the bucket to dump (bucket-NNNNNN.kvb)");
DEFINE_string(file, "", "dump_bucket: the path of a bucket file to dump (no --db needed)");
DEFINE_bool(values, false,
            "dump_bucket: read every value, show a hex preview and verify its checksum");
DEFINE_uint64(preview_bytes, 32, "dump_bucket --values, get: bytes of each value shown in hex");
DEFINE_string(prefix, "", "scan: only keys starting with this prefix");
DEFINE_string(regex, "",
              "scan: only keys matching this RE2 regex (the whole key, as in "
              "DeleteByRegex)");
DEFINE_uint64(limit, 0,
              "scan: print at most this many keys (0: all); explain: this many slowest "
              "requests (0: 10)");
DEFINE_string(log, "", "explain: a file of per-request accounts (JSON lines)");
DEFINE_string(key, "", "get, delete: the key (or give it as the argument after the command)");
DEFINE_bool(hex, false, "get: print the whole value as a hex dump");
DEFINE_bool(raw, false, "get: write the raw value bytes to stdout (for piping)");
DEFINE_string(out, "", "get: write the raw value bytes to this file");
DEFINE_bool(json, false,
            "list_buckets, scan, tombstones, verify, stats: print one JSON object instead of "
            "aligned text");
DEFINE_string(namespace, "",
              "scan, get: the keys of this namespace only, shown as its user sees them "
              "(\"default\": the default namespace's; unset: every key as stored, a "
              "namespace's with its 9-byte prefix)");
DEFINE_string(options, "",
              "stats, compact, delete: kvengine options for DB::Open, as name=value,... "
              "(anything Options::Set accepts)");

namespace kvengine {
namespace ldb {

namespace {

// ---------------------------------------------------------------- helpers

int Fail(const char* cmd, const std::string& msg, int code = kExitFailure) {
  std::fprintf(stderr, "kv_ldb %s: %s\n", cmd, msg.c_str());
  return code;
}

std::string Ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * r);
  return buf;
}

std::string Hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
  return buf;
}

std::string U(uint64_t v) { return std::to_string(v); }

// A DB directory checked to exist and look like a kvengine DB (so that kv_ldb never
// creates a LOCK or an IDENTITY in a stranger's directory).
Status CheckDbDir(Env* env, const std::string& dir) {
  if (dir.empty()) return Status::InvalidArgument("--db is required");
  std::vector<std::string> names;
  if (!env->FileExists(dir)) return Status::NotFound("DB directory " + dir + " does not exist");
  Status s = env->GetChildren(dir, &names);
  if (!s.ok()) return Status::IOError("cannot list " + dir, s.ToString());
  for (const std::string& name : names) {
    uint64_t id;
    if (name == "IDENTITY" || ParseBucketFileName(name, &id)) return Status::OK();
  }
  return Status::InvalidArgument(dir + " is not a kvengine DB (no IDENTITY file, no buckets)");
}

std::string BusyMessage(const std::string& dir, const Status& s) {
  return "the DB " + dir + " is in use by another process (" + s.ToString() +
         "); stop it, or inspect the DB with --read_only (offline commands only)";
}

// The DB directory for an offline command: checked, locked unless --read_only, modelled.
class OfflineDb {
 public:
  ~OfflineDb() {
    if (lock_ != nullptr) env_->UnlockFile(std::move(lock_));
  }

  // Returns 0 or the exit code (after printing why).
  int Open(const char* cmd) {
    Status s = CheckDbDir(env_, FLAGS_db);
    if (!s.ok()) return Fail(cmd, s.ToString(), s.IsInvalidArgument() ? kExitUsage : kExitFailure);
    if (!FLAGS_read_only) {
      s = env_->LockFile(FLAGS_db + "/LOCK", &lock_);
      if (s.IsBusy()) return Fail(cmd, BusyMessage(FLAGS_db, s));
      if (!s.ok()) return Fail(cmd, "cannot lock the DB: " + s.ToString());
    }
    s = DbModel::Load(env_, FLAGS_db, &model_);
    if (!s.ok()) return Fail(cmd, s.ToString());
    return kExitOk;
  }

  Env* env() const { return env_; }
  const DbModel& model() const { return *model_; }

 private:
  Env* const env_ = Env::Default();
  std::unique_ptr<FileLock> lock_;
  std::unique_ptr<DbModel> model_;
};

// The key from --key or the single argument.
bool KeyArg(const char* cmd, const std::vector<std::string>& args, std::string* key, int* code) {
  if (!FLAGS_key.empty() && !args.empty()) {
    *code = Fail(cmd, "give the key either as --key or as an argument, not both", kExitUsage);
    return false;
  }
  *key = args.empty() ? FLAGS_key : args[0];
  if (key->empty()) {
    *code = Fail(cmd, "a key is required (--key=K or an argument)", kExitUsage);
    return false;
  }
  return true;
}

// Which keys --namespace names: every key as stored (unset), or one namespace's, mapped
// as NamespaceKeys maps them (namespaces/namespace_keys.h).
class NamespaceScope {
 public:
  // Returns 0 or the exit code (after printing why): an unknown name, a damaged registry.
  int Resolve(const char* cmd, Env* env) {
    if (FLAGS_namespace.empty() || FLAGS_namespace == "default") {
      all_ = FLAGS_namespace.empty();
      return kExitOk;
    }
    NamespaceRecords records;
    Status s = LoadNamespaceRegistry(env, FLAGS_db, &records);
    if (!s.ok()) return Fail(cmd, s.ToString());
    for (const NamespaceRecord& r : records) {
      if (!r.dropped && r.info.name == FLAGS_namespace) {
        rule_ = NamespaceKeys(r.info.id, UINT64_MAX);
        all_ = false;
        return kExitOk;
      }
    }
    return Fail(cmd, "no namespace '" + FLAGS_namespace + "' in " + FLAGS_db, kExitUsage);
  }
  // The stored key of the user's `key`.
  std::string Internal(const std::string& key) const {
    return rule_.is_default() ? key : rule_.prefix() + key;
  }
  // Whether the stored key `internal` is in scope; stores the key its user sees.
  bool Contains(const std::string& internal, std::string* key) const {
    if (all_) {
      *key = internal;
      return true;
    }
    return rule_.FromInternal(internal, key);
  }

 private:
  bool all_ = true;
  NamespaceKeys rule_;  // the default namespace's unless a name was given
};

// ---------------------------------------------------------------- list_buckets

class ListBucketsCommand : public LdbCommand {
 public:
  const char* Name() const override { return "list_buckets"; }
  const char* Help() const override {
    return "list_buckets --db=DIR [--json]\n"
           "  Every bucket file: id, file, size, keys, live keys, live/deleted bytes, deleted\n"
           "  ratio and state (ok, or corrupt with the reason; quarantined files too). Live\n"
           "  and deleted are computed as recovery does: tombstones, then the highest version\n"
           "  of a key wins across buckets.";
  }
  std::vector<std::string> Flags() const override { return {"json"}; }

  int DoCommand(const std::vector<std::string>&) override {
    OfflineDb db;
    if (int rc = db.Open(Name()); rc != kExitOk) return rc;
    const DbModel& m = db.model();
    uint64_t corrupt = 0, quarantined = 0, live = 0, live_bytes = 0, deleted_bytes = 0;
    for (const auto& b : m.buckets()) {
      if (b->quarantined) {
        quarantined++;
      } else if (!b->ok()) {
        corrupt++;
      }
      live += b->live_keys;
      live_bytes += b->live_bytes;
      deleted_bytes += b->deleted_bytes;
    }
    if (FLAGS_json) {
      std::string out = "{\"db\":" + JsonString(m.dir()) + ",\"buckets\":[";
      bool first = true;
      for (const auto& b : m.buckets()) {
        if (!first) out += ",";
        first = false;
        out += "{\"id\":" + U(b->id) + ",\"file\":" + JsonString(b->name) +
               ",\"size\":" + U(b->file_size) + ",\"keys\":" + U(b->keys) +
               ",\"live_keys\":" + U(b->live_keys) + ",\"live_bytes\":" + U(b->live_bytes) +
               ",\"deleted_bytes\":" + U(b->deleted_bytes) +
               ",\"deleted_ratio\":" + std::to_string(b->deleted_ratio()) +
               ",\"state\":" + JsonString(State(*b)) +
               ",\"error\":" + (b->ok() ? "null" : JsonString(b->status.ToString())) + "}";
      }
      out += "],\"corrupt\":" + U(corrupt) + ",\"quarantined\":" + U(quarantined) +
             ",\"live_keys\":" + U(live) + ",\"live_bytes\":" + U(live_bytes) +
             ",\"deleted_bytes\":" + U(deleted_bytes) +
             ",\"tombstones\":" + U(m.tombstones().size()) +
             ",\"torn_tombstone_bytes\":" + U(m.torn_tombstone_bytes()) +
             ",\"damaged_tombstone_bytes\":" + U(m.damaged_tombstone_bytes()) + "}";
      std::printf("%s\n", out.c_str());
      return kExitOk;
    }
    std::printf("%6s  %-17s %12s %6s %6s %12s %14s %8s  %s\n", "id", "file", "size", "keys", "live",
                "live_bytes", "deleted_bytes", "deleted", "state");
    for (const auto& b : m.buckets()) {
      std::string state = State(*b);
      if (!b->ok()) state += ": " + b->status.ToString();
      const bool counted = b->ok() && !b->quarantined;
      std::printf("%6" PRIu64 "  %-17s %12" PRIu64 " %6s %6s %12s %14s %8s  %s\n", b->id,
                  b->name.c_str(), b->file_size, counted ? U(b->keys).c_str() : "-",
                  counted ? U(b->live_keys).c_str() : "-", counted ? U(b->live_bytes).c_str() : "-",
                  counted ? U(b->deleted_bytes).c_str() : "-",
                  counted ? Ratio(b->deleted_ratio()).c_str() : "-", state.c_str());
    }
    std::printf("%zu buckets (%" PRIu64 " corrupt, %" PRIu64 " quarantined), %" PRIu64
                " live keys, %s live, %s deleted; %zu tombstones",
                m.buckets().size(), corrupt, quarantined, live, FormatSize(live_bytes).c_str(),
                FormatSize(deleted_bytes).c_str(), m.tombstones().size());
    if (m.torn_tombstone_bytes() > 0) {
      std::printf(" (torn tail: %" PRIu64 " bytes)", m.torn_tombstone_bytes());
    }
    if (m.damaged_tombstone_bytes() > 0) {
      std::printf(" (tombstone log DAMAGED: %" PRIu64 " bytes)", m.damaged_tombstone_bytes());
    }
    if (!m.tombstone_status().ok()) {
      std::printf(" (tombstone log unreadable: %s)", m.tombstone_status().ToString().c_str());
    }
    std::printf("\n");
    return kExitOk;
  }

 private:
  static std::string State(const BucketModel& b) {
    if (b.quarantined) return b.ok() ? "quarantined" : "quarantined,corrupt";
    return b.ok() ? "ok" : "corrupt";
  }
};

// ---------------------------------------------------------------- dump_bucket

class DumpBucketCommand : public LdbCommand {
 public:
  const char* Name() const override { return "dump_bucket"; }
  const char* Help() const override {
    return "dump_bucket --db=DIR --bucket=N | --file=PATH [--values [--preview_bytes=N]]\n"
           "  The header, the footer and every index entry of one bucket file, as\n"
           "    'key' version:V offset:O size:S checksum:C [state]\n"
           "  (state, with --db: live, tombstoned, superseded or duplicate). --values adds a\n"
           "  hex preview of each value and its checksum verification (OK or MISMATCH). A\n"
           "  damaged file is dumped as far as it decodes; the exit code is then 1.";
  }
  std::vector<std::string> Flags() const override {
    return {"bucket", "file", "values", "preview_bytes"};
  }
  bool NeedsDb() const override { return false; }

  int DoCommand(const std::vector<std::string>&) override {
    const bool by_file = !FLAGS_file.empty();
    if (by_file == (FLAGS_bucket >= 0)) {
      return Fail(Name(), "give exactly one of --bucket=N (with --db) or --file=PATH", kExitUsage);
    }
    if (!by_file && FLAGS_db.empty()) return Fail(Name(), "--bucket needs --db", kExitUsage);
    OfflineDb db;
    const DbModel* model = nullptr;
    std::string path = FLAGS_file;
    Env* env = Env::Default();
    if (!by_file) {
      if (int rc = db.Open(Name()); rc != kExitOk) return rc;
      model = &db.model();
      const uint64_t id = static_cast<uint64_t>(FLAGS_bucket);
      path = FLAGS_db + "/" + BucketFileName(id);
      if (!env->FileExists(path)) {
        const std::string q = FLAGS_db + "/quarantine/" + BucketFileName(id);
        if (!env->FileExists(q)) {
          return Fail(Name(), "no bucket " + U(id) + " in " + FLAGS_db + " (nor in quarantine/)");
        }
        path = q;
        model = nullptr;  // not part of the DB: no live/dead states
      }
    } else if (!env->FileExists(path)) {
      return Fail(Name(), "no such file: " + path);
    }

    const BucketFileParts parts = InspectBucketFile(env, path);
    if (!parts.file_status.ok()) return Fail(Name(), parts.file_status.ToString());
    bool damaged = false;
    std::printf("file: %s\nsize: %" PRIu64 "\n", path.c_str(), parts.file_size);
    if (parts.file_size % kBucketAlignment != 0) {
      std::printf("warning: size is not a multiple of %zu (torn write?)\n", kBucketAlignment);
      damaged = true;
    }
    if (parts.header_status.ok()) {
      std::printf("header: bucket_id:%" PRIu64 " created_micros:%" PRIu64
                  " (%s) format_version:%u\n",
                  parts.header.bucket_id, parts.header.created_micros,
                  Time(parts.header.created_micros).c_str(), parts.header.format_version);
    } else {
      std::printf("header: CORRUPT: %s\n", parts.header_status.ToString().c_str());
      damaged = true;
    }
    if (parts.footer_status.ok()) {
      std::printf("footer: index_offset:%" PRIu64 " index_size:%" PRIu64 " entry_count:%" PRIu64
                  " bucket_id:%" PRIu64 "\n",
                  parts.footer.index_offset, parts.footer.index_size, parts.footer.entry_count,
                  parts.footer.bucket_id);
      if (parts.header_status.ok() && parts.header.bucket_id != parts.footer.bucket_id) {
        std::printf("warning: header and footer name different buckets\n");
        damaged = true;
      }
    } else {
      std::printf("footer: CORRUPT: %s\n", parts.footer_status.ToString().c_str());
      damaged = true;
    }
    uint64_t file_id;
    const std::string base = path.substr(path.find_last_of('/') + 1);
    if (parts.header_status.ok() && ParseBucketFileName(base, &file_id) &&
        file_id != parts.header.bucket_id) {
      std::printf("warning: file name says bucket %" PRIu64 ", header says %" PRIu64 "\n", file_id,
                  parts.header.bucket_id);
      damaged = true;
    }
    if (!parts.footer_status.ok()) {
      std::printf("index: not decoded (the footer that locates it is unusable)\n");
      return kExitFailure;
    }
    if (!parts.index_status.ok()) {
      std::printf("index: CORRUPT: %s\n", parts.index_status.ToString().c_str());
      return kExitFailure;
    }
    std::printf("index: %zu entries\n", parts.entries.size());

    // Values are read through a BucketReader (it needs a sound file).
    std::unique_ptr<BucketReader> reader;
    Status rs;
    if (FLAGS_values) rs = BucketReader::Open(env, path, FileOptions(), &reader);
    const BucketModel* bucket = nullptr;
    if (model != nullptr) bucket = model->FindBucket(static_cast<uint64_t>(FLAGS_bucket));
    uint64_t mismatches = 0;
    for (size_t i = 0; i < parts.entries.size(); i++) {
      const BucketEntry& e = parts.entries[i];
      std::string line = PrintableKey(e.key) + " version:" + U(e.version) +
                         " offset:" + U(e.offset) + " size:" + U(e.size) +
                         " checksum:" + Hex64(e.checksum);
      const bool known = bucket != nullptr && i < bucket->entry_states.size();
      if (known) line += std::string(" ") + EntryStateName(bucket->entry_states[i]);
      if (FLAGS_values) {
        if (reader == nullptr) {
          line += " value:unreadable (" + rs.ToString() + ")";
          mismatches++;
        } else {
          std::string value;
          bool ok = false;
          Status s = ReadValue(env, *reader, e, &value, &ok);
          if (!s.ok()) {
            line += " value:unreadable (" + s.ToString() + ")";
            mismatches++;
          } else {
            const bool reclaimed =
                known && IsReclaimed(bucket->entry_states[i], e.offset, value, ok);
            line += " => " + HexPreview(value, FLAGS_preview_bytes) +
                    (ok          ? " checksum:OK"
                     : reclaimed ? " reclaimed (hole punched)"
                                 : " checksum:MISMATCH");
            if (!ok && !reclaimed) mismatches++;
          }
        }
      }
      std::printf("%s\n", line.c_str());
    }
    if (FLAGS_values) {
      std::printf("values: %zu checked, %" PRIu64 " bad\n", parts.entries.size(), mismatches);
    }
    return damaged || mismatches > 0 ? kExitFailure : kExitOk;
  }

 private:
  static std::string Time(uint64_t micros) {
    const std::time_t t = static_cast<std::time_t>(micros / 1000000);
    std::tm tm;
    char buf[64];
    if (gmtime_r(&t, &tm) == nullptr || std::strftime(buf, sizeof(buf), "%F %T UTC", &tm) == 0) {
      return "?";
    }
    return buf;
  }
};

// ---------------------------------------------------------------- scan

class ScanCommand : public LdbCommand {
 public:
  const char* Name() const override { return "scan"; }
  const char* Help() const override {
    return "scan --db=DIR [--namespace=NAME] [--prefix=P] [--regex=R] [--limit=N] [--json]\n"
           "  The live keys in key order, each as\n"
           "    'key' tier:ssd bucket:B size:S version:V\n"
           "  (offline, only the SSD tier exists: the memory tier dies with its process).\n"
           "  With --namespace only that namespace's keys, as its user sees them (--prefix\n"
           "  and --regex apply to those).";
  }
  std::vector<std::string> Flags() const override {
    return {"namespace", "prefix", "regex", "limit", "json"};
  }

  int DoCommand(const std::vector<std::string>&) override {
    KeyPattern re;  // matches as DB::DeleteByRegex does
    if (!FLAGS_regex.empty()) {
      Status s = KeyPattern::Check(FLAGS_regex);
      if (s.ok()) s = re.Compile(FLAGS_regex);
      if (!s.ok()) return Fail(Name(), "bad --regex: " + s.ToString(), kExitUsage);
    }
    OfflineDb db;
    if (int rc = db.Open(Name()); rc != kExitOk) return rc;
    NamespaceScope scope;
    if (int rc = scope.Resolve(Name(), db.env()); rc != kExitOk) return rc;
    const std::string start = scope.Internal(FLAGS_prefix);
    const auto& live = db.model().live();
    auto it = start.empty() ? live.begin() : live.lower_bound(start);
    uint64_t shown = 0;
    std::string json = "{\"keys\":[";
    for (; it != live.end(); ++it) {
      if (!it->first.starts_with(start)) break;
      std::string key;
      if (!scope.Contains(it->first, &key)) continue;
      if (!FLAGS_regex.empty() && !re.Matches(key)) continue;
      if (FLAGS_limit > 0 && shown >= FLAGS_limit) break;
      const BucketEntry& e = *it->second.entry;
      if (FLAGS_json) {
        json += (shown > 0 ? "," : "") + std::string("{\"key\":") + JsonString(key) +
                ",\"tier\":\"ssd\",\"bucket\":" + U(it->second.bucket->id) +
                ",\"size\":" + U(e.size) + ",\"version\":" + U(e.version) + "}";
      } else {
        std::printf("%s tier:ssd bucket:%" PRIu64 " size:%" PRIu64 " version:%" PRIu64 "\n",
                    PrintableKey(key).c_str(), it->second.bucket->id, e.size, e.version);
      }
      shown++;
    }
    if (FLAGS_json) {
      std::printf("%s],\"count\":%" PRIu64 "}\n", json.c_str(), shown);
    } else {
      std::printf("%" PRIu64 " keys\n", shown);
    }
    return kExitOk;
  }
};

// ---------------------------------------------------------------- get

class GetCommand : public LdbCommand {
 public:
  const char* Name() const override { return "get"; }
  const char* Help() const override {
    return "get --db=DIR [--namespace=NAME] (KEY | --key=KEY) [--hex | --raw | --out=FILE]\n"
           "    [--preview_bytes=N]\n"
           "  The value of a live key, its checksum verified. By default one line of value\n"
           "  info and a hex preview; --hex a full hex dump; --raw the bytes to stdout;\n"
           "  --out=FILE the bytes to a file. Exit code 1 when the key is absent or the\n"
           "  value fails its checksum (nothing is written then). With --namespace, KEY is\n"
           "  that namespace's key.";
  }
  std::vector<std::string> Flags() const override {
    return {"namespace", "key", "hex", "raw", "out", "preview_bytes"};
  }
  size_t MaxArgs() const override { return 1; }

  int DoCommand(const std::vector<std::string>& args) override {
    std::string key;
    int code;
    if (!KeyArg(Name(), args, &key, &code)) return code;
    if (int(FLAGS_hex) + int(FLAGS_raw) + int(!FLAGS_out.empty()) > 1) {
      return Fail(Name(), "--hex, --raw and --out exclude each other", kExitUsage);
    }
    OfflineDb db;
    if (int rc = db.Open(Name()); rc != kExitOk) return rc;
    NamespaceScope scope;
    if (int rc = scope.Resolve(Name(), db.env()); rc != kExitOk) return rc;
    std::string ignored;
    if (!scope.Contains(scope.Internal(key), &ignored)) {
      return Fail(Name(), "key " + PrintableKey(key) + " is not a key of the default namespace");
    }
    auto it = db.model().live().find(scope.Internal(key));
    if (it == db.model().live().end()) {
      return Fail(Name(), "key " + PrintableKey(key) + " not found");
    }
    const BucketModel& b = *it->second.bucket;
    const BucketEntry& e = *it->second.entry;
    std::string value;
    bool ok = false;
    Status s = ReadValue(db.env(), *b.reader, e, &value, &ok);
    const std::string info = PrintableKey(key) + " tier:ssd bucket:" + U(b.id) +
                             " offset:" + U(e.offset) + " size:" + U(e.size) +
                             " version:" + U(e.version) + " checksum:" + Hex64(e.checksum);
    if (!s.ok()) return Fail(Name(), info + ": cannot read the value: " + s.ToString());
    if (!ok) return Fail(Name(), info + " MISMATCH: the value is corrupt");
    if (FLAGS_raw) {
      if (std::fwrite(value.data(), 1, value.size(), stdout) != value.size() ||
          std::fflush(stdout) != 0) {
        return Fail(Name(), "writing to stdout failed");
      }
      return kExitOk;
    }
    if (!FLAGS_out.empty()) {
      std::FILE* f = std::fopen(FLAGS_out.c_str(), "wb");
      if (f == nullptr) return Fail(Name(), "cannot create " + FLAGS_out);
      const bool written = std::fwrite(value.data(), 1, value.size(), f) == value.size();
      if (std::fclose(f) != 0 || !written) return Fail(Name(), "writing " + FLAGS_out + " failed");
      std::printf("%s OK: %" PRIu64 " bytes written to %s\n", info.c_str(), e.size,
                  FLAGS_out.c_str());
      return kExitOk;
    }
    std::printf("%s OK\n", info.c_str());
    if (FLAGS_hex) {
      HexDump(value);
    } else {
      std::printf("value: %s\n", HexPreview(value, FLAGS_preview_bytes).c_str());
    }
    return kExitOk;
  }

 private:
  // hexdump -C style: offset, 16 bytes, printable characters.
  static void HexDump(const std::string& v) {
    for (size_t off = 0; off < v.size(); off += 16) {
      std::string hex, text;
      for (size_t i = off; i < off + 16; i++) {
        if (i < v.size()) {
          const auto c = static_cast<unsigned char>(v[i]);
          char buf[4];
          std::snprintf(buf, sizeof(buf), "%02x ", c);
          hex += buf;
          text.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '.');
        } else {
          hex += "   ";
        }
        if (i == off + 7) hex += " ";
      }
      std::printf("%08zx  %s |%s|\n", off, hex.c_str(), text.c_str());
    }
  }
};

// ---------------------------------------------------------------- namespaces

class NamespacesCommand : public LdbCommand {
 public:
  const char* Name() const override { return "namespaces"; }
  const char* Help() const override {
    return "namespaces --db=DIR [--json]\n"
           "  The namespace registry (NAMESPACES: docs/namespace_format.md): each namespace's\n"
           "  name, id, quotas, weight and state (live, or dropping: a DropNamespace that did\n"
           "  not finish), and its live keys on SSD; the default namespace's, and keys of\n"
           "  namespaces the registry does not know (orphans: written by a peer, or left by a\n"
           "  lost registry). Exit code 1 when the registry is damaged.";
  }
  std::vector<std::string> Flags() const override { return {"json"}; }

  int DoCommand(const std::vector<std::string>&) override {
    OfflineDb db;
    if (int rc = db.Open(Name()); rc != kExitOk) return rc;
    NamespaceRecords stored;
    Status s = LoadNamespaceRegistry(db.env(), FLAGS_db, &stored);
    if (!s.ok()) return Fail(Name(), s.ToString());
    std::vector<NamespaceInfo> records;  // the tombstones of drops left out
    for (const NamespaceRecord& r : stored) {
      if (!r.dropped) records.push_back(r.info);
    }
    std::map<uint64_t, uint64_t> keys_by_id;
    uint64_t default_keys = 0, orphans = 0;
    for (const auto& [key, where] : db.model().live()) {
      if (ns::IsNamespaced(key) && key.size() >= ns::kPrefixSize) {
        keys_by_id[ns::IdOfKey(key)]++;
      } else if (!ns::IsNamespaced(key)) {
        default_keys++;
      } else {
        orphans++;  // too short to carry an id
      }
    }
    std::set<uint64_t> known;
    for (const NamespaceInfo& r : records) known.insert(r.id);
    for (const auto& [id, n] : keys_by_id) orphans += known.count(id) > 0 ? 0 : n;
    if (FLAGS_json) {
      std::string out = "{\"namespaces\":[";
      for (size_t i = 0; i < records.size(); i++) {
        const NamespaceInfo& r = records[i];
        out += (i > 0 ? "," : "") + std::string("{\"name\":") + JsonString(r.name) +
               ",\"id\":" + U(r.id) + ",\"memory_quota_bytes\":" + U(r.options.memory_quota_bytes) +
               ",\"ssd_quota_bytes\":" + U(r.options.ssd_quota_bytes) +
               ",\"weight\":" + U(r.options.weight) +
               ",\"dropping\":" + (r.dropping ? "true" : "false") +
               ",\"ssd_keys\":" + U(keys_by_id[r.id]) + "}";
      }
      std::printf("%s],\"default_ssd_keys\":%" PRIu64 ",\"orphan_ssd_keys\":%" PRIu64 "}\n",
                  out.c_str(), default_keys, orphans);
      return kExitOk;
    }
    std::printf("%-20s %-18s %14s %14s %6s %-8s %8s\n", "name", "id", "memory_quota", "ssd_quota",
                "weight", "state", "ssd_keys");
    std::printf("%-20s %-18s %14s %14s %6s %-8s %8" PRIu64 "\n", "default", "-", "-", "-", "1",
                "live", default_keys);
    for (const NamespaceInfo& r : records) {
      std::printf("%-20s %-18s %14" PRIu64 " %14" PRIu64 " %6u %-8s %8" PRIu64 "\n", r.name.c_str(),
                  Hex64(r.id).c_str(), r.options.memory_quota_bytes, r.options.ssd_quota_bytes,
                  r.options.weight, r.dropping ? "dropping" : "live", keys_by_id[r.id]);
    }
    std::printf("%zu namespaces besides the default; %" PRIu64 " orphan keys\n", records.size(),
                orphans);
    return kExitOk;
  }
};

// ---------------------------------------------------------------- tombstones

class TombstonesCommand : public LdbCommand {
 public:
  const char* Name() const override { return "tombstones"; }
  const char* Help() const override {
    return "tombstones --db=DIR [--json]\n"
           "  Every record of the tombstone log, as\n"
           "    'key' version:V bucket:B bucket_exists:yes|no covers:yes|no\n"
           "  (covers: a bucket of the DB still holds that key's version, so the tombstone\n"
           "  is what keeps it dead), then the bytes of a torn tail that recovery ignores\n"
           "  and of damaged stretches before valid records (their deletes are lost).";
  }
  std::vector<std::string> Flags() const override { return {"json"}; }

  int DoCommand(const std::vector<std::string>&) override {
    OfflineDb db;
    if (int rc = db.Open(Name()); rc != kExitOk) return rc;
    const DbModel& m = db.model();
    if (!m.tombstone_status().ok()) {
      return Fail(Name(), "tombstone log unreadable: " + m.tombstone_status().ToString());
    }
    uint64_t covering = 0;
    std::string json = "{\"tombstones\":[";
    bool first = true;
    for (const auto& r : m.tombstones()) {
      const bool exists = m.FindBucket(r.bucket) != nullptr;
      const bool covers = m.TombstoneCovers(r);
      covering += covers;
      if (FLAGS_json) {
        json += (first ? "" : ",") + std::string("{\"key\":") + JsonString(r.key) +
                ",\"version\":" + U(r.version) + ",\"bucket\":" + U(r.bucket) +
                ",\"bucket_exists\":" + (exists ? "true" : "false") +
                ",\"covers\":" + (covers ? "true" : "false") + "}";
        first = false;
      } else {
        std::printf("%s version:%" PRIu64 " bucket:%" PRIu64 " bucket_exists:%s covers:%s\n",
                    PrintableKey(r.key).c_str(), r.version, r.bucket, exists ? "yes" : "no",
                    covers ? "yes" : "no");
      }
    }
    if (FLAGS_json) {
      std::printf("%s],\"count\":%zu,\"covering\":%" PRIu64 ",\"torn_bytes\":%" PRIu64
                  ",\"damaged_bytes\":%" PRIu64 ",\"log_exists\":%s}\n",
                  json.c_str(), m.tombstones().size(), covering, m.torn_tombstone_bytes(),
                  m.damaged_tombstone_bytes(), m.has_tombstone_log() ? "true" : "false");
    } else {
      std::printf("%zu tombstones, %" PRIu64 " still covering a value; torn tail: %" PRIu64
                  " bytes; damaged: %" PRIu64 " bytes%s\n",
                  m.tombstones().size(), covering, m.torn_tombstone_bytes(),
                  m.damaged_tombstone_bytes(), m.has_tombstone_log() ? "" : " (no tombstone log)");
    }
    return kExitOk;
  }
};

// ---------------------------------------------------------------- verify

class VerifyCommand : public LdbCommand {
 public:
  const char* Name() const override { return "verify"; }
  const char* Help() const override {
    return "verify --db=DIR [--json]\n"
           "  Checks every bucket (header, footer, index checksums, the header's id, every\n"
           "  value's checksum) and the tombstone log. Lists each problem; exit code 1 when\n"
           "  there is any. A torn tail of the tombstone log, leftover *.tmp files,\n"
           "  quarantined buckets and files named like buckets but not as the DB names\n"
           "  them are reported as warnings (recovery handles them).";
  }
  std::vector<std::string> Flags() const override { return {"json"}; }

  int DoCommand(const std::vector<std::string>&) override {
    OfflineDb db;
    if (int rc = db.Open(Name()); rc != kExitOk) return rc;
    const DbModel& m = db.model();
    std::vector<std::string> problems, warnings;
    uint64_t buckets = 0, values = 0;
    for (const auto& b : m.buckets()) {
      if (b->quarantined) {
        warnings.push_back("quarantine/" + b->name +
                           ": quarantined by recovery, not part of the DB");
        continue;
      }
      buckets++;
      if (!b->ok()) {
        problems.push_back(b->name + ": " + b->status.ToString());
        Report(b->name + ": CORRUPT: " + b->status.ToString());
        continue;
      }
      uint64_t bad = 0;
      const auto& entries = b->reader->entries();
      for (size_t i = 0; i < entries.size(); i++) {
        const BucketEntry& e = entries[i];
        std::string value;
        bool ok = false;
        Status s = ReadValue(db.env(), *b->reader, e, &value, &ok);
        values++;
        if (s.ok() && ok) continue;
        if (s.ok() && i < b->entry_states.size() &&
            IsReclaimed(b->entry_states[i], e.offset, value, ok)) {
          continue;
        }
        bad++;
        const std::string what = b->name + ": " + PrintableKey(e.key) + " version:" + U(e.version) +
                                 " offset:" + U(e.offset) + ": " +
                                 (s.ok() ? "checksum MISMATCH" : s.ToString());
        problems.push_back(what);
        Report("  " + what);
      }
      Report(b->name + ": " + (bad == 0 ? "OK" : "CORRUPT") + " (" +
             U(b->reader->entries().size()) + " values, " + U(bad) + " bad)");
    }
    if (!m.tombstone_status().ok()) {
      problems.push_back(std::string(TombstoneLog::kFileName) + ": " +
                         m.tombstone_status().ToString());
      Report(std::string(TombstoneLog::kFileName) +
             ": CORRUPT: " + m.tombstone_status().ToString());
    } else {
      Report(std::string(TombstoneLog::kFileName) + ": OK (" + U(m.tombstones().size()) +
             " records" + (m.has_tombstone_log() ? "" : ", no log") + ")");
    }
    if (m.damaged_tombstone_bytes() > 0) {
      const std::string what =
          std::string(TombstoneLog::kFileName) + ": DAMAGED: " + U(m.damaged_tombstone_bytes()) +
          " bad bytes in " + U(m.damaged_tombstone_stretches()) +
          " places before valid records; the deletes recorded there are lost and their keys "
          "may come back (see docs/tombstone_log.md)";
      problems.push_back(what);
      Report(what);
    }
    if (m.tombstone_status().ok() && m.tombstone_log_lost()) {
      const std::string what = std::string(TombstoneLog::kFileName) +
                               ": LOST DELETES: " + m.tombstone_log_lost_why() +
                               "; the next Open drops every value they may have covered (see "
                               "docs/tombstone_log.md)";
      problems.push_back(what);
      Report(what);
    }
    if (m.torn_tombstone_bytes() > 0) {
      warnings.push_back(std::string(TombstoneLog::kFileName) + ": torn tail of " +
                         U(m.torn_tombstone_bytes()) + " bytes (ignored by recovery)");
    }
    for (const std::string& t : m.temp_files()) {
      warnings.push_back(t + ": leftover temporary file (removed by recovery)");
    }
    for (const std::string& t : m.stray_files()) {
      warnings.push_back(t +
                         ": not the name of a bucket of this DB, not part of it (recovery "
                         "moves it to quarantine/)");
    }
    if (FLAGS_json) {
      std::string out = "{\"ok\":" + std::string(problems.empty() ? "true" : "false") +
                        ",\"buckets\":" + U(buckets) + ",\"values\":" + U(values) +
                        ",\"problems\":[";
      for (size_t i = 0; i < problems.size(); i++) out += (i ? "," : "") + JsonString(problems[i]);
      out += "],\"warnings\":[";
      for (size_t i = 0; i < warnings.size(); i++) out += (i ? "," : "") + JsonString(warnings[i]);
      std::printf("%s]}\n", out.c_str());
    } else {
      for (const std::string& w : warnings) std::printf("warning: %s\n", w.c_str());
      std::printf("verify: %" PRIu64 " buckets, %" PRIu64 " values checked: %s\n", buckets, values,
                  problems.empty() ? "OK" : (U(problems.size()) + " problems").c_str());
    }
    if (!problems.empty()) {
      std::fprintf(stderr, "kv_ldb verify: %zu problems:\n", problems.size());
      for (const std::string& p : problems) std::fprintf(stderr, "  %s\n", p.c_str());
      return kExitFailure;
    }
    return kExitOk;
  }

 private:
  static void Report(const std::string& line) {
    if (!FLAGS_json) std::printf("%s\n", line.c_str());
  }
};

// ---------------------------------------------------------------- online commands

// Opens the DB with DB::Open for stats, peers, compact and delete.
class OnlineCommand : public LdbCommand {
 public:
  bool Online() const override { return true; }

 protected:
  // Returns 0 or the exit code (after printing why).
  int OpenDb(std::unique_ptr<DB>* db) {
    Env* env = Env::Default();
    Status s = CheckDbDir(env, FLAGS_db);
    if (!s.ok())
      return Fail(Name(), s.ToString(), s.IsInvalidArgument() ? kExitUsage : kExitFailure);
    Options options;
    // Defaults that keep a maintenance open small and harmless: a small arena, no
    // background GC, no eviction of buckets.  --options overrides them.
    options.create_if_missing = false;
    options.memory_capacity_bytes = 64ull << 20;
    options.memory_slab_size = 1ull << 20;
    options.prefault_memory = false;
    options.gc_interval_ms = 0;
    options.disable_ssd_eviction = true;
    std::string_view rest = FLAGS_options;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos) {
        return Fail(Name(), "--options: '" + std::string(item) + "' is not name=value", kExitUsage);
      }
      s = options.Set(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
      if (!s.ok()) return Fail(Name(), "--options: " + s.ToString(), kExitUsage);
    }
    s = DB::Open(options, FLAGS_db, db);
    if (s.IsBusy()) return Fail(Name(), BusyMessage(FLAGS_db, s));
    if (!s.ok()) return Fail(Name(), "cannot open the DB: " + s.ToString());
    return kExitOk;
  }

  int CloseDb(std::unique_ptr<DB>* db) {
    Status s = (*db)->Close();
    db->reset();
    if (!s.ok()) return Fail(Name(), "closing the DB: " + s.ToString());
    return kExitOk;
  }

  // Opens the DB, prints its property `name` and closes it; `missing` is the error when
  // the DB has no such property.
  int PrintProperty(const std::string& name, const std::string& missing) {
    std::unique_ptr<DB> db;
    if (int rc = OpenDb(&db); rc != kExitOk) return rc;
    std::string value;
    if (!db->GetProperty(name, &value)) {
      CloseDb(&db);
      return Fail(Name(), missing);
    }
    std::printf("%s%s", value.c_str(), value.ends_with('\n') ? "" : "\n");
    return CloseDb(&db);
  }
};

class StatsCommand : public OnlineCommand {
 public:
  const char* Name() const override { return "stats"; }
  const char* Help() const override {
    return "stats --db=DIR [--json] [--options=name=value,...]\n"
           "  Opens the DB (DB::Open: recovery runs, the tombstone log may be rewritten) and\n"
           "  prints the kvengine.stats property (kvengine.stats.json with --json).";
  }
  std::vector<std::string> Flags() const override { return {"json", "options"}; }

  int DoCommand(const std::vector<std::string>&) override {
    const std::string property = FLAGS_json ? "kvengine.stats.json" : "kvengine.stats";
    return PrintProperty(property, "the DB has no property " + property);
  }
};

class PeersCommand : public OnlineCommand {
 public:
  const char* Name() const override { return "peers"; }
  const char* Help() const override {
    return "peers --db=DIR [--options=name=value,...]\n"
           "  The DB's peers and cluster (the kvengine.peers property): transport, each\n"
           "  member with its endpoint and state, and with a cluster its etcd endpoints,\n"
           "  lease and the last revision seen. A DB a kv_server serves with\n"
           "  --local_listen is attached to, so this shows the server's live view; an\n"
           "  offline DB shows the view of the options given (e.g.\n"
           "  --options=cluster=etcd://127.0.0.1:2379/kv for the members etcd lists).\n"
           "  Exit code 1 when the DB has no peers configured.";
  }
  std::vector<std::string> Flags() const override { return {"options"}; }

  int DoCommand(const std::vector<std::string>&) override {
    return PrintProperty("kvengine.peers",
                         "the DB has no peers (no peers, listen or cluster option)");
  }
};

class CompactCommand : public OnlineCommand {
 public:
  const char* Name() const override { return "compact"; }
  const char* Help() const override {
    return "compact --db=DIR [--options=name=value,...]\n"
           "  Opens the DB and runs one round of SSD garbage collection (CompactBuckets):\n"
           "  buckets whose deleted ratio exceeds gc_deleted_ratio (e.g.\n"
           "  --options=gc_deleted_ratio=0 for every bucket with deleted bytes, at most\n"
           "  gc_max_buckets_per_round of them). Reports the bytes reclaimed.";
  }
  std::vector<std::string> Flags() const override { return {"options"}; }

  int DoCommand(const std::vector<std::string>&) override {
    std::unique_ptr<DB> db;
    if (int rc = OpenDb(&db); rc != kExitOk) return rc;
    uint64_t reclaimed = 0;
    Status s = db->CompactBuckets(&reclaimed);
    if (!s.ok()) {
      CloseDb(&db);
      return Fail(Name(), "CompactBuckets: " + s.ToString());
    }
    if (int rc = CloseDb(&db); rc != kExitOk) return rc;
    std::printf("compact: reclaimed %" PRIu64 " bytes (%s)\n", reclaimed,
                FormatSize(reclaimed).c_str());
    return kExitOk;
  }
};

class DeleteCommand : public OnlineCommand {
 public:
  const char* Name() const override { return "delete"; }
  const char* Help() const override {
    return "delete --db=DIR (KEY | --key=KEY) [--options=name=value,...]\n"
           "  Opens the DB, deletes the key (a durable tombstone) and flushes. Exit code 1\n"
           "  when the key is absent.";
  }
  std::vector<std::string> Flags() const override { return {"key", "options"}; }
  size_t MaxArgs() const override { return 1; }

  int DoCommand(const std::vector<std::string>& args) override {
    std::string key;
    int code;
    if (!KeyArg(Name(), args, &key, &code)) return code;
    std::unique_ptr<DB> db;
    if (int rc = OpenDb(&db); rc != kExitOk) return rc;
    Status s = db->Delete(WriteOptions(), key);
    if (s.ok()) s = db->Flush();
    const int rc = CloseDb(&db);
    if (s.IsNotFound()) return Fail(Name(), "key " + PrintableKey(key) + " not found");
    if (!s.ok()) return Fail(Name(), "delete " + PrintableKey(key) + ": " + s.ToString());
    if (rc != kExitOk) return rc;
    std::printf("deleted %s\n", PrintableKey(key).c_str());
    return kExitOk;
  }
};

}  // namespace

std::vector<std::unique_ptr<LdbCommand>> AllCommands() {
  std::vector<std::unique_ptr<LdbCommand>> c;
  c.push_back(std::make_unique<ListBucketsCommand>());
  c.push_back(std::make_unique<DumpBucketCommand>());
  c.push_back(std::make_unique<ScanCommand>());
  c.push_back(std::make_unique<GetCommand>());
  c.push_back(std::make_unique<NamespacesCommand>());
  c.push_back(std::make_unique<TombstonesCommand>());
  c.push_back(std::make_unique<VerifyCommand>());
  c.push_back(std::make_unique<StatsCommand>());
  c.push_back(std::make_unique<PeersCommand>());
  c.push_back(std::make_unique<CompactCommand>());
  c.push_back(std::make_unique<DeleteCommand>());
  c.push_back(NewExplainCommand());
  return c;
}

std::vector<std::string> AllFlagNames() {
  return {"db",     "read_only", "bucket",  "file", "values",   "preview_bytes",
          "prefix", "regex",     "limit",   "key",  "hex",      "raw",
          "out",    "json",      "options", "log",  "namespace"};
}

}  // namespace ldb
}  // namespace kvengine
