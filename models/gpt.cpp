#include "models/gpt.hpp"

#include "models/split_backward.hpp"

#include <cmath>
#include <utility>

namespace zero::models {
namespace {

ScalarType stat_type(ScalarType a) { return a == ScalarType::f64 ? ScalarType::f64 : ScalarType::f32; }

// Shared plumbing of the three Unit kinds.
class GptUnit : public Unit {
 public:
  GptUnit(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o)
      : name_(std::move(name)), ids_(std::move(ids)), ops_(ops), opt_(o) {}
  const std::string& name() const noexcept override { return name_; }
  std::span<const int> param_ids() const noexcept override { return ids_; }

 protected:
  // An activation of this micro-batch, counted in the ledger.
  Tensor act(Shape s) const { return Tensor::empty(ops_.device(), s, opt_.activation_type, MemCategory::activations); }
  Tensor stats(Shape s) const { return Tensor::empty(ops_.device(), s, stat_type(opt_.activation_type), MemCategory::activations); }
  static std::pair<int64_t, int64_t> batch_dims(const UnitContext& ctx) {
    ZERO_REQUIRE(ctx.batch && ctx.batch->inputs, "gpt: the Unit was called without a batch");
    const Tensor& tokens = ctx.batch->inputs;
    ZERO_REQUIRE(tokens.type() == ScalarType::i32 && tokens.shape().rank() == 2,
                 "gpt: the batch inputs must be int32 token ids [B, T], got " + tokens.describe());
    return {tokens.shape()[0], tokens.shape()[1]};
  }
  void require_params(const UnitContext& ctx, bool backward) const {
    ZERO_REQUIRE(ctx.params.size() == ids_.size(),
                 "gpt unit " + name_ + ": expected " + std::to_string(ids_.size()) +
                     " parameter tensors, got " + std::to_string(ctx.params.size()));
    if (backward)
      ZERO_REQUIRE(ctx.grads.size() == ids_.size(),
                   "gpt unit " + name_ + ": expected " + std::to_string(ids_.size()) +
                       " gradient tensors, got " + std::to_string(ctx.grads.size()));
  }

  std::string name_;
  std::vector<int> ids_;
  Ops& ops_;
  GptOptions opt_;
};

// ---- embedding: tokens -> wte[token] + wpe[position] ---------------------------------------
// Split backward: nothing flows to an earlier Unit, so the whole scatter-add into wte and wpe is
// weight gradient: backward_input only keeps grad_output (and the token ids) for W.
class EmbeddingUnit final : public SplitBackward<GptUnit> {
 public:
  using SplitBackward::SplitBackward;
  void forward(UnitContext& ctx) override {
    require_params(ctx, false);
    const auto [B, T] = batch_dims(ctx);
    ctx.output = act(Shape{B, T, opt_.shape.n_embd});
    ops_.embedding_forward(ctx.output, ctx.batch->inputs, ctx.params[0], ctx.params[1]);
  }

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override {
    require_params(ctx, true);
    ZERO_REQUIRE(ctx.grad_output, "gpt unit " + name_ + ": backward without grad_output");
    (void)batch_dims(ctx);
    wg.embedding(0, 1, ctx.grad_output, ctx.batch->inputs);
    ctx.grad_input = Tensor();
  }
};

// ---- transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)) -----------------------------
// Parameter order (ctx.params / ctx.grads): ln_1.w, ln_1.b, c_attn.w, c_attn.b, attn c_proj.w,
// c_proj.b, ln_2.w, ln_2.b, c_fc.w, c_fc.b, mlp c_proj.w, c_proj.b.
struct BlockState final : UnitState {
  Tensor ln1, mean1, rstd1, qkv, probs, atty, res2, ln2, mean2, rstd2, fch, fcg;
};

// Split backward: the four matmuls' weight and bias gradients (c_attn, attn c_proj, c_fc,
// mlp c_proj) go to W; backward_input does their input gradients, attention, GELU, both
// LayerNorms (their weight and bias gradients too: a row reduction over tensors B has at hand)
// and the residuals. W keeps, per matmul, its input and its output's gradient.
class BlockUnit final : public SplitBackward<GptUnit> {
 public:
  using SplitBackward::SplitBackward;
  bool checkpointable() const noexcept override { return true; }

  void forward(UnitContext& ctx) override {
    require_params(ctx, false);
    auto state = std::make_unique<BlockState>();
    ctx.output = run_forward(ctx, *state);
    // Checkpointed: drop the intermediates now (their memory returns once the enqueued ops
    // that use them have run); backward recomputes them from ctx.input, which the engine keeps.
    if (!ctx.checkpoint) ctx.state = std::move(state);
  }


 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override {
    require_params(ctx, true);
    ZERO_REQUIRE(ctx.grad_output, "gpt unit " + name_ + ": backward without grad_output");
    // Checkpointed: re-materialise. The same ops on the same input and parameters give bitwise
    // the same intermediates (every op is deterministic), hence the same gradients.
    std::unique_ptr<BlockState> owned;
    BlockState* s = &saved_or_recomputed(ctx, owned, [&](BlockState& st) { (void)run_forward(ctx, st); });
    const std::vector<Tensor>& w = ctx.params;
    const std::vector<Tensor>& g = ctx.grads;
    const Tensor& x = ctx.input;
    const Tensor& dout = ctx.grad_output;
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];

    // out = res2 + mlp(res2): the MLP branch first.
    Tensor dfcg = act(Shape{B, T, 4 * C});
    wg.linear(dfcg, 10, 11, dout, s->fcg, w[10]);
    Tensor dfch = act(Shape{B, T, 4 * C});
    ops_.gelu_backward(dfch, dfcg, s->fch);
    dfcg = Tensor();
    Tensor dln2 = act(Shape{B, T, C});
    wg.linear(dln2, 8, 9, dfch, s->ln2, w[8]);
    dfch = Tensor();
    Tensor dres2 = act(Shape{B, T, C});
    ops_.layernorm_backward(dres2, g[6], g[7], dln2, s->res2, w[6], s->mean2, s->rstd2);
    ops_.accumulate(dres2, dout);  // the residual path
    dln2 = Tensor();

    // res2 = x + attn(x): the attention branch.
    Tensor datty = act(Shape{B, T, C});
    wg.linear(datty, 4, 5, dres2, s->atty, w[4]);
    Tensor dqkv = act(Shape{B, T, 3 * C});
    ops_.attention_backward(dqkv, datty, s->qkv, s->probs, opt_.shape.n_head);
    datty = Tensor();
    Tensor dln1 = act(Shape{B, T, C});
    wg.linear(dln1, 2, 3, dqkv, s->ln1, w[2]);
    dqkv = Tensor();
    Tensor dx = act(Shape{B, T, C});
    ops_.layernorm_backward(dx, g[0], g[1], dln1, x, w[0], s->mean1, s->rstd1);
    ops_.accumulate(dx, dres2);  // the residual path
    ctx.grad_input = dx;
  }

 private:
  Tensor run_forward(const UnitContext& ctx, BlockState& s) const {
    ZERO_REQUIRE(ctx.input && ctx.input.shape().rank() == 3 && ctx.input.shape()[2] == opt_.shape.n_embd,
                 "gpt unit " + name_ + ": the input must be [B, T, " +
                     std::to_string(opt_.shape.n_embd) + "], got " + ctx.input.describe());
    const std::vector<Tensor>& w = ctx.params;
    const Tensor& x = ctx.input;
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    const int NH = opt_.shape.n_head;

    s.ln1 = act(Shape{B, T, C});
    s.mean1 = stats(Shape{B * T});
    s.rstd1 = stats(Shape{B * T});
    ops_.layernorm_forward(s.ln1, s.mean1, s.rstd1, x, w[0], w[1]);
    s.qkv = act(Shape{B, T, 3 * C});
    ops_.linear_forward(s.qkv, s.ln1, w[2], w[3]);
    s.probs = act(Shape{B, NH, T, T});
    s.atty = act(Shape{B, T, C});
    ops_.attention_forward(s.atty, s.probs, s.qkv, NH);
    Tensor attproj = act(Shape{B, T, C});
    ops_.linear_forward(attproj, s.atty, w[4], w[5]);
    s.res2 = act(Shape{B, T, C});
    ops_.add(s.res2, x, attproj);
    attproj = Tensor();

    s.ln2 = act(Shape{B, T, C});
    s.mean2 = stats(Shape{B * T});
    s.rstd2 = stats(Shape{B * T});
    ops_.layernorm_forward(s.ln2, s.mean2, s.rstd2, s.res2, w[6], w[7]);
    s.fch = act(Shape{B, T, 4 * C});
    ops_.linear_forward(s.fch, s.ln2, w[8], w[9]);
    s.fcg = act(Shape{B, T, 4 * C});
    ops_.gelu_forward(s.fcg, s.fch);
    Tensor fcproj = act(Shape{B, T, C});
    ops_.linear_forward(fcproj, s.fcg, w[10], w[11]);
    Tensor out = act(Shape{B, T, C});
    ops_.add(out, s.res2, fcproj);
    return out;
  }
};

// ---- head: ln_f, logits = x wte^T, cross-entropy --------------------------------------------
// Parameter order: ln_f.w, ln_f.b, wte (tied).
struct HeadState final : UnitState {
  Tensor lnf, mean, rstd, logits;
};

// Split backward: the LM head's weight gradient (into the tied wte) goes to W, which keeps the
// logits' gradient [B,T,V] and ln_f's output; backward_input does the cross-entropy, the head's
// input gradient and ln_f (with its weight and bias gradients).
class HeadUnit final : public SplitBackward<GptUnit> {
 public:
  using SplitBackward::SplitBackward;
  void forward(UnitContext& ctx) override {
    require_params(ctx, false);
    const auto [B, T] = batch_dims(ctx);
    const Tensor& targets = ctx.batch->targets;
    ZERO_REQUIRE(targets && targets.type() == ScalarType::i32 && targets.numel() == B * T,
                 "gpt: the batch targets must be int32 [B, T] like the inputs, got " + targets.describe());
    const Tensor& x = ctx.input;
    const int64_t C = opt_.shape.n_embd, V = opt_.shape.vocab_size;
    auto s = std::make_unique<HeadState>();
    s->lnf = act(Shape{B, T, C});
    s->mean = stats(Shape{B * T});
    s->rstd = stats(Shape{B * T});
    ops_.layernorm_forward(s->lnf, s->mean, s->rstd, x, ctx.params[0], ctx.params[1]);
    s->logits = act(Shape{B, T, V});
    ops_.linear_t_forward(s->logits, s->lnf, ctx.params[2]);
    Tensor losses = stats(Shape{B * T});
    ctx.loss = stats(Shape{1});
    ops_.cross_entropy_forward(ctx.loss, losses, s->logits, targets);
    ctx.output = s->logits;
    ctx.state = std::move(s);
  }


 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override {
    require_params(ctx, true);
    auto* s = dynamic_cast<HeadState*>(ctx.state.get());
    ZERO_REQUIRE(s != nullptr, "gpt unit " + name_ + ": backward without its forward");
    const Tensor& x = ctx.input;
    Tensor dlogits = act(s->logits.shape());
    ops_.cross_entropy_backward(dlogits, s->logits, ctx.batch->targets, ctx.grad_scale);
    Tensor dlnf = act(x.shape());
    wg.linear_t(dlnf, 2, dlogits, s->lnf, ctx.params[2]);
    dlogits = Tensor();
    Tensor dx = act(x.shape());
    ops_.layernorm_backward(dx, ctx.grads[0], ctx.grads[1], dlnf, x, ctx.params[0], s->mean, s->rstd);
    ctx.grad_input = dx;
  }
};

void check_options(const GptOptions& o, const Ops& ops) {
  const GptShape& s = o.shape;
  ZERO_REQUIRE(s.n_layer > 0 && s.n_embd > 0 && s.n_head > 0 && s.vocab_size > 0 && s.seq_len > 0,
               "gpt: every size must be positive (n_layer " + std::to_string(s.n_layer) + ", n_embd " +
                   std::to_string(s.n_embd) + ", n_head " + std::to_string(s.n_head) + ", vocab_size " +
                   std::to_string(s.vocab_size) + ", seq_len " + std::to_string(s.seq_len) + ")");
  ZERO_REQUIRE(s.n_embd % s.n_head == 0, "gpt: n_embd " + std::to_string(s.n_embd) +
                                             " is not divisible by n_head " + std::to_string(s.n_head));
  const ScalarType a = o.activation_type;
  if (ops.device().kind() == DeviceKind::cpu) {
    ZERO_REQUIRE(a == ScalarType::f32 || a == ScalarType::f64,
                 "gpt on " + ops.device().name() + ": activations must be fp32 (or fp64 for checks), got " +
                     std::string(to_string(a)));
  } else {
    ZERO_REQUIRE(a == ScalarType::f32 || a == ScalarType::bf16 || a == ScalarType::f16,
                 "gpt on " + ops.device().name() + ": activations must be fp32, bf16 or fp16, got " +
                     std::string(to_string(a)));
  }
  ZERO_REQUIRE(o.param_type != ScalarType::i32, "gpt: parameters must have a float type");
  ZERO_REQUIRE((o.param_type == ScalarType::f64) == (a == ScalarType::f64),
               "gpt: fp64 parameters go with fp64 activations only");
}

}  // namespace

Model make_gpt(const GptOptions& o, Ops& ops) {
  check_options(o, ops);
  const GptShape& s = o.shape;
  const int64_t C = s.n_embd;
  Model m;
  m.name = "gpt(n_layer " + std::to_string(s.n_layer) + ", n_embd " + std::to_string(C) +
           ", n_head " + std::to_string(s.n_head) + ", vocab " + std::to_string(s.vocab_size) +
           ", seq_len " + std::to_string(s.seq_len) + ")";
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(s.n_layer));
  auto add = [&](std::string name, Shape shape, ParamInit init, float std_dev = 0.02f) {
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
  const int wte = add("wte.weight", Shape{s.vocab_size, C}, ParamInit::normal);
  const int wpe = add("wpe.weight", Shape{s.seq_len, C}, ParamInit::normal);
  m.units.push_back(std::make_unique<EmbeddingUnit>("embedding", std::vector<int>{wte, wpe}, ops, o));
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    std::vector<int> ids;
    ids.push_back(add(h + "ln_1.weight", Shape{C}, ParamInit::ones));
    ids.push_back(add(h + "ln_1.bias", Shape{C}, ParamInit::zeros));
    ids.push_back(add(h + "attn.c_attn.weight", Shape{C, 3 * C}, ParamInit::normal));
    ids.push_back(add(h + "attn.c_attn.bias", Shape{3 * C}, ParamInit::zeros));
    ids.push_back(add(h + "attn.c_proj.weight", Shape{C, C}, ParamInit::normal, proj_std));
    ids.push_back(add(h + "attn.c_proj.bias", Shape{C}, ParamInit::zeros));
    ids.push_back(add(h + "ln_2.weight", Shape{C}, ParamInit::ones));
    ids.push_back(add(h + "ln_2.bias", Shape{C}, ParamInit::zeros));
    ids.push_back(add(h + "mlp.c_fc.weight", Shape{C, 4 * C}, ParamInit::normal));
    ids.push_back(add(h + "mlp.c_fc.bias", Shape{4 * C}, ParamInit::zeros));
    ids.push_back(add(h + "mlp.c_proj.weight", Shape{4 * C, C}, ParamInit::normal, proj_std));
    ids.push_back(add(h + "mlp.c_proj.bias", Shape{C}, ParamInit::zeros));
    m.units.push_back(std::make_unique<BlockUnit>("h." + std::to_string(l), std::move(ids), ops, o));
  }
  const int lnf_w = add("ln_f.weight", Shape{C}, ParamInit::ones);
  const int lnf_b = add("ln_f.bias", Shape{C}, ParamInit::zeros);
  m.units.push_back(std::make_unique<HeadUnit>("head", std::vector<int>{lnf_w, lnf_b, wte}, ops, o));
  return m;
}

int64_t gpt_parameter_count(const GptShape& s) noexcept {
  const int64_t C = s.n_embd;
  return static_cast<int64_t>(s.n_layer) * (12 * C * C + 13 * C) +
         static_cast<int64_t>(s.vocab_size) * C + static_cast<int64_t>(s.seq_len) * C + 2 * C;
}

double gpt_flops_per_token(const GptShape& s) noexcept {
  const double C = s.n_embd, L = s.n_layer, V = s.vocab_size, T = s.seq_len;
  // Matmul parameters per token: 12 C^2 per block (qkv 3, proj 1, fc 4, fc proj 4) and V C for
  // the head; each does 2 FLOPs per parameter forward and 4 backward. Attention: q k^T and
  // probs v are 2 T C each per layer forward (counted over the full T x T, as is customary).
  const double matmul_params = L * 12.0 * C * C + V * C;
  return 6.0 * matmul_params + 12.0 * L * T * C;
}

}  // namespace zero::models
