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

// Messages that name a key (util/printable.h, shared with attach/).
using ::kvengine::ForKey;
using ::kvengine::Printable;
using ::kvengine::TooSmall;

uint64_t PartsSize(std::span<const Slice> parts);

}  // namespace db_impl
}  // namespace kvengine

#endif  // KVENGINE_DB_DB_IMPL_HELPERS_H_
