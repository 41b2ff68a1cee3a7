// The cuda device: one GPU through the CUDA runtime API (never the driver API, so binaries
// start on machines without a driver).
#include <cuda_runtime_api.h>

#include <algorithm>

#include "runtime/core/cuda/checks.hpp"
#include "runtime/core/cuda/stream.hpp"
#include "runtime/core/device.hpp"
#include "runtime/core/log.hpp"

namespace zero {

int cuda_device_count_impl() noexcept {
  // Without a driver cudaGetDeviceCount fails and leaves n untouched: any error means no GPU.
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls do not see it
    return 0;
  }
  return n;
}

namespace {

struct GpuFacts {
  std::string name;
  size_t total_memory = 0;
  int major = 0;
};

GpuFacts query(int index) {
  const int n = cuda_device_count_impl();
  ZERO_REQUIRE(index >= 0 && index < n,
               "cuda device " + std::to_string(index) + " requested, but " + std::to_string(n) +
                   " GPU(s) are visible\nHINT: check nvidia-smi and CUDA_VISIBLE_DEVICES, or "
                   "use device 'cpu'");
  GpuFacts f;
  cudaDeviceProp prop{};
  ZERO_CHECK_CUDA(cudaGetDeviceProperties(&prop, index));
  f.name = prop.name;
  f.total_memory = prop.totalGlobalMem;
  f.major = prop.major;
  return f;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const DeviceOptions& o, const GpuFacts& f)
      : Device(DeviceKind::cuda, index, "cuda:" + std::to_string(index) + " (" + f.name + ")",
               o.memory_limit ? std::min(o.memory_limit, f.total_memory) : f.total_memory,
               o.host_memory_limit ? o.host_memory_limit : kUnlimited),
        major_(f.major) {
    ZERO_CHECK_CUDA(cudaSetDevice(index));
  }

  std::unique_ptr<Stream> create_stream(std::string name) override {
    return cuda::make_stream(index(), std::move(name));
  }
  std::unique_ptr<Event> create_event() override { return cuda::make_event(index()); }

  void copy_async(void* dst, const void* src, size_t bytes, Stream& stream) override {
    if (bytes == 0) return;
    ZERO_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::native(stream)));
  }
  void fill_async(void* dst, unsigned char value, size_t bytes, Stream& stream) override {
    if (bytes == 0) return;
    ZERO_CHECK_CUDA(cudaMemsetAsync(dst, value, bytes, cuda::native(stream)));
  }
  bool supports_bf16() const noexcept override { return major_ >= 8; }

 protected:
  void* raw_allocate(size_t bytes) override {
    ZERO_CHECK_CUDA(cudaSetDevice(index()));
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it and report through the ledger
      return nullptr;
    }
    ZERO_CHECK_CUDA(rc);
    return p;
  }
  void raw_free(void* p) noexcept override {
    if (cudaFree(p) != cudaSuccess) log::error("cudaFree failed on " + name());
  }
  void* raw_allocate_host(size_t bytes, bool pinned) override {
    if (!pinned) return Device::raw_allocate_host(bytes, false);
    void* p = nullptr;
    cudaError_t rc = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void raw_free_host(void* p, bool pinned) noexcept override {
    if (!pinned) return Device::raw_free_host(p, false);
    if (cudaFreeHost(p) != cudaSuccess) log::error("cudaFreeHost failed on " + name());
  }

 private:
  int major_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int index, const DeviceOptions& options) {
  return std::make_unique<CudaDevice>(index, options, query(index));
}

}  // namespace zero
