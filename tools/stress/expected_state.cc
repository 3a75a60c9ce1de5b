#include "tools/stress/expected_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/hash.h"

namespace kvengine::stress {
namespace {

constexpr uint64_t kMagic = 0x3153455254535653ull;  // "SVSTRES1" little-endian
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kKeyBytes = 32;  // 5 words used, room for more
constexpr size_t kCountersOffset = 64;

// The header's fixed part: checksummed.
struct FixedHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t keys;
  uint32_t workers;
  uint32_t reserved;
  uint64_t checksum;  // Hash64 of the bytes before it
};
static_assert(sizeof(FixedHeader) == 32);

uint64_t HeaderChecksum(const FixedHeader& h) {
  return Hash64(&h, offsetof(FixedHeader, checksum));
}

Status Errno(const std::string& what, const std::string& path) {
  return Status::IOError(what + " " + path, std::strerror(errno));
}

}  // namespace

const char* CounterName(Counter c) {
  static const char* const kNames[] = {"ops",         "verified_reads", "lost",        "wrong",
                                       "resurrected", "errors",         "refused",     "dropped",
                                       "flushes",     "rounds",         "read_refused"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Counter::kCount));
  return kNames[static_cast<int>(c)];
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kDropped:
      return "dropped";
    case Verdict::kLost:
      return "lost";
    case Verdict::kWrong:
      return "wrong";
    case Verdict::kResurrected:
      return "resurrected";
  }
  return "?";
}

ExpectedState::ExpectedState(int fd, void* base, size_t size, uint32_t keys, uint32_t workers)
    : fd_(fd), base_(base), size_(size), keys_(keys), workers_(workers) {}

ExpectedState::~ExpectedState() {
  munmap(base_, size_);
  close(fd_);
}

Status ExpectedState::Map(const std::string& path, int fd, size_t size, void** base) {
  *base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (*base == MAP_FAILED) return Errno("mmap", path);
  return Status::OK();
}

Status ExpectedState::Create(const std::string& path, uint32_t keys, uint32_t workers,
                             std::unique_ptr<ExpectedState>* state) {
  state->reset();
  if (keys == 0 || workers == 0) {
    return Status::InvalidArgument("expected state needs at least one key and one worker");
  }
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp);
  const size_t size = kHeaderBytes + static_cast<size_t>(keys) * kKeyBytes;
  void* base = nullptr;
  Status s = ftruncate(fd, static_cast<off_t>(size)) == 0 ? Status::OK() : Errno("truncate", tmp);
  if (s.ok()) s = Map(tmp, fd, size, &base);
  if (!s.ok()) {
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  // Zero is every key's initial state (absent at version 0) but `next`, which starts at 1.
  state->reset(new ExpectedState(fd, base, size, keys, workers));
  for (uint32_t k = 0; k < keys; k++) (*state)->Store(k, kNext, 1);
  FixedHeader h{kMagic, kFormatVersion, keys, workers, 0, 0};
  h.checksum = HeaderChecksum(h);
  std::memcpy(base, &h, sizeof(h));
  if (msync(base, size, MS_SYNC) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    s = Errno("write", path);
    state->reset();
    unlink(tmp.c_str());
  }
  return s;
}

Status ExpectedState::Open(const std::string& path, std::unique_ptr<ExpectedState>* state) {
  state->reset();
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  struct stat st;
  FixedHeader h{};
  Status s = fstat(fd, &st) == 0 ? Status::OK() : Errno("stat", path);
  if (s.ok() && (static_cast<size_t>(st.st_size) < kHeaderBytes ||
                 pread(fd, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h)))) {
    s = Status::Corruption("expected state " + path, "shorter than its header");
  }
  if (s.ok() && (h.magic != kMagic || h.format_version != kFormatVersion ||
                 h.checksum != HeaderChecksum(h))) {
    s = Status::Corruption("expected state " + path,
                           "bad magic, format version or header checksum");
  }
  const size_t size = kHeaderBytes + static_cast<size_t>(h.keys) * kKeyBytes;
  if (s.ok() && static_cast<size_t>(st.st_size) != size) {
    s = Status::Corruption("expected state " + path, "size " + std::to_string(st.st_size) +
                                                         " is not that of " +
                                                         std::to_string(h.keys) + " keys");
  }
  void* base = nullptr;
  if (s.ok()) s = Map(path, fd, size, &base);
  if (!s.ok()) {
    close(fd);
    return s;
  }
  state->reset(new ExpectedState(fd, base, size, h.keys, h.workers));
  return Status::OK();
}

uint32_t* ExpectedState::Word(uint32_t key, Field f) const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(base_) + kHeaderBytes +
                                     static_cast<size_t>(key) * kKeyBytes) +
         f;
}

uint32_t ExpectedState::Load(uint32_t key, Field f) const {
  return std::atomic_ref<uint32_t>(*Word(key, f)).load();
}

void ExpectedState::Store(uint32_t key, Field f, uint32_t v) {
  std::atomic_ref<uint32_t>(*Word(key, f)).store(v);
}

uint64_t* ExpectedState::CounterWord(Counter c) const {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(base_) + kCountersOffset) +
         static_cast<int>(c);
}

uint32_t ExpectedState::BeginPut(uint32_t key) {
  const uint32_t v = Load(key, kNext);
  Store(key, kNext, v + 1);
  Store(key, kHi, v);  // before the operation: a kill from here on may leave it
  return v;
}

uint32_t ExpectedState::BeginDelete(uint32_t key) {
  const uint32_t v = Load(key, kNext);
  Store(key, kNext, v + 1);
  Store(key, kDel, v);
  Store(key, kHi, v);
  return v;
}

void ExpectedState::Acknowledge(uint32_t key, uint32_t version) { Store(key, kLo, version); }

Verdict ExpectedState::Judge(uint32_t key, const Rule& rule, const Observation& seen) const {
  const uint32_t hi = Load(key, kHi);
  const uint32_t del = Load(key, kDel);
  switch (seen.kind) {
    case Observation::kCorrupt:
      return Verdict::kWrong;
    case Observation::kAbsent:
      if (del >= rule.floor) return Verdict::kOk;  // a delete at or after the floor
      if (rule.after_crash && hi > rule.floor) return Verdict::kOk;  // a put retired it
      return rule.may_drop ? Verdict::kDropped : Verdict::kLost;
    case Observation::kValue:
      if (seen.version > hi || seen.version == 0) return Verdict::kWrong;
      if (seen.version >= rule.floor) return Verdict::kOk;
      // Older than the floor: a value a known delete removed, or a superseded version.
      return del > seen.version && del <= rule.floor ? Verdict::kResurrected : Verdict::kWrong;
  }
  return Verdict::kWrong;
}

Verdict ExpectedState::JudgeExists(uint32_t key, const Rule& rule, bool present) const {
  if (!present) return Judge(key, rule, Observation{Observation::kAbsent, 0});
  const uint32_t hi = Load(key, kHi);
  const uint32_t del = Load(key, kDel);
  if (hi == 0) return Verdict::kWrong;  // never written
  // Present needs some version in [floor, hi] that is a put: only a key whose sole
  // allowed state is a delete (floor == hi == del) may not be present.
  if (rule.floor == hi && del == hi) return Verdict::kResurrected;
  return Verdict::kOk;
}

std::string ExpectedState::Describe(uint32_t key) const {
  return "acknowledged " + std::to_string(Load(key, kLo)) + ", in flight up to " +
         std::to_string(Load(key, kHi)) + ", durable " + std::to_string(Load(key, kDurable)) +
         ", last delete " + std::to_string(Load(key, kDel));
}

std::vector<uint32_t> ExpectedState::SnapshotLo() const {
  std::vector<uint32_t> lo(keys_);
  for (uint32_t k = 0; k < keys_; k++) lo[k] = Load(k, kLo);
  return lo;
}

void ExpectedState::CommitFlush(const std::vector<uint32_t>& snapshot) {
  for (uint32_t k = 0; k < keys_ && k < snapshot.size(); k++) {
    std::atomic_ref<uint32_t> durable(*Word(k, kDurable));
    uint32_t old = durable.load();
    while (old < snapshot[k] && !durable.compare_exchange_weak(old, snapshot[k])) {
    }
  }
}

void ExpectedState::Resolve(uint32_t key, const Observation& seen, bool after_crash) {
  if (!after_crash) {
    const uint32_t to = seen.kind == Observation::kValue ? seen.version : Load(key, kDel);
    if (to > Load(key, kLo) && to <= Load(key, kHi)) Store(key, kLo, to);
    return;
  }
  if (seen.kind == Observation::kValue) {
    // The versions after it were lost; the deletes after it too.
    if (Load(key, kDel) > seen.version) Store(key, kDel, 0);
    Store(key, kHi, seen.version);
    Store(key, kLo, seen.version);
    return;
  }
  // Absent (or unreadable, which a failed verification already counted): a new delete.
  const uint32_t v = BeginDelete(key);
  Acknowledge(key, v);
}

void ExpectedState::Add(Counter c, uint64_t n) {
  std::atomic_ref<uint64_t>(*CounterWord(c)).fetch_add(n);
}

uint64_t ExpectedState::Get(Counter c) const {
  return std::atomic_ref<uint64_t>(*CounterWord(c)).load();
}

std::string ExpectedState::Summary() const {
  // The summary's first six fields are the crash test's line; the rest follow.
  static const Counter kOrder[] = {Counter::kRounds,  Counter::kOps,     Counter::kVerifiedReads,
                                   Counter::kLost,    Counter::kWrong,   Counter::kResurrected,
                                   Counter::kErrors,  Counter::kRefused, Counter::kReadRefused,
                                   Counter::kDropped, Counter::kFlushes};
  std::string out;
  for (Counter c : kOrder) {
    if (!out.empty()) out += ", ";
    out += std::to_string(Get(c)) + " " + CounterName(c);
  }
  return out;
}

}  // namespace kvengine::stress
