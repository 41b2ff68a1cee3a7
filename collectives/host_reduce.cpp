// host_reduce: the reduction arithmetic of every collective on the host (reduce_kernel.hpp).
//
// Work goes block by block: a block of kBlock fp32 accumulators (16 KiB, stays in L1) takes
// input 0, then adds inputs 1, 2, ... in order, then is finished (avg: divided) and rounded once
// into `out`. Every input and the output are streamed through memory exactly once.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "collectives/reduce_kernel.hpp"
#include "core/error.hpp"

namespace zero::coll {

namespace {

constexpr size_t kBlock = 4096;


// NaN-propagating max: a NaN in either operand gives NaN; among equal values (+0, -0) the
// earlier input wins.
inline float max_nan(float acc, float x) { return (x > acc || x != x) ? x : acc; }

// Every NaN result is written as the canonical quiet NaN (0x7fc00000 before rounding), as the
// CUDA kernel does: which payload an x86 or GPU addition keeps differs, the canonical one not.
inline float canonical(float x) {
  return x != x ? std::numeric_limits<float>::quiet_NaN() : x;
}

template <class T, ReduceOp Op>
void reduce_typed(int divisor, const void* const* inputs, int n, void* out_v, size_t count) {
  T* out = static_cast<T*>(out_v);
  alignas(64) float acc[kBlock];
  const float scale_div = static_cast<float>(divisor);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    {
      const T* __restrict in = static_cast<const T*>(inputs[0]) + base;
      for (size_t i = 0; i < len; ++i) acc[i] = to_float(in[i]);
    }
    for (int q = 1; q < n; ++q) {
      const T* __restrict in = static_cast<const T*>(inputs[q]) + base;
      if constexpr (Op == ReduceOp::max) {
        for (size_t i = 0; i < len; ++i) acc[i] = max_nan(acc[i], to_float(in[i]));
      } else {
        for (size_t i = 0; i < len; ++i) acc[i] += to_float(in[i]);
      }
    }
    // `out` may be one of the inputs: it is written only after every input of the block was read.
    T* __restrict o = out + base;
    if constexpr (Op == ReduceOp::avg) {
      for (size_t i = 0; i < len; ++i) o[i] = from_float<T>(canonical(acc[i] / scale_div));
    } else {
      for (size_t i = 0; i < len; ++i) o[i] = from_float<T>(canonical(acc[i]));
    }
  }
}

template <class T>
void reduce_op(ReduceOp op, int divisor, const void* const* in, int n, void* out, size_t count) {
  switch (op) {
    case ReduceOp::sum: return reduce_typed<T, ReduceOp::sum>(divisor, in, n, out, count);
    case ReduceOp::avg: return reduce_typed<T, ReduceOp::avg>(divisor, in, n, out, count);
    case ReduceOp::max: return reduce_typed<T, ReduceOp::max>(divisor, in, n, out, count);
  }
}

// One entry per dtype, compiled for baseline x86-64, AVX2 and AVX-512 and chosen at load time
// (GCC function multi-versioning): a binary built on one host runs on any other.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZERO_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), flatten))
#else
#define ZERO_SIMD_CLONES
#endif

ZERO_SIMD_CLONES void reduce_f32(ReduceOp op, int d, const void* const* in, int n, void* out,
                                 size_t count) {
  reduce_op<float>(op, d, in, n, out, count);
}
ZERO_SIMD_CLONES void reduce_f16(ReduceOp op, int d, const void* const* in, int n, void* out,
                                 size_t count) {
  reduce_op<half>(op, d, in, n, out, count);
}
ZERO_SIMD_CLONES void reduce_bf16(ReduceOp op, int d, const void* const* in, int n, void* out,
                                  size_t count) {
  reduce_op<bfloat16>(op, d, in, n, out, count);
}

}  // namespace

void host_reduce(DType dtype, ReduceOp op, int divisor, const void* const* inputs, int n_inputs,
                 void* out, size_t count) {
  ZERO_REQUIRE(n_inputs >= 1, "host_reduce needs at least one input");
  ZERO_REQUIRE(op != ReduceOp::avg || divisor >= 1, "host_reduce: avg needs a divisor >= 1");
  if (count == 0) return;
  switch (dtype) {
    case DType::f32: return reduce_f32(op, divisor, inputs, n_inputs, out, count);
    case DType::f16: return reduce_f16(op, divisor, inputs, n_inputs, out, count);
    case DType::bf16: return reduce_bf16(op, divisor, inputs, n_inputs, out, count);
  }
}

}  // namespace zero::coll
