// The values kv_stress writes: each is a function of (key, version, size), so a value
// read back names the write it came from and is checked bit for bit.
//
//   bytes 0..7    kValueMagic
//   bytes 8..11   key index (little-endian)
//   bytes 12..15  version
//   bytes 16..19  size (the whole value's)
//   bytes 20..23  low 32 bits of Hash64 of bytes 0..19
//   bytes 24..    a xorshift64 stream seeded by (key, version, size)
// So a torn write, a value served under another key, a stale version and a flipped bit
// all fail the check, and Observation::version tells the oracle which write it was.
#ifndef KVENGINE_TOOLS_STRESS_STRESS_VALUE_H_
#define KVENGINE_TOOLS_STRESS_STRESS_VALUE_H_

#include <cstddef>
#include <cstdint>

#include "tools/stress/expected_state.h"

namespace kvengine::stress {

// Smallest value kv_stress writes: its header.
constexpr size_t kValueHeaderBytes = 24;

// Fills out[0, size) with the value of `key` at `version`.  REQUIRES: size >= 24.
void FillValue(uint32_t key, uint32_t version, size_t size, char* out);

// What `data` (the `size` bytes a read returned for `key`) is: the value of some
// version of that key (kValue with the version), or kCorrupt.
Observation ReadValue(uint32_t key, const char* data, size_t size);

}  // namespace kvengine::stress

#endif  // KVENGINE_TOOLS_STRESS_STRESS_VALUE_H_
