// The cuda device: one GPU through the CUDA runtime API (never the driver API, so binaries
// start on machines without a driver).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda/checks.hpp"
#include "core/cuda/stream.hpp"
#include "core/device.hpp"
#include "core/log.hpp"

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
  size_t free_memory = 0;  // once this process's CUDA context exists
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
  f.major = prop.major;
  // The capacity is what is free once the context exists, not prop.totalGlobalMem: the context
  // itself (hundreds of MiB), other processes on the GPU and memory this process already holds
  // are not ours to hand out. cudaFree(nullptr) creates the primary context if nothing has.
  int previous = 0;
  ZERO_CHECK_CUDA(cudaGetDevice(&previous));
  ZERO_CHECK_CUDA(cudaSetDevice(index));
  ZERO_CHECK_CUDA(cudaFree(nullptr));
  size_t total = 0;
  ZERO_CHECK_CUDA(cudaMemGetInfo(&f.free_memory, &total));
  if (previous != index) ZERO_CHECK_CUDA(cudaSetDevice(previous));
  return f;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const DeviceOptions& o, const GpuFacts& f)
      : Device(DeviceKind::cuda, index, "cuda:" + std::to_string(index) + " (" + f.name + ")",
               o.memory_limit ? std::min(o.memory_limit, f.free_memory) : f.free_memory,
               o.host_memory_limit ? o.host_memory_limit : kUnlimited),
        major_(f.major),
        limit_(o.memory_limit ? o.memory_limit : kUnlimited),
        free_at_open_(f.free_memory) {
    ZERO_CHECK_CUDA(cudaSetDevice(index));
    // The stream-ordered pool keeps freed memory for reuse instead of returning it to the driver
    // at every synchronisation (the default release threshold is 0).
    cudaMemPool_t pool;
    ZERO_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, index));
    uint64_t keep = UINT64_MAX;
    ZERO_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    pool_ = pool;
  }

  void set_allocation_stream(Stream* stream) override {
    ZERO_REQUIRE(!stream || stream->kind() == DeviceKind::cuda,
                 "set_allocation_stream on " + name() + ": needs a cuda stream");
    std::lock_guard<std::mutex> lock(mutex_);
    alloc_stream_ = stream ? cuda::native(*stream) : nullptr;
    ordered_ = stream != nullptr;
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

  void take_outside_ledger(size_t bytes, std::string_view what) override {
    std::lock_guard<std::mutex> lock(mutex_);
    outside_ += bytes;
    auto it = std::find_if(outside_by_.begin(), outside_by_.end(),
                           [&](const auto& e) { return e.first == what; });
    if (it == outside_by_.end()) it = outside_by_.insert(outside_by_.end(), {std::string(what), 0});
    it->second += bytes;
    const size_t left = free_at_open_ > outside_ ? free_at_open_ - outside_ : 0;
    ledger().set_capacity(MemSpace::device, std::min(limit_, left));
  }

  std::string outside_ledger_report() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (outside_by_.empty()) return {};
    std::string r = "device memory outside the ledger (taken after " + format_bytes(free_at_open_) +
                    " were free at opening):";
    for (const auto& [what, bytes] : outside_by_) r += " " + what + " " + format_bytes(bytes) + ";";
    r.back() = '.';
    return r;
  }

 protected:
  void* raw_allocate(size_t bytes) override {
    ZERO_CHECK_CUDA(cudaSetDevice(index()));
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    if (!ordered_) {
      cudaError_t rc = cudaMalloc(&p, bytes);
      if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // not sticky: clear it and report through the ledger
        return nullptr;
      }
      ZERO_CHECK_CUDA(rc);
      return p;
    }
    cudaError_t rc = cudaMallocAsync(&p, bytes, alloc_stream_);
    if (rc == cudaErrorMemoryAllocation) {
      // The pool may hold freed blocks of other sizes: let the stream pass its pending frees,
      // give the pool's unused memory back and try once more.
      (void)cudaGetLastError();
      ZERO_CHECK_CUDA(cudaStreamSynchronize(alloc_stream_));
      ZERO_CHECK_CUDA(cudaMemPoolTrimTo(pool_, 0));
      rc = cudaMallocAsync(&p, bytes, alloc_stream_);
      if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return nullptr;
      }
    }
    ZERO_CHECK_CUDA(rc);
    async_[p] = alloc_stream_;
    return p;
  }
  void raw_free(void* p) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = async_.find(p);
    if (it == async_.end()) {
      if (cudaFree(p) != cudaSuccess) log::error("cudaFree failed on " + name());
      return;
    }
    const cudaStream_t s = it->second;
    async_.erase(it);
    if (cudaFreeAsync(p, s) != cudaSuccess) log::error("cudaFreeAsync failed on " + name());
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
  const size_t limit_;         // the configured limit, kUnlimited without one
  const size_t free_at_open_;  // cudaMemGetInfo's free bytes when the device was opened
  size_t outside_ = 0;         // taken since by libraries, outside the ledger
  std::vector<std::pair<std::string, size_t>> outside_by_;  // ... by library, in first-seen order
  cudaMemPool_t pool_ = nullptr;
  mutable std::mutex mutex_;
  bool ordered_ = false;
  cudaStream_t alloc_stream_ = nullptr;
  std::unordered_map<void*, cudaStream_t> async_;  // allocated by cudaMallocAsync, on which stream
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int index, const DeviceOptions& options) {
  return std::make_unique<CudaDevice>(index, options, query(index));
}

}  // namespace zero
