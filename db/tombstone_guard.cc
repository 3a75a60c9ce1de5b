#include "db/tombstone_guard.h"

#include <algorithm>

#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {

namespace {
// DO NOT CHANGE: embedded in the guard file.
constexpr uint64_t kGuardMagic = 0x3144524155475456ull;  // "VTGUARD1"
constexpr uint32_t kGuardFormatVersion = 1;
constexpr size_t kGuardHeaderSize = 16;
constexpr size_t kGuardRecordSize = 64;
constexpr size_t kGuardChecked = kGuardRecordSize - 8;  // the bytes its checksum covers
}  // namespace

void TombstoneGuard::Encode(const State& state, std::string* out) {
  const size_t start = out->size();
  PutFixed64(out, state.generation);
  PutFixed64(out, state.length);
  PutFixed64(out, state.hash);
  PutFixed64(out, state.max_version);
  for (int i = 0; i < 3; i++) PutFixed64(out, 0);
  PutFixed64(out, Hash64(out->data() + start, kGuardChecked));
}

Status TombstoneGuard::Read(Env* env, const std::string& dir, Contents* contents) {
  *contents = Contents();
  const std::string path = dir + "/" + kFileName;
  if (!env->FileExists(path)) return Status::OK();
  contents->exists = true;
  std::string data;
  Status s = ReadFileToString(env, path, &data);
  if (!s.ok()) return s;
  if (data.size() < kGuardHeaderSize || DecodeFixed64(data.data()) != kGuardMagic ||
      DecodeFixed32(data.data() + 8) != kGuardFormatVersion) {
    contents->damaged = true;
    contents->damage = "bad header";
    return Status::OK();
  }
  for (size_t pos = kGuardHeaderSize; pos < data.size(); pos += kGuardRecordSize) {
    const std::string_view rec(data.data() + pos, std::min(kGuardRecordSize, data.size() - pos));
    const bool last = pos + kGuardRecordSize >= data.size();
    if (rec.size() == kGuardRecordSize &&
        DecodeFixed64(rec.data() + kGuardChecked) == Hash64(rec.data(), kGuardChecked)) {
      State st;
      st.generation = DecodeFixed64(rec.data());
      st.length = DecodeFixed64(rec.data() + 8);
      st.hash = DecodeFixed64(rec.data() + 16);
      st.max_version = DecodeFixed64(rec.data() + 24);
      contents->states.push_back(st);
      continue;
    }
    // Zeros at the end: an append a crash left unwritten (its size committed, its data
    // not).  A record cut short is not a crash's doing (one write of 64 bytes, sizes
    // always whole records): the file was truncated, and records after it may be gone.
    if (last && rec.size() == kGuardRecordSize &&
        std::all_of(rec.begin(), rec.end(), [](char c) { return c == 0; })) {
      break;
    }
    contents->damaged = true;
    contents->damage = "bad record at offset " + std::to_string(pos);
  }
  return Status::OK();
}

Status TombstoneGuard::Create(Env* env, const std::string& dir, const std::vector<State>& states,
                              std::unique_ptr<TombstoneGuard>* result) {
  result->reset();
  std::string data;
  PutFixed64(&data, kGuardMagic);
  PutFixed32(&data, kGuardFormatVersion);
  PutFixed32(&data, 0);
  for (const State& st : states) Encode(st, &data);
  Status s = ReplaceFileAtomically(env, dir, kFileName, Slice(data));
  std::unique_ptr<WritableFile> file;
  if (s.ok()) s = env->NewAppendableFile(dir + "/" + kFileName, &file);
  if (!s.ok()) return s;
  result->reset(new TombstoneGuard(std::move(file), data.size()));
  return Status::OK();
}

Status TombstoneGuard::Append(const State& state) {
  std::string rec;
  Encode(state, &rec);
  Status s = file_->Append(Slice(rec));
  if (s.ok()) s = file_->Sync();
  if (s.ok()) size_ += rec.size();
  return s;
}

}  // namespace kvengine
