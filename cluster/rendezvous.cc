#include "cluster/rendezvous.h"

#include <algorithm>
#include <utility>

#include "util/hash.h"

namespace kvengine {

uint64_t RendezvousScore(const Slice& key, const std::string& member) {
  Hasher64 h;
  h.Update(key.data(), key.size());
  const char zero = 0;
  h.Update(&zero, 1);
  h.Update(member.data(), member.size());
  return h.Digest();
}

std::vector<std::string> TopOwners(const Slice& key, const std::vector<std::string>& names,
                                   size_t r) {
  std::vector<std::pair<uint64_t, const std::string*>> scored;
  scored.reserve(names.size());
  for (const std::string& n : names) scored.emplace_back(RendezvousScore(key, n), &n);
  r = std::min(r, scored.size());
  std::partial_sort(scored.begin(), scored.begin() + r, scored.end(),
                    [](const auto& a, const auto& b) {
                      return a.first != b.first ? a.first > b.first : *a.second > *b.second;
                    });
  std::vector<std::string> out;
  out.reserve(r);
  for (size_t i = 0; i < r; i++) out.push_back(*scored[i].second);
  return out;
}

}  // namespace kvengine
