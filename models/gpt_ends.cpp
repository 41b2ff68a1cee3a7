#include "models/gpt_ends.hpp"

#include <memory>

namespace zero::models {

// ---- embedding: tokens -> wte[token] + wpe[position] ---------------------------------------

void GptEmbedding::forward(UnitContext& ctx) {
  require_params(ctx, false);
  const auto [B, T] = batch_dims(ctx);
  ctx.output = act(Shape{B, T, opt_.shape.n_embd});
  ops_.embedding_forward(ctx.output, ctx.batch->inputs, ctx.params[0], ctx.params[1]);
}

void GptEmbedding::backward_with(UnitContext& ctx, WeightGrads& wg) {
  require_params(ctx, true);
  ZERO_REQUIRE(ctx.grad_output, "gpt unit " + name_ + ": backward without grad_output");
  (void)batch_dims(ctx);
  wg.embedding(0, 1, ctx.grad_output, ctx.batch->inputs);
  ctx.grad_input = Tensor();
}

// ---- head: ln_f, logits = x wte^T, cross-entropy --------------------------------------------

namespace {
struct HeadState final : UnitState {
  Tensor lnf, mean, rstd, logits;
};
}  // namespace

void GptHead::forward(UnitContext& ctx) {
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

void GptHead::backward_with(UnitContext& ctx, WeightGrads& wg) {
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

}  // namespace zero::models
