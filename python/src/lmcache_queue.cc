#include "python/src/lmcache_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

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
    if (failed_++ == 0) first_ = "key '" + key + "': " + why;
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
  MutexLock l(&mu_);
  if (closing_) return Status::Aborted("the kvengine LMCache plug-in is closed");
  *future_id = next_future_id_++;
  queue_.push_back(Job{*future_id, std::move(request)});
  work_cv_.NotifyOne();
  return Status::OK();
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
  {
    MutexLock l(&mu_);
    if (closing_) return;
    closing_ = true;
    while (!queue_.empty()) {
      Job job = std::move(queue_.front());
      queue_.pop_front();
      BatchCompletion c;
      c.future_id = job.future_id;
      c.error = std::string(OpName(job.request.op)) + ": the kvengine LMCache plug-in was closed";
      c.has_per_key = job.request.op != BatchOp::kSet;
      c.per_key.assign(c.has_per_key ? job.request.keys.size() : 0, 0);
      c.keepalive = std::move(job.request.keepalive);
      completed_.push_back(std::move(c));
    }
    work_cv_.NotifyAll();
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
    Job job;
    {
      MutexLock l(&mu_);
      while (queue_.empty() && !closing_) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // closing, and nothing left to run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Complete(Run(std::move(job)));
  }
}

void LMCacheQueue::Complete(BatchCompletion completion) {
  MutexLock l(&mu_);
  completed_.push_back(std::move(completion));
  const uint64_t one = 1;
  ssize_t n = ::write(event_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN only at a counter of 2^64-2: the fd is readable anyway
}

void LMCacheQueue::RegisterOnFirstSight(const std::shared_ptr<DB>& db,
                                        const std::vector<MutableSlice>& buffers) {
  MutexLock l(&registered_mu_);
  for (const MutableSlice& b : buffers) {
    if (b.size() == 0 || !seen_.insert(b.data()).second) continue;
    // An overlap with a registered buffer (LMCache's allocator reuses its memory with
    // other boundaries) is refused; that buffer simply goes unregistered.
    if (db->RegisterBuffer(b.data(), b.size()).ok()) {
      registered_.emplace_back(db, b.data());
    }
  }
}

BatchCompletion LMCacheQueue::Run(Job job) {
  BatchRequest& req = job.request;
  BatchCompletion c;
  c.future_id = job.future_id;
  c.keepalive = std::move(req.keepalive);
  c.has_per_key = req.op != BatchOp::kSet;
  c.per_key.assign(c.has_per_key ? req.keys.size() : 0, 0);

  std::shared_ptr<DB> db = CurrentDb();
  if (options_.register_buffers) RegisterOnFirstSight(db, req.buffers);
  std::vector<Slice> keys(req.keys.begin(), req.keys.end());
  std::vector<int64_t> results;
  Status s;
  switch (req.op) {
    case BatchOp::kSet: {
      std::vector<ValueParts> values(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        values[i].emplace_back(req.buffers[i].data(), req.buffers[i].size());
      }
      s = db->BatchPut(WriteOptions(), keys, values, &results);
      break;
    }
    case BatchOp::kGet: {
      std::vector<Destination> dests(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) dests[i].push_back(req.buffers[i]);
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
  if (!s.ok() || results.size() != keys.size()) {
    c.error = std::string(OpName(req.op)) + ": " +
              (s.ok() ? std::string("the store returned no per-key results") : s.ToString());
    return c;
  }
  FailureNote note(req.op, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t r = results[i];
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
        } else if (r != Status::NotFound("").ErrorCode()) {
          note.Add(req.keys[i], CodeText(r));
        } else {
          note.Add(req.keys[i], "NotFound");
        }
        break;
      case BatchOp::kExists:
        if (r == 1) c.per_key[i] = 1;
        if (r < 0) note.Add(req.keys[i], CodeText(r));
        break;
      case BatchOp::kDelete:
        if (r == 0) c.per_key[i] = 1;
        if (r < 0 && r != Status::NotFound("").ErrorCode()) note.Add(req.keys[i], CodeText(r));
        break;
    }
  }
  c.ok = note.failed() == 0;
  c.error = note.ToString();
  return c;
}

}  // namespace lmcache
}  // namespace kvengine
