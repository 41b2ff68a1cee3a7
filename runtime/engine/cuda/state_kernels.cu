// The cuda StateKernels: the engine's state arithmetic as stream-ordered kernels on the compute
// stream. accumulate is the one kernel of its own here (acc += widen(x), one rounded fp32 addition
// per element, __fadd_rn so it is never contracted: the same bits as the cpu loop); the rest are
// the project's existing kernels.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "optim/cuda/adam_kernel.hpp"
#include "core/cuda/checks.hpp"
#include "core/cuda/dtype_convert.hpp"
#include "core/cuda/stream.hpp"
#include "runtime/engine/state_kernels.hpp"

namespace zero {

namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = 8192;

template <class T>
__device__ __forceinline__ float widen(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_float(x);
  }
}

template <class T>
__global__ void accumulate_kernel(float* __restrict__ acc, const T* __restrict__ x, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc[i] = __fadd_rn(acc[i], widen(x[i]));
}

template <class T>
void launch_accumulate(float* acc, const void* x, size_t n, cudaStream_t s) {
  const size_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  accumulate_kernel<T><<<unsigned(blocks), kThreads, 0, s>>>(acc, static_cast<const T*>(x), n);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    const std::string what = "accumulate_kernel<<<" + std::to_string(blocks) + ", " +
                             std::to_string(kThreads) + ">>>(n = " + std::to_string(n) + ")";
    detail::throw_cuda(rc, what.c_str(), __FILE__, __LINE__);
  }
}

class CudaStateKernels final : public StateKernels {
 public:
  CudaStateKernels(Device& d, Stream& s) : device_(d), stream_(cuda::native(s)) {
    // The norm's scratch: one block of partials, reused by every call on this stream (calls are
    // stream-ordered, so one call's partials are consumed before the next call writes them).
    partials_ = device_.allocate(optim::kCudaNormPartials * sizeof(float), MemCategory::comm_buffers);
  }

  void accumulate(float* acc, const void* x, DType t, size_t n) override {
    if (n == 0) return;
    switch (t) {
      case DType::f32: return launch_accumulate<float>(acc, x, n, stream_);
      case DType::f16: return launch_accumulate<half>(acc, x, n, stream_);
      case DType::bf16: return launch_accumulate<bfloat16>(acc, x, n, stream_);
    }
  }

  void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) override {
    cuda::convert_async(src, src_type, dst, dst_type, n, stream_);
  }

  void squared_norm(const void* x, DType t, size_t n, float* out) override {
    optim::cuda_squared_norm_async(x, t, n, out, stream_, partials_.as<float>());
  }

  void adam(const optim::AdamParams& params, const optim::AdamStep& step, float* param, float* m,
            float* v, const void* grad, DType grad_type, size_t n, void* param_copy,
            DType copy_type) override {
    optim::cuda_adam_step(params, step, param, m, v, grad, grad_type, n, param_copy, copy_type,
                          stream_);
  }

 private:
  Device& device_;
  cudaStream_t stream_;
  Buffer partials_;
};

}  // namespace

std::unique_ptr<StateKernels> make_cuda_state_kernels(Device& device, Stream& stream) {
  ZERO_REQUIRE(device.kind() == DeviceKind::cuda && stream.kind() == DeviceKind::cuda,
               "make_cuda_state_kernels: needs a cuda device and stream");
  return std::make_unique<CudaStateKernels>(device, stream);
}

}  // namespace zero
