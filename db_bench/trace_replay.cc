#include "db_bench/trace_replay.h"

#include <algorithm>
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
  Histogram lookup_us;       // per request
  Histogram load_us;         // per request with hits
  Histogram load_memory_us;  // ... whose keys all came from memory
  Histogram load_ssd_us;     // ... with a key read from SSD
  Histogram load_prefetched_us;  // ... whose hits the lookup hook prefetched from SSD
  Histogram load_peer_us;    // ... with a key read from a peer
  Histogram late_us;         // how late each paced step began against its schedule
  // The prefill model.
  double prefill_all_s = 0;    // recomputing every request's whole prompt
  double prefill_saved_s = 0;  // over the requests whose load beat recomputing
  uint64_t faster = 0, slower = 0;
  double slower_lost_s = 0;  // what loading instead of recomputing cost those
  Histogram ttft_saved_us;   // per request whose load beat recomputing
  uint64_t verified = 0;
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
    // The "KV cache" the keys are saved from: random bytes, stamped per key when saved.
    for (size_t i = 0; i + 8 <= buffer_.size(); i += 8) {
      const uint64_t x = Mix(i);
      std::memcpy(buffer_.data() + i, &x, 8);
    }
  }

  Result Run(double progress_interval);

 private:
  LookupPlan Lookup(size_t i, double now_s);
  void LoadAndSave(const LookupPlan& plan);
  // Reads blocks [0, plan.hit_blocks) in buffer-sized calls; returns the blocks loaded
  // whole (the load stops at the first block a key of which is gone).
  uint64_t Load(const LookupPlan& plan, double* seconds, uint64_t* bytes);
  // Writes blocks [first, end) in buffer-sized calls.
  void Save(const LookupPlan& plan, uint64_t first);
  void Price(const TraceRequest& r, uint64_t loaded_blocks, double load_s);
  char* KeyBuffer(uint64_t block_slot, uint64_t layer) {
    return buffer_.data() + block_slot * c_.BytesPerBlock() + layer * key_bytes_;
  }
  void Error(const std::string& what) {
    if (errors_++ == 0) first_error_ = what;
  }
  std::string Report(Result* r, double wall_s);

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
};

LookupPlan Replay::Lookup(size_t i, double now_s) {
  const TraceRequest& r = trace_[i];
  LookupPlan plan;
  plan.request = i;
  plan.lookup_at_s = now_s;
  const uint64_t per_block = c_.KeysPerBlock();
  for (uint64_t id : r.hash_ids) {
    for (uint64_t l = 0; l < per_block; l++) plan.keys.push_back(TraceKey(id, l, c_.key_per_layer));
  }
  slices_.assign(plan.keys.begin(), plan.keys.end());
  const auto start = Clock::now();
  Status st = slices_.empty() ? Status::OK() : engine_->BatchExists(slices_, &results_);
  const double us = Seconds(Clock::now() - start) * 1e6;
  s_.lookup_us.Add(us);
  s_.lookup_s += us / 1e6;
  if (!st.ok()) {
    Error("BatchExists: " + st.ToString());
    return plan;
  }
  while (plan.hit_blocks < r.hash_ids.size()) {
    const auto first = results_.begin() + static_cast<ptrdiff_t>(plan.hit_blocks * per_block);
    if (!std::all_of(first, first + static_cast<ptrdiff_t>(per_block),
                     [](int64_t x) { return x == 1; })) {
      break;
    }
    plan.hit_blocks++;
  }
  if (hook_) {
    plan.prefetched_keys =
        hook_(plan, std::span<const Slice>(slices_.data(), plan.hit_blocks * per_block));
  }
  return plan;
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

void Replay::Save(const LookupPlan& plan, uint64_t first_block) {
  const TraceRequest& r = trace_[plan.request];
  const uint64_t per_block = c_.KeysPerBlock();
  for (uint64_t first = first_block; first < r.hash_ids.size(); first += buffer_blocks_) {
    const uint64_t n = std::min<uint64_t>(buffer_blocks_, r.hash_ids.size() - first);
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

void Replay::Price(const TraceRequest& r, uint64_t loaded_blocks, double load_s) {
  const double tps = c_.prefill_tokens_per_s;
  s_.prefill_all_s += static_cast<double>(r.input_length) / tps;
  if (loaded_blocks == 0) return;
  const uint64_t tokens = std::min(r.input_length, loaded_blocks * c_.block_tokens);
  s_.loaded_tokens += tokens;
  const double recompute_s = static_cast<double>(tokens) / tps;
  if (load_s <= recompute_s) {
    s_.faster++;
    s_.prefill_saved_s += recompute_s - load_s;
    s_.ttft_saved_us.Add((recompute_s - load_s) * 1e6);
  } else {
    s_.slower++;
    s_.slower_lost_s += load_s - recompute_s;
  }
}

void Replay::LoadAndSave(const LookupPlan& plan) {
  const TraceRequest& r = trace_[plan.request];
  s_.requests++;
  s_.blocks += r.hash_ids.size();
  s_.tokens += r.input_length;
  s_.hit_blocks += plan.hit_blocks;
  uint64_t loaded = 0;
  double load_s = 0;
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
      s_.tier_keys += d;
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
  Price(r, loaded, load_s);
  Save(plan, loaded);
}

Result Replay::Run(double progress_interval) {
  Status reg = engine_->RegisterBuffer(buffer_.data(), buffer_.size());
  if (!reg.ok()) note_ = "buffer not registered: " + reg.ToString();
  const size_t n = trace_.size();
  const double first_ms = trace_.front().timestamp_ms;
  const auto t0 = Clock::now();
  auto last_progress = t0;
  const double lookahead_s = static_cast<double>(c_.lookahead_us) / 1e6;
  std::deque<LookupPlan> pending;  // looked up, not yet loaded, in arrival order
  size_t next = 0;
  while (next < n || !pending.empty()) {
    const double now_s = Seconds(Clock::now() - t0);
    // When each step is due, in seconds since t0 (infinity: not yet).
    const double never = std::numeric_limits<double>::infinity();
    // The scheduler looks up at most `depth` requests ahead of the worker's loads: a
    // replay that falls behind the trace's pace does not look up seconds of arrivals
    // before their predecessors have saved the blocks they share.
    double lookup_due = never;
    if (next < n && pending.size() < c_.depth) {
      lookup_due = c_.speed > 0 ? (trace_[next].timestamp_ms - first_ms) / 1000.0 / c_.speed
                                : now_s;  // as fast as possible: as soon as there is room
    }
    const double load_due = pending.empty() ? never : pending.front().lookup_at_s + lookahead_s;
    const bool load = load_due <= lookup_due;
    const double due = load ? load_due : lookup_due;
    if (due > now_s) {
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(due)));
    } else if (c_.speed > 0) {
      s_.late_us.Add((now_s - due) * 1e6);
    }
    if (load) {
      LoadAndSave(pending.front());
      pending.pop_front();
    } else {
      pending.push_back(Lookup(next++, Seconds(Clock::now() - t0)));
    }
    if (progress_interval > 0 && Seconds(Clock::now() - last_progress) >= progress_interval) {
      last_progress = Clock::now();
      std::fprintf(stderr, "... trace: %" PRIu64 " of %zu requests done\n", s_.requests, n);
    }
  }
  const double wall_s = Seconds(Clock::now() - t0);
  if (reg.ok()) engine_->UnregisterBuffer(buffer_.data());
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
      "micros; %" PRIu64 " loaded slower (%.3f s lost, not counted as saved)\n",
      c_.prefill_tokens_per_s, s.prefill_saved_s, s.prefill_all_s,
      s.prefill_all_s > 0 ? s.prefill_saved_s / s.prefill_all_s : 0, s.faster,
      s.ttft_saved_us.Percentile(50), s.ttft_saved_us.Percentile(99), s.slower, s.slower_lost_s);
  j += Printf(
      ",\"prefill_tokens_per_s\":%.6g,\"prefill_seconds\":%.6g"
      ",\"prefill_seconds_saved\":%.6g,\"loaded_tokens\":%" PRIu64 ",\"tokens\":%" PRIu64
      ",\"requests_load_faster\":%" PRIu64 ",\"requests_load_slower\":%" PRIu64
      ",\"slower_seconds_lost\":%.6g,\"ttft_saved_us\":",
      c_.prefill_tokens_per_s, s.prefill_all_s, s.prefill_saved_s, s.loaded_tokens, s.tokens,
      s.faster, s.slower, s.slower_lost_s);
  j += PercentilesJson(s.ttft_saved_us);
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
