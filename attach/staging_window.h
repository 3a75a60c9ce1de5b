// StagingWindow: one attached connection's own shared memory for reads of values that
// are not in the memory tier (docs/attach.md, "Reading values that are not in memory").
//
// A get of a value only on SSD (or at a peer) is read by the owner through the DB it
// serves into this window, and the client copies it out: one copy, as from the arena.
// The window is a memfd of its own, passed to its client only (OPEN_STAGING), sized
// kBytes; it is not in the arena, so a read never needs arena room, never counts
// against a namespace's quota and never evicts anybody's value -- what the in-process
// read of the same value would do.  The owner hands it out front to back (Take) to the
// PINs of one batch, and a batch larger than the window is read in rounds: the keys
// that do not fit are answered "later", and the client asks for them again after it
// released the round's pins (Release of the last one empties the window).
//
// Its pages are the connection's only while it reads: a window idle for kIdleRelease
// gives its pages back to the kernel (ReleaseIfIdle), so an idle connection costs a
// mapping and no memory.
//
// Thread-safety: none; one connection's thread uses it.
#ifndef KVENGINE_ATTACH_STAGING_WINDOW_H_
#define KVENGINE_ATTACH_STAGING_WINDOW_H_

#include <chrono>
#include <cstdint>
#include <memory>

#include "kvengine/status.h"

namespace kvengine {

class StagingWindow {
 public:
  // 8 MiB: a round holds two of the largest KV blocks (4 MiB) or 128 of 64 KiB.  A
  // larger window makes fewer rounds (each costs the client a round trip) at the cost of
  // memory per reading connection; a value larger than the window is staged in the
  // arena instead, as before windows.
  static constexpr uint64_t kBytes = 8ull << 20;
  static constexpr std::chrono::seconds kIdleRelease{1};

  // Creates a window of kBytes, mapped here; *memfd is its memfd, for the client (the
  // caller closes it once sent).  IOError when memory or descriptors run out.
  static Status Create(std::unique_ptr<StagingWindow>* window, int* memfd);
  ~StagingWindow();
  StagingWindow(const StagingWindow&) = delete;
  StagingWindow& operator=(const StagingWindow&) = delete;

  char* base() const { return base_; }
  uint64_t size() const { return kBytes; }

  // Room for `n` bytes after what is held: stores its offset in *offset and returns
  // true, or false when the rest of the window is too small.  Each room taken is held
  // until Release.
  bool Take(uint64_t n, uint64_t* offset);
  // Gives back one room Take handed out; the window is empty again with the last.
  void Release();
  // Gives the pages back to the kernel when nothing has been held for kIdleRelease.
  void ReleaseIfIdle();

 private:
  using Clock = std::chrono::steady_clock;
  explicit StagingWindow(char* base) : base_(base) {}

  char* const base_;
  uint64_t used_ = 0;     // bytes handed out since the window was last empty
  uint64_t held_ = 0;     // rooms handed out and not released
  bool touched_ = false;  // pages were written since they were last given back
  Clock::time_point emptied_ = Clock::now();
};

}  // namespace kvengine

#endif  // KVENGINE_ATTACH_STAGING_WINDOW_H_
