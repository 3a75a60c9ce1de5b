// How a namespace's keys are stored: the internal key encoding of DB namespaces
// (docs/namespace_format.md, "Keys").
//
// A key of namespace N is stored, in every tier and on the wire to peers, as
//   0xFE | N's id (8 bytes, big-endian) | the key as the namespace's user gave it
// and a key of the default namespace as itself.  The default namespace refuses keys whose
// first byte is 0xFE (input::CheckDefaultNamespaceKey), so the two never meet: a key of
// one namespace never matches, overwrites or deletes a key of another.  The id is the
// XXH3-64 of the namespace's name, recorded in the registry at CreateNamespace (so two
// hosts of a cluster that create the same name agree on its keys).
//
// DO NOT CHANGE kMarker or the layout: they are part of the keys stored on SSD.
#ifndef KVENGINE_UTIL_NAMESPACE_KEY_H_
#define KVENGINE_UTIL_NAMESPACE_KEY_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kvengine/status.h"

namespace kvengine::ns {

inline constexpr unsigned char kMarker = 0xFE;
inline constexpr size_t kPrefixSize = 1 + 8;

// Whether `key` is in the reserved space of namespaced keys.
inline bool IsNamespaced(std::string_view key) {
  return !key.empty() && static_cast<unsigned char>(key[0]) == kMarker;
}

// The id a new namespace called `name` gets.
uint64_t IdOf(std::string_view name);

// Writes the kPrefixSize bytes every key of namespace `id` starts with at dst.
inline void EncodePrefix(uint64_t id, char* dst) {
  dst[0] = static_cast<char>(kMarker);
  for (size_t i = 0; i < 8; i++) dst[1 + i] = static_cast<char>(id >> (56 - 8 * i));
}

// The same bytes as a string.
std::string Prefix(uint64_t id);

// The id of a namespaced key's prefix.  REQUIRES: IsNamespaced(key), key.size() >= kPrefixSize.
// Inline: the memory tier compares it with a tagged item's id on every lookup (db/item.h).
inline uint64_t IdOfKey(std::string_view key) {
  uint64_t id;
  std::memcpy(&id, key.data() + 1, sizeof(id));
  if constexpr (std::endian::native == std::endian::little) id = __builtin_bswap64(id);
  return id;
}

// Stores in *pattern a DeleteByRegex pattern (whole-key, util/key_pattern.h) matching
// exactly the keys of namespace `id` whose user part matches `user_pattern`.
// REQUIRES: user_pattern compiles on its own (checked by the caller, so that no pattern
// can close the group and match outside the namespace).
// The user part is matched after the prefix, so the assertions about what precedes a
// position would see the prefix: a leading '^' becomes an empty group (the match is of
// the whole key anyway), and any other '^', '\A', '\b' or '\B' outside a class is
// InvalidArgument.
Status PatternInNamespace(uint64_t id, std::string_view user_pattern, std::string* pattern);

// The same for the default namespace: the keys that match `user_pattern` and are not
// namespaced.  REQUIRES as above.
std::string PatternInDefault(std::string_view user_pattern);

// Every key of namespace `id`.
std::string AllKeysOfNamespace(uint64_t id);

// Regex text (util/key_pattern.h) that matches exactly the bytes of Prefix(id).
std::string PrefixPattern(uint64_t id);

}  // namespace kvengine::ns

#endif  // KVENGINE_UTIL_NAMESPACE_KEY_H_
