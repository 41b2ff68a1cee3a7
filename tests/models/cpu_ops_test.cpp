// Tests of the cpu backend of models/ops.hpp (models/cpu/cpu_ops.cpp), through make_cpu_ops on a
// cpu device and stream: every op gives bitwise what its kernel (models/cpu/kernels.hpp) gives;
// 16-bit parameters are read as fp32 except in the linear layers' products, which are 16-bit
// (within a stated bound); 16-bit gradients rounded once; bad ids surface from
// check_errors(); results do not depend on the number of oneTBB threads.
//
// One run enqueues every op before reading anything, and drops its handles on short-lived
// inputs (upstream gradients, the token tensor) right after enqueuing: the ops must keep their
// operands alive themselves.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "models/cpu/kernels.hpp"
#include "models/cpu/matmul.hpp"
#include "models/ops.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"

using namespace zero;
namespace kern = zero::models::cpu;
using Catch::Matchers::ContainsSubstring;
using Vec = std::vector<double>;
using Outputs = std::map<std::string, Vec>;

namespace {

struct Shapes {
  int64_t B, T, C, NH, V, OC;
  int64_t N() const { return B * T; }
  int64_t Tmax() const { return T + 2; }
};
constexpr Shapes kSmall{2, 5, 8, 2, 11, 6};
// Every kernel runs several of its fixed blocks: N = 320 rows (3 GEMM row blocks of 128, 5 row-sum
// partials of 64), C = 264 and OC = V = 300 (2 weight-gradient tiles of 256 per side),
// N * OC = 96000 elements (6 elementwise blocks of 16384).
constexpr Shapes kLarge{4, 80, 264, 4, 300, 300};

double round_to(double v, ScalarType t) {
  switch (t) {
    case ScalarType::f32: return double(float(v));
    case ScalarType::bf16: return double(to_float(to_bfloat16(float(v))));
    case ScalarType::f16: return double(to_float(to_half(float(v))));
    default: return v;
  }
}

Vec random_vec(int64_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = double(float(dist(gen)));
  return v;
}

std::vector<int32_t> random_ids(int64_t n, uint64_t seed, int64_t hi) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(hi - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// Inputs of one run, as doubles that the storage types of the run represent exactly.
struct Data {
  Shapes s;
  std::vector<int32_t> tokens, targets;
  Vec wte, wpe, x, ln_w, ln_b, lin_w, lin_b, head_w, qkv, logits, dy_c, dy_oc, dy_v;
  Vec g_wte, g_wpe, g_ln_w, g_ln_b, g_lin_w, g_lin_b, g_head_w;  // gradients' initial values

  Data(Shapes sh, ScalarType param, ScalarType grad) : s(sh) {
    const int64_t N = s.N(), C = s.C, V = s.V, OC = s.OC;
    tokens = random_ids(N, 1, V);
    targets = random_ids(N, 2, V);
    targets[1] = -1;
    const auto p = [&](int64_t n, uint64_t seed) { return rounded(random_vec(n, seed), param); };
    const auto g = [&](int64_t n, uint64_t seed) { return rounded(random_vec(n, seed), grad); };
    wte = p(V * C, 3), wpe = p(s.Tmax() * C, 4), ln_w = p(C, 5), ln_b = p(C, 6);
    lin_w = p(C * OC, 7), lin_b = p(OC, 8), head_w = p(V * C, 9);
    x = random_vec(N * C, 10, -1, 2), qkv = random_vec(N * 3 * C, 11, -2, 2);
    logits = random_vec(N * V, 12, -3, 3);
    dy_c = random_vec(N * C, 13), dy_oc = random_vec(N * OC, 14), dy_v = random_vec(N * V, 15);
    g_wte = g(V * C, 16), g_wpe = g(s.Tmax() * C, 17), g_ln_w = g(C, 18), g_ln_b = g(C, 19);
    g_lin_w = g(C * OC, 20), g_lin_b = g(OC, 21), g_head_w = g(V * C, 22);
  }
  static Vec rounded(Vec v, ScalarType t) {
    for (double& e : v) e = round_to(e, t);
    return v;
  }
};

struct Fixture {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_cpu_ops(*device, *stream);

  // A tensor of `type` holding v (exactly: v is representable in it). Written directly: cpu
  // tensors are host memory, and no op has been given this tensor yet.
  Tensor make(Shape shape, ScalarType type, const Vec& v) const {
    Tensor t = Tensor::empty(*device, shape, type, MemCategory::activations);
    REQUIRE(size_t(t.numel()) == v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      switch (type) {
        case ScalarType::f64: t.data_as<double>()[i] = v[i]; break;
        case ScalarType::f32: t.data_as<float>()[i] = float(v[i]); break;
        case ScalarType::bf16: t.data_as<bfloat16>()[i] = to_bfloat16(float(v[i])); break;
        case ScalarType::f16: t.data_as<half>()[i] = to_half(float(v[i])); break;
        default: FAIL("not a float type");
      }
    }
    return t;
  }
  Tensor ids(Shape shape, const std::vector<int32_t>& v) const {
    Tensor t = Tensor::empty(*device, shape, ScalarType::i32, MemCategory::activations);
    std::memcpy(t.data(), v.data(), t.bytes());
    return t;
  }
  Tensor empty(Shape shape, ScalarType type) const {
    return Tensor::empty(*device, shape, type, MemCategory::activations);
  }
  // The elements, widened exactly to double, once the stream has run everything.
  Vec read(const Tensor& t) const {
    ops->check_errors();
    Vec v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      switch (t.type()) {
        case ScalarType::f64: v[i] = t.data_as<double>()[i]; break;
        case ScalarType::f32: v[i] = t.data_as<float>()[i]; break;
        case ScalarType::bf16: v[i] = to_float(t.data_as<bfloat16>()[i]); break;
        case ScalarType::f16: v[i] = to_float(t.data_as<half>()[i]); break;
        default: FAIL("not a float type");
      }
    }
    return v;
  }
};

// Every op once, through Ops: activations of type A, parameters of type P, gradients of type G.
// Gradient outputs are named "grad.*".
Outputs via_ops(const Fixture& fx, const Data& d, ScalarType A, ScalarType P, ScalarType G) {
  const Shapes& s = d.s;
  const int64_t B = s.B, T = s.T, C = s.C, V = s.V, OC = s.OC, N = s.N();
  models::Ops& ops = *fx.ops;
  std::vector<std::pair<std::string, Tensor>> keep;
  const auto out = [&](const std::string& name, Tensor t) { keep.emplace_back(name, t); return t; };

  const Tensor emb = out("embedding.out", fx.empty({B, T, C}, A));
  const Tensor wte = fx.make({V, C}, P, d.wte), wpe = fx.make({s.Tmax(), C}, P, d.wpe);
  ops.embedding_forward(emb, fx.ids({B, T}, d.tokens), wte, wpe);
  ops.embedding_backward(out("grad.dwte", fx.make({V, C}, G, d.g_wte)),
                         out("grad.dwpe", fx.make({s.Tmax(), C}, G, d.g_wpe)),
                         fx.make({B, T, C}, A, d.dy_c), fx.ids({B, T}, d.tokens));

  const Tensor x = fx.make({B, T, C}, A, d.x), lnw = fx.make({C}, P, d.ln_w);
  const Tensor mean = out("layernorm.mean", fx.empty({N}, A));
  const Tensor rstd = out("layernorm.rstd", fx.empty({N}, A));
  ops.layernorm_forward(out("layernorm.y", fx.empty({B, T, C}, A)), mean, rstd, x, lnw,
                        fx.make({C}, P, d.ln_b));
  ops.layernorm_backward(out("layernorm.dx", fx.empty({B, T, C}, A)),
                         out("grad.ln.dw", fx.make({C}, G, d.g_ln_w)),
                         out("grad.ln.db", fx.make({C}, G, d.g_ln_b)),
                         fx.make({B, T, C}, A, d.dy_c), x, lnw, mean, rstd);

  const Tensor lw = fx.make({C, OC}, P, d.lin_w), dy_oc = fx.make({B, T, OC}, A, d.dy_oc);
  ops.linear_forward(out("linear.y", fx.empty({B, T, OC}, A)), x, lw, fx.make({OC}, P, d.lin_b));
  ops.linear_backward(out("linear.dx", fx.empty({B, T, C}, A)),
                      out("grad.linear.dw", fx.make({C, OC}, G, d.g_lin_w)),
                      out("grad.linear.db", fx.make({OC}, G, d.g_lin_b)), dy_oc, x, lw);
  ops.linear_forward(out("linear_nobias.y", fx.empty({N, OC}, A)), x.reshaped({N, C}), lw,
                     Tensor());
  ops.linear_backward(Tensor(), out("grad.linear_nobias.dw", fx.make({C, OC}, G, d.g_lin_w)),
                      Tensor(), dy_oc, x, lw);

  const Tensor hw = fx.make({V, C}, P, d.head_w);
  ops.linear_t_forward(out("linear_t.y", fx.empty({B, T, V}, A)), x, hw);
  ops.linear_t_backward(out("linear_t.dx", fx.empty({B, T, C}, A)),
                        out("grad.linear_t.dw", fx.make({V, C}, G, d.g_head_w)),
                        fx.make({B, T, V}, A, d.dy_v), x, hw);

  ops.gelu_forward(out("gelu.y", fx.empty({B, T, C}, A)), x);
  ops.gelu_backward(out("gelu.dx", fx.empty({B, T, C}, A)), fx.make({B, T, C}, A, d.dy_c), x);

  const Tensor qkv = fx.make({B, T, 3 * C}, A, d.qkv);
  const Tensor probs = out("attention.probs", fx.empty({B, s.NH, T, T}, A));
  ops.attention_forward(out("attention.out", fx.empty({B, T, C}, A)), probs, qkv, int(s.NH));
  ops.attention_backward(out("attention.dqkv", fx.empty({B, T, 3 * C}, A)),
                         fx.make({B, T, C}, A, d.dy_c), qkv, probs, int(s.NH));

  // The blocked pair (no probabilities): lse in the statistics type.
  const ScalarType S = A == ScalarType::f64 ? ScalarType::f64 : ScalarType::f32;
  const Tensor bout = out("attention_lse.out", fx.empty({B, T, C}, A));
  const Tensor lse = out("attention_lse.lse", fx.empty({B, s.NH, T}, S));
  ops.attention_forward_lse(bout, lse, qkv, int(s.NH));
  ops.attention_backward_lse(out("attention_lse.dqkv", fx.empty({B, T, 3 * C}, A)),
                             fx.make({B, T, C}, A, d.dy_c), qkv, bout, lse, int(s.NH));

  ops.add(out("add.out", fx.empty({B, T, C}, A)), x, fx.make({B, T, C}, A, d.dy_c));
  ops.accumulate(out("accumulate.acc", fx.make({N, C}, A, d.x)), fx.make({B, T, C}, A, d.dy_c));

  const Tensor logits = fx.make({B, T, V}, A, d.logits);
  ops.cross_entropy_forward(out("cross_entropy.loss", fx.empty({1}, A)),
                            out("cross_entropy.losses", fx.empty({N}, A)), logits,
                            fx.ids({N}, d.targets));
  ops.cross_entropy_backward(out("cross_entropy.dlogits", fx.empty({B, T, V}, A)), logits,
                             fx.ids({N}, d.targets), 0.7f);

  ops.zero(out("zero", fx.make({N, C}, A, d.x)));

  Outputs r;
  for (const auto& [name, t] : keep) r[name] = fx.read(t);
  return r;
}

// The same through the kernels, in F, with parameters and gradients of type F.
template <class F>
Outputs via_kernels(const Data& d) {
  const Shapes& s = d.s;
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH, V = s.V, OC = s.OC, N = s.N();
  const auto cv = [](const Vec& v) { return std::vector<F>(v.begin(), v.end()); };
  const auto up = [](const std::vector<F>& v) { return Vec(v.begin(), v.end()); };
  const auto fresh = [](int64_t n) { return std::vector<F>(static_cast<size_t>(n)); };
  const std::vector<F> x = cv(d.x), dy_c = cv(d.dy_c), dy_oc = cv(d.dy_oc), dy_v = cv(d.dy_v);
  const std::vector<F> lnw = cv(d.ln_w), lw = cv(d.lin_w), hw = cv(d.head_w), qkv = cv(d.qkv);
  Outputs r;

  auto a = fresh(N * C), b = fresh(N * C), g1 = cv(d.g_wte), g2 = cv(d.g_wpe);
  kern::embedding_forward<F>(a.data(), d.tokens.data(), cv(d.wte).data(), cv(d.wpe).data(), B, T,
                             C, V);
  kern::embedding_backward<F>(g1.data(), g2.data(), dy_c.data(), d.tokens.data(), B, T, C, V);
  r["embedding.out"] = up(a), r["grad.dwte"] = up(g1), r["grad.dwpe"] = up(g2);

  auto mean = fresh(N), rstd = fresh(N), dw = cv(d.g_ln_w), db = cv(d.g_ln_b);
  kern::layernorm_forward<F>(a.data(), mean.data(), rstd.data(), x.data(), lnw.data(),
                             cv(d.ln_b).data(), N, C);
  kern::layernorm_backward<F>(b.data(), dw.data(), db.data(), dy_c.data(), x.data(), lnw.data(),
                              mean.data(), rstd.data(), N, C);
  r["layernorm.y"] = up(a), r["layernorm.mean"] = up(mean), r["layernorm.rstd"] = up(rstd);
  r["layernorm.dx"] = up(b), r["grad.ln.dw"] = up(dw), r["grad.ln.db"] = up(db);

  auto y = fresh(N * OC), lw_g = cv(d.g_lin_w), lb_g = cv(d.g_lin_b), lw_g2 = cv(d.g_lin_w);
  kern::linear_forward<F>(y.data(), x.data(), lw.data(), cv(d.lin_b).data(), true, N, C, OC);
  kern::linear_backward<F>(b.data(), lw_g.data(), lb_g.data(), true, dy_oc.data(), x.data(),
                           lw.data(), N, C, OC);
  r["linear.y"] = up(y), r["linear.dx"] = up(b);
  r["grad.linear.dw"] = up(lw_g), r["grad.linear.db"] = up(lb_g);
  kern::linear_forward<F>(y.data(), x.data(), lw.data(), nullptr, false, N, C, OC);
  kern::linear_backward<F>(nullptr, lw_g2.data(), nullptr, false, dy_oc.data(), x.data(),
                           lw.data(), N, C, OC);
  r["linear_nobias.y"] = up(y), r["grad.linear_nobias.dw"] = up(lw_g2);

  auto yv = fresh(N * V), hw_g = cv(d.g_head_w);
  kern::linear_t_forward<F>(yv.data(), x.data(), hw.data(), N, C, V);
  kern::linear_t_backward<F>(b.data(), hw_g.data(), dy_v.data(), x.data(), hw.data(), N, C, V);
  r["linear_t.y"] = up(yv), r["linear_t.dx"] = up(b), r["grad.linear_t.dw"] = up(hw_g);

  kern::gelu_forward<F>(a.data(), x.data(), N * C);
  kern::gelu_backward<F>(b.data(), dy_c.data(), x.data(), N * C);
  r["gelu.y"] = up(a), r["gelu.dx"] = up(b);

  auto probs = fresh(B * NH * T * T), dqkv = fresh(N * 3 * C);
  kern::attention_forward<F>(a.data(), probs.data(), qkv.data(), B, T, C, NH);
  kern::attention_backward<F>(dqkv.data(), dy_c.data(), qkv.data(), probs.data(), B, T, C, NH);
  r["attention.out"] = up(a), r["attention.probs"] = up(probs), r["attention.dqkv"] = up(dqkv);
  auto lse = fresh(B * NH * T);
  kern::attention_forward_lse<F>(a.data(), lse.data(), qkv.data(), B, T, C, NH);
  kern::attention_backward_lse<F>(dqkv.data(), dy_c.data(), qkv.data(), a.data(), lse.data(), B,
                                  T, C, NH);
  r["attention_lse.out"] = up(a), r["attention_lse.lse"] = up(lse);
  r["attention_lse.dqkv"] = up(dqkv);

  auto acc = x;
  kern::add<F>(a.data(), x.data(), dy_c.data(), N * C);
  kern::accumulate<F>(acc.data(), dy_c.data(), N * C);
  r["add.out"] = up(a), r["accumulate.acc"] = up(acc);

  auto losses = fresh(N), dl = fresh(N * V);
  const std::vector<F> logits = cv(d.logits);
  const F loss =
      kern::cross_entropy_forward<F>(losses.data(), logits.data(), d.targets.data(), N, V);
  kern::cross_entropy_backward<F>(dl.data(), logits.data(), d.targets.data(), N, V, F(0.7f));
  r["cross_entropy.loss"] = Vec{double(loss)}, r["cross_entropy.losses"] = up(losses);
  r["cross_entropy.dlogits"] = up(dl);
  r["zero"] = Vec(static_cast<size_t>(N * C), 0.0);
  return r;
}

bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

void check_same(const Outputs& got, const Outputs& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(bitwise_equal(got.at(name), w));
  }
}

// The outputs of the linear layers' products, and those of their weight gradients.
const std::set<std::string> kProductOutputs = {"linear.y", "linear.dx", "linear_nobias.y",
                                               "linear_t.y", "linear_t.dx"};
const std::set<std::string> kWeightGradOutputs = {"grad.linear.dw", "grad.linear_nobias.dw",
                                                  "grad.linear_t.dw"};

// Per element of every output, sum_k |a_k| |b_k| of its product: the fp64 kernels on the
// absolute values, with zero biases and zero initial gradients.
Outputs abs_products(const Data& d) {
  Data a = d;
  for (Vec* v : {&a.x, &a.lin_w, &a.head_w, &a.dy_oc, &a.dy_v})
    for (double& e : *v) e = std::abs(e);
  for (Vec* v : {&a.lin_b, &a.g_lin_w, &a.g_lin_b, &a.g_head_w})
    std::fill(v->begin(), v->end(), 0.0);
  return via_kernels<double>(a);
}

}  // namespace

TEST_CASE("fp32 ops give bitwise what the fp32 kernels give") {
  const Fixture fx;
  const Data d(kSmall, ScalarType::f32, ScalarType::f32);
  check_same(via_ops(fx, d, ScalarType::f32, ScalarType::f32, ScalarType::f32),
             via_kernels<float>(d));
}

TEST_CASE("fp64 ops give bitwise what the fp64 kernels give") {
  const Fixture fx;
  const Data d(kSmall, ScalarType::f64, ScalarType::f64);
  check_same(via_ops(fx, d, ScalarType::f64, ScalarType::f64, ScalarType::f64),
             via_kernels<double>(d));
}

TEST_CASE("16-bit parameters: bf16 products within their rounding, all else as fp32") {
  // Reference: the fp32 kernels on the widened parameters, gradients rounded once to their type.
  // Ops that do not multiply matrices give exactly that. The linear layers' products run in the
  // parameter's 16-bit type where oneDNN has a kernel for it (bf16 here; fp16 only on CPUs with
  // AVX512-FP16, else fp32 and exact), and the weight gradients' products in the gradient's.
  const std::vector<std::pair<ScalarType, ScalarType>> cases = {
      {ScalarType::bf16, ScalarType::bf16},
      {ScalarType::bf16, ScalarType::f32},
      {ScalarType::f16, ScalarType::f16},
      {ScalarType::f32, ScalarType::bf16},
  };
  for (const auto& [P, G] : cases) {
    INFO("parameters " << to_string(P) << ", gradients " << to_string(G));
    const Fixture fx;
    const Data d(kSmall, P, G);
    Outputs want = via_kernels<float>(d);
    for (auto& [name, v] : want)
      if (name.starts_with("grad.")) v = Data::rounded(v, G);
    const Outputs got = via_ops(fx, d, ScalarType::f32, P, G);
    const Outputs scale = abs_products(d);
    REQUIRE(got.size() == want.size());
    for (const auto& [name, w] : want) {
      INFO(name);
      const bool p16 = kProductOutputs.count(name) == 1 && P != ScalarType::f32 &&
                       kern::matmul_supports(P);
      const bool g16 = kWeightGradOutputs.count(name) == 1 && G != ScalarType::f32 &&
                       kern::matmul_supports(G);
      const Vec& g = got.at(name);
      if (!p16 && !g16) {
        CHECK(bitwise_equal(g, w));
        continue;
      }
      // One operand rounded to 16 bits (the activation; the weight is stored so) moves each
      // product term by at most u = 2^-8 of |a_k b_k| (8 significant bits), two operands (a
      // weight gradient's) by 2u + u^2; 2^-9 of the sum more covers the two fp32 accumulations'
      // differing orders (K 2^-24 each for K < 2^14). A gradient stored 16-bit then rounds
      // reference and result once each: u of each.
      const double u = std::ldexp(1.0, -8);
      const double terms = g16 ? 2 * u + u * u : u;
      const Vec& S = scale.at(name);
      double worst = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        const double stored = g16 ? u * (std::abs(w[i]) + std::abs(g[i])) : 0.0;
        const double bound = (terms + u / 2) * S[i] + stored;
        worst = std::max(worst, std::abs(g[i] - w[i]) / (bound + 1e-30));
      }
      INFO("largest error over its bound: " << worst);
      CHECK(worst <= 1.0);
      CHECK(!bitwise_equal(g, w));  // the 16-bit path ran: bf16 rounding of x in [-1, 2] shows
    }
  }
}

TEST_CASE("blocked attention ops check lse and out") {
  const Fixture fx;
  const Data d(kSmall, ScalarType::f32, ScalarType::f32);
  const int64_t B = kSmall.B, T = kSmall.T, C = kSmall.C;
  const int NH = int(kSmall.NH);
  REQUIRE(fx.ops->blocked_attention());
  const Tensor qkv = fx.make({B, T, 3 * C}, ScalarType::f32, d.qkv);
  const Tensor out = fx.empty({B, T, C}, ScalarType::f32);
  REQUIRE_THROWS_MATCHES(
      fx.ops->attention_forward_lse(out, fx.empty({B, NH, T, T}, ScalarType::f32), qkv, NH),
      Error, Catch::Matchers::MessageMatches(ContainsSubstring("attention_forward_lse: lse is") &&
                                             ContainsSubstring("expected 20 elements")));
  REQUIRE_THROWS_MATCHES(
      fx.ops->attention_forward_lse(out, fx.empty({B, NH, T}, ScalarType::f64), qkv, NH), Error,
      Catch::Matchers::MessageMatches(ContainsSubstring("attention_forward_lse: lse is") &&
                                      ContainsSubstring("expected type fp32")));
  REQUIRE_THROWS_MATCHES(
      fx.ops->attention_backward_lse(fx.empty({B, T, 3 * C}, ScalarType::f32), out, qkv,
                                     fx.empty({B, T, 2 * C}, ScalarType::f32),
                                     fx.empty({B, NH, T}, ScalarType::f32), NH),
      Error, Catch::Matchers::MessageMatches(ContainsSubstring("attention_backward_lse: out is")));
}

TEST_CASE("an out-of-range token id surfaces from check_errors") {
  const Fixture fx;
  constexpr int64_t V = 64, C = 4;
  std::vector<int32_t> tokens(2 * 5, 1);
  tokens[3] = 70;
  const Tensor out = fx.empty({2, 5, C}, ScalarType::f32);
  // Enqueuing succeeds: the ids are read on the stream.
  REQUIRE_NOTHROW(fx.ops->embedding_forward(out, fx.ids({2, 5}, tokens),
                                            fx.make({V, C}, ScalarType::f32, Vec(V * C, 0.5)),
                                            fx.make({5, C}, ScalarType::f32, Vec(5 * C, 0.5))));
  REQUIRE_THROWS_MATCHES(
      fx.ops->check_errors(), Error,
      Catch::Matchers::MessageMatches(ContainsSubstring(
          "embedding_forward: token id 70 at [b=0, t=3] is outside the vocabulary [0, 64)")));
  // The stream's error is sticky: it is reported again at the next step boundary.
  REQUIRE_THROWS_AS(fx.ops->check_errors(), Error);
}

TEST_CASE("an out-of-range target surfaces from check_errors") {
  const Fixture fx;
  const Data d(kSmall, ScalarType::f32, ScalarType::f32);
  std::vector<int32_t> targets = d.targets;
  targets[4] = int32_t(kSmall.V);
  REQUIRE_NOTHROW(fx.ops->cross_entropy_forward(
      fx.empty({1}, ScalarType::f32), fx.empty({kSmall.N()}, ScalarType::f32),
      fx.make({kSmall.N(), kSmall.V}, ScalarType::f32, d.logits), fx.ids({kSmall.N()}, targets)));
  REQUIRE_THROWS_MATCHES(fx.ops->check_errors(), Error,
                         Catch::Matchers::MessageMatches(ContainsSubstring(
                             "cross_entropy_forward: target 11 at row 4 is outside the "
                             "vocabulary [0, 11)")));
}

TEST_CASE("ops are deterministic: repeated runs and 1 or 2 threads give the same bits") {
  const Data d(kLarge, ScalarType::bf16, ScalarType::bf16);
  const auto run = [&](size_t threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    const Fixture fx;
    return via_ops(fx, d, ScalarType::f32, ScalarType::bf16, ScalarType::bf16);
  };
  const Outputs one = run(1);
  const Outputs two = run(2);
  check_same(two, one);
  check_same(run(2), two);
  // And fp32 gradients (their own accumulation path).
  const auto run32 = [&](size_t threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    const Fixture fx;
    return via_ops(fx, d, ScalarType::f32, ScalarType::f32, ScalarType::f32);
  };
  check_same(run32(2), run32(1));
}
