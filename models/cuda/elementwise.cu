// Elementwise kernels: bias broadcast, GELU and its gradient, add, accumulate. Grid-stride loops
// with size_t indices; each element is read and written by one thread only, so an output may
// alias an input of the same call. Arithmetic in fp32, one rounding per stored result.
#include "models/cuda/common.cuh"

namespace zero::models::kernels {

namespace {

using namespace detail;

constexpr unsigned kThreads = 256;
// GPT-2's GELU, the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

template <class T>
__global__ void fill_rows_kernel(T* __restrict__ y, const T* __restrict__ b, size_t n,
                                 size_t cols) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = b[i % cols];
}

template <class T>
__global__ void gelu_forward_kernel(T* y, const T* x, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = widen(x[i]);
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    y[i] = narrow<T>(0.5f * v * (1.0f + tanhf(u)));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* dx, const T* dy, const T* x, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = widen(x[i]);
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    const float t = tanhf(u);
    // d/dv of 0.5 v (1 + tanh u) = 0.5 (1 + t) + 0.5 v (1 - t^2) du/dv.
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    dx[i] = narrow<T>(widen(dy[i]) * grad);
  }
}

template <class T>
__global__ void add_kernel(T* out, const T* x, const T* y, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = narrow<T>(widen(x[i]) + widen(y[i]));
}

template <class F>
void launch(DType a, const char* name, size_t n, F&& f) {
  if (n == 0) return;
  dispatch(a, [&](auto ta) {
    f(ta, grid_for(n, kThreads));
    check_launch(name, a);
  });
}

}  // namespace

void fill_rows(DType a, void* y, const void* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  const size_t n = size_t(rows) * size_t(cols);
  launch(a, "fill_rows_kernel", n, [&](auto ta, unsigned blocks) {
    using T = typename decltype(ta)::type;
    fill_rows_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(y),
                                                         static_cast<const T*>(b), n, size_t(cols));
  });
}

void gelu_forward(DType a, void* y, const void* x, size_t n, cudaStream_t stream) {
  launch(a, "gelu_forward_kernel", n, [&](auto ta, unsigned blocks) {
    using T = typename decltype(ta)::type;
    gelu_forward_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(static_cast<T*>(y), static_cast<const T*>(x), n);
  });
}

void gelu_backward(DType a, void* dx, const void* dy, const void* x, size_t n,
                   cudaStream_t stream) {
  launch(a, "gelu_backward_kernel", n, [&](auto ta, unsigned blocks) {
    using T = typename decltype(ta)::type;
    gelu_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), n);
  });
}

void add(DType a, void* out, const void* x, const void* y, size_t n, cudaStream_t stream) {
  launch(a, "add_kernel", n, [&](auto ta, unsigned blocks) {
    using T = typename decltype(ta)::type;
    add_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(x),
                                                   static_cast<const T*>(y), n);
  });
}

void accumulate(DType a, void* acc, const void* x, size_t n, cudaStream_t stream) {
  // acc = round(acc + x): the add kernel with the output aliasing its first input.
  launch(a, "accumulate_kernel", n, [&](auto ta, unsigned blocks) {
    using T = typename decltype(ta)::type;
    add_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(acc), static_cast<T*>(acc),
                                                   static_cast<const T*>(x), n);
  });
}

}  // namespace zero::models::kernels
