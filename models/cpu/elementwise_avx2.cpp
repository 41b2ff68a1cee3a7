// The AVX2 path of models/cpu/elementwise.hpp: V is two __m256 (lanes 0-7 and 8-15), so that
// sums keep the 16 partials of the other paths. Runs only when the CPU has AVX2.
#include "models/cpu/elementwise_simd.hpp"

#if ZERO_ELEMENTWISE_X86
#include <immintrin.h>

#define ZERO_EW_TARGET __attribute__((target("avx2")))
#define ZERO_EW_VI __attribute__((target("avx2"), always_inline)) inline
#define ZERO_EW_NS avx2

namespace zero::models::cpu::elementwise::avx2 {
namespace {

struct V {
  __m256 lo, hi;
};

ZERO_EW_VI V vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
ZERO_EW_VI void vstore(float* p, V v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
ZERO_EW_VI V vset(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
ZERO_EW_VI V vadd(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
ZERO_EW_VI V vsub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
ZERO_EW_VI V vmul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
ZERO_EW_VI V vdiv(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
ZERO_EW_VI V vmax(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
ZERO_EW_VI V vmin(V a, V b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
// The fixed tree: lanes i and i+8 (lo + hi), then i and i+4, i and i+2, 0 and 1.
ZERO_EW_VI float vhsum(V v) {
  const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
ZERO_EW_VI float vhmax(V v) {
  const __m256 s8 = _mm256_max_ps(v.lo, v.hi);
  const __m128 s4 = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_max_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
ZERO_EW_VI __m256 pow2i(__m256 n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
ZERO_EW_VI V vpow2i(V n) { return {pow2i(n.lo), pow2i(n.hi)}; }

}  // namespace
}  // namespace zero::models::cpu::elementwise::avx2

#include "models/cpu/elementwise_body.hpp"

namespace zero::models::cpu::elementwise::detail {
const Table& table_avx2() { return avx2::table(); }
}  // namespace zero::models::cpu::elementwise::detail

#endif
