#include "db/prefetcher.h"

#include <memory>

namespace kvengine {

namespace {
// One SSD submission reads at most this many values, or this many bytes: a waiter of
// the first key does not wait for a whole long queue.
constexpr size_t kJobsPerLoad = 64;
constexpr uint64_t kBytesPerLoad = 64ull << 20;
}  // namespace

Prefetcher::Prefetcher(MemoryTier* memory, SsdTier* ssd, uint64_t max_bytes, bool verify_checksums,
                       const Counters& counters)
    : memory_(memory),
      ssd_(ssd),
      max_bytes_(max_bytes),
      verify_checksums_(verify_checksums),
      counters_(counters) {
  thread_ = std::thread([this] { Run(); });
}

Prefetcher::~Prefetcher() { Stop(); }

void Prefetcher::Stop() {
  std::vector<Job> dropped;
  {
    MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    dropped.assign(queue_.begin(), queue_.end());
    queue_.clear();
  }
  work_cv_.NotifyAll();
  Finish(dropped);
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::Submit(std::span<const Slice> keys, std::vector<int64_t>* results) {
  counters_.requested->fetch_add(keys.size(), std::memory_order_relaxed);
  std::vector<uint8_t> in_memory;
  memory_->BatchContains(keys, &in_memory);
  uint64_t queued = 0;
  uint64_t dropped = 0;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); i++) {
      (*results)[i] = 0;
      if (in_memory[i] || stopping_) continue;
      SsdLocation loc;
      if (!ssd_->Locate(keys[i], &loc)) continue;  // absent: nothing to bring up
      std::string key = keys[i].ToString();
      if (in_flight_.count(key) != 0) continue;
      if (in_flight_bytes_.load(std::memory_order_relaxed) + loc.size > max_bytes_) {
        dropped++;
        continue;
      }
      in_flight_bytes_.fetch_add(loc.size, std::memory_order_relaxed);
      in_flight_.insert(key);
      queue_.push_back(Job{std::move(key), loc.size});
      (*results)[i] = 1;
      queued++;
    }
    in_flight_keys_.store(in_flight_.size(), std::memory_order_release);
  }
  counters_.queued->fetch_add(queued, std::memory_order_relaxed);
  counters_.dropped->fetch_add(dropped, std::memory_order_relaxed);
  if (queued > 0) work_cv_.NotifyOne();
}

void Prefetcher::AwaitKeys(std::span<const Slice> keys) {
  if (in_flight_keys_.load(std::memory_order_acquire) == 0) return;
  MutexLock lock(&mu_);
  for (const Slice& key : keys) {
    const std::string k = key.ToString();
    while (in_flight_.count(k) != 0) done_cv_.Wait(&mu_);
  }
}

void Prefetcher::NoteReads(std::span<const Slice> keys, const std::vector<bool>& found) {
  if (unread_count_.load(std::memory_order_relaxed) == 0) return;
  uint64_t hits = 0;
  uint64_t wasted = 0;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size() && !unread_.empty(); i++) {
      auto it = unread_.find(keys[i].ToString());
      if (it == unread_.end()) continue;
      (found[i] ? hits : wasted)++;
      unread_order_.erase(it->second);
      unread_.erase(it);
    }
    unread_count_.store(unread_.size(), std::memory_order_relaxed);
  }
  counters_.hits->fetch_add(hits, std::memory_order_relaxed);
  counters_.wasted->fetch_add(wasted, std::memory_order_relaxed);
}

void Prefetcher::Follow(const std::string& key) {
  auto it = unread_.find(key);
  if (it != unread_.end()) unread_order_.erase(it->second);
  unread_order_.push_back(key);
  unread_[key] = std::prev(unread_order_.end());
  while (unread_.size() > kPendingReads) {
    // The oldest is no longer followed: wasted when it is gone already.
    const std::string& oldest = unread_order_.front();
    if (!memory_->Contains(oldest)) counters_.wasted->fetch_add(1, std::memory_order_relaxed);
    unread_.erase(oldest);
    unread_order_.pop_front();
  }
  unread_count_.store(unread_.size(), std::memory_order_relaxed);
}

void Prefetcher::Run() {
  std::vector<Job> jobs;
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_cv_.Wait(&mu_);
      if (stopping_) return;
      uint64_t bytes = 0;
      while (!queue_.empty() && jobs.size() < kJobsPerLoad &&
             (jobs.empty() || bytes + queue_.front().size <= kBytesPerLoad)) {
        bytes += queue_.front().size;
        jobs.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    Load(&jobs);
    Finish(jobs);
    jobs.clear();
  }
}

void Prefetcher::Load(std::vector<Job>* jobs) {
  std::vector<std::unique_ptr<char[]>> buffers(jobs->size());
  std::vector<MutableSlice> dests(jobs->size());
  std::vector<SsdTier::Read> reads(jobs->size());
  for (size_t j = 0; j < jobs->size(); j++) {
    const Job& job = (*jobs)[j];
    buffers[j] = std::make_unique<char[]>(job.size > 0 ? job.size : 1);
    dests[j] = MutableSlice(buffers[j].get(), job.size);
    reads[j].key = Slice(job.key);
    reads[j].dest = std::span<const MutableSlice>(&dests[j], 1);
  }
  ssd_->MultiGet(reads, verify_checksums_);
  uint64_t prefetched = 0;
  uint64_t dropped = 0;
  std::vector<const std::string*> inserted;
  for (size_t j = 0; j < reads.size(); j++) {
    const SsdTier::Read& r = reads[j];
    // NotFound: deleted, or brought into memory by a read or a put meanwhile.
    if (r.status.IsNotFound()) continue;
    if (!r.status.ok()) {  // replaced by a larger value, or unreadable (the read says why)
      dropped++;
      continue;
    }
    const Slice part(buffers[j].get(), r.size);
    const uint64_t version = r.version;
    if (memory_->Insert(r.key, std::span<const Slice>(&part, 1), r.size, version,
                        [&] { return ssd_->HasVersion(r.key, version); })) {
      prefetched++;
      inserted.push_back(&(*jobs)[j].key);
    } else if (!memory_->Contains(r.key)) {
      dropped++;  // no room that could be made
    }
  }
  counters_.prefetched->fetch_add(prefetched, std::memory_order_relaxed);
  counters_.dropped->fetch_add(dropped, std::memory_order_relaxed);
  if (inserted.empty()) return;
  MutexLock lock(&mu_);
  for (const std::string* key : inserted) Follow(*key);
}

void Prefetcher::Finish(const std::vector<Job>& jobs) {
  if (jobs.empty()) return;
  {
    MutexLock lock(&mu_);
    for (const Job& job : jobs) {
      in_flight_.erase(job.key);
      in_flight_bytes_.fetch_sub(job.size, std::memory_order_relaxed);
    }
    in_flight_keys_.store(in_flight_.size(), std::memory_order_release);
  }
  done_cv_.NotifyAll();
}

}  // namespace kvengine
