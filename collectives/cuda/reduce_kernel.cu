// The reduction kernel: one grid-stride loop per (dtype, op, pass kind). Each thread reduces a
// pack of 16 bytes of elements (4 fp32 or 8 16-bit) across all inputs of the pass when every
// pointer is aligned for it, one element at a time otherwise and for the last count % pack.
// Pass kinds (more inputs than fit one launch's parameters, see the header):
//   first+last  inputs -> out               (the common case: n_inputs <= 32)
//   first       inputs -> fp32 scratch
//   middle      scratch + inputs -> scratch
//   last        scratch + inputs -> out
#include "collectives/cuda/reduce_kernel.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/cuda/checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace zero::coll {

namespace {

constexpr unsigned kThreads = 256;
// Enough blocks to fill any current GPU several times over; beyond that, threads loop.
constexpr size_t kMaxBlocks = 8192;
constexpr size_t kPackBytes = 16;
constexpr uint32_t kCanonicalNaN = 0x7fc00000u;

template <class T>
constexpr int kVec = int(kPackBytes / sizeof(T));

template <class T, int N>
struct alignas(N * sizeof(T)) Pack {
  T v[N];
};

// One launch's arguments, passed by value in the kernel's parameter space (about 300 bytes).
struct Pass {
  const void* in[kCudaReduceInputsPerPass];
  int n;                // inputs used in this pass
  const float* acc_in;  // not first: the accumulator so far
  float* acc_out;       // not last: where the accumulator goes (may equal acc_in)
  void* out;            // last: the result
  size_t count;
  float divisor;  // avg only
  bool vectorised;
};

// widen / narrow: dtype.hpp's to_float and from_float<T>, the host's exact rules on the device.
template <class T>
__device__ __forceinline__ float widen(T x) { return to_float(x); }
template <class T>
__device__ __forceinline__ T narrow(float x) { return from_float<T>(x); }

__device__ __forceinline__ bool is_nan(float x) {
  return (zero::detail::float_bits(x) & zero::detail::kF32AbsMask) > zero::detail::kF32Inf;
}

template <ReduceOp kOp>
__device__ __forceinline__ float combine(float acc, float x) {
  if constexpr (kOp == ReduceOp::max) {
    return (acc >= x || is_nan(acc)) ? acc : x;
  } else {
    return __fadd_rn(acc, x);  // explicitly IEEE round-to-nearest, never contracted
  }
}

template <class T, ReduceOp kOp>
__device__ __forceinline__ T finish(float acc, float divisor) {
  if constexpr (kOp == ReduceOp::avg) acc = __fdiv_rn(acc, divisor);
  if (is_nan(acc)) acc = zero::detail::bits_float(kCanonicalNaN);
  return narrow<T>(acc);
}

template <class T, ReduceOp kOp, bool kFirst, bool kLast>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const __grid_constant__ Pass p) {
  constexpr int V = kVec<T>;
  using In = Pack<T, V>;
  using Acc = Pack<float, V>;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int q0 = kFirst ? 1 : 0;

  const size_t packs = p.vectorised ? p.count / V : 0;
  for (size_t k = tid; k < packs; k += stride) {
    float acc[V];
    if constexpr (kFirst) {
      const In x = static_cast<const In*>(p.in[0])[k];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = widen(x.v[j]);
    } else {
      const Acc a = reinterpret_cast<const Acc*>(p.acc_in)[k];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = a.v[j];
    }
#pragma unroll 4
    for (int q = q0; q < p.n; ++q) {
      const In x = static_cast<const In*>(p.in[q])[k];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = combine<kOp>(acc[j], widen(x.v[j]));
    }
    // Every input of this pack has been read before `out` (possibly one of them) is written.
    if constexpr (kLast) {
      In y;
#pragma unroll
      for (int j = 0; j < V; ++j) y.v[j] = finish<T, kOp>(acc[j], p.divisor);
      static_cast<In*>(p.out)[k] = y;
    } else {
      Acc y;
#pragma unroll
      for (int j = 0; j < V; ++j) y.v[j] = acc[j];
      reinterpret_cast<Acc*>(p.acc_out)[k] = y;
    }
  }

  for (size_t i = packs * V + tid; i < p.count; i += stride) {
    float acc = kFirst ? widen(static_cast<const T*>(p.in[0])[i]) : p.acc_in[i];
    for (int q = q0; q < p.n; ++q)
      acc = combine<kOp>(acc, widen(static_cast<const T*>(p.in[q])[i]));
    if constexpr (kLast) {
      static_cast<T*>(p.out)[i] = finish<T, kOp>(acc, p.divisor);
    } else {
      p.acc_out[i] = acc;
    }
  }
}

bool aligned(const void* ptr, size_t alignment) {
  return reinterpret_cast<uintptr_t>(ptr) % alignment == 0;
}

struct Args {
  DType dtype;
  ReduceOp op;
  int divisor;
  const void* const* inputs;
  int n_inputs;
  void* out;
  size_t count;
  cudaStream_t stream;
  float* scratch;
};

template <class T, ReduceOp kOp, bool kFirst, bool kLast>
void launch(const Args& a, const Pass& p, int first_input) {
  constexpr size_t V = size_t(kVec<T>);
  const size_t work = p.vectorised ? p.count / V + p.count % V : p.count;  // busiest loop
  const size_t blocks = std::min((work + kThreads - 1) / kThreads, kMaxBlocks);
  reduce_kernel<T, kOp, kFirst, kLast><<<unsigned(blocks), kThreads, 0, a.stream>>>(p);
  // A launch fails synchronously (bad configuration, no device, bad stream); name it by its
  // arguments, since "cudaGetLastError()" would say nothing about which launch it was.
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    const std::string statement =
        "reduce_kernel<" + std::string(to_string(a.dtype)) + ", " + std::string(to_string(a.op)) +
        "><<<" + std::to_string(blocks) + ", " + std::to_string(kThreads) + ">>>(inputs " +
        std::to_string(first_input) + ".." + std::to_string(first_input + p.n - 1) + " of " +
        std::to_string(a.n_inputs) + ", count = " + std::to_string(p.count) + ")";
    zero::detail::throw_cuda(rc, statement.c_str(), __FILE__, __LINE__);
  }
}

template <class T, ReduceOp kOp>
void run(const Args& a) {
  constexpr int P = kCudaReduceInputsPerPass;
  const bool multi_pass = a.n_inputs > P;
  bool vectorised = aligned(a.out, kPackBytes) &&
                    (!multi_pass || aligned(a.scratch, sizeof(Pack<float, kVec<T>>)));
  for (int q = 0; q < a.n_inputs; ++q) vectorised = vectorised && aligned(a.inputs[q], kPackBytes);

  Pass p{};
  p.acc_in = a.scratch;
  p.acc_out = a.scratch;
  p.out = a.out;
  p.count = a.count;
  p.divisor = float(a.divisor);
  p.vectorised = vectorised;
  int next = 0;  // first input of the next pass
  auto take = [&](int n) {
    p.n = n;
    for (int j = 0; j < n; ++j) p.in[j] = a.inputs[next + j];
    const int first = next;
    next += n;
    return first;
  };

  if (!multi_pass) {
    const int first = take(a.n_inputs);
    return launch<T, kOp, true, true>(a, p, first);
  }
  int first = take(P);
  launch<T, kOp, true, false>(a, p, first);
  while (a.n_inputs - next > P) {
    first = take(P);
    launch<T, kOp, false, false>(a, p, first);
  }
  first = take(a.n_inputs - next);
  launch<T, kOp, false, true>(a, p, first);
}

template <class T>
void dispatch_op(const Args& a) {
  switch (a.op) {
    case ReduceOp::sum: return run<T, ReduceOp::sum>(a);
    case ReduceOp::avg: return run<T, ReduceOp::avg>(a);
    case ReduceOp::max: return run<T, ReduceOp::max>(a);
  }
  ZERO_FAIL("cuda_reduce_async: unknown reduce op " + std::to_string(int(a.op)));
}

}  // namespace

void cuda_reduce_async(DType dtype, ReduceOp op, int divisor, const void* const* inputs,
                       int n_inputs, void* out, size_t count, cudaStream_t stream,
                       float* fp32_scratch) {
  if (count == 0) return;
  ZERO_REQUIRE(n_inputs >= 1 && inputs != nullptr,
               "cuda_reduce_async needs at least one input, got " + std::to_string(n_inputs));
  ZERO_REQUIRE(op != ReduceOp::avg || divisor >= 1,
               "cuda_reduce_async: avg needs a divisor >= 1, got " + std::to_string(divisor));
  ZERO_REQUIRE(n_inputs <= kCudaReduceInputsPerPass || fp32_scratch != nullptr,
               "cuda_reduce_async: " + std::to_string(n_inputs) +
                   " inputs are more than one pass (" + std::to_string(kCudaReduceInputsPerPass) +
                   ") takes, and no fp32 scratch of `count` floats was given");
  const Args a{dtype, op, divisor, inputs, n_inputs, out, count, stream, fp32_scratch};
  switch (dtype) {
    case DType::f32: return dispatch_op<float>(a);
    case DType::f16: return dispatch_op<half>(a);
    case DType::bf16: return dispatch_op<bfloat16>(a);
  }
  ZERO_FAIL("cuda_reduce_async: unknown dtype " + std::to_string(int(dtype)));
}

}  // namespace zero::coll
