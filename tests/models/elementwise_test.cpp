// Tests of the vectorised fp32 element-wise kernels (models/cpu/elementwise.hpp): each kernel
// against a double-precision evaluation of its formula, with a stated bound; every vector path
// the CPU has (AVX-512, AVX2, generic) giving the same bits; and the results independent of the
// oneTBB thread count. Lengths are chosen to leave tails (n % 16 != 0) and to span several
// parallel blocks.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "models/cpu/elementwise.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/kernels.hpp"

namespace ew = zero::models::cpu::elementwise;
namespace kern = zero::models::cpu;
using Floats = std::vector<float>;

namespace {

Floats random_floats(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Floats v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<double> up(const Floats& v) { return {v.begin(), v.end()}; }

// max |got - want| / max |want|: the error relative to the tensor's scale.
double scaled_error(const Floats& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<ew::Simd> paths() {
  std::vector<ew::Simd> p;
  for (ew::Simd s : {ew::Simd::generic, ew::Simd::avx2, ew::Simd::avx512})
    if (ew::supported(s)) p.push_back(s);
  return p;
}

// Puts the default path back when a test ends, also on failure.
struct RestoreSimd {
  ~RestoreSimd() { ew::use(ew::Simd::best); }
};

// Shapes: a row width with a tail, rows spanning several row blocks (16) and sum blocks (64),
// a vocabulary row with a tail; element counts spanning several 16384-element blocks.
constexpr int64_t kN = 150, kC = 200, kV = 1003, kElems = 40000 + 7;

// Every kernel on fixed inputs; outputs concatenated by name.
std::vector<std::pair<std::string, Floats>> run_all() {
  std::vector<std::pair<std::string, Floats>> out;
  const Floats x = random_floats(kElems, 1, -6, 6), dy = random_floats(kElems, 2, -1, 1);
  Floats y(kElems), dx(kElems);
  ew::gelu_forward(y.data(), x.data(), kElems);
  ew::gelu_backward(dx.data(), dy.data(), x.data(), kElems);
  out.emplace_back("gelu.y", y);
  out.emplace_back("gelu.dx", dx);
  ew::add(y.data(), x.data(), dy.data(), kElems);
  out.emplace_back("add", y);

  const Floats lx = random_floats(kN * kC, 3, -2, 3), lw = random_floats(kC, 4, 0.5f, 1.5f),
               lb = random_floats(kC, 5, -0.5f, 0.5f), ldy = random_floats(kN * kC, 6, -1, 1);
  Floats ly(kN * kC), mean(kN), rstd(kN), ldx(kN * kC), dw(kC), db(kC);
  ew::layernorm_forward(ly.data(), mean.data(), rstd.data(), lx.data(), lw.data(), lb.data(), kN,
                        kC);
  ew::layernorm_backward(ldx.data(), dw.data(), db.data(), ldy.data(), lx.data(), lw.data(),
                         mean.data(), rstd.data(), kN, kC);
  out.emplace_back("layernorm.y", ly);
  out.emplace_back("layernorm.rstd", rstd);
  out.emplace_back("layernorm.dx", ldx);
  out.emplace_back("layernorm.dw", dw);
  out.emplace_back("layernorm.db", db);
  ew::add_bias(ly.data(), lb.data(), kN, kC);
  out.emplace_back("add_bias", ly);

  const Floats logits = random_floats(kN * kV, 7, -8, 8);
  std::vector<int32_t> targets(kN);
  for (int64_t r = 0; r < kN; ++r) targets[r] = r % 7 == 3 ? -1 : int32_t((r * 37) % kV);
  Floats losses(kN), dl(kN * kV);
  const float loss = ew::cross_entropy_forward(losses.data(), logits.data(), targets.data(), kN, kV);
  ew::cross_entropy_backward(dl.data(), logits.data(), targets.data(), kN, kV, 0.25f);
  out.emplace_back("cross_entropy.loss", Floats{loss});
  out.emplace_back("cross_entropy.losses", losses);
  out.emplace_back("cross_entropy.dlogits", dl);

  Floats p(logits.begin(), logits.begin() + kV), d(dy.begin(), dy.begin() + kV);
  ew::softmax_causal_row(p.data(), kV - 10, kV);
  ew::softmax_causal_backward_row(d.data(), p.data(), kV - 10, kV);
  out.emplace_back("softmax.p", p);
  out.emplace_back("softmax.d", d);
  return out;
}

}  // namespace

TEST_CASE("element-wise exp is exp_fast bit for bit and within 2 ulp of exp") {
  RestoreSimd restore;
  // Every float in [-87, 88] at a stride, plus the clamps' edges.
  Floats x;
  for (float v = -87.0f; v <= 88.0f; v += 0.00731f) x.push_back(v);
  x.push_back(-87.0f);
  x.push_back(88.0f);
  for (ew::Simd s : paths()) {
    INFO(ew::to_string(s));
    ew::use(s);
    Floats e(x.size());
    ew::exp_sum(e.data(), x.data(), 0.0f, int64_t(x.size()));
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      REQUIRE(e[i] == kern::detail::exp_fast(x[i]));
      const double want = std::exp(double(x[i]));
      worst = std::max(worst, std::abs(double(e[i]) - want) / want);
    }
    // 2 ulp of a float is at most 2 * 2^-23 ~ 2.4e-7 relative: the exp_fast contract (degree-7
    // polynomial, truncation < 7e-9, plus the rounding of ~16 fp32 operations). Observed below.
    CHECK(worst <= 2.4e-7);
    UNSCOPED_INFO("max relative error of exp over [-87, 88]: " << worst);
  }
  // A NaN stays NaN (a diverged run must not look finite).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float e = 0;
  ew::exp_sum(&e, &nan, 0.0f, 1);
  CHECK(std::isnan(e));
}

TEST_CASE("element-wise kernels agree with a double evaluation of their formulas") {
  const Floats x = random_floats(kElems, 1, -6, 6), dy = random_floats(kElems, 2, -1, 1);
  Floats y(kElems), dx(kElems);
  ew::gelu_forward(y.data(), x.data(), kElems);
  ew::gelu_backward(dx.data(), dy.data(), x.data(), kElems);
  // GELU in its tanh form (GPT-2's), so the logistic rewrite is checked too. Per element: the
  // exp's 2 ulp plus ~10 fp32 roundings, and the few-ulp rounding of exp's argument -2u, which
  // exp turns into a relative error |2u| times as large: so 1e-6 (~8 ulp) times (1 + |2u|). The
  // backward's terms s and 2 v s (1 - s) du can cancel, so its bound is relative to their
  // magnitudes, not to the (possibly ~0) result.
  constexpr double a = 0.7978845608028654, c = 0.044715;
  for (int64_t i = 0; i < kElems; ++i) {
    const double v = x[i], u = a * (v + c * v * v * v), th = std::tanh(u);
    const double want_y = 0.5 * v * (1 + th);
    const double s = 0.5 * (1 + th), du = a * (1 + 3 * c * v * v);
    const double t = 0.5 * v * (1 - th * th) * du;  // = 2 v s (1 - s) du
    const double want_dx = dy[i] * (s + t);
    const double amp = 1 + 2 * std::abs(u);
    INFO("x = " << x[i]);
    REQUIRE(std::abs(y[i] - want_y) <= 1e-6 * amp * std::abs(want_y));
    REQUIRE(std::abs(dx[i] - want_dx) <=
            1e-6 * amp * std::abs(dy[i]) * (std::abs(s) + std::abs(t)));
  }

  // The adds are one IEEE addition per element: exactly the double sum rounded to float.
  ew::add(y.data(), x.data(), dy.data(), kElems);
  for (int64_t i = 0; i < kElems; ++i) REQUIRE(y[i] == float(double(x[i]) + double(dy[i])));
  Floats rows(dy.begin(), dy.begin() + 37 * 101);
  ew::add_bias(rows.data(), x.data(), 37, 101);
  for (int64_t i = 0; i < 37 * 101; ++i)
    REQUIRE(rows[i] == float(double(dy[i]) + double(x[i % 101])));

  // Layernorm, cross-entropy and the softmax rows against the fp64 kernels of kernels.hpp (the
  // gradient checks' reference): the same inputs, only fp32 rounding differs. Each output is a
  // chain of at most ~30 roundings after a 16-way partial sum of <= 1003 terms (~log2(63) + 4
  // more levels): 4e-6 relative to the tensor's scale, as cpu_kernels_test's fp32-vs-fp64 bound.
  constexpr double kBound = 4e-6;
  const Floats lx = random_floats(kN * kC, 3, -2, 3), lw = random_floats(kC, 4, 0.5f, 1.5f),
               lb = random_floats(kC, 5, -0.5f, 0.5f), ldy = random_floats(kN * kC, 6, -1, 1);
  Floats ly(kN * kC), mean(kN), rstd(kN), ldx(kN * kC), dw(kC), db(kC);
  ew::layernorm_forward(ly.data(), mean.data(), rstd.data(), lx.data(), lw.data(), lb.data(), kN,
                        kC);
  ew::layernorm_backward(ldx.data(), dw.data(), db.data(), ldy.data(), lx.data(), lw.data(),
                         mean.data(), rstd.data(), kN, kC);
  const auto dlx = up(lx), dlw = up(lw), dlb = up(lb), dldy = up(ldy);
  std::vector<double> ry(kN * kC), rmean(kN), rrstd(kN), rdx(kN * kC), rdw(kC, 0.0), rdb(kC, 0.0);
  kern::layernorm_forward<double>(ry.data(), rmean.data(), rrstd.data(), dlx.data(), dlw.data(),
                                  dlb.data(), kN, kC);
  kern::layernorm_backward<double>(rdx.data(), rdw.data(), rdb.data(), dldy.data(), dlx.data(),
                                   dlw.data(), rmean.data(), rrstd.data(), kN, kC);
  CHECK(scaled_error(ly, ry) <= kBound);
  CHECK(scaled_error(mean, rmean) <= kBound);
  CHECK(scaled_error(rstd, rrstd) <= kBound);
  CHECK(scaled_error(ldx, rdx) <= kBound);
  CHECK(scaled_error(dw, rdw) <= kBound);
  CHECK(scaled_error(db, rdb) <= kBound);

  const Floats logits = random_floats(kN * kV, 7, -8, 8);
  std::vector<int32_t> targets(kN);
  for (int64_t r = 0; r < kN; ++r) targets[r] = r % 7 == 3 ? -1 : int32_t((r * 37) % kV);
  Floats losses(kN), dl(kN * kV);
  const float loss = ew::cross_entropy_forward(losses.data(), logits.data(), targets.data(), kN, kV);
  int64_t count = 0;
  for (int32_t t : targets) count += t >= 0;
  ew::cross_entropy_backward(dl.data(), logits.data(), targets.data(), kN, kV, 2.0f / float(count));
  const auto dlog = up(logits);
  std::vector<double> rlosses(kN), rdl(kN * kV);
  const double rloss =
      kern::cross_entropy_forward<double>(rlosses.data(), dlog.data(), targets.data(), kN, kV);
  kern::cross_entropy_backward<double>(rdl.data(), dlog.data(), targets.data(), kN, kV, 2.0);
  CHECK(std::abs(loss - rloss) <= kBound * std::abs(rloss));
  CHECK(scaled_error(losses, rlosses) <= kBound);
  CHECK(scaled_error(dl, rdl) <= kBound);

  // The causal softmax row and its backward: a row of kV with kV - 10 valid entries.
  const int64_t n = kV - 10;
  Floats p(logits.begin(), logits.begin() + kV), d(ldy.begin(), ldy.begin() + kV);
  const Floats d0 = d;
  ew::softmax_causal_row(p.data(), n, kV);
  ew::softmax_causal_backward_row(d.data(), p.data(), n, kV);
  double m = -1e300, sum = 0;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, double(logits[j]));
  for (int64_t j = 0; j < n; ++j) sum += std::exp(double(logits[j]) - m);
  std::vector<double> rp(kV, 0.0), rd(kV, 0.0);
  double dotp = 0;
  for (int64_t j = 0; j < n; ++j) rp[j] = std::exp(double(logits[j]) - m) / sum;
  for (int64_t j = 0; j < n; ++j) dotp += double(p[j]) * d0[j];
  for (int64_t j = 0; j < n; ++j) rd[j] = double(p[j]) * (d0[j] - dotp);
  CHECK(scaled_error(p, rp) <= kBound);
  CHECK(scaled_error(d, rd) <= kBound);
  for (int64_t j = n; j < kV; ++j) REQUIRE((p[j] == 0.0f && d[j] == 0.0f));
}

TEST_CASE("element-wise kernels give the same bits on every vector path") {
  RestoreSimd restore;
  const auto ps = paths();
  UNSCOPED_INFO("paths on this CPU: " << ps.size());
  ew::use(ps.front());
  const auto ref = run_all();
  for (size_t k = 1; k < ps.size(); ++k) {
    ew::use(ps[k]);
    CHECK(ew::active() == ps[k]);
    const auto got = run_all();
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO(ew::to_string(ps[k]) << " vs " << ew::to_string(ps.front()) << ": " << ref[i].first);
      CHECK(same_bits(got[i].second, ref[i].second));
    }
  }
}

TEST_CASE("element-wise kernels give the same bits on 1 and 2 threads") {
  const auto run = [](size_t threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    return run_all();
  };
  const auto one = run(1), two = run(2), again = run(2);
  for (size_t i = 0; i < one.size(); ++i) {
    INFO(one[i].first);
    CHECK(same_bits(one[i].second, two[i].second));
    CHECK(same_bits(two[i].second, again[i].second));
  }
}

TEST_CASE("asking for a vector path the CPU lacks is an error") {
  RestoreSimd restore;
  CHECK(ew::active() != ew::Simd::best);
  for (ew::Simd s : {ew::Simd::avx2, ew::Simd::avx512}) {
    if (ew::supported(s)) continue;
    CHECK_THROWS_WITH(ew::use(s), Catch::Matchers::ContainsSubstring("cannot run"));
  }
  ew::use(ew::Simd::best);
  CHECK(ew::active() != ew::Simd::best);
}
