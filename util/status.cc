#include "kvengine/status.h"

namespace kvengine {

namespace {
const std::string& EmptyString() {
  static const std::string* empty = new std::string;
  return *empty;
}
}  // namespace

Status::Status(Code code, std::string_view msg, std::string_view msg2) {
  if (msg.empty() && msg2.empty()) {
    rep_ = static_cast<uintptr_t>(code);
    return;
  }
  auto* state = new State{code, {}};
  state->message.reserve(msg.size() + (msg2.empty() ? 0 : msg2.size() + 2));
  state->message.append(msg);
  if (!msg2.empty()) {
    state->message.append(": ");
    state->message.append(msg2);
  }
  rep_ = reinterpret_cast<uintptr_t>(state);
}

uintptr_t Status::CopyOf(const Status& other) {
  return other.has_state() ? reinterpret_cast<uintptr_t>(new State(*other.state())) : other.rep_;
}

Status::Status(const Status& other) : rep_(CopyOf(other)) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) {
    const uintptr_t copy = CopyOf(other);
    Release();
    rep_ = copy;
  }
  return *this;
}

Status Status::FromErrorCode(int error_code, std::string_view msg) {
  int code = -error_code;
  if (code == 0) return OK();
  if (code < 0 || code > static_cast<int>(kLastCode)) {
    return InvalidArgument("unknown error code " + std::to_string(error_code), msg);
  }
  return Status(static_cast<Code>(code), msg, {});
}

const std::string& Status::message() const {
  return has_state() ? state()->message : EmptyString();
}

const char* Status::CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kNotFound:
      return "not_found";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kCorruption:
      return "corruption";
    case Code::kIOError:
      return "io_error";
    case Code::kNoSpace:
      return "no_space";
    case Code::kBusy:
      return "busy";
    case Code::kAborted:
      return "aborted";
    case Code::kNotSupported:
      return "not_supported";
    case Code::kBufferTooSmall:
      return "buffer_too_small";
    case Code::kPermissionDenied:
      return "permission_denied";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  static const char* const kTitles[] = {
      "OK",   "NotFound", "InvalidArgument", "Corruption",     "IOError",         "NoSpace",
      "Busy", "Aborted",  "NotSupported",    "BufferTooSmall", "PermissionDenied"};
  std::string result = kTitles[static_cast<int>(code())];
  result += ": ";
  result += message();
  return result;
}

}  // namespace kvengine
