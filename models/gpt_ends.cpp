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
  const int64_t P = group_.size();
  if (seq_par())
    ZERO_REQUIRE(T % P == 0, "gpt unit " + name_ + ": sequence parallelism splits the sequence of " +
                                 std::to_string(T) + " tokens over the tensor group of " + std::to_string(P) +
                                 ", which does not divide it: pick zero_train.model.seq_len (and the batches' "
                                 "length) divisible by zero_train.parallel.tensor");
  Tensor whole = act(Shape{B, T, opt_.shape.n_embd});
  if (group_.size() == 1) {  // the whole table: make_gpt's op
    ops_.embedding_forward(whole, ctx.batch->inputs, ctx.params[0], ctx.params[1]);
    ctx.output = whole;
    return;
  }
  // Each rank looks up the tokens of its vocabulary rows (0 for the others), tensor rank 0 adds
  // the positions, and the sum over the group is the whole embedding (exactly wte[token] +
  // wpe[t] in fp32: one rank's term plus zeros): all-reduced to every rank, or (sequence
  // parallel) reduce-scattered, each rank keeping its shard [B, T/P, C].
  ops_.embedding_forward_shard(whole, ctx.batch->inputs, ctx.params[0],
                               group_.rank() == 0 ? ctx.params[1] : Tensor(), vocab_begin(),
                               opt_.shape.vocab_size);
  if (!seq_par()) {
    all_reduce(whole);
    ctx.output = whole;
    return;
  }
  ctx.output = act(Shape{B, T / P, opt_.shape.n_embd});
  reduce_scatter(whole, ctx.output);
}

void GptEmbedding::backward_with(UnitContext& ctx, WeightGrads& wg) {
  require_params(ctx, true);
  ZERO_REQUIRE(ctx.grad_output, "gpt unit " + name_ + ": backward without grad_output");
  const auto [B, T] = batch_dims(ctx);
  // Every rank has the whole output gradient (the first block's input gradient; sequence
  // parallel: all-gathered from the shards, the reduce-scatter's conjugate): it adds into its own
  // wte rows only, and computes wpe's (replicated) gradient whole, alike on every rank.
  Tensor dout = ctx.grad_output;
  if (seq_par()) {
    dout = act(Shape{B, T, opt_.shape.n_embd});
    all_gather(ctx.grad_output, dout);
  }
  if (group_.size() == 1)
    wg.embedding(0, 1, dout, ctx.batch->inputs);
  else
    wg.embedding_shard(0, 1, dout, ctx.batch->inputs, vocab_begin(), opt_.shape.vocab_size);
  ctx.grad_input = Tensor();
}

// ---- head: ln_f, logits = x wte^T, cross-entropy --------------------------------------------

namespace {
struct HeadState final : UnitState {
  Tensor lnf, mean, rstd, logits;  // sequence parallel: lnf is this rank's token shard
  Tensor rowmax, sums;  // vocabulary-parallel: the whole rows' max and [sum exp; target logit]
};
}  // namespace

Tensor GptHead::whole_lnf(const Tensor& lnf, int64_t B, int64_t T) {
  if (!seq_par()) return lnf;
  Tensor full = act(Shape{B, T, opt_.shape.n_embd});
  all_gather(lnf, full);
  return full;
}

void GptHead::forward(UnitContext& ctx) {
  require_params(ctx, false);
  const auto [B, T] = batch_dims(ctx);
  const Tensor& targets = ctx.batch->targets;
  ZERO_REQUIRE(targets && targets.type() == ScalarType::i32 && targets.numel() == B * T,
               "gpt: the batch targets must be int32 [B, T] like the inputs, got " + targets.describe());
  const Tensor& x = ctx.input;
  const int64_t C = opt_.shape.n_embd, V = opt_.shape.vocab_size;
  auto s = std::make_unique<HeadState>();
  if (!seq_par()) {
    s->lnf = act(Shape{B, T, C});
    s->mean = stats(Shape{B * T});
    s->rstd = stats(Shape{B * T});
    ops_.layernorm_forward(s->lnf, s->mean, s->rstd, x, ctx.params[0], ctx.params[1]);
  } else {
    // ln_f on this rank's shard [B, T/P, C], then the all-gather of its output for the
    // vocabulary-parallel logits (every rank scores every position against its vocabulary rows).
    // Only the shard is kept: backward gathers it again (as the blocks do, gpt_block.cpp).
    const int64_t rows = B * T / group_.size();
    ZERO_REQUIRE(x.numel() == rows * C, "gpt unit " + name_ + ": the sequence-parallel input must be [" +
                                            std::to_string(B) + ", " + std::to_string(T / group_.size()) +
                                            ", " + std::to_string(C) + "], got " + x.describe());
    s->lnf = act(x.shape());
    s->mean = stats(Shape{rows});
    s->rstd = stats(Shape{rows});
    ops_.layernorm_forward(s->lnf, s->mean, s->rstd, x, ctx.params[0], ctx.params[1]);
  }
  s->logits = act(Shape{B, T, V / group_.size()});  // this rank's vocabulary columns
  ops_.linear_t_forward(s->logits, whole_lnf(s->lnf, B, T), ctx.params[2]);
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
  const auto [B, T] = batch_dims(ctx);
  const Tensor lnf = whole_lnf(s->lnf, B, T);  // issued first: it runs while dlogits is computed
  Tensor dlogits = act(s->logits.shape());
  if (group_.size() == 1)
    ops_.cross_entropy_backward(dlogits, s->logits, ctx.batch->targets, ctx.grad_scale);
  else
    ops_.cross_entropy_shard_backward(dlogits, s->logits, s->rowmax, s->sums, ctx.batch->targets,
                                      vocab_begin(), opt_.shape.vocab_size, ctx.grad_scale);
  Tensor dlnf = act(lnf.shape());
  wg.linear_t(dlnf, 2, dlogits, lnf, ctx.params[2]);
  dlogits = Tensor();
  // f's backward: this rank's vocabulary columns gave part of ln_f's output gradient. (Its wte
  // gradient, in W, needs no sum: the rank's rows from its own columns.) Sequence parallel: the
  // sum is reduce-scattered to the shard ln_f ran on, and ln_f's gradients summed over the group.
  Tensor dx = act(x.shape());
  if (!seq_par()) {
    all_reduce(dlnf);
    ops_.layernorm_backward(dx, ctx.grads[0], ctx.grads[1], dlnf, x, ctx.params[0], s->mean, s->rstd);
  } else {
    const Tensor shard = act(x.shape());
    reduce_scatter(dlnf, shard);
    dlnf = Tensor();
    replicated_grads(ctx.grads[0], ctx.grads[1], [&](const Tensor& dw, const Tensor& db) {
      ops_.layernorm_backward(dx, dw, db, shard, x, ctx.params[0], s->mean, s->rstd);
    });
  }
  ctx.grad_input = dx;
}

}  // namespace zero::models
