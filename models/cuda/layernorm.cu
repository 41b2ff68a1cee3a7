// LayerNorm over the last dimension, forward and backward.
//
// Forward and the dx part of backward: one warp per row, each lane taking channels lane,
// lane + 32, ... in order, reduced by a butterfly (fixed order). Forward is two-pass (mean, then
// the mean of squared deviations), so a large mean cannot cancel the variance away.
// dw, db: column sums of dy * xhat and dy over the rows, in two launches like reduce.cu's:
// fp32 partials per chunk of rows, then the chunks added in order to the gradients.
#include "models/cuda/common.cuh"

namespace zero::models::kernels {

namespace {

using namespace detail;

constexpr unsigned kRowWarps = 4;  // rows per block
constexpr unsigned kRowThreads = kRowWarps * kWarp;
constexpr unsigned kColThreads = 256;
constexpr float kEps = 1e-5f;

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(T* y, float* __restrict__ mean, float* __restrict__ rstd, const T* x,
                             const T* __restrict__ w, const T* __restrict__ b, int64_t rows,
                             int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves; no block-wide synchronisation below
  const unsigned lane = threadIdx.x % kWarp;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  float sum = 0.0f;
  for (int64_t c = lane; c < C; c += kWarp) sum += widen(xr[c]);
  const float m = warp_sum(sum) / float(C);
  float sq = 0.0f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float d = widen(xr[c]) - m;
    sq += d * d;
  }
  const float var = warp_sum(sq) / float(C);
  const float rs = 1.0f / sqrtf(var + kEps);
  // Each lane reads x[c] before it writes y[c]: y may alias x.
  for (int64_t c = lane; c < C; c += kWarp)
    yr[c] = narrow<T>((widen(xr[c]) - m) * rs * widen(w[c]) + widen(b[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * w.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_dx_kernel(T* dx, const T* dy, const T* __restrict__ x, const T* __restrict__ w,
                        const float* __restrict__ mean, const float* __restrict__ rstd,
                        int64_t rows, int64_t C) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (row >= rows) return;
  const unsigned lane = threadIdx.x % kWarp;
  const T* xr = x + row * C;
  const T* dyr = dy + row * C;
  T* dxr = dx + row * C;
  const float m = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float g = widen(dyr[c]) * widen(w[c]);
    sum_g += g;
    sum_gx += g * ((widen(xr[c]) - m) * rs);
  }
  const float mean_g = warp_sum(sum_g) / float(C);
  const float mean_gx = warp_sum(sum_gx) / float(C);
  // Each lane reads dy[c] before it writes dx[c]: dx may alias dy.
  for (int64_t c = lane; c < C; c += kWarp) {
    const float xhat = (widen(xr[c]) - m) * rs;
    const float g = widen(dyr[c]) * widen(w[c]);
    dxr[c] = narrow<T>(rs * (g - mean_g - xhat * mean_gx));
  }
}

// Block (x, p): the partial sums of dy * xhat and dy over the rows of chunk p.
template <class T>
__global__ void __launch_bounds__(kColThreads)
    layernorm_param_partials_kernel(float* __restrict__ dw_part, float* __restrict__ db_part,
                                    const T* __restrict__ dy, const T* __restrict__ x,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    int64_t rows, int64_t C, int64_t rows_per) {
  const int64_t c = int64_t(blockIdx.x) * kColThreads + threadIdx.x;
  if (c >= C) return;
  const int64_t p = blockIdx.y;
  const int64_t r1 = (p + 1) * rows_per < rows ? (p + 1) * rows_per : rows;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = p * rows_per; r < r1; ++r) {
    const float g = widen(dy[r * C + c]);
    sw += g * ((widen(x[r * C + c]) - mean[r]) * rstd[r]);
    sb += g;
  }
  dw_part[p * C + c] = sw;
  db_part[p * C + c] = sb;
}

int64_t parts_for(int64_t rows) {
  const int64_t per = rows_per_part(rows);
  return (rows + per - 1) / per;
}

}  // namespace

void layernorm_forward(DType a, void* y, float* mean, float* rstd, const void* x, const void* w,
                       const void* b, int64_t rows, int64_t C, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch(a, [&](auto ta) {
    using T = typename decltype(ta)::type;
    layernorm_forward_kernel<T><<<ceil_div(rows, kRowWarps), kRowThreads, 0, stream>>>(
        static_cast<T*>(y), mean, rstd, static_cast<const T*>(x), static_cast<const T*>(w),
        static_cast<const T*>(b), rows, C);
    check_launch("layernorm_forward_kernel", a);
  });
}

size_t layernorm_backward_workspace(int64_t rows, int64_t C) {
  return 2 * align_up(size_t(parts_for(rows)) * size_t(C) * sizeof(float));
}

void layernorm_backward(DType a, DType g_w, DType g_b, void* dx, void* dw, void* db, const void* dy,
                        const void* x, const void* w, const float* mean, const float* rstd,
                        int64_t rows, int64_t C, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  if (rows == 0 || C == 0) return;
  const int64_t rows_per = rows_per_part(rows);
  const int64_t parts = parts_for(rows);
  Carver carve(workspace, workspace_bytes);
  float* dw_part = carve.take<float>(size_t(parts * C));
  float* db_part = carve.take<float>(size_t(parts * C));
  dispatch(a, [&](auto ta) {
    using T = typename decltype(ta)::type;
    // The partials read dy before dx is written, in stream order: dx may alias dy.
    const dim3 grid(ceil_div(C, kColThreads), unsigned(parts));
    layernorm_param_partials_kernel<T>
        <<<grid, kColThreads, 0, stream>>>(dw_part, db_part, static_cast<const T*>(dy),
                                           static_cast<const T*>(x), mean, rstd, rows, C, rows_per);
    check_launch("layernorm_param_partials_kernel", a);
    layernorm_dx_kernel<T><<<ceil_div(rows, kRowWarps), kRowThreads, 0, stream>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x),
        static_cast<const T*>(w), mean, rstd, rows, C);
    check_launch("layernorm_dx_kernel", a);
  });
  detail::add_column_partials(g_w, dw, dw_part, parts, C, stream);
  detail::add_column_partials(g_b, db, db_part, parts, C, stream);
}

}  // namespace zero::models::kernels
