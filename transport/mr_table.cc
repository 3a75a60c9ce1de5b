#include "transport/mr_table.h"

#include <iterator>

namespace kvengine {

Status MrTable::Add(const Region& r) {
  if (r.length == 0) return Status::InvalidArgument("memory region is empty");
  MutexLock lock(&mu_);
  auto next = regions_.lower_bound(r.start);
  bool overlaps = next != regions_.end() && next->first < r.start + r.length;
  if (next != regions_.begin()) {
    auto prev = std::prev(next);
    overlaps |= prev->first + prev->second.length > r.start;
  }
  if (overlaps) return Status::InvalidArgument("memory region overlaps a registered one");
  regions_.emplace(r.start, r);
  return Status::OK();
}

bool MrTable::Remove(const void* addr, Region* removed) {
  MutexLock lock(&mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == regions_.end()) return false;
  *removed = it->second;
  regions_.erase(it);
  return true;
}

bool MrTable::Find(const void* addr, size_t length, Region* out) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  MutexLock lock(&mu_);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return false;
  --it;
  if (a + length < a || a + length > it->first + it->second.length) return false;
  *out = it->second;
  return true;
}

size_t MrTable::size() const {
  MutexLock lock(&mu_);
  return regions_.size();
}

std::vector<MrTable::Region> MrTable::All() const {
  MutexLock lock(&mu_);
  std::vector<Region> all;
  for (const auto& [start, r] : regions_) all.push_back(r);
  return all;
}

}  // namespace kvengine
