// The fused AdamW kernel and the gradient reductions (squared norm, inf/NaN test); contracts in
// adam_kernel.hpp. Every kernel is a grid-stride loop with size_t indices that handles four
// elements per thread and iteration: with vector accesses when every pointer is aligned for
// them, one element at a time otherwise and for the last n % 4.
#include "optim/cuda/adam_kernel.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/cuda/checks.hpp"
#include "core/error.hpp"

namespace zero::optim {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarps = kThreads / 32;
// Enough blocks to fill any current GPU several times over; beyond that, threads loop.
constexpr size_t kMaxBlocks = 8192;
constexpr size_t kVec = 4;  // elements per thread and iteration
constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kCudaNormPartials % kThreads == 0, "the finishing block reads whole rows");

// kVec elements of T: 16 bytes of fp32, 8 bytes of a 16-bit type, one vector access each.
template <class T>
struct alignas(kVec * sizeof(T)) Pack {
  T v[kVec];
};

// No 16-bit copy of the parameters.
struct NoCopy {};

// widen / narrow: dtype.hpp's to_float and from_float<T>, the host's exact rules on the device.
template <class T>
__device__ __forceinline__ float widen(T x) { return to_float(x); }
template <class T>
__device__ __forceinline__ T narrow(float x) { return from_float<T>(x); }

// ---- AdamW --------------------------------------------------------------------------------

// One launch's arguments, in the kernel's parameter space.
struct AdamArgs {
  float* param;
  float* m;
  float* v;
  const void* grad;
  void* copy;
  size_t n;
  AdamScalars s;
  bool vectorised;
};

// The formula of adam.hpp, one rounded fp32 operation per step, left to right as written there.
// The _rn intrinsics are never contracted into FMAs and ignore --use_fast_math, so this is the
// same sequence of IEEE operations a plain fp32 host loop performs.
template <bool kAdamW>
__device__ __forceinline__ void adam_update(const AdamScalars& s, float grad, float& p, float& m,
                                            float& v) {
  float g = __fmul_rn(grad, s.grad_scale);
  if constexpr (!kAdamW) g = __fadd_rn(g, __fmul_rn(s.l2, p));
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.inv_sqrt_bc2), s.eps);
  if constexpr (kAdamW) p = __fsub_rn(p, __fmul_rn(s.decay, p));
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
}

template <class G, class C, bool kAdamW>
__global__ void __launch_bounds__(kThreads) adam_kernel(const __grid_constant__ AdamArgs a) {
  constexpr bool kCopy = !std::is_same_v<C, NoCopy>;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float* __restrict__ param = a.param;
  float* __restrict__ m = a.m;
  float* __restrict__ v = a.v;
  const G* __restrict__ grad = static_cast<const G*>(a.grad);

  const size_t packs = a.vectorised ? a.n / kVec : 0;
  for (size_t k = tid; k < packs; k += stride) {
    Pack<float> p4 = reinterpret_cast<const Pack<float>*>(param)[k];
    Pack<float> m4 = reinterpret_cast<const Pack<float>*>(m)[k];
    Pack<float> v4 = reinterpret_cast<const Pack<float>*>(v)[k];
    const Pack<G> g4 = reinterpret_cast<const Pack<G>*>(grad)[k];
#pragma unroll
    for (size_t j = 0; j < kVec; ++j)
      adam_update<kAdamW>(a.s, widen(g4.v[j]), p4.v[j], m4.v[j], v4.v[j]);
    reinterpret_cast<Pack<float>*>(param)[k] = p4;
    reinterpret_cast<Pack<float>*>(m)[k] = m4;
    reinterpret_cast<Pack<float>*>(v)[k] = v4;
    if constexpr (kCopy) {
      Pack<C> c4;
#pragma unroll
      for (size_t j = 0; j < kVec; ++j) c4.v[j] = narrow<C>(p4.v[j]);
      static_cast<Pack<C>*>(a.copy)[k] = c4;
    }
  }

  for (size_t i = packs * kVec + tid; i < a.n; i += stride) {
    float p = param[i], mi = m[i], vi = v[i];
    adam_update<kAdamW>(a.s, widen(grad[i]), p, mi, vi);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kCopy) static_cast<C*>(a.copy)[i] = narrow<C>(p);
  }
}

bool aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Grid for a grid-stride loop whose busiest loop runs `work` iterations in all.
size_t blocks_for(size_t work) { return std::min((work + kThreads - 1) / kThreads, kMaxBlocks); }

// A launch fails synchronously (bad configuration, no device, bad stream); the error names the
// launch, since "cudaGetLastError()" alone would not say which one it was.
void check_launch(const std::string& what, size_t blocks, size_t n) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    const std::string statement = what + "<<<" + std::to_string(blocks) + ", " +
                                  std::to_string(kThreads) + ">>>(n = " + std::to_string(n) + ")";
    zero::detail::throw_cuda(rc, statement.c_str(), __FILE__, __LINE__);
  }
}

std::string copy_name(const AdamArgs& a, DType copy_dtype) {
  return a.copy ? std::string(to_string(copy_dtype)) : std::string("none");
}

template <class G, class C, bool kAdamW>
void launch_adam(const AdamArgs& a, DType grad_dtype, DType copy_dtype, cudaStream_t stream) {
  const size_t work = a.vectorised ? a.n / kVec + a.n % kVec : a.n;
  const size_t blocks = blocks_for(work);
  adam_kernel<G, C, kAdamW><<<unsigned(blocks), kThreads, 0, stream>>>(a);
  check_launch("adam_kernel<grad " + std::string(to_string(grad_dtype)) + ", copy " +
                   copy_name(a, copy_dtype) + (kAdamW ? ", adamw>" : ", adam-l2>"),
               blocks, a.n);
}

template <class G, bool kAdamW>
void dispatch_copy(const AdamArgs& a, DType grad_dtype, DType copy_dtype, cudaStream_t stream) {
  if (a.copy == nullptr) return launch_adam<G, NoCopy, kAdamW>(a, grad_dtype, copy_dtype, stream);
  switch (copy_dtype) {
    case DType::f32: return launch_adam<G, float, kAdamW>(a, grad_dtype, copy_dtype, stream);
    case DType::f16: return launch_adam<G, half, kAdamW>(a, grad_dtype, copy_dtype, stream);
    case DType::bf16: return launch_adam<G, bfloat16, kAdamW>(a, grad_dtype, copy_dtype, stream);
  }
  ZERO_FAIL("cuda_adam_step: unknown copy dtype " + std::to_string(int(copy_dtype)));
}

template <bool kAdamW>
void dispatch_grad(const AdamArgs& a, DType grad_dtype, DType copy_dtype, cudaStream_t stream) {
  switch (grad_dtype) {
    case DType::f32: return dispatch_copy<float, kAdamW>(a, grad_dtype, copy_dtype, stream);
    case DType::f16: return dispatch_copy<half, kAdamW>(a, grad_dtype, copy_dtype, stream);
    case DType::bf16: return dispatch_copy<bfloat16, kAdamW>(a, grad_dtype, copy_dtype, stream);
  }
  ZERO_FAIL("cuda_adam_step: unknown grad dtype " + std::to_string(int(grad_dtype)));
}

// ---- reductions ---------------------------------------------------------------------------

// The sum of x over the block, in a fixed order: a butterfly within each warp, then the warp
// sums in warp 0 by another butterfly. The result is valid in thread 0. (A butterfly lane may
// add a + b where its partner adds b + a: the same value, addition being commutative.)
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float warp_sums[kWarps];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (unsigned o = 16; o > 0; o /= 2) x = __fadd_rn(x, __shfl_xor_sync(kFullMask, x, o));
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < kWarps ? warp_sums[lane] : 0.0f;
#pragma unroll
    for (unsigned o = kWarps / 2; o > 0; o /= 2) x = __fadd_rn(x, __shfl_xor_sync(kFullMask, x, o));
  }
  return x;
}

// Stage 1: one partial sum of squares per block. Element 4k + j goes to lane j of the thread that
// owns pack k, whether it is read with one vector load or one by one, so alignment cannot change
// the result; a missing element of the last pack adds +0 (exactly nothing).
template <class T>
__global__ void __launch_bounds__(kThreads)
    squared_norm_partials(const T* __restrict__ x, size_t n, bool vectorised,
                          float* __restrict__ partials) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = (n + kVec - 1) / kVec;
  float acc[kVec] = {};
  for (size_t k = tid; k < packs; k += stride) {
    float e[kVec];
    if (vectorised && (k + 1) * kVec <= n) {
      const Pack<T> x4 = reinterpret_cast<const Pack<T>*>(x)[k];
#pragma unroll
      for (size_t j = 0; j < kVec; ++j) e[j] = widen(x4.v[j]);
    } else {
#pragma unroll
      for (size_t j = 0; j < kVec; ++j) e[j] = k * kVec + j < n ? widen(x[k * kVec + j]) : 0.0f;
    }
#pragma unroll
    for (size_t j = 0; j < kVec; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(e[j], e[j]));
  }
  const float mine = __fadd_rn(__fadd_rn(acc[0], acc[1]), __fadd_rn(acc[2], acc[3]));
  const float sum = block_sum(mine);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Stage 2, one block: thread t adds partials t, t + 256, ... in order, then the block sums.
__global__ void __launch_bounds__(kThreads)
    squared_norm_finish(const float* __restrict__ partials, unsigned count,
                        float* __restrict__ out) {
  float acc = 0.0f;
  for (unsigned i = threadIdx.x; i < count; i += kThreads) acc = __fadd_rn(acc, partials[i]);
  const float sum = block_sum(acc);
  if (threadIdx.x == 0) *out = sum;
}

// Exponent all ones: inf or NaN.
__device__ __forceinline__ bool nonfinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}
__device__ __forceinline__ bool nonfinite(half x) { return (x.bits & 0x7c00u) == 0x7c00u; }
__device__ __forceinline__ bool nonfinite(bfloat16 x) { return (x.bits & 0x7f80u) == 0x7f80u; }

template <class T>
__global__ void __launch_bounds__(kThreads)
    inf_or_nan_kernel(const T* __restrict__ x, size_t n, bool vectorised, int* flag) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = vectorised ? n / kVec : 0;
  bool found = false;
  for (size_t k = tid; k < packs; k += stride) {
    const Pack<T> x4 = reinterpret_cast<const Pack<T>*>(x)[k];
#pragma unroll
    for (size_t j = 0; j < kVec; ++j) found |= nonfinite(x4.v[j]);
  }
  for (size_t i = packs * kVec + tid; i < n; i += stride) found |= nonfinite(x[i]);
  // Every thread of the warp gets here (no early exit, whole warps per block); one atomic per
  // warp that saw one, since plain stores from many threads would be a data race.
  if (__any_sync(kFullMask, found) && threadIdx.x % 32 == 0) atomicExch(flag, 1);
}

template <class T>
void launch_norm(const void* grad, DType dtype, size_t n, float* out, cudaStream_t stream,
                 float* partials) {
  // The grid depends on n only: it fixes the reduction tree (see the header).
  const size_t packs = (n + kVec - 1) / kVec;
  const size_t blocks = std::min((packs + kThreads - 1) / kThreads, kCudaNormPartials);
  const bool vectorised = aligned(grad, sizeof(Pack<T>));
  squared_norm_partials<T><<<unsigned(blocks), kThreads, 0, stream>>>(static_cast<const T*>(grad),
                                                                      n, vectorised, partials);
  check_launch("squared_norm_partials<" + std::string(to_string(dtype)) + ">", blocks, n);
  squared_norm_finish<<<1, kThreads, 0, stream>>>(partials, unsigned(blocks), out);
  check_launch("squared_norm_finish", 1, blocks);
}

template <class T>
void launch_inf_or_nan(const void* grad, DType dtype, size_t n, int* flag, cudaStream_t stream) {
  const bool vectorised = aligned(grad, sizeof(Pack<T>));
  const size_t blocks = blocks_for(vectorised ? n / kVec + n % kVec : n);
  inf_or_nan_kernel<T>
      <<<unsigned(blocks), kThreads, 0, stream>>>(static_cast<const T*>(grad), n, vectorised, flag);
  check_launch("inf_or_nan_kernel<" + std::string(to_string(dtype)) + ">", blocks, n);
}

}  // namespace

void cuda_adam_step(const AdamParams& params, const AdamStep& step, float* param, float* m,
                    float* v, const void* grad, DType grad_dtype, size_t n, void* param_copy,
                    DType copy_dtype, cudaStream_t stream) {
  if (n == 0) return;
  ZERO_REQUIRE(
      param != nullptr && m != nullptr && v != nullptr && grad != nullptr,
      "cuda_adam_step: param, m, v and grad must be non-null for n = " + std::to_string(n));
  AdamArgs a{};
  a.param = param;
  a.m = m;
  a.v = v;
  a.grad = grad;
  a.copy = param_copy;
  a.n = n;
  a.s = adam_scalars(params, step);
  a.vectorised = aligned(param, sizeof(Pack<float>)) && aligned(m, sizeof(Pack<float>)) &&
                 aligned(v, sizeof(Pack<float>)) && aligned(grad, kVec * size_of(grad_dtype)) &&
                 (param_copy == nullptr || aligned(param_copy, kVec * size_of(copy_dtype)));
  if (params.adam_w_mode) return dispatch_grad<true>(a, grad_dtype, copy_dtype, stream);
  return dispatch_grad<false>(a, grad_dtype, copy_dtype, stream);
}

void cuda_squared_norm_async(const void* grad, DType dtype, size_t n, float* out_device,
                             cudaStream_t stream, float* partials_device) {
  ZERO_REQUIRE(out_device != nullptr, "cuda_squared_norm_async: out_device is null");
  if (n == 0) {
    ZERO_CHECK_CUDA(cudaMemsetAsync(out_device, 0, sizeof(float), stream));  // +0.0f
    return;
  }
  ZERO_REQUIRE(grad != nullptr,
               "cuda_squared_norm_async: grad is null for n = " + std::to_string(n));
  float* partials = partials_device;
  if (partials == nullptr) {
    void* p = nullptr;
    ZERO_CHECK_CUDA(cudaMallocAsync(&p, kCudaNormPartials * sizeof(float), stream));
    partials = static_cast<float*>(p);
  }
  try {
    switch (dtype) {
      case DType::f32: launch_norm<float>(grad, dtype, n, out_device, stream, partials); break;
      case DType::f16: launch_norm<half>(grad, dtype, n, out_device, stream, partials); break;
      case DType::bf16: launch_norm<bfloat16>(grad, dtype, n, out_device, stream, partials); break;
      default: ZERO_FAIL("cuda_squared_norm_async: unknown dtype " + std::to_string(int(dtype)));
    }
  } catch (...) {
    // Give the scratch back on the stream even when a launch was rejected.
    if (partials_device == nullptr) (void)cudaFreeAsync(partials, stream);
    throw;
  }
  // Stream-ordered: the memory returns to the pool only after squared_norm_finish has run.
  if (partials_device == nullptr) ZERO_CHECK_CUDA(cudaFreeAsync(partials, stream));
}

void cuda_has_inf_or_nan_async(const void* grad, DType dtype, size_t n, int* flag_device,
                               cudaStream_t stream) {
  if (n == 0) return;
  ZERO_REQUIRE(grad != nullptr && flag_device != nullptr,
               "cuda_has_inf_or_nan_async: grad and flag_device must be non-null for n = " +
                   std::to_string(n));
  switch (dtype) {
    case DType::f32: return launch_inf_or_nan<float>(grad, dtype, n, flag_device, stream);
    case DType::f16: return launch_inf_or_nan<half>(grad, dtype, n, flag_device, stream);
    case DType::bf16: return launch_inf_or_nan<bfloat16>(grad, dtype, n, flag_device, stream);
  }
  ZERO_FAIL("cuda_has_inf_or_nan_async: unknown dtype " + std::to_string(int(dtype)));
}

}  // namespace zero::optim
