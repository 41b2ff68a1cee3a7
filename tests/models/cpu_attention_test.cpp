// Tests of the blocked attention (models/cpu/attention.cpp: attention_forward_lse and
// attention_backward_lse), against the materialised fp64 kernels (attention_forward /
// attention_backward, themselves gradient-checked in cpu_kernels_test) and against central
// differences. The lengths cross the blocks' edges: T = 1, a part of one query block, exactly
// one key block, one past it, and several blocks with a ragged end (blocks of 64 queries by 128
// keys).
#include <catch2/catch_test_macros.hpp>

#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "models/cpu/kernels.hpp"

namespace kern = zero::models::cpu;
using Vec = std::vector<double>;

namespace {

// Uniform in [lo, hi), rounded to float (so the fp32 and fp64 kernels see the same values).
Vec random_vec(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = double(float(dist(gen)));
  return v;
}

template <class E>
std::vector<E> as(const Vec& v) {
  return std::vector<E>(v.begin(), v.end());
}

// max |a - b| / max |a|.
template <class E>
double rel_diff(const Vec& a, const std::vector<E>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(a[i] - double(b[i])));
    s = std::max(s, std::abs(a[i]));
  }
  return m / std::max(s, std::numeric_limits<double>::min());
}

struct Case {
  int64_t B, T, C, NH;
};

struct Result {
  Vec out, lse, dqkv;
};

// The reference: the materialised fp64 kernels, and lse from the scores in double.
Result reference(const Case& k, const Vec& qkv, const Vec& dout) {
  const int64_t hs = k.C / k.NH;
  Result r{Vec(k.B * k.T * k.C), Vec(k.B * k.NH * k.T), Vec(qkv.size())};
  Vec probs(k.B * k.NH * k.T * k.T);
  kern::attention_forward<double>(r.out.data(), probs.data(), qkv.data(), k.B, k.T, k.C, k.NH);
  kern::attention_backward<double>(r.dqkv.data(), dout.data(), qkv.data(), probs.data(), k.B, k.T,
                                   k.C, k.NH);
  for (int64_t b = 0; b < k.B; ++b)
    for (int64_t h = 0; h < k.NH; ++h)
      for (int64_t t = 0; t < k.T; ++t) {
        Vec s(t + 1);
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t c = 0; c < hs; ++c)
            d += qkv[(b * k.T + t) * 3 * k.C + h * hs + c] *
                 qkv[(b * k.T + j) * 3 * k.C + k.C + h * hs + c];
          s[j] = d / std::sqrt(double(hs));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        r.lse[(b * k.NH + h) * k.T + t] = m + std::log(sum);
      }
  return r;
}

template <class F>
struct Blocked {
  std::vector<F> out, lse, dqkv;
};

template <class F>
Blocked<F> blocked(const Case& k, const Vec& qkv_d, const Vec& dout_d) {
  const std::vector<F> qkv = as<F>(qkv_d), dout = as<F>(dout_d);
  Blocked<F> r{std::vector<F>(k.B * k.T * k.C), std::vector<F>(k.B * k.NH * k.T),
               std::vector<F>(qkv.size())};
  kern::attention_forward_lse<F>(r.out.data(), r.lse.data(), qkv.data(), k.B, k.T, k.C, k.NH);
  kern::attention_backward_lse<F>(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(),
                                  r.lse.data(), k.B, k.T, k.C, k.NH);
  return r;
}

// Inputs wide enough for peaked rows (scores up to ~ +-8 at hs = 64), so the running max moves
// from key block to key block and the rescaling is exercised.
Vec qkv_of(const Case& k, uint64_t seed) { return random_vec(k.B * k.T * 3 * k.C, seed, -1, 1); }
Vec dout_of(const Case& k, uint64_t seed) { return random_vec(k.B * k.T * k.C, seed, -1, 1); }

const Case kCases[] = {
    {2, 1, 16, 2},     // T = 1: one key, the softmax is 1
    {2, 37, 16, 2},    // part of one query block
    {1, 128, 128, 2},  // exactly one key block, two query blocks, hs = 64
    {1, 129, 16, 4},   // one past a key block: a key block of width 1
    {2, 300, 32, 1},   // several blocks each way, ragged ends, hs = 32
    {1, 200, 192, 3},  // hs = 64 with three heads
};

}  // namespace

TEST_CASE("blocked attention matches the materialised fp64 kernels") {
  for (const Case& k : kCases) {
    INFO("B " << k.B << " T " << k.T << " C " << k.C << " heads " << k.NH);
    const Vec qkv = qkv_of(k, 7 + k.T), dout = dout_of(k, 11 + k.T);
    const Result want = reference(k, qkv, dout);
    const Blocked<double> d = blocked<double>(k, qkv, dout);
    // fp64 against fp64: the same sums in another order and the normalisation moved; each value
    // is a chain of a few hundred double roundings at most (T <= 300): far below 1e-12.
    CHECK(rel_diff(want.out, d.out) <= 1e-12);
    CHECK(rel_diff(want.lse, d.lse) <= 1e-12);
    CHECK(rel_diff(want.dqkv, d.dqkv) <= 1e-12);
    const Blocked<float> f = blocked<float>(k, qkv, dout);
    // fp32 against fp64 on the same (float) inputs: dot products of hs <= 64 terms, exp_fast
    // (2 ulp), sums of up to T = 300 terms and the backward's three products: a few hundred fp32
    // roundings relative to the largest value, 300 * 2^-24 ~ 2e-5 as a worst case (observed
    // ~1e-6; the materialised fp32 kernel has the same bound).
    CHECK(rel_diff(want.out, f.out) <= 2e-5);
    CHECK(rel_diff(want.lse, f.lse) <= 2e-5);
    CHECK(rel_diff(want.dqkv, f.dqkv) <= 2e-5);
  }
}

TEST_CASE("blocked attention backward is the gradient of its forward") {
  // L = sum(r * out) over the blocked fp64 forward; its gradient with respect to qkv is the
  // blocked backward with dout = r. Two query blocks and two key blocks (T = 130).
  const Case k{1, 130, 8, 2};
  Vec qkv = random_vec(k.B * k.T * 3 * k.C, 21, -2, 2);
  const Vec r = dout_of(k, 22);
  const auto loss = [&] {
    std::vector<double> out(k.B * k.T * k.C), lse(k.B * k.NH * k.T);
    kern::attention_forward_lse<double>(out.data(), lse.data(), qkv.data(), k.B, k.T, k.C, k.NH);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += r[i] * out[i];
    return s;
  };
  const Blocked<double> got = blocked<double>(k, qkv, r);
  // Central differences with h = 1e-6 on O(1) inputs: truncation ~ h^2 |f'''| ~ 1e-12, rounding
  // ~ eps |L| / h ~ 1e-9 with |L| ~ 10; 1e-6 of the largest gradient entry leaves a margin of
  // two orders (cpu_kernels_test's bound, for the same reason).
  constexpr double h = 1e-6;
  Vec numeric(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    const double saved = qkv[i];
    qkv[i] = saved + h;
    const double up = loss();
    qkv[i] = saved - h;
    const double down = loss();
    qkv[i] = saved;
    numeric[i] = (up - down) / (2 * h);
  }
  double largest = 0;
  for (double g : got.dqkv) largest = std::max(largest, std::abs(g));
  REQUIRE(largest > 1e-3);  // a vanishing gradient would make the check vacuous
  CHECK(rel_diff(numeric, got.dqkv) <= 1e-6);
}

TEST_CASE("blocked attention is causal across blocks") {
  // Changing q, k and v after t0 (inside the second query block, past the first key block)
  // leaves out and lse at t <= t0 bitwise alone, and changes later ones.
  const Case k{1, 300, 32, 2};
  const Vec qkv = qkv_of(k, 31), dout = dout_of(k, 32);
  constexpr int64_t t0 = 150;
  Vec later = qkv;
  for (int64_t t = t0 + 1; t < k.T; ++t)
    for (int64_t c = 0; c < 3 * k.C; ++c) later[t * 3 * k.C + c] += 0.75;
  const Blocked<float> a = blocked<float>(k, qkv, dout), b = blocked<float>(k, later, dout);
  for (int64_t t = 0; t < k.T; ++t) {
    bool same = true;
    for (int64_t c = 0; c < k.C; ++c) same = same && a.out[t * k.C + c] == b.out[t * k.C + c];
    for (int64_t h = 0; h < k.NH; ++h) same = same && a.lse[h * k.T + t] == b.lse[h * k.T + t];
    INFO("t " << t);
    CHECK(same == (t <= t0));
  }
}

TEST_CASE("blocked attention gives the same bits on 1 and 2 threads") {
  const Case k{2, 300, 64, 2};
  const Vec qkv = qkv_of(k, 41), dout = dout_of(k, 42);
  const auto run = [&](size_t threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    return blocked<float>(k, qkv, dout);
  };
  const Blocked<float> one = run(1), two = run(2);
  CHECK(one.out == two.out);
  CHECK(one.lse == two.lse);
  CHECK(one.dqkv == two.dqkv);
  CHECK(run(2).dqkv == two.dqkv);
}
