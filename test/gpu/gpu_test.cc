// GPU staging on a real GPU: puts from cudaMalloc buffers, gets into them, bytes compared
// after copying back, multi-buffer values, concurrent callers and streams.  Every test
// skips (with the reason) on a machine without a usable GPU, unless KV_GPU_REQUIRED=1.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "env/gpu_staging.h"
#include "gtest/gtest.h"
#include "kvengine/db.h"
#include "test/test_util.h"

namespace kvengine {
namespace {

using test::MakeValue;

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t err_ = (call);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// A cudaMalloc'ed buffer, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t size) : size_(size) {
    if (cudaMalloc(&ptr_, size) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr; }
  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return size_; }
  bool ok() const { return ptr_ != nullptr; }
  void Upload(const std::string& bytes) const {
    ASSERT_EQ(cudaMemcpy(ptr_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::string Download(size_t n) const {
    std::string out(n, '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  void Clear() const { EXPECT_EQ(cudaMemset(ptr_, 0, size_), cudaSuccess); }

 private:
  void* ptr_ = nullptr;
  size_t size_;
};

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) {
      const char* required = std::getenv("KV_GPU_REQUIRED");
      if (required != nullptr && std::string(required) == "1") {
        FAIL() << "KV_GPU_REQUIRED=1 but no usable GPU: " << why;
      }
      GTEST_SKIP() << "no usable CUDA device (" << why << "); run test/gpu/run.sh on a GPU host";
    }
    Options o;
    o.apply_environment = false;
    o.memory_capacity_bytes = 512 << 20;
    o.gpu_staging_bytes = 16 << 20;
    o.gpu_chunk_bytes = 1 << 20;
    o.gpu_streams = 2;
    Status s = DB::Open(o, dir_.path(), &db_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::string GetHost(const std::string& key) {
    std::string v;
    Status s = db_->Get(ReadOptions(), key, &v);
    return s.ok() ? v : s.ToString();
  }
  test::TempDir dir_;
  std::unique_ptr<DB> db_;
};

TEST_F(GpuTest, DetectsDevicePinnedManagedAndHostMemory) {
  DeviceBuffer dev(4096);
  ASSERT_TRUE(dev.ok());
  void* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, 4096));
  void* managed = nullptr;
  CUDA_OK(cudaMallocManaged(&managed, 4096));
  std::vector<char> heap(4096);
  RefreshCudaDriverProbe();
  PointerInfo info;
  ASSERT_TRUE(ClassifyPointer(dev.data(), &info).ok());
  EXPECT_EQ(info.kind, MemoryKind::kDevice);
  EXPECT_GE(info.device, 0);
  ASSERT_TRUE(ClassifyPointer(dev.data() + 100, &info).ok());  // inside an allocation
  EXPECT_EQ(info.kind, MemoryKind::kDevice);
  ASSERT_TRUE(ClassifyPointer(pinned, &info).ok());
  EXPECT_EQ(info.kind, MemoryKind::kPinnedHost);
  ASSERT_TRUE(ClassifyPointer(managed, &info).ok());
  EXPECT_EQ(info.kind, MemoryKind::kHost);
  ASSERT_TRUE(ClassifyPointer(heap.data(), &info).ok());
  EXPECT_EQ(info.kind, MemoryKind::kHost);
  cudaFreeHost(pinned);
  cudaFree(managed);
}

TEST_F(GpuTest, PutFromCudaMallocAndGetIntoIt) {
  for (size_t size : {size_t{1}, size_t{4096}, size_t{1} << 20, (size_t{4} << 20) + 77,
                      size_t{20} << 20 /* larger than the staging memory */}) {
    const std::string value = MakeValue(size, size);
    DeviceBuffer src(size), dst(size);
    ASSERT_TRUE(src.ok() && dst.ok());
    src.Upload(value);
    const std::string key = "v" + std::to_string(size);
    Status s = db_->Put(WriteOptions(), key, Slice(src.data(), size));
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(GetHost(key), value) << size;
    dst.Clear();
    size_t got = 0;
    s = db_->GetInto(ReadOptions(), key, MutableSlice(dst.data(), size), &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(got, size);
    EXPECT_EQ(dst.Download(size), value) << size;
  }
}

TEST_F(GpuTest, MultiBufferValuesBothWays) {
  constexpr int kKeys = 4, kLayers = 32;
  constexpr size_t kLayer = 64 << 10;
  std::vector<std::string> keys;
  std::vector<std::vector<DeviceBuffer>> src(kKeys), dst(kKeys);
  std::vector<std::string> expect(kKeys);
  std::vector<ValueParts> values(kKeys);
  std::vector<Destination> dests(kKeys);
  for (int k = 0; k < kKeys; k++) {
    keys.push_back("llama@tp0/chunk" + std::to_string(k));
    for (int l = 0; l < kLayers; l++) {
      const std::string layer = MakeValue(k * 1000 + l, kLayer);
      expect[k] += layer;
      src[k].emplace_back(kLayer);
      ASSERT_TRUE(src[k].back().ok());
      src[k].back().Upload(layer);
      dst[k].emplace_back(kLayer);
      ASSERT_TRUE(dst[k].back().ok());
      dst[k].back().Clear();
    }
    for (auto& b : src[k]) values[k].push_back(Slice(b.data(), b.size()));
    for (auto& b : dst[k]) dests[k].push_back(MutableSlice(b.data(), b.size()));
  }
  std::vector<Slice> key_slices(keys.begin(), keys.end());
  std::vector<int64_t> results;
  ASSERT_TRUE(db_->BatchPut(WriteOptions(), key_slices, values, &results).ok());
  ASSERT_EQ(results, std::vector<int64_t>(kKeys, 0));
  for (int k = 0; k < kKeys; k++) EXPECT_EQ(GetHost(keys[k]), expect[k]);
  ASSERT_TRUE(db_->BatchGetInto(ReadOptions(), key_slices, dests, &results).ok());
  for (int k = 0; k < kKeys; k++) {
    ASSERT_EQ(results[k], static_cast<int64_t>(kLayers * kLayer));
    std::string got;
    for (auto& b : dst[k]) got += b.Download(kLayer);
    EXPECT_EQ(got, expect[k]) << keys[k];
  }
}

TEST_F(GpuTest, ConcurrentCallersShareTheStreams) {
  constexpr int kThreads = 4, kOps = 20;
  constexpr size_t kSize = (2 << 20) + 4096;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      DeviceBuffer src(kSize), dst(kSize);
      if (!src.ok() || !dst.ok()) {
        bad++;
        return;
      }
      for (int i = 0; i < kOps; i++) {
        const std::string value = MakeValue(t * 100 + i, kSize);
        if (cudaMemcpy(src.data(), value.data(), kSize, cudaMemcpyHostToDevice) != cudaSuccess) {
          bad++;
          continue;
        }
        const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i % 3);
        if (!db_->Put(WriteOptions(), key, Slice(src.data(), kSize)).ok()) bad++;
        size_t got = 0;
        if (!db_->GetInto(ReadOptions(), key, MutableSlice(dst.data(), kSize), &got).ok() ||
            got != kSize) {
          bad++;
        }
        std::string back(kSize, '\0');
        cudaMemcpy(back.data(), dst.data(), kSize, cudaMemcpyDeviceToHost);
        if (back != value) bad++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// An attached client (DB::Attach) with device buffers: D2H straight into the slots it
// reserved in the owner's shared arena, H2D straight out of its pinned values, once the
// client has page-locked its mapping of the arena (checked in its log).  The owner is a
// second DB in this process serving a Unix socket; the client maps the arena's memfd
// itself, as another process would.
TEST_F(GpuTest, AttachedClientPutsAndGetsDeviceBuffers) {
  test::TempDir owner_dir;
  Options owner_options;
  owner_options.apply_environment = false;
  owner_options.memory_capacity_bytes = 256 << 20;
  owner_options.ssd_capacity_bytes = 0;
  owner_options.local_listen = owner_dir.path() + "/attach.sock";
  std::unique_ptr<DB> owner;
  Status s = DB::Open(owner_options, owner_dir.path(), &owner);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::mutex log_mu;
  std::string client_log;
  Options client_options;
  client_options.apply_environment = false;
  client_options.log_level = LogLevel::kInfo;
  client_options.log_callback = [&](LogLevel, const std::string& line) {
    std::lock_guard<std::mutex> lock(log_mu);
    client_log += line + "\n";
  };
  std::unique_ptr<DB> client;
  s = DB::Attach(client_options, owner_options.local_listen, &client);
  ASSERT_TRUE(s.ok()) << s.ToString();

  // Whole values of 1 MiB and 4 MiB + 77, and a 32-layer value with a host part.
  constexpr int kLayers = 32;
  constexpr size_t kLayer = 64 << 10;
  const std::vector<size_t> sizes{size_t{1} << 20, (size_t{4} << 20) + 77};
  std::vector<std::string> keys{"whole/1", "whole/2", "layers"};
  std::vector<std::string> expect;
  std::vector<DeviceBuffer> src, dst;
  std::vector<ValueParts> values(3);
  std::vector<Destination> dests(3);
  for (size_t k = 0; k < sizes.size(); k++) {
    expect.push_back(MakeValue(k + 11, sizes[k]));
    src.emplace_back(sizes[k]);
    dst.emplace_back(sizes[k]);
  }
  const std::string host_part = MakeValue(99, 4096);
  expect.emplace_back();
  for (int l = 0; l < kLayers; l++) {
    expect.back() += MakeValue(1000 + l, kLayer);
    src.emplace_back(kLayer);
    dst.emplace_back(kLayer);
  }
  expect.back() += host_part;
  for (auto& b : src) ASSERT_TRUE(b.ok());
  for (auto& b : dst) ASSERT_TRUE(b.ok());
  for (size_t k = 0; k < sizes.size(); k++) {
    src[k].Upload(expect[k]);
    values[k] = {Slice(src[k].data(), sizes[k])};
    dests[k] = {MutableSlice(dst[k].data(), sizes[k])};
  }
  for (int l = 0; l < kLayers; l++) {
    DeviceBuffer& layer_src = src[sizes.size() + l];
    layer_src.Upload(expect.back().substr(l * kLayer, kLayer));
    values[2].push_back(Slice(layer_src.data(), kLayer));
    dests[2].push_back(MutableSlice(dst[sizes.size() + l].data(), kLayer));
  }
  values[2].push_back(Slice(host_part));
  std::string host_tail(host_part.size(), '\0');
  dests[2].push_back(MutableSlice(host_tail.data(), host_tail.size()));

  std::vector<Slice> key_slices(keys.begin(), keys.end());
  std::vector<int64_t> results;
  s = client->BatchPut(WriteOptions(), key_slices, values, &results);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(results, std::vector<int64_t>(3, 0));
  for (size_t k = 0; k < keys.size(); k++) {  // the owner serves the bytes the GPU held
    std::string v;
    ASSERT_TRUE(owner->Get(ReadOptions(), keys[k], &v).ok()) << keys[k];
    EXPECT_TRUE(v == expect[k]) << keys[k];
  }
  for (auto& b : dst) b.Clear();
  s = client->BatchGetInto(ReadOptions(), key_slices, dests, &results);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t k = 0; k < keys.size(); k++) {
    ASSERT_EQ(results[k], static_cast<int64_t>(expect[k].size())) << keys[k];
  }
  for (size_t k = 0; k < sizes.size(); k++) {
    EXPECT_TRUE(dst[k].Download(sizes[k]) == expect[k]) << keys[k];
  }
  std::string layers;
  for (int l = 0; l < kLayers; l++) layers += dst[sizes.size() + l].Download(kLayer);
  EXPECT_TRUE(layers + host_tail == expect.back());
  {
    std::lock_guard<std::mutex> lock(log_mu);
    EXPECT_NE(client_log.find("page-locked for direct DMA"), std::string::npos) << client_log;
  }
  client.reset();
  ASSERT_TRUE(owner->Close().ok());
}

TEST_F(GpuTest, PipelineOnCudaStreamsStagedAndDirect) {
  std::unique_ptr<DeviceCopier> copier;
  ASSERT_TRUE(NewCudaCopier(0, &copier).ok());
  std::unique_ptr<StagingPipeline> pipeline;
  StagingOptions o;
  o.chunk_bytes = 256 << 10;
  o.staging_bytes = 1 << 20;
  o.streams = 4;
  ASSERT_TRUE(StagingPipeline::Create(std::move(copier), o, &pipeline).ok());
  constexpr size_t kSize = (3 << 20) + 1000;
  const std::string value = MakeValue(77, kSize);
  DeviceBuffer dev(kSize);
  ASSERT_TRUE(dev.ok());
  // Pageable host -> device through the ring, then device -> pageable host.
  Transfer up;
  up.src.push_back({value.data(), value.size(), MemoryKind::kHost});
  up.dst.push_back({dev.data(), kSize, MemoryKind::kDevice});
  ASSERT_TRUE(pipeline->Run(&up).ok()) << up.status.ToString();
  std::string back(kSize, '\0');
  Transfer down;
  down.src.push_back({dev.data(), kSize, MemoryKind::kDevice});
  down.dst.push_back({back.data(), kSize, MemoryKind::kHost});
  ASSERT_TRUE(pipeline->Run(&down).ok()) << down.status.ToString();
  EXPECT_EQ(back, value);
  EXPECT_GT(pipeline->counters().staged_chunks, 0u);
  // Page-locked host memory goes direct.
  void* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, kSize));
  Transfer direct;
  direct.src.push_back({dev.data(), kSize, MemoryKind::kDevice});
  direct.dst.push_back({static_cast<char*>(pinned), kSize, MemoryKind::kPinnedHost});
  ASSERT_TRUE(pipeline->Run(&direct).ok());
  EXPECT_EQ(std::string(static_cast<char*>(pinned), kSize), value);
  EXPECT_GT(pipeline->counters().direct_chunks, 0u);
  cudaFreeHost(pinned);
}

}  // namespace
}  // namespace kvengine
