#include "util/region_map.h"

#include <iterator>
#include <string>

#include "util/input_check.h"

namespace kvengine {

Status RegionMap::Add(void* addr, size_t length, const char* what) {
  Status s = input::CheckRegion(addr, length);
  if (!s.ok()) return Status::InvalidArgument(std::string(what) + ": " + s.message());
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  MutexLock lock(&mu_);
  auto next = regions_.lower_bound(start);
  bool overlaps = next != regions_.end() && next->first < start + length;
  if (next != regions_.begin()) {
    auto prev = std::prev(next);
    overlaps |= prev->first + prev->second > start;
  }
  if (overlaps) {
    return Status::InvalidArgument(std::string(what) + ": region overlaps a registered one");
  }
  regions_.emplace(start, length);
  return Status::OK();
}

size_t RegionMap::Remove(void* addr) {
  MutexLock lock(&mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == regions_.end()) return 0;
  const size_t n = it->second;
  regions_.erase(it);
  return n;
}

std::vector<std::pair<void*, size_t>> RegionMap::TakeAll() {
  MutexLock lock(&mu_);
  std::vector<std::pair<void*, size_t>> all;
  for (const auto& [start, length] : regions_)
    all.emplace_back(reinterpret_cast<void*>(start), length);
  regions_.clear();
  return all;
}

size_t RegionMap::size() const {
  MutexLock lock(&mu_);
  return regions_.size();
}

}  // namespace kvengine
