// The cuda backend of models/ops.hpp (models/cuda/) against the cpu backend, op by op. Without a
// GPU every case reports Skipped.
//
// Method: each case runs the same calls on both backends from the same input values. The cuda
// run stores them in its types (activations A = fp32, bf16 or fp16; gradients fp32 or A); the
// cpu run, the reference, stores the very same values (they are generated already rounded to the
// cuda run's types) in fp32 and computes in fp32. So the two start from identical numbers and
// differ only by what the cuda backend does differently: summation order, libm, and rounding
// its stored results (and stored intermediates) to 16 bits.
//
// Tolerances, per element, as a fraction of the largest reference magnitude in its row (the
// row of the output's last dimension; for dqkv one third of it, q, k or v; for statistics the
// whole tensor), chosen by the type the cuda backend stores the result in:
//   fp32  1e-5: inputs are identical and both compute in fp32 (GEMMs with fp32 accumulation and
//         no TF32); a sum of K terms in another order moves by about sqrt(K) 2^-24 of its
//         terms' magnitude (~4e-6 for K = 4096 at worst, far less for the sizes here), and
//         CUDA's expf / tanhf are within 2 ulp. 1e-5 is a margin of several times over that.
//   bf16  1e-2: a stored bf16 result is rounded once (8 significant bits: up to 2^-9 = 0.2% of
//         itself); attention also stores probs and dS in bf16 and feeds them on, which adds a
//         couple of such roundings along a path. About 4 half-ulps, 2^-7 = 0.8%, bounds that.
//   fp16  2e-3: the same count of roundings with 11 significant bits (2^-10 = 0.1%).
// Ops whose cuda result is one rounding of one fp32 operation on identical inputs (embedding
// forward, add, accumulate) must equal the cpu result rounded to the cuda type bit for bit.
//
// Also: bad token ids / targets are reported by check_errors() (lowest position of the first
// failing call) and clamped; every op gives the same bits on every run; "+=" adds into existing
// gradients; 16-bit weight gradients bigger than the backend's chunk are done in chunks; the
// type rules reject parameters that are not of the activation type.
#include <algorithm>
#include <bit>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "models/cuda/kernels.hpp"
#include "models/ops.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "tests/cuda_support.hpp"

// Not `using namespace zero`: cuda_fp16.h (through cuda_support.hpp) declares a global ::half.
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::MessageMatches;
using zero::DeviceKind;
using zero::MemCategory;
using zero::ScalarType;
using zero::Shape;
using zero::Tensor;
using Vec = std::vector<float>;
using Ids = std::vector<int32_t>;

#define REQUIRE_GPU() \
  if (!zero::test::have_gpu()) SKIP("no GPU")

namespace {

constexpr ScalarType f32 = ScalarType::f32, bf16 = ScalarType::bf16, f16 = ScalarType::f16;

float round_to(float v, ScalarType t) {
  switch (t) {
    case ScalarType::bf16: return zero::to_float(zero::to_bfloat16(v));
    case ScalarType::f16: return zero::to_float(zero::to_half(v));
    default: return v;
  }
}

double tolerance(ScalarType stored) {
  switch (stored) {
    case ScalarType::bf16: return 1e-2;
    case ScalarType::f16: return 2e-3;
    default: return 1e-5;
  }
}

// ---- a backend and the tensors of one run ------------------------------------------------------

struct Backend {
  explicit Backend(DeviceKind kind)
      : device(zero::make_device(kind)),
        stream(device->create_stream("compute")),
        ops(zero::models::make_ops(*device, *stream)) {}

  Tensor upload(Shape shape, ScalarType type, const Vec& v) const {
    Tensor t = Tensor::empty(*device, shape, type, MemCategory::activations);
    REQUIRE(size_t(t.numel()) == v.size());
    std::vector<unsigned char> bytes(t.bytes());
    for (size_t i = 0; i < v.size(); ++i) {
      if (type == f32) {
        std::memcpy(&bytes[4 * i], &v[i], 4);
      } else {
        const uint16_t b = type == bf16 ? zero::to_bfloat16(v[i]).bits : zero::to_half(v[i]).bits;
        std::memcpy(&bytes[2 * i], &b, 2);
      }
    }
    zero::copy_from_host(*device, *stream, t, bytes.data());
    stream->synchronize();  // `bytes` goes away
    return t;
  }
  Tensor ids(Shape shape, const Ids& v) const {
    Tensor t = Tensor::empty(*device, shape, ScalarType::i32, MemCategory::activations);
    REQUIRE(size_t(t.numel()) == v.size());
    zero::copy_from_host(*device, *stream, t, v.data());
    stream->synchronize();
    return t;
  }
  // Filled with 0xff bytes (NaN in every float type), so an output an op fails to write shows.
  Tensor garbage(Shape shape, ScalarType type) const {
    Tensor t = Tensor::empty(*device, shape, type, MemCategory::activations);
    device->fill_async(t.data(), 0xff, t.bytes(), *stream);
    return t;
  }
  // The elements, widened exactly, after check_errors() has waited for the stream.
  Vec read(const Tensor& t) const {
    ops->check_errors();
    std::vector<unsigned char> bytes(t.bytes());
    zero::copy_to_host(*device, *stream, bytes.data(), t);
    stream->synchronize();
    Vec v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.type() == f32) {
        std::memcpy(&v[i], &bytes[4 * i], 4);
      } else {
        uint16_t b;
        std::memcpy(&b, &bytes[2 * i], 2);
        v[i] = t.type() == bf16 ? zero::to_float(zero::bfloat16::from_bits(b))
                                : zero::to_float(zero::half::from_bits(b));
      }
    }
    return v;
  }

  std::unique_ptr<zero::Device> device;
  std::unique_ptr<zero::Stream> stream;
  std::unique_ptr<zero::models::Ops> ops;
};

// Uniform values in [lo, hi), rounded to `t`, from a fixed seed.
Vec random_values(int64_t n, uint64_t seed, float lo, float hi, ScalarType t) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (float& x : v) x = round_to(dist(gen), t);
  return v;
}

Ids random_ids(int64_t n, uint64_t seed, int64_t hi) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(hi - 1));
  Ids v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(gen);
  return v;
}

struct Output {
  Vec v;
  ScalarType type;  // as stored by the backend that produced it
  int64_t row;      // elements per tolerance row
  bool exact;       // the cuda result must be the cpu result rounded to the cuda type
  double factor;    // times the type's tolerance (see attention_body)
};
using Outputs = std::map<std::string, Output>;

// One run of a test body on one backend. `act` / `grad` are this backend's storage types; the
// values are those of the cuda run's types (`act_values`, `grad_values`) on both backends.
struct Run {
  const Backend& be;
  ScalarType act, grad, act_values, grad_values;
  std::vector<std::pair<std::string, std::pair<Tensor, Output>>> kept;

  zero::models::Ops& ops() const { return *be.ops; }
  bool cuda() const { return be.device->kind() == DeviceKind::cuda; }

  // An activation or parameter, values in [lo, hi).
  Tensor input(Shape s, uint64_t seed, float lo = -1, float hi = 1) const {
    return be.upload(s, act, random_values(s.numel(), seed, lo, hi, act_values));
  }
  // A gradient with nonzero initial values, so "+=" is visible.
  Tensor grad_init(Shape s, uint64_t seed) const {
    return be.upload(s, grad, random_values(s.numel(), seed, -0.5f, 0.5f, grad_values));
  }
  Tensor output(Shape s) const { return be.garbage(s, act); }
  Tensor stats(Shape s) const { return be.garbage(s, f32); }
  Tensor ids(Shape s, const Ids& v) const { return be.ids(s, v); }

  // Compared after the body ran; `row` elements per tolerance row (-1: the last dimension,
  // 0: the whole tensor).
  void keep(const std::string& name, const Tensor& t, int64_t row = -1, bool exact = false,
            double factor = 1.0) {
    const int64_t r = row < 0 ? t.shape().back() : (row == 0 ? t.numel() : row);
    kept.push_back({name, {t, Output{{}, t.type(), std::max<int64_t>(r, 1), exact, factor}}});
  }
  Outputs read() {
    Outputs out;
    for (auto& [name, p] : kept) {
      p.second.v = be.read(p.first);
      out[name] = p.second;
    }
    return out;
  }
};

using Body = std::function<void(Run&)>;

// Per row: |got - want| <= tol * max |want| over the row. NaN never passes.
void expect_close(const std::string& name, const Output& got, const Output& want) {
  REQUIRE(got.v.size() == want.v.size());
  const double tol = tolerance(got.type) * (got.type == f32 ? 1.0 : got.factor);
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t r0 = 0; r0 < want.v.size(); r0 += size_t(got.row)) {
    const size_t r1 = std::min(want.v.size(), r0 + size_t(got.row));
    double mag = 0;
    for (size_t i = r0; i < r1; ++i) mag = std::max(mag, double(std::fabs(want.v[i])));
    for (size_t i = r0; i < r1; ++i) {
      const double err = std::fabs(double(got.v[i]) - double(want.v[i]));
      const double allowed = tol * mag;
      if (!(err <= allowed)) ++bad;
      const double ratio = allowed > 0 ? err / allowed : (err > 0 || std::isnan(err) ? 1e30 : 0);
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
  }
  INFO(name << " (" << zero::to_string(got.type) << ", " << got.v.size() << " elements, rows of "
            << got.row << ", tolerance " << tol << " of the row's magnitude): " << bad
            << " elements outside; worst at " << worst << ": cuda " << got.v[worst] << ", cpu "
            << want.v[worst] << " (" << worst_ratio << " of the allowance)");
  CHECK(bad == 0);
}

void expect_rounded_equal(const std::string& name, const Output& got, const Output& want) {
  REQUIRE(got.v.size() == want.v.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.v.size(); ++i) {
    const float w = round_to(want.v[i], got.type);
    if (std::bit_cast<uint32_t>(got.v[i]) != std::bit_cast<uint32_t>(w) && bad++ == 0) first = i;
  }
  INFO(name << ": " << bad << " elements differ from the cpu result rounded to "
            << zero::to_string(got.type) << "; first at " << first << ": cuda " << got.v[first]
            << ", cpu " << want.v[first]);
  CHECK(bad == 0);
}

void compare(const Outputs& got, const Outputs& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, g] : got) {
    REQUIRE(want.count(name) == 1);
    if (g.exact) {
      expect_rounded_equal(name, g, want.at(name));
    } else {
      expect_close(name, g, want.at(name));
    }
  }
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs `body` on cuda with activations A and gradients G, and on cpu in fp32 from the same
// values, and compares every kept output.
void against_cpu(ScalarType A, ScalarType G, const Body& body) {
  INFO("activations " << zero::to_string(A) << ", gradients " << zero::to_string(G));
  const Backend gpu(DeviceKind::cuda), cpu(DeviceKind::cpu);
  Run g{gpu, A, G, A, G, {}};
  body(g);
  Run c{cpu, f32, f32, A, G, {}};
  body(c);
  compare(g.read(), c.read());
}

// Every (A, G) pair: A in {fp32, bf16, fp16}, G in {fp32, A}.
void against_cpu_all(const Body& body) {
  for (ScalarType A : {f32, bf16, f16}) {
    against_cpu(A, f32, body);
    if (A != f32) against_cpu(A, A, body);
  }
}

// The shapes of most cases: odd sizes, so no dimension is a multiple of a block or a warp.
struct Dims {
  int64_t B = 3, T = 13, Tmax = 16, C = 72, NH = 3, V = 61, OC = 200;
  int64_t N() const { return B * T; }
};

// Token ids with a heavy repeat (id 7 at 20 of the 39 positions, more than one batch of the
// kernel's run loop) and one id that only occurs once.
Ids tokens_with_repeats(const Dims& d) {
  Ids t = random_ids(d.N(), 11, d.V);
  for (int64_t i = 0; i < d.N(); i += 2) t[size_t(i)] = 7;
  t[5] = int32_t(d.V - 1);
  return t;
}

// ---- the ops, as test bodies ------------------------------------------------------------------

void embedding_body(Run& r, const Dims& d, const Ids& tokens) {
  const Tensor wte = r.input({d.V, d.C}, 1), wpe = r.input({d.Tmax, d.C}, 2);
  const Tensor out = r.output({d.B, d.T, d.C});
  r.ops().embedding_forward(out, r.ids({d.B, d.T}, tokens), wte, wpe);
  r.keep("embedding.out", out, -1, /*exact=*/true);
  const Tensor dwte = r.grad_init({d.V, d.C}, 3), dwpe = r.grad_init({d.Tmax, d.C}, 4);
  r.ops().embedding_backward(dwte, dwpe, r.input({d.B, d.T, d.C}, 5), r.ids({d.B, d.T}, tokens));
  r.keep("embedding.dwte", dwte);
  r.keep("embedding.dwpe", dwpe);
}

void layernorm_body(Run& r, const Dims& d, int64_t C) {
  const Tensor x = r.input({d.B, d.T, C}, 10, -1, 2), w = r.input({C}, 11), b = r.input({C}, 12);
  const Tensor y = r.output({d.B, d.T, C}), mean = r.stats({d.N()}), rstd = r.stats({d.N()});
  r.ops().layernorm_forward(y, mean, rstd, x, w, b);
  const Tensor dx = r.output({d.B, d.T, C});
  const Tensor dw = r.grad_init({C}, 13), db = r.grad_init({C}, 14);
  r.ops().layernorm_backward(dx, dw, db, r.input({d.B, d.T, C}, 15), x, w, mean, rstd);
  r.keep("layernorm.y", y);
  r.keep("layernorm.mean", mean, 0);
  r.keep("layernorm.rstd", rstd, 0);
  r.keep("layernorm.dx", dx);
  r.keep("layernorm.dw", dw, 0);
  r.keep("layernorm.db", db, 0);
}

void linear_body(Run& r, const Dims& d) {
  const Tensor x = r.input({d.B, d.T, d.C}, 20), w = r.input({d.C, d.OC}, 21),
               b = r.input({d.OC}, 22);
  const Tensor y = r.output({d.B, d.T, d.OC}), y_nobias = r.output({d.N(), d.OC});
  r.ops().linear_forward(y, x, w, b);
  r.ops().linear_forward(y_nobias, x.reshaped({d.N(), d.C}), w, Tensor());
  const Tensor dy = r.input({d.B, d.T, d.OC}, 23);
  const Tensor dx = r.output({d.B, d.T, d.C});
  const Tensor dw = r.grad_init({d.C, d.OC}, 24), db = r.grad_init({d.OC}, 25);
  r.ops().linear_backward(dx, dw, db, dy, x, w);
  // Without dx and db: only dw.
  const Tensor dw2 = r.grad_init({d.C, d.OC}, 26);
  r.ops().linear_backward(Tensor(), dw2, Tensor(), dy, x, w);
  r.keep("linear.y", y);
  r.keep("linear.y_nobias", y_nobias);
  r.keep("linear.dx", dx);
  r.keep("linear.dw", dw);
  r.keep("linear.db", db, 0);
  r.keep("linear.dw_only", dw2);
}

void linear_t_body(Run& r, const Dims& d) {
  const Tensor x = r.input({d.B, d.T, d.C}, 30), w = r.input({d.V, d.C}, 31);
  const Tensor y = r.output({d.B, d.T, d.V});
  r.ops().linear_t_forward(y, x, w);
  const Tensor dx = r.output({d.B, d.T, d.C}), dw = r.grad_init({d.V, d.C}, 32);
  r.ops().linear_t_backward(dx, dw, r.input({d.B, d.T, d.V}, 33), x, w);
  r.keep("linear_t.y", y);
  r.keep("linear_t.dx", dx);
  r.keep("linear_t.dw", dw);
}

void gelu_body(Run& r, const Dims& d) {
  const Tensor x = r.input({d.N(), d.C}, 40, -4, 4);
  const Tensor y = r.output({d.N(), d.C}), dx = r.output({d.N(), d.C});
  r.ops().gelu_forward(y, x);
  r.ops().gelu_backward(dx, r.input({d.N(), d.C}, 41), x);
  r.keep("gelu.y", y);
  r.keep("gelu.dx", dx);
}

void attention_body(Run& r, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const Tensor qkv = r.input({B, T, 3 * C}, 50, -2, 2);
  const Tensor out = r.output({B, T, C}), probs = r.output({B, NH, T, T});
  r.ops().attention_forward(out, probs, qkv, int(NH));
  const Tensor dqkv = r.output({B, T, 3 * C});
  r.ops().attention_backward(dqkv, r.input({B, T, C}, 51), qkv, probs, int(NH));
  r.keep("attention.out", out);
  r.keep("attention.probs", probs);
  // q, k and v parts apart (rows of C): their magnitudes differ. dq_i = scale sum_j dS_ij k_j
  // sums terms that cancel (sum_j dS_ij = 0), each with the 16-bit roundings of probs and dS,
  // so its error can reach twice the usual count of half-ulps relative to the result.
  r.keep("attention.dqkv", dqkv, C, false, 2.0);
}

void add_body(Run& r, const Dims& d) {
  const Tensor a = r.input({d.N(), d.C}, 60), b = r.input({d.B, d.T, d.C}, 61);
  const Tensor out = r.output({d.N(), d.C});
  r.ops().add(out, a, b);
  const Tensor acc = r.input({d.B, d.T, d.C}, 62);
  r.ops().accumulate(acc, r.input({d.N(), d.C}, 63));
  r.keep("add.out", out, -1, true);
  r.keep("accumulate.acc", acc, -1, true);
}

void cross_entropy_body(Run& r, int64_t N, int64_t V, const Ids& targets) {
  const Tensor logits = r.input({N, V}, 70, -4, 4);
  const Tensor loss = r.stats({1}), losses = r.stats({N});
  r.ops().cross_entropy_forward(loss, losses, logits, r.ids({N}, targets));
  const Tensor dlogits = r.output({N, V});
  r.ops().cross_entropy_backward(dlogits, logits, r.ids({N}, targets), 0.7f);
  r.keep("cross_entropy.loss", loss);
  r.keep("cross_entropy.losses", losses, 1);
  r.keep("cross_entropy.dlogits", dlogits);
}

// Every op once (the determinism case).
void all_ops_body(Run& r, const Dims& d) {
  embedding_body(r, d, tokens_with_repeats(d));
  layernorm_body(r, d, d.C);
  linear_body(r, d);
  linear_t_body(r, d);
  gelu_body(r, d);
  attention_body(r, d.B, d.T, d.C, d.NH);
  add_body(r, d);
  Ids targets = random_ids(d.N(), 12, d.V);
  targets[3] = -1;
  cross_entropy_body(r, d.N(), d.V, targets);
}

}  // namespace

// ---- op by op against the cpu backend ---------------------------------------------------------

TEST_CASE("cuda ops: embedding forward is the cpu sum rounded once and backward adds per token") {
  REQUIRE_GPU();
  const Dims d;
  const Ids tokens = tokens_with_repeats(d);
  against_cpu_all([&](Run& r) { embedding_body(r, d, tokens); });
}

TEST_CASE("cuda ops: embedding backward with more distinct tokens than the wte kernel has blocks") {
  REQUIRE_GPU();
  // C = 2304 is 9 blocks of channels, so the wte-gradient grid has 8192 / 9 = 910 blocks along
  // the runs of equal ids; 2048 tokens drawn from 4096 ids (every 16th one id 7) make about 1500
  // runs, so most blocks take two or more of them, in the order the run list happens to have.
  Dims d;
  d.B = 2;
  d.T = 1024;
  d.Tmax = 1024;
  d.C = 2304;
  d.V = 4096;
  Ids tokens = random_ids(d.N(), 17, d.V);
  for (int64_t i = 0; i < d.N(); i += 16) tokens[size_t(i)] = 7;
  against_cpu(f32, f32, [&](Run& r) { embedding_body(r, d, tokens); });
  against_cpu(bf16, bf16, [&](Run& r) { embedding_body(r, d, tokens); });
}

TEST_CASE("cuda ops: embedding backward leaves rows of absent tokens untouched") {
  REQUIRE_GPU();
  const Dims d;
  const Ids tokens = tokens_with_repeats(d);
  const Backend gpu(DeviceKind::cuda);
  for (ScalarType G : {f32, bf16}) {
    Run r{gpu, bf16, G, bf16, G, {}};
    const Vec init = random_values(d.V * d.C, 3, -0.5f, 0.5f, G);
    const Tensor dwte = gpu.upload({d.V, d.C}, G, init);
    const Tensor dwpe = r.grad_init({d.Tmax, d.C}, 4);
    r.ops().embedding_backward(dwte, dwpe, r.input({d.B, d.T, d.C}, 5), r.ids({d.B, d.T}, tokens));
    const Vec got = gpu.read(dwte);
    const Vec got_pe = gpu.read(dwpe);
    const Vec init_pe = random_values(d.Tmax * d.C, 4, -0.5f, 0.5f, G);
    for (int64_t v = 0; v < d.V; ++v) {
      if (std::find(tokens.begin(), tokens.end(), int32_t(v)) != tokens.end()) continue;
      INFO("row " << v << " of dwte (" << zero::to_string(G) << ")");
      CHECK(same_bits(Vec(got.begin() + v * d.C, got.begin() + (v + 1) * d.C),
                      Vec(init.begin() + v * d.C, init.begin() + (v + 1) * d.C)));
    }
    // Positions t >= T of dwpe are not part of the sequence.
    CHECK(same_bits(Vec(got_pe.begin() + d.T * d.C, got_pe.end()),
                    Vec(init_pe.begin() + d.T * d.C, init_pe.end())));
  }
}

TEST_CASE("cuda ops: layernorm forward and backward match the cpu") {
  REQUIRE_GPU();
  const Dims d;
  for (int64_t C : {int64_t(72), int64_t(1000)}) {
    INFO("C = " << C);
    against_cpu_all([&](Run& r) { layernorm_body(r, d, C); });
  }
}

TEST_CASE("cuda ops: linear forward (with and without bias) and backward match the cpu") {
  REQUIRE_GPU();
  const Dims d;
  against_cpu_all([&](Run& r) { linear_body(r, d); });
}

TEST_CASE("cuda ops: the tied LM head (linear_t) matches the cpu") {
  REQUIRE_GPU();
  const Dims d;
  against_cpu_all([&](Run& r) { linear_t_body(r, d); });
}

TEST_CASE("cuda ops: gelu forward and backward match the cpu") {
  REQUIRE_GPU();
  const Dims d;
  against_cpu_all([&](Run& r) { gelu_body(r, d); });
}

TEST_CASE("cuda ops: causal attention forward and backward match the cpu") {
  REQUIRE_GPU();
  const Dims d;
  for (ScalarType A : {f32, bf16, f16}) {
    against_cpu(A, A, [&](Run& r) { attention_body(r, d.B, d.T, d.C, d.NH); });
    // Above the diagonal probs are exactly 0 (the causal mask, not a tiny exp).
    const Backend gpu(DeviceKind::cuda);
    Run r{gpu, A, A, A, A, {}};
    attention_body(r, d.B, d.T, d.C, d.NH);
    const Vec probs = gpu.read(r.kept[1].second.first);
    size_t nonzero = 0;
    for (int64_t m = 0; m < d.B * d.NH; ++m)
      for (int64_t i = 0; i < d.T; ++i)
        for (int64_t j = i + 1; j < d.T; ++j)
          nonzero += std::bit_cast<uint32_t>(probs[size_t((m * d.T + i) * d.T + j)]) != 0;
    INFO(zero::to_string(A));
    CHECK(nonzero == 0);
  }
}

TEST_CASE("cuda ops: attention over more heads than one workspace chunk holds matches the cpu") {
  REQUIRE_GPU();
  // T = 1024 with 20 heads: the forward's fp32 scores take 4 MiB per head, so a 64 MiB chunk holds
  // 16 heads (groups of 16 and 4); backward takes 4 + sizeof(A) MiB per head (fp32: groups of
  // 8, 8, 4; bf16: 10 and 10). B = 2, so the offsets of the second batch row are used too.
  constexpr int64_t B = 2, T = 1024, NH = 20, C = NH * 8;
  REQUIRE(zero::models::kernels::kChunkBytes / (T * T * 4) == 16);
  for (ScalarType A : {f32, bf16})
    against_cpu(A, A, [&](Run& r) { attention_body(r, B, T, C, NH); });
}

TEST_CASE("cuda ops: add and accumulate are the cpu sums rounded once") {
  REQUIRE_GPU();
  const Dims d;
  against_cpu_all([&](Run& r) { add_body(r, d); });
}

TEST_CASE("cuda ops: cross-entropy forward and backward match the cpu with ignored rows") {
  REQUIRE_GPU();
  const Dims d;
  Ids targets = random_ids(d.N(), 12, d.V);
  targets[0] = targets[7] = targets[38] = -1;
  against_cpu_all([&](Run& r) { cross_entropy_body(r, d.N(), d.V, targets); });
  // GPT-2's vocabulary: rows far longer than a block.
  constexpr int64_t kGpt2Vocab = 50257;
  Ids few = random_ids(6, 13, kGpt2Vocab);
  few[2] = -1;
  for (ScalarType A : {f32, bf16})
    against_cpu(A, A, [&](Run& r) { cross_entropy_body(r, 6, kGpt2Vocab, few); });
}

TEST_CASE("cuda ops: cross-entropy with every row ignored gives 0 loss and 0 gradients") {
  REQUIRE_GPU();
  const Backend gpu(DeviceKind::cuda);
  Run r{gpu, bf16, bf16, bf16, bf16, {}};
  cross_entropy_body(r, 5, 17, Ids(5, -1));
  for (const auto& [name, out] : r.read()) {
    INFO(name);
    CHECK(std::all_of(out.v.begin(), out.v.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("cuda ops: zero clears every byte") {
  REQUIRE_GPU();
  const Backend gpu(DeviceKind::cuda);
  const Tensor t = gpu.upload({7, 9}, bf16, random_values(63, 1, -1, 1, bf16));
  gpu.ops->zero(t);
  const Vec v = gpu.read(t);
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::bit_cast<uint32_t>(x) == 0; }));
}

// ---- "+=" semantics ----------------------------------------------------------------------------

TEST_CASE("cuda ops: weight gradients accumulate across calls") {
  REQUIRE_GPU();
  // Two backward calls into the same gradients: each adds its contribution to what is there
  // (16-bit gradients: rounded once per call, which the tolerance of the stored type covers).
  const Dims d;
  const Ids tokens = tokens_with_repeats(d);
  against_cpu_all([&](Run& r) {
    const Tensor x = r.input({d.N(), d.C}, 80), w = r.input({d.C, d.OC}, 81);
    const Tensor dw = r.grad_init({d.C, d.OC}, 82), db = r.grad_init({d.OC}, 83);
    for (uint64_t seed : {84u, 85u})
      r.ops().linear_backward(Tensor(), dw, db, r.input({d.N(), d.OC}, seed), x, w);
    const Tensor dwte = r.grad_init({d.V, d.C}, 86), dwpe = r.grad_init({d.Tmax, d.C}, 87);
    for (uint64_t seed : {88u, 89u})
      r.ops().embedding_backward(dwte, dwpe, r.input({d.B, d.T, d.C}, seed),
                                 r.ids({d.B, d.T}, tokens));
    r.keep("twice.linear.dw", dw);
    r.keep("twice.linear.db", db, 0);
    r.keep("twice.embedding.dwte", dwte);
    r.keep("twice.embedding.dwpe", dwpe);
  });
}

TEST_CASE("cuda ops: a 16-bit weight gradient larger than the workspace chunk is done in chunks") {
  REQUIRE_GPU();
  // dw of the LM head [V, C] as fp32 would take V * C * 4 bytes = 78 MiB > 64 MiB: two chunks of
  // columns (16384 and 3616 rows of dw), each a GEMM into fp32 and one rounding add.
  constexpr int64_t N = 8, C = 1024, V = 20000;
  REQUIRE(size_t(V * C * 4) > zero::models::kernels::kChunkBytes);
  against_cpu(bf16, bf16, [&](Run& r) {
    const Tensor x = r.input({N, C}, 90), w = r.input({V, C}, 91);
    const Tensor dx = r.output({N, C}), dw = r.grad_init({V, C}, 92);
    r.ops().linear_t_backward(dx, dw, r.input({N, V}, 93), x, w);
    r.keep("chunked.linear_t.dx", dx);
    r.keep("chunked.linear_t.dw", dw);
  });
}

// ---- determinism --------------------------------------------------------------------------------

TEST_CASE("cuda ops: every op gives the same bits on every run") {
  REQUIRE_GPU();
  // Sizes with several row chunks in the column sums (320 rows > 64 per chunk) and long runs of
  // one token in the embedding gradient.
  Dims d;
  d.B = 4;
  d.T = 80;
  d.Tmax = 80;
  for (ScalarType A : {f32, bf16}) {
    for (ScalarType G : {f32, A}) {
      INFO(zero::to_string(A) << " activations, " << zero::to_string(G) << " gradients");
      const Backend gpu(DeviceKind::cuda);
      Run first{gpu, A, G, A, G, {}};
      all_ops_body(first, d);
      const Outputs a = first.read();
      Run second{gpu, A, G, A, G, {}};  // same Ops object, workspaces reused
      all_ops_body(second, d);
      const Outputs b = second.read();
      const Backend gpu2(DeviceKind::cuda);
      Run third{gpu2, A, G, A, G, {}};  // a fresh Ops object
      all_ops_body(third, d);
      const Outputs c = third.read();
      for (const auto& [name, out] : a) {
        INFO(name);
        CHECK(same_bits(out.v, b.at(name).v));
        CHECK(same_bits(out.v, c.at(name).v));
      }
    }
  }
}

// ---- bad ids
// -------------------------------------------------------------------------------------

TEST_CASE("cuda ops: an out-of-range token id is clamped and reported by check_errors") {
  REQUIRE_GPU();
  const Backend gpu(DeviceKind::cuda);
  constexpr int64_t B = 3, T = 5, C = 8, V = 64;
  Ids tokens(B * T, 1);
  tokens[1 * T + 2] = 70;  // [b=1, t=2]: the lowest bad position
  tokens[2 * T + 0] = 64;
  tokens[2 * T + 4] = -3;
  const Vec wte_v = random_values(V * C, 1, -1, 1, f32),
            wpe_v = random_values(T * C, 2, -1, 1, f32);
  const Tensor wte = gpu.upload({V, C}, f32, wte_v), wpe = gpu.upload({T, C}, f32, wpe_v);
  const Tensor out = gpu.garbage({B, T, C}, f32);
  REQUIRE_NOTHROW(gpu.ops->embedding_forward(out, gpu.ids({B, T}, tokens), wte, wpe));
  REQUIRE_THROWS_MATCHES(
      gpu.ops->check_errors(), zero::Error,
      MessageMatches(ContainsSubstring(
          "embedding_forward: token id 70 at [b=1, t=2] is outside the vocabulary [0, 64)")));
  // Reported once: the record is cleared.
  REQUIRE_NOTHROW(gpu.ops->check_errors());
  // Clamped: 70 and 64 read row V - 1, -3 reads row 0.
  const Vec got = gpu.read(out);
  const auto expect_row = [&](int64_t pos, int64_t id) {
    INFO("position " << pos << " reads row " << id);
    for (int64_t c = 0; c < C; ++c)
      CHECK(got[size_t(pos * C + c)] ==
            wte_v[size_t(id * C + c)] + wpe_v[size_t((pos % T) * C + c)]);
  };
  expect_row(1 * T + 2, V - 1);
  expect_row(2 * T + 0, V - 1);
  expect_row(2 * T + 4, 0);
  expect_row(0, 1);

  // Backward reports too, and stays in bounds.
  const Tensor dwte = gpu.upload({V, C}, f32, Vec(V * C, 0.0f));
  const Tensor dwpe = gpu.upload({T, C}, f32, Vec(T * C, 0.0f));
  gpu.ops->embedding_backward(dwte, dwpe, gpu.upload({B, T, C}, f32, Vec(B * T * C, 1.0f)),
                              gpu.ids({B, T}, tokens));
  REQUIRE_THROWS_MATCHES(
      gpu.ops->check_errors(), zero::Error,
      MessageMatches(ContainsSubstring(
          "embedding_backward: token id 70 at [b=1, t=2] is outside the vocabulary [0, 64)")));
  const Vec g = gpu.read(dwte);
  CHECK(std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); }));
}

TEST_CASE("cuda ops: an out-of-range target is reported by check_errors") {
  REQUIRE_GPU();
  const Backend gpu(DeviceKind::cuda);
  constexpr int64_t N = 9, V = 11;
  Ids targets = random_ids(N, 5, V);
  targets[1] = -1;  // ignored: fine
  targets[4] = int32_t(V);
  targets[6] = -2;
  const Tensor logits = gpu.upload({N, V}, bf16, random_values(N * V, 6, -2, 2, bf16));
  gpu.ops->cross_entropy_forward(gpu.garbage({1}, f32), gpu.garbage({N}, f32), logits,
                                 gpu.ids({N}, targets));
  REQUIRE_THROWS_MATCHES(
      gpu.ops->check_errors(), zero::Error,
      MessageMatches(ContainsSubstring("cross_entropy_forward: target 11 at row 4 is outside the "
                                       "vocabulary [0, 11)")));
  targets[4] = 0;
  const Tensor dlogits = gpu.garbage({N, V}, bf16);
  gpu.ops->cross_entropy_backward(dlogits, logits, gpu.ids({N}, targets), 1.0f);
  REQUIRE_THROWS_MATCHES(
      gpu.ops->check_errors(), zero::Error,
      MessageMatches(ContainsSubstring("cross_entropy_backward: target -2 at row 6 is outside the "
                                       "vocabulary [0, 11)")));
  const Vec d = gpu.read(dlogits);
  CHECK(std::all_of(d.begin(), d.end(), [](float v) { return std::isfinite(v); }));
}

TEST_CASE("cuda ops: check_errors reports the first failing call of the step") {
  REQUIRE_GPU();
  const Backend gpu(DeviceKind::cuda);
  constexpr int64_t B = 2, T = 4, C = 8, V = 16;
  Ids tokens(B * T, 3);
  tokens[6] = 99;  // [b=1, t=2]
  Ids targets(B * T, 2);
  targets[0] = 40;  // an earlier row, but a later call
  gpu.ops->embedding_forward(gpu.garbage({B, T, C}, f32), gpu.ids({B, T}, tokens),
                             gpu.upload({V, C}, f32, Vec(V * C, 1.0f)),
                             gpu.upload({T, C}, f32, Vec(T * C, 1.0f)));
  gpu.ops->cross_entropy_forward(gpu.garbage({1}, f32), gpu.garbage({B * T}, f32),
                                 gpu.upload({B * T, V}, f32, Vec(B * T * V, 0.5f)),
                                 gpu.ids({B * T}, targets));
  REQUIRE_THROWS_MATCHES(
      gpu.ops->check_errors(), zero::Error,
      MessageMatches(ContainsSubstring("embedding_forward: token id 99 at [b=1, t=2]")));
  REQUIRE_NOTHROW(gpu.ops->check_errors());
}

// ---- type rules
// ------------------------------------------------------------------------------------

TEST_CASE("cuda ops: parameters must have the activation type and gradients fp32 or that type") {
  REQUIRE_GPU();
  const Backend gpu(DeviceKind::cuda);
  const Tensor x = gpu.garbage({4, 8}, bf16), y = gpu.garbage({4, 6}, bf16);
  REQUIRE_THROWS_MATCHES(gpu.ops->linear_forward(y, x, gpu.garbage({8, 6}, f32), Tensor()),
                         zero::Error,
                         MessageMatches(ContainsSubstring("linear_forward: w is fp32[8, 6]")));
  REQUIRE_THROWS_MATCHES(
      gpu.ops->linear_backward(Tensor(), gpu.garbage({8, 6}, f16), Tensor(), y, x,
                               gpu.garbage({8, 6}, bf16)),
      zero::Error,
      MessageMatches(ContainsSubstring("linear_backward: dw is fp16[8, 6], expected fp32 or the "
                                       "activation type bf16")));
  REQUIRE_THROWS_MATCHES(gpu.ops->layernorm_forward(gpu.garbage({4, 8}, f32), gpu.garbage({4}, f32),
                                                    gpu.garbage({4}, f32), gpu.garbage({4, 8}, f32),
                                                    gpu.garbage({8}, bf16), gpu.garbage({8}, f32)),
                         zero::Error,
                         MessageMatches(ContainsSubstring("layernorm_forward: w is bf16[8]")));
  // Nothing was enqueued by the rejected calls, and nothing is pending.
  REQUIRE_NOTHROW(gpu.ops->check_errors());
}
