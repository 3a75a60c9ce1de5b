#include <memory>
#include <string>

#include "kvengine/env.h"

namespace kvengine {

Status ReadFileToString(Env* env, const std::string& path, std::string* data) {
  data->clear();
  std::unique_ptr<RandomAccessFile> file;
  Status s = env->NewRandomAccessFile(path, FileOptions(), &file);
  if (!s.ok()) return s;
  // Read to the end rather than to Size(): a file may grow while it is read.
  const size_t kChunk = 8192;
  uint64_t offset = 0;
  for (;;) {
    data->resize(offset + kChunk);
    size_t n = 0;
    s = file->Read(offset, kChunk, data->data() + offset, &n);
    if (!s.ok()) {
      data->clear();
      return s;
    }
    offset += n;
    if (n < kChunk) break;
  }
  data->resize(offset);
  return Status::OK();
}

Status ReplaceFileAtomically(Env* env, const std::string& dir, const std::string& name,
                             const Slice& data) {
  const std::string path = dir + "/" + name;
  const std::string tmp = path + ".tmp";
  std::unique_ptr<WritableFile> file;
  Status s = env->NewWritableFile(tmp, FileOptions(), &file);
  if (s.ok()) s = file->Append(data);
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (s.ok()) s = env->SyncDir(dir);
  if (!s.ok() && env->FileExists(tmp)) env->RemoveFile(tmp);
  return s;
}

}  // namespace kvengine
