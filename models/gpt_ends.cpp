#include "models/gpt_ends.hpp"

#include <memory>
#include <utility>

namespace zero::models {

GptEnd::GptEnd(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o, TensorGroup group)
    : SplitBackward(std::move(name), std::move(ids), ops, o, std::move(group)) {
  ZERO_REQUIRE(opt_.shape.vocab_size % group_.size() == 0,
               "gpt unit " + name_ + ": vocab_size " + std::to_string(opt_.shape.vocab_size) +
                   " is not divisible by the tensor-parallel degree " + std::to_string(group_.size()));
}

// ---- embedding: tokens -> wte[token] + wpe[position] ---------------------------------------

void GptEmbedding::forward(UnitContext& ctx) {
  require_params(ctx, false);
  const auto [B, T] = batch_dims(ctx);
  ctx.output = act(Shape{B, T, opt_.shape.n_embd});
  if (group_.size() == 1) {  // the whole table: make_gpt's op
    ops_.embedding_forward(ctx.output, ctx.batch->inputs, ctx.params[0], ctx.params[1]);
    return;
  }
  // Each rank looks up the tokens of its vocabulary rows (0 for the others), tensor rank 0 adds
  // the positions, and the sum over the group is the whole embedding on every rank (exactly
  // wte[token] + wpe[t] in fp32: one rank's term plus zeros).
  ops_.embedding_forward_shard(ctx.output, ctx.batch->inputs, ctx.params[0],
                               group_.rank() == 0 ? ctx.params[1] : Tensor(), vocab_begin(),
                               opt_.shape.vocab_size);
  all_reduce(ctx.output);
}

void GptEmbedding::backward_with(UnitContext& ctx, WeightGrads& wg) {
  require_params(ctx, true);
  ZERO_REQUIRE(ctx.grad_output, "gpt unit " + name_ + ": backward without grad_output");
  (void)batch_dims(ctx);
  // Every rank has the whole output gradient (the first block's input gradient): it adds into
  // its own wte rows only, and computes wpe's (replicated) gradient whole, alike on every rank.
  if (group_.size() == 1)
    wg.embedding(0, 1, ctx.grad_output, ctx.batch->inputs);
  else
    wg.embedding_shard(0, 1, ctx.grad_output, ctx.batch->inputs, vocab_begin(), opt_.shape.vocab_size);
  ctx.grad_input = Tensor();
}

// ---- head: ln_f, logits = x wte^T, cross-entropy --------------------------------------------

namespace {
struct HeadState final : UnitState {
  Tensor lnf, mean, rstd, logits;
  Tensor rowmax, sums;  // vocabulary-parallel: the whole rows' max and [sum exp; target logit]
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
  s->logits = act(Shape{B, T, V / group_.size()});  // this rank's vocabulary columns
  ops_.linear_t_forward(s->logits, s->lnf, ctx.params[2]);
  Tensor losses = stats(Shape{B * T});
  ctx.loss = stats(Shape{1});
  if (group_.size() == 1) {
    ops_.cross_entropy_forward(ctx.loss, losses, s->logits, targets);
  } else {
    // Megatron's parallel cross-entropy: the rows' max, then their sum of exp and the target's
    // logit, each combined over the group; the logits never leave their rank.
    s->rowmax = stats(Shape{B * T});
    ops_.cross_entropy_shard_max(s->rowmax, s->logits);
    all_reduce(s->rowmax, coll::ReduceOp::max);
    s->sums = stats(Shape{2, B * T});
    ops_.cross_entropy_shard_sums(s->sums, s->logits, s->rowmax, targets, vocab_begin(), V);
    all_reduce(s->sums);
    ops_.cross_entropy_shard_loss(ctx.loss, losses, s->rowmax, s->sums, targets);
  }
  ctx.output = s->logits;
  ctx.state = std::move(s);
}

void GptHead::backward_with(UnitContext& ctx, WeightGrads& wg) {
  require_params(ctx, true);
  auto* s = dynamic_cast<HeadState*>(ctx.state.get());
  ZERO_REQUIRE(s != nullptr, "gpt unit " + name_ + ": backward without its forward");
  const Tensor& x = ctx.input;
  Tensor dlogits = act(s->logits.shape());
  if (group_.size() == 1)
    ops_.cross_entropy_backward(dlogits, s->logits, ctx.batch->targets, ctx.grad_scale);
  else
    ops_.cross_entropy_shard_backward(dlogits, s->logits, s->rowmax, s->sums, ctx.batch->targets,
                                      vocab_begin(), opt_.shape.vocab_size, ctx.grad_scale);
  Tensor dlnf = act(x.shape());
  wg.linear_t(dlnf, 2, dlogits, s->lnf, ctx.params[2]);
  dlogits = Tensor();
  // f's backward: this rank's vocabulary columns gave part of ln_f's output gradient. (Its wte
  // gradient, in W, needs no sum: the rank's rows from its own columns.)
  all_reduce(dlnf);
  Tensor dx = act(x.shape());
  ops_.layernorm_backward(dx, ctx.grads[0], ctx.grads[1], dlnf, x, ctx.params[0], s->mean, s->rstd);
  ctx.grad_input = dx;
}

}  // namespace zero::models
