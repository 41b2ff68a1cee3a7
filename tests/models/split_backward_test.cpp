// The split backward of the models' Units (models/split_backward.hpp) on the cpu backend: for
// every Unit of a GPT and of the MLP, backward_input then backward_weight gives bitwise the
// gradients and grad_inputs of backward, with and without checkpointing, fp32 and bf16
// parameters, over several micro-batches accumulating into the same gradients, with the weight
// parts right after their input parts or all deferred; what W keeps alive is what docs/models.md
// says; a Unit that does not split does everything in backward_input.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <random>

#include "models/gpt.hpp"
#include "models/mlp.hpp"
#include "models/split_backward.hpp"
#include "tests/models/split_check.hpp"

using namespace zero;
using namespace zero::models;
using zero::test::BackwardOrder;
using zero::test::BackwardResult;
using zero::test::ModelRunner;

namespace {

struct Fixture {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<Ops> ops = make_ops(*device, *stream);
};

std::vector<Batch> gpt_batches(ModelRunner& r, const GptShape& s, int B, int T, int count) {
  std::mt19937 rng(42);
  std::vector<Batch> out;
  for (int k = 0; k < count; ++k) {
    std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(s.vocab_size));
    for (size_t i = 0; i < targets.size(); ++i)
      targets[i] = i % 7 == 6 ? -1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(s.vocab_size));
    out.push_back(r.make_batch(Shape{B, T}, tokens, Shape{B, T}, targets));
  }
  return out;
}

// Bitwise: the split runs the same ops in the same order on the same tensors (no tolerance).
void require_same(const Model& m, const BackwardResult& joint, const BackwardResult& split) {
  REQUIRE(joint.losses == split.losses);
  for (size_t i = 0; i < m.params.size(); ++i) {
    INFO("gradient of " << m.params[i].name);
    CHECK(joint.grads[i] == split.grads[i]);
  }
  for (size_t k = 0; k < joint.dx.size(); ++k)
    for (size_t u = 0; u < m.units.size(); ++u) {
      INFO("grad_input of unit " << m.units[u]->name() << ", micro-batch " << k);
      CHECK(joint.dx[k][u] == split.dx[k][u]);
    }
}

// A Unit that keeps the defaults: y = x @ w (w [C, C]), backward in one piece.
class JointOnlyUnit final : public Unit {
 public:
  JointOnlyUnit(Ops& ops, int param) : ops_(ops), ids_{param} {}
  const std::string& name() const noexcept override { return name_; }
  std::span<const int> param_ids() const noexcept override { return ids_; }
  void forward(UnitContext& ctx) override {
    ctx.input = ctx.batch->inputs;
    ctx.output = Tensor::empty(ops_.device(), ctx.input.shape(), ScalarType::f32, MemCategory::activations);
    ops_.linear_forward(ctx.output, ctx.input, ctx.params[0], Tensor());
  }
  void backward(UnitContext& ctx) override {
    ctx.grad_input = Tensor::empty(ops_.device(), ctx.input.shape(), ScalarType::f32, MemCategory::activations);
    ops_.linear_backward(ctx.grad_input, ctx.grads[0], Tensor(), ctx.grad_output, ctx.input, ctx.params[0]);
  }

 private:
  Ops& ops_;
  std::string name_ = "joint-only";
  std::vector<int> ids_;
};

}  // namespace

TEST_CASE("split backward: every GPT Unit splits, and B then W equals backward bitwise") {
  Fixture f;
  const GptShape s = *gpt_preset("tiny");
  const int B = 2, T = 32, micro_batches = 3;
  for (ScalarType param : {ScalarType::f32, ScalarType::bf16}) {
    Model m = make_gpt({s, param, ScalarType::f32}, *f.ops);
    for (const auto& u : m.units) CHECK(u->splits_backward());
    // Gradients in the parameter's own type: bf16 ones round at every "+=", so a reordered or
    // repeated accumulation would show.
    ModelRunner r(m, *f.ops, 5);
    const std::vector<Batch> batches = gpt_batches(r, s, B, T, micro_batches);
    for (bool checkpoint : {false, true}) {
      const std::vector<bool> plan = checkpoint_plan(m, checkpoint ? std::optional<long long>(99) : std::nullopt);
      // 1/3: the gradient accumulation seed of three micro-batches.
      const BackwardResult joint = run_backward(r, m, batches, plan, BackwardOrder::joint, 1.0f / 3);
      for (BackwardOrder order : {BackwardOrder::split_each, BackwardOrder::split_later}) {
        INFO(to_string(param) << " parameters, checkpointing " << checkpoint << ", " << to_string(order));
        require_same(m, joint, run_backward(r, m, batches, plan, order, 1.0f / 3));
      }
      // Not vacuous: every parameter got a gradient.
      for (size_t i = 0; i < m.params.size(); ++i) {
        double norm = 0;
        for (double g : joint.grads[i]) norm += g * g;
        INFO(m.params[i].name);
        CHECK(norm > 0);
      }
    }
  }
}

TEST_CASE("split backward: every MLP Unit splits, and B then W equals backward bitwise") {
  Fixture f;
  const MlpShape s{16, 32, 3, 4};
  MlpTeacherTask task(s, 4);
  for (ScalarType param : {ScalarType::f32, ScalarType::bf16}) {
    Model m = make_mlp({s, param, ScalarType::f32}, *f.ops);
    for (const auto& u : m.units) CHECK(u->splits_backward());
    ModelRunner r(m, *f.ops, 9, ScalarType::f32);
    std::vector<Batch> batches;
    for (int k = 0; k < 3; ++k) {
      std::vector<float> feat;
      std::vector<int32_t> labels;
      task.batch(32 * k, 32, feat, labels);
      batches.push_back(r.make_feature_batch(Shape{32, 16}, ScalarType::f32,
                                             std::vector<double>(feat.begin(), feat.end()), labels));
    }
    for (bool checkpoint : {false, true}) {
      const std::vector<bool> plan = checkpoint_plan(m, checkpoint ? std::optional<long long>(99) : std::nullopt);
      const BackwardResult joint = run_backward(r, m, batches, plan, BackwardOrder::joint, 0.5f);
      for (BackwardOrder order : {BackwardOrder::split_each, BackwardOrder::split_later}) {
        INFO(to_string(param) << " parameters, checkpointing " << checkpoint << ", " << to_string(order));
        require_same(m, joint, run_backward(r, m, batches, plan, order, 0.5f));
      }
    }
  }
}

TEST_CASE("split backward: W keeps exactly the matmuls' inputs and output gradients") {
  Fixture f;
  const GptShape s{2, 32, 4, 40, 16};
  const int64_t B = 2, T = 16, C = s.n_embd, V = s.vocab_size;
  Model m = make_gpt({s, ScalarType::f32, ScalarType::f32}, *f.ops);
  ModelRunner r(m, *f.ops, 5);
  const std::vector<Batch> batches = gpt_batches(r, s, B, T, 1);
  for (bool checkpoint : {false, true}) {
    INFO("checkpointing " << checkpoint);
    r.zero_grads();
    r.forward(batches[0], checkpoint_plan(m, checkpoint ? std::optional<long long>(99) : std::nullopt));
    std::vector<UnitContext> ctx = r.backward_input();
    std::vector<int64_t> kept;
    for (const UnitContext& c : ctx) {
      const auto* d = dynamic_cast<const DeferredWeightGrads*>(c.state.get());
      REQUIRE(d != nullptr);
      kept.push_back(d->elements());
    }
    // docs/models.md, "Split backward": embedding B T C (its output gradient); a block 16 B T C
    // (inputs ln_1 C, attention output C, ln_2 C, GELU output 4C; output gradients qkv 3C,
    // attention projection C, fc 4C, block output C); head B T (V + C).
    CHECK(kept.front() == B * T * C);
    for (size_t u = 1; u + 1 < ctx.size(); ++u) CHECK(kept[u] == 16 * B * T * C);
    CHECK(kept.back() == B * T * (V + C));
    // The parameter gradients W owns are still zero after B; ln_1's are not (B does them).
    CHECK(r.grad(4) == std::vector<double>(static_cast<size_t>(m.params[4].numel()), 0.0));  // c_attn.weight
    CHECK(r.grad(5) == std::vector<double>(static_cast<size_t>(m.params[5].numel()), 0.0));  // c_attn.bias
    CHECK(r.grad(0) == std::vector<double>(static_cast<size_t>(m.params[0].numel()), 0.0));  // wte
    CHECK(r.grad(2) != std::vector<double>(static_cast<size_t>(m.params[2].numel()), 0.0));  // ln_1.weight
    r.backward_weight(ctx);
    for (const UnitContext& c : ctx) CHECK_FALSE(c.state);
  }
}

TEST_CASE("split backward: backward_weight without backward_input is refused") {
  Fixture f;
  Model m = make_mlp({MlpShape{4, 8, 1, 3}, ScalarType::f32, ScalarType::f32}, *f.ops);
  UnitContext ctx;
  ctx.grads.resize(2);
  REQUIRE_THROWS_WITH(m.units[0]->backward_weight(ctx),
                      Catch::Matchers::ContainsSubstring("fc.0: backward_weight without backward_input"));
}

TEST_CASE("split backward: a Unit that cannot split does all of its backward in B") {
  Fixture f;
  Model m;
  m.name = "joint-only";
  m.params.push_back(ParamSpec{"w", Shape{8, 8}});
  m.units.push_back(std::make_unique<JointOnlyUnit>(*f.ops, 0));
  Unit& unit = *m.units[0];
  CHECK_FALSE(unit.splits_backward());
  ModelRunner r(m, *f.ops, 3, ScalarType::f32);
  std::mt19937 rng(1);
  std::vector<double> x(32), dy(32);
  for (double& v : x) v = static_cast<double>(rng() % 100) / 50.0 - 1.0;
  for (double& v : dy) v = static_cast<double>(rng() % 100) / 50.0 - 1.0;
  const Batch batch = r.make_feature_batch(Shape{4, 8}, ScalarType::f32, x, std::vector<int32_t>(4, 0));
  Tensor grad_out = Tensor::empty(f.ops->device(), Shape{4, 8}, ScalarType::f32, MemCategory::activations);
  r.write(grad_out, dy);

  auto run = [&](bool split) {
    r.zero_grads();
    UnitContext ctx;
    ctx.batch = &batch;
    ctx.params = {r.param_tensor(0)};
    unit.forward(ctx);
    ctx.grads = {r.grad_tensor(0)};
    ctx.grad_output = grad_out;
    if (!split) {
      unit.backward(ctx);
      return std::make_pair(r.grad(0), r.read(ctx.grad_input));
    }
    unit.backward_input(ctx);
    // Everything is done after B: the gradient is complete before W runs.
    auto after_b = std::make_pair(r.grad(0), r.read(ctx.grad_input));
    unit.backward_weight(ctx);
    CHECK(r.grad(0) == after_b.first);
    return after_b;
  };
  const auto joint = run(false);
  const auto split = run(true);
  CHECK(joint.first == split.first);
  CHECK(joint.second == split.second);
  CHECK(joint.first != std::vector<double>(64, 0.0));
}

TEST_CASE("split backward: the ops' halves are the joint ops bit for bit") {
  Fixture f;
  Model none;  // a runner without parameters, for its host <-> device copies
  ModelRunner io(none, *f.ops, 0);
  std::mt19937 rng(3);
  auto random = [&](Shape s, ScalarType t = ScalarType::f32) {
    Tensor x = Tensor::empty(f.ops->device(), s, t, MemCategory::activations);
    std::vector<double> v(static_cast<size_t>(s.numel()));
    for (double& e : v) e = static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 700.0;
    io.write(x, v);
    return x;
  };
  const int64_t N = 37, C = 24, OC = 40, V = 29;
  for (ScalarType gt : {ScalarType::f32, ScalarType::bf16}) {
    INFO("gradients of type " << to_string(gt));
    const Tensor x = random({N, C}), w = random({C, OC}, ScalarType::bf16), dy = random({N, OC});
    const Tensor dx1 = random({N, C}), dx2 = random({N, C});
    const Tensor dw1 = random({C, OC}, gt), db1 = random({OC}, gt);
    const Tensor dw2 = Tensor::empty(f.ops->device(), Shape{C, OC}, gt, MemCategory::gradients);
    const Tensor db2 = Tensor::empty(f.ops->device(), Shape{OC}, gt, MemCategory::gradients);
    io.write(dw2, io.read(dw1));
    io.write(db2, io.read(db1));
    f.ops->linear_backward(dx1, dw1, db1, dy, x, w);
    f.ops->linear_backward_input(dx2, dy, w);
    f.ops->linear_backward_weight(dw2, db2, dy, x);
    CHECK(io.read(dx1) == io.read(dx2));
    CHECK(io.read(dw1) == io.read(dw2));
    CHECK(io.read(db1) == io.read(db2));

    const Tensor wt = random({V, C}), dyt = random({N, V});
    const Tensor dwt1 = random({V, C}, gt);
    const Tensor dwt2 = Tensor::empty(f.ops->device(), Shape{V, C}, gt, MemCategory::gradients);
    io.write(dwt2, io.read(dwt1));
    f.ops->linear_t_backward(dx1, dwt1, dyt, x, wt);
    f.ops->linear_t_backward_input(dx2, dyt, wt);
    f.ops->linear_t_backward_weight(dwt2, dyt, x);
    CHECK(io.read(dx1) == io.read(dx2));
    CHECK(io.read(dwt1) == io.read(dwt2));
  }
  // The halves check their operands like the joint ops.
  REQUIRE_THROWS_WITH(f.ops->linear_backward_weight(random({C, OC + 1}), Tensor(), random({N, OC}), random({N, C})),
                      Catch::Matchers::ContainsSubstring("linear_backward_weight: dy is"));
}
