// Column sums in a fixed order (bias gradients, and the finisher the layernorm parameter
// gradients share) and the "+=" of an fp32 contribution into a gradient.
//
// A column sum over many rows runs in two launches, with no atomics: first, block (x, p) sums
// the rows of chunk p for 256 consecutive columns, one column per thread, rows in order, into
// partials[p, :]; then one thread per column adds the partials in chunk order to the gradient.
// The chunk length is a function of the row count only, so the order never changes.
#include "models/cuda/common.cuh"

namespace zero::models::kernels {

namespace detail {

namespace {

constexpr unsigned kColThreads = 256;
constexpr int64_t kMinRowsPerPart = 64;
constexpr int64_t kMaxParts = 1024;

template <class G>
__global__ void __launch_bounds__(kColThreads)
    add_column_partials_kernel(G* __restrict__ grad, const float* __restrict__ partials,
                               int64_t parts, int64_t cols) {
  const int64_t c = int64_t(blockIdx.x) * kColThreads + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t p = 0; p < parts; ++p) sum += partials[p * cols + c];
  grad[c] = narrow<G>(widen(grad[c]) + sum);
}

}  // namespace

int64_t rows_per_part(int64_t rows) {
  return std::max(kMinRowsPerPart, (rows + kMaxParts - 1) / kMaxParts);
}

void add_column_partials(DType g, void* grad, const float* partials, int64_t parts, int64_t cols,
                         cudaStream_t stream) {
  if (cols == 0) return;
  dispatch(g, [&](auto tg) {
    using G = typename decltype(tg)::type;
    add_column_partials_kernel<G><<<ceil_div(cols, kColThreads), kColThreads, 0, stream>>>(
        static_cast<G*>(grad), partials, parts, cols);
    check_launch("add_column_partials_kernel", g);
  });
}

}  // namespace detail

namespace {

using namespace detail;

template <class T>
__global__ void __launch_bounds__(kColThreads)
    column_partials_kernel(float* __restrict__ partials, const T* __restrict__ x, int64_t rows,
                           int64_t cols, int64_t rows_per) {
  const int64_t c = int64_t(blockIdx.x) * kColThreads + threadIdx.x;
  if (c >= cols) return;
  const int64_t p = blockIdx.y;
  const int64_t r1 = (p + 1) * rows_per < rows ? (p + 1) * rows_per : rows;
  float sum = 0.0f;
  for (int64_t r = p * rows_per; r < r1; ++r) sum += widen(x[r * cols + c]);
  partials[p * cols + c] = sum;
}

template <class G>
__global__ void add_f32_kernel(G* __restrict__ grad, const float* __restrict__ contribution,
                               size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    grad[i] = narrow<G>(widen(grad[i]) + contribution[i]);
}

}  // namespace

size_t column_sums_workspace(int64_t rows, int64_t cols) {
  const int64_t parts = (rows + rows_per_part(rows) - 1) / rows_per_part(rows);
  return align_up(size_t(parts) * size_t(cols) * sizeof(float));
}

void add_column_sums(DType a, DType g, void* grad, const void* x, int64_t rows, int64_t cols,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;  // adds nothing
  const int64_t rows_per = rows_per_part(rows);
  const int64_t parts = (rows + rows_per - 1) / rows_per;
  Carver carve(workspace, workspace_bytes);
  float* partials = carve.take<float>(size_t(parts * cols));
  dispatch_grad(a, g, [&](auto ta, auto) {
    using T = typename decltype(ta)::type;
    const dim3 grid(ceil_div(cols, kColThreads), unsigned(parts));
    column_partials_kernel<T><<<grid, kColThreads, 0, stream>>>(partials, static_cast<const T*>(x),
                                                                rows, cols, rows_per);
    check_launch("column_partials_kernel", a);
  });
  add_column_partials(g, grad, partials, parts, cols, stream);
}

void add_f32(DType g, void* grad, const float* contribution, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr unsigned kThreads = 256;
  dispatch(g, [&](auto tg) {
    using G = typename decltype(tg)::type;
    add_f32_kernel<G>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<G*>(grad), contribution, n);
    check_launch("add_f32_kernel", g);
  });
}

}  // namespace zero::models::kernels
