#include "transport/frame_reader.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace kvengine {

namespace {

// Metadata buffers up to this size stay with the connection for its next frame.
constexpr size_t kKeptMetaBytes = 64 << 10;

Status RecvError(int err) { return Status::IOError(std::string("recv: ") + std::strerror(err)); }

}  // namespace

BodyPool::Buffer BodyPool::Take(uint64_t n) {
  {
    MutexLock lock(&mu_);
    auto it = kept_.lower_bound(n);
    if (it != kept_.end()) {
      Buffer b{std::move(it->second), it->first};
      kept_bytes_ -= it->first;
      kept_.erase(it);
      return b;
    }
  }
  Buffer b;
  b.data.reset(new (std::nothrow) char[n]);
  if (b.data != nullptr) b.capacity = n;
  return b;
}

void BodyPool::Give(Buffer b) {
  if (b.data == nullptr || b.capacity > limit_) return;  // freed here
  std::vector<std::unique_ptr<char[]>> dropped;          // freed outside the lock
  MutexLock lock(&mu_);
  while (kept_bytes_ + b.capacity > limit_ && !kept_.empty()) {
    kept_bytes_ -= kept_.begin()->first;
    dropped.push_back(std::move(kept_.begin()->second));
    kept_.erase(kept_.begin());
  }
  kept_bytes_ += b.capacity;
  kept_.emplace(b.capacity, std::move(b.data));
}

Status FrameReader::CheckHeader(bool authenticated) const {
  const wire::FrameHeader& h = header_;
  if (h.flags & wire::kFlagResponse)
    return Status::Corruption("a response frame sent to the server");
  if (!authenticated) {
    if (h.op != wire::kAuth) return Status::Corruption("request before authentication");
    if (h.meta_len > kMaxAuthMetaLen || h.body_len != 0) {
      return Status::Corruption("authentication frame of " + std::to_string(h.meta_len) + "+" +
                                std::to_string(h.body_len) + " bytes exceeds the limit of " +
                                std::to_string(kMaxAuthMetaLen));
    }
  }
  if ((h.flags & wire::kFlagBodyUnhashed) && !allow_unhashed_) {
    return Status::Corruption(
        "a frame with an unhashed body on a connection that may not send one");
  }
  if (h.op == wire::kPut ? h.body_len > wire::kMaxBodyLen : h.body_len != 0) {
    return Status::Corruption("unexpected body of " + std::to_string(h.body_len) + " bytes");
  }
  return Status::OK();
}

Status FrameReader::ReadAvailable(int fd, bool authenticated, BodyPool* pool, Progress* progress) {
  Status s = ReadHeader(fd, authenticated, pool, progress);
  if (!s.ok() || !header_done_) return s;
  bool complete = false;
  s = ReadPayload(fd, &complete);
  if (s.ok() && complete) *progress = Progress::kComplete;
  return s;
}

Status FrameReader::ReadHeader(int fd, bool authenticated, BodyPool* pool, Progress* progress) {
  *progress = header_got_ > 0 ? Progress::kPartial : Progress::kNone;
  while (!header_done_) {
    const size_t need = sizeof(raw_header_) - header_got_;
    size_t n;
    if (ahead_begin_ < ahead_end_) {
      n = std::min(need, ahead_end_ - ahead_begin_);
      std::memcpy(raw_header_ + header_got_, ahead_ + ahead_begin_, n);
      ahead_begin_ += n;
    } else {
      iovec iov[2] = {{raw_header_ + header_got_, need}, {ahead_, sizeof(ahead_)}};
      const ssize_t r = readv(fd, iov, 2);
      if (r == 0) {
        return Status::IOError(header_got_ == 0 ? "connection closed by peer"
                                                : "connection closed in the middle of a frame");
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
        return RecvError(errno);
      }
      n = std::min(need, static_cast<size_t>(r));
      ahead_begin_ = 0;
      ahead_end_ = static_cast<size_t>(r) - n;
    }
    if (header_got_ == 0) started_ = SteadyClock::now();
    header_got_ += n;
    *progress = Progress::kPartial;
    if (header_got_ < sizeof(raw_header_)) continue;
    Status s = wire::FrameHeader::DecodeFrom(raw_header_, &header_);
    if (s.ok()) s = CheckHeader(authenticated);
    if (!s.ok()) return s;
    meta_.resize(header_.meta_len);
    if (header_.body_len > 0) {
      body_ = pool->Take(header_.body_len);
      if (body_.data == nullptr) {
        return Status::IOError("no memory for a body of " + std::to_string(header_.body_len) +
                               " bytes");
      }
    }
    hasher_.emplace();
    hasher_->Update(raw_header_, 32);
    header_done_ = true;
  }
  return Status::OK();
}

iovec FrameReader::NextPayload() const {
  if (payload_got_ < header_.meta_len) {
    return {const_cast<char*>(meta_.data()) + payload_got_,
            static_cast<size_t>(header_.meta_len - payload_got_)};
  }
  const uint64_t off = payload_got_ - header_.meta_len;
  return {body_.data.get() + off, static_cast<size_t>(header_.body_len - off)};
}

Status FrameReader::Landed(size_t n) {
  const bool unhashed = (header_.flags & wire::kFlagBodyUnhashed) != 0;
  while (n > 0) {
    const iovec at = NextPayload();
    const size_t k = std::min(n, at.iov_len);
    const bool in_meta = payload_got_ < header_.meta_len;
    if (in_meta || !unhashed) hasher_->Update(at.iov_base, k);
    payload_got_ += k;
    n -= k;
    if (in_meta && unhashed && payload_got_ == header_.meta_len &&
        hasher_->Digest() != header_.checksum) {
      return Status::Corruption("frame checksum mismatch");
    }
  }
  return Status::OK();
}

Status FrameReader::ReadPayload(int fd, bool* complete) {
  const uint64_t total = header_.meta_len + header_.body_len;
  while (payload_got_ < total) {
    if (ahead_begin_ < ahead_end_) {
      // What the last read brought ahead, copied into place piece by piece.
      size_t n = std::min<uint64_t>(ahead_end_ - ahead_begin_, total - payload_got_);
      while (n > 0) {
        const iovec at = NextPayload();
        const size_t k = std::min(n, at.iov_len);
        std::memcpy(at.iov_base, ahead_ + ahead_begin_, k);
        ahead_begin_ += k;
        n -= k;
        Status s = Landed(k);
        if (!s.ok()) return s;
      }
      continue;
    }
    // The metadata's rest, the body's rest, then room for what follows.
    iovec iov[3];
    int count = 0;
    iov[count++] = NextPayload();
    if (payload_got_ < header_.meta_len && header_.body_len > 0) {
      iov[count++] = {body_.data.get(), static_cast<size_t>(header_.body_len)};
    }
    iov[count++] = {ahead_, sizeof(ahead_)};
    const ssize_t r = readv(fd, iov, count);
    if (r > 0) {
      const size_t mine = std::min<uint64_t>(static_cast<uint64_t>(r), total - payload_got_);
      ahead_begin_ = 0;
      ahead_end_ = static_cast<size_t>(r) - mine;
      Status s = Landed(mine);
      if (!s.ok()) return s;
      continue;
    }
    if (r == 0) return Status::IOError("connection closed in the middle of a frame");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
    return RecvError(errno);
  }
  if (hasher_->Digest() != header_.checksum) return Status::Corruption("frame checksum mismatch");
  *complete = true;
  return Status::OK();
}

void FrameReader::Reset(BodyPool* pool) {
  if (body_.data != nullptr) pool->Give(std::move(body_));
  body_ = BodyPool::Buffer();
  if (meta_.capacity() > kKeptMetaBytes) {
    std::string().swap(meta_);
  } else {
    meta_.clear();
  }
  header_got_ = 0;
  header_done_ = false;
  payload_got_ = 0;
  hasher_.reset();
}

}  // namespace kvengine
