// Status: the result of every kvengine operation that can fail.
//
// An OK status carries nothing. An error carries a code and a message that names the
// problem ("key 'a/b' is empty", "value of 5000000 bytes exceeds max_value_size ...").
// kvengine never throws across its public API; it returns a Status.
//
// Batch calls report one result per key as a signed integer: zero or a positive count on
// success, and on failure the negated error code below (ErrorCode()).  The numeric codes
// are part of the API (the Python module and peers see them) and are frozen:
//
//   -1 NotFound         the key is not present (never written, deleted, or evicted)
//   -2 InvalidArgument  bad input: empty/oversized key, null buffer, bad option value ...
//   -3 Corruption       stored bytes failed a checksum; the value is not returned
//   -4 IOError          the operating system refused a read, write or sync
//   -5 NoSpace          the tier is full and may not evict; nothing was changed
//   -6 Busy             the resource is in use (e.g. the DB directory is locked)
//   -7 Aborted          the operation was cancelled (e.g. the DB was closed meanwhile)
//   -8 NotSupported     the build or machine lacks the feature (no CUDA, no RDMA ...)
//   -9 BufferTooSmall   the caller's buffer cannot hold the value; the message (and, for
//                       GetInto, *value_size) reports the size needed
//  -10 PermissionDenied the caller's credentials do not allow the call (a peer's tenant
//                       token or an attached client's binding does not name the key's
//                       namespace); nothing was changed; the message names the namespace
//
// Thread-safety: a Status is a value; distinct objects may be used from distinct threads.
#ifndef KVENGINE_STATUS_H_
#define KVENGINE_STATUS_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace kvengine {

class Status {
 public:
  // DO NOT CHANGE THESE VALUES: they are returned to users and peers as negative codes.
  enum class Code : int {
    kOk = 0,
    kNotFound = 1,
    kInvalidArgument = 2,
    kCorruption = 3,
    kIOError = 4,
    kNoSpace = 5,
    kBusy = 6,
    kAborted = 7,
    kNotSupported = 8,
    kBufferTooSmall = 9,
    kPermissionDenied = 10,
  };

  Status() noexcept = default;
  ~Status() { Release(); }
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&& other) noexcept : rep_(other.rep_) { other.rep_ = 0; }
  Status& operator=(Status&& other) noexcept {
    if (this != &other) {
      Release();
      rep_ = other.rep_;
      other.rep_ = 0;
    }
    return *this;
  }

  static Status OK() { return Status(); }
  static Status NotFound(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kNotFound, msg, msg2);
  }
  static Status InvalidArgument(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kInvalidArgument, msg, msg2);
  }
  static Status Corruption(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kCorruption, msg, msg2);
  }
  static Status IOError(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kIOError, msg, msg2);
  }
  static Status NoSpace(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kNoSpace, msg, msg2);
  }
  static Status Busy(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kBusy, msg, msg2);
  }
  static Status Aborted(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kAborted, msg, msg2);
  }
  static Status NotSupported(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kNotSupported, msg, msg2);
  }
  static Status BufferTooSmall(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kBufferTooSmall, msg, msg2);
  }
  static Status PermissionDenied(std::string_view msg, std::string_view msg2 = {}) {
    return Status(Code::kPermissionDenied, msg, msg2);
  }
  // Builds a status from a code returned by ErrorCode() (or a batch result).  Unknown
  // codes become InvalidArgument naming the code.
  static Status FromErrorCode(int error_code, std::string_view msg = {});
  // The highest code (the codes run 0..kLastCode without gaps).
  static constexpr Code kLastCode = Code::kPermissionDenied;

  bool ok() const { return rep_ == 0; }
  bool IsNotFound() const { return code() == Code::kNotFound; }
  bool IsInvalidArgument() const { return code() == Code::kInvalidArgument; }
  bool IsCorruption() const { return code() == Code::kCorruption; }
  bool IsIOError() const { return code() == Code::kIOError; }
  bool IsNoSpace() const { return code() == Code::kNoSpace; }
  bool IsBusy() const { return code() == Code::kBusy; }
  bool IsAborted() const { return code() == Code::kAborted; }
  bool IsNotSupported() const { return code() == Code::kNotSupported; }
  bool IsBufferTooSmall() const { return code() == Code::kBufferTooSmall; }
  bool IsPermissionDenied() const { return code() == Code::kPermissionDenied; }

  Code code() const { return has_state() ? state()->code : static_cast<Code>(rep_); }
  // 0 for OK, else the negated code (-1 NotFound ... -10 PermissionDenied).
  int ErrorCode() const { return -static_cast<int>(code()); }
  // The message alone, without the code name ("" for OK).
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>", e.g. "NotFound: key 'a'".
  std::string ToString() const;

  // A short stable name for a code: "ok", "not_found", "invalid_argument", ... (used in
  // logs and by the Python module).
  static const char* CodeName(Code code);

 private:
  struct State {
    Code code;
    std::string message;
  };
  Status(Code code, std::string_view msg, std::string_view msg2);

  bool has_state() const { return rep_ > static_cast<uintptr_t>(kLastCode); }
  State* state() const { return reinterpret_cast<State*>(rep_); }
  // A copy of other's rep_: its own State when other has one.
  static uintptr_t CopyOf(const Status& other);
  void Release() {
    if (has_state()) delete state();
  }

  // 0 for OK; an error without a message is its code alone (1 to kLastCode, never an
  // address), so that the errors said only between layers -- a miss the caller names,
  // a third of readrandom's gets -- allocate nothing; any other error points to its
  // State.
  uintptr_t rep_ = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_STATUS_H_
