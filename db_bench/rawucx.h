// The physical baseline of peer_get and peer_put over UCX (db_bench/rawucx.cc).
#ifndef KVENGINE_DB_BENCH_RAWUCX_H_
#define KVENGINE_DB_BENCH_RAWUCX_H_

#include "db_bench/benchmarks.h"

namespace kvbench {

// rawucx (put false) and rawucx_put: per call --batch_size one-sided UCP gets (puts) of
// --value_size bytes, all in flight at once, between buffers this thread mapped and
// random slots of a region as large as the data set that a child process mapped (kv_bench
// re-executed with --rawucx_far_end), over whatever UCX_TLS lets UCX use.  Puts are
// flushed before the call returns.  One error result when the build has no UCX.
Result RunRawUcx(const BenchContext& b, bool put);

// The child's main (argv: "--rawucx_far_end", FD, LENGTH): maps LENGTH bytes, writes its
// worker address, the region and its rkey to FD, and progresses its worker until FD
// closes.  The exit status.
int RawUcxFarEnd(int argc, char** argv);

}  // namespace kvbench

#endif  // KVENGINE_DB_BENCH_RAWUCX_H_
