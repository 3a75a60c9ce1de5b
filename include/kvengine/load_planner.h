// LoadPlanner: how much of a prefix hit is worth loading.
//
// A cache hit is worth loading only when loading it is faster than computing it again:
// a block on a slow SSD, or on a peer behind a slow network, can take longer to read
// than the GPU takes to prefill its tokens.  A connector asks the planner, per request,
// how many of the leading hit blocks to load; the rest it leaves to the engine to
// recompute (docs/design.md, "The load planner").
//
// The planner keeps a running estimate of each tier's read time on this host,
//   seconds = latency + bytes / bandwidth,
// fitted (exponentially weighted least squares, each measurement bounded to 3x the
// estimate either way so that one stalled load moves it a step only) to the loads the
// caller reports (RecordLoad), starting from the nominal figures of LoadPlannerOptions
// before any load is measured; and the engine's prefill rate, configured or fitted to the
// prefill steps the caller reports (RecordPrefill).  Bytes a prefetch has queued on a tier
// (AddInFlight) wait ahead of a plan's reads on that tier until the tier's bandwidth has
// drained them.
//
// A nominal figure is a guess about a host the planner has not seen (an SSD of this
// VM read at 0.5-0.8 GB/s against the nominal 2 GB/s), so it is not trusted: until a
// slower tier (SSD, peer) has kTrustedLoads loads' worth of measurements, a plan prices
// its reads at up to kColdFactor times the estimate (the factor falls to 1 as they come),
// so the only loads it lets through from an unmeasured tier are small ones beside faster
// reads -- the loads that measure it without making the request slower than recompute
// even where the guess was 4x too fast.  A load is worth the share of its measured time
// charged to the tier (a mixed load's small SSD share carries mostly memory's error), and
// the first loads' worth outweighs the nominal figure (the n-th counts 1/(n+1) until
// that is less than estimate_weight).  A figure the caller states from its own
// measurement is trusted as such by giving it samples (TierReadEstimate::samples).
// Memory needs neither: its hits are never refused, so its first loads measure it.
//
// And a host is noisy (a loaded VM's memory copies ran at 1.3 to 7 GB/s from one run to
// the next, and wider from one load to the next): each tier's reads are priced at no
// less than its slow end, the ratio of measured to estimated time that 9 in 10 of its
// single-tier loads stay under, so that a block a plan adds past the memory hits beats
// its compute when the tier runs slow, not only on average.
//
// A plan never refuses a memory hit: the leading blocks held in memory are always
// loaded, whatever the estimates say.
//
// Thread-safety: every method may be called from any thread (one internal mutex, held
// for the arithmetic only).
#ifndef KVENGINE_LOAD_PLANNER_H_
#define KVENGINE_LOAD_PLANNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kvengine/db.h"
#include "kvengine/env.h"
#include "kvengine/status.h"

namespace kvengine {

// One tier's read time on this host: seconds = latency_s + bytes / bytes_per_s.
struct TierReadEstimate {
  double bytes_per_s = 0;
  double latency_s = 0;
  // Loads measured on this tier so far (0: the nominal figures).  In
  // LoadPlannerOptions: how many measured loads the stated figures stand for -- 0 (the
  // default), a nominal guess that plans do not trust until loads on this host have
  // measured the tier; LoadPlanner::kTrustedLoads or more, a figure measured on this
  // host (fio, an earlier run) that plans use as it is from the first.
  uint64_t samples = 0;
};

struct LoadPlannerOptions {
  // The engine's prefill rate: tokens it computes per second (for one request, at the
  // batch it usually runs).
  // Default: unset -- unknown: until RecordPrefill has measured it, every plan loads
  // every hit, and the first plan logs once that this option is unset.
  std::optional<double> recompute_tokens_per_s;

  // Nominal read figures of each tier, used until loads on it have been measured (and
  // for SSD and peer, with samples 0, priced at up to kColdFactor times until then).
  // Defaults: memory 10 GB/s after 20 us, SSD 2 GB/s after 200 us, peer 1.25 GB/s
  // (10 Gb/s) after 500 us, samples 0.
  TierReadEstimate memory{10e9, 20e-6};
  TierReadEstimate ssd{2e9, 200e-6};
  TierReadEstimate peer{1.25e9, 500e-6};

  // The engine computes the request layer by layer while the load goes on layer by
  // layer (vLLM's layer-wise load: a layer's attention waits for that layer's load
  // only), over this many layers.  1: the load finishes before the compute starts.
  // Default: 1
  uint32_t overlap_layers = 1;

  // The weight of a new measurement in an estimate, in (0, 1]: each measurement
  // multiplies the weight of all older ones (and of the nominal figures) by
  // 1 - estimate_weight, so an estimate follows a tier that speeds up or slows down
  // within about 2 / estimate_weight loads.
  // Default: 0.1
  double estimate_weight = 0.1;

  // A plan extends its prefix past the leading memory hits only where the estimate
  // says the longer prefix saves, over the best shorter one, at least this share of the
  // added blocks' recompute time: a margin for the estimate's error.
  // Default: 0.05
  double margin = 0.05;

  // Where the one-time notice of an unknown prefill rate goes.  Default: stderr.
  std::function<void(const std::string&)> info_log;

  // The clock the in-flight bytes drain by.  Default: Env::Default().
  Env* env = nullptr;
};

// What the planner was asked, in prefix order.
struct LoadPlanRequest {
  // Where each key of the hit blocks is (BatchLocate's answers: kLocatedMemory,
  // kLocatedSsd, kLocatedPeer), block after block, keys_per_block keys per block.
  std::span<const int64_t> key_tiers;
  uint64_t keys_per_block = 1;
  // The bytes one key's load reads (on one rank, where ranks load their keys at once).
  uint64_t key_bytes = 0;
  // Tokens per block, and the request's tokens from the first hit block on (what it
  // computes when it loads nothing; 0: the hit blocks' tokens).  Where it is less than
  // the hit blocks' tokens (a partial last block), the last block counts its own.
  uint64_t block_tokens = 0;
  uint64_t request_tokens = 0;
};

// The planner's answer.
struct LoadPlan {
  uint64_t hit_blocks = 0;   // the blocks it was asked about
  uint64_t load_blocks = 0;  // the leading ones to load; the rest are recomputed
  bool rate_known = false;   // false: the prefill rate is unknown and every hit is loaded
  // The estimates that decided it, for the blocks it loads and for all the hits.
  double load_s = 0;                // reading the blocks it loads
  double recompute_s = 0;           // computing those blocks' tokens instead
  double all_hits_load_s = 0;       // reading every hit block
  double all_hits_recompute_s = 0;  // computing every hit block's tokens
  // The request's time to its first token, estimated: with the plan, and loading
  // every hit (equal when every hit is loaded); with overlap_layers > 1 these count
  // the overlap of the load with the compute of the rest.
  double planned_ttft_s = 0;
  double all_hits_ttft_s = 0;
};

class LoadPlanner {
 public:
  // A slower tier (SSD, peer) is trusted at its estimate once this many loads have
  // measured it (its stated samples included); before, its reads are priced at up to
  // kColdFactor times the estimate, falling linearly to 1 with the loads' worth measured.
  static constexpr uint64_t kTrustedLoads = 8;
  static constexpr double kColdFactor = 4;

  // Stores a new planner in *result.  Returns InvalidArgument, naming the option, when
  // a rate, bandwidth or latency is zero, negative, not a number or absurd (a rate over
  // 1e9 tokens/s, a bandwidth over 1e13 B/s, a latency over 10 s), or overlap_layers
  // or estimate_weight is out of range; *result is then untouched.
  static Status Create(const LoadPlannerOptions& options, std::unique_ptr<LoadPlanner>* result);

  LoadPlanner() = default;
  virtual ~LoadPlanner() = default;
  LoadPlanner(const LoadPlanner&) = delete;
  LoadPlanner& operator=(const LoadPlanner&) = delete;

  // Plans one request.  InvalidArgument (and *plan untouched) when key_tiers is not a
  // whole number of blocks, keys_per_block or block_tokens is 0, or a key's tier is not
  // one of memory, SSD or peer.
  virtual Status Plan(const LoadPlanRequest& request, LoadPlan* plan) = 0;

  // Reports a load made: the bytes read from each tier (memory, SSD, peer) and the
  // seconds it took.  A load from one tier is a measurement of that tier; a load from
  // several is charged to one of them, the others' estimated shares taken off: to
  // the slower tier (SSD or peer) with the largest estimated share, never to memory,
  // which its memory-only loads measure -- and is worth, to that tier's estimate and its
  // trust, the share of the measured time charged to it.  InvalidArgument for negative,
  // not-a-number or all-zero figures.
  virtual Status RecordLoad(uint64_t memory_bytes, uint64_t ssd_bytes, uint64_t peer_bytes,
                            double seconds) = 0;

  // Reports a prefill step of the engine: `tokens` computed in `seconds`.  Fitted as
  // the tiers are (seconds = overhead + tokens / rate); the fit replaces the configured
  // rate once it has a rate. InvalidArgument for a non-positive figure.
  virtual Status RecordPrefill(uint64_t tokens, double seconds) = 0;

  // A prefetch queued `bytes` of reads on a tier: they drain at the tier's bandwidth,
  // and until then a plan's reads of that tier wait behind them.
  virtual Status AddInFlight(int64_t tier, uint64_t bytes) = 0;

  // The current estimate of a tier (kLocatedMemory, kLocatedSsd, kLocatedPeer); the
  // zero estimate for another value.
  virtual TierReadEstimate Estimate(int64_t tier) = 0;

  // The prefill rate plans use (tokens per second); 0 while it is unknown.
  virtual double RecomputeTokensPerSecond() = 0;
};

}  // namespace kvengine

#endif  // KVENGINE_LOAD_PLANNER_H_
