// ReadyChild: this program re-executed (/proc/self/exe) as a helper process -- the owner
// of a DB that a benchmark attaches to, say -- which says "ready" on its stdout once it
// serves and runs until its stdin closes.  Only this object holds the pipe to the
// child's stdin, so the child also ends when this process dies, however it dies.
//
// Thread-safety: none; one thread starts and stops a child.
#ifndef KVENGINE_UTIL_READY_CHILD_H_
#define KVENGINE_UTIL_READY_CHILD_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "kvengine/status.h"

namespace kvengine {

class ReadyChild {
 public:
  ReadyChild() = default;
  ~ReadyChild() { Stop(); }
  ReadyChild(const ReadyChild&) = delete;
  ReadyChild& operator=(const ReadyChild&) = delete;

  // Starts the child with argv `args` (args[0] its name) and waits up to `timeout_ms`
  // for a first line that starts with "ready".  IOError, with what the child said, when
  // it did not say so in time; the child is then stopped.  The child is exec'd at once
  // after fork, so it inherits no state of this process's libraries (CUDA's, say).
  Status Start(const std::vector<std::string>& args, int timeout_ms);

  // Closes the child's stdin (it finishes and exits) and reaps it.  Idempotent.
  void Stop();

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
};

// The child's side: says "ready" on stdout, then returns once stdin closes (the
// parent's ReadyChild stopped, or the parent died).
void SayReadyAndWaitForStdinToClose();

}  // namespace kvengine

#endif  // KVENGINE_UTIL_READY_CHILD_H_
