#include "models/mlp.hpp"

#include "core/random.hpp"
#include "models/split_backward.hpp"

#include <cmath>
#include <string>
#include <utility>

namespace zero::models {
namespace {

class MlpUnit : public Unit {
 public:
  MlpUnit(std::string name, std::vector<int> ids, Ops& ops, const MlpOptions& o, bool first)
      : name_(std::move(name)), ids_(std::move(ids)), ops_(ops), opt_(o), first_(first) {}
  const std::string& name() const noexcept override { return name_; }
  std::span<const int> param_ids() const noexcept override { return ids_; }

 protected:
  Tensor act(Shape s) const { return Tensor::empty(ops_.device(), s, opt_.activation_type, MemCategory::activations); }
  // The first Unit reads the batch's features; the others the previous Unit's output.
  const Tensor& input(const UnitContext& ctx) const {
    if (!first_) {
      ZERO_REQUIRE(ctx.input, "mlp unit " + name_ + ": forward without an input");
      return ctx.input;
    }
    ZERO_REQUIRE(ctx.batch && ctx.batch->inputs && ctx.batch->inputs.shape().rank() == 2 &&
                     ctx.batch->inputs.shape()[1] == opt_.shape.in_features,
                 "mlp: the batch inputs must be features [B, " + std::to_string(opt_.shape.in_features) +
                     "], got " + (ctx.batch ? ctx.batch->inputs.describe() : std::string("no batch")));
    return ctx.batch->inputs;
  }
  void require(const UnitContext& ctx, bool backward) const {
    ZERO_REQUIRE(ctx.params.size() == 2 && (!backward || ctx.grads.size() == 2),
                 "mlp unit " + name_ + ": expected 2 parameter (and gradient) tensors");
  }

  std::string name_;
  std::vector<int> ids_;
  Ops& ops_;
  MlpOptions opt_;
  bool first_;
};

struct HiddenState final : UnitState {
  Tensor h;  // pre-activation
};

// Split backward: the GELU and the input gradient in B; the weight and bias gradients in W,
// which keeps the layer's input and the pre-activation's gradient.
class HiddenUnit final : public SplitBackward<MlpUnit> {
 public:
  using SplitBackward::SplitBackward;
  bool checkpointable() const noexcept override { return true; }
  void forward(UnitContext& ctx) override {
    require(ctx, false);
    auto s = std::make_unique<HiddenState>();
    ctx.output = run(ctx, *s);
    if (!ctx.checkpoint) ctx.state = std::move(s);
  }

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override {
    require(ctx, true);
    std::unique_ptr<HiddenState> owned;  // checkpointed: the pre-activation, recomputed
    HiddenState* s = &saved_or_recomputed(ctx, owned, [&](HiddenState& st) { (void)run(ctx, st); });
    const Tensor& x = input(ctx);
    Tensor dh = act(s->h.shape());
    ops_.gelu_backward(dh, ctx.grad_output, s->h);
    Tensor dx = first_ ? Tensor() : act(x.shape());
    wg.linear(dx, 0, 1, dh, x, ctx.params[0]);
    ctx.grad_input = dx;
  }

 private:
  Tensor run(const UnitContext& ctx, HiddenState& s) const {
    const Tensor& x = input(ctx);
    s.h = act(Shape{x.shape()[0], ctx.params[0].shape()[1]});
    ops_.linear_forward(s.h, x, ctx.params[0], ctx.params[1]);
    Tensor y = act(s.h.shape());
    ops_.gelu_forward(y, s.h);
    return y;
  }
};

struct HeadState final : UnitState {
  Tensor logits;
};

// Split backward: the cross-entropy and the input gradient in B; weight and bias in W.
class HeadUnit final : public SplitBackward<MlpUnit> {
 public:
  using SplitBackward::SplitBackward;
  void forward(UnitContext& ctx) override {
    require(ctx, false);
    const Tensor& x = input(ctx);
    const int64_t B = x.shape()[0];
    const Tensor& labels = ctx.batch->targets;
    ZERO_REQUIRE(labels && labels.type() == ScalarType::i32 && labels.numel() == B,
                 "mlp: the batch targets must be int32 labels [B], got " + labels.describe());
    auto s = std::make_unique<HeadState>();
    s->logits = act(Shape{B, opt_.shape.classes});
    ops_.linear_forward(s->logits, x, ctx.params[0], ctx.params[1]);
    const ScalarType stat = opt_.activation_type == ScalarType::f64 ? ScalarType::f64 : ScalarType::f32;
    Tensor losses = Tensor::empty(ops_.device(), Shape{B}, stat, MemCategory::activations);
    ctx.loss = Tensor::empty(ops_.device(), Shape{1}, stat, MemCategory::activations);
    ops_.cross_entropy_forward(ctx.loss, losses, s->logits, labels);
    ctx.output = s->logits;
    ctx.state = std::move(s);
  }

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override {
    require(ctx, true);
    auto* s = dynamic_cast<HeadState*>(ctx.state.get());
    ZERO_REQUIRE(s != nullptr, "mlp unit " + name_ + ": backward without its forward");
    const Tensor& x = input(ctx);
    Tensor dlogits = act(s->logits.shape());
    ops_.cross_entropy_backward(dlogits, s->logits, ctx.batch->targets, ctx.grad_scale);
    Tensor dx = first_ ? Tensor() : act(x.shape());
    wg.linear(dx, 0, 1, dlogits, x, ctx.params[0]);
    ctx.grad_input = dx;
  }
};

}  // namespace

Model make_mlp(const MlpOptions& o, Ops& ops) {
  const MlpShape& s = o.shape;
  ZERO_REQUIRE(s.in_features > 0 && s.hidden > 0 && s.n_hidden >= 1 && s.classes > 1,
               "mlp: in_features, hidden must be positive, n_hidden >= 1 and classes >= 2");
  ZERO_REQUIRE((o.param_type == ScalarType::f64) == (o.activation_type == ScalarType::f64),
               "mlp: fp64 parameters go with fp64 activations only");
  Model m;
  m.name = "mlp(" + std::to_string(s.in_features) + " -> " + std::to_string(s.n_hidden) + " x " +
           std::to_string(s.hidden) + " -> " + std::to_string(s.classes) + ")";
  auto add = [&](std::string name, Shape shape, ParamInit init, float std_dev) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = shape;
    p.type = o.param_type;
    p.weight_decay = shape.rank() >= 2;
    p.init = init;
    p.init_std = std_dev;
    m.params.push_back(std::move(p));
    return static_cast<int>(m.params.size()) - 1;
  };
  int in = s.in_features;
  for (int i = 0; i < s.n_hidden; ++i) {
    const std::string n = "fc." + std::to_string(i);
    // He-style scale so activations neither vanish nor explode through the GELUs.
    const float sd = std::sqrt(2.0f / static_cast<float>(in));
    std::vector<int> ids{add(n + ".weight", Shape{in, s.hidden}, ParamInit::normal, sd),
                         add(n + ".bias", Shape{s.hidden}, ParamInit::zeros, 0.0f)};
    m.units.push_back(std::make_unique<HiddenUnit>(n, std::move(ids), ops, o, i == 0));
    in = s.hidden;
  }
  std::vector<int> ids{add("head.weight", Shape{in, s.classes}, ParamInit::normal,
                           1.0f / std::sqrt(static_cast<float>(in))),
                       add("head.bias", Shape{s.classes}, ParamInit::zeros, 0.0f)};
  m.units.push_back(std::make_unique<HeadUnit>("head", std::move(ids), ops, o, false));
  return m;
}

MlpTeacherTask::MlpTeacherTask(MlpShape shape, uint64_t seed)
    : shape_(shape), seed_(seed), teacher_hidden_(2 * shape.classes + 8) {
  ZERO_REQUIRE(shape.in_features > 0 && shape.classes > 1, "mlp teacher task: bad shape");
  const uint64_t key = hash_counters(seed, hash_string("mlp teacher"));
  w1_.resize(static_cast<size_t>(shape.in_features) * teacher_hidden_);
  w2_.resize(static_cast<size_t>(teacher_hidden_) * shape.classes);
  for (size_t i = 0; i < w1_.size(); ++i) w1_[i] = counter_normal(key, i);
  for (size_t i = 0; i < w2_.size(); ++i) w2_[i] = counter_normal(key + 1, i);
}

void MlpTeacherTask::batch(int64_t first, int count, std::vector<float>& features,
                           std::vector<int32_t>& labels) const {
  const int D = shape_.in_features, H = teacher_hidden_, K = shape_.classes;
  features.resize(static_cast<size_t>(count) * D);
  labels.resize(static_cast<size_t>(count));
  const uint64_t key = hash_counters(seed_, hash_string("mlp features"));
  std::vector<double> hid(static_cast<size_t>(H));
  for (int r = 0; r < count; ++r) {
    const uint64_t sample = static_cast<uint64_t>(first + r);
    float* x = features.data() + static_cast<size_t>(r) * D;
    for (int d = 0; d < D; ++d) x[d] = counter_normal(key, sample * static_cast<uint64_t>(D) + static_cast<uint64_t>(d));
    for (int h = 0; h < H; ++h) {
      double a = 0;
      for (int d = 0; d < D; ++d) a += static_cast<double>(x[d]) * w1_[static_cast<size_t>(d) * H + h];
      hid[static_cast<size_t>(h)] = std::tanh(a / std::sqrt(static_cast<double>(D)));
    }
    int best = 0;
    double best_v = -1e300;
    for (int k = 0; k < K; ++k) {
      double a = 0;
      for (int h = 0; h < H; ++h) a += hid[static_cast<size_t>(h)] * w2_[static_cast<size_t>(h) * K + k];
      if (a > best_v) best_v = a, best = k;
    }
    labels[static_cast<size_t>(r)] = best;
  }
}

}  // namespace zero::models
