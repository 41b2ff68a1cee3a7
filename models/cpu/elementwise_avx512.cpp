// The AVX-512F path of models/cpu/elementwise.hpp: V is one __m512 (16 lanes). Compiled for any
// x86-64 host; the target attributes confine AVX-512 code to these functions, which run only
// when the CPU has AVX-512F (elementwise.cpp checks at start-up).
#include "models/cpu/elementwise_simd.hpp"

#if ZERO_ELEMENTWISE_X86
#include <immintrin.h>

#define ZERO_EW_TARGET __attribute__((target("avx512f")))
#define ZERO_EW_VI __attribute__((target("avx512f"), always_inline)) inline
#define ZERO_EW_NS avx512

namespace zero::models::cpu::elementwise::avx512 {
namespace {

using V = __m512;
// g++ 12's unmasked forms of some conversions start from _mm512_undefined_*() and trip
// -Wmaybe-uninitialized (GCC PR105593); the zero-masked forms with every lane selected compile
// to the same instructions.
constexpr __mmask16 kAll = 0xffff;

ZERO_EW_VI V vload(const float* p) { return _mm512_loadu_ps(p); }
ZERO_EW_VI void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
ZERO_EW_VI V vset(float x) { return _mm512_set1_ps(x); }
ZERO_EW_VI V vadd(V a, V b) { return _mm512_add_ps(a, b); }
ZERO_EW_VI V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
ZERO_EW_VI V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
ZERO_EW_VI V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
ZERO_EW_VI V vmax(V a, V b) { return _mm512_maskz_max_ps(kAll, a, b); }
ZERO_EW_VI V vmin(V a, V b) { return _mm512_maskz_min_ps(kAll, a, b); }
// The two 256-bit halves through memory: g++ 12's _mm512_castps512_ps256 and extract forms trip
// the same warning, and this runs once per row.
ZERO_EW_VI void halves(V v, __m256& lo, __m256& hi) {
  alignas(64) float buf[16];
  _mm512_store_ps(buf, v);
  lo = _mm256_load_ps(buf);
  hi = _mm256_load_ps(buf + 8);
}
// The fixed tree: lanes i and i+8, then i and i+4, i and i+2, 0 and 1.
ZERO_EW_VI float vhsum(V v) {
  __m256 lo, hi;
  halves(v, lo, hi);
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
ZERO_EW_VI float vhmax(V v) {
  __m256 lo, hi;
  halves(v, lo, hi);
  const __m256 s8 = _mm256_max_ps(lo, hi);
  const __m128 s4 = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_max_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
ZERO_EW_VI V vpow2i(V n) {
  const __m512i e = _mm512_add_epi32(_mm512_maskz_cvttps_epi32(kAll, n), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, e, 23));
}

}  // namespace
}  // namespace zero::models::cpu::elementwise::avx512

#include "models/cpu/elementwise_body.hpp"

namespace zero::models::cpu::elementwise::detail {
const Table& table_avx512() { return avx512::table(); }
}  // namespace zero::models::cpu::elementwise::detail

#endif
