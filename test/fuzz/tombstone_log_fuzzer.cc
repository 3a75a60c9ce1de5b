// Fuzz target: TombstoneLog::Read over an arbitrary log file.
//
// The first input byte says how the log is made from the rest of the input:
//   bit 0 clear: the rest is the file, byte for byte (the seeds are real logs).  Whatever
//                Read accepts must survive being written again (Create) and read back.
//   bit 0 set:   the rest chooses records, written by the log's own writer (Create, then
//                Add and Sync), then a tear (the file cut short) and a flipped byte.  Read
//                must return the records written, in order: all of them and nothing else
//                when the damage spared them, all but the one the flip hit when the file
//                was not cut (it resynchronises at the next valid record: a bad record
//                loses only its own deletes).  After damage it may also return a phantom: a
//                record frame a damaged record's key happens to hold (MatchInOrder).
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "db/tombstone_log.h"
#include "test/fuzz/damage.h"
#include "test/fuzz/fuzz_check.h"
#include "test/fuzz/memory_env.h"

namespace kvengine {
namespace {

constexpr const char* kDir = "/fuzz";

std::string LogPath() { return std::string(kDir) + "/" + TombstoneLog::kFileName; }

bool SameRecord(const TombstoneLog::Record& a, const TombstoneLog::Record& b) {
  return a.key == b.key && a.version == b.version && a.bucket == b.bucket;
}

bool IsPrefix(const std::vector<TombstoneLog::Record>& prefix,
              const std::vector<TombstoneLog::Record>& all) {
  if (prefix.size() > all.size()) return false;
  for (size_t i = 0; i < prefix.size(); i++) {
    if (!SameRecord(prefix[i], all[i])) return false;
  }
  return true;
}

// Matches read records to written ones, in order, and returns how many matched.  A read
// record that matches none is a phantom, counted in *phantoms: resynchronising after damage,
// the reader may take a record frame that a damaged record's key bytes contain for a record
// (keys are any bytes; the fuzzer builds such keys, checksum included).
size_t MatchInOrder(const std::vector<TombstoneLog::Record>& read,
                    const std::vector<TombstoneLog::Record>& written, size_t* phantoms) {
  size_t j = 0, matched = 0;
  *phantoms = 0;
  for (const auto& r : read) {
    size_t k = j;
    while (k < written.size() && !SameRecord(r, written[k])) k++;
    if (k == written.size()) {
      (*phantoms)++;
    } else {
      matched++;
      j = k + 1;
    }
  }
  return matched;
}

std::string Describe(const std::vector<TombstoneLog::Record>& records) {
  std::string out;
  for (const auto& r : records) {
    out += " (";
    for (unsigned char c : r.key) {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%02x", c);
      out += hex;
    }
    out += " v" + std::to_string(r.version) + " b" + std::to_string(r.bucket) + ")";
  }
  return out;
}

void CheckRawLog(const std::string& file) {
  fuzz::MemoryEnv env;
  env.SetFile(LogPath(), file);
  std::vector<TombstoneLog::Record> records;
  uint64_t torn = 0;
  Status s = TombstoneLog::Read(&env, kDir, &records, &torn);
  if (!s.ok()) return;
  FUZZ_CHECK(torn <= file.size(), "more torn bytes than the file holds");
  for (const auto& r : records) FUZZ_CHECK(!r.key.empty(), "a record with an empty key");

  std::unique_ptr<TombstoneLog> log;
  s = TombstoneLog::Create(&env, kDir, records, &log);
  FUZZ_CHECK(s.ok(), "Create: " + s.ToString());
  std::vector<TombstoneLog::Record> again;
  s = TombstoneLog::Read(&env, kDir, &again, &torn);
  FUZZ_CHECK(s.ok(), "reading a rewritten log: " + s.ToString());
  FUZZ_CHECK(torn == 0, "a rewritten log has a torn tail");
  FUZZ_CHECK(again.size() == records.size() && IsPrefix(again, records),
             "a rewritten log reads back other records");
}

void CheckWrittenLog(FuzzedDataProvider& in) {
  std::vector<TombstoneLog::Record> written(in.ConsumeIntegralInRange<size_t>(0, 12));
  for (auto& r : written) {
    r.key = in.ConsumeRandomLengthString(40);
    if (r.key.empty()) r.key = "k";
    r.version = in.ConsumeIntegral<uint64_t>();
    r.bucket = in.ConsumeIntegral<uint64_t>();
  }
  // The first records go through Create, the others through Add and Sync.
  const size_t created = in.ConsumeIntegralInRange<size_t>(0, written.size());
  fuzz::MemoryEnv env;
  std::unique_ptr<TombstoneLog> log;
  Status s = TombstoneLog::Create(
      &env, kDir, std::vector<TombstoneLog::Record>(written.begin(), written.begin() + created),
      &log);
  FUZZ_CHECK(s.ok(), "Create: " + s.ToString());
  for (size_t i = created; i < written.size(); i++) log->Add(written[i]);
  s = log->Sync();
  FUZZ_CHECK(s.ok(), "Sync: " + s.ToString());
  log.reset();

  std::string file = *env.GetFile(LogPath());
  const std::string whole = file;
  fuzz::TearAndFlip(in, &file);
  env.SetFile(LogPath(), file);
  std::vector<TombstoneLog::Record> records;
  uint64_t torn = 0;
  s = TombstoneLog::Read(&env, kDir, &records, &torn);
  if (!s.ok()) return;  // the flip hit the header's magic or version
  size_t phantoms = 0;
  const size_t matched = MatchInOrder(records, written, &phantoms);
  FUZZ_CHECK(torn <= file.size(), "more torn bytes than the file holds");
  if (file == whole) {
    FUZZ_CHECK(matched == written.size() && phantoms == 0 && torn == 0,
               "an intact log lost records or read others:\nwritten" + Describe(written) +
                   "\nread   " + Describe(records));
  } else if (file.size() == whole.size() && phantoms == 0) {
    FUZZ_CHECK(matched + 1 >= written.size(),
               "one flipped byte lost more than its record:\nwritten" + Describe(written) +
                   "\nread   " + Describe(records));
  }
}

}  // namespace
}  // namespace kvengine

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvengine;
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  if ((data[0] & 1) != 0) {
    CheckWrittenLog(in);
  } else {
    CheckRawLog(in.ConsumeBytesAsString(in.remaining_bytes()));
  }
  return 0;
}
