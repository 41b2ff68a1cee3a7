#include "core/dtype.hpp"

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

// acc[i] += widen(x[i]) in one pass, blocked like convert_loop (accumulate_widened).
template <class Src>
void add_loop(float* acc, const void* src, size_t n) {
  const Src* __restrict s = static_cast<const Src*>(src);
  float* __restrict a = acc;
  const size_t bulk = n - n % kBlock;
  for (size_t i = 0; i < bulk; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) a[i + j] += to_float(s[i + j]);
  }
  for (size_t i = bulk; i < n; ++i) a[i] += to_float(s[i]);
}
ZERO_SIMD_CLONES void add_f32(float* acc, const void* s, size_t n) { add_loop<float>(acc, s, n); }
ZERO_SIMD_CLONES void add_f16(float* acc, const void* s, size_t n) { add_loop<half>(acc, s, n); }
ZERO_SIMD_CLONES void add_bf16(float* acc, const void* s, size_t n) { add_loop<bfloat16>(acc, s, n); }

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
  switch (t) {
    case DType::f32: return add_f32(acc, x, n);
    case DType::f16: return add_f16(acc, x, n);
    case DType::bf16: return add_bf16(acc, x, n);
  }
}

}  // namespace zero
