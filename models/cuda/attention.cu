// The causal softmax of attention and its gradient; the matrix products around them are cuBLAS
// calls in cuda_ops.cpp. One warp per row of a [T, T] matrix (row i is query position i, and
// only keys j <= i take part); lanes take columns lane, lane + 32, ... and reduce by a butterfly,
// so the order of every sum is fixed by T.
#include "models/cuda/common.cuh"

namespace zero::models::kernels {

namespace {

using namespace detail;

constexpr unsigned kRowWarps = 4;
constexpr unsigned kRowThreads = kRowWarps * kWarp;

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    causal_softmax_forward_kernel(T* __restrict__ probs, const float* __restrict__ scores,
                                  int64_t rows, int64_t T_) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (row >= rows) return;
  const unsigned lane = threadIdx.x % kWarp;
  const int64_t i = row % T_;
  const float* s = scores + row * T_;
  T* p = probs + row * T_;
  float m = -INFINITY;
  for (int64_t j = lane; j <= i; j += kWarp) m = fmaxf(m, s[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t j = lane; j <= i; j += kWarp) sum += expf(s[j] - m);
  sum = warp_sum(sum);  // >= 1: the maximum contributes exp(0)
  for (int64_t j = lane; j < T_; j += kWarp) p[j] = narrow<T>(j <= i ? expf(s[j] - m) / sum : 0.0f);
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    causal_softmax_backward_kernel(T* __restrict__ dscores, const T* __restrict__ probs,
                                   const float* __restrict__ dprobs, int64_t rows, int64_t T_) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (row >= rows) return;
  const unsigned lane = threadIdx.x % kWarp;
  const int64_t i = row % T_;
  const T* p = probs + row * T_;
  const float* dp = dprobs + row * T_;
  T* ds = dscores + row * T_;
  // dot = sum_j p_j dp_j / sum_j p_j. With exact probabilities the divisor is 1; with probs
  // rounded to 16 bits it is 1 +- a few 2^-9, and dividing by it keeps dp_i - dot free of that
  // error: dp_i - dot = sum_j p_j (dp_i - dp_j) / sum_j p_j, whose every term is small where
  // the result is (without it, a row like i = 1 with a small p_1 loses most of its digits).
  float dot = 0.0f, total = 0.0f;
  for (int64_t j = lane; j <= i; j += kWarp) {
    const float pj = widen(p[j]);
    dot += pj * dp[j];
    total += pj;
  }
  dot = warp_sum(dot) / warp_sum(total);
  for (int64_t j = lane; j < T_; j += kWarp)
    ds[j] = narrow<T>(j <= i ? widen(p[j]) * (dp[j] - dot) : 0.0f);
}

}  // namespace

void causal_softmax_forward(DType a, void* probs, const float* scores, int64_t matrices, int64_t T,
                            cudaStream_t stream) {
  const int64_t rows = matrices * T;
  if (rows == 0) return;
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    causal_softmax_forward_kernel<E><<<ceil_div(rows, kRowWarps), kRowThreads, 0, stream>>>(
        static_cast<E*>(probs), scores, rows, T);
    check_launch("causal_softmax_forward_kernel", a);
  });
}

void causal_softmax_backward(DType a, void* dscores, const void* probs, const float* dprobs,
                             int64_t matrices, int64_t T, cudaStream_t stream) {
  const int64_t rows = matrices * T;
  if (rows == 0) return;
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    causal_softmax_backward_kernel<E><<<ceil_div(rows, kRowWarps), kRowThreads, 0, stream>>>(
        static_cast<E*>(dscores), static_cast<const E*>(probs), dprobs, rows, T);
    check_launch("causal_softmax_backward_kernel", a);
  });
}

}  // namespace zero::models::kernels
