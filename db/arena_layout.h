// ArenaLayout: how the memory tier's arena is cut into arenas, one per trust boundary
// (Options::namespace_arenas; docs/attach.md, "An arena per trust boundary").
//
// Part 0 is the default arena: the default namespace and every namespace no entry
// names.  Each entry of the option is another part, of its own size, holding the values
// of the namespaces it names and of no other.  The parts are fixed when the DB opens:
// memory never moves from one part to another while it runs, so a byte that held one
// part's value is never handed to another part's namespaces (on the next Open every
// part is fresh memory, which the kernel clears).  With a shared arena (local_listen)
// each part is a memfd of its own, mapped by the owner at its place in one contiguous
// range and passed only to the clients whose grant includes one of its namespaces.
//
// A namespace's id is a hash of its name (util/namespace_key.h), so the part of a key
// is known from the key alone -- a value put through a peer or promoted from SSD lands
// in the same part as one put through attach.
//
// Thread-safety: immutable after Parse.
#ifndef KVENGINE_DB_ARENA_LAYOUT_H_
#define KVENGINE_DB_ARENA_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvengine/options.h"
#include "kvengine/status.h"

namespace kvengine {

class ArenaLayout {
 public:
  // Parts beyond the default one an option may name.
  static constexpr size_t kMaxNamedParts = 15;

  struct Part {
    std::string names;                    // "default", or the entry's namespaces joined by '+'
    std::vector<std::string> namespaces;  // empty for the default part
    uint64_t offset = 0;                  // from the arena's first byte
    uint64_t size = 0;
  };

  // Parses options.namespace_arenas against the tier's size (memory_capacity_bytes in
  // whole slabs): entries `NAMES=SIZE` separated by ',' or ';', NAMES one namespace or
  // several joined by '+' (they share the part), SIZE as every size option ("512MiB").
  // Each named part is rounded up to whole 2 MiB chunks and slabs; the default part
  // comes first and takes what is left (the tier rounded down to whole chunks), at
  // least one chunk.  InvalidArgument naming the entry and what
  // is wrong: a malformed entry, a namespace named twice, "default", a size of zero, or
  // parts that leave the default one no room.
  static Status Parse(const Options& options, ArenaLayout* layout);

  // The layout of one part: the whole tier.
  static ArenaLayout Single(uint64_t size);

  size_t part_count() const { return parts_.size(); }
  const Part& part(size_t i) const { return parts_[i]; }
  bool single() const { return parts_.size() == 1; }
  // The whole arena's size: the parts' sizes added.
  uint64_t total_size() const;

  // The part holding namespace `id`'s values (0 for the default namespace and every
  // namespace no entry names).
  uint32_t PartOfId(uint64_t id) const;
  // The part of a stored key's namespace (util/namespace_key.h).
  uint32_t PartOfKey(std::string_view key) const;
  // The part holding namespace `name`'s values ("": the default namespace).
  uint32_t PartOfName(std::string_view name) const;

 private:
  std::vector<Part> parts_;
  std::vector<std::pair<uint64_t, uint32_t>> ids_;  // namespace id -> part, by id
};

}  // namespace kvengine

#endif  // KVENGINE_DB_ARENA_LAYOUT_H_
