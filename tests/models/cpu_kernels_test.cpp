// Tests of the cpu model kernels (models/cpu/kernels.hpp), called directly.
//
// Gradient checks: every backward kernel, in double precision, against central finite differences
// of L = sum(r * y) for a random r (the kernels' dy is then r), for each input and parameter of
// each op. Inputs come from fixed seeds and are rounded to float, so the fp32 kernels can be
// compared with the fp64 ones on the very same values.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "models/cpu/kernels.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"

namespace kern = zero::models::cpu;
using Catch::Matchers::ContainsSubstring;
using Vec = std::vector<double>;

namespace {

// Small shapes: every loop and head boundary is crossed, each check takes microseconds.
constexpr int64_t B = 2, T = 5, C = 8, NH = 2, V = 11, OC = 6, Tmax = 7, N = B * T;

// Central differences with h = 1e-6 on O(1) inputs: truncation error h^2 |f'''| / 6 ~ 1e-13,
// rounding error ~ eps |L| / h ~ 2e-16 * 10 / 1e-6 = 2e-9; the largest gradient entry of every
// check is O(0.1 .. 1), so 1e-6 relative to it leaves more than two orders of margin (observed:
// at most 2e-9).
constexpr double kStep = 1e-6;
constexpr double kGradTol = 1e-6;

// Uniform in [lo, hi), rounded to float (so fp32 and fp64 runs see the same inputs).
Vec random_vec(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = double(float(dist(gen)));
  return v;
}

std::vector<int32_t> random_ids(size_t n, uint64_t seed, int32_t hi) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double max_abs(const Vec& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max |a|.
template <class E>
double rel_diff(const Vec& a, const std::vector<E>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - double(b[i])));
  return m / std::max(max_abs(a), std::numeric_limits<double>::min());
}

// Checks `analytic`, the kernels' gradient of loss() with respect to x, against central
// differences (x is perturbed one element at a time and restored).
void check_gradient(const std::string& name, Vec& x, const Vec& analytic,
                    const std::function<double()>& loss) {
  REQUIRE(analytic.size() == x.size());
  Vec numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double up = loss();
    x[i] = saved - kStep;
    const double down = loss();
    x[i] = saved;
    numeric[i] = (up - down) / (2 * kStep);
  }
  INFO("gradient of " << name);
  REQUIRE(max_abs(analytic) > 1e-3);  // a vanishing gradient would make the check vacuous
  CHECK(rel_diff(numeric, analytic) <= kGradTol);
}

// Fresh inputs for every test case: same seeds, same values.
struct Inputs {
  std::vector<int32_t> tokens = random_ids(N, 1, V);
  std::vector<int32_t> targets = [] {
    auto t = random_ids(N, 2, V);
    t[1] = t[6] = -1;  // two ignored rows
    return t;
  }();
  Vec wte = random_vec(V * C, 3), wpe = random_vec(Tmax * C, 4);
  Vec x = random_vec(N * C, 5, -1, 2);  // mean ~0.5: layernorm's centring matters
  Vec ln_w = random_vec(C, 6, 0.5, 1.5), ln_b = random_vec(C, 7);
  Vec lin_w = random_vec(C * OC, 8), lin_b = random_vec(OC, 9);
  Vec head_w = random_vec(V * C, 10);
  Vec gelu_x = random_vec(N * C, 11, -3, 3);  // both tails and the bend of GELU
  Vec qkv = random_vec(N * 3 * C, 12, -2, 2);  // wide enough for peaked attention rows
  Vec logits = random_vec(N * V, 13, -3, 3);
  Inputs() { tokens[7] = tokens[2]; }  // a repeated token: dwte rows sum several positions
};

}  // namespace

TEST_CASE("embedding_backward is the gradient of embedding_forward") {
  Inputs in;
  const Vec r = random_vec(N * C, 100);
  const auto loss = [&] {
    Vec out(N * C);
    kern::embedding_forward<double>(out.data(), in.tokens.data(), in.wte.data(), in.wpe.data(), B,
                                    T, C, V);
    return dot(r, out);
  };
  Vec dwte(V * C, 0.0), dwpe(Tmax * C, 0.0);
  kern::embedding_backward<double>(dwte.data(), dwpe.data(), r.data(), in.tokens.data(), B, T, C,
                                   V);
  check_gradient("wte", in.wte, dwte, loss);
  check_gradient("wpe", in.wpe, dwpe, loss);
}

TEST_CASE("layernorm_backward is the gradient of layernorm_forward") {
  Inputs in;
  const Vec r = random_vec(N * C, 101);
  Vec y(N * C), mean(N), rstd(N);
  const auto loss = [&] {
    kern::layernorm_forward<double>(y.data(), mean.data(), rstd.data(), in.x.data(),
                                    in.ln_w.data(), in.ln_b.data(), N, C);
    return dot(r, y);
  };
  loss();  // mean and rstd of the unperturbed input, for backward
  Vec dx(N * C), dw(C, 0.0), db(C, 0.0);
  kern::layernorm_backward<double>(dx.data(), dw.data(), db.data(), r.data(), in.x.data(),
                                   in.ln_w.data(), mean.data(), rstd.data(), N, C);
  check_gradient("x", in.x, dx, loss);
  check_gradient("w", in.ln_w, dw, loss);
  check_gradient("b", in.ln_b, db, loss);
}

TEST_CASE("linear_backward is the gradient of linear_forward") {
  Inputs in;
  const Vec r = random_vec(N * OC, 102);
  const auto loss = [&] {
    Vec y(N * OC);
    kern::linear_forward<double>(y.data(), in.x.data(), in.lin_w.data(), in.lin_b.data(), true, N,
                                 C, OC);
    return dot(r, y);
  };
  Vec dx(N * C), dw(C * OC, 0.0), db(OC, 0.0);
  kern::linear_backward<double>(dx.data(), dw.data(), db.data(), true, r.data(), in.x.data(),
                                in.lin_w.data(), N, C, OC);
  check_gradient("x", in.x, dx, loss);
  check_gradient("w", in.lin_w, dw, loss);
  check_gradient("b", in.lin_b, db, loss);

  SECTION("without a bias, and without dx") {
    Vec y(N * OC), y_bias(N * OC);
    kern::linear_forward<double>(y.data(), in.x.data(), in.lin_w.data(), nullptr, false, N, C, OC);
    kern::linear_forward<double>(y_bias.data(), in.x.data(), in.lin_w.data(), in.lin_b.data(),
                                 true, N, C, OC);
    // |x w| <= 8 here, so the bias add moves the result by a few ulps of 8 at most.
    for (int64_t i = 0; i < N * OC; ++i)
      CHECK(std::abs(y_bias[i] - y[i] - in.lin_b[i % OC]) < 1e-14);
    Vec dw2(C * OC, 0.0);
    kern::linear_backward<double>(nullptr, dw2.data(), nullptr, false, r.data(), in.x.data(),
                                  in.lin_w.data(), N, C, OC);
    CHECK(dw2 == dw);  // the same products in the same order
  }
}

TEST_CASE("linear_t_backward is the gradient of linear_t_forward") {
  Inputs in;
  const Vec r = random_vec(N * V, 103);
  const auto loss = [&] {
    Vec y(N * V);
    kern::linear_t_forward<double>(y.data(), in.x.data(), in.head_w.data(), N, C, V);
    return dot(r, y);
  };
  Vec dx(N * C), dw(V * C, 0.0);
  kern::linear_t_backward<double>(dx.data(), dw.data(), r.data(), in.x.data(), in.head_w.data(), N,
                                  C, V);
  check_gradient("x", in.x, dx, loss);
  check_gradient("w", in.head_w, dw, loss);
}

TEST_CASE("gelu_backward is the gradient of gelu_forward") {
  Inputs in;
  const Vec r = random_vec(N * C, 104);
  const auto loss = [&] {
    Vec y(N * C);
    kern::gelu_forward<double>(y.data(), in.gelu_x.data(), N * C);
    return dot(r, y);
  };
  Vec dx(N * C);
  kern::gelu_backward<double>(dx.data(), r.data(), in.gelu_x.data(), N * C);
  check_gradient("x", in.gelu_x, dx, loss);

  // GPT-2's formula at a few points (values from the formula evaluated by hand in long double).
  const Vec pts = {-3.0, -0.5, 0.0, 1.0, 2.5};
  Vec y(pts.size());
  kern::gelu_forward<double>(y.data(), pts.data(), int64_t(pts.size()));
  for (size_t i = 0; i < pts.size(); ++i) {
    const long double v = pts[i];
    const long double want =
        0.5L * v *
        (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846L) * (v + 0.044715L * v * v * v)));
    CHECK(std::abs(y[i] - double(want)) < 4e-15);  // ~8 ulps of values up to 2.5
  }
}

TEST_CASE("attention_backward is the gradient of attention_forward") {
  Inputs in;
  const Vec r = random_vec(N * C, 105);
  Vec probs(B * NH * T * T);
  const auto loss = [&] {
    Vec out(N * C);
    kern::attention_forward<double>(out.data(), probs.data(), in.qkv.data(), B, T, C, NH);
    return dot(r, out);
  };
  loss();  // probs of the unperturbed input, for backward
  Vec dqkv(N * 3 * C);
  kern::attention_backward<double>(dqkv.data(), r.data(), in.qkv.data(), probs.data(), B, T, C,
                                   NH);
  check_gradient("qkv", in.qkv, dqkv, loss);
}

TEST_CASE("cross_entropy_backward is the gradient of cross_entropy_forward") {
  Inputs in;
  Vec losses(N);
  const auto loss = [&] {
    return kern::cross_entropy_forward<double>(losses.data(), in.logits.data(), in.targets.data(),
                                               N, V);
  };
  Vec dlogits(N * V);
  kern::cross_entropy_backward<double>(dlogits.data(), in.logits.data(), in.targets.data(), N, V,
                                       1.0);
  check_gradient("logits", in.logits, dlogits, loss);

  SECTION("scale multiplies the gradient") {
    Vec scaled(N * V);
    kern::cross_entropy_backward<double>(scaled.data(), in.logits.data(), in.targets.data(), N, V,
                                         2.5);
    // scale enters through scale / count: one more rounding of entries below 1.
    for (int64_t i = 0; i < N * V; ++i) CHECK(std::abs(scaled[i] - 2.5 * dlogits[i]) < 1e-15);
  }
}

TEST_CASE("cross-entropy ignores rows whose target is -1") {
  Inputs in;
  Vec losses(N, 123.0), dlogits(N * V, std::nan(""));
  const double loss = kern::cross_entropy_forward<double>(losses.data(), in.logits.data(),
                                                          in.targets.data(), N, V);
  kern::cross_entropy_backward<double>(dlogits.data(), in.logits.data(), in.targets.data(), N, V,
                                       1.0);
  double total = 0;
  int count = 0;
  for (int64_t r = 0; r < N; ++r) {
    const double* row = in.logits.data() + r * V;
    double row_sum = 0;
    for (int64_t j = 0; j < V; ++j) row_sum += dlogits[r * V + j];
    if (in.targets[r] < 0) {
      CHECK(losses[r] == 0.0);
      for (int64_t j = 0; j < V; ++j) CHECK(dlogits[r * V + j] == 0.0);
      continue;
    }
    double lse = 0;  // logits are in [-3, 3]: the plain formula cannot overflow
    for (int64_t j = 0; j < V; ++j) lse += std::exp(row[j]);
    const double want = std::log(lse) - row[in.targets[r]];
    CHECK(std::abs(losses[r] - want) < 1e-13);  // a few ulps of a log of a sum of 11 terms
    CHECK(std::abs(row_sum) < 1e-14);           // softmax - onehot: 0 up to 11 roundings
    total += want;
    ++count;
  }
  CHECK(count == N - 2);
  CHECK(std::abs(loss - total / count) < 1e-13);

  SECTION("no row counts: loss 0, gradient 0") {
    std::vector<int32_t> none(N, -1);
    CHECK(kern::cross_entropy_forward<double>(losses.data(), in.logits.data(), none.data(), N, V) ==
          0.0);
    kern::cross_entropy_backward<double>(dlogits.data(), in.logits.data(), none.data(), N, V, 1.0);
    CHECK(max_abs(dlogits) == 0.0);
  }
  SECTION("large logits stay finite") {
    Vec big = in.logits;
    for (double& v : big) v = v * 1000 + 5000;  // exp would overflow without the max shift
    kern::cross_entropy_forward<double>(losses.data(), big.data(), in.targets.data(), N, V);
    kern::cross_entropy_backward<double>(dlogits.data(), big.data(), in.targets.data(), N, V, 1.0);
    for (double v : losses) CHECK(std::isfinite(v));
    for (double v : dlogits) CHECK(std::isfinite(v));
  }
}

TEST_CASE("attention is causal") {
  Inputs in;
  Vec out(N * C), probs(B * NH * T * T);
  kern::attention_forward<double>(out.data(), probs.data(), in.qkv.data(), B, T, C, NH);
  for (int64_t bh = 0; bh < B * NH; ++bh)
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < T; ++j) {
        const double p = probs[(bh * T + t) * T + j];
        if (j > t) CHECK(p == 0.0);  // exactly: the mask is not a large negative score
        sum += p;
      }
      CHECK(std::abs(sum - 1) < 1e-14);  // a softmax row of <= 5 terms, up to a few ulps each
    }

  // Changing q, k and v at positions after t0 leaves out at positions up to t0 bitwise alone.
  constexpr int64_t t0 = 2;
  Vec later = in.qkv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = t0 + 1; t < T; ++t)
      for (int64_t c = 0; c < 3 * C; ++c) later[(b * T + t) * 3 * C + c] += 0.75;
  Vec out2(N * C);
  kern::attention_forward<double>(out2.data(), probs.data(), later.data(), B, T, C, NH);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = (b * T + t) * C + c;
        if (t <= t0) CHECK(out2[i] == out[i]);
      }
  CHECK(out2 != out);  // and the later positions did change
}

TEST_CASE("parameter gradients accumulate, input gradients are overwritten") {
  Inputs in;
  const Vec dy_c = random_vec(N * C, 106), dy_oc = random_vec(N * OC, 107),
            dy_v = random_vec(N * V, 108);
  Vec mean(N), rstd(N), y(N * C);
  kern::layernorm_forward<double>(y.data(), mean.data(), rstd.data(), in.x.data(), in.ln_w.data(),
                                  in.ln_b.data(), N, C);
  const double nan = std::nan("");

  // Each backward runs from a zero state (dx prefilled with 0) and from a prefilled state (dx NaN,
  // parameter gradients g0): dx must be the same, each gradient g0 + the zero-state value with
  // one rounding, i.e. exactly what the test computes below.
  struct Run {
    Vec dx;
    std::vector<Vec> grads;
  };
  const auto run = [&](const std::function<void(double*, std::vector<Vec>&)>& backward,
                       int64_t nx, std::vector<size_t> sizes) {
    Run zero{Vec(nx, 0.0), {}}, filled{Vec(nx, nan), {}};
    for (size_t i = 0; i < sizes.size(); ++i) {
      zero.grads.emplace_back(sizes[i], 0.0);
      filled.grads.push_back(random_vec(sizes[i], 200 + i));
    }
    const std::vector<Vec> g0 = filled.grads;
    backward(zero.dx.data(), zero.grads);
    backward(filled.dx.data(), filled.grads);
    CHECK(filled.dx == zero.dx);
    for (size_t i = 0; i < sizes.size(); ++i) {
      Vec want(sizes[i]);
      for (size_t j = 0; j < sizes[i]; ++j) want[j] = g0[i][j] + zero.grads[i][j];
      CHECK(filled.grads[i] == want);
    }
  };
  run([&](double*, std::vector<Vec>& g) {
        kern::embedding_backward<double>(g[0].data(), g[1].data(), dy_c.data(), in.tokens.data(), B,
                                         T, C, V);
      },
      0, {V * C, Tmax * C});
  run([&](double* dx, std::vector<Vec>& g) {
        kern::layernorm_backward<double>(dx, g[0].data(), g[1].data(), dy_c.data(), in.x.data(),
                                         in.ln_w.data(), mean.data(), rstd.data(), N, C);
      },
      N * C, {C, C});
  run([&](double* dx, std::vector<Vec>& g) {
        kern::linear_backward<double>(dx, g[0].data(), g[1].data(), true, dy_oc.data(),
                                      in.x.data(), in.lin_w.data(), N, C, OC);
      },
      N * C, {C * OC, OC});
  run([&](double* dx, std::vector<Vec>& g) {
        kern::linear_t_backward<double>(dx, g[0].data(), dy_v.data(), in.x.data(),
                                        in.head_w.data(), N, C, V);
      },
      N * C, {V * C});
  run([&](double* dx, std::vector<Vec>&) {
        kern::gelu_backward<double>(dx, dy_c.data(), in.gelu_x.data(), N * C);
      },
      N * C, {});
  run([&](double* dx, std::vector<Vec>&) {
        Vec out(N * C), probs(B * NH * T * T);
        kern::attention_forward<double>(out.data(), probs.data(), in.qkv.data(), B, T, C, NH);
        kern::attention_backward<double>(dx, dy_c.data(), in.qkv.data(), probs.data(), B, T, C, NH);
      },
      N * 3 * C, {});
}

TEST_CASE("add and accumulate") {
  const Vec a = random_vec(1000, 300), b = random_vec(1000, 301);
  Vec out(1000), acc = a;
  kern::add<double>(out.data(), a.data(), b.data(), 1000);
  kern::accumulate<double>(acc.data(), b.data(), 1000);
  for (size_t i = 0; i < 1000; ++i) {
    CHECK(out[i] == a[i] + b[i]);
    CHECK(acc[i] == a[i] + b[i]);
  }
}

// A 16-bit accumulator (sequence parallelism's LayerNorm gradients under bf16 parameters): each
// element added in fp32 and rounded once, so exactly what rounding the fp32 sum gives.
TEST_CASE("accumulate into a bf16 or fp16 gradient rounds each sum once") {
  const Vec a = random_vec(1000, 302), b = random_vec(1000, 303);
  std::vector<float> x(b.begin(), b.end());
  std::vector<zero::bfloat16> acc_bf(1000);
  std::vector<zero::half> acc_h(1000);
  for (size_t i = 0; i < 1000; ++i) {
    acc_bf[i] = zero::to_bfloat16(static_cast<float>(a[i]));
    acc_h[i] = zero::to_half(static_cast<float>(a[i]));
  }
  const auto start_bf = acc_bf;
  const auto start_h = acc_h;
  kern::accumulate<float>(kern::Grad<float>(acc_bf.data(), zero::ScalarType::bf16), x.data(), 1000);
  kern::accumulate<float>(kern::Grad<float>(acc_h.data(), zero::ScalarType::f16), x.data(), 1000);
  for (size_t i = 0; i < 1000; ++i) {
    const float bf = zero::to_float(zero::to_bfloat16(zero::to_float(start_bf[i]) + x[i]));
    const float h = zero::to_float(zero::to_half(zero::to_float(start_h[i]) + x[i]));
    CHECK(zero::to_float(acc_bf[i]) == bf);
    CHECK(zero::to_float(acc_h[i]) == h);
  }
}

TEST_CASE("bad token ids and targets throw, naming the op, the position and the value") {
  Inputs in;
  Vec out(N * C), losses(N), dlogits(N * V);
  in.tokens[3] = 70;
  in.tokens[8] = -1;  // later in memory order: the message names the first bad one
  REQUIRE_THROWS_WITH(
      kern::embedding_forward<double>(out.data(), in.tokens.data(), in.wte.data(), in.wpe.data(),
                                      B, T, C, V),
      ContainsSubstring(
          "embedding_forward: token id 70 at [b=0, t=3] is outside the vocabulary [0, 11)"));
  in.tokens[3] = 0;
  Vec dwte(V * C, 0.0), dwpe(Tmax * C, 0.0);
  REQUIRE_THROWS_WITH(kern::embedding_backward<double>(dwte.data(), dwpe.data(), out.data(),
                                                       in.tokens.data(), B, T, C, V),
                      ContainsSubstring("embedding_backward: token id -1 at [b=1, t=3]"));
  CHECK(max_abs(dwte) == 0.0);  // checked before anything is written

  in.targets[4] = 11;
  REQUIRE_THROWS_WITH(kern::cross_entropy_forward<double>(losses.data(), in.logits.data(),
                                                          in.targets.data(), N, V),
                      ContainsSubstring("cross_entropy_forward: target 11 at row 4 is outside "
                                        "the vocabulary [0, 11)"));
  in.targets[4] = -2;
  REQUIRE_THROWS_WITH(kern::cross_entropy_backward<double>(dlogits.data(), in.logits.data(),
                                                           in.targets.data(), N, V, 1.0),
                      ContainsSubstring("cross_entropy_backward: target -2 at row 4"));
  REQUIRE_THROWS_AS(kern::Param<double>(nullptr, zero::ScalarType::bf16), zero::Error);
}

// ---- fp32 against fp64 -------------------------------------------------------------------------

namespace {

// Every kernel's outputs for the shared inputs, computed in F, widened to double.
template <class F>
std::map<std::string, Vec> run_all() {
  Inputs in;
  const auto cv = [](const Vec& v) { return std::vector<F>(v.begin(), v.end()); };
  const auto up = [](const std::vector<F>& v) { return Vec(v.begin(), v.end()); };
  const std::vector<F> wte = cv(in.wte), wpe = cv(in.wpe), x = cv(in.x), lnw = cv(in.ln_w),
                       lnb = cv(in.ln_b), lw = cv(in.lin_w), lb = cv(in.lin_b),
                       hw = cv(in.head_w), gx = cv(in.gelu_x), qkv = cv(in.qkv),
                       logits = cv(in.logits), dy_c = cv(random_vec(N * C, 106)),
                       dy_oc = cv(random_vec(N * OC, 107)), dy_v = cv(random_vec(N * V, 108));
  std::map<std::string, Vec> r;
  std::vector<F> a(N * C), b(N * C), mean(N), rstd(N), g1(V * C, F(0)), g2(Tmax * C, F(0));
  kern::embedding_forward<F>(a.data(), in.tokens.data(), wte.data(), wpe.data(), B, T, C, V);
  kern::embedding_backward<F>(g1.data(), g2.data(), dy_c.data(), in.tokens.data(), B, T, C, V);
  r["embedding.out"] = up(a), r["embedding.dwte"] = up(g1), r["embedding.dwpe"] = up(g2);

  std::vector<F> dw(C, F(0)), db(C, F(0));
  kern::layernorm_forward<F>(a.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(),
                             N, C);
  kern::layernorm_backward<F>(b.data(), dw.data(), db.data(), dy_c.data(), x.data(), lnw.data(),
                              mean.data(), rstd.data(), N, C);
  r["layernorm.y"] = up(a), r["layernorm.rstd"] = up(rstd), r["layernorm.dx"] = up(b);
  r["layernorm.dw"] = up(dw), r["layernorm.db"] = up(db);

  std::vector<F> y(N * OC), lw_g(C * OC, F(0)), lb_g(OC, F(0));
  kern::linear_forward<F>(y.data(), x.data(), lw.data(), lb.data(), true, N, C, OC);
  kern::linear_backward<F>(b.data(), lw_g.data(), lb_g.data(), true, dy_oc.data(), x.data(),
                           lw.data(), N, C, OC);
  r["linear.y"] = up(y), r["linear.dx"] = up(b);
  r["linear.dw"] = up(lw_g), r["linear.db"] = up(lb_g);

  std::vector<F> yv(N * V), hw_g(V * C, F(0));
  kern::linear_t_forward<F>(yv.data(), x.data(), hw.data(), N, C, V);
  kern::linear_t_backward<F>(b.data(), hw_g.data(), dy_v.data(), x.data(), hw.data(), N, C, V);
  r["linear_t.y"] = up(yv), r["linear_t.dx"] = up(b), r["linear_t.dw"] = up(hw_g);

  kern::gelu_forward<F>(a.data(), gx.data(), N * C);
  kern::gelu_backward<F>(b.data(), dy_c.data(), gx.data(), N * C);
  r["gelu.y"] = up(a), r["gelu.dx"] = up(b);

  std::vector<F> probs(B * NH * T * T), dqkv(N * 3 * C);
  kern::attention_forward<F>(a.data(), probs.data(), qkv.data(), B, T, C, NH);
  kern::attention_backward<F>(dqkv.data(), dy_c.data(), qkv.data(), probs.data(), B, T, C, NH);
  r["attention.out"] = up(a), r["attention.probs"] = up(probs), r["attention.dqkv"] = up(dqkv);

  std::vector<F> losses(N), dl(N * V);
  const F loss =
      kern::cross_entropy_forward<F>(losses.data(), logits.data(), in.targets.data(), N, V);
  kern::cross_entropy_backward<F>(dl.data(), logits.data(), in.targets.data(), N, V, F(1));
  r["cross_entropy.loss"] = Vec{double(loss)}, r["cross_entropy.losses"] = up(losses);
  r["cross_entropy.dlogits"] = up(dl);
  return r;
}

}  // namespace

TEST_CASE("fp32 kernels agree with fp64 kernels") {
  const auto ref = run_all<double>();
  const auto f32 = run_all<float>();
  // Same inputs (float values), so only fp32 rounding differs. The longest chain of roundings
  // here (attention backward: three products of length <= 5 plus a softmax, or a CE row of 11)
  // is well under 64 steps of at most 2^-24 relative to the largest value: 64 * 2^-24 ~ 4e-6 is
  // a worst case (observed: 2e-7).
  for (const auto& [name, want] : ref) {
    INFO(name);
    CHECK(rel_diff(want, f32.at(name)) <= 4e-6);
  }
}

// The products' blocks and tiles (kernels.cpp: gemm_rows, tile_grid) on shapes the small inputs
// above never reach: a head of more than 8M elements at few rows (its weight-gradient grid then
// has more than the usual 8 tiles: 10 of 1664 x 640 here) and 2000 rows (row blocks of 256, the
// last one short). Each element is checked against its fp64 sum with the bound that holds for any
// order of fp32 summation of K products, (K + 2) * 2^-24 * sum |terms| (the products and the
// final store rounded too), and 1 and 2 threads must give the same bits.
TEST_CASE("wide and tall products: within the fp32 summation bound, same bits on 1 and 2 threads") {
  struct Shape {
    int64_t N, C, V;
  };
  const Shape shape = GENERATE(Shape{8, 640, 16384}, Shape{2000, 96, 80});
  const int64_t n = shape.N, c = shape.C, v = shape.V;
  INFO("N " << n << ", C " << c << ", V " << v);
  const auto to_f = [](const Vec& a) { return std::vector<float>(a.begin(), a.end()); };
  const Vec x = random_vec(n * c, 201), w = random_vec(v * c, 202), dy = random_vec(n * v, 203);
  const Vec dw0 = random_vec(v * c, 204);  // gradients accumulate: start from nonzero values
  const auto xf = to_f(x), wf = to_f(w), dyf = to_f(dy);
  struct Out {
    std::vector<float> y, dx, dw;
  };
  const auto run = [&](size_t threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    Out o{std::vector<float>(n * v), std::vector<float>(n * c), to_f(dw0)};
    kern::linear_t_forward<float>(o.y.data(), xf.data(), wf.data(), n, c, v);
    kern::linear_t_backward<float>(o.dx.data(), o.dw.data(), dyf.data(), xf.data(), wf.data(), n, c,
                                   v);
    return o;
  };
  const Out one = run(1), two = run(2);
  CHECK(one.y == two.y);
  CHECK(one.dx == two.dx);
  CHECK(one.dw == two.dw);

  // An element of a K-term product against its fp64 sum; counts the elements outside the bound.
  int64_t outside = 0;
  const auto check = [&](double got, double exact, double abs_sum, int64_t K) {
    const double bound = double(K + 2) * std::ldexp(1.0, -24) * abs_sum;
    if (std::abs(got - exact) > bound) ++outside;
  };
  for (int64_t i = 0; i < n; ++i)  // y = x w^T and dx = dy w: K = C and K = V
    for (int64_t j = 0; j < v; ++j) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < c; ++k)
        s += x[i * c + k] * w[j * c + k], a += std::abs(x[i * c + k] * w[j * c + k]);
      check(one.y[i * v + j], s, a, c);
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k) {
      double s = 0, a = 0;
      for (int64_t j = 0; j < v; ++j)
        s += dy[i * v + j] * w[j * c + k], a += std::abs(dy[i * v + j] * w[j * c + k]);
      check(one.dx[i * c + k], s, a, v);
    }
  for (int64_t j = 0; j < v; ++j)  // dw += dy^T x: K = N, plus the old value
    for (int64_t k = 0; k < c; ++k) {
      double s = dw0[j * c + k], a = std::abs(dw0[j * c + k]);
      for (int64_t i = 0; i < n; ++i)
        s += dy[i * v + j] * x[i * c + k], a += std::abs(dy[i * v + j] * x[i * c + k]);
      check(one.dw[j * c + k], s, a, n + 1);
    }
  CHECK(outside == 0);
}

TEST_CASE("empty products: no rows or no output columns leave gradients as they were") {
  const Vec x = random_vec(N * C, 301), w = random_vec(C * OC, 302), b = random_vec(OC, 303);
  const Vec dw0 = random_vec(C * OC, 304), db0 = random_vec(OC, 305);
  SECTION("no rows") {
    Vec y, dy, dx, dw = dw0, db = db0;
    kern::linear_forward<double>(y.data(), x.data(), w.data(), b.data(), true, 0, C, OC);
    kern::linear_backward<double>(dx.data(), dw.data(), db.data(), true, dy.data(), x.data(),
                                  w.data(), 0, C, OC);
    CHECK(dw == dw0);
    CHECK(db == db0);
  }
  SECTION("no output columns") {
    Vec y, dy(N * 0), dx(N * C, 7.0), dw, db;
    kern::linear_forward<double>(y.data(), x.data(), w.data(), b.data(), true, N, C, 0);
    kern::linear_backward<double>(dx.data(), dw.data(), db.data(), true, dy.data(), x.data(),
                                  w.data(), N, C, 0);
    // dx = dy @ w^T with nothing to sum: zeros.
    CHECK(max_abs(dx) == 0);
  }
}
