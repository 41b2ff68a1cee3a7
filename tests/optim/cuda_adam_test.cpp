// optim/cuda/adam_kernel.cu: the fused AdamW step, the squared norm and the inf/NaN test.
// Without a CUDA device every test case reports Skipped, never passed. With one, the host side
// dominates the run time (the double reference, about 250 ns per element and step on a slow
// core): about 30 s for the all-configurations case, 40 s for each n = 1000003 case.
//
// Each step of the kernel is checked three ways, element by element:
//   1. Against a plain double-precision evaluation of the formula of optim/adam.hpp, started
//      from the same fp32 state (the GPU's, downloaded after the previous step) with the same
//      fp32 scalars (adam_scalars()), within the per-step bound derived below.
//   2. Bit for bit against an fp32 evaluation on the host, written here in the order of the
//      contract (emulate_step): the kernel's every operation is one correctly rounded IEEE fp32
//      operation, so the same sequence of operations gives the same bits.
//   3. Bit for bit against HostAdam::step (optim/host_adam.hpp), which states the same contract
//      (same order, no FMA, correctly rounded sqrt and division, no flush-to-zero): the state
//      an offloaded step and a GPU step produce must not depend on where it ran.
// The 16-bit copy must equal to_half / to_bfloat16 (dtype.hpp) of the GPU's own fp32 result.
//
// Tolerance of check 1, per step and element. Every input of a step (p, m, v, the widened
// gradient, the fp32 scalars) is an exact number; the reference evaluates the formula on them in
// double (x) and, alongside, the bound e of how far a correctly rounded fp32 evaluation of the
// same operations can land from x (`Bounded` below, a running error analysis). With
// u = 2^-24 (fp32 round to nearest):
//   a*b, a+b, a-b   |error| <= (propagated input error) + u * (|exact| + propagated) + 2^-150
//   sqrt(a)         propagated <= min(e_a / (sqrt(a) + sqrt(max(a - e_a, 0))), sqrt(e_a))
//   a / b (b > e_b) propagated <= (e_a + |a / b| * e_b) / (b - e_b)
// (2^-150: the absolute error of a subnormal result.) The bound has no first-order shortcuts, so
// it holds for every input, cancellation included; it is accepted with a factor 1 + 2^-20 for
// the double reference's own rounding (about 2^-29 of e). The one case it cannot bound is a
// denominator whose own error may reach its value (sqrt(v) * inv_sqrt_bc2 ~ eps after a
// cancellation); such elements are counted and must stay rare (and still match checks 2 and 3).
//
// In ULPs. Take the scale of a result to be the sum of the magnitudes of the terms of its last
// addition (for m: |beta1 m| + |(1 - beta1) g|): |result| when they do not cancel. When g is good
// to its one rounding (always in AdamW mode) the bound comes to at most 3 ulps of the scale for
// m (a rounding per product and for the sum, one more carried in by g) and 5 for v (g's rounding
// twice, three products, the sum; its terms never cancel). For p it is ~2 ulps of |p| (the
// decay and the last subtraction) plus ~8 ulps of the update step_size * m / denom (m's 3,
// ~5.5 through sqrt and denom, 1 for the division), plus 3 ulps of step_size * (m's scale) /
// denom where m itself cancels (m crossing zero), which for a parameter near zero is many ulps
// of p. In Adam + L2 mode g = grad * grad_scale + l2 * p may cancel; g, and with it m, v and p,
// then carry an error of about u (|grad * grad_scale| + |l2 p|), up to ~1e6 ulps of their own
// terms. That is what fp32 evaluation of this formula gives, and the bound follows it. The
// largest errors seen, in ULPs of the scale and as a fraction of the bound, are printed as a
// warning, AdamW and Adam + L2 apart.
//
// The test's own fp32 arithmetic (emulate_step) must not be contracted into FMAs, which g++
// does for C++ wherever the target has them; hence the pragma, before every #include so inline
// functions from headers get it too.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "optim/adam.hpp"
#include "optim/cuda/adam_kernel.hpp"
#include "optim/host_adam.hpp"
#include "core/cuda/checks.hpp"
#include "tests/cuda_support.hpp"
#include "core/dtype.hpp"

// Not `using namespace zero`: cuda_fp16.h (through cublas_v2.h) declares a global ::half.
using zero::DType;
using zero::size_of;
using zero::optim::AdamParams;
using zero::optim::AdamScalars;
using zero::optim::AdamStep;
using zero::optim::HostAdam;

using namespace zero::test;

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

std::string hex(uint32_t u) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", u);
  return buf;
}

// ---- deterministic pseudo-random numbers: a hash of (seed, step, index, stream) ---------------

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1).
double uniform(uint64_t seed, uint64_t step, uint64_t i, uint64_t which) {
  const uint64_t h = mix(mix(mix(seed ^ (which << 56)) ^ step) ^ i);
  return double(h >> 11) * 0x1p-53;
}

// ---- element types -------------------------------------------------------------------------

// Stores x as dtype at dst (rounding to nearest even for the 16-bit types) and returns the value
// stored, widened back exactly: the gradient the kernel sees.
float store_as(DType t, float x, uint8_t* dst) {
  switch (t) {
    case DType::f32: std::memcpy(dst, &x, 4); return x;
    case DType::f16: {
      const zero::half h = zero::to_half(x);
      std::memcpy(dst, &h.bits, 2);
      return zero::to_float(h);
    }
    case DType::bf16: {
      const zero::bfloat16 b = zero::to_bfloat16(x);
      std::memcpy(dst, &b.bits, 2);
      return zero::to_float(b);
    }
  }
  return 0.0f;
}

// The bytes dtype.hpp's conversion of p gives: what the 16-bit (or fp32) copy must hold.
void expected_copy(DType t, float p, uint8_t* dst) {
  switch (t) {
    case DType::f32: std::memcpy(dst, &p, 4); return;
    case DType::f16: {
      const uint16_t b = zero::to_half(p).bits;
      std::memcpy(dst, &b, 2);
      return;
    }
    case DType::bf16: {
      const uint16_t b = zero::to_bfloat16(p).bits;
      std::memcpy(dst, &b, 2);
      return;
    }
  }
}

// ---- the references ------------------------------------------------------------------------

// Check 2: the contract's formula in plain fp32, one rounding per operation (no FMA: see the
// pragma at the top; std::sqrt is correctly rounded).
void emulate_step(const AdamScalars& s, bool adam_w, float grad, float& p, float& m, float& v) {
  float g = grad * s.grad_scale;
  if (!adam_w) g = g + s.l2 * p;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) * s.inv_sqrt_bc2 + s.eps;
  if (adam_w) p = p - s.decay * p;
  p = p - s.step_size * m / denom;
}

// Check 1: x, the formula evaluated in double on the exact inputs; e, the bound on the distance
// of a correctly rounded fp32 evaluation from the exact value (see the top of the file).
struct Bounded {
  double x;
  double e;
};
constexpr double kU = 0x1p-24;
constexpr double kSubnormalHalfUlp = 0x1p-150;
constexpr double kInf = std::numeric_limits<double>::infinity();

Bounded exact(float f) { return {double(f), 0.0}; }
Bounded rounded(double x, double propagated) {
  return {x, propagated + kU * (std::fabs(x) + propagated) + kSubnormalHalfUlp};
}
Bounded operator*(Bounded a, Bounded b) {
  return rounded(a.x * b.x, std::fabs(a.x) * b.e + std::fabs(b.x) * a.e + a.e * b.e);
}
Bounded operator+(Bounded a, Bounded b) { return rounded(a.x + b.x, a.e + b.e); }
Bounded operator-(Bounded a, Bounded b) { return rounded(a.x - b.x, a.e + b.e); }
Bounded operator/(Bounded a, Bounded b) {
  const double x = a.x / b.x;
  if (!(b.x > b.e)) return {x, kInf};  // the denominator may be 0: no bound
  return rounded(x, (a.e + std::fabs(x) * b.e) / (b.x - b.e));
}
Bounded sqrt(Bounded a) {
  const double x = std::sqrt(std::max(a.x, 0.0));
  const double near = a.e / (x + std::sqrt(std::max(a.x - a.e, 0.0)));  // inf when a.x = 0
  return rounded(x, std::min(near, std::sqrt(a.e)));
}

struct Reference {
  Bounded p, m, v;
  // The sum of the magnitudes of the terms of each result's last addition: the scale the
  // ULP figures at the top of the file refer to (equal to |result| when nothing cancels).
  double p_scale, m_scale, v_scale;
};

Reference reference_step(const AdamScalars& s, bool adam_w, float grad, float p0, float m0,
                         float v0) {
  Bounded g = exact(grad) * exact(s.grad_scale);
  if (!adam_w) g = g + exact(s.l2) * exact(p0);
  const Bounded m_old = exact(s.beta1) * exact(m0), m_new = exact(s.one_minus_beta1) * g;
  const Bounded m = m_old + m_new;
  const Bounded v_old = exact(s.beta2) * exact(v0), v_new = exact(s.one_minus_beta2) * g * g;
  const Bounded v = v_old + v_new;
  const Bounded denom = sqrt(v) * exact(s.inv_sqrt_bc2) + exact(s.eps);
  Bounded p = exact(p0);
  if (adam_w) p = p - exact(s.decay) * p;
  const Bounded update = exact(s.step_size) * m / denom;
  const double p_scale = std::fabs(p.x) + std::fabs(update.x);
  p = p - update;
  return {p,
          m,
          v,
          p_scale,
          std::fabs(m_old.x) + std::fabs(m_new.x),
          std::fabs(v_old.x) + std::fabs(v_new.x)};
}

// One fp32 ulp at the magnitude of x.
double ulp(double x) {
  const int e = x == 0.0 ? -126 : std::max(std::ilogb(x), -126);
  return std::ldexp(1.0, e - 23);
}

// The largest errors against the double reference, over a whole test case.
struct Stats {
  double ulps_p = 0, ulps_m = 0, ulps_v = 0;  // |got - x| / ulp(scale), see Reference
  double of_bound = 0;                        // |got - x| / e
  size_t checked = 0, unbounded = 0;
  std::string summary() const {
    std::ostringstream o;
    o << checked << " element-steps: max error vs double p " << ulps_p << " ulp, m " << ulps_m
      << " ulp, v " << ulps_v << " ulp; max " << of_bound << " of the bound; " << unbounded
      << " p unbounded";
    return o.str();
  }
};

// ---- one run: `steps` steps of one configuration over one layout ---------------------------

struct Config {
  DType grad = DType::f32;
  bool adam_w = true;
  bool bias_correction = true;
  float weight_decay = 0.0f;
  bool copy = false;
  DType copy_dtype = DType::bf16;
};

// Element offsets of the range within its device buffers: p, m and v share `state`. Non-zero
// offsets make sub-ranges whose pointers are not 4-element aligned: the element-wise path.
struct Layout {
  size_t state = 0, grad = 0, copy = 0;
};

std::string describe(const Config& c, const Layout& l, size_t n) {
  std::ostringstream o;
  o << "grad " << zero::to_string(c.grad) << (c.adam_w ? ", adamw" : ", adam+l2")
    << (c.bias_correction ? ", bias correction" : ", no bias correction") << ", wd "
    << c.weight_decay << ", copy " << (c.copy ? zero::to_string(c.copy_dtype) : "none") << ", n "
    << n << ", offsets state " << l.state << " grad " << l.grad << " copy " << l.copy;
  return o.str();
}

constexpr size_t kGuard = 8;  // elements after each range that must stay untouched
constexpr unsigned char kSentinel = 0xcd;

// A device buffer of `pre + n + kGuard` elements, filled with the sentinel byte; the range
// starts `pre` elements in.
struct Ranged {
  Ranged(size_t pre, size_t n, size_t elem)
      : pre(pre), n(n), elem(elem), buf((pre + n + kGuard) * elem) {}
  uint8_t* range() const { return buf.get() + pre * elem; }
  size_t pre, n, elem;
  DeviceBuffer buf;
};

// Downloads the whole buffer; returns the range's bytes and counts guard bytes that changed.
std::vector<uint8_t> fetch(const Ranged& r, const TestStream& s, size_t& guard_damage) {
  std::vector<uint8_t> all(r.buf.bytes());
  download(all.data(), r.buf.get(), all.size(), s);
  s.sync();
  for (size_t i = 0; i < r.pre * r.elem; ++i) guard_damage += all[i] != kSentinel;
  for (size_t i = (r.pre + r.n) * r.elem; i < all.size(); ++i) guard_damage += all[i] != kSentinel;
  return {all.begin() + r.pre * r.elem, all.begin() + (r.pre + r.n) * r.elem};
}

void run_adam(const Config& c, const Layout& l, size_t n, int steps, uint64_t seed, HostAdam& host,
              Stats& stats, const TestStream& stream) {
  INFO(describe(c, l, n));
  const size_t gsize = size_of(c.grad), csize = size_of(c.copy_dtype);
  Ranged dp(l.state, n, 4), dm(l.state, n, 4), dv(l.state, n, 4), dg(l.grad, n, gsize),
      dc(l.copy, n, csize);
  for (const Ranged* r : {&dp, &dm, &dv, &dg, &dc})
    ZERO_CHECK_CUDA(cudaMemsetAsync(r->buf.get(), kSentinel, r->buf.bytes(), stream.get()));

  // Initial state: parameters mostly in [-1, 1), some tiny, some zero; fresh moments.
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    const double u = uniform(seed, 0, i, 0);
    p[i] = i % 101 == 3 ? 0.0f : float(i % 97 == 5 ? (u - 0.5) * 1e-30 : 2 * u - 1);
  }
  upload(dp.range(), p.data(), 4 * n, stream);
  upload(dm.range(), m.data(), 4 * n, stream);
  upload(dv.range(), v.data(), 4 * n, stream);

  AdamParams params;
  params.adam_w_mode = c.adam_w;
  params.bias_correction = c.bias_correction;
  params.weight_decay = c.weight_decay;
  // Gradients as a loss-scaled fp16 run stores them (scale 1024) or a clipped fp32/bf16 run.
  const double loss_scale = c.grad == DType::f16 ? 1024.0 : 8.0;
  const double clip[] = {1.0, 0.75, 0.3125};

  // Per element a fixed magnitude (1e-4 .. 1e-1) and mean of its gradient.
  std::vector<double> mag(n), mean(n);
  for (size_t i = 0; i < n; ++i) {
    mag[i] = std::pow(10.0, -4.0 + 3.0 * uniform(seed, 0, i, 1));
    mean[i] = 2 * uniform(seed, 0, i, 2) - 1;
  }
  std::vector<uint8_t> grad_bytes(n * gsize);
  std::vector<float> grad(n);
  std::vector<float> hp(n), hm(n), hv(n);
  std::vector<uint8_t> hcopy(n * csize);

  for (int t = 1; t <= steps; ++t) {
    INFO("step " << t);
    AdamStep step;
    step.step = t;
    step.lr = float(1e-3 * (1.0 + 0.9 * std::sin(0.37 * t)));
    step.grad_scale = float(clip[t % 3] / loss_scale);
    const AdamScalars s = zero::optim::adam_scalars(params, step);

    // Fresh noise around each element's mean every step; 1 in 1000 elements never gets a
    // gradient, 1 in 64 element-steps gets an exact zero.
    for (size_t i = 0; i < n; ++i) {
      const double noise = uniform(seed, t, i, 3) + uniform(seed, t, i, 4) - 1.0;
      const bool zero_grad = i % 1000 == 999 || uniform(seed, t, i, 5) < 1.0 / 64;
      const double gamma = zero_grad ? 0.0 : mag[i] * (mean[i] + 2.0 * noise);
      grad[i] = store_as(c.grad, float(gamma * loss_scale), &grad_bytes[i * gsize]);
    }
    upload(dg.range(), grad_bytes.data(), grad_bytes.size(), stream);

    zero::optim::cuda_adam_step(params, step, reinterpret_cast<float*>(dp.range()),
                                reinterpret_cast<float*>(dm.range()),
                                reinterpret_cast<float*>(dv.range()), dg.range(), c.grad, n,
                                c.copy ? dc.range() : nullptr, c.copy_dtype, stream.get());

    size_t guard_damage = 0;
    const std::vector<uint8_t> gp_b = fetch(dp, stream, guard_damage);
    const std::vector<uint8_t> gm_b = fetch(dm, stream, guard_damage);
    const std::vector<uint8_t> gv_b = fetch(dv, stream, guard_damage);
    const std::vector<uint8_t> gc_b = fetch(dc, stream, guard_damage);
    std::vector<float> gp(n), gm(n), gv(n);
    std::memcpy(gp.data(), gp_b.data(), 4 * n);
    std::memcpy(gm.data(), gm_b.data(), 4 * n);
    std::memcpy(gv.data(), gv_b.data(), 4 * n);

    // Check 3's input: HostAdam from the same state (it has no fp32 copy; then none is asked).
    const bool host_copy = c.copy && c.copy_dtype != DType::f32;
    hp = p;
    hm = m;
    hv = v;
    host.step(params, step, hp.data(), hm.data(), hv.data(), grad_bytes.data(), c.grad, n,
              host_copy ? hcopy.data() : nullptr, c.copy_dtype);

    size_t off_bound = 0, vs_emulation = 0, vs_host = 0, bad_copy = 0;
    std::string first;  // the first failure, described
    auto note = [&](size_t& counter, size_t i, const std::string& what) {
      if (counter++ == 0 && first.empty()) {
        first = what + " at element " + std::to_string(i) + ": gpu p m v " + hex(bits(gp[i])) +
                " " + hex(bits(gm[i])) + " " + hex(bits(gv[i])) + " from p m v " + hex(bits(p[i])) +
                " " + hex(bits(m[i])) + " " + hex(bits(v[i])) + ", grad " + hex(bits(grad[i]));
      }
    };
    for (size_t i = 0; i < n; ++i) {
      // 1. double reference and bound
      const Reference r = reference_step(s, c.adam_w, grad[i], p[i], m[i], v[i]);
      bool ok = true;
      const double slack = 1.0 + 0x1p-20;
      if (std::fabs(double(gm[i]) - r.m.x) > r.m.e * slack) ok = false;
      if (std::fabs(double(gv[i]) - r.v.x) > r.v.e * slack) ok = false;
      if (std::isinf(r.p.e)) {
        ++stats.unbounded;
      } else {
        const double err = std::fabs(double(gp[i]) - r.p.x);
        if (err > r.p.e * slack) ok = false;
        stats.ulps_p = std::max(stats.ulps_p, err / ulp(r.p_scale));
        if (r.p.e > 0) stats.of_bound = std::max(stats.of_bound, err / r.p.e);
      }
      stats.ulps_m = std::max(stats.ulps_m, std::fabs(double(gm[i]) - r.m.x) / ulp(r.m_scale));
      stats.ulps_v = std::max(stats.ulps_v, std::fabs(double(gv[i]) - r.v.x) / ulp(r.v_scale));
      if (r.m.e > 0)
        stats.of_bound = std::max(stats.of_bound, std::fabs(double(gm[i]) - r.m.x) / r.m.e);
      if (r.v.e > 0)
        stats.of_bound = std::max(stats.of_bound, std::fabs(double(gv[i]) - r.v.x) / r.v.e);
      if (!ok)
        note(off_bound, i,
             "outside the bound (want p " + std::to_string(r.p.x) + " +- " + std::to_string(r.p.e) +
                 ", m " + std::to_string(r.m.x) + " +- " + std::to_string(r.m.e) + ", v " +
                 std::to_string(r.v.x) + " +- " + std::to_string(r.v.e) + ")");
      // 2. the fp32 emulation, bit for bit
      float ep = p[i], em = m[i], ev = v[i];
      emulate_step(s, c.adam_w, grad[i], ep, em, ev);
      if (bits(ep) != bits(gp[i]) || bits(em) != bits(gm[i]) || bits(ev) != bits(gv[i]))
        note(vs_emulation, i,
             "differs from the fp32 emulation (" + hex(bits(ep)) + " " + hex(bits(em)) + " " +
                 hex(bits(ev)) + ")");
      // 3. HostAdam, bit for bit
      if (bits(hp[i]) != bits(gp[i]) || bits(hm[i]) != bits(gm[i]) || bits(hv[i]) != bits(gv[i]))
        note(vs_host, i,
             "differs from HostAdam (" + hex(bits(hp[i])) + " " + hex(bits(hm[i])) + " " +
                 hex(bits(hv[i])) + ")");
      // The copy: dtype.hpp's rounding of the GPU's own p, and HostAdam's copy.
      if (c.copy) {
        uint8_t want[4];
        expected_copy(c.copy_dtype, gp[i], want);
        if (std::memcmp(want, &gc_b[i * csize], csize) != 0) note(bad_copy, i, "wrong copy");
        if (host_copy && std::memcmp(&hcopy[i * csize], &gc_b[i * csize], csize) != 0)
          note(bad_copy, i, "copy differs from HostAdam's");
      } else if (std::any_of(&gc_b[i * csize], &gc_b[i * csize] + csize,
                             [](uint8_t b) { return b != kSentinel; })) {
        note(bad_copy, i, "copy written though none was asked for");
      }
    }
    stats.checked += n;
    INFO(first);
    CHECK(off_bound == 0);
    CHECK(vs_emulation == 0);
    CHECK(vs_host == 0);
    CHECK(bad_copy == 0);
    CHECK(guard_damage == 0);
    if (off_bound || vs_emulation || vs_host || bad_copy || guard_damage) return;  // one report

    // The next step starts from the GPU's state.
    p = gp;
    m = gm;
    v = gv;
  }
}

constexpr DType kTypes[] = {DType::f32, DType::f16, DType::bf16};

std::vector<Config> all_configs() {
  std::vector<Config> out;
  for (DType g : kTypes)
    for (bool adam_w : {true, false})
      for (bool bias : {true, false})
        for (float wd : {0.0f, 0.01f})
          for (int copy = 0; copy < 4; ++copy) {
            Config c;
            c.grad = g;
            c.adam_w = adam_w;
            c.bias_correction = bias;
            c.weight_decay = wd;
            c.copy = copy > 0;
            c.copy_dtype = copy == 1 ? DType::f16 : copy == 2 ? DType::bf16 : DType::f32;
            out.push_back(c);
          }
  return out;
}

// Aligned (the vector path), then sub-ranges whose pointers are off by 1 or 3 elements (all of
// them, or only the gradient or only the copy): the element-wise path.
constexpr Layout kLayouts[] = {{0, 0, 0}, {1, 1, 1}, {3, 3, 3}, {0, 2, 0}, {0, 0, 1}};

// Element-steps allowed without a bound (see the top of the file): rare by construction.
void check_unbounded(const Stats& stats) {
  INFO(stats.summary());
  CHECK(stats.unbounded * 10000 <= stats.checked);
}

// Checks and prints the largest errors seen, Adam + L2 (stats[0]) and AdamW (stats[1]) apart:
// with L2 decay g = grad + l2 * p can cancel, and the errors it carries into m, v and p are
// large in ULPs of their own terms (the bound follows them; see the top of the file).
void report(const Stats (&stats)[2]) {
  check_unbounded(stats[0]);
  check_unbounded(stats[1]);
  WARN("Adam + L2: " << stats[0].summary() << "\nAdamW: " << stats[1].summary());
}

}  // namespace

TEST_CASE(
    "cuda adam: every configuration at lengths 1 7 17 4099 aligned and unaligned for 50 steps") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  HostAdam host;
  Stats stats[2];  // Adam + L2, AdamW
  uint64_t seed = 1;
  for (const Config& c : all_configs())
    for (const Layout& l : kLayouts)
      for (size_t n : {size_t(1), size_t(7), size_t(17), size_t(4099)})
        run_adam(c, l, n, 50, seed++, host, stats[c.adam_w], stream);
  report(stats);
}

namespace {

// A million elements (not a multiple of 4: the vector path and a tail) for 50 steps, twice:
// AdamW with decay and a 16-bit copy on aligned buffers (the usual mixed-precision step), and
// Adam with L2 decay, no bias correction and no copy on unaligned sub-ranges.
void large_runs(DType g, uint64_t seed) {
  TestStream stream;
  HostAdam host;
  Stats stats[2];  // Adam + L2, AdamW
  Config w;
  w.grad = g;
  w.weight_decay = 0.01f;
  w.copy = true;
  w.copy_dtype = g == DType::f16 ? DType::f16 : DType::bf16;
  run_adam(w, Layout{0, 0, 0}, 1000003, 50, seed, host, stats[1], stream);
  Config l2;
  l2.grad = g;
  l2.adam_w = false;
  l2.bias_correction = false;
  l2.weight_decay = 0.01f;
  run_adam(l2, Layout{1, 3, 0}, 1000003, 50, seed + 1, host, stats[0], stream);
  report(stats);
}

}  // namespace

TEST_CASE("cuda adam: n = 1000003 with fp32 gradients for 50 steps") {
  if (!have_gpu()) SKIP("no CUDA device");
  large_runs(DType::f32, 1000);
}

TEST_CASE("cuda adam: n = 1000003 with fp16 gradients for 50 steps") {
  if (!have_gpu()) SKIP("no CUDA device");
  large_runs(DType::f16, 2000);
}

TEST_CASE("cuda adam: n = 1000003 with bf16 gradients for 50 steps") {
  if (!have_gpu()) SKIP("no CUDA device");
  large_runs(DType::bf16, 3000);
}

TEST_CASE("cuda adam: more elements than threads in the grid (grid-stride loop)") {
  if (!have_gpu()) SKIP("no CUDA device");
  // 8192 blocks of 256 threads at most, 4 elements each when aligned: 9000011 elements make
  // every thread loop on both paths.
  TestStream stream;
  HostAdam host;
  Stats stats;
  Config c;
  c.grad = DType::bf16;
  c.weight_decay = 0.1f;
  c.copy = true;
  run_adam(c, Layout{0, 0, 0}, 9000011, 3, 77, host, stats, stream);
  run_adam(c, Layout{2, 1, 3}, 9000011, 3, 78, host, stats, stream);
  check_unbounded(stats);
}

TEST_CASE("cuda adam: special values match the host bit for bit (NaNs as NaNs)") {
  if (!have_gpu()) SKIP("no CUDA device");
  // Gradients: infinities, NaN, zeros of both signs, subnormals, the largest finite values;
  // parameters: zeros of both signs, subnormals, huge values. Every result must match the fp32
  // emulation and HostAdam: the same bits, or NaN on both sides (NaN payloads differ between the
  // GPU, 0x7fffffff, and x86). The GPU must not flush subnormals to zero.
  TestStream stream;
  HostAdam host;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float grads[] = {inf,     -inf,  nan,      0.0f,  -0.0f,  1e-40f,
                         -3e-45f, 6e-8f, 65504.0f, 3e38f, -1e-3f, 0.5f};
  const float params[] = {0.0f, -0.0f, 1e-40f, -1e-38f, 3e38f, -2.5f, 1.0f, 0x1p-149f};
  std::vector<float> g32, p0, m0, v0;
  for (float g : grads)
    for (float p : params) {
      g32.push_back(g);
      p0.push_back(p);
      m0.push_back(p == 1.0f ? 1e-39f : 0.01f * float(g32.size() % 7) - 0.03f);
      v0.push_back(p == -2.5f ? 0.0f : 1e-6f * float(g32.size() % 5));
    }
  const size_t n = g32.size();
  auto same = [](float a, float b) {
    return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b));
  };
  for (DType gt : kTypes)
    for (bool adam_w : {true, false}) {
      INFO("grad " << zero::to_string(gt) << (adam_w ? ", adamw" : ", adam+l2"));
      AdamParams hyper;
      hyper.adam_w_mode = adam_w;
      hyper.weight_decay = 0.05f;
      AdamStep step;
      step.step = 3;
      step.lr = 0.01f;
      step.grad_scale = 0.5f;
      const AdamScalars s = zero::optim::adam_scalars(hyper, step);
      std::vector<uint8_t> gbytes(n * size_of(gt));
      std::vector<float> gw(n);
      for (size_t i = 0; i < n; ++i) gw[i] = store_as(gt, g32[i], &gbytes[i * size_of(gt)]);
      DeviceBuffer dp(4 * n), dm(4 * n), dv(4 * n), dg(gbytes.size()), dc(2 * n);
      upload(dp.get(), p0.data(), 4 * n, stream);
      upload(dm.get(), m0.data(), 4 * n, stream);
      upload(dv.get(), v0.data(), 4 * n, stream);
      upload(dg.get(), gbytes.data(), gbytes.size(), stream);
      zero::optim::cuda_adam_step(
          hyper, step, reinterpret_cast<float*>(dp.get()), reinterpret_cast<float*>(dm.get()),
          reinterpret_cast<float*>(dv.get()), dg.get(), gt, n, dc.get(), DType::bf16, stream.get());
      std::vector<float> gp(n), gm(n), gv(n);
      std::vector<uint16_t> gc(n), hc(n);
      download(gp.data(), dp.get(), 4 * n, stream);
      download(gm.data(), dm.get(), 4 * n, stream);
      download(gv.data(), dv.get(), 4 * n, stream);
      download(gc.data(), dc.get(), 2 * n, stream);
      stream.sync();
      std::vector<float> hp = p0, hm = m0, hv = v0;
      host.step(hyper, step, hp.data(), hm.data(), hv.data(), gbytes.data(), gt, n, hc.data(),
                DType::bf16);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        float ep = p0[i], em = m0[i], ev = v0[i];
        emulate_step(s, adam_w, gw[i], ep, em, ev);
        // The copy is dtype.hpp's rounding of the GPU's own p, NaN included (both sides run the
        // same bit code); HostAdam's copy matches unless p is a NaN (payloads differ).
        const bool ok = same(gp[i], ep) && same(gm[i], em) && same(gv[i], ev) &&
                        same(gp[i], hp[i]) && same(gm[i], hm[i]) && same(gv[i], hv[i]) &&
                        gc[i] == zero::to_bfloat16(gp[i]).bits &&
                        (std::isnan(gp[i]) || gc[i] == hc[i]);
        if (!ok && bad++ == 0)
          FAIL_CHECK("element " << i << ": grad " << hex(bits(gw[i])) << " p " << hex(bits(p0[i]))
                                << " -> gpu " << hex(bits(gp[i])) << " " << hex(bits(gm[i])) << " "
                                << hex(bits(gv[i])) << ", emulation " << hex(bits(ep)) << " "
                                << hex(bits(em)) << " " << hex(bits(ev)) << ", host "
                                << hex(bits(hp[i])) << " " << hex(bits(hm[i])) << " "
                                << hex(bits(hv[i])));
      }
      CHECK(bad == 0);
    }
}

TEST_CASE("cuda adam: n = 0 launches nothing even with null pointers") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  for (DType g : kTypes)
    zero::optim::cuda_adam_step(AdamParams{}, AdamStep{}, nullptr, nullptr, nullptr, nullptr, g, 0,
                                nullptr, DType::bf16, stream.get());
  for (DType g : kTypes)
    zero::optim::cuda_has_inf_or_nan_async(nullptr, g, 0, nullptr, stream.get());
  stream.sync();
  CHECK(cudaGetLastError() == cudaSuccess);
  // A null state pointer with n > 0 is an argument error, caught before any launch.
  DeviceBuffer g(64);
  CHECK_THROWS_AS(
      zero::optim::cuda_adam_step(AdamParams{}, AdamStep{}, nullptr, nullptr, nullptr, g.get(),
                                  DType::f32, 4, nullptr, DType::bf16, stream.get()),
      zero::Error);
}

// ---- squared norm --------------------------------------------------------------------------

namespace {

// n values of dtype with magnitudes over many decades (1e-6 .. 1e3), some zeros, as bytes.
std::vector<uint8_t> norm_data(DType t, size_t n, uint64_t seed, std::vector<double>& widened) {
  std::vector<uint8_t> b(n * size_of(t));
  widened.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double mag = std::pow(10.0, -6.0 + 9.0 * uniform(seed, 0, i, 0));
    const double x = i % 53 == 7 ? 0.0 : mag * (2 * uniform(seed, 0, i, 1) - 1);
    widened[i] = store_as(t, float(x), &b[i * size_of(t)]);
  }
  return b;
}

// The bound of adam_kernel.hpp: relative error <= (c + 24) u, c = ceil(n / 2^20), plus 2^-150
// per square for squares that underflow into fp32 subnormals.
double norm_tolerance(size_t n, double exact) {
  const double c = double(std::max<size_t>(1, (n + (size_t(1) << 20) - 1) >> 20));
  return (c + 24) * kU * exact + double(n) * kSubnormalHalfUlp;
}

float device_norm(const void* dgrad, DType t, size_t n, const TestStream& s, float* partials) {
  DeviceBuffer out(sizeof(float));
  ZERO_CHECK_CUDA(cudaMemsetAsync(out.get(), 0xff, sizeof(float), s.get()));  // NaN until written
  zero::optim::cuda_squared_norm_async(dgrad, t, n, reinterpret_cast<float*>(out.get()), s.get(),
                                       partials);
  float r = 0;
  download(&r, out.get(), sizeof r, s);
  s.sync();
  return r;
}

int device_flag(const void* dgrad, DType t, size_t n, int initial, const TestStream& s) {
  DeviceBuffer flag(sizeof(int));
  ZERO_CHECK_CUDA(
      cudaMemcpyAsync(flag.get(), &initial, sizeof initial, cudaMemcpyHostToDevice, s.get()));
  zero::optim::cuda_has_inf_or_nan_async(dgrad, t, n, reinterpret_cast<int*>(flag.get()), s.get());
  int r = -1;
  download(&r, flag.get(), sizeof r, s);
  s.sync();
  return r;
}

}  // namespace

TEST_CASE(
    "cuda squared norm: within its bound of a double sum and deterministic across alignments") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  DeviceBuffer partials(zero::optim::kCudaNormPartials * sizeof(float));
  for (DType t : kTypes)
    for (size_t n :
         {size_t(1), size_t(7), size_t(17), size_t(4099), size_t(1000003), size_t(9000011)}) {
      INFO(zero::to_string(t) << ", n " << n);
      std::vector<double> w;
      const std::vector<uint8_t> bytes = norm_data(t, n, n * 3 + size_t(t), w);
      double exact = 0;  // squares of fp32 values are exact in double; n * 2^-53 is negligible
      for (double x : w) exact += x * x;
      // The same values at element offsets 0 (vector loads) and 1 (element-wise loads).
      DeviceBuffer d(bytes.size() + 16);
      upload(d.get(), bytes.data(), bytes.size(), stream);
      const float aligned = device_norm(d.get(), t, n, stream, nullptr);
      upload(d.get() + size_of(t), bytes.data(), bytes.size(), stream);
      const float shifted =
          device_norm(d.get() + size_of(t), t, n, stream, reinterpret_cast<float*>(partials.get()));
      const float again = device_norm(d.get() + size_of(t), t, n, stream, nullptr);
      INFO("gpu " << aligned << ", exact " << exact);
      CHECK(std::fabs(double(aligned) - exact) <= norm_tolerance(n, exact));
      CHECK(bits(shifted) == bits(aligned));  // the tree depends on n only
      CHECK(bits(again) == bits(aligned));
    }
}

TEST_CASE("cuda squared norm: n = 0 gives 0 and inf or NaN propagate") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  CHECK(bits(device_norm(nullptr, DType::f32, 0, stream, nullptr)) == 0u);
  for (DType t : kTypes) {
    INFO(zero::to_string(t));
    std::vector<double> w;
    std::vector<uint8_t> bytes = norm_data(t, 1001, 5, w);
    DeviceBuffer d(bytes.size());
    store_as(t, std::numeric_limits<float>::infinity(), &bytes[500 * size_of(t)]);
    upload(d.get(), bytes.data(), bytes.size(), stream);
    CHECK(std::isinf(device_norm(d.get(), t, 1001, stream, nullptr)));
    store_as(t, std::numeric_limits<float>::quiet_NaN(), &bytes[1000 * size_of(t)]);
    upload(d.get(), bytes.data(), bytes.size(), stream);
    CHECK(std::isnan(device_norm(d.get(), t, 1001, stream, nullptr)));
  }
}

TEST_CASE("cuda inf/nan: exact flags that are set but never cleared and only inside the range") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  // Non-finite encodings per type: +inf, -inf, quiet NaN, signalling NaN, negative NaN.
  const uint32_t bad32[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00001u};
  const uint16_t bad16[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01};
  const uint16_t badbf[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1};
  // The largest finite values must not count.
  const uint32_t max32 = 0x7f7fffffu;
  const uint16_t max16 = 0x7bff, maxbf = 0x7f7f;
  for (DType t : kTypes)
    for (size_t n : {size_t(1), size_t(7), size_t(17), size_t(1000003)})
      for (size_t offset : {size_t(0), size_t(1)}) {
        INFO(zero::to_string(t) << ", n " << n << ", offset " << offset);
        const size_t es = size_of(t);
        std::vector<double> w;
        std::vector<uint8_t> bytes = norm_data(t, offset + n + 1, n, w);
        auto put = [&](size_t i, uint32_t code) { std::memcpy(&bytes[i * es], &code, es); };
        put(offset + n / 2, t == DType::f32 ? max32 : t == DType::f16 ? max16 : maxbf);
        // Infinities just outside the range: before it (when offset 1) and right after it.
        if (offset) put(0, t == DType::f32 ? bad32[0] : t == DType::f16 ? bad16[0] : badbf[0]);
        put(offset + n, t == DType::f32 ? bad32[1] : t == DType::f16 ? bad16[1] : badbf[1]);
        DeviceBuffer d(bytes.size());
        upload(d.get(), bytes.data(), bytes.size(), stream);
        const uint8_t* range = d.get() + offset * es;
        CHECK(device_flag(range, t, n, 0, stream) == 0);
        CHECK(device_flag(range, t, n, 1, stream) == 1);  // never cleared
        for (int k = 0; k < 5; ++k)
          for (size_t at : {size_t(0), n / 2, n - 1}) {
            INFO("code " << k << " at " << at);
            std::vector<uint8_t> one = bytes;
            const uint32_t code = t == DType::f32   ? bad32[k]
                                  : t == DType::f16 ? bad16[k]
                                                    : badbf[k];
            std::memcpy(&one[(offset + at) * es], &code, es);
            upload(d.get(), one.data(), one.size(), stream);
            CHECK(device_flag(range, t, n, 0, stream) == 1);
          }
      }
}

TEST_CASE("cuda reductions: more than 2^32 elements (size_t indexing)") {
  if (!have_gpu()) SKIP("no CUDA device");
  // 2^32 + 9 bf16 values (8 GiB), every one 0x3f3f = 0.74609375, whose square is exact in fp32:
  // an index that wrapped at 2^32 would miscount the sum or miss the infinity placed past 2^32.
  const size_t n = (size_t(1) << 32) + 9;
  size_t free_bytes = 0, total_bytes = 0;
  ZERO_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < 2 * n + (size_t(1) << 30)) SKIP("needs 9 GiB of free device memory");
  TestStream stream;
  DeviceBuffer d(2 * n);
  ZERO_CHECK_CUDA(cudaMemsetAsync(d.get(), 0x3f, d.bytes(), stream.get()));
  const double x = zero::to_float(zero::bfloat16::from_bits(0x3f3f));
  const double exact = double(n) * x * x;
  const float got = device_norm(d.get(), DType::bf16, n, stream, nullptr);
  INFO("gpu " << got << ", exact " << exact);
  CHECK(std::fabs(double(got) - exact) <= norm_tolerance(n, exact));
  CHECK(device_flag(d.get(), DType::bf16, n, 0, stream) == 0);
  const uint16_t inf = 0x7f80;
  upload(d.get() + 2 * ((size_t(1) << 32) + 5), &inf, 2, stream);
  CHECK(device_flag(d.get(), DType::bf16, n, 0, stream) == 1);
  // The infinity is outside the first 2^32 elements: a range that ends before it is clean.
  CHECK(device_flag(d.get(), DType::bf16, size_t(1) << 32, 0, stream) == 0);
}
