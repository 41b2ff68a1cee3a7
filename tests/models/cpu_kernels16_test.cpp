// Tests of the 16-bit activation kernels (models/cpu/kernels16.hpp, attention16.cpp): each
// against the fp32 kernel (kernels.hpp) on the same inputs, which are bf16 / fp16 values, so the
// fp32 kernel sees exactly what the 16-bit one widens.
//
// What to expect, and so the bounds:
//   - Row and element kernels run the fp32 row code on the widened block and round each output
//     once: the 16-bit result is the fp32 result rounded to S, bit for bit; fp32 outputs
//     (statistics, losses, parameter gradients) are the fp32 kernel's bits.
//   - Products: a 16-bit product of S operands is exact in fp32 and oneDNN sums in fp32, in
//     another order than the BLAS: |y16 - y32| <= u |y32| (the one rounding to S, u = 2^-8 for
//     bf16, 2^-11 for fp16) + 2 K 2^-24 sum_k |a_k b_k| (two fp32 sums of K terms in different
//     orders, each within K 2^-24 of the exact one). fp32 outputs (weight gradients) lack the u.
//   - Attention: P and dS are rounded to S for their products (one more u on every term), so the
//     bounds are stated against the fp32 kernel with the error measured (see each CHECK).
//   - Attention on bf16 with AMX takes its tile path (amx.hpp) for T and the head size in
//     multiples of 32, else the oneDNN one; both are held to the same bounds, and the tile
//     products themselves against an fp64 reference.
//   - Determinism: bitwise the same on 1 and 2 oneTBB threads and on every vector path.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <tbb/global_control.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "models/cpu/amx.hpp"
#include "models/cpu/elementwise.hpp"
#include "models/cpu/kernels.hpp"
#include "models/cpu/kernels16.hpp"
#include "models/cpu/matmul.hpp"
#include "models/ops.hpp"

using namespace zero;
namespace kern = zero::models::cpu;
namespace k16 = zero::models::cpu::k16;
namespace ew = zero::models::cpu::elementwise;
using Floats = std::vector<float>;
using Bits = std::vector<uint16_t>;

namespace {

// Shapes crossing every fixed block: N = 320 rows (3 product blocks of 128, 5 row-sum partials of
// 64, 20 row blocks of 16), C = 264 and OC = V = 300 (2 weight-gradient tiles of 256 each way),
// N * OC = 96000 elements (6 element blocks of 16384).
constexpr int64_t kB = 4, kT = 80, kN = kB * kT, kC = 264, kOC = 300, kV = 300;

double unit_roundoff(ScalarType s) { return s == ScalarType::bf16 ? 0x1p-8 : 0x1p-11; }

Bits to16(const Floats& f, ScalarType s) {
  Bits b(f.size());
  convert(f.data(), DType::f32, b.data(), *to_dtype(s), f.size());
  return b;
}
Floats from16(const Bits& b, ScalarType s) {
  Floats f(b.size());
  convert(b.data(), *to_dtype(s), f.data(), DType::f32, b.size());
  return f;
}
// n values uniform in [lo, hi), rounded to s (exactly representable in S and in fp32).
Floats random_values(int64_t n, uint64_t seed, ScalarType s, double lo = -1, double hi = 1) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Floats v(static_cast<size_t>(n));
  for (float& x : v) x = float(dist(gen));
  return from16(to16(v, s), s);
}
std::vector<int32_t> random_ids(int64_t n, uint64_t seed, int64_t hi, bool ignore_some) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(hi - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = ignore_some && i % 7 == 3 ? -1 : dist(gen);
  return v;
}
bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
// The fp32 result rounded once to s, as bits.
Bits rounded(const Floats& f, ScalarType s) { return to16(f, s); }

// sum_k |A(i,k) B(k,j)| for an [M,N] result, in double (the scale of each product's rounding).
template <class A, class B>
std::vector<double> abs_product(int64_t M, int64_t N, int64_t K, const A& a, const B& b) {
  std::vector<double> out(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const double ak = std::abs(double(a(i, k)));
      for (int64_t j = 0; j < N; ++j) out[i * N + j] += ak * std::abs(double(b(k, j)));
    }
  return out;
}
// How far the worst element of got is from want, in units of its bound
// u_out |want| + 2 K 2^-24 terms (<= 1 passes).
double worst_ratio(const Floats& got, const Floats& want, const std::vector<double>& terms,
                   int64_t K, double u_out) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = u_out * std::abs(double(want[i])) + 2.0 * double(K) * 0x1p-24 * terms[i] + 1e-30;
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / bound);
  }
  return worst;
}
// max |a - b| / max |b|.
double rel_to_max(const Floats& a, const Floats& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return err / scale;
}

const ScalarType kTypes[] = {ScalarType::bf16, ScalarType::f16};

struct RestoreSimd {
  ~RestoreSimd() { ew::use(ew::Simd::best); }
};

}  // namespace

TEST_CASE("16-bit row and element kernels give the fp32 kernels' results rounded once") {
  for (const ScalarType s : kTypes) {
    INFO("activations " << to_string(s));
    const int64_t n = kN * kOC;
    const Floats x = random_values(n, 1, s, -4, 4), y0 = random_values(n, 2, s);
    const Bits x16 = to16(x, s), y16 = to16(y0, s);

    Floats r32(n);
    Bits r16(n);
    kern::gelu_forward<float>(r32.data(), x.data(), n);
    k16::gelu_forward(s, r16.data(), x16.data(), n);
    CHECK(r16 == rounded(r32, s));
    kern::gelu_backward<float>(r32.data(), y0.data(), x.data(), n);
    k16::gelu_backward(s, r16.data(), y16.data(), x16.data(), n);
    CHECK(r16 == rounded(r32, s));
    kern::add<float>(r32.data(), x.data(), y0.data(), n);
    k16::add(s, r16.data(), x16.data(), y16.data(), n);
    CHECK(r16 == rounded(r32, s));
    // In place, as the block uses it (out == a).
    Bits inplace = x16;
    k16::add(s, inplace.data(), inplace.data(), y16.data(), n);
    CHECK(inplace == r16);
    // accumulate into an S acc and into an fp32 acc.
    Bits acc16 = y16;
    Floats acc32 = y0;
    k16::accumulate(s, kern::Grad<float>(acc16.data(), s), x16.data(), n);
    kern::accumulate<float>(kern::Grad<float>(acc32.data()), x.data(), n);
    CHECK(acc16 == rounded(acc32, s));
    Floats accf = y0;
    k16::accumulate(s, kern::Grad<float>(accf.data()), x16.data(), n);
    CHECK(same_bits(accf, acc32));

    // layernorm forward and backward, parameters in S.
    const Floats w = random_values(kC, 3, s, 0.5, 1.5), b = random_values(kC, 4, s);
    const Bits w16 = to16(w, s), b16 = to16(b, s);
    const Floats ln_x = random_values(kN * kC, 5, s, -2, 3), ln_dy = random_values(kN * kC, 6, s);
    const Bits ln_x16 = to16(ln_x, s), ln_dy16 = to16(ln_dy, s);
    Floats ly32(kN * kC), mean32(kN), rstd32(kN), mean16(kN), rstd16(kN);
    Bits ly16(kN * kC);
    kern::layernorm_forward<float>(ly32.data(), mean32.data(), rstd32.data(), ln_x.data(),
                                   kern::Param<float>(w16.data(), s), kern::Param<float>(b16.data(), s),
                                   kN, kC);
    k16::layernorm_forward(s, ly16.data(), mean16.data(), rstd16.data(), ln_x16.data(),
                           kern::Param<float>(w16.data(), s), kern::Param<float>(b16.data(), s), kN, kC);
    CHECK(ly16 == rounded(ly32, s));
    CHECK(same_bits(mean16, mean32));
    CHECK(same_bits(rstd16, rstd32));
    Floats dx32(kN * kC), dw32(kC, 0.5f), db32(kC, -0.25f), dw16(kC, 0.5f), db16(kC, -0.25f);
    Bits dx16(kN * kC);
    kern::layernorm_backward<float>(dx32.data(), dw32.data(), db32.data(), ln_dy.data(), ln_x.data(),
                                    kern::Param<float>(w16.data(), s), mean32.data(), rstd32.data(), kN, kC);
    k16::layernorm_backward(s, dx16.data(), dw16.data(), db16.data(), ln_dy16.data(), ln_x16.data(),
                            kern::Param<float>(w16.data(), s), mean32.data(), rstd32.data(), kN, kC);
    CHECK(dx16 == rounded(dx32, s));
    CHECK(same_bits(dw16, dw32));
    CHECK(same_bits(db16, db32));

    // embedding forward and backward (whole vocabulary, and a shard of it).
    const auto tokens = random_ids(kN, 7, kV, false);
    const Floats wte = random_values(kV * kC, 8, s), wpe = random_values((kT + 2) * kC, 9, s);
    const Bits wte16 = to16(wte, s), wpe16 = to16(wpe, s);
    Floats e32(kN * kC);
    Bits e16(kN * kC);
    kern::embedding_forward<float>(e32.data(), tokens.data(), kern::Param<float>(wte16.data(), s),
                                   kern::Param<float>(wpe16.data(), s), kB, kT, kC, kV);
    k16::embedding_forward(s, e16.data(), tokens.data(), kern::Param<float>(wte16.data(), s),
                           kern::Param<float>(wpe16.data(), s), true, kB, kT, kC, 0, kV, kV, "t");
    CHECK(e16 == rounded(e32, s));
    kern::embedding_forward_shard<float>(e32.data(), tokens.data(), kern::Param<float>(wte16.data() + 100 * kC, s),
                                         kern::Param<float>(wpe16.data(), s), false, kB, kT, kC, 100, 120, kV);
    k16::embedding_forward(s, e16.data(), tokens.data(), kern::Param<float>(wte16.data() + 100 * kC, s),
                           kern::Param<float>(wpe16.data(), s), false, kB, kT, kC, 100, 120, kV, "t");
    CHECK(e16 == rounded(e32, s));
    Floats dwte32(kV * kC, 0.0f), dwpe32((kT + 2) * kC, 0.0f), dwte16 = dwte32, dwpe16 = dwpe32;
    kern::embedding_backward<float>(dwte32.data(), dwpe32.data(), ln_dy.data(), tokens.data(), kB, kT, kC, kV);
    k16::embedding_backward(s, dwte16.data(), dwpe16.data(), true, ln_dy16.data(), tokens.data(), kB, kT,
                            kC, 0, kV, kV, "t");
    CHECK(same_bits(dwte16, dwte32));
    CHECK(same_bits(dwpe16, dwpe32));

    // cross-entropy, whole and by vocabulary shards (two shards: 0..170, 170..300).
    const auto targets = random_ids(kN, 10, kV, true);
    const Floats logits = random_values(kN * kV, 11, s, -6, 6);
    const Bits logits16 = to16(logits, s);
    Floats losses32(kN), losses16(kN);
    const float mean_32 = kern::cross_entropy_forward<float>(losses32.data(), logits.data(), targets.data(), kN, kV);
    const float mean_16 = k16::cross_entropy_forward(s, losses16.data(), logits16.data(), targets.data(), kN, kV);
    CHECK(same_bits(losses16, losses32));
    CHECK(mean_16 == mean_32);
    Floats dl32(kN * kV);
    Bits dl16(kN * kV);
    kern::cross_entropy_backward<float>(dl32.data(), logits.data(), targets.data(), kN, kV, 0.5f);
    k16::cross_entropy_backward(s, dl16.data(), logits16.data(), targets.data(), kN, kV, 0.5f);
    CHECK(dl16 == rounded(dl32, s));
    for (const auto& [v0, Vs] : {std::pair<int64_t, int64_t>{0, 170}, {170, 130}}) {
      Floats shard(kN * Vs);
      for (int64_t r = 0; r < kN; ++r) std::copy_n(logits.data() + r * kV + v0, Vs, shard.data() + r * Vs);
      const Bits shard16 = to16(shard, s);
      Floats mx32(kN), mx16(kN), sums32(2 * kN), sums16(2 * kN), d32(kN * Vs);
      Bits d16(kN * Vs);
      kern::cross_entropy_shard_max<float>(mx32.data(), shard.data(), kN, Vs);
      k16::cross_entropy_shard_max(s, mx16.data(), shard16.data(), kN, Vs);
      CHECK(same_bits(mx16, mx32));
      kern::cross_entropy_shard_sums<float>(sums32.data(), shard.data(), mx32.data(), targets.data(), kN, v0, Vs, kV);
      k16::cross_entropy_shard_sums(s, sums16.data(), shard16.data(), mx32.data(), targets.data(), kN, v0, Vs, kV);
      CHECK(same_bits(sums16, sums32));
      kern::cross_entropy_shard_backward<float>(d32.data(), shard.data(), mx32.data(), sums32.data(),
                                                targets.data(), kN, v0, Vs, kV, 0.5f);
      k16::cross_entropy_shard_backward(s, d16.data(), shard16.data(), mx32.data(), sums32.data(),
                                        targets.data(), kN, v0, Vs, kV, 0.5f);
      CHECK(d16 == rounded(d32, s));
    }
  }
}

namespace {

// The linear kernels on N rows, C inputs, OC outputs and a tied head of V: 16-bit against fp32.
void check_linear(ScalarType s, int64_t N, int64_t C, int64_t OC, int64_t V) {
  INFO("N " << N << ", C " << C << ", OC " << OC << ", V " << V);
  INFO("activations " << to_string(s) << ", " << (kern::matmul_supports(s) ? "16-bit" : "fp32")
                      << " products");
  const double u = unit_roundoff(s);
  const Floats x = random_values(N * C, 21, s), dy = random_values(N * OC, 22, s);
  const Floats w = random_values(C * OC, 23, s), b = random_values(OC, 24, s);
  const Bits x16 = to16(x, s), dy16 = to16(dy, s), w16 = to16(w, s), b16 = to16(b, s);
  const kern::Param<float> wp(w16.data(), s), bp(b16.data(), s);

  // y = x w + b: K = C terms plus the bias.
  Floats y32(N * OC);
  Bits y16(N * OC);
  kern::linear_forward<float>(y32.data(), x.data(), kern::Param<float>(w.data()), kern::Param<float>(b.data()),
                              true, N, C, OC);
  k16::linear_forward(s, y16.data(), x16.data(), wp, bp, true, N, C, OC);
  auto terms = abs_product(N, OC, C, [&](int64_t i, int64_t k) { return x[i * C + k]; },
                           [&](int64_t k, int64_t j) { return w[k * OC + j]; });
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < OC; ++j) terms[i * OC + j] += std::abs(b[j]);
  CHECK(worst_ratio(from16(y16, s), y32, terms, C + 1, u) <= 1.0);
  // fp32 weights with 16-bit activations: the fp32 product on widened blocks, rounded once.
  k16::linear_forward(s, y16.data(), x16.data(), kern::Param<float>(w.data()),
                      kern::Param<float>(b.data()), true, N, C, OC);
  CHECK(worst_ratio(from16(y16, s), y32, terms, C + 1, u) <= 1.0);

  // dx = dy w^T: K = OC.
  Floats dx32(N * C);
  Bits dx16(N * C);
  kern::linear_backward_input<float>(dx32.data(), dy.data(), kern::Param<float>(w.data()), N, C, OC);
  k16::linear_backward_input(s, dx16.data(), dy16.data(), wp, N, C, OC);
  terms = abs_product(N, C, OC, [&](int64_t i, int64_t k) { return dy[i * OC + k]; },
                      [&](int64_t k, int64_t j) { return w[j * OC + k]; });
  CHECK(worst_ratio(from16(dx16, s), dx32, terms, OC, u) <= 1.0);

  // dw += x^T dy into an fp32 gradient (K = N, no rounding to S), db += column sums of dy.
  Floats dw32(C * OC, 0.0f), dw16(C * OC, 0.0f), db32(OC, 0.0f), db16(OC, 0.0f);
  kern::linear_backward_weight<float>(dw32.data(), db32.data(), true, dy.data(), x.data(), N, C, OC);
  k16::linear_backward_weight(s, dw16.data(), db16.data(), true, dy16.data(), x16.data(), N, C, OC);
  terms = abs_product(C, OC, N, [&](int64_t i, int64_t k) { return x[k * C + i]; },
                      [&](int64_t k, int64_t j) { return dy[k * OC + j]; });
  CHECK(worst_ratio(dw16, dw32, terms, N, 0.0) <= 1.0);
  CHECK(same_bits(db16, db32));  // the column sums: the fp32 kernel's order on the same values

  // The tied head: logits = x wte^T (K = C), dx = dlogits wte (K = V), dwte += dlogits^T x.
  const Floats wte = random_values(V * C, 25, s), dl = random_values(N * V, 26, s);
  const Bits wte16 = to16(wte, s), dl16 = to16(dl, s);
  Floats l32(N * V);
  Bits l16(N * V);
  kern::linear_t_forward<float>(l32.data(), x.data(), kern::Param<float>(wte.data()), N, C, V);
  k16::linear_t_forward(s, l16.data(), x16.data(), kern::Param<float>(wte16.data(), s), N, C, V);
  terms = abs_product(N, V, C, [&](int64_t i, int64_t k) { return x[i * C + k]; },
                      [&](int64_t k, int64_t j) { return wte[j * C + k]; });
  CHECK(worst_ratio(from16(l16, s), l32, terms, C, u) <= 1.0);
  kern::linear_t_backward_input<float>(dx32.data(), dl.data(), kern::Param<float>(wte.data()), N, C, V);
  k16::linear_t_backward_input(s, dx16.data(), dl16.data(), kern::Param<float>(wte16.data(), s), N, C, V);
  terms = abs_product(N, C, V, [&](int64_t i, int64_t k) { return dl[i * V + k]; },
                      [&](int64_t k, int64_t j) { return wte[k * C + j]; });
  CHECK(worst_ratio(from16(dx16, s), dx32, terms, V, u) <= 1.0);
  Floats dwte32(V * C, 0.0f), dwte16(V * C, 0.0f);
  kern::linear_t_backward_weight<float>(dwte32.data(), dl.data(), x.data(), N, C, V);
  k16::linear_t_backward_weight(s, dwte16.data(), dl16.data(), x16.data(), N, C, V);
  terms = abs_product(V, C, N, [&](int64_t i, int64_t k) { return dl[k * V + i]; },
                      [&](int64_t k, int64_t j) { return x[k * C + j]; });
  CHECK(worst_ratio(dwte16, dwte32, terms, N, 0.0) <= 1.0);
  // A 16-bit gradient gets the fp32 sum rounded once on the add.
  Bits dwb(V * C, 0);
  k16::linear_t_backward_weight(s, kern::Grad<float>(dwb.data(), s), dl16.data(), x16.data(), N, C, V);
  CHECK(dwb == rounded(dwte16, s));
}

}  // namespace

TEST_CASE("16-bit linear products are within one rounding and two fp32 sums of the fp32 kernels") {
  for (const ScalarType s : kTypes) {
    check_linear(s, kN, kC, kOC, kV);
    // Wider shapes: a short last row block (N = 200), weights cut into column slices (OC and V
    // above 1024) and weight gradients with more than two rows of 256-row tiles (C = 600, V),
    // whose right operands are packed once for all of them.
    check_linear(s, 200, 600, 1100, 1100);
  }
}

namespace {

struct Attn {
  Floats out, lse, dqkv;
};
struct AttnCase {
  int64_t B, T, C, NH;
};
// Lengths crossing the blocks (64 queries by 128 keys), head sizes 32 and 64; the last three in
// whole tiles (T and hs multiples of 32: the AMX path where there is one), with a short last
// query block (96, 160) and a short last key block (96, 160, 192).
const AttnCase kAttnCases[] = {{2, 1, 64, 2},   {2, 37, 64, 2},   {1, 129, 128, 2},
                               {2, 300, 64, 2}, {1, 200, 192, 3}, {2, 96, 64, 2},
                               {1, 160, 128, 2}, {1, 192, 192, 3}};

// Restores the AMX path when a test switched it off.
struct RestoreTiles {
  ~RestoreTiles() { kern::amx::use_tiles(true); }
};

Attn attention32(const AttnCase& k, const Floats& qkv, const Floats& dout) {
  Attn a{Floats(k.B * k.T * k.C), Floats(k.B * k.NH * k.T), Floats(qkv.size())};
  kern::attention_forward_lse<float>(a.out.data(), a.lse.data(), qkv.data(), k.B, k.T, k.C, k.NH);
  kern::attention_backward_lse<float>(a.dqkv.data(), dout.data(), qkv.data(), a.out.data(), a.lse.data(),
                                      k.B, k.T, k.C, k.NH);
  return a;
}
// The 16-bit pair, outputs widened (exactly) to fp32.
Attn attention16(ScalarType s, const AttnCase& k, const Floats& qkv, const Floats& dout) {
  const Bits qkv16 = to16(qkv, s), dout16 = to16(dout, s);
  Bits out16(k.B * k.T * k.C), dqkv16(qkv.size());
  Attn a{{}, Floats(k.B * k.NH * k.T), {}};
  k16::attention_forward_lse(s, out16.data(), a.lse.data(), qkv16.data(), k.B, k.T, k.C, k.NH);
  k16::attention_backward_lse(s, dqkv16.data(), dout16.data(), qkv16.data(), out16.data(), a.lse.data(),
                              k.B, k.T, k.C, k.NH);
  a.out = from16(out16, s);
  a.dqkv = from16(dqkv16, s);
  return a;
}

}  // namespace

TEST_CASE("16-bit blocked attention agrees with the fp32 kernel within its roundings") {
  RestoreTiles restore;
  const bool amx = kern::amx::available();
  for (const bool tiles : {true, false}) {
    if (tiles && !amx) continue;  // no AMX here: the oneDNN path alone
    kern::amx::use_tiles(tiles);
    for (const ScalarType s : kTypes) {
      const double u = unit_roundoff(s);
      for (const AttnCase& k : kAttnCases) {
        INFO(to_string(s) << " B " << k.B << " T " << k.T << " C " << k.C << " NH " << k.NH
                          << (tiles ? " (AMX tiles where they apply)" : " (oneDNN products)"));
        // q, k in [-2, 2): scores up to ~hs/3 / sqrt(hs), so softmaxes that are far from uniform.
        const Floats qkv = random_values(k.B * k.T * 3 * k.C, 31 + k.T, s, -2, 2);
        const Floats dout = random_values(k.B * k.T * k.C, 32 + k.T, s);
        const Attn a = attention32(k, qkv, dout), h = attention16(s, k, qkv, dout);
        const double e_out = rel_to_max(h.out, a.out), e_d = rel_to_max(h.dqkv, a.dqkv);
        double e_lse = 0;
        for (size_t i = 0; i < a.lse.size(); ++i)
          e_lse = std::max(e_lse, std::abs(double(h.lse[i]) - double(a.lse[i])) / (1 + std::abs(double(a.lse[i]))));
        INFO("out " << e_out << " lse " << e_lse << " dqkv " << e_d << " (relative to the largest entry)");
        // lse: scores of exact products summed in fp32 in another order: fp32 noise only.
        CHECK(e_lse <= 1e-5);
        // out = sum_j P_j v_j / l: P rounded (u per term; sum_j P_j = 1, so at most u max|v|) and
        // out rounded once (u |out|): within 2u of max |v|, about max |out| here. Measured: 0.63u
        // (bf16), 0.5u (fp16, whose P stays fp32 where oneDNN has no fp16 kernel). Bound 2u.
        CHECK(e_out <= 2 * u);
        // dqkv: dV sums P dO (one rounded operand), dQ and dK sum dS k and dS q where dS = P (dP - D)
        // is itself rounded after a cancellation, and each is rounded once on store; measured 0.77u
        // (bf16) and 0.77u (fp16) of the tensor's largest entry. Bound 4u.
        CHECK(e_d <= 4 * u);
      }
    }
  }
}

namespace {

// Every 16-bit kernel once on fixed inputs; all outputs' bits, concatenated.
std::vector<uint32_t> run_all16(ScalarType s) {
  std::vector<uint32_t> bits;
  const auto keep16 = [&](const Bits& b) { bits.insert(bits.end(), b.begin(), b.end()); };
  const auto keep32 = [&](const Floats& f) {
    for (float v : f) bits.push_back(std::bit_cast<uint32_t>(v));
  };
  const Floats x = random_values(kN * kC, 41, s), dy = random_values(kN * kOC, 42, s);
  const Floats w = random_values(kC * kOC, 43, s), lnw = random_values(kC, 44, s, 0.5, 1.5);
  const Bits x16 = to16(x, s), dy16 = to16(dy, s), w16 = to16(w, s), lnw16 = to16(lnw, s);
  const kern::Param<float> wp(w16.data(), s), lp(lnw16.data(), s);
  Bits y(kN * kOC), dx(kN * kC);
  Floats dw(kC * kOC, 0.0f), db(kOC, 0.0f), mean(kN), rstd(kN), lw(kC, 0.0f), lb(kC, 0.0f);
  k16::linear_forward(s, y.data(), x16.data(), wp, lp, false, kN, kC, kOC);
  k16::linear_backward_input(s, dx.data(), dy16.data(), wp, kN, kC, kOC);
  k16::linear_backward_weight(s, dw.data(), db.data(), true, dy16.data(), x16.data(), kN, kC, kOC);
  keep16(y), keep16(dx), keep32(dw), keep32(db);
  k16::gelu_forward(s, y.data(), dy16.data(), kN * kOC);
  keep16(y);
  Bits g(kN * kOC);
  k16::gelu_backward(s, g.data(), dy16.data(), y.data(), kN * kOC);
  keep16(g);
  k16::layernorm_forward(s, dx.data(), mean.data(), rstd.data(), x16.data(), lp, lp, kN, kC);
  keep16(dx), keep32(mean), keep32(rstd);
  Bits ldx(kN * kC);
  k16::layernorm_backward(s, ldx.data(), lw.data(), lb.data(), dx.data(), x16.data(), lp, mean.data(),
                          rstd.data(), kN, kC);
  keep16(ldx), keep32(lw), keep32(lb);
  const auto targets = random_ids(kN, 45, kOC, true);
  Floats losses(kN);
  const float loss = k16::cross_entropy_forward(s, losses.data(), dy16.data(), targets.data(), kN, kOC);
  keep32(losses), keep32({loss});
  k16::cross_entropy_backward(s, y.data(), dy16.data(), targets.data(), kN, kOC, 1.0f);
  keep16(y);
  // A wide layer: weights in two column slices, a weight gradient with packed right operands.
  {
    const int64_t N = 200, C = 600, OC = 1100;
    const Bits wx = to16(random_values(N * C, 48, s), s), wdy = to16(random_values(N * OC, 49, s), s);
    const Bits ww = to16(random_values(C * OC, 50, s), s);
    Bits wy(N * OC), wdx(N * C);
    Floats wdw(C * OC, 0.0f), wdb(OC, 0.0f);
    k16::linear_forward(s, wy.data(), wx.data(), kern::Param<float>(ww.data(), s), lp, false, N, C, OC);
    k16::linear_backward_input(s, wdx.data(), wdy.data(), kern::Param<float>(ww.data(), s), N, C, OC);
    k16::linear_backward_weight(s, wdw.data(), wdb.data(), true, wdy.data(), wx.data(), N, C, OC);
    keep16(wy), keep16(wdx), keep32(wdw), keep32(wdb);
  }
  // Attention off and (on bf16 with AMX) on the tile path, whose forward splits its tasks by
  // (batch, head) on 1 thread and by query block on 2 here.
  for (const AttnCase& k : {AttnCase{2, 300, 64, 2}, AttnCase{1, 256, 128, 2}}) {
    const Floats qkv = random_values(k.B * k.T * 3 * k.C, 46, s, -2, 2);
    const Floats dout = random_values(k.B * k.T * k.C, 47, s);
    const Attn a = attention16(s, k, qkv, dout);
    keep32(a.out), keep32(a.lse), keep32(a.dqkv);
  }
  return bits;
}

}  // namespace

TEST_CASE("16-bit kernels give the same bits on 1 and 2 threads and on every vector path") {
  RestoreSimd restore;
  for (const ScalarType s : kTypes) {
    INFO(to_string(s));
    const auto run = [&](size_t threads) {
      const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
      return run_all16(s);
    };
    const auto one = run(1), two = run(2);
    CHECK(one == two);
    for (const ew::Simd p : {ew::Simd::generic, ew::Simd::avx2, ew::Simd::avx512}) {
      if (!ew::supported(p)) continue;
      INFO("vector path " << ew::to_string(p));
      ew::use(p);
      CHECK(run(2) == two);
    }
    ew::use(ew::Simd::best);
  }
}

TEST_CASE("ops refuse activation types the cpu backend has no kernels for") {
  auto device = make_device(DeviceKind::cpu);
  auto stream = device->create_stream("compute");
  auto ops = models::make_ops(*device, *stream);
  const auto t = [&](Shape shape, ScalarType type) {
    return Tensor::empty(*device, shape, type, MemCategory::activations);
  };
  // int32 is no activation type.
  REQUIRE_THROWS_WITH(ops->gelu_forward(t({4}, ScalarType::i32), t({4}, ScalarType::i32)),
                      Catch::Matchers::ContainsSubstring("activations are fp32, fp64, bf16 or fp16"));
  // The probabilities pair has no 16-bit kernels on cpu: refused with the way out.
  REQUIRE_THROWS_WITH(ops->attention_forward(t({1, 4, 8}, ScalarType::bf16), t({1, 2, 4, 4}, ScalarType::bf16),
                                             t({1, 4, 24}, ScalarType::bf16), 2),
                      Catch::Matchers::ContainsSubstring("HINT: use attention_forward_lse"));
  // fp64 accumulators go with fp64 activations only.
  REQUIRE_THROWS_WITH(ops->accumulate(t({4}, ScalarType::f64), t({4}, ScalarType::bf16)),
                      Catch::Matchers::ContainsSubstring("expected type bf16"));
  // A 16-bit parameter is fine, an fp64 one with bf16 activations is not.
  REQUIRE_THROWS_WITH(ops->layernorm_forward(t({2, 4}, ScalarType::bf16), t({2}, ScalarType::f32),
                                             t({2}, ScalarType::f32), t({2, 4}, ScalarType::bf16),
                                             t({4}, ScalarType::f64), t({4}, ScalarType::f64)),
                      Catch::Matchers::ContainsSubstring("fp64 parameters go with fp64 activations"));
  // 16-bit activations need fp32 statistics.
  REQUIRE_THROWS_WITH(ops->layernorm_forward(t({2, 4}, ScalarType::bf16), t({2}, ScalarType::bf16),
                                             t({2}, ScalarType::f32), t({2, 4}, ScalarType::bf16),
                                             t({4}, ScalarType::bf16), t({4}, ScalarType::bf16)),
                      Catch::Matchers::ContainsSubstring("expected type fp32"));
}
