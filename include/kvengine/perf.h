// Perf levels: how much of a call path kvengine times.
//
// kvengine times named scopes ("perf keys": DB calls, tier methods, Env I/O ...) into
// latency histograms, read with DB::GetProperty("kvengine.perf") (text) or
// "kvengine.perf.json", and cleared with DB::ResetPerf().  The keys are listed in
// docs/observability.md.
//
// The level is process-wide, like RocksDB's SetPerfLevel, because the Env, transport and
// Python layers time scopes that belong to no single DB; so are the histograms.  DB::Open
// sets it from Options::perf_level (KVENGINE_PERF_LEVEL in the environment), so with
// several DBs in one process the last Open wins; SetPerfLevel changes it at any time.
// With the level off, a timed scope costs one predictable branch.
#ifndef KVENGINE_PERF_H_
#define KVENGINE_PERF_H_

#include <string>

namespace kvengine {

enum class PerfLevel : int {
  kOff = 0,    // "off": nothing is timed
  kEntry = 1,  // "entry": the calls a user makes (DB API, Python binding) only
  kAll = 2,    // "all": every instrumented method of every layer too
  // "auto", Options::perf_level only (the default): "entry" for a DB that serves
  // metrics (Options::metrics_listen set), so the latency histogram it exports has
  // samples; "off" otherwise.  DB::Open resolves it; SetPerfLevel takes it as "off".
  kAuto = 3,
};

// Thread-safe; takes effect for scopes that start after the call.
void SetPerfLevel(PerfLevel level);
PerfLevel GetPerfLevel();

// Clears every perf histogram of the process.  Thread-safe; a scope that ends while the
// reset runs may be counted or not.
void ResetPerf();

// Every perf histogram with at least one sample, as text ("kvengine.perf") or as one JSON
// object ("kvengine.perf.json").
std::string PerfReport(bool json);

}  // namespace kvengine

#endif  // KVENGINE_PERF_H_
