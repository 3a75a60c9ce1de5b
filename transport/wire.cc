#include "transport/wire.h"

#include <cstring>

#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {
namespace wire {

// Header layout (little-endian):
//   0  u32 magic      4  u8 version   5  u8 op   6  u16 flags
//   8  u64 request_id
//   16 u32 meta_len   20 u32 reserved (0)
//   24 u64 body_len
//   32 u64 checksum
void FrameHeader::EncodeTo(char* dst) const {
  EncodeFixed32(dst, kMagic);
  dst[4] = static_cast<char>(kVersion);
  dst[5] = static_cast<char>(op);
  dst[6] = static_cast<char>(flags & 0xff);
  dst[7] = static_cast<char>(flags >> 8);
  EncodeFixed64(dst + 8, request_id);
  EncodeFixed32(dst + 16, meta_len);
  EncodeFixed32(dst + 20, 0);
  EncodeFixed64(dst + 24, body_len);
  EncodeFixed64(dst + 32, checksum);
}

Status FrameHeader::DecodeFrom(const char* src, FrameHeader* out) {
  if (DecodeFixed32(src) != kMagic) return Status::Corruption("frame has a bad magic number");
  if (static_cast<uint8_t>(src[4]) != kVersion) {
    return Status::Corruption("frame has unknown version " +
                              std::to_string(static_cast<uint8_t>(src[4])));
  }
  out->op = static_cast<uint8_t>(src[5]);
  out->flags =
      static_cast<uint16_t>(static_cast<uint8_t>(src[6]) | (static_cast<uint8_t>(src[7]) << 8));
  out->request_id = DecodeFixed64(src + 8);
  out->meta_len = DecodeFixed32(src + 16);
  out->body_len = DecodeFixed64(src + 24);
  out->checksum = DecodeFixed64(src + 32);
  // Unknown ops pass: the server reads the whole frame and answers NotSupported, so a
  // newer client meets a clear error instead of a dropped connection.
  if (out->op == 0) return Status::Corruption("frame has op 0");
  if (DecodeFixed32(src + 20) != 0) return Status::Corruption("frame's reserved field is set");
  if (out->meta_len > kMaxMetaLen) {
    return Status::Corruption("frame metadata of " + std::to_string(out->meta_len) +
                              " bytes exceeds the limit");
  }
  if (out->body_len > kMaxBodyLen) {
    return Status::Corruption("frame body of " + std::to_string(out->body_len) +
                              " bytes exceeds the limit");
  }
  return Status::OK();
}

void EncodeFrameHeader(uint8_t op, uint16_t flags, uint64_t request_id, std::string_view meta,
                       std::span<const Slice> body, char* header) {
  FrameHeader h;
  h.op = op;
  h.flags = flags;
  h.request_id = request_id;
  h.meta_len = static_cast<uint32_t>(meta.size());
  for (const Slice& b : body) h.body_len += b.size();
  h.EncodeTo(header);
  h.checksum = FrameChecksum(header, meta, body);
  h.EncodeTo(header);
}

bool BodyUnhashed(const char* header) {
  const uint16_t flags = static_cast<uint16_t>(static_cast<uint8_t>(header[6]) |
                                               (static_cast<uint8_t>(header[7]) << 8));
  return (flags & kFlagBodyUnhashed) != 0;
}

uint64_t FrameChecksum(const char* header, std::string_view meta, std::span<const Slice> body) {
  Hasher64 h;
  h.Update(header, 32);
  h.Update(meta.data(), meta.size());
  if (!BodyUnhashed(header)) {
    for (const Slice& part : body) h.Update(part.data(), part.size());
  }
  return h.Digest();
}

void PutBatchStatus(std::string* dst, const Status& s) {
  PutFixed32(dst, static_cast<uint32_t>(s.ErrorCode()));
  PutLengthPrefixed(dst, s.message());
}

bool GetBatchStatus(std::string_view* in, Status* s) {
  uint32_t code;
  std::string_view msg;
  if (!GetFixed32(in, &code) || !GetLengthPrefixed(in, &msg)) return false;
  const int c = static_cast<int32_t>(code);
  if (c > 0 || c < -static_cast<int>(Status::kLastCode)) return false;
  *s = c == 0 ? Status::OK() : Status::FromErrorCode(c, msg);
  return true;
}

void PutKeys(std::string* dst, std::span<const Slice> keys, const uint64_t* extra) {
  PutFixed32(dst, static_cast<uint32_t>(keys.size()));
  for (size_t i = 0; i < keys.size(); i++) {
    PutLengthPrefixed(dst, keys[i].view());
    if (extra != nullptr) PutFixed64(dst, extra[i]);
  }
}

bool GetKeys(std::string_view* in, std::vector<std::string_view>* keys,
             std::vector<uint64_t>* extra) {
  uint32_t n;
  if (!GetFixed32(in, &n) || n > kMaxKeysPerRequest) return false;
  // Each key takes at least one byte: a count larger than what is left is a lie.
  if (n > in->size()) return false;
  keys->clear();
  keys->reserve(n);
  if (extra != nullptr) {
    extra->clear();
    extra->reserve(n);
  }
  for (uint32_t i = 0; i < n; i++) {
    std::string_view key;
    if (!GetLengthPrefixed(in, &key)) return false;
    keys->push_back(key);
    if (extra != nullptr) {
      uint64_t v = 0;
      if (!GetFixed64(in, &v)) return false;
      extra->push_back(v);
    }
  }
  return true;
}

void PutGetGroups(std::string* dst, std::span<const uint32_t> counts, std::span<const Slice> keys,
                  const uint64_t* capacity) {
  PutFixed32(dst, static_cast<uint32_t>(counts.size()));
  for (uint32_t n : counts) PutFixed32(dst, n);
  PutKeys(dst, keys, capacity);
}

bool GetGetGroups(std::string_view* in, std::vector<uint32_t>* counts,
                  std::vector<std::string_view>* keys, std::vector<uint64_t>* capacity) {
  uint32_t groups;
  // Each count takes four bytes: a group count larger than what is left is a lie.
  if (!GetFixed32(in, &groups) || groups == 0 || groups > kMaxKeysPerRequest ||
      groups > in->size() / 4) {
    return false;
  }
  counts->assign(groups, 0);
  uint64_t total = 0;
  for (uint32_t g = 0; g < groups; g++) {
    if (!GetFixed32(in, &(*counts)[g]) || (*counts)[g] == 0) return false;
    total += (*counts)[g];
  }
  return GetKeys(in, keys, capacity) && keys->size() == total;
}

void PutResults(std::string* dst, std::span<const int64_t> results) {
  PutFixed32(dst, static_cast<uint32_t>(results.size()));
  for (int64_t r : results) PutFixed64(dst, static_cast<uint64_t>(r));
}

bool GetResults(std::string_view* in, std::vector<int64_t>* results) {
  uint32_t n;
  if (!GetFixed32(in, &n) || n > kMaxKeysPerRequest || in->size() < 8ull * n) return false;
  results->resize(n);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t v = 0;
    GetFixed64(in, &v);
    (*results)[i] = static_cast<int64_t>(v);
  }
  return true;
}

void PutDeleteMatching(std::string* dst, MatchMode mode, std::string_view pattern) {
  dst->push_back(static_cast<char>(mode));
  PutLengthPrefixed(dst, pattern);
}

bool GetDeleteMatching(std::string_view* in, MatchMode* mode, std::string_view* pattern) {
  if (in->empty()) return false;
  const uint8_t m = static_cast<uint8_t>(in->front());
  in->remove_prefix(1);
  if (m != kMatchAll && m != kMatchRegex) return false;
  if (!GetLengthPrefixed(in, pattern) || !in->empty()) return false;
  if (m == kMatchAll && !pattern->empty()) return false;
  *mode = static_cast<MatchMode>(m);
  return true;
}

void PutRemovalBatch(std::string* dst, const RemovalBatch& batch) {
  PutFixed64(dst, batch.missed);
  PutFixed64(dst, batch.last_sequence);
  PutFixed32(dst, static_cast<uint32_t>(batch.events.size()));
  for (const RemovalEvent& e : batch.events) {
    PutFixed64(dst, e.sequence);
    PutFixed64(dst, e.time_micros);
    dst->push_back(static_cast<char>(e.tier));
    dst->push_back(static_cast<char>(e.reason));
    PutLengthPrefixed(dst, e.key);
  }
}

bool GetRemovalBatch(std::string_view* in, RemovalBatch* batch) {
  uint32_t n = 0;
  if (!GetFixed64(in, &batch->missed) || !GetFixed64(in, &batch->last_sequence) ||
      !GetFixed32(in, &n) || n > in->size() / 19) {  // 19: the smallest event's bytes
    return false;
  }
  batch->events.assign(n, RemovalEvent());
  for (RemovalEvent& e : batch->events) {
    std::string_view key;
    if (!GetFixed64(in, &e.sequence) || !GetFixed64(in, &e.time_micros) || in->size() < 2) {
      return false;
    }
    const uint8_t tier = static_cast<uint8_t>((*in)[0]);
    const uint8_t reason = static_cast<uint8_t>((*in)[1]);
    in->remove_prefix(2);
    if ((tier != RemovalEvent::kMemory && tier != RemovalEvent::kSsd) ||
        (reason != RemovalEvent::kCapacity && reason != RemovalEvent::kDeleted) ||
        !GetLengthPrefixed(in, &key)) {
      return false;
    }
    e.tier = static_cast<RemovalEvent::Tier>(tier);
    e.reason = static_cast<RemovalEvent::Reason>(reason);
    e.key.assign(key);
  }
  return in->empty();
}

uint64_t AuthProof(std::string_view nonce, std::string_view token) {
  // token || nonce || token, so neither a prefix nor a suffix of the input is chosen by
  // the server alone.
  Hasher64 h;
  h.Update(token.data(), token.size());
  h.Update(nonce.data(), nonce.size());
  h.Update(token.data(), token.size());
  return h.Digest();
}

void PutAuth(std::string* dst, uint64_t proof, std::string_view tenant) {
  PutFixed64(dst, proof);
  if (!tenant.empty()) PutLengthPrefixed(dst, tenant);
}

bool GetAuth(std::string_view meta, bool* has_proof, uint64_t* proof, std::string_view* tenant) {
  *has_proof = false;
  *tenant = {};
  if (meta.empty()) return true;
  if (!GetFixed64(&meta, proof)) return false;
  *has_proof = true;
  if (meta.empty()) return true;
  return GetLengthPrefixed(&meta, tenant) && meta.empty() && !tenant->empty();
}

}  // namespace wire
}  // namespace kvengine
