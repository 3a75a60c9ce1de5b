// How the server receives request frames without a thread waiting on any one client.
//
// BodyPool lends put bodies' memory and keeps a bounded amount of it between requests,
// shared by every connection.  FrameReader assembles one connection's request frame
// from a non-blocking socket in as many pieces as the bytes arrive in, checking the
// header before anything it announces is allocated.
#ifndef KVENGINE_TRANSPORT_FRAME_READER_H_
#define KVENGINE_TRANSPORT_FRAME_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kvengine/status.h"
#include "transport/socket_util.h"
#include "transport/wire.h"
#include "util/hash.h"
#include "util/mutex.h"

namespace kvengine {

// Memory for put bodies.  A fresh multi-MiB buffer per put costs a page fault per page
// on its first write, so returned buffers are kept for the next put on any connection
// -- at most `limit` bytes of them in all, however many connections sit idle.
// Thread-safe.
class BodyPool {
 public:
  struct Buffer {
    std::unique_ptr<char[]> data;
    uint64_t capacity = 0;
  };

  explicit BodyPool(uint64_t limit) : limit_(limit) {}

  // A buffer of at least n > 0 bytes; its data is null when memory is short.
  Buffer Take(uint64_t n);
  // Keeps b for a later Take when it fits the limit (the smallest kept buffers make
  // room), else frees it.
  void Give(Buffer b);

 private:
  const uint64_t limit_;
  Mutex mu_;
  std::multimap<uint64_t, std::unique_ptr<char[]>> kept_ GUARDED_BY(mu_);  // by capacity
  uint64_t kept_bytes_ GUARDED_BY(mu_) = 0;
};

// One connection's request frame in the making.  Not thread-safe: the connection's
// owner (one worker at a time) drives it.
class FrameReader {
 public:
  // Largest metadata of the only frame accepted before authentication (AUTH: a proof of
  // 8 bytes and a tenant's name of at most 64, its length one varint byte).
  static constexpr uint32_t kMaxAuthMetaLen = 8 + 1 + 64;

  enum class Progress {
    kNone,      // nothing of a frame has arrived
    kPartial,   // a frame began and is not whole yet
    kComplete,  // header(), meta() and body() hold a whole, checksummed frame
  };

  FrameReader() = default;
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  // Whether frames may carry wire::kFlagBodyUnhashed (a loopback connection, on a
  // server that offers it).  Off: such a frame is refused with Corruption.
  void AllowUnhashedBodies(bool allow) { allow_unhashed_ = allow; }

  // Reads what `fd` (non-blocking) has and says how far the current frame got.  Each
  // read also takes up to kAheadBytes of what follows (a header's metadata, the next
  // frame of a pipeline) into a fixed buffer, handed out first by the next calls: a
  // small request's header and metadata come in one system call.  So the reader must
  // be driven until it reports a frame incomplete (it has then taken everything the
  // socket held) before the socket is watched for more.  A header is checked before
  // its metadata or body is allocated: magic, version, limits; a request (not a
  // response); a body only on a put; an unhashed body only when allowed; and, unless
  // `authenticated`, only an AUTH with a small metadata and no body.  The checksum is
  // checked once the metadata is whole when the body is unhashed (so the metadata is
  // trusted before the body is read on its word), else at the end.
  // Errors: IOError "connection closed by peer" when the peer closed between frames,
  // IOError for a socket error or a frame cut short, Corruption for a frame refused
  // (the connection is then unusable: the stream is out of step).
  Status ReadAvailable(int fd, bool authenticated, BodyPool* pool, Progress* progress);
  // ReadAvailable's first step alone: reads what `fd` has of the header (and ahead),
  // and checks it once whole (header_done()).  Lets the server's poller see a frame's
  // op and sizes before it decides to read the rest itself.
  Status ReadHeader(int fd, bool authenticated, BodyPool* pool, Progress* progress);
  bool header_done() const { return header_done_; }

  // When the current frame's first byte arrived; meaningful once Progress is not kNone.
  Deadline started() const { return started_; }
  bool in_progress() const { return header_got_ > 0; }
  // Bytes read ahead of the current frame's needs and not handed out yet: while there
  // are any, the socket's readiness says nothing of them.
  size_t buffered() const { return ahead_end_ - ahead_begin_; }

  const wire::FrameHeader& header() const { return header_; }
  std::string_view meta() const { return meta_; }
  const char* body() const { return body_.data.get(); }

  // Gives the body's memory back to `pool` and readies for the next frame (whose first
  // bytes may be buffered already).
  void Reset(BodyPool* pool);

 private:
  static constexpr size_t kAheadBytes = 4096;

  Status CheckHeader(bool authenticated) const;
  Status ReadPayload(int fd, bool* complete);
  // The payload's next unfilled bytes: the metadata's rest, else the body's rest.
  iovec NextPayload() const;
  // Accounts for n bytes that landed at the payload's position: hashes what the
  // checksum covers, and checks it as soon as the metadata is whole when the body is
  // unhashed.
  Status Landed(size_t n);

  char raw_header_[wire::kHeaderSize];
  size_t header_got_ = 0;
  bool header_done_ = false;
  Deadline started_{};
  wire::FrameHeader header_;
  std::string meta_;
  BodyPool::Buffer body_;
  uint64_t payload_got_ = 0;  // bytes of meta, then body, received
  std::optional<Hasher64> hasher_;
  bool allow_unhashed_ = false;
  size_t ahead_begin_ = 0, ahead_end_ = 0;  // ahead_[begin, end) read, not handed out
  char ahead_[kAheadBytes];
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_FRAME_READER_H_
