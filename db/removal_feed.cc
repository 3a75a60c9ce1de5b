#include "db/removal_feed.h"

#include <algorithm>

#include "util/namespace_key.h"

namespace kvengine {

void RemovalFeed::RecordSlow(std::string_view key, RemovalEvent::Tier tier,
                             RemovalEvent::Reason reason) {
  const uint64_t now = clock_->NowMicros();  // outside the lock
  MutexLock lock(&mu_);
  const uint64_t seq = next_++;
  const size_t slot = static_cast<size_t>((seq - 1) % capacity_);
  if (ring_.size() <= slot) {
    ring_.resize(slot + 1);
    ring_namespace_.resize(slot + 1);
  } else {  // the slot's event leaves the ring, the oldest its namespace holds
    tracks_[ring_namespace_[slot]].held.pop_front();
  }
  const uint64_t id = NamespaceOf(key);
  Track& track = tracks_[id];
  track.next++;
  track.held.push_back(seq);
  ring_namespace_[slot] = id;
  RemovalEvent& e = ring_[slot];
  e.sequence = seq;
  e.time_micros = now;
  e.tier = tier;
  e.reason = reason;
  e.key.assign(key.data(), key.size());  // keeps the slot's buffer when it is big enough
}

namespace {

// Fills *batch with the events numbered after `after` (at most max_events) of a numbering
// whose newest is `last` and whose oldest still held is `oldest`: the event numbered n is
// event(n), given that number.
template <class Event>
void Window(uint64_t after, size_t max_events, uint64_t last, uint64_t oldest, RemovalBatch* batch,
            Event event) {
  batch->last_sequence = last;
  if (after >= last || max_events == 0) return;
  uint64_t first = after + 1;
  if (first < oldest) {
    batch->missed = oldest - first;
    first = oldest;
  }
  const uint64_t end = std::min<uint64_t>(last, first + max_events - 1);
  batch->events.reserve(static_cast<size_t>(end - first + 1));
  for (uint64_t seq = first; seq <= end; seq++) {
    batch->events.push_back(event(seq));
    batch->events.back().sequence = seq;
  }
}

void Clear(RemovalBatch* batch) {
  batch->events.clear();
  batch->missed = 0;
  batch->last_sequence = 0;
}

}  // namespace

void RemovalFeed::Read(uint64_t after, size_t max_events, RemovalBatch* batch) {
  recording_.store(true, std::memory_order_relaxed);
  Clear(batch);
  MutexLock lock(&mu_);
  const uint64_t last = next_ - 1;
  const uint64_t oldest = last >= capacity_ ? last - capacity_ + 1 : 1;
  // The window's lambda runs under this lock; clang's analysis, which sees a lambda as a
  // function of its own, reads the ring through a plain pointer.
  const RemovalEvent* ring = ring_.data();
  Window(after, max_events, last, oldest, batch,
         [&ring, this](uint64_t seq) { return ring[static_cast<size_t>((seq - 1) % capacity_)]; });
}

void RemovalFeed::ReadNamespace(uint64_t id, uint64_t after, size_t max_events,
                                RemovalBatch* batch) {
  recording_.store(true, std::memory_order_relaxed);
  Clear(batch);
  MutexLock lock(&mu_);
  const auto it = tracks_.find(id);
  if (it == tracks_.end()) return;
  const Track& track = it->second;
  const uint64_t oldest = track.next - track.held.size();
  // The window's lambda runs under this lock; clang's analysis, which sees a lambda as a
  // function of its own, reads the ring through a plain pointer.
  const RemovalEvent* ring = ring_.data();
  Window(after, max_events, track.next - 1, oldest, batch, [&](uint64_t seq) {
    const uint64_t global = track.held[static_cast<size_t>(seq - oldest)];
    return ring[static_cast<size_t>((global - 1) % capacity_)];
  });
}

uint64_t RemovalFeed::NamespaceOf(std::string_view key) {
  if (!ns::IsNamespaced(key)) return 0;
  return key.size() >= ns::kPrefixSize ? ns::IdOfKey(key) : kNoNamespace;
}

uint64_t RemovalFeed::recorded() const {
  MutexLock lock(&mu_);
  return next_ - 1;
}

}  // namespace kvengine
