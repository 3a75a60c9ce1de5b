#include "transport/frame_reader.h"

#include <sys/socket.h>
#include <sys/uio.h>

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
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  while (kept_bytes_ + b.capacity > limit_ && !kept_.empty()) {
    kept_bytes_ -= kept_.begin()->first;
    dropped.push_back(std::move(kept_.begin()->second));
    kept_.erase(kept_.begin());
  }
  kept_bytes_ += b.capacity;
  kept_.emplace(b.capacity, std::move(b.data));
}

uint64_t BodyPool::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_bytes_;
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
    const ssize_t n = recv(fd, raw_header_ + header_got_, sizeof(raw_header_) - header_got_, 0);
    if (n > 0) {
      if (header_got_ == 0) started_ = SteadyClock::now();
      header_got_ += static_cast<size_t>(n);
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
      return Status::OK();
    }
    if (n == 0) {
      return Status::IOError(header_got_ == 0 ? "connection closed by peer"
                                              : "connection closed in the middle of a frame");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
    return RecvError(errno);
  }
  return Status::OK();
}

Status FrameReader::ReadPayload(int fd, bool* complete) {
  const uint64_t meta_len = header_.meta_len;
  const uint64_t total = meta_len + header_.body_len;
  const bool unhashed = (header_.flags & wire::kFlagBodyUnhashed) != 0;
  while (payload_got_ < total) {
    iovec iov[2];
    int count = 0;
    if (payload_got_ < meta_len) {
      iov[count++] = {meta_.data() + payload_got_, static_cast<size_t>(meta_len - payload_got_)};
    }
    if (header_.body_len > 0) {
      const uint64_t off = payload_got_ > meta_len ? payload_got_ - meta_len : 0;
      iov[count++] = {body_.data.get() + off, static_cast<size_t>(header_.body_len - off)};
    }
    const ssize_t n = readv(fd, iov, count);
    if (n > 0) {
      const bool had_meta = payload_got_ < meta_len;  // then iov[0] is the metadata
      size_t left = static_cast<size_t>(n);
      for (int i = 0; left > 0; i++) {
        const size_t k = std::min(left, iov[i].iov_len);
        if (!unhashed || (had_meta && i == 0)) hasher_->Update(iov[i].iov_base, k);
        left -= k;
      }
      payload_got_ += static_cast<uint64_t>(n);
      if (unhashed && had_meta && payload_got_ >= meta_len &&
          hasher_->Digest() != header_.checksum) {
        return Status::Corruption("frame checksum mismatch");
      }
      continue;
    }
    if (n == 0) return Status::IOError("connection closed in the middle of a frame");
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
