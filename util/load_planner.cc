// LoadPlanner (include/kvengine/load_planner.h): the estimates and the plan.
#include "kvengine/load_planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "util/linear_fit.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace kvengine {

namespace {

// The figures past which an option is surely a mistake (a unit slip, a typo).
constexpr double kMaxTokensPerSecond = 1e9;
constexpr double kMaxBytesPerSecond = 1e13;  // 10 TB/s: no memory bus reads faster
constexpr double kMaxLatencySeconds = 10;
constexpr uint32_t kMaxOverlapLayers = 4096;

// Where the nominal figures put their second point: the fit starts as a line through
// (0, latency) and (this many bytes, latency + bytes / bandwidth).
constexpr double kSeedBytes = 64.0 * 1024 * 1024;
constexpr double kSeedTokens = 8192;

constexpr int kTiers = 3;  // memory, SSD, peer: LocatedTier - 1

// A measurement counts as at most this many times (or at least 1/this of) the estimate:
// see LinearFit::AddBounded.
constexpr double kOutlierFactor = 3;

// A tier's slow end: the ratio of measured to estimated time that 9 in 10 of its loads
// stay under, tracked as a running quantile (each load above it raises it by
// kSlowStep * 0.9 in the log, each below lowers it by kSlowStep * 0.1).
constexpr double kSlowQuantile = 0.9;
constexpr double kSlowStep = 0.1;

// OK when low < value <= high (low <= value with zero_ok), else InvalidArgument naming
// the option.
Status CheckRange(const char* name, double value, double low, double high, bool zero_ok = false) {
  const bool above = zero_ok ? value >= low : value > low;
  if (!above || !(value <= high)) {  // NaN fails both
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s is %g; it must be %s %g and at most %g", name, value,
                  zero_ok ? "at least" : "more than", low, high);
    return Status::InvalidArgument("LoadPlannerOptions", buf);
  }
  return Status::OK();
}

Status CheckTier(const char* name, const TierReadEstimate& t) {
  char bw[64], lat[64];
  std::snprintf(bw, sizeof(bw), "%s.bytes_per_s", name);
  std::snprintf(lat, sizeof(lat), "%s.latency_s", name);
  Status s = CheckRange(bw, t.bytes_per_s, 0, kMaxBytesPerSecond);
  if (s.ok()) s = CheckRange(lat, t.latency_s, 0, kMaxLatencySeconds, true);
  return s;
}

class LoadPlannerImpl final : public LoadPlanner {
 public:
  explicit LoadPlannerImpl(const LoadPlannerOptions& o)
      : options_(o), env_(o.env != nullptr ? o.env : Env::Default()) {
    const TierReadEstimate* nominal[kTiers] = {&o.memory, &o.ssd, &o.peer};
    for (int t = 0; t < kTiers; t++) {
      tiers_[t].fit.Seed(nominal[t]->latency_s, 1.0 / nominal[t]->bytes_per_s, kSeedBytes);
      tiers_[t].stated = nominal[t]->samples;
    }
    if (o.recompute_tokens_per_s) {
      prefill_.Seed(0, 1.0 / *o.recompute_tokens_per_s, kSeedTokens);
      rate_known_ = true;
    }
  }

  Status Plan(const LoadPlanRequest& r, LoadPlan* plan) override;
  Status RecordLoad(uint64_t memory_bytes, uint64_t ssd_bytes, uint64_t peer_bytes,
                    double seconds) override;
  Status RecordPrefill(uint64_t tokens, double seconds) override;
  Status AddInFlight(int64_t tier, uint64_t bytes) override;
  TierReadEstimate Estimate(int64_t tier) override;
  double RecomputeTokensPerSecond() override;

 private:
  struct Tier {
    LinearFit fit;  // seconds over bytes
    uint64_t samples = 0;  // loads measured
    // What they are worth: each counts the share of its load's measured time charged
    // to this tier, the rest being the other tiers' estimates and their errors.
    double evidence = 0;
    uint64_t stated = 0;      // the measured loads its nominal figures stand for (options)
    double slow = 1;          // its slow end: measured / estimated, 9 in 10 of its own loads
    double queued_bytes = 0;  // a prefetch's reads not yet drained, as of queued_at
    double queued_at = 0;     // seconds (env_'s clock)
  };
  // What a plan reads of the estimates, copied under the lock.
  struct Snapshot {
    std::array<double, kTiers> latency{}, per_byte{}, queued{};
    // The factor its reads are priced at: the cold start's, or its slow end (>= 1).
    std::array<double, kTiers> price{};
    double per_token = 0;  // seconds per token; 0: unknown
  };

  double Now() const { return static_cast<double>(env_->NowMicros()) / 1e6; }
  // The loads' worth behind tier t's estimate: measured and stated.  REQUIRES: mu_ held.
  double EvidenceLocked(int t) const REQUIRES(mu_) {
    return tiers_[t].evidence + static_cast<double>(tiers_[t].stated);
  }
  // The factor a plan prices tier t's reads at: kColdFactor while nothing has measured
  // a slower tier, falling linearly to 1 at kTrustedLoads loads' worth.  Memory's is 1:
  // its hits are never refused, so its own loads measure it from the first.
  // REQUIRES: mu_ held.
  double ColdFactorLocked(int t) const REQUIRES(mu_) {
    const double n = EvidenceLocked(t), trusted = static_cast<double>(kTrustedLoads);
    if (t == 0 || n >= trusted) return 1;
    return 1 + (kColdFactor - 1) * (trusted - n) / trusted;
  }
  // The weight of the next whole load's measurement of tier t: estimate_weight, but
  // while the tier has n < 1/estimate_weight loads' worth behind it, 1/(n+2) -- the
  // nominal figures count as one load, so the first measurements outweigh a guess in
  // a few loads instead of the 1/estimate_weight it takes to forget a measured figure.
  // REQUIRES: mu_ held.
  double WeightLocked(int t) const REQUIRES(mu_) {
    return std::max(options_.estimate_weight, 1 / (EvidenceLocked(t) + 2));
  }
  // The tier's queue, drained to `now`.  REQUIRES: mu_ held.
  double QueuedLocked(Tier& t, double now) REQUIRES(mu_) {
    if (t.queued_bytes > 0) {
      const double drained = (now - t.queued_at) / t.fit.slope();
      t.queued_bytes = std::max(0.0, t.queued_bytes - std::max(0.0, drained));
    }
    t.queued_at = now;
    return t.queued_bytes;
  }
  Snapshot Take();
  void NoticeUnknownRate();

  const LoadPlannerOptions options_;
  Env* const env_;
  Mutex mu_;
  std::array<Tier, kTiers> tiers_ GUARDED_BY(mu_);
  LinearFit prefill_ GUARDED_BY(mu_);  // seconds over tokens
  bool rate_known_ GUARDED_BY(mu_) = false;
  bool noticed_ GUARDED_BY(mu_) = false;
};

LoadPlannerImpl::Snapshot LoadPlannerImpl::Take() {
  Snapshot s;
  const double now = Now();
  MutexLock lock(&mu_);
  for (int t = 0; t < kTiers; t++) {
    s.latency[t] = tiers_[t].fit.intercept();
    s.per_byte[t] = tiers_[t].fit.slope();
    s.queued[t] = QueuedLocked(tiers_[t], now);
    s.price[t] = std::max(ColdFactorLocked(t), tiers_[t].slow);
  }
  if (rate_known_) s.per_token = prefill_.slope();
  return s;
}

void LoadPlannerImpl::NoticeUnknownRate() {
  {
    MutexLock lock(&mu_);
    if (noticed_) return;
    noticed_ = true;
  }
  const std::string line =
      "kvengine: the load planner does not know the engine's prefill rate "
      "(recompute_tokens_per_s is unset and no prefill step was reported): every hit is "
      "loaded, however slow its tier";
  if (options_.info_log) {
    options_.info_log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

Status LoadPlannerImpl::Plan(const LoadPlanRequest& r, LoadPlan* plan) {
  if (r.keys_per_block == 0 || r.block_tokens == 0) {
    return Status::InvalidArgument(
        "LoadPlanRequest", r.keys_per_block == 0 ? "keys_per_block is 0" : "block_tokens is 0");
  }
  if (r.key_tiers.size() % r.keys_per_block != 0) {
    return Status::InvalidArgument(
        "LoadPlanRequest", "key_tiers is not a whole number of blocks of keys_per_block keys");
  }
  const Snapshot s = Take();
  const uint64_t n = r.key_tiers.size() / r.keys_per_block;
  const uint64_t tokens_all =
      r.request_tokens > 0 ? r.request_tokens : n * r.block_tokens;  // 0: the hits' own
  const double layers = options_.overlap_layers;
  const double key_bytes = static_cast<double>(r.key_bytes);

  // The estimates for the first k blocks, k = 0..n, one block at a time.
  std::array<double, kTiers> bytes{};
  std::array<uint64_t, kTiers> keys{};
  auto load_s = [&]() {
    double sec = 0;
    for (int t = 0; t < kTiers; t++) {
      if (bytes[t] > 0) {
        sec += s.price[t] * (s.latency[t] + (s.queued[t] + bytes[t]) * s.per_byte[t]);
      }
    }
    return sec;
  };
  auto tokens_of = [&](uint64_t k) { return std::min(k * r.block_tokens, tokens_all); };
  // The time to the first token loading the first k blocks: the load and the compute of
  // the rest, each split in `layers` steps, a layer's compute waiting for its load.
  auto ttft_s = [&](double load, uint64_t k) {
    const double l = load / layers;
    const double c = static_cast<double>(tokens_all - tokens_of(k)) * s.per_token / layers;
    return l + c + (layers - 1) * std::max(l, c);
  };

  uint64_t best = 0;
  double best_load = 0, best_ttft = ttft_s(0, 0);
  bool leading_memory = true;
  for (uint64_t k = 1; k <= n; k++) {
    // The block's keys by tier: counted in registers (a loop the compiler vectorizes),
    // checked on the way.
    const int64_t* key = r.key_tiers.data() + (k - 1) * r.keys_per_block;
    uint64_t memory = 0, ssd = 0, bad = 0;
    for (uint64_t i = 0; i < r.keys_per_block; i++) {
      memory += key[i] == kLocatedMemory;
      ssd += key[i] == kLocatedSsd;
      bad += key[i] < kLocatedMemory || key[i] > kLocatedPeer;
    }
    if (bad > 0) {
      return Status::InvalidArgument("LoadPlanRequest",
                                     "a key's tier is not memory (1), ssd (2) or peer (3)");
    }
    keys[0] += memory;
    keys[1] += ssd;
    keys[2] += r.keys_per_block - memory - ssd;
    for (int t = 0; t < kTiers; t++) bytes[t] = static_cast<double>(keys[t]) * key_bytes;
    leading_memory &= memory == r.keys_per_block;
    const double load = load_s();
    const double ttft = ttft_s(load, k);
    // A memory hit is never refused; past them, a longer prefix must beat the best
    // shorter one (at first: computing everything) by the margin of the recompute time
    // of the blocks it adds.
    const double added = static_cast<double>(tokens_of(k) - tokens_of(best)) * s.per_token;
    const bool take =
        leading_memory || (s.per_token == 0) || best_ttft - ttft >= options_.margin * added;
    if (take) {
      best = k;
      best_load = load;
      best_ttft = ttft;
    }
  }
  LoadPlan p;
  p.hit_blocks = n;
  p.load_blocks = best;
  p.rate_known = s.per_token > 0;
  p.load_s = best_load;
  p.recompute_s = static_cast<double>(tokens_of(best)) * s.per_token;
  p.all_hits_load_s = load_s();
  p.all_hits_recompute_s = static_cast<double>(tokens_of(n)) * s.per_token;
  p.planned_ttft_s = best_ttft;
  p.all_hits_ttft_s = ttft_s(p.all_hits_load_s, n);
  if (!p.rate_known) {
    p.planned_ttft_s = p.all_hits_ttft_s = p.all_hits_load_s;
    if (n > 0) NoticeUnknownRate();
  }
  *plan = p;
  return Status::OK();
}

Status LoadPlannerImpl::RecordLoad(uint64_t memory_bytes, uint64_t ssd_bytes, uint64_t peer_bytes,
                                   double seconds) {
  const std::array<double, kTiers> bytes = {static_cast<double>(memory_bytes),
                                            static_cast<double>(ssd_bytes),
                                            static_cast<double>(peer_bytes)};
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return Status::InvalidArgument("RecordLoad", "seconds must be a positive number");
  }
  if (memory_bytes + ssd_bytes + peer_bytes == 0) {
    return Status::InvalidArgument("RecordLoad", "no bytes loaded");
  }
  MutexLock lock(&mu_);
  // Charged to one tier, less the others' estimates: never memory when a slower tier
  // took part, else the tier with the largest estimated share.  Memory is measured by
  // the memory-only loads every engine makes; charging it a mixed load's time taught it
  // the SSD's slowness where memory's share of the bytes was the larger (kv_bench's
  // trace on a loaded VM: memory learned below the SSD's nominal 2 GB/s, every mixed
  // load went to memory, and the SSD estimate never left its nominal figure).
  std::array<double, kTiers> predicted{};
  const bool slower_tier = bytes[1] > 0 || bytes[2] > 0;
  int main = slower_tier ? 1 : 0;
  for (int t = 0; t < kTiers; t++) {
    if (bytes[t] > 0) predicted[t] = tiers_[t].fit.Predict(bytes[t]);
    if (t == 0 && slower_tier) continue;
    if (predicted[t] > predicted[main]) main = t;
  }
  double own = seconds;
  for (int t = 0; t < kTiers; t++) {
    if (t != main) own -= predicted[t];
  }
  // The others' estimates may exceed the whole (they are estimates): the main tier
  // then gets a floor of its share of the measured time rather than a negative one.
  own = std::max(own, seconds * bytes[main] / (bytes[0] + bytes[1] + bytes[2]));
  // What the load says of the main tier is worth the share of its time charged to it:
  // a mixed load whose SSD reads took a tenth of it is mostly memory's time, and taking
  // memory's estimate off leaves memory's error in the SSD's part (kv_bench's trace:
  // two loads of 2 MB from SSD beside 60 MB from memory that ran faster than memory's
  // estimate put the SSD at 6.3 GB/s, where the larger SSD shares read at 0.5-0.7 GB/s).
  // The share is of the time measured, not estimated, so a load that finds the tier
  // slower than its estimate counts more than one that finds it faster: the error that
  // makes a load slower than recompute is learned first.
  const double share = own / seconds;
  Tier& tier = tiers_[main];
  if (tier.samples == 0) {
    // The nominal line is placed at the size of the loads it meets: seeded at kSeedBytes
    // it would pin the slope to the nominal bandwidth against measurements of loads
    // ten or a hundred times smaller (an SSD's share of a mixed load: a few MB) -- a
    // point that far out outweighs them in a least-squares slope -- which would then
    // move only the latency.
    tier.fit.Seed(tier.fit.intercept(), tier.fit.slope(), bytes[main]);
  }
  if (bytes[main] == bytes[0] + bytes[1] + bytes[2]) {
    // A load from this tier alone: how far above its estimate it ran.  A plan prices the
    // tier at its slow end, so that a block it adds past the memory hits still beats its
    // compute when the tier runs 9-in-10 slow: memory on a loaded host (kv_bench's trace
    // at load 19) ran at about 3 GB/s against an estimate of 4.5, and mixed blocks that the
    // mean priced under their compute took longer.  (The leading memory hits are loaded
    // whatever the price: it moves only where a plan stops past them.)
    const double ratio = own / predicted[main];
    tier.slow *=
        std::exp(ratio > tier.slow ? kSlowStep * kSlowQuantile : -kSlowStep * (1 - kSlowQuantile));
    tier.slow = std::clamp(tier.slow, 1.0, kOutlierFactor);
  }
  tier.fit.AddBounded(bytes[main], own, share * WeightLocked(main), kOutlierFactor);
  tier.samples++;
  tier.evidence += share;
  return Status::OK();
}

Status LoadPlannerImpl::RecordPrefill(uint64_t tokens, double seconds) {
  if (tokens == 0 || !(seconds > 0) || !std::isfinite(seconds)) {
    return Status::InvalidArgument("RecordPrefill", "tokens and seconds must be positive");
  }
  MutexLock lock(&mu_);
  if (rate_known_) {
    prefill_.AddBounded(static_cast<double>(tokens), seconds, options_.estimate_weight,
                        kOutlierFactor);
  } else {
    prefill_.Add(static_cast<double>(tokens), seconds, options_.estimate_weight);
  }
  rate_known_ = true;
  return Status::OK();
}

Status LoadPlannerImpl::AddInFlight(int64_t tier, uint64_t bytes) {
  if (tier < kLocatedMemory || tier > kLocatedPeer) {
    return Status::InvalidArgument("AddInFlight", "tier is not memory (1), ssd (2) or peer (3)");
  }
  const double now = Now();
  MutexLock lock(&mu_);
  Tier& t = tiers_[tier - 1];
  t.queued_bytes = QueuedLocked(t, now) + static_cast<double>(bytes);
  return Status::OK();
}

TierReadEstimate LoadPlannerImpl::Estimate(int64_t tier) {
  if (tier < kLocatedMemory || tier > kLocatedPeer) return TierReadEstimate{};
  MutexLock lock(&mu_);
  const Tier& t = tiers_[tier - 1];
  return TierReadEstimate{1.0 / t.fit.slope(), t.fit.intercept(), t.samples};
}

double LoadPlannerImpl::RecomputeTokensPerSecond() {
  MutexLock lock(&mu_);
  return rate_known_ ? 1.0 / prefill_.slope() : 0;
}

}  // namespace

Status LoadPlanner::Create(const LoadPlannerOptions& o, std::unique_ptr<LoadPlanner>* result) {
  Status s;
  if (o.recompute_tokens_per_s) {
    s = CheckRange("recompute_tokens_per_s", *o.recompute_tokens_per_s, 0, kMaxTokensPerSecond);
  }
  if (s.ok()) s = CheckTier("memory", o.memory);
  if (s.ok()) s = CheckTier("ssd", o.ssd);
  if (s.ok()) s = CheckTier("peer", o.peer);
  if (s.ok()) s = CheckRange("overlap_layers", o.overlap_layers, 0, kMaxOverlapLayers);
  if (s.ok()) s = CheckRange("estimate_weight", o.estimate_weight, 0, 1);
  if (s.ok()) s = CheckRange("margin", o.margin, 0, 0.9, true);
  if (!s.ok()) return s;
  *result = std::make_unique<LoadPlannerImpl>(o);
  return Status::OK();
}

}  // namespace kvengine
