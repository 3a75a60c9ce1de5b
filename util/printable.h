// Printable: a key (arbitrary bytes) as messages show it, and messages that name one.
#ifndef KVENGINE_UTIL_PRINTABLE_H_
#define KVENGINE_UTIL_PRINTABLE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine {

// How many of a key's bytes Printable shows.
constexpr size_t kPrintableKeyBytes = 64;

// The key quoted, at most kPrintableKeyBytes of its bytes, the unprintable ones (and
// quotes and backslashes) escaped as \xNN: 'layer.0\x00'; a longer key is followed by
// its length and hash, which tell it from the others that begin alike:
// 'aaaa...' (70000 bytes, hash 0f1e2d3c4b5a6978).  No quote appears between the two
// that enclose it.  Every message and log line that names a key shows it this way (the
// Python module's printable_key too), so that no line carries a whole 64 KiB key.
std::string Printable(const Slice& key);
// "N bytes, hash H" of a key longer than kPrintableKeyBytes, as Printable shows it
// (H: Hash64 of the whole key, 16 hex digits).
std::string KeyDigest(const Slice& key);
// NotFound naming `key`: "key 'k'", or in a namespace "key 'k' (namespace n)" (a name
// of at most 64 bytes, as every namespace's is).
Status KeyNotFound(const Slice& key, std::string_view namespace_name = {});
// Whether `shown` is what Printable shows between its quotes for the whole of `key` (a
// key of at most kPrintableKeyBytes): checks a key named in a message without printing
// it again.
bool ShowsWholeKey(std::string_view shown, const Slice& key);

// `s` (an error about one key's buffers, say) with the key named: "key 'k': ...".
Status ForKey(const Slice& key, const Status& s);

// InvalidArgument naming the first of key's buffers that is null with a length
// ("value buffer 1 of key 'k' is null with length 5"), as a DB's input checks name it;
// OK when none is.  `what` names the buffers: "value" (a put's parts) or "destination".
Status CheckNoNullBuffer(const Slice& key, std::span<const Slice> buffers, const char* what);
Status CheckNoNullBuffer(const Slice& key, std::span<const MutableSlice> buffers, const char* what);

// BufferTooSmall for key's value of `size` bytes and buffers that hold `capacity`.
Status TooSmall(const Slice& key, uint64_t size, uint64_t capacity);

}  // namespace kvengine

#endif  // KVENGINE_UTIL_PRINTABLE_H_
