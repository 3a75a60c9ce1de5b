#include "db/db_impl_helpers.h"

namespace kvengine {
namespace db_impl {

uint64_t PartsSize(std::span<const Slice> parts) {
  uint64_t size = 0;
  for (const Slice& part : parts) size += part.size();
  return size;
}

}  // namespace db_impl
}  // namespace kvengine
