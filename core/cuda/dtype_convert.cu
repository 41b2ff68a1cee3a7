// The dtype conversion kernel: one grid-stride loop per (source, destination) type pair, moving
// four elements per thread and iteration with vector loads and stores when both buffers are
// aligned for them, one at a time otherwise and for the last n % 4.
#include "core/cuda/dtype_convert.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/cuda/checks.hpp"

namespace zero::cuda {

namespace {

constexpr unsigned kThreads = 256;
// Enough blocks to fill any current GPU several times over; beyond that, threads loop.
constexpr size_t kMaxBlocks = 8192;
constexpr size_t kVec = 4;

template <class T>
struct alignas(kVec * sizeof(T)) Pack {
  T v[kVec];
};

// Dispatch on the destination type; the source type picks the overload in dtype.hpp
// (fp16 <-> bf16 go through the exact fp32 value, like the host's convert()).
template <class Dst, class Src>
__device__ __forceinline__ Dst convert_one(Src x) {
  if constexpr (std::is_same_v<Dst, float>) {
    return to_float(x);
  } else if constexpr (std::is_same_v<Dst, half>) {
    return to_half(x);
  } else {
    return to_bfloat16(x);
  }
}

template <class Src, class Dst>
__global__ void convert_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, size_t n,
                               bool vectorised) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = vectorised ? n / kVec : 0;
  const Pack<Src>* src_packs = reinterpret_cast<const Pack<Src>*>(src);
  Pack<Dst>* dst_packs = reinterpret_cast<Pack<Dst>*>(dst);
  for (size_t p = tid; p < packs; p += stride) {
    const Pack<Src> in = src_packs[p];
    Pack<Dst> out;
#pragma unroll
    for (size_t k = 0; k < kVec; ++k) out.v[k] = convert_one<Dst>(in.v[k]);
    dst_packs[p] = out;
  }
  for (size_t i = packs * kVec + tid; i < n; i += stride) dst[i] = convert_one<Dst>(src[i]);
}

bool aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

struct Args {
  const void* src;
  DType src_type;
  void* dst;
  DType dst_type;
  size_t n;
  cudaStream_t stream;
};

template <class Src, class Dst>
void launch(const Args& a) {
  const size_t n = a.n;
  const bool vectorised = aligned(a.src, sizeof(Pack<Src>)) && aligned(a.dst, sizeof(Pack<Dst>));
  const size_t work = vectorised ? n / kVec + n % kVec : n;  // iterations of the busiest loop
  const size_t blocks = std::min((work + kThreads - 1) / kThreads, kMaxBlocks);
  convert_kernel<Src, Dst><<<unsigned(blocks), kThreads, 0, a.stream>>>(
      static_cast<const Src*>(a.src), static_cast<Dst*>(a.dst), n, vectorised);
  // A launch fails synchronously (bad configuration, no device, bad stream); name it by its
  // types, since "cudaGetLastError()" would say nothing about which launch it was.
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    const std::string statement =
        "convert_kernel<" + std::string(to_string(a.src_type)) + ", " +
        std::string(to_string(a.dst_type)) + "><<<" + std::to_string(blocks) + ", " +
        std::to_string(kThreads) + ">>>(n = " + std::to_string(n) + ")";
    detail::throw_cuda(rc, statement.c_str(), __FILE__, __LINE__);
  }
}

}  // namespace

void convert_async(const void* src, DType src_type, void* dst, DType dst_type, size_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  if (src_type == dst_type) {
    ZERO_CHECK_CUDA(
        cudaMemcpyAsync(dst, src, n * size_of(src_type), cudaMemcpyDefault, stream));
    return;
  }
  const Args a{src, src_type, dst, dst_type, n, stream};
  switch (src_type) {
    case DType::f32:
      if (dst_type == DType::f16) return launch<float, half>(a);
      return launch<float, bfloat16>(a);
    case DType::f16:
      if (dst_type == DType::f32) return launch<half, float>(a);
      return launch<half, bfloat16>(a);
    case DType::bf16:
      if (dst_type == DType::f32) return launch<bfloat16, float>(a);
      return launch<bfloat16, half>(a);
  }
}

}  // namespace zero::cuda
