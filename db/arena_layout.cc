#include "db/arena_layout.h"

#include <algorithm>
#include <set>

#include "util/config_parse.h"
#include "util/input_check.h"
#include "util/namespace_key.h"

namespace kvengine {

namespace {

// Each part starts and ends on a 2 MiB boundary (a hugetlb memfd maps only whole huge
// pages) and on a slab boundary (a slab never straddles two parts).
uint64_t Granule(const Options& options) {
  return std::max<uint64_t>(options.memory_slab_size, 2ull << 20);
}

Status EntryError(std::string_view entry, const std::string& why) {
  return Status::InvalidArgument("namespace_arenas: entry '" + std::string(entry) + "': " + why);
}

}  // namespace

ArenaLayout ArenaLayout::Single(uint64_t size) {
  ArenaLayout layout;
  layout.parts_.push_back(Part{"default", {}, 0, size});
  return layout;
}

Status ArenaLayout::Parse(const Options& options, ArenaLayout* layout) {
  const uint64_t total =
      options.memory_capacity_bytes / options.memory_slab_size * options.memory_slab_size;
  if (options.namespace_arenas.empty()) {
    *layout = Single(total);
    return Status::OK();
  }
  const uint64_t granule = Granule(options);
  ArenaLayout out;
  std::set<std::string> seen;
  std::string_view spec = options.namespace_arenas;
  uint64_t named = 0;
  while (!spec.empty()) {
    const size_t end = spec.find_first_of(",;");
    std::string_view entry = spec.substr(0, end);
    spec.remove_prefix(end == std::string_view::npos ? spec.size() : end + 1);
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) return EntryError(entry, "expected NAMES=SIZE");
    Part part;
    part.names = std::string(entry.substr(0, eq));
    std::string_view names = entry.substr(0, eq);
    while (true) {
      const size_t plus = names.find('+');
      const std::string_view name = names.substr(0, plus);
      if (name == "default") {
        return EntryError(entry, "the default namespace is in the default arena");
      }
      Status s = input::CheckNamespaceName(name);
      if (!s.ok()) return EntryError(entry, s.ToString());
      if (!seen.insert(std::string(name)).second) {
        return EntryError(entry, "namespace '" + std::string(name) + "' is named twice");
      }
      part.namespaces.emplace_back(name);
      if (plus == std::string_view::npos) break;
      names.remove_prefix(plus + 1);
    }
    uint64_t size = 0;
    Status s = ParseSize(entry.substr(eq + 1), &size);
    if (!s.ok() || size == 0) return EntryError(entry, "expected a size above zero after '='");
    if (size > total) return EntryError(entry, "larger than the memory tier");
    part.size = (size + granule - 1) / granule * granule;
    named += part.size;
    if (out.parts_.size() == kMaxNamedParts) {
      return EntryError(entry, "more than " + std::to_string(kMaxNamedParts) + " arenas");
    }
    out.parts_.push_back(std::move(part));
  }
  if (out.parts_.empty()) {
    *layout = Single(total);
    return Status::OK();
  }
  // Cut into parts, the tier is whole granules (what it loses is under one).
  const uint64_t whole = total / granule * granule;
  if (named + granule > whole) {
    return Status::InvalidArgument(
        "namespace_arenas: the arenas take " + FormatSize(named) + " of the memory tier's " +
        FormatSize(whole) + " (memory_capacity_bytes), leaving the default arena less than " +
        FormatSize(granule));
  }
  // The default part first, with what the others leave; then the others, in order.
  out.parts_.insert(out.parts_.begin(), Part{"default", {}, 0, whole - named});
  uint64_t offset = 0;
  for (Part& part : out.parts_) {
    part.offset = offset;
    offset += part.size;
  }
  for (uint32_t i = 1; i < out.parts_.size(); i++) {
    for (const std::string& name : out.parts_[i].namespaces)
      out.ids_.emplace_back(ns::IdOf(name), i);
  }
  std::sort(out.ids_.begin(), out.ids_.end());
  *layout = std::move(out);
  return Status::OK();
}

uint64_t ArenaLayout::total_size() const {
  uint64_t total = 0;
  for (const Part& p : parts_) total += p.size;
  return total;
}

uint32_t ArenaLayout::PartOfId(uint64_t id) const {
  if (ids_.empty() || id == 0) return 0;
  auto it = std::lower_bound(ids_.begin(), ids_.end(), std::make_pair(id, uint32_t{0}));
  return it != ids_.end() && it->first == id ? it->second : 0;
}

uint32_t ArenaLayout::PartOfKey(std::string_view key) const {
  if (ids_.empty() || !ns::IsNamespaced(key) || key.size() < ns::kPrefixSize) return 0;
  return PartOfId(ns::IdOfKey(key));
}

uint32_t ArenaLayout::PartOfName(std::string_view name) const {
  return name.empty() ? 0 : PartOfId(ns::IdOf(name));
}

}  // namespace kvengine
