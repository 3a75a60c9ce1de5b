// The key-level benchmarks, the vLLM scenarios and gc_churn.  Each thread owns its keys,
// buffers and random stream; only the engine call sits inside the timed span (key
// formatting and byte verification do not).
#include "db_bench/benchmarks.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace kvbench {

RunSpec BenchContext::Spec(uint64_t total_ops) const {
  RunSpec s;
  s.label = label;
  s.threads = config->threads;
  s.total_ops = total_ops;
  s.duration = config->duration;
  s.progress_interval = config->progress_interval;
  s.seed = config->seed + seed_salt * 7919;
  return s;
}

namespace {

std::string Describe(const Slice& key, int64_t code) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "' failed with code %" PRId64, code);
  return "key '" + key.ToString() + buf;
}

// The keys of one call of a key-level benchmark, with what its value should be.
struct KeyBatch {
  std::vector<uint64_t> ids;
  std::vector<std::string> strings;
  std::vector<Slice> slices;

  void Build(const KeySpace& space, bool missing) {
    strings.resize(ids.size());
    slices.resize(ids.size());
    for (size_t i = 0; i < ids.size(); i++) {
      if (missing) {
        space.FormatMissing(ids[i], &strings[i]);
      } else {
        space.Format(ids[i], &strings[i]);
      }
      slices[i] = Slice(strings[i]);
    }
  }
  uint64_t KeyBytes() const {
    uint64_t n = 0;
    for (const auto& s : strings) n += s.size();
    return n;
  }
};

// Chooses the keys of the next call: sequential through this thread's slice of the key
// space, or distinct random keys anywhere in it.
class KeyChooser {
 public:
  KeyChooser(const BenchContext& b, ThreadContext& ctx, bool sequential)
      : num_(b.config->num),
        batch_(b.config->batch_size),
        sequential_(sequential),
        begin_(ctx.SliceBegin(num_)),
        end_(ctx.SliceEnd(num_)) {}

  void Next(ThreadContext& ctx, std::vector<uint64_t>* ids) {
    uint64_t n = std::min(batch_, ctx.Remaining());
    if (sequential_) {
      const uint64_t span = end_ - begin_;
      const uint64_t first = begin_ + (position_ % span);
      n = std::min(n, end_ - first);
      ids->clear();
      for (uint64_t i = 0; i < n; i++) ids->push_back(first + i);
      position_ += n;
    } else {
      DistinctRandom(&ctx.rng(), num_, n, ids);
    }
  }

 private:
  uint64_t num_, batch_;
  bool sequential_;
  uint64_t begin_, end_;
  uint64_t position_ = 0;
};

// The buffers a thread reads into: one per key of a batch.
struct ReadBuffers {
  std::vector<AlignedBuffer> buffers;
  std::vector<Destination> dests;
  Engine* registered_with = nullptr;

  // With `engine`, the buffers are registered with it, as a peer's client registers the
  // buffers it reads into again and again (one-sided transports then read into them
  // directly).
  ReadBuffers(uint64_t n, uint64_t value_size, Engine* engine = nullptr) {
    buffers.reserve(n);
    for (uint64_t i = 0; i < n; i++) {
      buffers.emplace_back(value_size);
      dests.push_back({MutableSlice(buffers.back().data(), value_size)});
    }
    if (engine == nullptr) return;
    registered_with = engine;
    for (AlignedBuffer& b : buffers) {
      if (!engine->RegisterBuffer(b.data(), value_size).ok()) registered_with = nullptr;
    }
  }
  ~ReadBuffers() {
    if (registered_with == nullptr) return;
    for (AlignedBuffer& b : buffers) (void)registered_with->UnregisterBuffer(b.data());
  }
};

// Checks one value read for key id; counts it.
void CheckValue(ThreadContext& ctx, const BenchContext& b, const Slice& key, uint64_t id,
                const char* data, uint64_t size) {
  if (!b.config->verify) return;
  const Slice want = b.pool->For(id);
  if (size != want.size() || std::memcmp(data, want.data(), want.size()) != 0) {
    ctx.Error("key '" + key.ToString() + "': the bytes read differ from the bytes written");
  } else {
    ctx.CountVerified(1);
  }
}

// One write call (Put, or BatchPut for several keys).
void DoWrite(ThreadContext& ctx, const BenchContext& b, KeyBatch& kb,
             std::vector<ValueParts>& values, std::vector<int64_t>& results) {
  const uint64_t n = kb.ids.size();
  const uint64_t bytes = kb.KeyBytes() + n * b.config->value_size;
  if (n == 1) {
    const Slice value = b.pool->For(kb.ids[0]);
    const auto start = Clock::now();
    Status s = b.engine->Put(kb.slices[0], value);
    ctx.Record(start, 1, 1, bytes);
    if (!s.ok()) ctx.Error("put of key '" + kb.strings[0] + "': " + s.ToString());
    return;
  }
  values.resize(n);
  for (uint64_t i = 0; i < n; i++) values[i] = {b.pool->For(kb.ids[i])};
  const auto start = Clock::now();
  Status s = b.engine->BatchPut(kb.slices, values, &results);
  ctx.Record(start, n, n, bytes);
  if (!s.ok()) {
    ctx.Error("BatchPut: " + s.ToString());
    return;
  }
  for (uint64_t i = 0; i < n; i++) {
    if (results[i] != 0) ctx.Error("put of " + Describe(kb.slices[i], results[i]));
  }
}

// One read call (GetInto, or BatchGetInto for several keys); returns the latency.
double DoRead(ThreadContext& ctx, const BenchContext& b, KeyBatch& kb, ReadBuffers& rb,
              std::vector<int64_t>& results) {
  const uint64_t n = kb.ids.size();
  const uint64_t vs = b.config->value_size;
  if (n == 1) {
    size_t size = 0;
    const auto start = Clock::now();
    Status s = b.engine->GetInto(kb.slices[0], MutableSlice(rb.buffers[0].data(), vs), &size);
    const bool found = s.ok();
    const double us = ctx.Record(start, 1, 1, kb.KeyBytes() + (found ? size : 0));
    ctx.CountLookups(1, found ? 1 : 0);
    if (found) {
      CheckValue(ctx, b, kb.slices[0], kb.ids[0], rb.buffers[0].data(), size);
    } else if (!s.IsNotFound()) {
      ctx.Error("get of key '" + kb.strings[0] + "': " + s.ToString());
    }
    return us;
  }
  std::span<const Destination> dests(rb.dests.data(), n);
  const auto start = Clock::now();
  Status s = b.engine->BatchGetInto(kb.slices, dests, &results);
  uint64_t found = 0, bytes = kb.KeyBytes();
  if (s.ok()) {
    for (uint64_t i = 0; i < n; i++) {
      if (results[i] >= 0) {
        found++;
        bytes += static_cast<uint64_t>(results[i]);
      }
    }
  }
  const double us = ctx.Record(start, n, n, bytes);
  ctx.CountLookups(n, found);
  if (!s.ok()) {
    ctx.Error("BatchGetInto: " + s.ToString());
    return us;
  }
  for (uint64_t i = 0; i < n; i++) {
    if (results[i] >= 0) {
      CheckValue(ctx, b, kb.slices[i], kb.ids[i], rb.buffers[i].data(),
                 static_cast<uint64_t>(results[i]));
    } else if (results[i] != Status::NotFound("").ErrorCode()) {
      ctx.Error("get of " + Describe(kb.slices[i], results[i]));
    }
  }
  return us;
}

// One delete call (Delete, or BatchDelete for several keys); returns the latency.
double DoDelete(ThreadContext& ctx, const BenchContext& b, KeyBatch& kb,
                std::vector<int64_t>& results) {
  const uint64_t n = kb.ids.size();
  if (n == 1) {
    const auto start = Clock::now();
    Status s = b.engine->Delete(kb.slices[0]);
    const double us = ctx.Record(start, 1, 1, kb.KeyBytes());
    ctx.CountLookups(1, s.ok() ? 1 : 0);
    if (!s.ok() && !s.IsNotFound()) {
      ctx.Error("delete of key '" + kb.strings[0] + "': " + s.ToString());
    }
    return us;
  }
  const auto start = Clock::now();
  Status s = b.engine->BatchDelete(kb.slices, &results);
  const double us = ctx.Record(start, n, n, kb.KeyBytes());
  if (!s.ok()) {
    ctx.Error("BatchDelete: " + s.ToString());
    return us;
  }
  uint64_t found = 0;
  for (uint64_t i = 0; i < n; i++) {
    if (results[i] == 0) {
      found++;
    } else if (results[i] != Status::NotFound("").ErrorCode()) {
      ctx.Error("delete of " + Describe(kb.slices[i], results[i]));
    }
  }
  ctx.CountLookups(n, found);
  return us;
}

}  // namespace

// The value pool registered with a peer engine while puts run, as a client registers the
// memory its values come from once (vLLM's and SGLang's KV caches): a one-sided
// transport then writes from it directly, with no bounce copy (UCX's ucx_direct_ops
// against ucx_bounce_ops).  The transport only reads it.
struct PoolRegistration {
  Engine* engine = nullptr;
  void* addr = nullptr;
  explicit PoolRegistration(const BenchContext& b) {
    if (std::string(b.engine->Name()) != "peer" || !b.config->peer_register_values) return;
    addr = const_cast<char*>(b.pool->data());
    if (b.engine->RegisterBuffer(addr, b.pool->bytes()).ok()) engine = b.engine;
  }
  ~PoolRegistration() {
    if (engine != nullptr) (void)engine->UnregisterBuffer(addr);
  }
};

Result RunFill(const BenchContext& b, bool sequential) {
  const PoolRegistration registered(b);
  return RunParallel(b.Spec(b.config->num), [&b, sequential](ThreadContext& ctx) -> OpFn {
    auto chooser = std::make_shared<KeyChooser>(b, ctx, sequential);
    auto kb = std::make_shared<KeyBatch>();
    auto values = std::make_shared<std::vector<ValueParts>>();
    auto results = std::make_shared<std::vector<int64_t>>();
    const KeySpace space = b.Keys();
    return [=, &b](ThreadContext& c) {
      chooser->Next(c, &kb->ids);
      kb->Build(space, false);
      DoWrite(c, b, *kb, *values, *results);
    };
  });
}

Result RunRead(const BenchContext& b, ReadKind kind) {
  Result r = RunParallel(b.Spec(b.config->num), [&b, kind](ThreadContext& ctx) -> OpFn {
    auto chooser = std::make_shared<KeyChooser>(b, ctx, kind == ReadKind::kSequential);
    auto kb = std::make_shared<KeyBatch>();
    const bool peer = std::string(b.engine->Name()) == "peer";
    auto rb = std::make_shared<ReadBuffers>(b.config->batch_size, b.config->value_size,
                                            peer ? b.engine : nullptr);
    auto results = std::make_shared<std::vector<int64_t>>();
    const KeySpace space = b.Keys();
    return [=, &b](ThreadContext& c) {
      chooser->Next(c, &kb->ids);
      kb->Build(space, kind == ReadKind::kMissing);
      DoRead(c, b, *kb, *rb, *results);
    };
  });
  r.counts_found = true;
  return r;
}

Result RunDeleteRandom(const BenchContext& b) {
  Result r = RunParallel(b.Spec(b.config->num), [&b](ThreadContext& ctx) -> OpFn {
    auto chooser = std::make_shared<KeyChooser>(b, ctx, false);
    auto kb = std::make_shared<KeyBatch>();
    auto results = std::make_shared<std::vector<int64_t>>();
    const KeySpace space = b.Keys();
    return [=, &b](ThreadContext& c) {
      chooser->Next(c, &kb->ids);
      kb->Build(space, false);
      DoDelete(c, b, *kb, *results);
    };
  });
  r.counts_found = b.engine->DeleteReportsAbsent();
  if (!r.counts_found) r.note = "the engine does not report absent keys on delete";
  return r;
}

Result RunCompact(const BenchContext& b) {
  // Untimed: delete a random fraction of the keys (the same in every engine for a
  // seed) and make the deletes durable, so that the engine has garbage to collect.
  std::mt19937_64 rng(b.config->seed + b.seed_salt * 7919);
  std::bernoulli_distribution coin(b.config->compact_delete_fraction);
  const KeySpace space = b.Keys();
  KeyBatch kb;
  std::vector<int64_t> results;
  uint64_t deleted = 0;
  Result r;
  auto fail = [&r](const std::string& what) {
    if (r.errors++ == 0) r.first_error = what;
  };
  auto delete_batch = [&] {
    kb.Build(space, false);
    Status s = b.engine->BatchDelete(kb.slices, &results);
    if (!s.ok()) fail("BatchDelete: " + s.ToString());
    deleted += kb.ids.size();
    kb.ids.clear();
  };
  for (uint64_t id = 0; id < b.config->num; id++) {
    if (coin(rng)) kb.ids.push_back(id);
    if (kb.ids.size() == 256) delete_batch();
  }
  if (!kb.ids.empty()) delete_batch();
  Status s = b.engine->Flush();
  if (!s.ok()) fail("Flush: " + s.ToString());

  uint64_t reclaimed = 0, rewritten = 0;
  const auto start = Clock::now();
  s = b.engine->Compact(&reclaimed, &rewritten);
  r.seconds = r.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!s.ok()) fail("Compact: " + s.ToString());
  r.ops = 1;
  r.bytes = reclaimed;
  r.reclaimed_bytes = reclaimed;
  r.reports_reclaimed = true;
  char note[128];
  std::snprintf(note, sizeof(note),
                "%" PRIu64 " of %" PRIu64 " keys deleted first; %.1f MiB rewritten", deleted,
                b.config->num, static_cast<double>(rewritten) / 1048576.0);
  r.note = note;
  return r;
}

Result RunExistRandom(const BenchContext& b) {
  Result r = RunParallel(b.Spec(b.config->num), [&b](ThreadContext& ctx) -> OpFn {
    auto chooser = std::make_shared<KeyChooser>(b, ctx, false);
    auto kb = std::make_shared<KeyBatch>();
    auto results = std::make_shared<std::vector<int64_t>>();
    const KeySpace space = b.Keys();
    return [=, &b](ThreadContext& c) {
      chooser->Next(c, &kb->ids);
      kb->Build(space, false);
      const uint64_t n = kb->ids.size();
      const auto start = Clock::now();
      Status s = b.engine->BatchExists(kb->slices, results.get());
      c.Record(start, n, n, kb->KeyBytes());
      if (!s.ok()) {
        c.Error("BatchExists: " + s.ToString());
        return;
      }
      uint64_t found = 0;
      for (uint64_t i = 0; i < n; i++) {
        if ((*results)[i] == 1) {
          found++;
        } else if ((*results)[i] != 0) {
          c.Error("exists of " + Describe(kb->slices[i], (*results)[i]));
        }
      }
      c.CountLookups(n, found);
    };
  });
  r.counts_found = true;
  return r;
}

namespace {

// A thread's state for the vLLM scenarios: one source and one destination buffer per
// layer (as a serving engine has one KV tensor per layer), and the request's keys.
struct VllmThread {
  uint64_t layers, value_size, seed;
  uint64_t offset;        // where each layer's bytes start in its buffer (--buffer_offset)
  uint64_t first, count;  // this thread's requests
  std::vector<AlignedBuffer> src, dst;
  std::vector<std::vector<std::string>> all_keys;  // per request of this thread
  std::vector<Slice> keys;
  std::vector<ValueParts> values;
  std::vector<Destination> dests;
  std::vector<int64_t> put_results, exist_results, get_results;
  std::vector<size_t> layer_ends;  // one group per layer (vllm_load)

  VllmThread(const BenchContext& b, ThreadContext& ctx)
      : layers(b.config->num_layers),
        value_size(b.config->value_size),
        seed(b.config->seed),
        offset(b.config->buffer_offset),
        first(ctx.SliceBegin(b.config->requests)),
        count(ctx.SliceEnd(b.config->requests) - first),
        all_keys(count),
        keys(layers),
        values(layers),
        dests(layers) {
    for (uint64_t l = 0; l < layers; l++) {
      layer_ends.push_back(l + 1);
      src.emplace_back(offset + value_size);
      std::memcpy(src.back().data() + offset, b.pool->For(l).data(), value_size);
      dst.emplace_back(offset + value_size);
      values[l] = {Slice(src[l].data() + offset, value_size)};
      dests[l] = {MutableSlice(dst[l].data() + offset, value_size)};
    }
  }

  // Points keys at the request's layer keys (formatted once, at the first use) and, for a
  // write, stamps the request into the source buffers.
  uint64_t Prepare(uint64_t request, bool stamp) {
    std::vector<std::string>& strings = all_keys[request - first];
    if (strings.empty()) {
      for (uint64_t l = 0; l < layers; l++) strings.push_back(VllmKey(seed, request, l));
    }
    uint64_t key_bytes = 0;
    for (uint64_t l = 0; l < layers; l++) {
      keys[l] = Slice(strings[l]);
      key_bytes += strings[l].size();
      if (stamp) StampVllmValue(request, l, src[l].data() + offset, value_size);
    }
    return key_bytes;
  }

  // Checks the layers read for `request` against what vllm_write stored.
  void Verify(ThreadContext& ctx, const BenchContext& b, uint64_t request) {
    uint64_t ok = 0;
    for (uint64_t l = 0; l < layers; l++) {
      if (get_results[l] < 0) continue;
      char expected_stamp[16];
      std::memcpy(expected_stamp, b.pool->For(l).data(), std::min<uint64_t>(16, value_size));
      StampVllmValue(request, l, expected_stamp, std::min<uint64_t>(16, value_size));
      const uint64_t head = std::min<uint64_t>(16, value_size);
      const bool same = static_cast<uint64_t>(get_results[l]) == value_size &&
                        std::memcmp(dst[l].data() + offset, expected_stamp, head) == 0 &&
                        std::memcmp(dst[l].data() + offset + head, b.pool->For(l).data() + head,
                                    value_size - head) == 0;
      if (same) {
        ok++;
      } else {
        ctx.Error("key '" + keys[l].ToString() + "': the bytes read differ from the bytes written");
      }
    }
    ctx.CountVerified(ok);
  }
};

void CheckCodes(ThreadContext& ctx, const char* call, const std::vector<Slice>& keys,
                const std::vector<int64_t>& results, bool absent_ok, uint64_t* found) {
  for (size_t i = 0; i < results.size(); i++) {
    if (results[i] >= 0) {
      if (found) *found += results[i] != 0 || std::string(call) != "exists";
    } else if (!(absent_ok && results[i] == Status::NotFound("").ErrorCode())) {
      ctx.Error(std::string(call) + " of " + Describe(keys[i], results[i]));
    }
  }
}

}  // namespace

Result RunVllm(const BenchContext& b, VllmKind kind) {
  Result r = RunParallel(b.Spec(b.config->requests), [&b, kind](ThreadContext& ctx) -> OpFn {
    auto t = std::make_shared<VllmThread>(b, ctx);
    return [t, &b, kind](ThreadContext& c) {
      const uint64_t request = t->first + c.ops_done() % t->count;
      const bool writes = kind == VllmKind::kWrite || kind == VllmKind::kAll;
      const uint64_t key_bytes = t->Prepare(request, writes);
      const uint64_t value_bytes = t->layers * t->value_size;
      const auto start = Clock::now();
      Status put, exist, get;
      if (writes) put = b.engine->BatchPut(t->keys, t->values, &t->put_results);
      if (kind == VllmKind::kExist || kind == VllmKind::kAll) {
        exist = b.engine->BatchExists(t->keys, &t->exist_results);
      }
      if (kind == VllmKind::kGet || kind == VllmKind::kAll) {
        get = b.engine->BatchGetInto(t->keys, t->dests, &t->get_results);
      }
      if (kind == VllmKind::kLoad || kind == VllmKind::kLoadSerial) {
        Clock::time_point first_ready = start;
        auto on_ready = [&first_ready](size_t layer) {
          if (layer == 0) first_ready = Clock::now();
        };
        get = kind == VllmKind::kLoad
                  ? b.engine->BatchGetIntoGroups(t->keys, t->dests, t->layer_ends, on_ready,
                                                 &t->get_results)
                  : b.engine->Engine::BatchGetIntoGroups(t->keys, t->dests, t->layer_ends, on_ready,
                                                         &t->get_results);
        c.extra[0].Add(std::chrono::duration<double, std::micro>(first_ready - start).count());
      }
      uint64_t bytes = key_bytes + (writes ? value_bytes : 0);
      uint64_t found = 0;
      const bool reads = kind == VllmKind::kGet || kind == VllmKind::kAll ||
                         kind == VllmKind::kLoad || kind == VllmKind::kLoadSerial;
      if (reads && get.ok()) {
        for (int64_t x : t->get_results) bytes += x > 0 ? static_cast<uint64_t>(x) : 0;
      }
      c.Record(start, 1, t->layers, bytes);
      if (!put.ok()) c.Error("BatchPut: " + put.ToString());
      if (!exist.ok()) c.Error("BatchExists: " + exist.ToString());
      if (!get.ok()) c.Error("BatchGetInto: " + get.ToString());
      if (writes && put.ok()) CheckCodes(c, "put", t->keys, t->put_results, false, nullptr);
      if (kind == VllmKind::kExist && exist.ok()) {
        CheckCodes(c, "exists", t->keys, t->exist_results, false, &found);
        c.CountLookups(t->layers, found);
      }
      if (kind == VllmKind::kAll && exist.ok()) {
        uint64_t present = 0;
        CheckCodes(c, "exists", t->keys, t->exist_results, false, &present);
        if (present != t->layers) {
          c.Error("exists after put found " + std::to_string(present) + " of " +
                  std::to_string(t->layers) + " layers");
        }
      }
      if (reads && get.ok()) {
        found = 0;
        CheckCodes(c, "get", t->keys, t->get_results, true, &found);
        c.CountLookups(t->layers, found);
        if (b.config->verify) t->Verify(c, b, request);
      }
    };
  });
  r.counts_found = kind != VllmKind::kWrite;
  if (kind == VllmKind::kLoad || kind == VllmKind::kLoadSerial) {
    // The whole load's latency is the per-call P50/P99; the first layer's beside it.
    r.reports_latency = true;
    const Histogram& first = r.kind_hist[0];
    char note[128];
    std::snprintf(note, sizeof(note), "first layer ready P50 %.1f P99 %.1f micros",
                  first.Percentile(50), first.Percentile(99));
    r.note = note;
  }
  return r;
}

Result RunGcChurn(const BenchContext& b) {
  const std::optional<uint64_t> before = b.engine->ReclaimedBytes();
  Result r = RunParallel(b.Spec(b.config->num), [&b](ThreadContext& ctx) -> OpFn {
    auto chooser = std::make_shared<KeyChooser>(b, ctx, false);
    auto kb = std::make_shared<KeyBatch>();
    auto values = std::make_shared<std::vector<ValueParts>>();
    auto rb = std::make_shared<ReadBuffers>(b.config->batch_size, b.config->value_size);
    auto results = std::make_shared<std::vector<int64_t>>();
    const KeySpace space = b.Keys();
    std::uniform_real_distribution<double> coin(0, 1);
    return [=, &b](ThreadContext& c) mutable {
      chooser->Next(c, &kb->ids);
      kb->Build(space, false);
      const double x = coin(c.rng());
      if (x < b.config->gc_delete_fraction) {
        c.extra[2].Add(DoDelete(c, b, *kb, *results));
      } else if (x < b.config->gc_delete_fraction + b.config->gc_write_fraction) {
        const auto start = Clock::now();
        DoWrite(c, b, *kb, *values, *results);
        c.extra[1].Add(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      } else {
        c.extra[0].Add(DoRead(c, b, *kb, *rb, *results));
      }
    };
  });
  // Deletes and reads both count lookups; the found counts mix them, so leave them out.
  r.lookups = r.found = 0;
  r.reports_reclaimed = true;
  const std::optional<uint64_t> after = b.engine->ReclaimedBytes();
  if (before && after) r.reclaimed_bytes = *after - *before;
  return r;
}

}  // namespace kvbench
