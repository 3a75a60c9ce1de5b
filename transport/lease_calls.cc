#include "transport/lease_calls.h"

#include <string>
#include <string_view>

#include "transport/tcp_transport.h"
#include "transport/wire.h"
#include "util/coding.h"

namespace kvengine {

void EncodeLookupRequest(std::span<const Slice> keys, std::string* meta) {
  wire::PutKeys(meta, keys, nullptr);
}

Status DecodeLookupAnswer(std::string_view in, size_t keys, uint64_t arena_len,
                          std::vector<int64_t>* results, std::vector<RemoteLocation>* locations) {
  Status batch;
  if (!wire::GetBatchStatus(&in, &batch)) return Status::Corruption("malformed lookup");
  if (!batch.ok()) return batch;
  if (!DecodeLocations(&in, results, locations) || results->size() != keys) {
    return Status::Corruption("malformed lookup");
  }
  for (size_t i = 0; i < locations->size(); i++) {
    const RemoteLocation& l = (*locations)[i];
    if ((*results)[i] == kLookupPinned && l.size > 0 &&
        (l.offset > arena_len || l.size > arena_len - l.offset)) {
      return Status::Corruption("lookup names bytes outside the peer's arena");
    }
  }
  return Status::OK();
}

void EncodeReleaseRequest(std::span<const uint64_t> leases, std::string* meta) {
  PutFixed32(meta, static_cast<uint32_t>(leases.size()));
  for (uint64_t l : leases) PutFixed64(meta, l);
}

Status DecodeReleaseAnswer(std::string_view in, size_t leases, std::vector<uint8_t>* held) {
  Status batch;
  std::vector<int64_t> r;
  if (!wire::GetBatchStatus(&in, &batch) || !wire::GetResults(&in, &r)) {
    return Status::Corruption("malformed release answer");
  }
  if (!batch.ok()) return batch;
  if (r.size() != leases) return Status::Corruption("malformed release answer");
  held->assign(r.begin(), r.end());
  return Status::OK();
}

Status CallLookup(TcpTransport* t, const Endpoint& peer, std::span<const Slice> keys,
                  uint64_t arena_len, std::vector<int64_t>* results,
                  std::vector<RemoteLocation>* locations) {
  std::string meta;
  EncodeLookupRequest(keys, &meta);
  MetaSink sink;
  Status s = t->Call(peer, wire::kLookup, meta, {}, &sink);
  if (!s.ok()) return s;
  return DecodeLookupAnswer(sink.meta, keys.size(), arena_len, results, locations);
}

Status CallRelease(TcpTransport* t, const Endpoint& peer, std::span<const uint64_t> leases,
                   std::vector<uint8_t>* held) {
  std::string meta;
  EncodeReleaseRequest(leases, &meta);
  MetaSink sink;
  Status s = t->Call(peer, wire::kRelease, meta, {}, &sink);
  if (!s.ok()) return s;
  return DecodeReleaseAnswer(sink.meta, leases.size(), held);
}

void GetUnpinnedOverTcp(TcpTransport* t, const Endpoint& peer, std::span<const Slice> keys,
                        std::span<const Destination> dests, std::vector<int64_t>* results) {
  std::vector<Slice> rest_keys;
  std::vector<Destination> rest_dests;
  std::vector<size_t> rest;
  for (size_t i = 0; i < keys.size(); i++) {
    if ((*results)[i] == kLookupNotPinned) {
      rest.push_back(i);
      rest_keys.push_back(keys[i]);
      rest_dests.push_back(dests[i]);
    }
  }
  if (rest.empty()) return;
  std::vector<int64_t> more;
  t->TcpTransport::BatchGet(peer, rest_keys, rest_dests, &more);
  for (size_t j = 0; j < rest.size(); j++) (*results)[rest[j]] = more[j];
}

}  // namespace kvengine
