#include "core/dtype.hpp"

#include <algorithm>
#include <cstring>

namespace zero {

std::optional<DType> parse_dtype(std::string_view s) noexcept {
  if (s == "fp32" || s == "float32" || s == "float") return DType::f32;
  if (s == "fp16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  return std::nullopt;
}

namespace {

// g++ -O2 (GCC 12's "very cheap" vectoriser cost model) vectorises only loops whose trip count
// is a known multiple of the vector width and that need no runtime alias checks. So the bulk of
// every conversion runs in fixed blocks of kBlock elements through restrict pointers, and only
// the last n % kBlock elements take the scalar tail.
constexpr size_t kBlock = 16;

template <class Src, class Dst, class Fn>
void convert_loop(const void* src, void* dst, size_t n, Fn fn) {
  const Src* __restrict s = static_cast<const Src*>(src);
  Dst* __restrict d = static_cast<Dst*>(dst);
  const size_t bulk = n - n % kBlock;
  for (size_t i = 0; i < bulk; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) d[i + j] = fn(s[i + j]);
  }
  for (size_t i = bulk; i < n; ++i) d[i] = fn(s[i]);
}

// fp16 <-> bf16: widen a block to fp32 (exact), then narrow it (rounded once), giving the same
// bits as to_bfloat16(half) / to_half(bfloat16). Two loops, because g++ will not vectorise one
// loop that goes 16 -> 32 -> 16 bits with a float operation in the middle.
template <class Src, class Dst, class Widen, class Narrow>
void convert_via_f32(const void* src, void* dst, size_t n, Widen widen, Narrow narrow) {
  const Src* __restrict s = static_cast<const Src*>(src);
  Dst* __restrict d = static_cast<Dst*>(dst);
  const size_t bulk = n - n % kBlock;
  for (size_t i = 0; i < bulk; i += kBlock) {
    float tmp[kBlock];
    for (size_t j = 0; j < kBlock; ++j) tmp[j] = widen(s[i + j]);
    for (size_t j = 0; j < kBlock; ++j) d[i + j] = narrow(tmp[j]);
  }
  for (size_t i = bulk; i < n; ++i) d[i] = narrow(widen(s[i]));
}

// One entry point per conversion, each compiled several times (x86-64 baseline, AVX2, AVX-512)
// and chosen at load time for the CPU it runs on (GCC function multi-versioning through ifunc),
// so a binary built on one host runs on any other, using the widest vectors that host has.
// `flatten` inlines the loop into each clone (otherwise every clone calls one baseline copy).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define ZERO_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), flatten))
#else
#define ZERO_SIMD_CLONES
#endif

ZERO_SIMD_CLONES void f32_to_f16(const void* s, void* d, size_t n) {
  convert_loop<float, half>(s, d, n, [](float x) { return to_half(x); });
}
ZERO_SIMD_CLONES void f32_to_bf16(const void* s, void* d, size_t n) {
  convert_loop<float, bfloat16>(s, d, n, [](float x) { return to_bfloat16(x); });
}
ZERO_SIMD_CLONES void f16_to_f32(const void* s, void* d, size_t n) {
  convert_loop<half, float>(s, d, n, [](half x) { return to_float(x); });
}
ZERO_SIMD_CLONES void bf16_to_f32(const void* s, void* d, size_t n) {
  convert_loop<bfloat16, float>(s, d, n, [](bfloat16 x) { return to_float(x); });
}
ZERO_SIMD_CLONES void f16_to_bf16(const void* s, void* d, size_t n) {
  convert_via_f32<half, bfloat16>(
      s, d, n, [](half x) { return to_float(x); }, [](float x) { return to_bfloat16(x); });
}
ZERO_SIMD_CLONES void bf16_to_f16(const void* s, void* d, size_t n) {
  convert_via_f32<bfloat16, half>(
      s, d, n, [](bfloat16 x) { return to_float(x); }, [](float x) { return to_half(x); });
}

}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (n == 0) return;
  if (src_type == dst_type) {
    if (src != dst) std::memcpy(dst, src, n * size_of(src_type));
    return;
  }
  switch (src_type) {
    case DType::f32:
      return dst_type == DType::f16 ? f32_to_f16(src, dst, n) : f32_to_bf16(src, dst, n);
    case DType::f16:
      return dst_type == DType::f32 ? f16_to_f32(src, dst, n) : f16_to_bf16(src, dst, n);
    case DType::bf16:
      return dst_type == DType::f32 ? bf16_to_f32(src, dst, n) : bf16_to_f16(src, dst, n);
  }
}

void accumulate_widened(float* acc, const void* x, DType t, size_t n) {
  constexpr size_t kWiden = 1024;  // 4 KiB of fp32: stays in L1 next to acc's block
  const size_t es = size_of(t);
  float widened[kWiden];
  for (size_t b = 0; b < n; b += kWiden) {
    const size_t m = std::min(kWiden, n - b);
    const float* __restrict w = widened;
    if (t == DType::f32) {
      w = static_cast<const float*>(x) + b;
    } else {
      convert(static_cast<const unsigned char*>(x) + b * es, t, widened, DType::f32, m);
    }
    float* __restrict a = acc + b;
    const size_t bulk = m - m % kBlock;
    for (size_t i = 0; i < bulk; i += kBlock)
      for (size_t j = 0; j < kBlock; ++j) a[i + j] += w[i + j];
    for (size_t i = bulk; i < m; ++i) a[i] += w[i];
  }
}

}  // namespace zero
