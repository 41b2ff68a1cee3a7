// Cross-entropy of logits against targets, forward and backward, with the stable softmax
// (subtract the row maximum before exp). One block per row: threads take columns tid,
// tid + 512, ... and the block reduces by a fixed tree (common.cuh), so every sum is in an order
// fixed by V. The mean loss and the count of rows that count are computed on the device by one
// more single-block launch, so nothing goes back to the host.
#include "models/cuda/common.cuh"

namespace zero::models::kernels {

namespace {

using namespace detail;

constexpr unsigned kRowThreads = 512;
constexpr unsigned kCountThreads = 1024;
constexpr int32_t kIgnore = -1;

// The row's maximum and sum of exp(x - max), for every thread of the block.
template <class T>
__device__ __forceinline__ void row_softmax_stats(const T* x, int64_t V, float* scratch, float* m,
                                                  float* s) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kRowThreads) mx = fmaxf(mx, widen(x[j]));
  mx = block_max<kRowThreads>(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kRowThreads) sum += expf(widen(x[j]) - mx);
  *m = mx;
  *s = block_sum<kRowThreads>(sum, scratch);
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_rows_kernel(float* __restrict__ losses, const T* __restrict__ logits,
                              const int32_t* __restrict__ targets, int64_t V, ErrorSink err) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const int32_t raw = targets[row];
  if (raw == kIgnore) {  // the whole block leaves together
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  const T* x = logits + row * V;
  float m = 0.0f, s = 0.0f;
  row_softmax_stats(x, V, scratch, &m, &s);
  if (threadIdx.x == 0) {
    const int64_t target = checked_id(raw, V, row, err);
    // -log softmax(x)[target] = log(sum exp(x - m)) + m - x[target]
    losses[row] = logf(s) + m - widen(x[target]);
  }
}

// loss[0] = (sum of losses over rows whose target is not -1) / their count, 0 if none. One block.
__global__ void __launch_bounds__(kCountThreads)
    cross_entropy_mean_kernel(float* __restrict__ loss, const float* __restrict__ losses,
                              const int32_t* __restrict__ targets, int64_t N) {
  __shared__ float scratch[kWarp];
  float sum = 0.0f, count = 0.0f;
  for (int64_t r = threadIdx.x; r < N; r += kCountThreads) {
    if (targets[r] != kIgnore) {
      sum += losses[r];
      count += 1.0f;
    }
  }
  // count: a sum of ones, exact in fp32 up to 2^24 rows per call.
  sum = block_sum<kCountThreads>(sum, scratch);
  count = block_sum<kCountThreads>(count, scratch);
  if (threadIdx.x == 0) *loss = count > 0.0f ? sum / count : 0.0f;
}

// count[0] = rows whose target is not -1. One block; integer sums, so any order gives the same.
__global__ void __launch_bounds__(kCountThreads)
    cross_entropy_count_kernel(float* __restrict__ count, const int32_t* __restrict__ targets,
                               int64_t N) {
  __shared__ float scratch[kWarp];
  float mine = 0.0f;
  for (int64_t r = threadIdx.x; r < N; r += kCountThreads)
    mine += targets[r] != kIgnore ? 1.0f : 0.0f;
  const float total = block_sum<kCountThreads>(mine, scratch);
  if (threadIdx.x == 0) *count = total;
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_backward_kernel(T* dlogits, const T* logits, const int32_t* __restrict__ targets,
                                  const float* __restrict__ count, float scale, int64_t V,
                                  ErrorSink err) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const int32_t raw = targets[row];
  T* d = dlogits + row * V;
  if (raw == kIgnore) {
    for (int64_t j = threadIdx.x; j < V; j += kRowThreads) d[j] = narrow<T>(0.0f);
    return;
  }
  const T* x = logits + row * V;
  const int64_t target =
      threadIdx.x == 0 ? checked_id(raw, V, row, err) : (raw < 0 ? 0 : (raw >= V ? V - 1 : raw));
  float m = 0.0f, s = 0.0f;
  row_softmax_stats(x, V, scratch, &m, &s);
  // This row counts, so *count >= 1.
  const float factor = scale / *count;
  // Every read of the row happened before the block reductions above returned, and below each
  // thread reads x[j] before it writes d[j]: dlogits may alias logits.
  for (int64_t j = threadIdx.x; j < V; j += kRowThreads) {
    const float p = expf(widen(x[j]) - m) / s;
    d[j] = narrow<T>(factor * (j == target ? p - 1.0f : p));
  }
}

}  // namespace

void cross_entropy_forward(DType a, float* loss, float* losses, const void* logits,
                           const int32_t* targets, int64_t N, int64_t V, ErrorSink err,
                           cudaStream_t stream) {
  if (N > 0) {
    dispatch(a, [&](auto ta) {
      using E = typename decltype(ta)::type;
      cross_entropy_rows_kernel<E><<<unsigned(N), kRowThreads, 0, stream>>>(
          losses, static_cast<const E*>(logits), targets, V, err);
      check_launch("cross_entropy_rows_kernel", a);
    });
  }
  cross_entropy_mean_kernel<<<1, kCountThreads, 0, stream>>>(loss, losses, targets, N);
  check_launch("cross_entropy_mean_kernel", a);
}

size_t cross_entropy_backward_workspace() { return align_up(sizeof(float)); }

void cross_entropy_backward(DType a, void* dlogits, const void* logits, const int32_t* targets,
                            float scale, int64_t N, int64_t V, ErrorSink err, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
  if (N == 0) return;
  Carver carve(workspace, workspace_bytes);
  float* count = carve.take<float>(1);
  cross_entropy_count_kernel<<<1, kCountThreads, 0, stream>>>(count, targets, N);
  check_launch("cross_entropy_count_kernel", a);
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    cross_entropy_backward_kernel<E><<<unsigned(N), kRowThreads, 0, stream>>>(
        static_cast<E*>(dlogits), static_cast<const E*>(logits), targets, count, scale, V, err);
    check_launch("cross_entropy_backward_kernel", a);
  });
}

}  // namespace zero::models::kernels
