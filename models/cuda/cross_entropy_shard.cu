// The vocabulary-parallel cross-entropy (Megatron's parallel cross-entropy; ops.hpp,
// "Vocabulary-parallel ends"): each rank holds columns [v0, v0 + Vs) of the logits and the loss
// comes from two all-reduces of per-row numbers (the caller's), never from the whole logits.
// The arithmetic mirrors cross_entropy.cu: one block per row, threads over columns tid,
// tid + 512, ..., fixed block trees (common.cuh), expf(x - max), the loss as
// logf(sum) + max - target logit, the mean and the count of counted rows by one single-block
// launch. No float atomics; every order is fixed by the shapes.
#include "models/cuda/common.cuh"

namespace zero::models::kernels {

namespace {

using namespace detail;

constexpr unsigned kRowThreads = 512;
constexpr unsigned kCountThreads = 1024;
constexpr int32_t kIgnore = -1;

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    shard_max_kernel(float* __restrict__ rowmax, const T* __restrict__ logits, int64_t Vs) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vs;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < Vs; j += kRowThreads) mx = fmaxf(mx, widen(x[j]));
  mx = block_max<kRowThreads>(mx, scratch);
  if (threadIdx.x == 0) rowmax[row] = mx;
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    shard_sums_kernel(float* __restrict__ sums, const T* __restrict__ logits,
                      const float* __restrict__ rowmax, const int32_t* __restrict__ targets,
                      int64_t N, int64_t v0, int64_t Vs, int64_t V, ErrorSink err) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vs;
  const float m = rowmax[row];
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < Vs; j += kRowThreads) sum += expf(widen(x[j]) - m);
  sum = block_sum<kRowThreads>(sum, scratch);
  if (threadIdx.x == 0) {
    sums[row] = sum;
    const int32_t raw = targets[row];
    float target_logit = 0.0f;  // ignored rows, and targets another rank holds
    if (raw != kIgnore) {
      const int64_t local = checked_id(raw, V, row, err) - v0;
      if (local >= 0 && local < Vs) target_logit = widen(x[local]);
    }
    sums[N + row] = target_logit;
  }
}

// losses[r] = logf(sums[r]) + rowmax[r] - sums[N + r] for counted rows (0 else); loss[0] = their
// mean (0 if none). One block, as cross_entropy.cu's mean.
__global__ void __launch_bounds__(kCountThreads)
    shard_loss_kernel(float* __restrict__ loss, float* __restrict__ losses,
                      const float* __restrict__ rowmax, const float* __restrict__ sums,
                      const int32_t* __restrict__ targets, int64_t N) {
  __shared__ float scratch[kWarp];
  float sum = 0.0f, count = 0.0f;
  for (int64_t r = threadIdx.x; r < N; r += kCountThreads) {
    if (targets[r] == kIgnore) {
      losses[r] = 0.0f;
      continue;
    }
    const float l = logf(sums[r]) + rowmax[r] - sums[N + r];
    losses[r] = l;
    sum += l;
    count += 1.0f;
  }
  // count: a sum of ones, exact in fp32 up to 2^24 rows per call.
  sum = block_sum<kCountThreads>(sum, scratch);
  count = block_sum<kCountThreads>(count, scratch);
  if (threadIdx.x == 0) *loss = count > 0.0f ? sum / count : 0.0f;
}

__global__ void __launch_bounds__(kCountThreads)
    shard_count_kernel(float* __restrict__ count, const int32_t* __restrict__ targets, int64_t N) {
  __shared__ float scratch[kWarp];
  float mine = 0.0f;
  for (int64_t r = threadIdx.x; r < N; r += kCountThreads) mine += targets[r] != kIgnore ? 1.0f : 0.0f;
  const float total = block_sum<kCountThreads>(mine, scratch);
  if (threadIdx.x == 0) *count = total;
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    shard_backward_kernel(T* dlogits, const T* logits, const float* __restrict__ rowmax,
                          const float* __restrict__ sums, const int32_t* __restrict__ targets,
                          const float* __restrict__ count, float scale, int64_t v0, int64_t Vs,
                          int64_t V, ErrorSink err) {
  const int64_t row = blockIdx.x;
  const int32_t raw = targets[row];
  T* d = dlogits + row * Vs;
  if (raw == kIgnore) {
    for (int64_t j = threadIdx.x; j < Vs; j += kRowThreads) d[j] = narrow<T>(0.0f);
    return;
  }
  const int64_t target =
      threadIdx.x == 0 ? checked_id(raw, V, row, err) : (raw < 0 ? 0 : (raw >= V ? V - 1 : raw));
  const int64_t local = target - v0;  // outside [0, Vs): another rank's column
  const T* x = logits + row * Vs;
  const float m = rowmax[row], s = sums[row];
  const float factor = scale / *count;  // this row counts, so *count >= 1
  // Each thread reads x[j] before it writes d[j]: dlogits may alias logits.
  for (int64_t j = threadIdx.x; j < Vs; j += kRowThreads) {
    const float p = expf(widen(x[j]) - m) / s;
    d[j] = narrow<T>(factor * (j == local ? p - 1.0f : p));
  }
}

}  // namespace

void cross_entropy_shard_max(DType a, float* rowmax, const void* logits, int64_t N, int64_t Vs,
                             cudaStream_t stream) {
  if (N == 0) return;
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    shard_max_kernel<E><<<unsigned(N), kRowThreads, 0, stream>>>(rowmax, static_cast<const E*>(logits), Vs);
    check_launch("shard_max_kernel", a);
  });
}

void cross_entropy_shard_sums(DType a, float* sums, const void* logits, const float* rowmax,
                              const int32_t* targets, int64_t N, int64_t v0, int64_t Vs, int64_t V,
                              ErrorSink err, cudaStream_t stream) {
  if (N == 0) return;
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    shard_sums_kernel<E><<<unsigned(N), kRowThreads, 0, stream>>>(
        sums, static_cast<const E*>(logits), rowmax, targets, N, v0, Vs, V, err);
    check_launch("shard_sums_kernel", a);
  });
}

void cross_entropy_shard_loss(float* loss, float* losses, const float* rowmax, const float* sums,
                              const int32_t* targets, int64_t N, cudaStream_t stream) {
  shard_loss_kernel<<<1, kCountThreads, 0, stream>>>(loss, losses, rowmax, sums, targets, N);
  check_launch("shard_loss_kernel", DType::f32);
}

void cross_entropy_shard_backward(DType a, void* dlogits, const void* logits, const float* rowmax,
                                  const float* sums, const int32_t* targets, float scale,
                                  int64_t N, int64_t v0, int64_t Vs, int64_t V, ErrorSink err,
                                  void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (N == 0) return;
  Carver carve(workspace, workspace_bytes);
  float* count = carve.take<float>(1);
  shard_count_kernel<<<1, kCountThreads, 0, stream>>>(count, targets, N);
  check_launch("shard_count_kernel", a);
  dispatch(a, [&](auto ta) {
    using E = typename decltype(ta)::type;
    shard_backward_kernel<E><<<unsigned(N), kRowThreads, 0, stream>>>(
        static_cast<E*>(dlogits), static_cast<const E*>(logits), rowmax, sums, targets, count,
        scale, v0, Vs, V, err);
    check_launch("shard_backward_kernel", a);
  });
}

}  // namespace zero::models::kernels
