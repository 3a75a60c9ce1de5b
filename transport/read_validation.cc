#include "transport/read_validation.h"

#include "util/coding.h"

namespace kvengine {

void EncodeLocations(std::string* dst, std::span<const int64_t> results,
                     std::span<const RemoteLocation> locations) {
  PutFixed32(dst, static_cast<uint32_t>(results.size()));
  for (size_t i = 0; i < results.size(); i++) {
    PutFixed64(dst, static_cast<uint64_t>(results[i]));
    if (results[i] == kLookupPinned) {
      const RemoteLocation& l = locations[i];
      PutFixed64(dst, l.offset);
      PutFixed64(dst, l.size);
      PutFixed64(dst, l.version);
      PutFixed64(dst, l.lease);
    }
  }
}

bool DecodeLocations(std::string_view* in, std::vector<int64_t>* results,
                     std::vector<RemoteLocation>* locations) {
  uint32_t n;
  if (!GetFixed32(in, &n) || n > in->size() / 8) return false;
  results->assign(n, 0);
  locations->assign(n, RemoteLocation());
  for (uint32_t i = 0; i < n; i++) {
    uint64_t r;
    if (!GetFixed64(in, &r)) return false;
    (*results)[i] = static_cast<int64_t>(r);
    if ((*results)[i] == kLookupPinned) {
      RemoteLocation& l = (*locations)[i];
      if (!GetFixed64(in, &l.offset) || !GetFixed64(in, &l.size) || !GetFixed64(in, &l.version) ||
          !GetFixed64(in, &l.lease)) {
        return false;
      }
    }
  }
  return true;
}

LeaseTable::LeaseTable(std::chrono::milliseconds ttl, Clock clock)
    : ttl_(ttl), clock_(std::move(clock)) {}

LeaseTable::~LeaseTable() { Clear(); }

std::chrono::steady_clock::time_point LeaseTable::Now() const {
  return clock_ ? clock_() : std::chrono::steady_clock::now();
}

uint64_t LeaseTable::Grant(std::shared_ptr<void> pin) {
  std::vector<std::shared_ptr<void>> reaped;  // unpinned outside the lock
  MutexLock lock(&mu_);
  ReapExpiredLocked(&reaped);
  const uint64_t id = next_++;
  leases_.emplace_hint(leases_.end(), id, Entry{std::move(pin), Now() + ttl_});
  return id;
}

bool LeaseTable::Release(uint64_t lease) {
  std::shared_ptr<void> pin;  // unpinned outside the lock
  MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return false;
  pin = std::move(it->second.pin);
  leases_.erase(it);
  return true;
}

void LeaseTable::ReapExpiredLocked(std::vector<std::shared_ptr<void>>* reaped) {
  const auto now = Now();
  while (!leases_.empty() && leases_.begin()->second.expires <= now) {
    reaped->push_back(std::move(leases_.begin()->second.pin));
    leases_.erase(leases_.begin());
  }
}

size_t LeaseTable::ReapExpired() {
  std::vector<std::shared_ptr<void>> reaped;  // unpinned outside the lock
  MutexLock lock(&mu_);
  ReapExpiredLocked(&reaped);
  return reaped.size();
}

void LeaseTable::Clear() {
  std::map<uint64_t, Entry> all;
  {
    MutexLock lock(&mu_);
    all.swap(leases_);
  }
}

size_t LeaseTable::size() const {
  MutexLock lock(&mu_);
  return leases_.size();
}

Status ValidatedReader::BatchGet(std::span<const Slice> keys, std::span<const Destination> dests,
                                 std::vector<int64_t>* results) {
  results->assign(keys.size(), Status::Aborted("").ErrorCode());
  std::vector<size_t> todo(keys.size());
  for (size_t i = 0; i < keys.size(); i++) todo[i] = i;
  for (int attempt = 0; attempt < max_attempts_ && !todo.empty(); attempt++) {
    if (attempt > 0) retries_ += todo.size();
    std::vector<Slice> ask;
    ask.reserve(todo.size());
    for (size_t i : todo) ask.push_back(keys[i]);
    std::vector<int64_t> found;
    std::vector<RemoteLocation> where;
    Status s = remote_->Lookup(ask, &found, &where);
    if (s.ok() && (found.size() != ask.size() || where.size() != ask.size())) {
      s = Status::Corruption("lookup answered for the wrong number of keys");
    }
    if (!s.ok()) {
      for (size_t i : todo) (*results)[i] = s.ErrorCode();
      return s;
    }
    // Split each pinned value over its destination buffers: one read per buffer piece.
    std::vector<RemoteRead> reads;
    std::vector<uint64_t> leases;
    std::vector<size_t> leased_key;  // todo index of leases[j]
    for (size_t j = 0; j < todo.size(); j++) {
      const size_t i = todo[j];
      if (found[j] != kLookupPinned) {
        (*results)[i] = found[j];
        continue;
      }
      const RemoteLocation& loc = where[j];
      leases.push_back(loc.lease);
      leased_key.push_back(j);
      uint64_t capacity = 0;
      for (const MutableSlice& d : dests[i]) capacity += d.size();
      if (loc.size > capacity) {
        (*results)[i] = Status::BufferTooSmall("").ErrorCode();
        continue;
      }
      uint64_t off = loc.offset, left = loc.size;
      for (const MutableSlice& d : dests[i]) {
        if (left == 0) break;
        const uint64_t n = std::min<uint64_t>(left, d.size());
        if (n == 0) continue;
        RemoteRead r;
        r.remote_offset = off;
        r.length = n;
        r.local = d.data();
        r.key_index = i;
        reads.push_back(r);
        off += n;
        left -= n;
      }
      (*results)[i] = static_cast<int64_t>(loc.size);
    }
    if (!reads.empty()) {
      s = remote_->Read(reads);
      for (const RemoteRead& r : reads) {
        if (!r.status.ok()) (*results)[r.key_index] = r.status.ErrorCode();
      }
    }
    std::vector<uint8_t> held;
    Status rs = leases.empty() ? Status::OK() : remote_->Release(leases, &held);
    if (rs.ok() && held.size() != leases.size()) {
      rs = Status::Corruption("release answered for the wrong number of leases");
    }
    std::vector<size_t> again;
    for (size_t k = 0; k < leases.size(); k++) {
      const size_t i = todo[leased_key[k]];
      if (!rs.ok()) {
        (*results)[i] = rs.ErrorCode();  // cannot tell whether the bytes were valid
      } else if (!held[k] && (*results)[i] >= 0) {
        (*results)[i] = Status::Aborted("").ErrorCode();
        again.push_back(i);  // the lease lapsed during the read: look it up again
      }
    }
    if (!rs.ok()) return rs;
    todo.swap(again);
  }
  return Status::OK();
}

}  // namespace kvengine
