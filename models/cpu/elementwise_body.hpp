// The leaf kernels of models/cpu/elementwise.cpp, written once against a 16-lane vector type and
// compiled once per ISA: elementwise_<isa>.cpp defines, in namespace ZERO_EW_NS, the type V and
// its operations (always inlined, with the ISA's target attribute ZERO_EW_TARGET):
//   vload, vstore (unaligned), vset (broadcast), vadd, vsub, vmul, vdiv,
//   vmax(a, b) = a > b ? a : b and vmin(a, b) = a < b ? a : b (x86's maxps / minps, NaN rule
//   included: the second operand when unordered), vhsum (the fixed tree of elementwise.hpp),
//   vhmax, vpow2i (2^n for integral n in [-126, 127]),
// then includes this file. No include guard: it is meant to be included once per ISA. Helpers
// taking V are ZERO_EW_VI (forced inline, with the target): a V passed through memory to an
// out-of-line call would cost more than the arithmetic.
//
// Why the results are the same bits on every ISA: see elementwise.hpp. Row tails are one padded
// vector (pad_load / pad_store / keep_first) so that no path has a scalar epilogue of its own.
// No lambdas here: g++ does not give a lambda its enclosing function's target attribute.

#include <cmath>
#include <cstdint>
#include <limits>

#include "models/cpu/elementwise_simd.hpp"

namespace zero::models::cpu::elementwise::ZERO_EW_NS {
namespace {

constexpr int64_t kL = 16;  // lanes

// The first r (< 16) elements of p, the other lanes `pad`.
ZERO_EW_VI V pad_load(const float* p, int64_t r, float pad) {
  alignas(64) float buf[kL];
  for (int64_t i = 0; i < kL; ++i) buf[i] = i < r ? p[i] : pad;
  return vload(buf);
}
ZERO_EW_VI void pad_store(float* p, V v, int64_t r) {
  alignas(64) float buf[kL];
  vstore(buf, v);
  for (int64_t i = 0; i < r; ++i) p[i] = buf[i];
}
// v with lanes r.. set to +0 (a tail's terms that must not count in a sum).
ZERO_EW_VI V keep_first(V v, int64_t r) {
  alignas(64) float buf[kL];
  vstore(buf, v);
  for (int64_t i = r; i < kL; ++i) buf[i] = 0.0f;
  return vload(buf);
}

// detail::exp_fast on 16 lanes, the same operations in the same order. The clamps put the data
// second so that a NaN stays NaN.
ZERO_EW_VI V vexp(V x) {
  x = vmin(vset(88.0f), vmax(vset(-87.0f), x));
  const V shifter = vset(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const V n = vsub(vadd(vmul(x, vset(1.44269504088896341f)), shifter), shifter);
  const V r = vadd(vsub(x, vmul(n, vset(0.693359375f))), vmul(n, vset(2.12194440e-4f)));
  V p = vset(1.0f / 5040.0f);
  p = vadd(vmul(p, r), vset(1.0f / 720.0f));
  p = vadd(vmul(p, r), vset(1.0f / 120.0f));
  p = vadd(vmul(p, r), vset(1.0f / 24.0f));
  p = vadd(vmul(p, r), vset(1.0f / 6.0f));
  p = vadd(vmul(p, r), vset(0.5f));
  p = vadd(vmul(p, r), vset(1.0f));
  p = vadd(vmul(p, r), vset(1.0f));
  return vmul(p, vpow2i(n));
}

// GPT-2's constants: sqrt(2 / pi) and the cubic coefficient (as kernels.cpp).
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// GELU as v * s, s = 1 / (1 + e^(-2u)): the logistic form of 0.5 (1 + tanh u), one exp.
ZERO_EW_VI V gelu_v(V v) {
  const V cube = vmul(vmul(vmul(vset(kGeluCubic), v), v), v);
  const V u = vmul(vset(kGeluScale), vadd(v, cube));
  return vdiv(v, vadd(vset(1.0f), vexp(vmul(vset(-2.0f), u))));
}
// dy * (s + 2 v s (1 - s) du/dv), 1 - tanh^2 = 4 s (1 - s).
ZERO_EW_VI V gelu_grad_v(V dy, V v) {
  const V cube = vmul(vmul(vmul(vset(kGeluCubic), v), v), v);
  const V s = vdiv(vset(1.0f),
                   vadd(vset(1.0f), vexp(vmul(vset(-2.0f * kGeluScale), vadd(v, cube)))));
  const V du = vmul(vset(kGeluScale), vadd(vset(1.0f), vmul(vmul(vset(3 * kGeluCubic), v), v)));
  const V t = vmul(vmul(vmul(vmul(vset(2.0f), v), s), vsub(vset(1.0f), s)), du);
  return vmul(dy, vadd(s, t));
}

ZERO_EW_TARGET void gelu_forward(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kL <= n; i += kL) vstore(y + i, gelu_v(vload(x + i)));
  if (i < n) pad_store(y + i, gelu_v(pad_load(x + i, n - i, 0.0f)), n - i);
}

ZERO_EW_TARGET void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kL <= n; i += kL) vstore(dx + i, gelu_grad_v(vload(dy + i), vload(x + i)));
  if (i < n)
    pad_store(dx + i, gelu_grad_v(pad_load(dy + i, n - i, 0.0f), pad_load(x + i, n - i, 0.0f)),
              n - i);
}

ZERO_EW_TARGET void add(float* out, const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  for (; i + kL <= n; i += kL) vstore(out + i, vadd(vload(a + i), vload(b + i)));
  if (i < n)
    pad_store(out + i, vadd(pad_load(a + i, n - i, 0.0f), pad_load(b + i, n - i, 0.0f)), n - i);
}

ZERO_EW_TARGET float row_sum(const float* x, int64_t n) {
  V acc = vset(0.0f);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) acc = vadd(acc, vload(x + i));
  if (i < n) acc = vadd(acc, pad_load(x + i, n - i, 0.0f));
  return vhsum(acc);
}

// sum of (x - m)^2; the tail padded with m, whose term is exactly 0.
ZERO_EW_TARGET float row_sq_dev(const float* x, float m, int64_t n) {
  const V mv = vset(m);
  V acc = vset(0.0f);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    const V d = vsub(vload(x + i), mv);
    acc = vadd(acc, vmul(d, d));
  }
  if (i < n) {
    const V d = vsub(pad_load(x + i, n - i, m), mv);
    acc = vadd(acc, vmul(d, d));
  }
  return vhsum(acc);
}

ZERO_EW_VI V layernorm_v(V x, V m, V s, V w, V b) {
  return vadd(vmul(vmul(vsub(x, m), s), w), b);
}

ZERO_EW_TARGET void layernorm_forward_row(float* y, float* mean, float* rstd, const float* x,
                                          const float* w, const float* b, int64_t C) {
  const float m = row_sum(x, C) / float(C);
  const float s = 1.0f / std::sqrt(row_sq_dev(x, m, C) / float(C) + 1e-5f);
  const V mv = vset(m), sv = vset(s);
  int64_t i = 0;
  for (; i + kL <= C; i += kL)
    vstore(y + i, layernorm_v(vload(x + i), mv, sv, vload(w + i), vload(b + i)));
  if (i < C) {
    const int64_t r = C - i;
    pad_store(y + i,
              layernorm_v(pad_load(x + i, r, 0.0f), mv, sv, pad_load(w + i, r, 0.0f),
                          pad_load(b + i, r, 0.0f)),
              r);
  }
  *mean = m;
  *rstd = s;
}

// One vector of the backward's first pass: g = dy * w into sum_g, g * (x - m) * s into sum_gx.
ZERO_EW_VI void layernorm_sums_v(V dy, V x, V w, V m, V s, V& sg, V& sgx) {
  const V g = vmul(dy, w);
  sg = vadd(sg, g);
  sgx = vadd(sgx, vmul(vmul(g, vsub(x, m)), s));
}

// dx = s * (dy * w - mg - (x - m) * s * mgx); dw += dy * ((x - m) * s); db += dy.
ZERO_EW_VI V layernorm_dx_v(V dy, V x, V w, V m, V s, V mg, V mgx, float* dw,
                                       float* db, int64_t r) {
  const V xhat = vmul(vsub(x, m), s);
  const V dx = vmul(s, vsub(vsub(vmul(dy, w), mg), vmul(xhat, mgx)));
  if (r == kL) {
    vstore(dw, vadd(vload(dw), vmul(dy, xhat)));
    vstore(db, vadd(vload(db), dy));
  } else {
    pad_store(dw, vadd(pad_load(dw, r, 0.0f), vmul(dy, xhat)), r);
    pad_store(db, vadd(pad_load(db, r, 0.0f), dy), r);
  }
  return dx;
}

ZERO_EW_TARGET void layernorm_backward_row(float* dx, float* dw_acc, float* db_acc,
                                           const float* dy, const float* x, const float* w,
                                           float mean, float rstd, int64_t C) {
  const V m = vset(mean), s = vset(rstd);
  V sg = vset(0.0f), sgx = vset(0.0f);
  int64_t i = 0;
  for (; i + kL <= C; i += kL)
    layernorm_sums_v(vload(dy + i), vload(x + i), vload(w + i), m, s, sg, sgx);
  const int64_t r = C - i;
  // The tail's dy padded with 0 makes g and its terms exactly 0.
  if (r > 0)
    layernorm_sums_v(pad_load(dy + i, r, 0.0f), pad_load(x + i, r, 0.0f),
                     pad_load(w + i, r, 0.0f), m, s, sg, sgx);
  const V mg = vset(vhsum(sg) / float(C)), mgx = vset(vhsum(sgx) / float(C));
  for (i = 0; i + kL <= C; i += kL)
    vstore(dx + i, layernorm_dx_v(vload(dy + i), vload(x + i), vload(w + i), m, s, mg, mgx,
                                  dw_acc + i, db_acc + i, kL));
  if (r > 0)
    pad_store(dx + i,
              layernorm_dx_v(pad_load(dy + i, r, 0.0f), pad_load(x + i, r, 0.0f),
                             pad_load(w + i, r, 0.0f), m, s, mg, mgx, dw_acc + i, db_acc + i, r),
              r);
}

ZERO_EW_TARGET float row_max(const float* x, int64_t n) {
  V acc = vset(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kL <= n; i += kL) acc = vmax(vload(x + i), acc);
  if (i < n) acc = vmax(pad_load(x + i, n - i, -std::numeric_limits<float>::infinity()), acc);
  return vhmax(acc);
}

ZERO_EW_TARGET float exp_sum(float* out, const float* x, float shift, int64_t n) {
  const V sh = vset(shift);
  V acc = vset(0.0f);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    const V e = vexp(vsub(vload(x + i), sh));
    if (out) vstore(out + i, e);
    acc = vadd(acc, e);
  }
  if (i < n) {
    const V e = keep_first(vexp(vsub(pad_load(x + i, n - i, shift), sh)), n - i);
    if (out) pad_store(out + i, e, n - i);
    acc = vadd(acc, e);
  }
  return vhsum(acc);
}

ZERO_EW_TARGET void scale(float* d, float inv, float f, int64_t n) {
  const V iv = vset(inv), fv = vset(f);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) vstore(d + i, vmul(fv, vmul(vload(d + i), iv)));
  if (i < n) pad_store(d + i, vmul(fv, vmul(pad_load(d + i, n - i, 0.0f), iv)), n - i);
}

ZERO_EW_TARGET float dot(const float* a, const float* b, int64_t n) {
  V acc = vset(0.0f);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) acc = vadd(acc, vmul(vload(a + i), vload(b + i)));
  if (i < n) acc = vadd(acc, vmul(pad_load(a + i, n - i, 0.0f), pad_load(b + i, n - i, 0.0f)));
  return vhsum(acc);
}

ZERO_EW_TARGET void softmax_backward(float* d, const float* p, float dt, int64_t n) {
  const V dv = vset(dt);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) vstore(d + i, vmul(vload(p + i), vsub(vload(d + i), dv)));
  if (i < n)
    pad_store(d + i, vmul(pad_load(p + i, n - i, 0.0f), vsub(pad_load(d + i, n - i, 0.0f), dv)),
              n - i);
}

}  // namespace

const detail::Table& table() {
  static const detail::Table t{gelu_forward, gelu_backward, add,   layernorm_forward_row,
                               layernorm_backward_row, row_max, exp_sum, scale, dot,
                               softmax_backward};
  return t;
}

}  // namespace zero::models::cpu::elementwise::ZERO_EW_NS
