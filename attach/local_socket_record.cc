#include "attach/local_socket_record.h"

#include <memory>

namespace kvengine {

namespace {

std::string RecordPath(const std::string& dir) { return dir + "/" + kLocalSocketFile; }

}  // namespace

Status WriteLocalSocketRecord(Env* env, const std::string& dir, const std::string& socket_path) {
  std::unique_ptr<WritableFile> file;
  Status s = env->NewWritableFile(RecordPath(dir), FileOptions(), &file);
  if (s.ok()) s = file->Append(Slice(socket_path));
  if (s.ok()) s = file->Close();
  return s;
}

Status ReadLocalSocketRecord(Env* env, const std::string& dir, std::string* socket_path) {
  socket_path->clear();
  std::string text;
  Status s = ReadFileToString(env, RecordPath(dir), &text);
  if (!s.ok()) return s;
  // The first line: a record written by hand may end with a newline.
  *socket_path = text.substr(0, text.find('\n'));
  if (socket_path->empty()) return Status::NotFound(RecordPath(dir) + " is empty");
  return Status::OK();
}

void RemoveLocalSocketRecord(Env* env, const std::string& dir) {
  env->RemoveFile(RecordPath(dir));  // absent already: nothing to do
}

}  // namespace kvengine
