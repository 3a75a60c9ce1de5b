// GPU staging on every machine: the pipeline's logic through the HostCopier (a "device"
// made of host memory and worker threads), the DB's routing of device buffers through
// test hooks, and pointer detection on whatever this machine has.
#include "env/gpu_staging.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "env/gpu_io.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "kvengine/perf.h"
#include "test/test_util.h"
#include "util/perf_point.h"

namespace kvengine {
namespace {

using test::MakeValue;

StagingOptions SmallRing(size_t chunk = 4096, size_t slots = 4, int streams = 2) {
  StagingOptions o;
  o.chunk_bytes = chunk;
  o.staging_bytes = chunk * slots;
  o.streams = streams;
  return o;
}

// A pipeline over a HostCopier; copier_ stays readable after the pipeline takes it.
class PipelineTest : public ::testing::Test {
 protected:
  void Make(const StagingOptions& options, HostCopier::Faults faults = {}) {
    auto copier = std::make_unique<HostCopier>(std::move(faults));
    copier_ = copier.get();
    Status s = StagingPipeline::Create(std::move(copier), options, &pipeline_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  HostCopier* copier_ = nullptr;
  std::unique_ptr<StagingPipeline> pipeline_;
};

// Splits `bytes` into buffers of the given sizes (the last takes the rest).
std::vector<size_t> Split(size_t bytes, std::mt19937_64& rng, size_t max_part) {
  std::vector<size_t> sizes;
  while (bytes > 0) {
    size_t n = std::min<size_t>(bytes, rng() % (max_part + 1));
    if (rng() % 5 == 0) n = 0;  // empty buffers are legal and skipped
    sizes.push_back(n);
    bytes -= n;
  }
  sizes.push_back(0);
  return sizes;
}

TEST_F(PipelineTest, DeviceToPageableHostIsChunkedThroughTheRing) {
  Make(SmallRing(4096, 4));
  const std::string value = MakeValue(1, 4096 * 5 + 1234);  // 6 chunks, ring of 4
  std::string out(value.size(), '\0');
  Transfer t;
  t.src.push_back({value.data(), value.size(), MemoryKind::kDevice});
  t.dst.push_back({out.data(), out.size(), MemoryKind::kHost});
  Status s = pipeline_->Run(&t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out, value);
  EXPECT_EQ(pipeline_->counters().staged_chunks, 6u);
  EXPECT_EQ(pipeline_->counters().direct_chunks, 0u);
  EXPECT_LE(copier_->counters().max_copy_bytes, 4096u);
  EXPECT_EQ(copier_->counters().streams_used, 0b11u);  // both streams carried chunks
}

TEST_F(PipelineTest, PageableHostToDeviceIsChunkedThroughTheRing) {
  Make(SmallRing(4096, 2));
  const std::string value = MakeValue(2, 4096 * 7 + 5);
  std::string out(value.size() + 100, 'x');
  Transfer t;
  t.src.push_back({value.data(), value.size(), MemoryKind::kHost});
  t.dst.push_back({out.data(), out.size(), MemoryKind::kDevice});
  ASSERT_TRUE(pipeline_->Run(&t).ok());
  EXPECT_EQ(out.substr(0, value.size()), value);
  EXPECT_EQ(out.substr(value.size()), std::string(100, 'x'));  // nothing past the value
  EXPECT_EQ(pipeline_->counters().staged_chunks, 8u);
}

TEST_F(PipelineTest, PinnedHostSideCopiesDirectly) {
  Make(SmallRing(4096, 4));
  const std::string value = MakeValue(3, 4096 * 3);
  std::string dev(value.size(), '\0'), back(value.size(), '\0');
  Transfer up;
  up.src.push_back({value.data(), value.size(), MemoryKind::kPinnedHost});
  up.dst.push_back({dev.data(), dev.size(), MemoryKind::kDevice});
  ASSERT_TRUE(pipeline_->Run(&up).ok());
  Transfer down;
  down.src.push_back({dev.data(), dev.size(), MemoryKind::kDevice});
  down.dst.push_back({back.data(), back.size(), MemoryKind::kPinnedHost});
  ASSERT_TRUE(pipeline_->Run(&down).ok());
  EXPECT_EQ(back, value);
  EXPECT_EQ(pipeline_->counters().direct_chunks, 6u);
  EXPECT_EQ(pipeline_->counters().staged_chunks, 0u);
}

TEST_F(PipelineTest, MultiBufferGatherAndScatterBothWays) {
  HostCopier::Faults faults;
  faults.max_delay_us = 50;  // shuffle completion timing
  Make(SmallRing(1000, 3, 2), faults);
  std::mt19937_64 rng(42);
  for (int round = 0; round < 30; round++) {
    const size_t bytes = 1 + rng() % 20000;
    const std::string value = MakeValue(round, bytes);
    // Gather: many "device" layers -> one pageable host value.
    std::vector<size_t> parts = Split(bytes, rng, 3000);
    std::vector<std::string> layers;
    size_t off = 0;
    for (size_t n : parts) {
      layers.push_back(value.substr(off, n));
      off += n;
    }
    Transfer gather;
    for (size_t i = 0; i < layers.size(); i++) {
      // Mixed values: some layers already on the host.
      MemoryKind k = (i % 4 == 3) ? MemoryKind::kHost : MemoryKind::kDevice;
      gather.src.push_back({layers[i].data(), layers[i].size(), k});
    }
    std::string host(bytes, '\0');
    gather.dst.push_back({host.data(), host.size(), MemoryKind::kHost});
    Status s = pipeline_->Run(&gather);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(host, value) << "round " << round;

    // Scatter: one host value -> many "device" buffers with room to spare.
    std::vector<size_t> dsizes = Split(bytes + rng() % 50, rng, 2500);
    std::vector<std::string> dbufs;
    for (size_t n : dsizes) dbufs.emplace_back(n, '\0');
    Transfer scatter;
    scatter.src.push_back({value.data(), value.size(), MemoryKind::kHost});
    for (auto& d : dbufs) scatter.dst.push_back({d.data(), d.size(), MemoryKind::kDevice});
    ASSERT_TRUE(pipeline_->Run(&scatter).ok());
    std::string joined;
    for (auto& d : dbufs) joined += d;
    ASSERT_EQ(joined.substr(0, bytes), value) << "round " << round;
  }
  // Double buffering: more than one copy was in flight at once, on both streams.
  EXPECT_GE(copier_->counters().max_in_flight, 2u);
  EXPECT_EQ(copier_->counters().streams_used, 0b11u);
}

TEST_F(PipelineTest, ManyTransfersInFlightWrapTheRingAndKeepTheirBytes) {
  HostCopier::Faults faults;
  faults.max_delay_us = 30;
  Make(SmallRing(512, 2, 3), faults);  // a ring of two slots: every chunk waits for one
  std::vector<std::string> values, outs;
  for (int i = 0; i < 40; i++) {
    values.push_back(MakeValue(100 + i, 1 + (i * 397) % 3000));
    outs.emplace_back(values.back().size(), '\0');
  }
  std::vector<Transfer> ts(values.size());
  for (size_t i = 0; i < values.size(); i++) {
    const bool up = i % 2 == 0;
    ts[i].src.push_back(
        {values[i].data(), values[i].size(), up ? MemoryKind::kHost : MemoryKind::kDevice});
    ts[i].dst.push_back(
        {outs[i].data(), outs[i].size(), up ? MemoryKind::kDevice : MemoryKind::kHost});
    pipeline_->Submit(&ts[i]);  // no waiting between transfers
  }
  pipeline_->WaitAll();
  for (size_t i = 0; i < values.size(); i++) {
    ASSERT_TRUE(ts[i].status.ok()) << i << ": " << ts[i].status.ToString();
    EXPECT_EQ(ts[i].pending, 0u);
    EXPECT_EQ(outs[i], values[i]) << "transfer " << i;
  }
}

TEST_F(PipelineTest, LaterTransfersToTheSameBufferWin) {
  HostCopier::Faults faults;
  faults.max_delay_us = 40;
  Make(SmallRing(256, 4, 4), faults);
  std::string dst(2048, '\0');
  std::vector<std::string> values;
  std::vector<Transfer> ts(8);
  for (int i = 0; i < 8; i++) values.push_back(MakeValue(7 + i, dst.size()));
  for (int i = 0; i < 8; i++) {
    // Device -> pageable host drains in submission order, so the last one lands last.
    ts[i].src.push_back({values[i].data(), values[i].size(), MemoryKind::kDevice});
    ts[i].dst.push_back({dst.data(), dst.size(), MemoryKind::kHost});
    pipeline_->Submit(&ts[i]);
  }
  pipeline_->WaitAll();
  EXPECT_EQ(dst, values.back());
}

TEST_F(PipelineTest, AFailedCopyFailsItsTransferOnly) {
  std::string bad_value = MakeValue(9, 10000);
  const char* bad_begin = bad_value.data();
  const char* bad_end = bad_begin + bad_value.size();
  HostCopier::Faults faults;
  faults.max_delay_us = 20;
  faults.fail_complete = [=](const void*, const void* src, size_t) {
    const char* p = static_cast<const char*>(src);
    return p >= bad_begin && p < bad_end;
  };
  Make(SmallRing(1024, 3), faults);
  std::string good1 = MakeValue(10, 5000), good2 = MakeValue(11, 7000);
  std::string out1(good1.size(), '\0'), out_bad(bad_value.size(), '\0'), out2(good2.size(), '\0');
  Transfer t1, tb, t2;
  t1.src.push_back({good1.data(), good1.size(), MemoryKind::kDevice});
  t1.dst.push_back({out1.data(), out1.size(), MemoryKind::kHost});
  tb.src.push_back({bad_value.data(), bad_value.size(), MemoryKind::kDevice});
  tb.dst.push_back({out_bad.data(), out_bad.size(), MemoryKind::kHost});
  t2.src.push_back({good2.data(), good2.size(), MemoryKind::kDevice});
  t2.dst.push_back({out2.data(), out2.size(), MemoryKind::kHost});
  pipeline_->Submit(&t1);
  pipeline_->Submit(&tb);
  pipeline_->Submit(&t2);
  pipeline_->WaitAll();
  EXPECT_TRUE(t1.status.ok()) << t1.status.ToString();
  EXPECT_TRUE(tb.status.IsIOError()) << tb.status.ToString();
  EXPECT_NE(tb.status.message().find("injected"), std::string::npos);
  EXPECT_TRUE(t2.status.ok()) << t2.status.ToString();
  EXPECT_EQ(out1, good1);
  EXPECT_EQ(out2, good2);
  EXPECT_EQ(pipeline_->counters().failed_transfers, 1u);
}

TEST_F(PipelineTest, ASubmitErrorStopsItsTransferAndTheNextOneRuns) {
  std::atomic<int> calls{0};
  HostCopier::Faults faults;
  faults.fail_submit = [&](const void*, const void*, size_t) { return ++calls == 3; };
  Make(SmallRing(1024, 4), faults);
  std::string v1 = MakeValue(20, 8000), v2 = MakeValue(21, 3000);
  std::string o1(v1.size(), '\0'), o2(v2.size(), '\0');
  Transfer t1, t2;
  t1.src.push_back({v1.data(), v1.size(), MemoryKind::kHost});
  t1.dst.push_back({o1.data(), o1.size(), MemoryKind::kDevice});
  t2.src.push_back({v2.data(), v2.size(), MemoryKind::kHost});
  t2.dst.push_back({o2.data(), o2.size(), MemoryKind::kDevice});
  EXPECT_TRUE(pipeline_->Run(&t1).IsIOError());
  EXPECT_LT(t1.submitted, v1.size());  // it stopped at the failed chunk
  EXPECT_TRUE(pipeline_->Run(&t2).ok());
  EXPECT_EQ(o2, v2);
}

TEST_F(PipelineTest, MalformedTransfersAreRefused) {
  Make(SmallRing());
  std::string v(100, 'a'), small(50, '\0');
  Transfer too_small;
  too_small.src.push_back({v.data(), v.size(), MemoryKind::kDevice});
  too_small.dst.push_back({small.data(), small.size(), MemoryKind::kHost});
  EXPECT_TRUE(pipeline_->Run(&too_small).IsBufferTooSmall());
  Transfer null_src;
  null_src.src.push_back({nullptr, 10, MemoryKind::kDevice});
  null_src.dst.push_back({small.data(), small.size(), MemoryKind::kHost});
  EXPECT_TRUE(pipeline_->Run(&null_src).IsInvalidArgument());
  Transfer empty;  // nothing to move is fine
  EXPECT_TRUE(pipeline_->Run(&empty).ok());
}

TEST(StagingPipelineCreate, RingHasAtLeastTwoSlotsAndPinnedMemory) {
  auto copier = std::make_unique<HostCopier>();
  HostCopier* c = copier.get();
  std::unique_ptr<StagingPipeline> p;
  StagingOptions o;
  o.chunk_bytes = 8192;
  o.staging_bytes = 4096;  // less than one chunk: still double-buffered
  ASSERT_TRUE(StagingPipeline::Create(std::move(copier), o, &p).ok());
  EXPECT_EQ(p->slots(), 2);
  EXPECT_EQ(p->staging_size(), 2u * 8192);
  EXPECT_GE(c->counters().pinned_allocated, 2u * 8192);
  EXPECT_TRUE(StagingPipeline::Create(nullptr, o, &p).IsInvalidArgument());
  EXPECT_EQ(p, nullptr);
}

// ---------------------------------------------------------------- detection

TEST(GpuDetection, HostMemoryIsHostAndMachineWithoutGpuSaysSo) {
  RefreshCudaDriverProbe();
  std::vector<char> heap(4096);
  char stack[64];
  PointerInfo info;
  ASSERT_TRUE(ClassifyPointer(heap.data(), &info).ok());
  EXPECT_EQ(info.kind, MemoryKind::kHost);
  ASSERT_TRUE(ClassifyPointer(stack, &info).ok());
  EXPECT_EQ(info.kind, MemoryKind::kHost);
  ASSERT_TRUE(ClassifyPointer(nullptr, &info).ok());
  EXPECT_EQ(info.kind, MemoryKind::kHost);
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (devices == 0) {
    EXPECT_FALSE(why.empty());
    std::unique_ptr<DeviceCopier> copier;
    Status s = NewCudaCopier(0, &copier);
    EXPECT_TRUE(s.IsNotSupported()) << s.ToString();
    EXPECT_EQ(copier, nullptr);
    GTEST_SKIP() << "no usable CUDA device (" << why
                 << "): device paths are tested by test/gpu/run.sh on a GPU host";
  }
  std::unique_ptr<DeviceCopier> copier;
  EXPECT_TRUE(NewCudaCopier(0, &copier).ok());
}

// ---------------------------------------------------------------- the DB's GPU path

// Host buffers registered here are "device memory" to the DB; copies go through
// HostCopiers that inject the faults configured below.
class FakeGpu {
 public:
  FakeGpu() {
    hooks_.classify = [this](const void* p, PointerInfo* info) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [begin, end, device] : regions_) {
        if (p >= begin && p < end) {
          info->kind = MemoryKind::kDevice;
          info->device = device;
          return true;
        }
      }
      return false;
    };
    hooks_.new_copier = [this](int device, std::unique_ptr<DeviceCopier>* result) {
      if (!copiers_enabled_) return Status::NotSupported("fake GPU has no copier");
      HostCopier::Faults f;
      f.max_delay_us = max_delay_us_;
      f.fail_complete = [this](const void*, const void* src, size_t) {
        const char* p = static_cast<const char*>(src);
        return p >= fail_begin_.load() && p < fail_end_.load();
      };
      (void)device;
      auto copier = std::make_unique<HostCopier>(std::move(f));
      last_copier_ = copier.get();
      *result = std::move(copier);
      lanes_created_++;
      return Status::OK();
    };
    GpuIo::SetHooksForTesting(&hooks_);
  }
  ~FakeGpu() { GpuIo::SetHooksForTesting(nullptr); }

  // Marks s's bytes as memory of `device`.
  void Add(const std::string& s, int device = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.push_back({s.data(), s.data() + s.size(), device});
  }
  void FailCopiesFrom(const std::string& s) {
    fail_begin_ = s.data();
    fail_end_ = s.data() + s.size();
  }
  void StopFailingCopies() {
    fail_begin_ = nullptr;
    fail_end_ = nullptr;
  }
  void DisableCopiers() { copiers_enabled_ = false; }
  // Copies go to the real CUDA copier (refused without CUDA or without a GPU).
  void UseRealCopier() { hooks_.new_copier = nullptr; }
  int lanes_created() const { return lanes_created_; }
  // Copies created from now on each wait a random 0..us microseconds before they run.
  void SetMaxDelayUs(int us) { max_delay_us_ = us; }
  // The copier of the lane created last (owned by that lane).
  HostCopier* last_copier() const { return last_copier_; }

 private:
  struct Region {
    const char* begin;
    const char* end;
    int device;
  };
  GpuIo::Hooks hooks_;
  std::mutex mu_;
  std::vector<Region> regions_;
  std::atomic<const char*> fail_begin_{nullptr}, fail_end_{nullptr};
  bool copiers_enabled_ = true;
  int max_delay_us_ = 20;
  HostCopier* last_copier_ = nullptr;
  std::atomic<int> lanes_created_{0};
};

class GpuDbTest : public ::testing::Test {
 protected:
  void Open(uint64_t staging = 1 << 20, uint64_t chunk = 64 << 10, uint64_t memory = 64 << 20) {
    Options o;
    o.apply_environment = false;
    o.memory_capacity_bytes = memory;
    o.memory_slab_size = 1 << 20;
    o.prefault_memory = false;
    o.gpu_staging_bytes = staging;
    o.gpu_chunk_bytes = chunk;
    Status s = DB::Open(o, dir_.path(), &db_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::string GetHost(const std::string& key) {
    std::string v;
    Status s = db_->Get(ReadOptions(), key, &v);
    return s.ok() ? v : s.ToString();
  }
  FakeGpu gpu_;
  test::TempDir dir_;
  std::unique_ptr<DB> db_;
};

TEST_F(GpuDbTest, LayeredPutsFromDeviceAndGetsIntoDevice) {
  Open();
  constexpr int kLayers = 8;
  constexpr size_t kLayer = 48 << 10;  // value of 384 KiB in 8 device buffers
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> layers(3);
  std::vector<ValueParts> values(3);
  for (int k = 0; k < 3; k++) {
    keys.push_back("model@tp0/req" + std::to_string(k));
    for (int l = 0; l < kLayers; l++) {
      layers[k].push_back(MakeValue(k * 100 + l, kLayer));
      gpu_.Add(layers[k].back());
    }
    for (const auto& l : layers[k]) values[k].push_back(Slice(l));
  }
  std::vector<Slice> key_slices(keys.begin(), keys.end());
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), key_slices, values, &results).ok());
  ASSERT_EQ(results, std::vector<int64_t>(3, 0));
  EXPECT_EQ(gpu_.lanes_created(), 1);

  // Host readers see exactly the concatenated layers.
  for (int k = 0; k < 3; k++) {
    std::string expect;
    for (const auto& l : layers[k]) expect += l;
    EXPECT_EQ(GetHost(keys[k]), expect);
  }

  // Gets into per-layer device buffers (scatter), one of them a little larger.
  std::vector<std::vector<std::string>> outs(3);
  std::vector<Destination> dests(3);
  for (int k = 0; k < 3; k++) {
    for (int l = 0; l < kLayers; l++) {
      outs[k].emplace_back(kLayer + (l == kLayers - 1 ? 100 : 0), '\0');
      gpu_.Add(outs[k].back());
    }
    for (auto& o : outs[k]) dests[k].push_back(MutableSlice(o.data(), o.size()));
  }
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), key_slices, dests, &results).ok());
  for (int k = 0; k < 3; k++) {
    ASSERT_EQ(results[k], static_cast<int64_t>(kLayers * kLayer));
    for (int l = 0; l < kLayers; l++) {
      EXPECT_EQ(outs[k][l].substr(0, kLayer), layers[k][l]) << "key " << k << " layer " << l;
    }
  }
}

// A batch's device copies are queued back to back, not waited for key by key: with
// copies that take a while, several are in flight at once (never more than one when
// each key was waited for before the next was queued).  Puts are then published in
// order, gets answered once their copies are done.
TEST_F(GpuDbTest, BatchPutsFromDeviceAreQueuedBackToBack) {
  gpu_.SetMaxDelayUs(2000);
  Open();
  constexpr size_t kKeys = 8, kSize = 48 << 10;  // one chunk each
  std::vector<std::string> names, vals;
  for (size_t k = 0; k < kKeys; k++) {
    names.push_back("queued/" + std::to_string(k));
    vals.push_back(MakeValue(k, kSize));
  }
  for (const auto& v : vals) gpu_.Add(v);
  std::vector<Slice> keys(names.begin(), names.end());
  std::vector<ValueParts> values;
  for (const auto& v : vals) values.push_back({Slice(v)});
  std::vector<int64_t> results;
  SetPerfLevel(PerfLevel::kAll);
  const uint64_t d2h_before = PerfSnapshot(PerfKey::gpu_stage_d2h).count;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  EXPECT_EQ(results, std::vector<int64_t>(kKeys, 0));
  for (size_t k = 0; k < kKeys; k++) EXPECT_EQ(GetHost(names[k]), vals[k]);
  ASSERT_NE(gpu_.last_copier(), nullptr);
  EXPECT_GE(gpu_.last_copier()->counters().max_in_flight, 2u);
  EXPECT_EQ(PerfSnapshot(PerfKey::gpu_stage_d2h).count - d2h_before, kKeys);  // each timed
  SetPerfLevel(PerfLevel::kOff);
}

TEST_F(GpuDbTest, BatchGetsIntoDeviceAreQueuedBackToBack) {
  gpu_.SetMaxDelayUs(2000);
  Open();
  constexpr size_t kKeys = 8, kSize = 48 << 10;
  std::vector<std::string> names, vals, outs(kKeys, std::string(kSize, '\0'));
  for (size_t k = 0; k < kKeys; k++) {
    names.push_back("queued/" + std::to_string(k));
    vals.push_back(MakeValue(k, kSize));
    ASSERT_TRUE(db_->Put(WriteOptions(), names[k], vals[k]).ok());  // host memory: no lane
  }
  EXPECT_EQ(gpu_.lanes_created(), 0);
  std::vector<Slice> keys(names.begin(), names.end());
  keys.push_back("absent");
  std::string absent(kSize, '\0');
  outs.push_back(absent);
  std::vector<Destination> dests;
  for (auto& o : outs) {
    gpu_.Add(o);
    dests.push_back({MutableSlice(o.data(), o.size())});
  }
  std::vector<int64_t> results;
  SetPerfLevel(PerfLevel::kAll);
  const uint64_t h2d_before = PerfSnapshot(PerfKey::gpu_stage_h2d).count;
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), keys, dests, &results).ok());
  for (size_t k = 0; k < kKeys; k++) {
    EXPECT_EQ(results[k], static_cast<int64_t>(kSize));
    EXPECT_EQ(outs[k], vals[k]) << k;
  }
  EXPECT_EQ(results[kKeys], Status::NotFound("").ErrorCode());
  ASSERT_NE(gpu_.last_copier(), nullptr);
  EXPECT_GE(gpu_.last_copier()->counters().max_in_flight, 2u);
  EXPECT_EQ(PerfSnapshot(PerfKey::gpu_stage_h2d).count - h2d_before, kKeys);  // each timed
  SetPerfLevel(PerfLevel::kOff);
}

// A BatchPut of device values larger than the memory tier stores every key, as host
// puts would (older values evicted): rooms in flight cannot be evicted, so the batch
// keeps at most a quarter of the tier in flight, and publishes what it has in flight
// when a reservation finds no room.  Failed copies give their room back at once.
TEST_F(GpuDbTest, BatchPutLargerThanTheMemoryTierStoresEveryKey) {
  Open(/*staging=*/64 << 20, /*chunk=*/256 << 10, /*memory=*/16 << 20);
  constexpr size_t kFailing = 40, kGood = 8, kSize = 512 << 10;  // 20 MiB fail, 4 MiB don't
  const std::string failing = MakeValue(1, kFailing * kSize), good = MakeValue(2, kGood * kSize);
  gpu_.Add(failing);
  gpu_.Add(good);
  gpu_.FailCopiesFrom(failing);
  std::vector<std::string> names;
  std::vector<ValueParts> values;
  for (size_t k = 0; k < kFailing + kGood; k++) {
    names.push_back("big/" + std::to_string(k));
    const char* at =
        k < kFailing ? failing.data() + k * kSize : good.data() + (k - kFailing) * kSize;
    values.push_back({Slice(at, kSize)});
  }
  const std::vector<Slice> keys(names.begin(), names.end());
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  for (size_t k = 0; k < kFailing; k++) {
    EXPECT_EQ(results[k], Status::IOError("").ErrorCode()) << k;
  }
  for (size_t k = kFailing; k < keys.size(); k++) {
    EXPECT_EQ(results[k], 0) << k;
    EXPECT_EQ(GetHost(names[k]), good.substr((k - kFailing) * kSize, kSize)) << k;
  }
  gpu_.StopFailingCopies();
  // Now 48 values of 512 KiB (24 MiB) that all succeed, into the 16 MiB tier.
  std::vector<std::string> more;
  for (size_t k = 0; k < kFailing + kGood; k++) more.push_back(MakeValue(100 + k, kSize));
  for (const auto& v : more) gpu_.Add(v);
  values.clear();
  for (const auto& v : more) values.push_back({Slice(v)});
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  EXPECT_EQ(results, std::vector<int64_t>(keys.size(), 0));
  EXPECT_EQ(GetHost(names.back()), more.back());
}

TEST_F(GpuDbTest, SingleKeyCallsAndValuesLargerThanTheStagingMemory) {
  Open(/*staging=*/128 << 10, /*chunk=*/16 << 10);
  const std::string big = MakeValue(5, (1 << 20) + 333);  // > staging: through the ring
  gpu_.Add(big);
  ASSERT_TRUE(db_->Put(WriteOptions(), "big", big).ok());
  EXPECT_EQ(GetHost("big"), big);
  std::string dev(big.size(), '\0');
  gpu_.Add(dev);
  size_t size = 0;
  Status s = db_->GetInto(ReadOptions(), "big", MutableSlice(dev.data(), dev.size()), &size);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(size, big.size());
  EXPECT_EQ(dev, big);
  // Too small a device buffer: BufferTooSmall with the size needed, as on the host path.
  std::string small(1000, '\0');
  gpu_.Add(small);
  s = db_->GetInto(ReadOptions(), "big", MutableSlice(small.data(), small.size()), &size);
  EXPECT_TRUE(s.IsBufferTooSmall()) << s.ToString();
  EXPECT_EQ(size, big.size());
  // A miss into a device buffer is NotFound.
  s = db_->GetInto(ReadOptions(), "nope", MutableSlice(dev.data(), dev.size()), &size);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
}

TEST_F(GpuDbTest, MixedHostAndDeviceParts) {
  Open();
  const std::string a = MakeValue(1, 10000), b = MakeValue(2, 70000), c = MakeValue(3, 5);
  gpu_.Add(b);
  std::vector<Slice> keys = {Slice("mixed")};
  std::vector<ValueParts> values = {{Slice(a), Slice(b), Slice(c)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  ASSERT_EQ(results[0], 0);
  EXPECT_EQ(GetHost("mixed"), a + b + c);
  std::string h1(20000, '\0'), d1(65000, '\0');
  gpu_.Add(d1);
  std::vector<Destination> dests = {
      {MutableSlice(h1.data(), h1.size()), MutableSlice(d1.data(), d1.size())}};
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), keys, dests, &results).ok());
  ASSERT_EQ(results[0], static_cast<int64_t>(a.size() + b.size() + c.size()));
  EXPECT_EQ((h1 + d1).substr(0, results[0]), a + b + c);
}

TEST_F(GpuDbTest, AFailedCopyFailsItsKeyOnly) {
  Open();
  std::vector<std::string> vals = {MakeValue(1, 100000), MakeValue(2, 100000),
                                   MakeValue(3, 100000)};
  for (auto& v : vals) gpu_.Add(v);
  gpu_.FailCopiesFrom(vals[1]);
  std::vector<Slice> keys = {Slice("k0"), Slice("k1"), Slice("k2")};
  std::vector<ValueParts> values = {{Slice(vals[0])}, {Slice(vals[1])}, {Slice(vals[2])}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{0, Status::IOError("").ErrorCode(), 0}));
  EXPECT_EQ(GetHost("k0"), vals[0]);
  EXPECT_TRUE(GetHost("k1").find("NotFound") == 0) << GetHost("k1");  // nothing stored
  EXPECT_EQ(GetHost("k2"), vals[2]);
}

TEST_F(GpuDbTest, DeviceBuffersWithoutAUsableGpuAreRefused) {
  gpu_.DisableCopiers();
  Open();
  const std::string dev = MakeValue(1, 4096);
  gpu_.Add(dev);
  Status s = db_->Put(WriteOptions(), "k", dev);
  EXPECT_TRUE(s.IsNotSupported()) << s.ToString();
  EXPECT_NE(s.message().find("'k'"), std::string::npos) << s.ToString();
  EXPECT_TRUE(GetHost("k").find("NotFound") == 0);
  // The host path is untouched.
  ASSERT_TRUE(db_->Put(WriteOptions(), "k", "host value").ok());
  std::string out(4096, '\0');
  gpu_.Add(out);
  size_t size = 0;
  s = db_->GetInto(ReadOptions(), "k", MutableSlice(out.data(), out.size()), &size);
  EXPECT_TRUE(s.IsNotSupported()) << s.ToString();
  EXPECT_EQ(GetHost("k"), "host value");
}

TEST_F(GpuDbTest, DeviceBuffersAreRefusedWithoutCudaOrGpuNeverDereferenced) {
  if (CudaDeviceCount(nullptr) > 0) GTEST_SKIP() << "this machine has a GPU";
  gpu_.UseRealCopier();
  Open();
  // A "device" pointer that would crash if dereferenced.
  const char* bogus = reinterpret_cast<const char*>(uintptr_t{1} << 47);
  std::vector<Slice> keys = {Slice("dev"), Slice("host")};
  std::vector<ValueParts> values = {{Slice(bogus, 4096)}, {Slice("host bytes")}};
  GpuIo::Hooks hooks;
  hooks.classify = [bogus](const void* p, PointerInfo* info) {
    if (p != bogus) return false;
    info->kind = MemoryKind::kDevice;
    info->device = 0;
    return true;
  };
  GpuIo::SetHooksForTesting(&hooks);
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  EXPECT_EQ(results, (std::vector<int64_t>{Status::NotSupported("").ErrorCode(), 0}));
  uint64_t size = 0;
  EXPECT_TRUE(db_->GetValueSize("dev", &size).IsNotFound());
  EXPECT_EQ(GetHost("host"), "host bytes");
  size_t got = 0;
  Status s =
      db_->GetInto(ReadOptions(), "host", MutableSlice(const_cast<char*>(bogus), 4096), &got);
  EXPECT_TRUE(s.IsNotSupported()) << s.ToString();
  EXPECT_NE(s.message().find(GpuSupportBuilt() ? "not available" : "KV_WITH_CUDA"),
            std::string::npos)
      << s.ToString();
  GpuIo::SetHooksForTesting(nullptr);
}

TEST_F(GpuDbTest, OneKeysBuffersOnTwoDevicesAreRefused) {
  Open();
  const std::string a = MakeValue(1, 100), b = MakeValue(2, 100);
  gpu_.Add(a, 0);
  gpu_.Add(b, 1);
  std::vector<Slice> keys = {Slice("two")};
  std::vector<ValueParts> values = {{Slice(a), Slice(b)}};
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), keys, values, &results).ok());
  EXPECT_EQ(results[0], Status::InvalidArgument("").ErrorCode());
}

TEST_F(GpuDbTest, ConcurrentPutsAndGetsThroughOneLane) {
  Open(/*staging=*/256 << 10, /*chunk=*/32 << 10);
  constexpr int kThreads = 4, kOps = 40;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < kOps; i++) {
        const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i % 5);
        const std::string v = MakeValue(t * 1000 + i, 1 + rng() % (300 << 10));
        std::string out(v.size(), '\0');
        gpu_.Add(v);
        gpu_.Add(out);
        if (!db_->Put(WriteOptions(), key, v).ok()) bad++;
        size_t size = 0;
        Status s = db_->GetInto(ReadOptions(), key, MutableSlice(out.data(), out.size()), &size);
        if (!s.ok() || size != v.size() || out != v) bad++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(gpu_.lanes_created(), 1);
}

TEST(GpuOptions, ParsedAndValidated) {
  Options o;
  EXPECT_TRUE(o.Set("gpu_staging_bytes", "32MiB").ok());
  EXPECT_TRUE(o.Set("gpu_chunk_bytes", "4MiB").ok());
  EXPECT_TRUE(o.Set("gpu_streams", "4").ok());
  EXPECT_EQ(o.gpu_staging_bytes, 32ull << 20);
  EXPECT_EQ(o.gpu_chunk_bytes, 4ull << 20);
  EXPECT_EQ(o.gpu_streams, 4u);
  EXPECT_TRUE(o.Validate().ok());
  o.gpu_chunk_bytes = 20 << 20;  // more than half the staging memory
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
  o.gpu_chunk_bytes = 1 << 20;
  o.gpu_streams = 0;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
  EXPECT_NE(o.ToString().find("gpu_streams=0"), std::string::npos);
}

}  // namespace
}  // namespace kvengine
