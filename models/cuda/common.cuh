// Device helpers shared by the model kernels (models/cuda/*.cu only): element access through
// dtype.hpp's exact conversions, reductions in a fixed order, error reporting, launch checks and
// the dispatch from a DType to a C++ element type.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/cuda/kernels.hpp"
#include "core/cuda/checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace zero::models::kernels::detail {

inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr unsigned kWarp = 32;
// Grid-stride loops: enough blocks to fill any current GPU several times over.
inline constexpr size_t kMaxBlocks = 8192;

// widen / narrow: the host's exact conversions (dtype.hpp), so a 16-bit result stored here is
// the one the host would store for the same fp32 value.
template <class T>
__device__ __forceinline__ float widen(T x) {
  return to_float(x);
}
template <class T>
__device__ __forceinline__ T narrow(float x) {
  return from_float<T>(x);
}

// The sum / max over the warp by a butterfly. Every lane ends with the same value: at each step
// a lane and its partner add the same two numbers (in swapped order, which addition does not
// care about), so the tree, and therefore the result, depends on nothing but the inputs.
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (unsigned o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (unsigned o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Block-wide sum / max for blocks of kThreads (a multiple of 32, at most 1024), returned to every
// thread. Fixed tree: warp butterflies, then a butterfly over the warp results. Every thread of
// the block must call it (it synchronises); `scratch` holds 32 floats of shared memory and may be
// reused by the next call (the leading __syncthreads protects it).
template <unsigned kThreads>
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  static_assert(kThreads % kWarp == 0 && kThreads <= 1024);
  constexpr unsigned kWarps = kThreads / kWarp;
  const unsigned lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_sum(x);
  __syncthreads();  // an earlier call's readers are done with scratch
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < kWarps ? scratch[lane] : 0.0f;
  return warp_sum(x);  // every warp reduces the same kWarps values the same way
}
template <unsigned kThreads>
__device__ __forceinline__ float block_max(float x, float* scratch) {
  static_assert(kThreads % kWarp == 0 && kThreads <= 1024);
  constexpr unsigned kWarps = kThreads / kWarp;
  const unsigned lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < kWarps ? scratch[lane] : -INFINITY;
  return warp_max(x);
}

// Records an id outside [0, limit) found at `row` by the call `err` describes (see ErrorRecord),
// and returns the id clamped into range so the caller's accesses stay in bounds.
__device__ __forceinline__ int64_t checked_id(int32_t id, int64_t limit, int64_t row,
                                              const ErrorSink& err) {
  if (id >= 0 && id < limit) return id;
  ErrorRecord* r = err.record;
  const unsigned old = atomicCAS(&r->seq, 0u, err.seq);
  if (old == 0u) {  // this call is the first to fail since the record was last cleared
    r->op = static_cast<unsigned>(err.op);
    r->cols = err.cols;
    r->limit = limit;
  }
  if (old == 0u || old == err.seq) {
    const unsigned long long key =
        (static_cast<unsigned long long>(row) << 32) | static_cast<uint32_t>(id);
    atomicMax(&r->inv_key, ~key);  // the lowest row wins, whatever the thread order
  }
  return id < 0 ? 0 : limit - 1;
}

// A launch fails synchronously (bad configuration, no device, bad stream); the error names the
// kernel, since "cudaGetLastError()" alone would not say which launch it was.
inline void check_launch(const char* kernel, DType a) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    const std::string statement = std::string(kernel) + "<" + std::string(to_string(a)) + "><<<>>>";
    zero::detail::throw_cuda(rc, statement.c_str(), __FILE__, __LINE__);
  }
}

// Blocks for a grid-stride loop over `work` items.
inline unsigned grid_for(size_t work, unsigned threads) {
  return unsigned(std::max<size_t>(1, std::min((work + threads - 1) / threads, kMaxBlocks)));
}
inline unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

template <class T>
struct Type {
  using type = T;
};

// Calls f(Type<T>{}) with T the element type of `t`.
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(Type<float>{}); return;
    case DType::f16: f(Type<half>{}); return;
    case DType::bf16: f(Type<bfloat16>{}); return;
  }
  ZERO_FAIL("cuda kernels: unknown element type " + std::to_string(int(t)));
}
// Calls f(Type<T>{}, Type<G>{}) for an activation type and a gradient type, fp32 or the same.
template <class F>
void dispatch_grad(DType a, DType g, F&& f) {
  dispatch(a, [&](auto ta) {
    using T = typename decltype(ta)::type;
    if (g == DType::f32) {
      f(ta, Type<float>{});
    } else {
      ZERO_REQUIRE(g == a, "cuda kernels: a gradient is " + std::string(to_string(g)) +
                               " with activations in " + std::string(to_string(a)) +
                               " (gradients are fp32 or the activation type)");
      f(ta, Type<T>{});
    }
  });
}

// Carves consecutive aligned pieces out of a workspace.
class Carver {
 public:
  Carver(void* base, size_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {}
  template <class T>
  T* take(size_t count) {
    const size_t size = align_up(count * sizeof(T));
    ZERO_REQUIRE(used_ + size <= bytes_, "cuda kernels: workspace of " + std::to_string(bytes_) +
                                             " bytes is too small (internal error)");
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += size;
    return p;
  }

 private:
  char* base_;
  size_t bytes_;
  size_t used_ = 0;
};

// Launches the finisher of a column reduction (reduce.cu): grad[c] = round_g(grad[c] + sum over
// p < parts of partials[p * cols + c]), the parts added in order.
void add_column_partials(DType g, void* grad, const float* partials, int64_t parts, int64_t cols,
                         cudaStream_t stream);
// Rows per partial of a column reduction over `rows` rows: a function of rows only, so the
// summation order is fixed by the shape.
int64_t rows_per_part(int64_t rows);

}  // namespace zero::models::kernels::detail
