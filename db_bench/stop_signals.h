// kv_bench's stop signals: a temporary DB is removed when kv_bench is stopped by SIGINT,
// SIGTERM or SIGHUP, as it is when kv_bench ends (issue #49 item 5: a trace replay stopped
// by `timeout` left 64 GB of buckets in /tmp).
//
// The signals are blocked in every thread (BlockStopSignals, first thing in main, before
// any thread starts, so that every thread inherits the mask) and one thread of its own
// waits for them with sigwait: it can then remove a directory tree, which a signal
// handler could not.  Children exec'd by kv_bench start with the signals unblocked
// (util/ready_child.cc).
#ifndef KVENGINE_DB_BENCH_STOP_SIGNALS_H_
#define KVENGINE_DB_BENCH_STOP_SIGNALS_H_

#include <sys/types.h>

#include <string>

namespace kvbench {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and the threads it starts) and
// starts the thread that waits for them.  A stop signal then kills the children given to
// KillOnStop, removes the paths given to RemoveOnStop, and exits with 128 + the
// signal's number.
void BlockStopSignals();

// From now on a stop signal removes `path` (a temporary DB directory, an owner's socket)
// first.  ForgetRemoval(path) undoes it, once the path is removed otherwise.
void RemoveOnStop(const std::string& path);
void ForgetRemoval(const std::string& path);

// From now on a stop signal kills child `pid` (an attached run's owner, whose DB lies
// under the temporary directory) before the directory is removed.
void KillOnStop(pid_t pid);
// Before the child is reaped otherwise.
void ForgetOnStop(pid_t pid);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_STOP_SIGNALS_H_
