// The generic path of models/cpu/elementwise.hpp: V is 16 floats and each operation a loop over
// them, which the compiler vectorises for the build's baseline ISA (SSE2 on x86-64). The
// reference the vector paths are tested against, and the path of CPUs without AVX2.
#include <bit>
#include <cstdint>

#include "models/cpu/elementwise_simd.hpp"

#define ZERO_EW_TARGET
#define ZERO_EW_VI __attribute__((always_inline)) inline
#define ZERO_EW_NS generic

namespace zero::models::cpu::elementwise::generic {
namespace {

struct V {
  float v[16];
};

ZERO_EW_VI V vload(const float* p) {
  V r;
  for (int i = 0; i < 16; ++i) r.v[i] = p[i];
  return r;
}
ZERO_EW_VI void vstore(float* p, V a) {
  for (int i = 0; i < 16; ++i) p[i] = a.v[i];
}
ZERO_EW_VI V vset(float x) {
  V r;
  for (float& e : r.v) e = x;
  return r;
}
#define ZERO_EW_LANEWISE(name, expr)                 \
  ZERO_EW_VI V name(V a, V b) {                      \
    V r;                                             \
    for (int i = 0; i < 16; ++i) r.v[i] = (expr);    \
    return r;                                        \
  }
ZERO_EW_LANEWISE(vadd, a.v[i] + b.v[i])
ZERO_EW_LANEWISE(vsub, a.v[i] - b.v[i])
ZERO_EW_LANEWISE(vmul, a.v[i] * b.v[i])
ZERO_EW_LANEWISE(vdiv, a.v[i] / b.v[i])
// x86's maxps / minps: the second operand unless the comparison holds (NaN included).
ZERO_EW_LANEWISE(vmax, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
ZERO_EW_LANEWISE(vmin, a.v[i] < b.v[i] ? a.v[i] : b.v[i])
#undef ZERO_EW_LANEWISE

// The fixed tree: lanes i and i+8, then i and i+4, i and i+2, 0 and 1.
ZERO_EW_VI float vhsum(V a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a.v[i] = a.v[i] + a.v[i + w];
  return a.v[0];
}
ZERO_EW_VI float vhmax(V a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a.v[i] = a.v[i] > a.v[i + w] ? a.v[i] : a.v[i + w];
  return a.v[0];
}
// n is integral in [-126, 127] (exp's clamp), or NaN, whose result is NaN whatever this gives.
ZERO_EW_VI V vpow2i(V n) {
  V r;
  for (int i = 0; i < 16; ++i) {
    const float x = n.v[i] == n.v[i] ? n.v[i] : 0.0f;
    r.v[i] = std::bit_cast<float>((static_cast<int32_t>(x) + 127) << 23);
  }
  return r;
}

}  // namespace
}  // namespace zero::models::cpu::elementwise::generic

#include "models/cpu/elementwise_body.hpp"

namespace zero::models::cpu::elementwise::detail {
const Table& table_generic() { return generic::table(); }
}  // namespace zero::models::cpu::elementwise::detail
