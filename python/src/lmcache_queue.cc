#include "python/src/lmcache_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "util/printable.h"

namespace kvengine {
namespace lmcache {

namespace {

const char* OpName(BatchOp op) {
  switch (op) {
    case BatchOp::kSet:
      return "set";
    case BatchOp::kGet:
      return "get";
    case BatchOp::kExists:
      return "exists";
    case BatchOp::kDelete:
      return "delete";
  }
  return "?";
}

// Counts the keys that failed, with the first failure, for the completion's error:
// "set: 2 of 8 keys failed; first: key 'm@..': NoSpace: ...".
class FailureNote {
 public:
  FailureNote(BatchOp op, size_t keys) : op_(op), keys_(keys) {}
  void Add(const std::string& key, const std::string& why) {
    // Printable: LMCache logs the completion's error, and a key may be 64 KiB long.
    if (failed_++ == 0) first_ = "key " + kvengine::Printable(kvengine::Slice(key)) + ": " + why;
  }
  size_t failed() const { return failed_; }
  std::string ToString() const {
    if (failed_ == 0) return "";
    return std::string(OpName(op_)) + ": " + std::to_string(failed_) + " of " +
           std::to_string(keys_) + " keys failed; first: " + first_;
  }

 private:
  BatchOp op_;
  size_t keys_;
  size_t failed_ = 0;
  std::string first_;
};

std::string CodeText(int64_t code) {
  Status s = Status::FromErrorCode(static_cast<int>(code));
  return Status::CodeName(s.code());
}

}  // namespace

Status LMCacheQueue::Create(std::shared_ptr<DB> db, const QueueOptions& options,
                            std::unique_ptr<LMCacheQueue>* result) {
  result->reset();
  if (!db) return Status::InvalidArgument("LMCacheQueue: no store");
  if (options.workers < 1 || options.workers > 256) {
    return Status::InvalidArgument("LMCacheQueue: workers must be 1..256, not " +
                                   std::to_string(options.workers));
  }
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return Status::IOError(std::string("eventfd: ") + std::strerror(errno));
  std::unique_ptr<LMCacheQueue> queue(new LMCacheQueue(std::move(db), options, fd));
  for (int i = 0; i < options.workers; ++i) {
    queue->workers_.emplace_back([q = queue.get()] { q->WorkLoop(); });
  }
  *result = std::move(queue);
  return Status::OK();
}

LMCacheQueue::LMCacheQueue(std::shared_ptr<DB> db, const QueueOptions& options, int event_fd)
    : options_(options), event_fd_(event_fd), db_(std::move(db)) {}

LMCacheQueue::~LMCacheQueue() { Close(); }

Status LMCacheQueue::Submit(BatchRequest request, uint64_t* future_id) {
  const bool with_buffers = request.op == BatchOp::kSet || request.op == BatchOp::kGet;
  const size_t want = with_buffers ? request.keys.size() : 0;
  if (request.buffers.size() != want) {
    return Status::InvalidArgument(std::string(OpName(request.op)) + ": " +
                                   std::to_string(request.buffers.size()) + " buffers for " +
                                   std::to_string(request.keys.size()) + " keys");
  }
  auto batch = std::make_shared<Batch>();
  batch->request = std::move(request);
  batch->results.assign(batch->request.keys.size(), 0);
  std::vector<Part> parts = Cut(batch);
  MutexLock l(&mu_);
  if (closing_) return Status::Aborted("the kvengine LMCache plug-in is closed");
  batch->future_id = *future_id = next_future_id_++;
  batch->parts_left = parts.size();
  for (Part& p : parts) queue_.push_back(std::move(p));
  if (parts.size() == 1) {
    work_cv_.NotifyOne();
  } else {
    work_cv_.NotifyAll();
  }
  return Status::OK();
}

std::vector<LMCacheQueue::Part> LMCacheQueue::Cut(const std::shared_ptr<Batch>& batch) const {
  const BatchRequest& req = batch->request;
  const size_t n = req.keys.size();
  std::vector<Part> parts;
  bool cut = false;
  if (!req.buffers.empty()) {
    uint64_t total = 0;
    for (const MutableSlice& b : req.buffers) total += b.size();
    cut = total > options_.part_bytes;
  }
  if (cut && req.op == BatchOp::kSet) {
    std::unordered_set<std::string_view> seen;
    for (const std::string& k : req.keys) cut = cut && seen.insert(k).second;
  }
  if (!cut) {
    parts.push_back(Part{batch, 0, n});
    return parts;
  }
  size_t begin = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i > begin && bytes + req.buffers[i].size() > options_.part_bytes) {
      parts.push_back(Part{batch, begin, i});
      begin = i;
      bytes = 0;
    }
    bytes += req.buffers[i].size();
  }
  parts.push_back(Part{batch, begin, n});
  return parts;
}

std::vector<BatchCompletion> LMCacheQueue::Drain() {
  std::vector<BatchCompletion> out;
  MutexLock l(&mu_);
  // Reset before taking the list: a completion added after this read writes the fd again.
  if (!closed_) {
    uint64_t count;
    ssize_t n = ::read(event_fd_, &count, sizeof(count));
    (void)n;  // EAGAIN: nothing was signalled, the list may still hold cancelled batches
  }
  out.swap(completed_);
  return out;
}

void LMCacheQueue::ReplaceDb(std::shared_ptr<DB> db) {
  if (!db) return;
  MutexLock l(&mu_);
  db_ = std::move(db);
}

std::shared_ptr<DB> LMCacheQueue::CurrentDb() {
  MutexLock l(&mu_);
  return db_;
}

void LMCacheQueue::Close() {
  std::deque<Part> cancelled;
  {
    MutexLock l(&mu_);
    if (closing_) return;
    closing_ = true;
    cancelled.swap(queue_);
    work_cv_.NotifyAll();
  }
  for (const Part& part : cancelled) {
    FinishPart(part, Status::Aborted("the kvengine LMCache plug-in was closed"));
  }
  for (auto& t : workers_) t.join();
  workers_.clear();
  {
    MutexLock l(&registered_mu_);
    for (auto& [db, addr] : registered_) db->UnregisterBuffer(addr);
    registered_.clear();
    seen_.clear();
  }
  MutexLock l(&mu_);
  ::close(event_fd_);
  event_fd_ = -1;
  closed_ = true;
}

void LMCacheQueue::WorkLoop() {
  for (;;) {
    Part part;
    {
      MutexLock l(&mu_);
      while (queue_.empty() && !closing_) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // closing, and nothing left to run
      part = std::move(queue_.front());
      queue_.pop_front();
    }
    FinishPart(part, RunPart(part));
  }
}

void LMCacheQueue::FinishPart(const Part& part, const Status& s) {
  Batch* batch = part.batch.get();
  if (!s.ok()) {
    for (size_t i = part.begin; i < part.end; ++i) batch->results[i] = s.ErrorCode();
  }
  MutexLock l(&mu_);
  if (!s.ok() && batch->error.empty()) {
    batch->error = std::string(OpName(batch->request.op)) + ": " + s.ToString();
  }
  if (--batch->parts_left > 0) return;
  completed_.push_back(Evaluate(batch));
  const uint64_t one = 1;
  ssize_t n = ::write(event_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN only at a counter of 2^64-2: the fd is readable anyway
}

void LMCacheQueue::RegisterOnFirstSight(const std::shared_ptr<DB>& db,
                                        std::span<const MutableSlice> buffers) {
  MutexLock l(&registered_mu_);
  for (const MutableSlice& b : buffers) {
    if (b.size() == 0 || !seen_.insert(b.data()).second) continue;
    // An overlap with a registered buffer (LMCache's allocator reuses its memory with
    // other boundaries) is refused; that buffer simply goes unregistered.
    if (db->RegisterBuffer(b.data(), b.size()).ok()) registered_.emplace_back(db, b.data());
  }
}

// BatchPut of keys[i] = buffers[i].  A key that fails with Aborted (an attached store's
// reserved slot outlived: the copy into it came too late, on a loaded host, and nothing
// was published) is put once more.
Status LMCacheQueue::Put(DB* db, std::span<const Slice> keys, std::span<const MutableSlice> buffers,
                         std::vector<int64_t>* results) {
  std::vector<ValueParts> values(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    values[i].emplace_back(buffers[i].data(), buffers[i].size());
  }
  Status s = db->BatchPut(WriteOptions(), keys, values, results);
  if (!s.ok() || results->size() != keys.size()) return s;
  const int64_t aborted = Status::Aborted("").ErrorCode();
  std::vector<size_t> again;
  for (size_t i = 0; i < keys.size(); ++i) {
    if ((*results)[i] == aborted) again.push_back(i);
  }
  if (again.empty()) return s;
  std::vector<Slice> retry_keys;
  std::vector<ValueParts> retry_values;
  for (size_t i : again) {
    retry_keys.push_back(keys[i]);
    retry_values.push_back(values[i]);
  }
  std::vector<int64_t> retry_results;
  if (db->BatchPut(WriteOptions(), retry_keys, retry_values, &retry_results).ok() &&
      retry_results.size() == again.size()) {
    for (size_t j = 0; j < again.size(); ++j) (*results)[again[j]] = retry_results[j];
  }
  return s;
}

// One engine call for keys [begin, end); the per-key results go to the batch's range.
// Returns the call's own status (the whole part failed) or OK.
Status LMCacheQueue::RunPart(const Part& part) {
  BatchRequest& req = part.batch->request;
  const size_t n = part.end - part.begin;
  std::shared_ptr<DB> db = CurrentDb();
  std::span<const MutableSlice> buffers;
  if (!req.buffers.empty()) buffers = std::span(req.buffers).subspan(part.begin, n);
  if (options_.register_buffers) RegisterOnFirstSight(db, buffers);
  std::vector<Slice> keys(req.keys.begin() + part.begin, req.keys.begin() + part.end);
  std::vector<int64_t> results;
  Status s;
  switch (req.op) {
    case BatchOp::kSet:
      s = Put(db.get(), keys, buffers, &results);
      break;
    case BatchOp::kGet: {
      std::vector<Destination> dests(n);
      for (size_t i = 0; i < n; ++i) dests[i].push_back(buffers[i]);
      s = db->BatchGetInto(ReadOptions(), keys, dests, &results);
      break;
    }
    case BatchOp::kExists:
      s = db->BatchExists(keys, &results);
      break;
    case BatchOp::kDelete:
      s = db->BatchDelete(WriteOptions(), keys, &results);
      break;
  }
  if (s.ok() && results.size() != n) s = Status::IOError("the store returned no per-key results");
  if (s.ok()) std::copy(results.begin(), results.end(), part.batch->results.begin() + part.begin);
  return s;
}

// The completion LMCache reads, from every key's result.
BatchCompletion LMCacheQueue::Evaluate(Batch* batch) {
  BatchRequest& req = batch->request;
  BatchCompletion c;
  c.future_id = batch->future_id;
  c.keepalive = std::move(req.keepalive);
  c.has_per_key = req.op != BatchOp::kSet;
  c.per_key.assign(c.has_per_key ? req.keys.size() : 0, 0);
  const int64_t not_found = Status::NotFound("").ErrorCode();
  FailureNote note(req.op, req.keys.size());
  for (size_t i = 0; i < req.keys.size(); ++i) {
    const int64_t r = batch->results[i];
    switch (req.op) {
      case BatchOp::kSet:
        if (r < 0) note.Add(req.keys[i], CodeText(r));
        break;
      case BatchOp::kGet:
        if (r == static_cast<int64_t>(req.buffers[i].size())) {
          c.per_key[i] = 1;
        } else if (r >= 0) {
          // A value of another size (a stale chunk of another layout): the buffer was not
          // filled as LMCache expects, so it does not count as loaded.
          note.Add(req.keys[i], "value is " + std::to_string(r) + " bytes, buffer " +
                                    std::to_string(req.buffers[i].size()));
        } else {
          note.Add(req.keys[i], CodeText(r));
        }
        break;
      case BatchOp::kExists:
        if (r == 1) c.per_key[i] = 1;
        if (r < 0) note.Add(req.keys[i], CodeText(r));
        break;
      case BatchOp::kDelete:
        if (r == 0) c.per_key[i] = 1;
        if (r < 0 && r != not_found) note.Add(req.keys[i], CodeText(r));
        break;
    }
  }
  c.ok = note.failed() == 0 && batch->error.empty();
  // A part that failed whole says why in its own words; otherwise the keys that failed.
  c.error = !batch->error.empty() ? batch->error : note.ToString();
  return c;
}

}  // namespace lmcache
}  // namespace kvengine
