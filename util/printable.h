// Printable: a key (arbitrary bytes) as messages show it.
#ifndef KVENGINE_UTIL_PRINTABLE_H_
#define KVENGINE_UTIL_PRINTABLE_H_

#include <string>

#include "kvengine/slice.h"

namespace kvengine {

// The key quoted, at most 64 of its bytes, the unprintable ones (and quotes and
// backslashes) escaped as \xNN: 'layer.0\x00' or 'aaaa...'.
std::string Printable(const Slice& key);

}  // namespace kvengine

#endif  // KVENGINE_UTIL_PRINTABLE_H_
