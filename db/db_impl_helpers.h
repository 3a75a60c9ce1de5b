// Helpers shared by DBImpl's files (db_impl*.cc): messages that name a key, and sizes.
#ifndef KVENGINE_DB_DB_IMPL_HELPERS_H_
#define KVENGINE_DB_DB_IMPL_HELPERS_H_

#include <cstdint>
#include <span>
#include <string>

#include "kvengine/slice.h"
#include "kvengine/status.h"
#include "util/printable.h"

namespace kvengine {
namespace db_impl {

// Keys are arbitrary bytes; messages show at most 64 of them, escaping the rest.
using ::kvengine::Printable;

// A GpuIo error about one key's buffers, with the key named.
Status ForKey(const Slice& key, const Status& s);

uint64_t PartsSize(std::span<const Slice> parts);

// BufferTooSmall for a value of `size` bytes and buffers of `capacity`.
Status TooSmall(const Slice& key, uint64_t size, uint64_t capacity);

}  // namespace db_impl
}  // namespace kvengine

#endif  // KVENGINE_DB_DB_IMPL_HELPERS_H_
