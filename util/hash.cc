#include "util/hash.h"

#include <xxhash.h>

namespace kvengine {

uint64_t Hash64(const void* data, size_t size) { return XXH3_64bits(data, size); }

Hasher64::Hasher64() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Hasher64::~Hasher64() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher64::Update(const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
uint64_t Hasher64::Digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

}  // namespace kvengine
