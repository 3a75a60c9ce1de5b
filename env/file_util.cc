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

}  // namespace kvengine
