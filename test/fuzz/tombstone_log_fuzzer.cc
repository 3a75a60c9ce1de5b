// Fuzz target: TombstoneLog::Read over an arbitrary log file.
//
// The first input byte says how the log is made from the rest of the input:
//   bit 0 clear: the rest is the file, byte for byte (the seeds are real logs).  Whatever
//                Read accepts must survive being written again (Create) and read back.
//   bit 0 set:   the rest chooses records, written by the log's own writer (Create, then
//                Add and Sync), then a tear (the file cut short) and a flipped byte.  Read
//                must return records written, in order: all of them when the damage spared
//                them, all but the one the flip hit when the file was not cut (it
//                resynchronises at the next valid record: a bad record loses only its own
//                deletes).
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "db/tombstone_log.h"
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

// Whether `part` is `all` with some records left out, in order.
bool IsSubsequence(const std::vector<TombstoneLog::Record>& part,
                   const std::vector<TombstoneLog::Record>& all) {
  size_t j = 0;
  for (const auto& r : part) {
    while (j < all.size() && !SameRecord(r, all[j])) j++;
    if (j == all.size()) return false;
    j++;
  }
  return true;
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
  if (in.ConsumeBool()) file.resize(in.ConsumeIntegralInRange<size_t>(0, file.size()));
  if (!file.empty() && in.ConsumeBool()) {
    file[in.ConsumeIntegralInRange<size_t>(0, file.size() - 1)] ^=
        static_cast<char>(in.ConsumeIntegralInRange<int>(1, 255));
  }
  env.SetFile(LogPath(), file);
  std::vector<TombstoneLog::Record> records;
  uint64_t torn = 0;
  s = TombstoneLog::Read(&env, kDir, &records, &torn);
  if (!s.ok()) return;  // the flip hit the header's magic or version
  FUZZ_CHECK(IsSubsequence(records, written),
             "Read returned records that were never written, or out of order");
  FUZZ_CHECK(torn <= file.size(), "more torn bytes than the file holds");
  if (file == whole) {
    FUZZ_CHECK(records.size() == written.size() && torn == 0, "an intact log lost records");
  } else if (file.size() == whole.size()) {
    FUZZ_CHECK(records.size() + 1 >= written.size(), "one flipped byte lost more than its record");
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
