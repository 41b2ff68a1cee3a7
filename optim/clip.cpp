#include "optim/clip.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <vector>

#include "core/error.hpp"

namespace zero::optim {
namespace {

// Compiled for AVX-512, AVX2 and baseline x86-64, chosen at load time (as core/dtype.cpp
// does). The clones give the same bits: every lane adds in the same order, and a float's square
// is exact in double, so a fused multiply-add rounds exactly like a multiply then an add.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define ZERO_NORM_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZERO_NORM_SIMD_CLONES
#endif

// Sum of squares of x[0, n) in double, in a fixed order: eight interleaved accumulators (lane j
// takes the elements i with i % 8 == j) added pairwise, then the tail. Independent accumulators
// let the loop run at load speed instead of one add latency per element.
ZERO_NORM_SIMD_CLONES double sum_of_squares(const float* x, size_t n) {
  constexpr size_t kLanes = 8;
  double acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      acc[j] += v * v;
    }
  double tail = 0.0;
  for (; i < n; ++i) {
    const double v = x[i];
    tail += v * v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// One chunk: fp32 directly; 16-bit types widened (exactly) to fp32 a block at a time by the
// vectorised convert() first, then summed block by block in order.
template <class T>
double chunk_sum_of_squares(const T* x, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return sum_of_squares(x, n);
  } else {
    constexpr size_t kBlock = 2048;
    constexpr DType kType = std::is_same_v<T, half> ? DType::f16 : DType::bf16;
    float widened[kBlock];
    double total = 0.0;
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t m = std::min(kBlock, n - b);
      convert(x + b, kType, widened, DType::f32, m);
      total += sum_of_squares(widened, m);
    }
    return total;
  }
}

template <class T>
float squared_norm(const T* x, size_t n) {
  const size_t chunks = (n + kNormChunkElements - 1) / kNormChunkElements;
  auto chunk = [&](size_t c) {
    const size_t begin = c * kNormChunkElements;
    return chunk_sum_of_squares(x + begin, std::min(kNormChunkElements, n - begin));
  };
  if (chunks <= 1) return static_cast<float>(n == 0 ? 0.0 : chunk(0));
  // Each chunk's sum lands in its own slot; the slots are added in chunk order afterwards, so
  // the result does not depend on how oneTBB spreads the chunks over threads.
  std::vector<double> partial(chunks);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, chunks), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t c = r.begin(); c != r.end(); ++c) partial[c] = chunk(c);
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return static_cast<float>(total);
}

}  // namespace

float local_squared_norm(const void* grad, DType dtype, size_t n) {
  ZERO_REQUIRE(grad != nullptr || n == 0, "local_squared_norm: null gradient pointer");
  switch (dtype) {
    case DType::f32: return squared_norm(static_cast<const float*>(grad), n);
    case DType::f16: return squared_norm(static_cast<const half*>(grad), n);
    case DType::bf16: return squared_norm(static_cast<const bfloat16*>(grad), n);
  }
  ZERO_FAIL("local_squared_norm: unknown dtype");
}

GlobalNorm global_grad_norm(coll::Communicator& comm, float local_sq) {
  ZERO_REQUIRE(comm.kind() == DeviceKind::cpu,
               "global_grad_norm needs a host (MPI) communicator: the squared norm is a host "
               "scalar, and an NCCL communicator takes device buffers only");
  float sq = local_sq;
  comm.all_reduce(&sq, &sq, 1, DType::f32, coll::ReduceOp::sum).wait();
  GlobalNorm g;
  g.squared = sq;
  g.norm = std::sqrt(sq);
  g.finite = std::isfinite(sq);
  return g;
}

namespace {

// min(1, max_norm / (norm + 1e-6)) in double; 1 when max_norm <= 0; NaN stays NaN.
double clip_coefficient_d(double norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0;  // gradient_clipping 0: off
  const double coef = max_norm / (norm + 1e-6);
  return std::isnan(coef) ? coef : std::min(1.0, coef);
}

}  // namespace

float clip_coefficient(float norm, float max_norm) {
  return static_cast<float>(clip_coefficient_d(norm, max_norm));
}

StepScale fold_grad_scale(const GlobalNorm& norm, double loss_scale, float max_norm) {
  ZERO_REQUIRE(std::isfinite(loss_scale) && loss_scale > 0.0,
               "fold_grad_scale: the loss scale must be positive and finite");
  const double grad_norm = static_cast<double>(norm.norm) / loss_scale;
  const double coef = clip_coefficient_d(grad_norm, max_norm);
  StepScale s;
  s.apply = norm.finite;
  s.loss_scale = loss_scale;
  s.grad_norm = static_cast<float>(grad_norm);
  s.clip_coef = static_cast<float>(coef);
  s.grad_scale = static_cast<float>(coef / loss_scale);
  return s;
}

StepScale prepare_step(LossScaler& scaler, const GlobalNorm& norm, float max_norm) {
  const ScaleUpdate u = scaler.update(!norm.finite);
  StepScale s = fold_grad_scale(norm, u.step_scale, max_norm);
  s.apply = u.apply;
  if (!s.apply) s.grad_scale = 0.0f;
  return s;
}

}  // namespace zero::optim
