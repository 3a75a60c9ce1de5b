// Giving the heap's free memory back to the system.
//
// malloc keeps what is freed for reuse: a freed block in the middle of the heap, or in a
// thread's arena, stays resident.  After a step that allocates much and frees all of it
// (the SSD tier's recovery reads bucket indexes on several threads and drops them), the
// process would keep that peak as its resident size; ReleaseFreeHeap returns it.
#ifndef KVENGINE_ENV_HEAP_RELEASE_H_
#define KVENGINE_ENV_HEAP_RELEASE_H_

namespace kvengine {

// Returns the free memory of every malloc arena to the system (a no-op where the C
// library cannot).  Takes milliseconds for a heap of GBs: call it after a big step, not
// on a data path.
void ReleaseFreeHeap();

}  // namespace kvengine

#endif  // KVENGINE_ENV_HEAP_RELEASE_H_
