#include "env/heap_release.h"

#include <cstdlib>  // defines __GLIBC__ on glibc: checked below

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvengine {

void ReleaseFreeHeap() {
#if defined(__GLIBC__)
  ::malloc_trim(0);  // every arena, not only the heap's top (glibc 2.8 and later)
#endif
}

}  // namespace kvengine
