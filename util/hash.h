// Checksums and hashes: XXH3 (xxHash) everywhere, for speed on multi-MiB values.
#ifndef KVENGINE_UTIL_HASH_H_
#define KVENGINE_UTIL_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvengine {

uint64_t Hash64(const void* data, size_t size);
inline uint64_t Hash64(std::string_view s) { return Hash64(s.data(), s.size()); }

// XXH3-128 of data: a key's fingerprint (see db/ssd_index.h).
struct Hash128Value {
  uint64_t low = 0;
  uint64_t high = 0;
};
Hash128Value Hash128(const void* data, size_t size);

// Incremental XXH3-64 over several pieces; equals Hash64 of their concatenation.
class Hasher64 {
 public:
  Hasher64();
  ~Hasher64();
  Hasher64(const Hasher64&) = delete;
  Hasher64& operator=(const Hasher64&) = delete;
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  void* state_;
};

}  // namespace kvengine

#endif  // KVENGINE_UTIL_HASH_H_
