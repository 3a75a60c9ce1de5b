// A GET's answer on the server: the values it names, pinned in the memory tier or read
// through the DB, as the answer frame's metadata and body.
//
// Two ways to build it.  FromMemory only pins (no I/O, no waiting, not even for a lock:
// PeerService::TryPin) and gives up when a value is not in memory or its lock is busy:
// the server's poller tries it, and answers a GET without handing it to a worker when
// it succeeds.  Build reads whatever the pins did not cover
// through the DB (possibly from SSD): the workers' way.
#ifndef KVENGINE_TRANSPORT_GET_ANSWER_H_
#define KVENGINE_TRANSPORT_GET_ANSWER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "transport/server.h"

namespace kvengine {

class GetAnswer {
 public:
  explicit GetAnswer(PeerService* service) : service_(service) {}
  GetAnswer(const GetAnswer&) = delete;
  GetAnswer& operator=(const GetAnswer&) = delete;

  // Builds the answer when every value named is in the memory tier and could be pinned
  // without waiting; false (nothing built, nothing kept pinned) otherwise.
  bool FromMemory(std::span<const Slice> keys, std::span<const uint64_t> capacity);
  // Builds the answer from any tier.  A key named several times is looked up and read
  // once, its bytes sent once per mention.  The answer's size is known before any value
  // is read: one past the frame limit is refused with InvalidArgument (the client splits
  // the batch) and nothing is read.
  void Build(std::span<const Slice> keys, std::span<const uint64_t> capacity);

  // The answer's metadata (batch status, results) and body (the found values back to
  // back); the body's bytes stay valid and unchanged while this object lives.
  std::string TakeMeta() { return std::move(meta_); }
  std::span<const Slice> body() const { return body_; }

 private:
  // Pins (or, unless memory_only, sizes) each distinct key; false when memory_only and
  // a value is not in memory.
  bool Locate(std::span<const Slice> keys, bool memory_only);
  // Reads each distinct value the pins did not cover, once, into room for the largest
  // capacity any of its mentions offers.
  void ReadUnpinned(std::span<const Slice> keys, std::span<const uint64_t> capacity);
  // Sums the answer's body; false (and the refusal as the answer) when it exceeds what
  // one frame carries.
  bool FitsOneFrame(std::span<const uint64_t> capacity);
  void Assemble(std::span<const uint64_t> capacity);
  int64_t ReadValue(const Slice& key, uint64_t room, std::unique_ptr<char[]>* buf);

  PeerService* const service_;
  std::vector<size_t> first_;  // per mention: the index of its key's first mention
  std::vector<PinnedValue> pinned_;
  std::vector<int64_t> size_;  // per first mention: the value's size, or an error code
  std::vector<std::unique_ptr<char[]>> owned_;  // values read through the DB
  std::string meta_;
  std::vector<Slice> body_;
};

}  // namespace kvengine

#endif  // KVENGINE_TRANSPORT_GET_ANSWER_H_
