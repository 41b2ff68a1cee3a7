// The GPT decoder as Units: its parameter table (Hugging Face names and shapes), gradients of the
// whole model against central finite differences in double precision, fp32 against fp64, and
// activation checkpointing (same gradients, less activation memory in the ledger).
#include "models/gpt.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "tests/models/model_runner.hpp"

using namespace zero;
using namespace zero::models;
using zero::test::ModelRunner;

namespace {

struct Fixture {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<Ops> ops = make_ops(*device, *stream);
};

// Token ids and next-token targets for a [B, T] batch; a few targets ignored (-1).
void random_tokens(int B, int T, int V, uint32_t seed, std::vector<int32_t>& tokens,
                   std::vector<int32_t>& targets) {
  std::mt19937 rng(seed);
  tokens.resize(static_cast<size_t>(B * T));
  targets.resize(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  for (size_t i = 0; i < targets.size(); ++i)
    targets[i] = (i % 4 == 3) ? -1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
}

// Larger-than-GPT-2 random parameters, so every path carries gradients well above the finite
// difference noise (GPT-2's 0.02 init would leave the deep paths' gradients near 1e-6).
void randomise(ModelRunner& r, const Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 0.3);
  for (size_t i = 0; i < m.params.size(); ++i) {
    std::vector<double> v(static_cast<size_t>(m.params[i].numel()));
    const bool ln_weight = m.params[i].init == ParamInit::ones;
    for (double& x : v) x = (ln_weight ? 1.0 : 0.0) + n(rng);
    r.set_param(i, v);
  }
}

}  // namespace

TEST_CASE("gpt: parameter table uses Hugging Face GPT-2 names, shapes and counts") {
  Fixture f;
  Model m = make_gpt({*gpt_preset("tiny"), ScalarType::f32, ScalarType::f32}, *f.ops);
  const GptShape s = *gpt_preset("tiny");
  REQUIRE(m.units.size() == static_cast<size_t>(s.n_layer) + 2);
  REQUIRE(m.params.size() == static_cast<size_t>(12 * s.n_layer + 4));
  CHECK(m.params[0].name == "wte.weight");
  CHECK(m.params[0].shape == Shape{64, 128});
  CHECK(m.params[1].name == "wpe.weight");
  CHECK(m.params[4].name == "h.0.attn.c_attn.weight");
  CHECK(m.params[4].shape == Shape{128, 384});  // Conv1D: [in, out]
  CHECK(m.params[4].weight_decay);
  CHECK_FALSE(m.params[5].weight_decay);  // h.0.attn.c_attn.bias
  CHECK(m.params[12].name == "h.0.mlp.c_proj.weight");
  CHECK(m.params[12].shape == Shape{512, 128});
  CHECK(m.params.back().name == "ln_f.bias");
  CHECK(m.parameter_count() == gpt_parameter_count(s));
  // GPT-2 small with its tied head: 124,439,808 parameters, as Hugging Face reports.
  CHECK(gpt_parameter_count(*gpt_preset("gpt2-124m")) == 124439808);
  CHECK(gpt_parameter_count(*gpt_preset("gpt2-1.5b")) == 1557611200);

  // The LM head is tied: the head Unit uses wte, and wte's gradient is complete only after the
  // embedding Unit (the first) has run its backward.
  const auto head_ids = m.units.back()->param_ids();
  CHECK(std::find(head_ids.begin(), head_ids.end(), 0) != head_ids.end());
  const std::vector<int> last = m.last_gradient_unit();
  CHECK(last[0] == 0);
  CHECK(last.back() == static_cast<int>(m.units.size()) - 1);
  CHECK(last[4] == 1);
}

TEST_CASE("gpt: bad shapes and types are refused with the reason") {
  Fixture f;
  GptShape s{2, 30, 4, 16, 8};
  REQUIRE_THROWS_WITH(make_gpt({s, ScalarType::f32, ScalarType::f32}, *f.ops),
                      Catch::Matchers::ContainsSubstring("not divisible by n_head"));
  s = {2, 32, 4, 16, 8};
  REQUIRE_THROWS_WITH(make_gpt({s, ScalarType::bf16, ScalarType::i32}, *f.ops),
                      Catch::Matchers::ContainsSubstring("activations must be fp32, bf16 or fp16"));
  GptOptions probs{s, ScalarType::bf16, ScalarType::bf16};
  probs.attention_probabilities = true;
  REQUIRE_THROWS_WITH(make_gpt(probs, *f.ops),
                      Catch::Matchers::ContainsSubstring("attention_probabilities needs fp32 or fp64"));
  REQUIRE_THROWS_WITH(make_gpt({s, ScalarType::f32, ScalarType::f64}, *f.ops),
                      Catch::Matchers::ContainsSubstring("fp64 parameters go with fp64"));
}

TEST_CASE("gpt: whole-model gradients match central finite differences in fp64") {
  Fixture f;
  const GptShape s{2, 8, 2, 11, 8};
  Model m = make_gpt({s, ScalarType::f64, ScalarType::f64}, *f.ops);
  ModelRunner r(m, *f.ops, 7);
  randomise(r, m, 11);
  const int B = 2, T = 5;  // T below seq_len: rows of wpe past T must get no gradient
  std::vector<int32_t> tokens, targets;
  random_tokens(B, T, s.vocab_size, 3, tokens, targets);
  const Batch batch = r.make_batch(Shape{B, T}, tokens, Shape{B, T}, targets);

  r.forward_backward(batch);
  // Central differences with h = 1e-5: truncation error h^2/6 |f'''| ~ 1e-10 for these O(1)
  // derivatives, rounding error ~ 1e-15 * |loss| / h ~ 1e-10 (the loss is ~3). 1e-8 absolute
  // plus 1e-6 relative is a hundred times that and still catches any wrong term (the smallest
  // gradients checked are ~1e-4).
  const double h = 1e-5;
  std::mt19937 rng(5);
  int checked = 0;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const std::vector<double> grad = r.grad(i);
    std::vector<size_t> elems;
    for (int k = 0; k < 4; ++k) elems.push_back(rng() % grad.size());
    if (i == 0) elems.push_back(static_cast<size_t>(tokens[0]) * s.n_embd + 3);  // a used wte row
    if (i == 1) elems.push_back(static_cast<size_t>(T + 1) * s.n_embd);          // an unused position
    for (size_t e : elems) {
      const double fd = r.finite_difference(i, e, h, batch);
      INFO(m.params[i].name << "[" << e << "]: analytic " << grad[e] << ", finite difference " << fd);
      CHECK(std::abs(fd - grad[e]) <= 1e-8 + 1e-6 * std::abs(fd));
      ++checked;
    }
  }
  CHECK(checked >= 4 * static_cast<int>(m.params.size()));
  // The unused position's gradient is exactly zero.
  CHECK(r.grad(1)[static_cast<size_t>(T + 1) * s.n_embd] == 0.0);
}

TEST_CASE("gpt: fp32 compute agrees with fp64, bf16 parameters with their fp32 values") {
  Fixture f;
  const GptShape s{2, 32, 4, 19, 16};
  const int B = 2, T = 16;
  std::vector<int32_t> tokens, targets;
  random_tokens(B, T, s.vocab_size, 9, tokens, targets);

  auto run = [&](ScalarType param, ScalarType act, std::vector<std::vector<double>>& grads) {
    Model m = make_gpt({s, param, act}, *f.ops);
    ModelRunner r(m, *f.ops, 21, act == ScalarType::f64 ? ScalarType::f64 : ScalarType::f32);
    const Batch batch = r.make_batch(Shape{B, T}, tokens, Shape{B, T}, targets);
    const double loss = r.forward_backward(batch);
    for (size_t i = 0; i < m.params.size(); ++i) grads.push_back(r.grad(i));
    return loss;
  };
  std::vector<std::vector<double>> g64, g32, gbf;
  const double l64 = run(ScalarType::f64, ScalarType::f64, g64);
  const double l32 = run(ScalarType::f32, ScalarType::f32, g32);
  const double lbf = run(ScalarType::bf16, ScalarType::f32, gbf);
  // fp32: each value carries ~1e-7 relative error, amplified by a few dozen ops in sequence;
  // 1e-5 of the loss and 1e-4 of each tensor's largest gradient leave a wide margin.
  CHECK(std::abs(l32 - l64) <= 1e-5 * std::abs(l64));
  for (size_t i = 0; i < g64.size(); ++i) {
    double scale = 0, err = 0;
    for (size_t e = 0; e < g64[i].size(); ++e) {
      scale = std::max(scale, std::abs(g64[i][e]));
      err = std::max(err, std::abs(g32[i][e] - g64[i][e]));
    }
    INFO("parameter " << i << ": max |g32 - g64| " << err << " of max |g| " << scale);
    CHECK(err <= 1e-4 * scale + 1e-12);
  }
  // bf16 parameters are the fp32 initial values rounded to 8 significant bits (relative 2^-8): a
  // different model, and its linear layers multiply in bf16 (activations rounded to 2^-8, fp32
  // sums: docs/models.md), but each only moves the loss by parts in a few hundred of its
  // logits' size, so the loss moves by well under 1%.
  CHECK(std::abs(lbf - l32) <= 1e-2 * std::abs(l32));
}

TEST_CASE("gpt: bf16 and fp16 activations agree with fp32 activations on the same parameters") {
  // The cpu backend's 16-bit activations (docs/cpu-kernels.md, "16-bit activations"): the same
  // 16-bit parameters run with fp32 and with 16-bit activations, fp32 gradients. T = 80 crosses
  // the attention's 64-row query blocks.
  Fixture f;
  const GptShape s{2, 64, 4, 37, 80};
  const int B = 2, T = 80;
  std::vector<int32_t> tokens, targets;
  random_tokens(B, T, s.vocab_size, 19, tokens, targets);
  auto run = [&](ScalarType param, ScalarType act, std::vector<std::vector<double>>& grads) {
    Model m = make_gpt({s, param, act}, *f.ops);
    ModelRunner r(m, *f.ops, 23, ScalarType::f32);
    const Batch batch = r.make_batch(Shape{B, T}, tokens, Shape{B, T}, targets);
    const double loss = r.forward_backward(batch);
    for (size_t i = 0; i < m.params.size(); ++i) grads.push_back(r.grad(i));
    return loss;
  };
  for (const ScalarType t : {ScalarType::bf16, ScalarType::f16}) {
    INFO("parameters and activations " << to_string(t));
    // Each stored activation is rounded once to t (relative u = 2^-8 for bf16, 2^-11 for fp16)
    // and the products' P and dS once more; through ~10 ops per layer, 2 layers and the head,
    // errors of a few u per tensor add up, partly cancelling. Measured: the loss within 2.2e-5
    // (bf16) and 2.0e-6 (fp16) relative, under u/100; every gradient within 2.2u (bf16: 0.0084)
    // and 2.5u (fp16: 0.0012) of its tensor's largest entry. Bounds: the loss within u, each
    // gradient within 8u.
    const double u = t == ScalarType::bf16 ? 0x1p-8 : 0x1p-11;
    std::vector<std::vector<double>> g32, g16;
    const double l32 = run(t, ScalarType::f32, g32);
    const double l16 = run(t, t, g16);
    INFO("loss fp32 activations " << l32 << ", 16-bit " << l16);
    CHECK(std::abs(l16 - l32) <= u * std::abs(l32));
    for (size_t i = 0; i < g32.size(); ++i) {
      double scale = 0, err = 0;
      for (size_t e = 0; e < g32[i].size(); ++e) {
        scale = std::max(scale, std::abs(g32[i][e]));
        err = std::max(err, std::abs(g16[i][e] - g32[i][e]));
      }
      INFO("parameter " << i << ": max |g16 - g32| " << err << " of max |g| " << scale);
      CHECK(err <= 8 * u * scale);
    }
  }
}

TEST_CASE("gpt: activation checkpointing gives identical gradients and less activation memory") {
  Fixture f;
  const GptShape s{4, 64, 4, 64, 32};
  const int B = 4, T = 32;
  std::vector<int32_t> tokens, targets;
  random_tokens(B, T, s.vocab_size, 17, tokens, targets);

  auto run = [&](bool checkpoint, std::vector<std::vector<double>>& grads, size_t& peak) {
    Model m = make_gpt({s, ScalarType::f32, ScalarType::f32}, *f.ops);
    ModelRunner r(m, *f.ops, 3);
    const Batch batch = r.make_batch(Shape{B, T}, tokens, Shape{B, T}, targets);
    const std::vector<bool> plan = checkpoint_plan(m, checkpoint ? std::optional<long long>(100) : std::nullopt);
    CHECK(std::count(plan.begin(), plan.end(), true) == (checkpoint ? s.n_layer : 0));
    f.device->ledger().reset_peaks();
    const double loss = r.forward_backward(batch, plan);
    peak = f.device->ledger().snapshot().at(MemSpace::device, MemCategory::activations).peak;
    for (size_t i = 0; i < m.params.size(); ++i) grads.push_back(r.grad(i));
    return loss;
  };
  std::vector<std::vector<double>> plain, ckpt;
  size_t peak_plain = 0, peak_ckpt = 0;
  const double l_plain = run(false, plain, peak_plain);
  const double l_ckpt = run(true, ckpt, peak_ckpt);
  CHECK(l_plain == l_ckpt);
  REQUIRE(plain.size() == ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == ckpt[i]);  // bitwise: same ops, same order
  INFO("activation peak without checkpointing " << format_bytes(peak_plain) << ", with "
                                                 << format_bytes(peak_ckpt));
  // Without checkpointing all four blocks' intermediates (15 C + n_head floats per token each:
  // the cpu backend keeps attention's logsumexp, not its n_head T probabilities) are live at the
  // end of forward; with it, one block's at a time plus the gradients in flight: measured
  // 2.58 MiB -> 1.25 MiB (2.82 -> 1.32 with the probabilities). Require at least a 40% drop.
  CHECK(peak_ckpt * 5 < peak_plain * 3);
}

TEST_CASE("gpt: blocked attention keeps each row's logsumexp instead of the probabilities") {
  // What one forward leaves stored (the ledger's activations after it, less before) with the
  // cpu backend's blocked attention and with GptOptions::attention_probabilities: per layer the
  // [B, H, T, T] probabilities replace the [B, H, T] logsumexp, nothing else changes, so the
  // difference is exactly L (B H T^2 - B H T) fp32 values. T = 80 crosses the kernel's blocks.
  Fixture f;
  REQUIRE(f.ops->blocked_attention());
  const GptShape s{3, 32, 4, 64, 80};
  const int B = 2, T = 80;
  std::vector<int32_t> tokens, targets;
  random_tokens(B, T, s.vocab_size, 23, tokens, targets);
  const auto stored = [&](bool probabilities, std::vector<std::vector<double>>& grads) {
    GptOptions o{s, ScalarType::f32, ScalarType::f32};
    o.attention_probabilities = probabilities;
    Model m = make_gpt(o, *f.ops);
    ModelRunner r(m, *f.ops, 5);
    const Batch batch = r.make_batch(Shape{B, T}, tokens, Shape{B, T}, targets);
    const auto current = [&] {
      return f.device->ledger().snapshot().at(MemSpace::device, MemCategory::activations).current;
    };
    const size_t before = current();
    const double loss = r.forward(batch);
    const size_t after = current();
    r.backward();
    for (size_t i = 0; i < m.params.size(); ++i) grads.push_back(r.grad(i));
    return std::pair{static_cast<int64_t>(after - before), loss};
  };
  std::vector<std::vector<double>> g_blocked, g_probs;
  const auto [blocked, loss_blocked] = stored(false, g_blocked);
  const auto [probs, loss_probs] = stored(true, g_probs);
  const int64_t H = s.n_head, L = s.n_layer;
  CHECK(probs - blocked == L * (B * H * T * T - B * H * T) * 4);
  // Same model, two roundings of attention (fp32, T <= 80): the loss agrees to a few ulp of its
  // O(1) size, the gradients to the fp32-vs-fp64 bound of the kernels (4e-6 of each tensor's
  // largest entry; observed ~1e-7).
  CHECK(std::abs(loss_blocked - loss_probs) <= 1e-6 * std::abs(loss_probs));
  REQUIRE(g_blocked.size() == g_probs.size());
  for (size_t i = 0; i < g_probs.size(); ++i) {
    double diff = 0, scale = 0;
    for (size_t j = 0; j < g_probs[i].size(); ++j) {
      diff = std::max(diff, std::abs(g_probs[i][j] - g_blocked[i][j]));
      scale = std::max(scale, std::abs(g_probs[i][j]));
    }
    INFO("parameter " << i);
    CHECK(diff <= 4e-6 * scale);
  }
}

TEST_CASE("gpt: FLOPs per token follow 6N + 12 L T C") {
  const GptShape s = *gpt_preset("gpt2-124m");
  const double n = 12.0 * 12 * 768 * 768 + 50257.0 * 768;
  CHECK(gpt_flops_per_token(s) == 6 * n + 12.0 * 12 * 1024 * 768);
}
