// The namespace registry file: which namespaces a DB directory has (name, id, options),
// which it dropped (tombstones, so that a cluster's members agree on a drop one of them
// missed), its on-disk form (docs/namespace_format.md) and its atomic replacement.
//
// The file is small (a few dozen bytes per namespace) and rewritten whole at each change:
// written to NAMESPACES.tmp, synced, renamed over NAMESPACES, and the directory synced,
// so that after a crash the file is either the old registry or the new one.  A file that
// fails any check (magic, version, checksum, a record that does not parse, a duplicate
// name or id) is Corruption naming the file and the problem: never read as a partial
// registry, which could merge two namespaces' keys.
//
// Thread-safety: the functions hold no state; callers serialise writes of one directory.
#ifndef KVENGINE_NAMESPACES_NAMESPACE_REGISTRY_H_
#define KVENGINE_NAMESPACES_NAMESPACE_REGISTRY_H_

#include <string>
#include <string_view>
#include <vector>

#include "kvengine/db.h"
#include "kvengine/env.h"

namespace kvengine {

inline constexpr char kNamespaceRegistryFile[] = "NAMESPACES";
// The most namespaces one DB may register.
inline constexpr size_t kMaxNamespaces = 4096;
// The most tombstones a registry keeps; past it the oldest are forgotten.
inline constexpr size_t kMaxNamespaceTombstones = 4096;

// One record of the registry: a namespace (live, or being dropped), or the tombstone its
// finished drop left.  `stamp` orders the changes of one name across the members of a
// cluster (namespaces/namespace_fleet.h): the record with the later stamp wins.  Records
// of a format 1 file have stamp 0.
struct NamespaceRecord {
  NamespaceInfo info;
  uint64_t stamp = 0;
  bool dropped = false;  // a tombstone: info.options are not meaningful
};

// The registry's contents, in the order they are stored (by name).
using NamespaceRecords = std::vector<NamespaceRecord>;

// Whether `a` supersedes `b`, two records of one name: the later stamp, and on a tie the
// later state (dropped, then dropping, then live), then the larger options -- an order
// every member computes alike, so that merging registries in any order converges.
bool Supersedes(const NamespaceRecord& a, const NamespaceRecord& b);

// NamespaceOptions a registry accepts: weight 1 to 1000.
Status CheckNamespaceOptions(const NamespaceOptions& options);

// The file's bytes for `records`.
std::string EncodeNamespaceRegistry(const NamespaceRecords& records);
// Parses a whole file (format 1 or 2); on failure returns Corruption naming the problem
// (prefixed by `what`, the file's name in messages) and leaves *records empty.
Status DecodeNamespaceRegistry(std::string_view data, const std::string& what,
                               NamespaceRecords* records);

// Reads dir/NAMESPACES into *records: empty when the file does not exist (a DB that never
// had a namespace), Corruption when it is damaged, the Env's error when unreadable.
Status LoadNamespaceRegistry(Env* env, const std::string& dir, NamespaceRecords* records);
// Replaces dir/NAMESPACES by `records`, atomically (see above).
Status SaveNamespaceRegistry(Env* env, const std::string& dir, const NamespaceRecords& records);

}  // namespace kvengine

#endif  // KVENGINE_NAMESPACES_NAMESPACE_REGISTRY_H_
