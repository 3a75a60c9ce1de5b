// The CUDA side of GPU staging: CudaCopier and pointer detection.  The only file of the
// engine that includes CUDA headers; without KV_WITH_CUDA it builds the fallbacks, which
// still recognize device memory (through a CUDA driver the process already loaded) so
// that it is refused instead of dereferenced.
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "env/gpu_staging.h"

#ifdef KV_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvengine {

namespace {

// ---------------------------------------------------------------- the driver probe
// cuPointerGetAttribute from a libcuda.so.1 that the process has already loaded.  Until
// something loads the driver no device memory can exist, so asking nothing is right.
using CuPointerGetAttributeFn = int (*)(void* data, int attribute, unsigned long long ptr);

std::atomic<CuPointerGetAttributeFn> g_cu_pointer_get_attribute{nullptr};

bool DriverLoaded() { return g_cu_pointer_get_attribute.load(std::memory_order_acquire); }

[[maybe_unused]] std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

#ifdef KV_WITH_CUDA
Status CudaError(const std::string& call, cudaError_t err) {
  cudaGetLastError();  // do not leave our failure for the caller's next cudaGetLastError
  return Status::IOError(call, std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err));
}

// Makes `device` current for the scope and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0 && status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

class CudaCopier final : public DeviceCopier {
 public:
  explicit CudaCopier(int device) : device_(device) {}
  ~CudaCopier() override {
    DeviceScope scope(device_);
    for (cudaStream_t s : streams_) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaGetLastError();
  }

  std::string Name() const override { return "cuda:" + std::to_string(device_); }

  Status Init(int streams, int events) override {
    DeviceScope scope(device_);
    if (scope.status() != cudaSuccess) {
      return CudaError("cudaSetDevice(" + std::to_string(device_) + ")", scope.status());
    }
    for (int i = 0; i < streams; i++) {
      cudaStream_t s;
      cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (err != cudaSuccess) return CudaError("cudaStreamCreateWithFlags", err);
      streams_.push_back(s);
    }
    for (int i = 0; i < events; i++) {
      cudaEvent_t e;
      cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (err != cudaSuccess) return CudaError("cudaEventCreateWithFlags", err);
      events_.push_back(e);
    }
    return Status::OK();
  }

  Status AllocatePinned(size_t bytes, void** ptr) override {
    DeviceScope scope(device_);
    *ptr = nullptr;
    cudaError_t err = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      *ptr = nullptr;
      return CudaError("cudaHostAlloc(" + std::to_string(bytes) + " bytes)", err);
    }
    return Status::OK();
  }

  void FreePinned(void* ptr) override {
    if (ptr == nullptr) return;
    if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
  }

  Status RegisterHost(void* addr, size_t bytes) override {
    DeviceScope scope(device_);
    cudaError_t err = cudaHostRegister(addr, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      return CudaError("cudaHostRegister(" + Hex(addr) + ", " + std::to_string(bytes) + " bytes)",
                       err);
    }
    return Status::OK();
  }

  void UnregisterHost(void* addr) override {
    if (cudaHostUnregister(addr) != cudaSuccess) cudaGetLastError();
  }

  Status CopyAsync(void* dst, const void* src, size_t n, int stream) override {
    DeviceScope scope(device_);
    // cudaMemcpyDefault: with unified addressing the runtime knows each side's kind.
    cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, streams_.at(stream));
    if (err != cudaSuccess) {
      return CudaError("cudaMemcpyAsync(dst=" + Hex(dst) + ", src=" + Hex(src) + ", " +
                           std::to_string(n) + " bytes, stream " + std::to_string(stream) + ")",
                       err);
    }
    return Status::OK();
  }

  Status RecordEvent(int event, int stream) override {
    cudaError_t err = cudaEventRecord(events_.at(event), streams_.at(stream));
    if (err != cudaSuccess) return CudaError("cudaEventRecord", err);
    return Status::OK();
  }

  Status WaitEvent(int event) override {
    cudaError_t err = cudaEventSynchronize(events_.at(event));
    if (err != cudaSuccess) return CudaError("cudaEventSynchronize", err);
    return Status::OK();
  }

  Status Synchronize() override {
    for (cudaStream_t s : streams_) {
      cudaError_t err = cudaStreamSynchronize(s);
      if (err != cudaSuccess) return CudaError("cudaStreamSynchronize", err);
    }
    return Status::OK();
  }

 private:
  const int device_;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
};
#endif  // KV_WITH_CUDA

}  // namespace

Status NewCudaCopier(int device, std::unique_ptr<DeviceCopier>* result) {
  result->reset();
#ifdef KV_WITH_CUDA
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (device < 0 || device >= count) {
    return Status::NotSupported("CUDA device " + std::to_string(device) + " is not available",
                                count == 0 ? why : std::to_string(count) + " device(s)");
  }
  *result = std::make_unique<CudaCopier>(device);
  return Status::OK();
#else
  (void)device;
  return Status::NotSupported("GPU staging: kvengine was built without CUDA (KV_WITH_CUDA)");
#endif
}

bool GpuSupportBuilt() {
#ifdef KV_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount(std::string* why) {
#ifdef KV_WITH_CUDA
  static std::once_flag once;
  static int count = 0;
  static std::string reason;
  std::call_once(once, [] {
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      count = 0;
      reason = CudaError("cudaGetDeviceCount", err).ToString();
    } else if (count == 0) {
      reason = "cudaGetDeviceCount: no CUDA device";
    }
  });
  if (why != nullptr) *why = reason;
  return count;
#else
  if (why != nullptr) *why = "kvengine was built without CUDA (KV_WITH_CUDA)";
  return 0;
#endif
}

namespace {
// A walk of the loaded objects looking for the CUDA driver.  The loader counts the
// objects it has loaded (dlpi_adds, given with each object): while the count is what it
// was at the last walk that found no driver, none can have come, and the walk stops at
// the first object.  Looking at every object's name took 0.7 us of each single-key get
// in kv_bench.
struct DriverWalk {
  unsigned long long adds_without_driver;  // in: from the last walk that found none
  unsigned long long adds = 0;             // out: the count this walk saw
  bool counted = false;                    // adds is set
  bool skipped = false;                    // stopped at the first object: nothing new
};

int FindDriver(struct dl_phdr_info* info, size_t size, void* arg) {
  DriverWalk* walk = static_cast<DriverWalk*>(arg);
  if (!walk->counted && size >= offsetof(dl_phdr_info, dlpi_subs)) {  // dlpi_adds is there
    walk->counted = true;
    walk->adds = info->dlpi_adds;
    if (walk->adds == walk->adds_without_driver) {
      walk->skipped = true;
      return 1;
    }
  }
  return info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libcuda.so") != nullptr;
}

// Whether the process has mapped the CUDA driver.  Walks the loaded objects instead of
// asking dlopen(RTLD_NOLOAD), which searches the library path on disk and took ~130 us
// per call: once per batch, it tripled the cost of small batches.
bool CudaDriverMapped() {
  static std::atomic<unsigned long long> adds_without_driver{0};  // 0: no walk yet
  DriverWalk walk{adds_without_driver.load(std::memory_order_relaxed)};
  const bool found = dl_iterate_phdr(FindDriver, &walk) != 0 && !walk.skipped;
  if (!found && !walk.skipped && walk.counted) {
    adds_without_driver.store(walk.adds, std::memory_order_relaxed);
  }
  return found;
}
}  // namespace

void RefreshCudaDriverProbe() {
  if (DriverLoaded()) return;  // once loaded, a driver is never unloaded
  if (!CudaDriverMapped()) return;
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return;
  auto fn = reinterpret_cast<CuPointerGetAttributeFn>(dlsym(lib, "cuPointerGetAttribute"));
  // The handle is kept: the reference it holds is what keeps fn valid.
  if (fn != nullptr) g_cu_pointer_get_attribute.store(fn, std::memory_order_release);
}

Status ClassifyPointer(const void* ptr, PointerInfo* info) {
  *info = PointerInfo();
  if (ptr == nullptr || !DriverLoaded()) return Status::OK();
#ifdef KV_WITH_CUDA
  if (CudaDeviceCount(nullptr) == 0) return Status::OK();
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err == cudaErrorInvalidValue) {  // memory CUDA has never seen (before CUDA 11)
    cudaGetLastError();
    return Status::OK();
  }
  if (err != cudaSuccess) return CudaError("cudaPointerGetAttributes(" + Hex(ptr) + ")", err);
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      info->kind = MemoryKind::kDevice;
      info->device = attr.device;
      break;
    case cudaMemoryTypeHost:
      info->kind = MemoryKind::kPinnedHost;
      break;
    default:  // unregistered host memory, or managed memory (the host may touch it)
      break;
  }
  return Status::OK();
#else
  // No runtime built in; ask the driver the process loaded, only to refuse device memory.
  constexpr int kCuPointerAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  constexpr int kCuPointerAttributeIsManaged = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
  constexpr int kCuPointerAttributeDeviceOrdinal = 9;
  constexpr unsigned kCuMemoryTypeDevice = 2;  // CU_MEMORYTYPE_DEVICE
  CuPointerGetAttributeFn fn = g_cu_pointer_get_attribute.load(std::memory_order_acquire);
  unsigned int type = 0;
  if (fn(&type, kCuPointerAttributeMemoryType, reinterpret_cast<unsigned long long>(ptr)) != 0) {
    return Status::OK();  // unknown to CUDA (or CUDA not initialized): host memory
  }
  if (type != kCuMemoryTypeDevice) return Status::OK();
  unsigned int managed = 0;
  if (fn(&managed, kCuPointerAttributeIsManaged, reinterpret_cast<unsigned long long>(ptr)) == 0 &&
      managed != 0) {
    return Status::OK();
  }
  int ordinal = -1;
  fn(&ordinal, kCuPointerAttributeDeviceOrdinal, reinterpret_cast<unsigned long long>(ptr));
  info->kind = MemoryKind::kDevice;
  info->device = ordinal;
  return Status::OK();
#endif
}

}  // namespace kvengine
