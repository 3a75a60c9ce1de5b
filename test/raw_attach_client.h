// RawClient: a client of an owner's attach socket speaking the protocol frame by frame
// (docs/attach.md), to behave as DB::Attach never does: reserve and go idle, send and
// never read.  For the attach tests (attach_test, attach_namespace_test).
#ifndef KVENGINE_TEST_RAW_ATTACH_CLIENT_H_
#define KVENGINE_TEST_RAW_ATTACH_CLIENT_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvengine/status.h"
#include "transport/read_validation.h"
#include "transport/socket_util.h"
#include "transport/unix_socket.h"
#include "transport/wire.h"
#include "util/coding.h"

namespace kvengine {
namespace test {

class RawClient {
 public:
  ~RawClient() {
    if (arena_ != nullptr) munmap(arena_, arena_size_);
    if (fd_ >= 0) close(fd_);
  }
  Status Connect(const std::string& socket) {
    const Deadline deadline = DeadlineIn(2000);
    Status s = ConnectUnix(socket, deadline, &fd_);
    int arena_fd = -1;
    if (s.ok()) s = ReceiveDescriptor(fd_, deadline, &arena_fd);
    wire::FrameHeader h;
    std::string meta;
    if (s.ok()) s = ReadFrame(fd_, deadline, &h, &meta);
    if (!s.ok()) return s;
    std::string_view in(meta);
    Status owner;
    if (!wire::GetBatchStatus(&in, &owner) || !GetFixed64(&in, &arena_size_)) {
      return Status::Corruption("greeting");
    }
    void* p = mmap(nullptr, arena_size_, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0);
    close(arena_fd);
    if (p == MAP_FAILED) return Status::IOError("mmap");
    arena_ = static_cast<char*>(p);
    return owner;
  }
  Status Send(uint8_t op, const std::string& meta) {
    return SendFrame(fd_, op, 0, ++next_request_, meta, {}, DeadlineIn(2000));
  }
  Status Call(uint8_t op, const std::string& meta, std::string* answer) {
    Status s = Send(op, meta);
    wire::FrameHeader h;
    if (s.ok()) s = ReadFrame(fd_, DeadlineIn(2000), &h, answer);
    return s;
  }
  // One key's RESERVE: its slot's address in the arena and its reservation id.
  Status Reserve(const std::string& key, uint64_t size, char** slot, uint64_t* id) {
    std::string meta, answer;
    const Slice k(key);
    wire::PutKeys(&meta, std::span<const Slice>(&k, 1), &size);
    Status s = Call(wire::kReserve, meta, &answer);
    std::string_view in(answer);
    Status batch;
    std::vector<int64_t> results;
    std::vector<RemoteLocation> locs;
    if (s.ok() && (!wire::GetBatchStatus(&in, &batch) || !DecodeLocations(&in, &results, &locs) ||
                   results.size() != 1)) {
      s = Status::Corruption("RESERVE answer");
    }
    if (s.ok() && results[0] < 0) s = Status::FromErrorCode(static_cast<int>(results[0]));
    if (!s.ok()) return s;
    *slot = arena_ + locs[0].offset;
    *id = locs[0].lease;
    return Status::OK();
  }
  // Binds the connection to namespace `name` ("": the default one), as USE_NAMESPACE.
  Status Use(const std::string& name) {
    std::string meta, answer;
    PutLengthPrefixed(&meta, name);
    Status s = Call(wire::kUseNamespace, meta, &answer);
    std::string_view in(answer);
    Status used;
    if (s.ok() && !wire::GetBatchStatus(&in, &used)) s = Status::Corruption("USE answer");
    return s.ok() ? used : s;
  }
  // One key's COMMIT: the key's result code.
  int64_t Commit(const std::string& key, uint64_t id) {
    std::string meta, answer;
    const Slice k(key);
    wire::PutKeys(&meta, std::span<const Slice>(&k, 1), &id);
    if (!Call(wire::kCommit, meta, &answer).ok()) return 1;
    std::string_view in(answer);
    Status batch;
    std::vector<int64_t> results;
    if (!wire::GetBatchStatus(&in, &batch) || !wire::GetResults(&in, &results) ||
        results.size() != 1) {
      return 2;
    }
    return results[0];
  }

 private:
  int fd_ = -1;
  char* arena_ = nullptr;
  uint64_t arena_size_ = 0;
  uint64_t next_request_ = 0;
};

}  // namespace test
}  // namespace kvengine

#endif  // KVENGINE_TEST_RAW_ATTACH_CLIENT_H_
