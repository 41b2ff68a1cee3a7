// host_adam.hpp / host_adam.cpp: the host AdamW step against the formula of adam.hpp.
//
// Two references, built differently from the kernel:
//  1. The exact formula, evaluated in double with the exact hyper-parameters (bias corrections
//     from std::pow in double, 1 - beta, lr / bc1, ...), carrying alongside every value a
//     rigorous bound on how far an fp32 evaluation of the same expression, in the same order,
//     can be from it (running error analysis, see `Val`). The kernel must stay within it.
//  2. The fp32 formula in plain scalar code (each operation rounded once, as the header
//     promises), which the kernel must match bit for bit, on every SIMD path, thread count,
//     length, alignment and sub-range.
//
// The ULP bound, and why. One fp32 operation has relative error at most u = 2^-24 (half an ULP,
// and u|x| < 1 ULP of x). From the SAME fp32 state (p, m, v), one AdamW step (adam_w_mode) gives:
//   v:  g = g0*scale (1 rounding), (1-b2)*g*g (2 more, g counted twice, plus (1-b2)'s own
//       rounding), b2*v (1), the sum of two non-negative terms (1): |dv| <= 6u*v, under 6 ULP.
//   m:  b1*m (1), (1-b1)*g (3 with g's and (1-b1)'s), the sum (1): |dm| <= 4u*(|b1 m| +
//       |(1-b1) g|), so at most 4 ULP unless the two terms cancel (then it is absolute, on the
//       scale of the terms).
//   p:  p - decay*p is about 1 rounding of p; the update step*m/denom has relative error about
//       10u (denom: half of v's 6u through sqrt, + sqrt, 1/sqrt(bc2), the multiply and + eps:
//       7u; step_size, the multiply and the divide: 3u) plus m's absolute error times step/denom;
//       the final subtraction 1 more: |dp| <= u(|p after decay| + |p new|) + 2u|decay p| +
//       10u|update| + 4u(|b1 m| + |(1-b1) g|)*step/denom. With lr << 1, about 2 ULP of p.
// Adam with L2 (g += wd*p) can cancel in g too; the running bound covers every mode, so the test
// asserts it everywhere, and the three closed forms above in AdamW mode.
// Over k steps the errors of the fp32 state compound (m and v are contractions, factors b1, b2 <
// 1; p accumulates about 2 ULP per step plus the updates' errors): the multi-step test steps the
// double reference on its own from the same start and carries the bound through all 50 steps.
#pragma GCC optimize("fp-contract=off")  // the fp32 reference must round every operation, too

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "optim/host_adam.hpp"
#include "core/error.hpp"

using namespace zero;
using namespace zero::optim;

// Per-element checks in loops over millions of elements: a plain test, and Catch only on failure
// (REQUIRE and CAPTURE per element would dominate the run time).
#define REQUIRE_AT(cond, where)                                \
  do {                                                         \
    if (!(cond)) FAIL(#cond << " does not hold at " << where); \
  } while (0)

namespace {

constexpr double kU = 0x1p-24;      // fp32 unit roundoff
constexpr double kTiny = 0x1p-150;  // absolute error of a rounding into fp32's subnormal range

// ---- reference 1: exact value in double plus a bound on the fp32 evaluation's error -------------
// x: the exact value of the expression (double's own error, ~1e-16 relative, is covered by the
// slack in `within`). e: a bound on |fp32 evaluation - x|: the inputs' bounds propagated
// (including second-order terms) plus the operation's own rounding, u times the magnitude of the
// rounded result (bounded by |x| + propagated error).
struct Val {
  double x = 0, e = 0;
};
Val rounded(double x, double propagated) {
  return {x, propagated + kU * (std::abs(x) + propagated) + kTiny};
}
Val operator*(Val a, Val b) {
  return rounded(a.x * b.x, std::abs(a.x) * b.e + std::abs(b.x) * a.e + a.e * b.e);
}
Val operator+(Val a, Val b) { return rounded(a.x + b.x, a.e + b.e); }
Val operator-(Val a, Val b) { return rounded(a.x - b.x, a.e + b.e); }
Val operator/(Val a, Val b) {
  if (!(b.e < std::abs(b.x))) FAIL("the divisor's error bound reaches zero");
  const double r = a.x / b.x;
  return rounded(r, (a.e + std::abs(r) * b.e) / (std::abs(b.x) - b.e));
}
Val sqrt(Val a) {
  // |sqrt(a + d) - sqrt(a)| = |d| / (sqrt(a + d) + sqrt(a)) <= min(|d| / sqrt(a), sqrt(|d|))
  const double r = std::sqrt(a.x);
  return rounded(r, a.x > 0 ? std::min(a.e / r, std::sqrt(a.e)) : std::sqrt(a.e));
}
Val exact(double x) { return {x, 0}; }
// A scalar the kernel gets as fp32 though its exact value is a double expression.
Val scalar(float f, double x) { return {x, std::abs(double(f) - x)}; }

// |kernel - exact| within the bound; the slack covers the double evaluation's own rounding.
bool within(float kernel, const Val& ref) {
  return std::abs(double(kernel) - ref.x) <= ref.e * (1 + 1e-9) + 1e-13 * std::abs(ref.x);
}

struct ExactScalars {
  bool adam_w;
  Val beta1, omb1, beta2, omb2, eps, step_size, inv_sqrt_bc2, decay, l2, grad_scale;
};
ExactScalars exact_scalars(const AdamParams& hp, const AdamStep& st) {
  const AdamScalars s = adam_scalars(hp, st);
  const double t = double(st.step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta1), t) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta2), t) : 1.0;
  ExactScalars e;
  e.adam_w = hp.adam_w_mode;
  e.beta1 = exact(hp.beta1);
  e.omb1 = scalar(s.one_minus_beta1, 1.0 - double(hp.beta1));
  e.beta2 = exact(hp.beta2);
  e.omb2 = scalar(s.one_minus_beta2, 1.0 - double(hp.beta2));
  e.eps = exact(hp.eps);
  e.step_size = scalar(s.step_size, double(st.lr) / bc1);
  e.inv_sqrt_bc2 = scalar(s.inv_sqrt_bc2, 1.0 / std::sqrt(bc2));
  e.decay = scalar(s.decay, hp.adam_w_mode ? double(st.lr) * double(hp.weight_decay) : 0.0);
  e.l2 = exact(hp.adam_w_mode ? 0.0 : hp.weight_decay);
  e.grad_scale = exact(st.grad_scale);
  return e;
}

struct RefState {
  Val p, m, v;
  // Magnitudes of the last step, for the closed-form bounds: |b1 m| + |(1-b1) g|, the parameter
  // after the decoupled decay, |decay * p|, the update step*m/denom, and step/denom.
  double m_terms = 0, p1 = 0, decay_p = 0, update = 0, step_over_denom = 0;
};
// The formula of adam.hpp, term for term in its order.
void ref_step(const ExactScalars& c, RefState& s, double grad) {
  Val g = exact(grad) * c.grad_scale;
  if (!c.adam_w) g = g + c.l2 * s.p;
  const Val t1 = c.beta1 * s.m, t2 = c.omb1 * g;
  s.m_terms = std::abs(t1.x) + std::abs(t2.x);
  s.m = t1 + t2;
  s.v = c.beta2 * s.v + c.omb2 * g * g;
  const Val denom = sqrt(s.v) * c.inv_sqrt_bc2 + c.eps;
  s.decay_p = std::abs(c.decay.x * s.p.x);
  if (c.adam_w) s.p = s.p - c.decay * s.p;
  s.p1 = s.p.x;
  const Val update = c.step_size * s.m / denom;
  s.update = update.x;
  s.step_over_denom = c.step_size.x / denom.x;
  s.p = s.p - update;
}

// ---- reference 2: the fp32 formula, plain scalar code -------------------------------------------
void fp32_step(const AdamScalars& s, bool adam_w, float& p, float& m, float& v, float grad) {
  float g = grad * s.grad_scale;
  if (!adam_w) g = g + s.l2 * p;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) * s.inv_sqrt_bc2 + s.eps;
  if (adam_w) p = p - s.decay * p;
  p = p - s.step_size * m / denom;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
bool same(float a, float b) { return bits(a) == bits(b) || (a != a && b != b); }  // NaN ~ NaN

// ---- test data ----------------------------------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: a fixed, portable hash
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double unit(uint64_t h) { return double(h >> 11) * 0x1p-53; }  // [0, 1)

// Gradient of element i at step k: signed, magnitudes log-uniform over 1e-9..3 (the small ones
// keep sqrt(v) near eps, where eps's place in the formula shows), one in 32 zero.
float grad_value(size_t i, int64_t k) {
  const uint64_t h = mix(i * 1000003ull + uint64_t(k) * 7919ull);
  if (h % 32 == 0) return 0.0f;
  const float mag = float(1e-9 * std::pow(3e9, unit(mix(h))));
  return (h & 64) ? -mag : mag;
}

// Gradients of one step in dtype dt (16-bit ones rounded from the fp32 values).
struct Grads {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  const void* data() const {
    return dtype == DType::f32 ? static_cast<const void*>(f32.data()) : b16.data();
  }
  float at(size_t i) const {  // the exact fp32 value the kernel reads
    if (dtype == DType::f32) return f32[i];
    return dtype == DType::f16 ? to_float(half::from_bits(b16[i]))
                               : to_float(bfloat16::from_bits(b16[i]));
  }
};
Grads make_grads(DType dt, size_t n, int64_t k, size_t first = 0) {
  Grads g{dt, {}, {}};
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = grad_value(first + i, k);
  if (dt == DType::f32) {
    g.f32 = std::move(f);
  } else {
    g.b16.resize(n);
    convert(f.data(), DType::f32, g.b16.data(), dt, n);
  }
  return g;
}

struct State {
  std::vector<float> p, m, v;
  std::vector<uint16_t> copy;
};
// p of magnitude 1e-3..10, m and v of a few earlier steps; one element in 8 fresh (m = v = 0)
// with a tiny p, where the update is all of the new p and every digit of it shows.
State make_state(size_t n) {
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
          std::vector<uint16_t>(n, 0xdead)};
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = mix(i ^ 0xabcdefull);
    if (h % 8 == 0) {
      s.p[i] = float((unit(h) - 0.5) * 2e-6);
      continue;
    }
    s.p[i] = float((unit(h) - 0.5) * 2.0 * std::pow(10.0, unit(mix(h)) * 4 - 3));
    s.m[i] = float((unit(mix(h + 1)) - 0.5) * 0.1);
    s.v[i] = float(unit(mix(h + 2)) * 0.01);
  }
  return s;
}

AdamStep step_number(int64_t k, float grad_scale) {
  AdamStep st;
  st.step = k;
  st.lr = float(1e-3 * (1.0 + 0.5 * std::sin(double(k))));  // varies step to step
  st.grad_scale = grad_scale;
  return st;
}

std::vector<HostAdam::Simd> simd_paths() {
  std::vector<HostAdam::Simd> paths{HostAdam::Simd::portable};
  for (HostAdam::Simd s : {HostAdam::Simd::avx2, HostAdam::Simd::avx512}) {
    try {
      HostAdam probe(1, s);
      paths.push_back(s);
    } catch (const Error&) {
      WARN("this CPU has no " << to_string(s) << " path; not tested here");
    }
  }
  return paths;
}

const char* copy_name(bool copy, DType dt) {
  return copy ? (dt == DType::f16 ? "fp16" : "bf16") : "none";
}

uint16_t expected_copy(float p, DType dt) {
  return dt == DType::f16 ? to_half(p).bits : to_bfloat16(p).bits;
}

}  // namespace

TEST_CASE("host_adam: bytes_per_param counts the streams") {
  CHECK(bytes_per_param(DType::f32, false, DType::bf16) == 28);
  CHECK(bytes_per_param(DType::f16, false, DType::bf16) == 26);
  CHECK(bytes_per_param(DType::bf16, false, DType::bf16) == 26);
  CHECK(bytes_per_param(DType::f32, true, DType::bf16) == 30);
  CHECK(bytes_per_param(DType::bf16, true, DType::f16) == 28);
}

TEST_CASE("host_adam: each step is the fp32 formula bit for bit and within the per-step bound") {
  // Every combination, 50 steps, each step started from the kernel's own fp32 state.
  const size_t n = 1001;  // odd: vector body, head and tail
  HostAdam adam;
  double worst_ratio = 0, worst_v_ulps = 0, worst_p_ulps = 0;
  for (DType gdt : {DType::f32, DType::f16, DType::bf16})
    for (bool adam_w : {true, false})
      for (bool bias_correction : {true, false})
        for (float wd : {0.0f, 0.01f})
          for (int copy_kind = 0; copy_kind < 3; ++copy_kind) {
            const bool copy = copy_kind > 0;
            const DType cdt = copy_kind == 1 ? DType::f16 : DType::bf16;
            CAPTURE(to_string(gdt), adam_w, bias_correction, wd, copy_name(copy, cdt));
            AdamParams hp;
            hp.adam_w_mode = adam_w;
            hp.bias_correction = bias_correction;
            hp.weight_decay = wd;
            State s = make_state(n);
            for (int64_t k = 1; k <= 50; ++k) {
              const AdamStep st = step_number(k, k % 3 == 0 ? 1.0f : 0.37f);
              const Grads g = make_grads(gdt, n, k);
              const State before = s;
              adam.step(hp, st, s.p.data(), s.m.data(), s.v.data(), g.data(), gdt, n,
                        copy ? s.copy.data() : nullptr, cdt);
              const AdamScalars sc = adam_scalars(hp, st);
              const ExactScalars ex = exact_scalars(hp, st);
              for (size_t i = 0; i < n; ++i) {
                const auto where = [&] {
                  return "step " + std::to_string(k) + ", element " + std::to_string(i);
                };
                float p = before.p[i], m = before.m[i], v = before.v[i];
                fp32_step(sc, adam_w, p, m, v, g.at(i));
                REQUIRE_AT(same(s.p[i], p), where());
                REQUIRE_AT(same(s.m[i], m), where());
                REQUIRE_AT(same(s.v[i], v), where());
                if (copy) REQUIRE_AT(s.copy[i] == expected_copy(s.p[i], cdt), where());

                RefState r{exact(before.p[i]), exact(before.m[i]), exact(before.v[i]), {}};
                ref_step(ex, r, g.at(i));
                REQUIRE_AT(within(s.p[i], r.p), where());
                REQUIRE_AT(within(s.m[i], r.m), where());
                REQUIRE_AT(within(s.v[i], r.v), where());
                if (adam_w) {  // the closed forms of the header comment
                  REQUIRE_AT(
                      std::abs(double(s.v[i]) - r.v.x) <= 6 * kU * r.v.x * (1 + 1e-6) + kTiny,
                      where());
                  REQUIRE_AT(
                      std::abs(double(s.m[i]) - r.m.x) <= 4 * kU * r.m_terms * (1 + 1e-6) + kTiny,
                      where());
                  const double p_bound =
                      kU * (std::abs(r.p1) + std::abs(r.p.x) + 2 * r.decay_p +
                            10 * std::abs(r.update) + 4 * r.m_terms * r.step_over_denom);
                  REQUIRE_AT(std::abs(double(s.p[i]) - r.p.x) <= p_bound * (1 + 1e-5) + 4 * kTiny,
                             where());
                }
                for (auto [out, ref] : {std::pair{s.p[i], r.p}, {s.m[i], r.m}, {s.v[i], r.v}})
                  if (ref.e > 0) worst_ratio = std::max(worst_ratio, std::abs(out - ref.x) / ref.e);
                if (!adam_w) continue;  // the ULP figures below are for AdamW
                const double ulp_v = std::ldexp(1.0, std::ilogb(float(r.v.x)) - 23);
                const float p_mag = std::max(std::abs(before.p[i]), std::abs(float(r.p.x)));
                const double ulp_p = std::ldexp(1.0, std::ilogb(p_mag) - 23);
                if (r.v.x > 0)
                  worst_v_ulps = std::max(worst_v_ulps, std::abs(s.v[i] - r.v.x) / ulp_v);
                if (p_mag != 0)
                  worst_p_ulps = std::max(worst_p_ulps, std::abs(s.p[i] - r.p.x) / ulp_p);
              }
            }
          }
  // For the record (run with -s): how close to the bounds the kernel actually comes.
  INFO("worst error / bound " << worst_ratio << "; AdamW: worst v error " << worst_v_ulps
                              << " ULP, worst p error " << worst_p_ulps
                              << " ULP of max(|p before|, |p after|)");
  CHECK(worst_ratio <= 1.0);
  SUCCEED();
}

TEST_CASE("host_adam: 50 steps in fp32 stay within the bound carried by the double reference") {
  // The reference steps on its own, in double, from the same start; the bound carries every
  // step's rounding and its effect on the later steps (the kernel's actual error reaches about
  // a quarter of it; run with -s to see). A closed form for v in AdamW mode: both terms of v are
  // non-negative, so its relative error grows by at most 6u per step (b2 < 1 only shrinks the
  // carried part): at most 300u after 50 steps.
  const size_t n = 4099;
  HostAdam adam(2);
  for (DType gdt : {DType::f32, DType::bf16})
    for (bool adam_w : {true, false}) {
      CAPTURE(to_string(gdt), adam_w);
      AdamParams hp;
      hp.adam_w_mode = adam_w;
      hp.weight_decay = 0.01f;
      State s = make_state(n);
      std::vector<RefState> ref(n);
      for (size_t i = 0; i < n; ++i) ref[i] = {exact(s.p[i]), exact(s.m[i]), exact(s.v[i]), {}};
      for (int64_t k = 1; k <= 50; ++k) {
        const AdamStep st = step_number(k, 0.5f);
        const Grads g = make_grads(gdt, n, k);
        adam.step(hp, st, s.p.data(), s.m.data(), s.v.data(), g.data(), gdt, n);
        const ExactScalars ex = exact_scalars(hp, st);
        for (size_t i = 0; i < n; ++i) ref_step(ex, ref[i], g.at(i));
      }
      double worst_ratio = 0, worst_v = 0;
      for (size_t i = 0; i < n; ++i) {
        REQUIRE_AT(within(s.p[i], ref[i].p), i);
        REQUIRE_AT(within(s.m[i], ref[i].m), i);
        REQUIRE_AT(within(s.v[i], ref[i].v), i);
        worst_ratio = std::max(worst_ratio, std::abs(s.p[i] - ref[i].p.x) / ref[i].p.e);
        worst_v = std::max(worst_v, std::abs(s.v[i] - ref[i].v.x) / ref[i].v.x);
      }
      INFO("p: worst error / bound " << worst_ratio << "; v: worst relative error " << worst_v / kU
                                     << " u");
      if (adam_w) CHECK(worst_v <= 300 * kU);
      SUCCEED();
    }
}

TEST_CASE("host_adam: SIMD paths, thread counts and sub-ranges give the same bits") {
  const size_t n = 1000003;
  const std::vector<HostAdam::Simd> paths = simd_paths();
  for (DType gdt : {DType::f32, DType::f16, DType::bf16})
    for (int copy_kind = 0; copy_kind < 3; ++copy_kind) {
      const bool copy = copy_kind > 0;
      const DType cdt = copy_kind == 1 ? DType::f16 : DType::bf16;
      CAPTURE(to_string(gdt), copy_name(copy, cdt));
      AdamParams hp;
      hp.weight_decay = 0.01f;
      hp.adam_w_mode = copy_kind != 2;
      const AdamStep st = step_number(3, 0.25f);
      const Grads g = make_grads(gdt, n, 3);
      const State start = make_state(n);
      auto run = [&](HostAdam::Simd simd, int threads, size_t a, size_t b) {
        State s = start;
        HostAdam adam(threads, simd);
        const size_t gs = size_of(gdt);
        adam.step(hp, st, s.p.data() + a, s.m.data() + a, s.v.data() + a,
                  static_cast<const char*>(g.data()) + a * gs, gdt, b - a,
                  copy ? s.copy.data() + a : nullptr, cdt);
        return s;
      };
      const State want = run(HostAdam::Simd::portable, 1, 0, n);
      for (size_t i = 0; i < n; i += 997) {  // the portable path is the formula (spot check)
        float p = start.p[i], m = start.m[i], v = start.v[i];
        fp32_step(adam_scalars(hp, st), hp.adam_w_mode, p, m, v, g.at(i));
        REQUIRE_AT(same(want.p[i], p), i);
      }
      auto check_range = [&](const State& got, size_t a, size_t b) {
        for (size_t i = 0; i < n; ++i) {
          const State& w = (i >= a && i < b) ? want : start;  // outside [a, b): untouched
          if (!same(got.p[i], w.p[i]) || !same(got.m[i], w.m[i]) || !same(got.v[i], w.v[i]) ||
              got.copy[i] != w.copy[i]) {
            FAIL("element " << i << " differs (range [" << a << ", " << b << "))");
          }
        }
      };
      for (HostAdam::Simd simd : paths) {
        CAPTURE(to_string(simd));
        for (int threads : {1, 2, 0}) {
          CAPTURE(threads);
          check_range(run(simd, threads, 0, n), 0, n);
        }
        // Sub-ranges at odd offsets (unaligned starts, chunk boundaries crossed or not).
        const std::pair<size_t, size_t> ranges[] = {
            {1, 2},
            {3, 10},
            {5, 22},
            {17, 40000},
            {HostAdam::kChunk - 3, 2 * HostAdam::kChunk + 5},
            {12345, n - 7},
            {n - 1, n}};
        for (auto [a, b] : ranges) check_range(run(simd, 2, a, b), a, b);
      }
    }
}

TEST_CASE("host_adam: step_into is step out of place, its inputs untouched") {
  const size_t n = 300007;
  for (HostAdam::Simd simd : simd_paths())
    for (DType gdt : {DType::f32, DType::bf16}) {
      CAPTURE(to_string(simd), to_string(gdt));
      AdamParams hp;
      hp.weight_decay = 0.01f;
      const AdamStep st = step_number(5, 0.5f);
      const Grads g = make_grads(gdt, n, 7);
      const State start = make_state(n);
      HostAdam adam(2, simd);
      State want = start;
      adam.step(hp, st, want.p.data(), want.m.data(), want.v.data(), g.data(), gdt, n,
                want.copy.data(), DType::bf16);
      // Into a second state at a different alignment (offset by 3 elements), from the first.
      const State in = start;
      std::vector<float> p(n + 3), m(n + 3), v(n + 3);
      std::vector<uint16_t> copy(n, 0);
      adam.step_into(hp, st, in.p.data(), in.m.data(), in.v.data(), p.data() + 3, m.data() + 3,
                     v.data() + 3, g.data(), gdt, n, copy.data(), DType::bf16);
      for (size_t i = 0; i < n; ++i) {
        REQUIRE_AT(same(p[i + 3], want.p[i]) && same(m[i + 3], want.m[i]) &&
                       same(v[i + 3], want.v[i]) && copy[i] == want.copy[i],
                   i);
        REQUIRE_AT(same(in.p[i], start.p[i]) && same(in.m[i], start.m[i]) &&
                       same(in.v[i], start.v[i]),
                   i);
      }
    }
}

TEST_CASE("host_adam: step_into may write the 16-bit copy over its own gradient") {
  // The NVMe tier lands the reduced gradient and writes the new parameters' copy into the same
  // bytes (HostOffload::out): each element's gradient must be read before its copy is written.
  const size_t n = 100003;
  for (HostAdam::Simd simd : simd_paths())
    for (DType dt : {DType::bf16, DType::f16}) {
      CAPTURE(to_string(simd), to_string(dt));
      AdamParams hp;
      hp.weight_decay = 0.01f;
      const AdamStep st = step_number(3, 0.25f);
      const Grads g = make_grads(dt, n, 11);
      const State start = make_state(n);
      HostAdam adam(2, simd);
      State want = start;
      adam.step_into(hp, st, start.p.data(), start.m.data(), start.v.data(), want.p.data(), want.m.data(),
                     want.v.data(), g.data(), dt, n, want.copy.data(), dt);
      State got = start;
      std::vector<uint16_t> shared = g.b16;  // the gradient, then the copy
      adam.step_into(hp, st, start.p.data(), start.m.data(), start.v.data(), got.p.data(), got.m.data(),
                     got.v.data(), shared.data(), dt, n, shared.data(), dt);
      for (size_t i = 0; i < n; ++i)
        REQUIRE_AT(same(got.p[i], want.p[i]) && same(got.m[i], want.m[i]) && same(got.v[i], want.v[i]) &&
                       shared[i] == want.copy[i],
                   i);
    }
}

TEST_CASE("host_adam: odd lengths and misaligned starts") {
  const std::vector<HostAdam::Simd> paths = simd_paths();
  for (size_t n : {size_t{1}, size_t{7}, size_t{15}, size_t{17}, size_t{1000003}})
    for (size_t offset : {size_t{0}, size_t{1}, size_t{5}})
      for (DType gdt : {DType::f32, DType::f16}) {
        CAPTURE(n, offset, to_string(gdt));
        AdamParams hp;
        hp.weight_decay = 0.1f;
        const size_t total = n + offset + 3;
        const State start = make_state(total);
        const Grads g = make_grads(gdt, total, 9);
        const AdamStep st = step_number(9, 2.0f);
        const AdamScalars sc = adam_scalars(hp, st);
        const ExactScalars ex = exact_scalars(hp, st);
        for (HostAdam::Simd simd : paths) {
          CAPTURE(to_string(simd));
          State s = start;
          HostAdam adam(2, simd);
          adam.step(hp, st, s.p.data() + offset, s.m.data() + offset, s.v.data() + offset,
                    static_cast<const char*>(g.data()) + offset * size_of(gdt), gdt, n,
                    s.copy.data() + offset, DType::bf16);
          for (size_t i = 0; i < total; ++i) {
            if (i < offset || i >= offset + n) {
              REQUIRE_AT(bits(s.p[i]) == bits(start.p[i]), i);
              REQUIRE_AT(s.copy[i] == start.copy[i], i);
              continue;
            }
            float p = start.p[i], m = start.m[i], v = start.v[i];
            fp32_step(sc, true, p, m, v, g.at(i));
            REQUIRE_AT(same(s.p[i], p), i);
            REQUIRE_AT(same(s.m[i], m), i);
            REQUIRE_AT(same(s.v[i], v), i);
            REQUIRE_AT(s.copy[i] == to_bfloat16(s.p[i]).bits, i);
            RefState r{exact(start.p[i]), exact(start.m[i]), exact(start.v[i]), {}};
            ref_step(ex, r, g.at(i));
            REQUIRE_AT(within(s.p[i], r.p), i);
          }
        }
      }
}

TEST_CASE("host_adam: every fp16 and bf16 gradient pattern reads as to_float") {
  // All 65536 patterns: subnormals, infinities, NaNs (signalling ones too). The vector paths
  // widen fp16 with vcvtph2ps and bf16 with a shift; the reference uses dtype.hpp.
  const size_t n = 65536;
  for (DType gdt : {DType::f16, DType::bf16})
    for (HostAdam::Simd simd : simd_paths()) {
      CAPTURE(to_string(gdt), to_string(simd));
      Grads g{gdt, {}, std::vector<uint16_t>(n)};
      for (size_t i = 0; i < n; ++i) g.b16[i] = uint16_t(i);
      State s = make_state(n);
      const State start = s;
      AdamParams hp;
      hp.adam_w_mode = false;  // L2: the gradient meets p too
      hp.weight_decay = 0.5f;
      const AdamStep st = step_number(2, 1.0f);
      HostAdam(2, simd).step(hp, st, s.p.data(), s.m.data(), s.v.data(), g.data(), gdt, n);
      const AdamScalars sc = adam_scalars(hp, st);
      for (size_t i = 0; i < n; ++i) {
        float p = start.p[i], m = start.m[i], v = start.v[i];
        fp32_step(sc, false, p, m, v, g.at(i));
        REQUIRE_AT(same(s.p[i], p), "pattern " << i);
        REQUIRE_AT(same(s.m[i], m), "pattern " << i);
        REQUIRE_AT(same(s.v[i], v), "pattern " << i);
      }
    }
}

TEST_CASE("host_adam: the 16-bit copy is to_half / to_bfloat16 of the new parameter") {
  // Parameters at every fp16 value, the midpoints between neighbours (ties) and one fp32 ulp
  // either side of them, plus a million scattered fp32 patterns (NaNs, infinities, subnormals).
  // With lr = 0 and no decay the step leaves p as it is (bar -0 and NaN payload quieting), so the
  // copy sees all of them.
  std::vector<float> ps;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = to_float(half::from_bits(uint16_t(h)));
    const float y = to_float(half::from_bits(uint16_t(h + 1)));
    ps.push_back(x);
    if ((h & 0x7fff) < 0x7c00 && ((h + 1) & 0x7fff) <= 0x7c00 &&
        (h & 0x8000) == ((h + 1) & 0x8000)) {
      const float mid = float((double(x) + double(y)) / 2);  // exact in fp32
      ps.push_back(mid);
      ps.push_back(std::nextafter(mid, 0.0f));
      ps.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity()));
    }
  }
  for (uint64_t i = 0; i < (1u << 20); ++i) ps.push_back(std::bit_cast<float>(uint32_t(mix(i))));
  const size_t n = ps.size();
  for (DType cdt : {DType::f16, DType::bf16})
    for (HostAdam::Simd simd : simd_paths()) {
      CAPTURE(to_string(cdt), to_string(simd));
      State s{ps, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f),
              std::vector<uint16_t>(n, 0)};
      const std::vector<float> zero_grad(n, 0.0f);
      AdamParams hp;  // AdamW, weight decay 0
      AdamStep st;
      st.lr = 0.0f;
      HostAdam(2, simd).step(hp, st, s.p.data(), s.m.data(), s.v.data(), zero_grad.data(),
                             DType::f32, n, s.copy.data(), cdt);
      size_t unchanged = 0;
      for (size_t i = 0; i < n; ++i) {
        REQUIRE_AT(s.copy[i] == expected_copy(s.p[i], cdt), "p bits 0x" << std::hex << bits(ps[i]));
        unchanged += bits(s.p[i]) == bits(ps[i]);
      }
      CHECK(unchanged > n - n / 100);  // the copy did see the intended values
    }
}

TEST_CASE("host_adam: the copy is the same streamed (aligned) or stored (unaligned)") {
  // The vector paths stream the copy when it is aligned where the vector loop starts (p's
  // first 64-byte boundary) and store it otherwise: start p and the copy on 64 bytes, then
  // shift the copy by one element.
  const size_t n = 100003;
  auto aligned_offset = [](const void* base, size_t elem) {
    const auto a = reinterpret_cast<uintptr_t>(base);
    return ((64 - a % 64) % 64) / elem;
  };
  for (DType cdt : {DType::f16, DType::bf16})
    for (HostAdam::Simd simd : simd_paths()) {
      CAPTURE(to_string(cdt), to_string(simd));
      const State start = make_state(n);
      const Grads g = make_grads(DType::f32, n, 4);
      std::vector<uint16_t> copies[2];
      for (size_t shift : {size_t{0}, size_t{1}}) {
        // Room to move the data to an aligned start; element i of the step is start's i.
        std::vector<float> p(n + 16), m(n + 16), v(n + 16), grad(n + 16);
        std::vector<uint16_t> copy(n + 33);
        const size_t op = aligned_offset(p.data(), 4);
        const size_t oc = aligned_offset(copy.data(), 2) + shift;
        std::copy(start.p.begin(), start.p.end(), p.begin() + long(op));
        std::copy(start.m.begin(), start.m.end(), m.begin() + long(op));
        std::copy(start.v.begin(), start.v.end(), v.begin() + long(op));
        std::copy(g.f32.begin(), g.f32.end(), grad.begin() + long(op));
        HostAdam(1, simd).step(AdamParams{}, step_number(4, 1.0f), p.data() + op, m.data() + op,
                               v.data() + op, grad.data() + op, DType::f32, n, copy.data() + oc,
                               cdt);
        for (size_t i = 0; i < n; ++i) REQUIRE_AT(copy[oc + i] == expected_copy(p[op + i], cdt), i);
        copies[shift].assign(copy.begin() + long(oc), copy.begin() + long(oc + n));
      }
      CHECK(copies[0] == copies[1]);
    }
}

TEST_CASE("host_adam: n = 0, thread counts and bad arguments") {
  HostAdam one(1), two(2), all;
  CHECK(one.threads() == 1);
  CHECK(two.threads() == 2);
  CHECK(all.threads() >= 1);
  CHECK(all.simd() != HostAdam::Simd::best);
  AdamParams hp;
  AdamStep st;
  float x = 1.0f;
  two.step(hp, st, nullptr, nullptr, nullptr, nullptr, DType::f32, 0);  // nothing to do
  CHECK_THROWS_AS(two.step(hp, st, &x, &x, nullptr, &x, DType::f32, 1), Error);
  float p = 1, m = 0, v = 0, g = 1, c = 0;
  CHECK_THROWS_AS(two.step(hp, st, &p, &m, &v, &g, DType::f32, 1, &c, DType::f32), Error);
  CHECK_THROWS_AS(HostAdam(-1), Error);
  st.step = 0;
  CHECK_THROWS_AS(two.step(hp, st, &p, &m, &v, &g, DType::f32, 1), Error);
}
