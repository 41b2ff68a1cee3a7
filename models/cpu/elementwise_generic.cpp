// The generic path of models/cpu/elementwise.hpp: V is four 4-float GCC vectors, which the
// compiler maps onto the baseline ISA's 128-bit registers (SSE2 on x86-64, NEON on Arm); a
// 16-float GCC vector would not do, as g++ splits its compares and selects into scalar code.
// The path of CPUs without AVX2, and the reference the vector paths are tested against.
#include <cstdint>

#include "models/cpu/elementwise_simd.hpp"

#define ZERO_EW_TARGET
#define ZERO_EW_VI __attribute__((always_inline)) inline
#define ZERO_EW_NS generic

namespace zero::models::cpu::elementwise::generic {
namespace {

using Q = float __attribute__((vector_size(16)));
using QI = int32_t __attribute__((vector_size(16)));
struct V {
  Q q[4];  // lanes 4k .. 4k+3 in q[k]
};

// Written out four times, not as a loop: g++ -O2 keeps a loop over the parts and routes every
// part through the stack.
#define ZERO_EW_EACH(expr)     \
  V r;                         \
  {                            \
    constexpr int k = 0;       \
    r.q[k] = expr;             \
  }                            \
  {                            \
    constexpr int k = 1;       \
    r.q[k] = expr;             \
  }                            \
  {                            \
    constexpr int k = 2;       \
    r.q[k] = expr;             \
  }                            \
  {                            \
    constexpr int k = 3;       \
    r.q[k] = expr;             \
  }                            \
  return r

// Unaligned, may-alias access to 4 floats.
using QU = float __attribute__((vector_size(16), aligned(4), may_alias));

ZERO_EW_VI V vload(const float* p) { ZERO_EW_EACH(*reinterpret_cast<const QU*>(p + 4 * k)); }
ZERO_EW_VI void vstore(float* p, V a) {
  QU* q = reinterpret_cast<QU*>(p);
  q[0] = a.q[0];
  q[1] = a.q[1];
  q[2] = a.q[2];
  q[3] = a.q[3];
}
ZERO_EW_VI V vset(float x) { ZERO_EW_EACH(Q{} + x); }
ZERO_EW_VI V vadd(V a, V b) { ZERO_EW_EACH(a.q[k] + b.q[k]); }
ZERO_EW_VI V vsub(V a, V b) { ZERO_EW_EACH(a.q[k] - b.q[k]); }
ZERO_EW_VI V vmul(V a, V b) { ZERO_EW_EACH(a.q[k] * b.q[k]); }
ZERO_EW_VI V vdiv(V a, V b) { ZERO_EW_EACH(a.q[k] / b.q[k]); }
// x86's maxps / minps: the second operand unless the comparison holds (NaN included).
ZERO_EW_VI V vmax(V a, V b) { ZERO_EW_EACH(a.q[k] > b.q[k] ? a.q[k] : b.q[k]); }
ZERO_EW_VI V vmin(V a, V b) { ZERO_EW_EACH(a.q[k] < b.q[k] ? a.q[k] : b.q[k]); }
// 2^n for integral n in [-126, 127] (exp's clamp), or NaN, whose result is NaN whatever this
// gives; NaN lanes are zeroed first so that the conversion is defined.
ZERO_EW_VI Q pow2i(Q n) {
  const Q safe = n == n ? n : Q{};
  const QI e = (__builtin_convertvector(safe, QI) + 127) << 23;
  Q r;
  __builtin_memcpy(&r, &e, sizeof r);
  return r;
}
ZERO_EW_VI V vpow2i(V n) { ZERO_EW_EACH(pow2i(n.q[k])); }
#undef ZERO_EW_EACH

// The fixed tree: lanes i and i+8, then i and i+4, i and i+2, 0 and 1.
ZERO_EW_VI float vhsum(V a) {
  alignas(64) float b[16];
  vstore(b, a);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) b[i] = b[i] + b[i + w];
  return b[0];
}
ZERO_EW_VI float vhmax(V a) {
  alignas(64) float b[16];
  vstore(b, a);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) b[i] = b[i] > b[i + w] ? b[i] : b[i + w];
  return b[0];
}

}  // namespace
}  // namespace zero::models::cpu::elementwise::generic

#include "models/cpu/elementwise_body.hpp"

namespace zero::models::cpu::elementwise::detail {
const Table& table_generic() { return generic::table(); }
}  // namespace zero::models::cpu::elementwise::detail
