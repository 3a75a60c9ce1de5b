#include "db/removal_feed.h"

#include <algorithm>

namespace kvengine {

void RemovalFeed::RecordSlow(std::string_view key, RemovalEvent::Tier tier,
                             RemovalEvent::Reason reason) {
  const uint64_t now = clock_->NowMicros();  // outside the lock
  MutexLock lock(&mu_);
  const uint64_t seq = next_++;
  const size_t slot = static_cast<size_t>((seq - 1) % capacity_);
  if (ring_.size() <= slot) ring_.resize(slot + 1);
  RemovalEvent& e = ring_[slot];
  e.sequence = seq;
  e.time_micros = now;
  e.tier = tier;
  e.reason = reason;
  e.key.assign(key.data(), key.size());  // keeps the slot's buffer when it is big enough
}

void RemovalFeed::Read(uint64_t after, size_t max_events, RemovalBatch* batch) {
  recording_.store(true, std::memory_order_relaxed);
  batch->events.clear();
  batch->missed = 0;
  MutexLock lock(&mu_);
  const uint64_t last = next_ - 1;
  batch->last_sequence = last;
  if (after >= last || max_events == 0) return;
  // The oldest event the ring still holds.
  const uint64_t oldest = last >= capacity_ ? last - capacity_ + 1 : 1;
  uint64_t first = after + 1;
  if (first < oldest) {
    batch->missed = oldest - first;
    first = oldest;
  }
  const uint64_t end = std::min<uint64_t>(last, first + max_events - 1);
  batch->events.reserve(static_cast<size_t>(end - first + 1));
  for (uint64_t seq = first; seq <= end; seq++) {
    batch->events.push_back(ring_[static_cast<size_t>((seq - 1) % capacity_)]);
  }
}

uint64_t RemovalFeed::recorded() const {
  MutexLock lock(&mu_);
  return next_ - 1;
}

}  // namespace kvengine
