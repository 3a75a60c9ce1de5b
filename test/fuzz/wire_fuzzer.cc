// Fuzz target: every decoder that reads a peer's bytes (transport/wire.h and the
// metadata parsers of transport/, see docs/transport.md).
//
// The first input byte picks the decoder; the rest of the input is what it decodes, in
// a buffer of exactly that size so that any read past it is caught.  Whatever a decoder
// accepts must come back the same through its encoder and the decoder again.
//   0 the frame header              4 a response's batch status
//   1 keys with capacities/sizes    5 a DELETE_MATCHING request
//     (GET, PUT requests)           6 LOOKUP locations
//   2 keys alone (EXISTS, DELETE,   7 a UCX connect answer (and the
//     LOOKUP, VALUE_SIZE requests)     same bytes as a connect request)
//   3 a response's results
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "test/fuzz/fuzz_check.h"
#include "transport/read_validation.h"
#include "transport/ucx.h"
#include "transport/wire.h"

namespace kvengine {
namespace {

void FuzzFrameHeader(std::string_view in) {
  if (in.size() < wire::kHeaderSize) return;
  std::vector<char> src(in.begin(), in.begin() + wire::kHeaderSize);
  wire::FrameHeader h;
  if (!wire::FrameHeader::DecodeFrom(src.data(), &h).ok()) return;
  FUZZ_CHECK(h.op != 0 && h.meta_len <= wire::kMaxMetaLen && h.body_len <= wire::kMaxBodyLen,
             "a header past the limits was accepted");
  // Every byte of an accepted header is meaningful: encoding it gives the same bytes.
  char again[wire::kHeaderSize];
  h.EncodeTo(again);
  FUZZ_CHECK(std::memcmp(again, src.data(), wire::kHeaderSize) == 0,
             "an accepted header does not encode back to its bytes");
}

void FuzzKeys(std::string_view in, bool with_extra) {
  std::vector<std::string_view> keys;
  std::vector<uint64_t> extra;
  if (!wire::GetKeys(&in, &keys, with_extra ? &extra : nullptr)) return;
  FUZZ_CHECK(keys.size() <= wire::kMaxKeysPerRequest, "more keys than a request may carry");
  FUZZ_CHECK(!with_extra || extra.size() == keys.size(), "one extra per key");
  std::vector<Slice> slices(keys.begin(), keys.end());
  std::string encoded;
  wire::PutKeys(&encoded, slices, with_extra ? extra.data() : nullptr);
  std::string_view view(encoded);
  std::vector<std::string_view> keys2;
  std::vector<uint64_t> extra2;
  FUZZ_CHECK(wire::GetKeys(&view, &keys2, with_extra ? &extra2 : nullptr) && view.empty(),
             "encoded keys do not decode");
  FUZZ_CHECK(keys2 == keys && extra2 == extra, "keys changed through an encoding");
}

void FuzzResults(std::string_view in) {
  std::vector<int64_t> results;
  if (!wire::GetResults(&in, &results)) return;
  std::string encoded;
  wire::PutResults(&encoded, results);
  std::string_view view(encoded);
  std::vector<int64_t> again;
  FUZZ_CHECK(wire::GetResults(&view, &again) && view.empty() && again == results,
             "results changed through an encoding");
}

void FuzzBatchStatus(std::string_view in) {
  Status s;
  if (!wire::GetBatchStatus(&in, &s)) return;
  std::string encoded;
  wire::PutBatchStatus(&encoded, s);
  std::string_view view(encoded);
  Status again;
  FUZZ_CHECK(wire::GetBatchStatus(&view, &again) && view.empty(), "a status does not decode");
  FUZZ_CHECK(again.ErrorCode() == s.ErrorCode() && again.ToString() == s.ToString(),
             "a status changed through an encoding: " + s.ToString() + " / " + again.ToString());
}

void FuzzDeleteMatching(std::string_view in) {
  wire::MatchMode mode;
  std::string_view pattern;
  if (!wire::GetDeleteMatching(&in, &mode, &pattern)) return;
  FUZZ_CHECK(mode == wire::kMatchRegex || pattern.empty(), "a pattern with kMatchAll");
  std::string encoded;
  wire::PutDeleteMatching(&encoded, mode, pattern);
  std::string_view view(encoded);
  wire::MatchMode mode2;
  std::string_view pattern2;
  FUZZ_CHECK(
      wire::GetDeleteMatching(&view, &mode2, &pattern2) && mode2 == mode && pattern2 == pattern,
      "a delete-matching request changed through an encoding");
}

void FuzzLocations(std::string_view in) {
  std::vector<int64_t> results;
  std::vector<RemoteLocation> locations;
  if (!DecodeLocations(&in, &results, &locations)) return;
  FUZZ_CHECK(results.size() == locations.size(), "one location per result");
  std::string encoded;
  EncodeLocations(&encoded, results, locations);
  std::string_view view(encoded);
  std::vector<int64_t> results2;
  std::vector<RemoteLocation> locations2;
  FUZZ_CHECK(DecodeLocations(&view, &results2, &locations2) && view.empty() && results2 == results,
             "locations changed through an encoding");
  for (size_t i = 0; i < results.size(); i++) {
    const RemoteLocation& a = locations[i];
    const RemoteLocation& b = locations2[i];
    FUZZ_CHECK(
        a.offset == b.offset && a.size == b.size && a.version == b.version && a.lease == b.lease,
        "a location changed through an encoding");
  }
}

void FuzzUcxConnect(std::string_view in) {
  UcxConnectAnswer a;
  // A version 1 answer (an older server's: no token) is read but never written.
  if (UcxConnectAnswer::DecodeFrom(in, &a).ok() && a.token != 0) {
    std::string encoded;
    a.EncodeTo(&encoded);
    UcxConnectAnswer again;
    FUZZ_CHECK(UcxConnectAnswer::DecodeFrom(encoded, &again).ok() && again == a,
               "an accepted UCX connect answer changed through an encoding");
    FUZZ_CHECK(a.reads_by_am || !a.rkey.empty(), "a UCX connect answer without an rkey");
  }
  UcxConnectRequest r;
  if (UcxConnectRequest::DecodeFrom(in, &r).ok()) {
    std::string encoded;
    r.EncodeTo(&encoded);
    UcxConnectRequest again;
    FUZZ_CHECK(UcxConnectRequest::DecodeFrom(encoded, &again).ok() &&
                   again.worker_address == r.worker_address && !r.worker_address.empty(),
               "an accepted UCX connect request changed through an encoding");
  }
}

}  // namespace
}  // namespace kvengine

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvengine;
  if (size == 0) return 0;
  // An exactly sized copy: ASan then catches a read one byte past the input.
  const std::vector<char> copy(data + 1, data + size);
  const std::string_view in(copy.data(), copy.size());
  switch (data[0] % 8) {
    case 0:
      FuzzFrameHeader(in);
      break;
    case 1:
      FuzzKeys(in, /*with_extra=*/true);
      break;
    case 2:
      FuzzKeys(in, /*with_extra=*/false);
      break;
    case 3:
      FuzzResults(in);
      break;
    case 4:
      FuzzBatchStatus(in);
      break;
    case 5:
      FuzzDeleteMatching(in);
      break;
    case 6:
      FuzzLocations(in);
      break;
    case 7:
      FuzzUcxConnect(in);
      break;
  }
  return 0;
}
