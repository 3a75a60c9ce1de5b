#include "db_bench/trace_replay.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <thread>

#include "db_bench/histogram.h"
#include "db_bench/prefix_cache_model.h"
#include "db_bench/workload.h"
#include "kvengine/load_planner.h"

namespace kvbench {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Share(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0 : static_cast<double>(part) / static_cast<double>(whole);
}

std::string TraceKey(uint64_t hash_id, uint64_t layer, bool per_layer) {
  return per_layer
             ? "kvbench-trace@tp0/layer." + std::to_string(layer) + "/" + std::to_string(hash_id)
             : "kvbench-trace@tp0/" + std::to_string(hash_id);
}

// "p50":..,"p99":..,"p99.9":.. of a histogram, as JSON members.
std::string PercentilesJson(const Histogram& h) {
  return Printf("{\"count\":%" PRIu64 ",\"p50\":%.6g,\"p99\":%.6g,\"p99.9\":%.6g,\"max\":%.6g}",
                h.count(), h.Percentile(50), h.Percentile(99), h.Percentile(99.9), h.max());
}
std::string PercentilesText(const Histogram& h, const char* what = "requests") {
  return Printf("%" PRIu64 " %s, P50 %.1f P99 %.1f P99.9 %.1f max %.1f micros", h.count(), what,
                h.Percentile(50), h.Percentile(99), h.Percentile(99.9), h.max());
}

// Every figure of one replay.
struct TraceStats {
  uint64_t requests = 0;
  uint64_t blocks = 0;         // blocks the requests asked for
  uint64_t hit_blocks = 0;     // leading hits the lookups found
  uint64_t loaded_blocks = 0;  // of those, blocks whose every key the load returned
  uint64_t lost_blocks = 0;    // found by the lookup, gone by the load
  uint64_t tokens = 0, loaded_tokens = 0;
  TierCounts tier_keys;  // keys each tier served to the loads (deltas)
  bool tiers_known = false;
  uint64_t bytes_loaded = 0, bytes_saved = 0;
  double load_s = 0, save_s = 0, lookup_s = 0;
  Histogram lookup_us;           // per request
  Histogram load_us;             // per request with hits
  Histogram load_memory_us;      // ... whose keys all came from memory
  Histogram load_ssd_us;         // ... with a key read from SSD
  Histogram load_prefetched_us;  // ... whose hits the lookup hook prefetched from SSD
  Histogram load_peer_us;        // ... with a key read from a peer
  Histogram late_us;             // how late each paced step began against its schedule
  // The prefill model.
  double prefill_all_s = 0;    // recomputing every request's whole prompt
  double prefill_saved_s = 0;  // over the requests whose load beat recomputing
  uint64_t faster = 0, slower = 0;
  double slower_lost_s = 0;         // what loading instead of recomputing cost those
  uint64_t slower_from_memory = 0;  // ... of those, loads whose every key came from memory
  // ... and loads that read a key from SSD although the plan, re-checked just before,
  // had found every key in memory: the offloader moved it during the load.
  uint64_t slower_moved_in_load = 0;
  Histogram ttft_saved_us;  // per request whose load beat recomputing
  uint64_t verified = 0;
  // The load planner.
  uint64_t planned_requests = 0;   // requests with hits it planned
  uint64_t refused_requests = 0;   // ... of which it left some hits to recompute
  uint64_t refused_blocks = 0;     // hit blocks it left to recompute
  double refused_load_s = 0;       // its estimate of loading them with the rest
  double refused_recompute_s = 0;  // ... and of computing them
  double plan_s = 0;               // time in LoadPlanner::Plan
  uint64_t planned_blocks = 0;     // hit blocks planned
  // The plan re-checked at the load (Replay::Recheck).
  uint64_t rechecks = 0;                // re-checks made (the rest were skipped: nothing moved)
  uint64_t recheck_moved_requests = 0;  // requests with a planned key on another tier by then
  uint64_t recheck_cut_requests = 0;    // ... whose load the new plan cut
  uint64_t recheck_cut_blocks = 0;      // planned blocks it cut
  double recheck_s = 0;                 // time in the re-check's BatchLocate
};

class Replay {
 public:
  Replay(const TraceConfig& c, const std::vector<TraceRequest>& trace, Engine* engine, bool verify,
         const LookupHook& hook)
      : c_(c),
        trace_(trace),
        engine_(engine),
        verify_(verify),
        hook_(hook),
        key_bytes_(c.BytesPerKey()),
        buffer_blocks_(std::max<uint64_t>(1, c.buffer_bytes / c.BytesPerBlock())),
        buffer_(buffer_blocks_ * c.BytesPerBlock()) {
    if (c.planner) {
      kvengine::LoadPlannerOptions o;
      o.recompute_tokens_per_s = c.prefill_tokens_per_s;
      if (c.planner_ssd_bytes_per_s > 0) {  // stated: measured on this host
        o.ssd.bytes_per_s = c.planner_ssd_bytes_per_s;
        o.ssd.samples = kvengine::LoadPlanner::kTrustedLoads;
      }
      Status st = kvengine::LoadPlanner::Create(o, &planner_);
      if (!st.ok()) Error("load planner: " + st.ToString());
    }
    if (!c.dump_requests.empty()) {
      // A second replay of the same mode in this process (--repeat) numbers its file.
      static int replays[2] = {0, 0};
      const int n = ++replays[c.planner ? 1 : 0];
      const std::string path = c.dump_requests + (c.planner ? ".on" : ".off") +
                               (n > 1 ? "." + std::to_string(n) : "") + ".tsv";
      dump_ = std::fopen(path.c_str(), "w");
      if (dump_ == nullptr) {
        Error("--trace_dump_requests: cannot open " + path + ": " + std::strerror(errno));
      } else {
        std::fputs(
            "request\tinput_tokens\tfound_blocks\tplanned_blocks\trechecked_blocks\t"
            "loaded_blocks\tmemory_keys\tssd_keys\tpeer_keys\tlookup_us\trecheck_us\t"
            "load_us\tcompute_us\tsaved_us\n",
            dump_);
      }
    }
    // The "KV cache" the keys are saved from: random bytes, stamped per key when saved.
    for (size_t i = 0; i + 8 <= buffer_.size(); i += 8) {
      const uint64_t x = Mix(i);
      std::memcpy(buffer_.data() + i, &x, 8);
    }
  }

  ~Replay() {
    if (dump_ != nullptr) std::fclose(dump_);
  }

  Result Run(double progress_interval);
  // Run in steps, for two replays interleaved: Begin, then Step until it returns false
  // (each call one lookup or one load and save, in the order Run makes them), then
  // Finish.
  void Begin(double progress_interval);
  bool Step();
  // Steps until one more request has been loaded and saved (or the trace is done);
  // false when the trace is done.
  bool StepRequest();
  Result Finish();

 private:
  LookupPlan Lookup(size_t i, double now_s);
  void LoadAndSave(LookupPlan& plan);
  // Reads blocks [0, plan.hit_blocks) in buffer-sized calls; returns the blocks loaded
  // whole (the load stops at the first block a key of which is gone).
  uint64_t Load(const LookupPlan& plan, double* seconds, uint64_t* bytes);
  // Where the planned keys are now; cuts plan->hit_blocks where they moved so that the
  // planner would load fewer.  Returns the seconds it took.
  double Recheck(LookupPlan* plan);
  // Whether a planned key can have moved since the lookup (see Recheck).
  bool NeedsRecheck(const LookupPlan& plan) const;
  // Writes blocks [first, end) in buffer-sized calls.
  void Save(const LookupPlan& plan, uint64_t first, uint64_t end);
  // memory_only: every key the load read came from memory; planned_memory_only: the
  // plan (re-checked) had every key in memory.
  // Returns what the load saved (its compute less its time; 0 when it loaded nothing)
  // -- negative when it was slower.
  // The prompt tokens r's first `blocks` blocks hold, and the seconds computing them takes.
  uint64_t BlockTokens(const TraceRequest& r, uint64_t blocks) const {
    return std::min(r.input_length, blocks * c_.block_tokens);
  }
  double ComputeSeconds(const TraceRequest& r, uint64_t blocks) const {
    return static_cast<double>(BlockTokens(r, blocks)) / c_.prefill_tokens_per_s;
  }
  double Price(const TraceRequest& r, uint64_t loaded_blocks, double load_s, bool memory_only,
               bool planned_memory_only);
  // --trace_print_off_memory_loads: one line on stderr for a load that read a key off
  // memory, its measured time against its compute and the plan's estimates.
  void PrintOffMemoryLoad(const LookupPlan& plan, uint64_t loaded_blocks, const TierCounts& read,
                          double load_s);
  char* KeyBuffer(uint64_t block_slot, uint64_t layer) {
    return buffer_.data() + block_slot * c_.BytesPerBlock() + layer * key_bytes_;
  }
  void Error(const std::string& what) {
    if (errors_++ == 0) first_error_ = what;
  }
  std::string Report(Result* r, double wall_s);
  void ReportPlanner(Result* r);
  // How many of the lookup's hit blocks to load (BatchLocate's answers in results_);
  // notes the plan's estimates in *plan.
  uint64_t PlanLoad(const TraceRequest& r, uint64_t hit_blocks, LookupPlan* plan);
  // The planner's plan of a request's leading blocks whose keys are on `key_tiers`;
  // false (an error noted) when it refused them.
  bool RunPlanner(const TraceRequest& r, std::span<const int64_t> key_tiers,
                  kvengine::LoadPlan* plan);

  const TraceConfig& c_;
  const std::vector<TraceRequest>& trace_;
  Engine* engine_;
  const bool verify_;
  const LookupHook& hook_;
  const uint64_t key_bytes_;
  const uint64_t buffer_blocks_;
  AlignedBuffer buffer_;
  TraceStats s_;
  uint64_t errors_ = 0;
  std::string first_error_;
  std::vector<int64_t> results_;
  std::vector<Slice> slices_;
  std::vector<Destination> dests_;
  std::vector<ValueParts> parts_;
  std::string note_;
  std::unique_ptr<kvengine::LoadPlanner> planner_;  // null: every hit is loaded
  std::string planner_note_;                        // why it is off, when it was asked for
  std::FILE* dump_ = nullptr;                       // --trace_dump_requests
  // Run's state between steps.
  Status reg_;
  Clock::time_point t0_, last_progress_;
  double progress_interval_ = 0;
  std::deque<LookupPlan> pending_;  // looked up, not yet loaded, in arrival order
  size_t next_ = 0;                 // the next request to look up
  // The BatchGetInto and BatchPut calls issued so far: each may make room in the memory
  // tier (a put, a load's promotion from SSD) and so move other keys to SSD.
  uint64_t engine_writes_ = 0;
};

LookupPlan Replay::Lookup(size_t i, double now_s) {
  const TraceRequest& r = trace_[i];
  LookupPlan plan;
  plan.request = i;
  plan.lookup_at_s = now_s;
  plan.engine_writes_at_lookup = engine_writes_;
  const uint64_t per_block = c_.KeysPerBlock();
  for (uint64_t id : r.hash_ids) {
    for (uint64_t l = 0; l < per_block; l++) plan.keys.push_back(TraceKey(id, l, c_.key_per_layer));
  }
  slices_.assign(plan.keys.begin(), plan.keys.end());
  const auto start = Clock::now();
  Status st;
  if (!slices_.empty() && planner_) {
    // Where each key is, for the planner (the same walk of the index as BatchExists).
    st = engine_->BatchLocate(slices_, &results_);
    if (st.IsNotSupported()) {
      planner_.reset();
      planner_note_ = "off: the engine does not say where its keys are (BatchLocate)";
    }
  }
  if (!slices_.empty() && !planner_) st = engine_->BatchExists(slices_, &results_);
  const double us = Seconds(Clock::now() - start) * 1e6;
  s_.lookup_us.Add(us);
  s_.lookup_s += us / 1e6;
  plan.lookup_s = us / 1e6;
  if (!st.ok()) {
    Error("BatchExists: " + st.ToString());
    return plan;
  }
  while (plan.hit_blocks < r.hash_ids.size()) {
    const auto first = results_.begin() + static_cast<ptrdiff_t>(plan.hit_blocks * per_block);
    if (!std::all_of(first, first + static_cast<ptrdiff_t>(per_block),
                     [](int64_t x) { return x > 0; })) {  // exists, or its tier
      break;
    }
    plan.hit_blocks++;
  }
  plan.found_blocks = plan.hit_blocks;
  if (planner_ && plan.hit_blocks > 0) {
    plan.hit_blocks = PlanLoad(r, plan.hit_blocks, &plan);
    plan.tiers.assign(results_.begin(),
                      results_.begin() + static_cast<ptrdiff_t>(plan.hit_blocks * per_block));
  }
  if (hook_) {
    // Blocks past the plan are not prefetched either.
    plan.prefetched_keys =
        hook_(plan, std::span<const Slice>(slices_.data(), plan.hit_blocks * per_block));
    if (planner_ && plan.prefetched_keys > 0) {
      planner_->AddInFlight(kvengine::kLocatedSsd, plan.prefetched_keys * key_bytes_);
    }
  }
  return plan;
}

bool Replay::RunPlanner(const TraceRequest& r, std::span<const int64_t> key_tiers,
                        kvengine::LoadPlan* plan) {
  kvengine::LoadPlanRequest request;
  request.key_tiers = key_tiers;
  request.keys_per_block = c_.KeysPerBlock();
  request.key_bytes = key_bytes_;
  request.block_tokens = c_.block_tokens;
  request.request_tokens = r.input_length;
  const auto start = Clock::now();
  Status st = planner_->Plan(request, plan);
  s_.plan_s += Seconds(Clock::now() - start);
  if (!st.ok()) Error("LoadPlanner::Plan: " + st.ToString());
  return st.ok();
}

uint64_t Replay::PlanLoad(const TraceRequest& r, uint64_t hit_blocks, LookupPlan* plan) {
  kvengine::LoadPlan p;
  if (!RunPlanner(r, std::span<const int64_t>(results_.data(), hit_blocks * c_.KeysPerBlock()),
                  &p)) {
    return hit_blocks;
  }
  plan->planned_load_s = p.load_s;
  plan->planned_ssd = planner_->Estimate(kvengine::kLocatedSsd);
  s_.planned_requests++;
  s_.planned_blocks += hit_blocks;
  if (p.load_blocks < hit_blocks) {
    s_.refused_requests++;
    s_.refused_blocks += hit_blocks - p.load_blocks;
    s_.refused_load_s += p.all_hits_load_s - p.load_s;
    s_.refused_recompute_s += p.all_hits_recompute_s - p.recompute_s;
  }
  return p.load_blocks;
}

// The lookup planned by where the keys were then; by the load the offloader may have
// moved some of them to SSD (making room for the saves of the requests in between), and
// a block read from there can take longer than computing it.  So the worker asks again,
// just before it loads, and when a planned key is on another tier now the planner plans
// the blocks again over where they are: the load is cut to that plan, never lengthened
// (the scheduler has committed to the lookup's).  A key gone by now is left to the load,
// which ends the prefix there.  Its time is the load's (the caller adds it).
//
// Only where a key can have moved: the memory tier makes room (offloading to SSD) only
// in a put or a load's promotion from SSD, and this replay is the engine's only user,
// so where it issued neither since the lookup (depth 1: the lookup right before its
// load) and no prefetch is promoting in the background, every planned key is where the
// lookup found it and the re-check is skipped -- it cost 0.013-0.023 s of the loads'
// time on Mooncake's conversation trace, 2-4% of the prefill saved, and found nothing.
// A connector sharing its engine with other writers would ask the engine whether it
// evicted since instead.
bool Replay::NeedsRecheck(const LookupPlan& plan) const {
  return plan.engine_writes_at_lookup != engine_writes_ || c_.prefetch;
}

double Replay::Recheck(LookupPlan* plan) {
  s_.rechecks++;
  const TraceRequest& r = trace_[plan->request];
  const uint64_t per_block = c_.KeysPerBlock();
  slices_.assign(plan->keys.begin(),
                 plan->keys.begin() + static_cast<ptrdiff_t>(plan->hit_blocks * per_block));
  const auto start = Clock::now();
  Status st = engine_->BatchLocate(slices_, &results_);
  if (!st.ok()) {
    const double seconds = Seconds(Clock::now() - start);
    Error("BatchLocate (the re-check at the load): " + st.ToString());
    return seconds;
  }
  if (std::equal(results_.begin(), results_.end(), plan->tiers.begin(), plan->tiers.end())) {
    return Seconds(Clock::now() - start);
  }
  s_.recheck_moved_requests++;
  plan->tiers = results_;
  uint64_t present = 0;  // leading blocks whose every key is still there
  while (present < plan->hit_blocks &&
         std::all_of(results_.begin() + static_cast<ptrdiff_t>(present * per_block),
                     results_.begin() + static_cast<ptrdiff_t>((present + 1) * per_block),
                     [](int64_t x) { return x > 0; })) {
    present++;
  }
  kvengine::LoadPlan p;
  const bool planned =
      present > 0 &&
      RunPlanner(r, std::span<const int64_t>(results_.data(), present * per_block), &p);
  const double seconds = Seconds(Clock::now() - start);
  if (planned && p.load_blocks < present) {
    s_.recheck_cut_requests++;
    s_.recheck_cut_blocks += plan->hit_blocks - p.load_blocks;
    plan->hit_blocks = p.load_blocks;
  }
  return seconds;
}

uint64_t Replay::Load(const LookupPlan& plan, double* seconds, uint64_t* bytes) {
  const TraceRequest& r = trace_[plan.request];
  const uint64_t per_block = c_.KeysPerBlock();
  uint64_t loaded = 0;
  for (uint64_t first = 0; first < plan.hit_blocks; first += buffer_blocks_) {
    const uint64_t n = std::min(buffer_blocks_, plan.hit_blocks - first);
    slices_.clear();
    dests_.clear();
    for (uint64_t b = 0; b < n; b++) {
      for (uint64_t l = 0; l < per_block; l++) {
        slices_.emplace_back(plan.keys[(first + b) * per_block + l]);
        dests_.push_back(Destination{MutableSlice(KeyBuffer(b, l), key_bytes_)});
      }
    }
    const auto start = Clock::now();
    engine_writes_++;
    Status st = engine_->BatchGetInto(slices_, dests_, &results_);
    *seconds += Seconds(Clock::now() - start);
    if (!st.ok()) {
      Error("BatchGetInto: " + st.ToString());
      return loaded;
    }
    for (uint64_t b = 0; b < n; b++) {
      for (uint64_t l = 0; l < per_block; l++) {
        const int64_t got = results_[b * per_block + l];
        if (got < 0) return loaded;  // evicted since the lookup: the prefix ends here
        *bytes += static_cast<uint64_t>(got);
        if (static_cast<uint64_t>(got) != key_bytes_) {
          Error("load of '" + slices_[b * per_block + l].ToString() + "' returned " +
                std::to_string(got) + " bytes, expected " + std::to_string(key_bytes_));
          return loaded;
        }
        if (verify_) {
          uint64_t want[2] = {r.hash_ids[first + b], l}, have[2] = {0, 0};
          const size_t k = std::min<size_t>(sizeof(want), key_bytes_);
          std::memcpy(have, KeyBuffer(b, l), k);
          if (std::memcmp(want, have, k) != 0) {
            Error("load of '" + slices_[b * per_block + l].ToString() +
                  "' returned another key's bytes");
            return loaded;
          }
          s_.verified++;
        }
      }
      loaded++;
    }
  }
  return loaded;
}

void Replay::Save(const LookupPlan& plan, uint64_t first_block, uint64_t end) {
  const TraceRequest& r = trace_[plan.request];
  const uint64_t per_block = c_.KeysPerBlock();
  for (uint64_t first = first_block; first < end; first += buffer_blocks_) {
    const uint64_t n = std::min<uint64_t>(buffer_blocks_, end - first);
    slices_.clear();
    parts_.clear();
    for (uint64_t b = 0; b < n; b++) {
      for (uint64_t l = 0; l < per_block; l++) {
        StampVllmValue(r.hash_ids[first + b], l, KeyBuffer(b, l), key_bytes_);
        slices_.emplace_back(plan.keys[(first + b) * per_block + l]);
        parts_.push_back(ValueParts{Slice(KeyBuffer(b, l), key_bytes_)});
      }
    }
    const auto start = Clock::now();
    engine_writes_++;
    Status st = engine_->BatchPut(slices_, parts_, &results_);
    s_.save_s += Seconds(Clock::now() - start);
    if (!st.ok()) {
      Error("BatchPut: " + st.ToString());
      return;
    }
    for (size_t k = 0; k < results_.size(); k++) {
      // A full cache may refuse a put (NoSpace): a cache's right, not an error.
      if (results_[k] == 0) s_.bytes_saved += key_bytes_;
    }
  }
}

double Replay::Price(const TraceRequest& r, uint64_t loaded_blocks, double load_s, bool memory_only,
                     bool planned_memory_only) {
  s_.prefill_all_s += static_cast<double>(r.input_length) / c_.prefill_tokens_per_s;
  if (loaded_blocks == 0) return 0;
  s_.loaded_tokens += BlockTokens(r, loaded_blocks);
  const double recompute_s = ComputeSeconds(r, loaded_blocks);
  if (load_s <= recompute_s) {
    s_.faster++;
    s_.prefill_saved_s += recompute_s - load_s;
    s_.ttft_saved_us.Add((recompute_s - load_s) * 1e6);
  } else {
    s_.slower++;
    s_.slower_lost_s += load_s - recompute_s;
    if (memory_only) {
      s_.slower_from_memory++;
    } else if (planned_memory_only) {
      s_.slower_moved_in_load++;
    }
  }
  return recompute_s - load_s;
}

void Replay::PrintOffMemoryLoad(const LookupPlan& plan, uint64_t loaded_blocks,
                                const TierCounts& read, double load_s) {
  const TraceRequest& r = trace_[plan.request];
  const double compute_s = ComputeSeconds(r, loaded_blocks);
  std::string line = Printf(
      "off-memory load: request %zu, %" PRIu64 " blocks (keys: %" PRIu64 " from memory, %" PRIu64
      " from SSD, %" PRIu64 " from peers) loaded in %.3f ms against %.3f ms of compute (%s)",
      plan.request, loaded_blocks, read.memory, read.ssd, read.peer, load_s * 1e3, compute_s * 1e3,
      load_s > compute_s ? "slower" : "faster");
  if (planner_) {
    line += Printf("; planned at %.3f ms with the SSD at %.3g GB/s + %.1f us (%" PRIu64
                   " loads measured)",
                   plan.planned_load_s * 1e3, plan.planned_ssd.bytes_per_s / 1e9,
                   plan.planned_ssd.latency_s * 1e6, plan.planned_ssd.samples);
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Replay::LoadAndSave(LookupPlan& plan) {
  const TraceRequest& r = trace_[plan.request];
  s_.requests++;
  s_.blocks += r.hash_ids.size();
  s_.tokens += r.input_length;
  s_.hit_blocks += plan.found_blocks;
  uint64_t loaded = 0;
  double load_s = 0;
  bool memory_only = false;  // every key the load read came from memory (tiers known)
  TierCounts read;           // the keys it read from each tier (tiers known)
  // The plan re-checked first: its time is the load's, in the price (but not in the
  // tiers' estimates, which measure reads).  A request whose blocks it cut to none
  // loads nothing, and its few microseconds of re-check are counted in recheck_s only.
  const uint64_t planned_blocks = plan.hit_blocks;
  const double recheck_s =
      planner_ && plan.hit_blocks > 0 && NeedsRecheck(plan) ? Recheck(&plan) : 0;
  s_.recheck_s += recheck_s;
  if (plan.hit_blocks > 0) {
    const std::optional<TierCounts> before = engine_->ReadTierCounts();
    uint64_t bytes = 0;
    loaded = Load(plan, &load_s, &bytes);
    const std::optional<TierCounts> after = engine_->ReadTierCounts();
    s_.bytes_loaded += bytes;
    s_.load_s += load_s;
    s_.lost_blocks += plan.hit_blocks - loaded;
    s_.loaded_blocks += loaded;
    s_.load_us.Add(load_s * 1e6);
    if (before && after) {
      s_.tiers_known = true;
      const TierCounts d = *after - *before;
      read = d;
      s_.tier_keys += d;
      memory_only = d.ssd == 0 && d.peer == 0;
      // The planner's estimates follow the loads actually made.
      if (planner_ && loaded > 0 && load_s > 0) {
        planner_->RecordLoad(d.memory * key_bytes_, d.ssd * key_bytes_, d.peer * key_bytes_,
                             load_s);
      }
      Histogram& by_tier = d.peer > 0  ? s_.load_peer_us
                           : d.ssd > 0 ? s_.load_ssd_us
                                       : s_.load_memory_us;
      by_tier.Add(load_s * 1e6);
    }
    // Its hits were on SSD at the lookup, and the hook started bringing them up: the load
    // that prefetching is for (compare with "some from SSD" of a run without it).
    if (plan.prefetched_keys > 0) {
      s_.load_prefetched_us.Add(load_s * 1e6);
    }
  }
  const bool planned_memory_only =
      planner_ && plan.hit_blocks > 0 &&
      std::all_of(plan.tiers.begin(),
                  plan.tiers.begin() + static_cast<ptrdiff_t>(plan.hit_blocks * c_.KeysPerBlock()),
                  [](int64_t t) { return t == kvengine::kLocatedMemory; });
  const double saved_s = Price(r, loaded, load_s + recheck_s, memory_only, planned_memory_only);
  if (dump_ != nullptr) {
    const double compute_s = ComputeSeconds(r, loaded);
    std::fprintf(dump_,
                 "%zu\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64
                 "\t%" PRIu64 "\t%" PRIu64 "\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\n",
                 plan.request, r.input_length, plan.found_blocks, planned_blocks, plan.hit_blocks,
                 loaded, read.memory, read.ssd, read.peer, plan.lookup_s * 1e6, recheck_s * 1e6,
                 load_s * 1e6, compute_s * 1e6, saved_s * 1e6);
  }
  if (c_.print_off_memory_loads && loaded > 0 && s_.tiers_known && !memory_only) {
    PrintOffMemoryLoad(plan, loaded, read, load_s + recheck_s);
  }
  // The engine computed every block it did not load, and saves them -- the hits the
  // planner left to recompute too, as the connectors do: saved again from the recomputed
  // KV they come back into memory (promoted without an SSD read), as a load from SSD
  // would have brought them (promote_on_read).
  Save(plan, loaded, r.hash_ids.size());
}

void Replay::Begin(double progress_interval) {
  reg_ = engine_->RegisterBuffer(buffer_.data(), buffer_.size());
  if (!reg_.ok()) note_ = "buffer not registered: " + reg_.ToString();
  progress_interval_ = progress_interval;
  t0_ = last_progress_ = Clock::now();
}

bool Replay::Step() {
  const size_t n = trace_.size();
  if (next_ >= n && pending_.empty()) return false;
  const double first_ms = trace_.front().timestamp_ms;
  const double lookahead_s = static_cast<double>(c_.lookahead_us) / 1e6;
  const double now_s = Seconds(Clock::now() - t0_);
  // When each step is due, in seconds since t0_ (infinity: not yet).
  const double never = std::numeric_limits<double>::infinity();
  // The scheduler looks up at most `depth` requests ahead of the worker's loads: a
  // replay that falls behind the trace's pace does not look up seconds of arrivals
  // before their predecessors have saved the blocks they share.
  double lookup_due = never;
  if (next_ < n && pending_.size() < c_.depth) {
    lookup_due = c_.speed > 0 ? (trace_[next_].timestamp_ms - first_ms) / 1000.0 / c_.speed
                              : now_s;  // as fast as possible: as soon as there is room
  }
  const double load_due = pending_.empty() ? never : pending_.front().lookup_at_s + lookahead_s;
  const bool load = load_due <= lookup_due;
  const double due = load ? load_due : lookup_due;
  if (due > now_s) {
    std::this_thread::sleep_until(
        t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(due)));
  } else if (c_.speed > 0) {
    s_.late_us.Add((now_s - due) * 1e6);
  }
  if (load) {
    LoadAndSave(pending_.front());
    pending_.pop_front();
  } else {
    pending_.push_back(Lookup(next_++, Seconds(Clock::now() - t0_)));
  }
  if (progress_interval_ > 0 && Seconds(Clock::now() - last_progress_) >= progress_interval_) {
    last_progress_ = Clock::now();
    std::fprintf(stderr, "... trace: %" PRIu64 " of %zu requests done\n", s_.requests, n);
  }
  return true;
}

bool Replay::StepRequest() {
  const uint64_t done = s_.requests;
  bool more = true;
  while (more && s_.requests == done) more = Step();
  return more;
}

Result Replay::Finish() {
  const double wall_s = Seconds(Clock::now() - t0_);
  if (reg_.ok()) engine_->UnregisterBuffer(buffer_.data());
  Result r;
  r.ops = s_.requests;
  r.keys = s_.blocks * c_.KeysPerBlock();
  r.bytes = s_.bytes_loaded + s_.bytes_saved;
  r.seconds = s_.lookup_s + s_.load_s + s_.save_s;
  r.wall_seconds = wall_s;
  r.counts_found = true;
  r.lookups = s_.blocks;
  r.found = s_.loaded_blocks;
  r.verified = s_.verified;
  r.errors = errors_;
  r.first_error = first_error_;
  r.hist = s_.load_us;
  r.note = Report(&r, wall_s);
  return r;
}

Result Replay::Run(double progress_interval) {
  Begin(progress_interval);
  while (Step()) {
  }
  return Finish();
}

void Replay::ReportPlanner(Result* r) {
  const TraceStats& s = s_;
  std::string& t = r->detail_text;
  std::string& j = r->detail_json;
  if (!planner_) {
    const std::string why = planner_note_.empty() ? "off (--planner=off)" : planner_note_;
    t += "  load planner: " + why + "\n";
    j += ",\"planner\":false";
    return;
  }
  const kvengine::TierReadEstimate m = planner_->Estimate(kvengine::kLocatedMemory);
  const kvengine::TierReadEstimate d = planner_->Estimate(kvengine::kLocatedSsd);
  const double ns_per_block =
      s.planned_blocks > 0 ? s.plan_s * 1e9 / static_cast<double>(s.planned_blocks) : 0;
  t += Printf("  load planner: %" PRIu64 " of %" PRIu64
              " planned hit blocks left to recompute, in %" PRIu64 " of %" PRIu64
              " requests (estimated %.3f s to load them, %.3f s to compute); "
              "estimates: memory %.2f GB/s + %.1f us (%" PRIu64
              " loads), SSD %.2f GB/s + "
              "%.1f us (%" PRIu64 " loads); %.1f ns of planning per block\n",
              s.refused_blocks, s.planned_blocks, s.refused_requests, s.planned_requests,
              s.refused_load_s, s.refused_recompute_s, m.bytes_per_s / 1e9, m.latency_s * 1e6,
              m.samples, d.bytes_per_s / 1e9, d.latency_s * 1e6, d.samples, ns_per_block);
  t += Printf("  re-checked at the load: %" PRIu64 " of %" PRIu64
              " planned loads (the rest had no load or save issued since their lookup: "
              "nothing moved); %" PRIu64
              " had a planned key on another tier by then; the new plan cut %" PRIu64
              " blocks in %" PRIu64 " of them (%.3f s of re-checks, counted in the loads' time)\n",
              s.rechecks, s.planned_requests, s.recheck_moved_requests, s.recheck_cut_blocks,
              s.recheck_cut_requests, s.recheck_s);
  j += Printf(
      ",\"planner\":true,\"planner_blocks_planned\":%" PRIu64
      ",\"planner_blocks_left_to_recompute\":%" PRIu64 ",\"planner_requests_planned\":%" PRIu64
      ",\"planner_requests_cut\":%" PRIu64
      ",\"planner_cut_load_seconds\":%.6g,\"planner_cut_recompute_seconds\":%.6g"
      ",\"planner_memory_bytes_per_s\":%.6g,\"planner_ssd_bytes_per_s\":%.6g"
      ",\"planner_ns_per_block\":%.6g,\"planner_rechecks\":%" PRIu64
      ",\"planner_recheck_moved_requests\":%" PRIu64 ",\"planner_recheck_cut_requests\":%" PRIu64
      ",\"planner_recheck_cut_blocks\":%" PRIu64 ",\"planner_recheck_seconds\":%.6g",
      s.planned_blocks, s.refused_blocks, s.planned_requests, s.refused_requests, s.refused_load_s,
      s.refused_recompute_s, m.bytes_per_s, d.bytes_per_s, ns_per_block, s.rechecks,
      s.recheck_moved_requests, s.recheck_cut_requests, s.recheck_cut_blocks, s.recheck_s);
}

std::string Replay::Report(Result* r, double wall_s) {
  const TraceStats& s = s_;
  const uint64_t keys_asked = s.blocks * c_.KeysPerBlock();
  std::string& t = r->detail_text;
  std::string& j = r->detail_json;
  t += Printf(
      "  trace: %" PRIu64 " requests, %" PRIu64 " blocks of %" PRIu64
      " tokens, %.2f MiB of KV per block (%" PRIu64 " key(s) per block), replayed in %.2f s%s\n",
      s.requests, s.blocks, c_.block_tokens, static_cast<double>(c_.BytesPerBlock()) / 1048576.0,
      c_.KeysPerBlock(), wall_s,
      c_.speed > 0 ? Printf(" at %gx the trace's pace", c_.speed).c_str() : " as fast as possible");
  t += Printf("  prefix hits: %.4f of blocks found by the lookups, %.4f loaded (%" PRIu64
              " blocks found, then gone by the load)\n",
              Share(s.hit_blocks, s.blocks), Share(s.loaded_blocks, s.blocks), s.lost_blocks);
  j += Printf("\"trace\":{\"requests\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"block_tokens\":%" PRIu64
              ",\"bytes_per_block\":%" PRIu64 ",\"keys_per_block\":%" PRIu64
              ",\"speed\":%g,\"lookahead_us\":%" PRIu64 ",\"depth\":%" PRIu64
              ",\"wall_seconds\":%.6g"
              ",\"hit_ratio\":%.6g,\"loaded_ratio\":%.6g,\"lost_blocks\":%" PRIu64,
              s.requests, s.blocks, c_.block_tokens, c_.BytesPerBlock(), c_.KeysPerBlock(),
              c_.speed, c_.lookahead_us, c_.depth, wall_s, Share(s.hit_blocks, s.blocks),
              Share(s.loaded_blocks, s.blocks), s.lost_blocks);
  if (s.tiers_known) {
    t += Printf(
        "  hits by tier (keys each tier served to the loads, over the keys asked for): "
        "memory %.4f, ssd %.4f, peer %.4f\n",
        Share(s.tier_keys.memory, keys_asked), Share(s.tier_keys.ssd, keys_asked),
        Share(s.tier_keys.peer, keys_asked));
    j += Printf(",\"hit_ratio_memory\":%.6g,\"hit_ratio_ssd\":%.6g,\"hit_ratio_peer\":%.6g",
                Share(s.tier_keys.memory, keys_asked), Share(s.tier_keys.ssd, keys_asked),
                Share(s.tier_keys.peer, keys_asked));
  } else {
    t += "  hits by tier: not reported by this engine\n";
    j += ",\"hit_ratio_memory\":null,\"hit_ratio_ssd\":null,\"hit_ratio_peer\":null";
  }
  const double load_mbps =
      s.load_s > 0 ? static_cast<double>(s.bytes_loaded) / 1048576.0 / s.load_s : 0;
  const double save_mbps =
      s.save_s > 0 ? static_cast<double>(s.bytes_saved) / 1048576.0 / s.save_s : 0;
  t +=
      Printf("  loaded %.1f MiB at %.1f MB/s, saved %.1f MiB at %.1f MB/s; lookups %.3f s in all\n",
             static_cast<double>(s.bytes_loaded) / 1048576.0, load_mbps,
             static_cast<double>(s.bytes_saved) / 1048576.0, save_mbps, s.lookup_s);
  j += Printf(",\"bytes_loaded\":%" PRIu64
              ",\"load_seconds\":%.6g,\"load_mb_per_sec\":%.6g"
              ",\"bytes_saved\":%" PRIu64
              ",\"save_seconds\":%.6g,\"save_mb_per_sec\":%.6g"
              ",\"lookup_seconds\":%.6g",
              s.bytes_loaded, s.load_s, load_mbps, s.bytes_saved, s.save_s, save_mbps, s.lookup_s);
  t += "  load per request: " + PercentilesText(s.load_us) + "\n";
  if (s.tiers_known) {
    t += "    all from memory: " + PercentilesText(s.load_memory_us) + "\n";
    t += "    some from SSD:   " + PercentilesText(s.load_ssd_us) + "\n";
    t += "    some from peers: " + PercentilesText(s.load_peer_us) + "\n";
  }
  if (s.load_prefetched_us.count() > 0) {
    t += "    SSD hits prefetched at lookup: " + PercentilesText(s.load_prefetched_us) + "\n";
  }
  t += "  lookup per request: " + PercentilesText(s.lookup_us) + "\n";
  j += ",\"load_us\":" + PercentilesJson(s.load_us) +
       ",\"load_memory_us\":" + PercentilesJson(s.load_memory_us) +
       ",\"load_ssd_us\":" + PercentilesJson(s.load_ssd_us) +
       ",\"load_peer_us\":" + PercentilesJson(s.load_peer_us) +
       ",\"load_prefetched_us\":" + PercentilesJson(s.load_prefetched_us) +
       ",\"lookup_us\":" + PercentilesJson(s.lookup_us);
  if (c_.speed > 0) {
    t +=
        "  schedule: lookups and loads began late by " + PercentilesText(s.late_us, "steps") + "\n";
    j += ",\"late_us\":" + PercentilesJson(s.late_us);
  }
  t += Printf(
      "  prefill model at %.0f tokens/s: %.2f s of %.2f s of prefill saved (%.4f); "
      "%" PRIu64
      " requests loaded faster than recompute, TTFT saved P50 %.1f P99 %.1f "
      "micros; %" PRIu64 " loaded slower (%.3f s lost, not counted as saved): %" PRIu64
      " with a key off memory (a planner decides those; %" PRIu64
      " of them read a key the offloader moved to SSD during the load, after its re-check "
      "had found it in memory), %" PRIu64
      " from memory alone (measured copies slower than the model's prefill: "
      "a memory hit is never refused)\n",
      c_.prefill_tokens_per_s, s.prefill_saved_s, s.prefill_all_s,
      s.prefill_all_s > 0 ? s.prefill_saved_s / s.prefill_all_s : 0, s.faster,
      s.ttft_saved_us.Percentile(50), s.ttft_saved_us.Percentile(99), s.slower, s.slower_lost_s,
      s.slower - s.slower_from_memory, s.slower_moved_in_load, s.slower_from_memory);
  j += Printf(
      ",\"prefill_tokens_per_s\":%.6g,\"prefill_seconds\":%.6g"
      ",\"prefill_seconds_saved\":%.6g,\"loaded_tokens\":%" PRIu64 ",\"tokens\":%" PRIu64
      ",\"requests_load_faster\":%" PRIu64 ",\"requests_load_slower\":%" PRIu64
      ",\"slower_seconds_lost\":%.6g,\"requests_load_slower_from_memory\":%" PRIu64
      ",\"requests_load_slower_off_memory\":%" PRIu64
      ",\"requests_load_slower_moved_in_load\":%" PRIu64 ",\"ttft_saved_us\":",
      c_.prefill_tokens_per_s, s.prefill_all_s, s.prefill_saved_s, s.loaded_tokens, s.tokens,
      s.faster, s.slower, s.slower_lost_s, s.slower_from_memory, s.slower - s.slower_from_memory,
      s.slower_moved_in_load);
  j += PercentilesJson(s.ttft_saved_us);
  ReportPlanner(r);
  r->trace = TraceFigures{s.prefill_saved_s,
                          s.prefill_all_s,
                          s.faster,
                          s.slower,
                          s.slower_lost_s,
                          s.slower_from_memory,
                          s.slower_moved_in_load,
                          s.ttft_saved_us.Percentile(50),
                          s.ttft_saved_us.Percentile(99),
                          s.bytes_loaded,
                          s.refused_blocks,
                          planner_ != nullptr};
  return note_;
}

}  // namespace

Result RunTraceReplay(const TraceConfig& config, const std::vector<TraceRequest>& trace,
                      Engine* engine, bool verify, double progress_interval,
                      const LookupHook& hook) {
  Replay replay(config, trace, engine, verify, hook);
  Result r = replay.Run(progress_interval);
  r.detail_json += "}";  // closes "trace"
  return r;
}

std::pair<Result, Result> RunTraceReplayInterleaved(const TraceConfig& config_a,
                                                    const TraceConfig& config_b,
                                                    const std::vector<TraceRequest>& trace,
                                                    Engine* engine_a, Engine* engine_b, bool verify,
                                                    double progress_interval) {
  const LookupHook none;  // Replay keeps a reference
  Replay a(config_a, trace, engine_a, verify, none);
  Replay b(config_b, trace, engine_b, verify, none);
  a.Begin(progress_interval);
  b.Begin(0);
  // Each replays one request (its lookup, and its load and save) in turn, which of the
  // two goes first alternating: neither always loads right after the other's save, and
  // nothing of the other runs between a request's lookup and its load (at depth 1), as
  // in a replay alone.  (Step by step instead, one replay's lookup and load were always
  // split by the other's load and save: its loads ran colder, 0.1-0.2 us each.)
  bool more_a = true, more_b = true;
  for (uint64_t i = 0; more_a || more_b; i++) {
    if (i % 2 == 0) {
      if (more_a) more_a = a.StepRequest();
      if (more_b) more_b = b.StepRequest();
    } else {
      if (more_b) more_b = b.StepRequest();
      if (more_a) more_a = a.StepRequest();
    }
  }
  std::pair<Result, Result> r{a.Finish(), b.Finish()};
  r.first.detail_json += "}";  // closes "trace"
  r.second.detail_json += "}";
  return r;
}

std::string FormatPlannerComparison(const Result& on, const Result& off, bool json) {
  if (!on.trace || !off.trace) return "";
  const TraceFigures& a = *on.trace;
  const TraceFigures& b = *off.trace;
  // The prefill saved with the planner over without it; a run that saved nothing (or
  // lost: the saved figure never counts the slower loads) has no ratio.
  const double ratio = b.prefill_saved_s > 0 ? a.prefill_saved_s / b.prefill_saved_s : 0;
  if (json) {
    return Printf(
        "{\"benchmark\":\"trace\",\"engine\":\"both\",\"compare\":\"planner\""
        ",\"prefill_saved_ratio_on_over_off\":%.6g"
        ",\"on\":{\"prefill_seconds_saved\":%.6g,\"prefill_seconds\":%.6g"
        ",\"requests_load_slower\":%" PRIu64 ",\"requests_load_slower_from_memory\":%" PRIu64
        ",\"requests_load_slower_off_memory\":%" PRIu64
        ",\"requests_load_slower_moved_in_load\":%" PRIu64
        ",\"slower_seconds_lost\":%.6g"
        ",\"ttft_saved_p50_us\":%.6g,\"ttft_saved_p99_us\":%.6g"
        ",\"bytes_loaded\":%" PRIu64 ",\"blocks_left_to_recompute\":%" PRIu64
        "}"
        ",\"off\":{\"prefill_seconds_saved\":%.6g,\"prefill_seconds\":%.6g"
        ",\"requests_load_slower\":%" PRIu64 ",\"requests_load_slower_from_memory\":%" PRIu64
        ",\"requests_load_slower_off_memory\":%" PRIu64
        ",\"slower_seconds_lost\":%.6g"
        ",\"ttft_saved_p50_us\":%.6g,\"ttft_saved_p99_us\":%.6g"
        ",\"bytes_loaded\":%" PRIu64 "}}",
        ratio, a.prefill_saved_s, a.prefill_all_s, a.slower, a.slower_from_memory,
        a.slower - a.slower_from_memory, a.slower_moved_in_load, a.slower_lost_s,
        a.ttft_saved_p50_us, a.ttft_saved_p99_us, a.bytes_loaded, a.refused_blocks,
        b.prefill_saved_s, b.prefill_all_s, b.slower, b.slower_from_memory,
        b.slower - b.slower_from_memory, b.slower_lost_s, b.ttft_saved_p50_us, b.ttft_saved_p99_us,
        b.bytes_loaded);
  }
  return Printf(
      "trace        : planner on/off: prefill saved %.3f s vs %.3f s of %.2f s (%.2fx); "
      "requests loaded slower than recompute with a key off memory (the planner decides "
      "those) %" PRIu64 " vs %" PRIu64 " (with the planner, %" PRIu64
      " read a key moved to SSD during the load, after its re-check)"
      "; memory hits slower than the model's prefill (never refused) %" PRIu64 " vs %" PRIu64
      " (%.3f s vs %.3f s lost by both); TTFT saved P50 %.1f vs %.1f, P99 %.1f vs %.1f micros; "
      "loaded %.1f vs %.1f MiB; %" PRIu64 " hit blocks left to recompute",
      a.prefill_saved_s, b.prefill_saved_s, b.prefill_all_s, ratio, a.slower - a.slower_from_memory,
      b.slower - b.slower_from_memory, a.slower_moved_in_load, a.slower_from_memory,
      b.slower_from_memory, a.slower_lost_s, b.slower_lost_s, a.ttft_saved_p50_us,
      b.ttft_saved_p50_us, a.ttft_saved_p99_us, b.ttft_saved_p99_us,
      static_cast<double>(a.bytes_loaded) / 1048576.0,
      static_cast<double>(b.bytes_loaded) / 1048576.0, a.refused_blocks);
}

IdealCacheReport ComputeIdealCaches(const TraceConfig& c, const std::vector<TraceRequest>& trace) {
  IdealCacheReport out;
  struct Row {
    const char* name;
    const char* text;
    uint64_t bytes;  // 0: infinite
  };
  std::vector<Row> rows = {
      {"ideal_lru_memory", "block-LRU of the memory tier's bytes", c.memory_capacity}};
  if (c.ssd_capacity > 0) {
    rows.push_back({"ideal_lru_memory_ssd", "block-LRU of memory + SSD bytes",
                    c.memory_capacity + c.ssd_capacity});
  }
  rows.push_back({"ideal_infinite", "infinite cache", 0});
  for (const Row& row : rows) {
    const uint64_t blocks =
        row.bytes == 0 ? std::numeric_limits<uint64_t>::max() : row.bytes / c.BytesPerBlock();
    const PrefixHits h = SimulatePrefixCache(trace, blocks, c.block_tokens);
    out.text += Printf("  %-38s: prefix hits %.4f of blocks (%" PRIu64 " of %" PRIu64 ")%s\n",
                       row.text, h.Ratio(), h.hit_blocks, h.blocks,
                       row.bytes == 0 ? "" : Printf(", %" PRIu64 " blocks", blocks).c_str());
    out.json += Printf("%s\"%s\":{\"hit_ratio\":%.6g,\"hit_blocks\":%" PRIu64 ",\"blocks\":%" PRIu64
                       ",\"capacity_blocks\":%s}",
                       out.json.empty() ? "" : ",", row.name, h.Ratio(), h.hit_blocks, h.blocks,
                       row.bytes == 0 ? "null" : std::to_string(blocks).c_str());
  }
  return out;
}

}  // namespace kvbench
