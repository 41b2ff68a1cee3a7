#include "models/gpt_block.hpp"

#include <utility>

namespace zero::models {

// What backward reads of forward; at degree T the shards' widths are C/T (attention) and 4C/T
// (MLP), the rest is whole. Sequence parallel: ln1 and ln2 are this rank's token shards of the
// LayerNorm outputs, and ln1_full / ln2_full their all-gathered whole, which the column-split
// matmuls read. A forward kept for backward drops the whole ones and backward gathers them again
// (Megatron-SP's re-gather: every stored activation of the block is then 1/T of the whole
// model's); a recomputed forward (checkpointed) has them already. Without sequence parallelism
// ln*_full is ln*. Attention keeps either its probabilities `probs` [B, H/T, T, T] or, where the
// backend has blocked attention (Ops::blocked_attention: the cpu backend) and the options do not
// ask for the probabilities (GptOptions::attention_probabilities), only each row's
// logsumexp `lse` [B, H/T, T]; backward then recomputes the probabilities from qkv, lse and the
// attention output atty, which it keeps anyway (c_proj's weight gradient reads it).
struct GptBlock::State final : UnitState {
  Tensor ln1, ln1_full, mean1, rstd1, qkv, probs, lse, atty, res2, ln2, ln2_full, mean2, rstd2, fch, fcg;
};

GptBlock::GptBlock(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o, TensorGroup group)
    : SplitBackward(std::move(name), std::move(ids), ops, o, std::move(group)) {
  ZERO_REQUIRE(ids_.size() == 12, "gpt unit " + name_ + ": expected 12 parameter ids, got " +
                                      std::to_string(ids_.size()));
  ZERO_REQUIRE(opt_.shape.n_head % group_.size() == 0,
               "gpt unit " + name_ + ": n_head " + std::to_string(opt_.shape.n_head) +
                   " is not divisible by the tensor-parallel degree " + std::to_string(group_.size()));
}

void GptBlock::forward(UnitContext& ctx) {
  require_params(ctx, false);
  auto state = std::make_unique<State>();
  ctx.output = run_forward(ctx, *state);
  // Checkpointed: drop the intermediates now (their memory returns once the enqueued ops that
  // use them have run); backward recomputes them (and all-reduces again) from ctx.input, which
  // the engine keeps. Kept: without the gathered LayerNorm outputs (see State).
  if (ctx.checkpoint) return;
  state->ln1_full = Tensor();
  state->ln2_full = Tensor();
  ctx.state = std::move(state);
}

Tensor GptBlock::run_forward(const UnitContext& ctx, State& s) {
  ZERO_REQUIRE(ctx.input && ctx.input.shape().rank() == 3 && ctx.input.shape()[2] == opt_.shape.n_embd,
               "gpt unit " + name_ + ": the input must be [B, T, " + std::to_string(opt_.shape.n_embd) +
                   "], got " + ctx.input.describe());
  const std::vector<Tensor>& w = ctx.params;
  const Tensor& x = ctx.input;
  const int64_t P = group_.size();
  // Sequence parallel: x is this rank's shard [B, T/P, C] (the replicated regions run on it);
  // the column-split / row-split pairs see the whole [B, T, C].
  const bool sp = seq_par();
  const int64_t B = x.shape()[0], Ts = x.shape()[1], C = x.shape()[2];
  const int64_t T = sp ? Ts * P : Ts;
  const int heads = opt_.shape.n_head / static_cast<int>(P);  // this rank's heads
  const int64_t Ca = C / P, F = 4 * C / P;                     // shard widths
  // The row-split matrices' replicated biases enter the sum once, on tensor rank 0.
  const bool adds_bias = group_.rank() == 0;

  // f: identity, or (sequence parallel) the all-gather of the LayerNorm's shard output into
  // `full`, which the column-split matmul reads.
  auto layernorm_f = [&](Tensor& kept, Tensor& full, Tensor& mean, Tensor& rstd, const Tensor& in,
                         const Tensor& lw, const Tensor& lb) {
    mean = stats(Shape{B * Ts});
    rstd = stats(Shape{B * Ts});
    kept = act(Shape{B, Ts, C});
    ops_.layernorm_forward(kept, mean, rstd, in, lw, lb);
    if (!sp) {
      full = kept;
      return;
    }
    full = act(Shape{B, T, C});
    all_gather(kept, full);
  };
  // g: the all-reduce of the partial output, or (sequence parallel) its reduce-scatter to shards.
  auto g = [&](Tensor partial) {
    if (!sp) {
      all_reduce(partial);
      return partial;
    }
    Tensor shard = act(Shape{B, Ts, C});
    reduce_scatter(partial, shard);
    return shard;
  };

  // Attention: ln_1 (whole, or on the shard), f, c_attn on this rank's heads, c_proj partial, g.
  layernorm_f(s.ln1, s.ln1_full, s.mean1, s.rstd1, x, w[0], w[1]);
  s.qkv = act(Shape{B, T, 3 * Ca});
  ops_.linear_forward(s.qkv, s.ln1_full, w[2], w[3]);
  s.atty = act(Shape{B, T, Ca});
  if (ops_.blocked_attention() && !opt_.attention_probabilities) {
    s.lse = stats(Shape{B, heads, T});
    ops_.attention_forward_lse(s.atty, s.lse, s.qkv, heads);
  } else {
    s.probs = act(Shape{B, heads, T, T});
    ops_.attention_forward(s.atty, s.probs, s.qkv, heads);
  }
  Tensor attproj = act(Shape{B, T, C});
  ops_.linear_forward(attproj, s.atty, w[4], adds_bias ? w[5] : Tensor());
  attproj = g(std::move(attproj));
  s.res2 = act(Shape{B, Ts, C});
  ops_.add(s.res2, x, attproj);
  attproj = Tensor();

  // MLP: ln_2, f, c_fc on this rank's 4C/T columns, GELU, c_proj partial, g.
  layernorm_f(s.ln2, s.ln2_full, s.mean2, s.rstd2, s.res2, w[6], w[7]);
  s.fch = act(Shape{B, T, F});
  ops_.linear_forward(s.fch, s.ln2_full, w[8], w[9]);
  s.fcg = act(Shape{B, T, F});
  ops_.gelu_forward(s.fcg, s.fch);
  Tensor fcproj = act(Shape{B, T, C});
  ops_.linear_forward(fcproj, s.fcg, w[10], adds_bias ? w[11] : Tensor());
  fcproj = g(std::move(fcproj));
  Tensor out = act(Shape{B, Ts, C});
  ops_.add(out, s.res2, fcproj);
  return out;
}

void GptBlock::backward_with(UnitContext& ctx, WeightGrads& wg) {
  require_params(ctx, true);
  ZERO_REQUIRE(ctx.grad_output, "gpt unit " + name_ + ": backward without grad_output");
  // Checkpointed: re-materialise. The same ops on the same input and parameters give bitwise
  // the same intermediates (every op is deterministic, the collectives sum in rank order), hence
  // the same gradients.
  std::unique_ptr<State> owned;
  State* s = &saved_or_recomputed(ctx, owned, [&](State& st) { (void)run_forward(ctx, st); });
  const std::vector<Tensor>& w = ctx.params;
  const std::vector<Tensor>& g = ctx.grads;
  const Tensor& x = ctx.input;
  const Tensor& dout = ctx.grad_output;
  const int64_t P = group_.size();
  const bool sp = seq_par();
  const int64_t B = x.shape()[0], Ts = x.shape()[1], C = x.shape()[2];
  const int64_t T = sp ? Ts * P : Ts;
  const int64_t Ca = C / P, F = 4 * C / P;
  const int heads = opt_.shape.n_head / static_cast<int>(P);

  // g's backward: the identity (every rank has the whole gradient), or (sequence parallel) the
  // all-gather of the shards' gradients.
  auto g_back = [&](const Tensor& shard) {
    if (!sp) return shard;
    Tensor full = act(Shape{B, T, C});
    all_gather(shard, full);
    return full;
  };
  // f's backward then the LayerNorm's: the partial input gradient all-reduced, or (sequence
  // parallel) reduce-scattered to the shard, whose LayerNorm gradients are summed over the group.
  auto f_back_layernorm = [&](const Tensor& dx, Tensor partial, const Tensor& in, int lw, const Tensor& mean,
                              const Tensor& rstd) {
    if (!sp) {
      all_reduce(partial);
      ops_.layernorm_backward(dx, g[lw], g[lw + 1], partial, in, w[lw], mean, rstd);
      return;
    }
    const Tensor shard = act(Shape{B, Ts, C});
    reduce_scatter(partial, shard);
    partial = Tensor();
    replicated_grads(g[lw], g[lw + 1], [&](const Tensor& dw, const Tensor& db) {
      ops_.layernorm_backward(dx, dw, db, shard, in, w[lw], mean, rstd);
    });
  };

  // The whole LayerNorm output a column-split matmul's weight gradient reads: kept, or (sequence
  // parallel, not recomputed) gathered again from the kept shard. Issued a branch ahead of its
  // use, so the gather runs while the branch's first products do.
  auto whole = [&](const Tensor& kept, const Tensor& full) {
    if (!sp) return kept;
    if (full) return full;
    Tensor t = act(Shape{B, T, C});
    all_gather(kept, t);
    return t;
  };

  // out = res2 + mlp(res2): the MLP branch first. c_proj's (replicated) bias gradient is the
  // column sum of the whole dout, alike on every rank.
  const Tensor dout_full = g_back(dout);
  const Tensor ln2_full = whole(s->ln2, s->ln2_full);
  Tensor dfcg = act(Shape{B, T, F});
  wg.linear(dfcg, 10, 11, dout_full, s->fcg, w[10]);
  Tensor dfch = act(Shape{B, T, F});
  ops_.gelu_backward(dfch, dfcg, s->fch);
  dfcg = Tensor();
  Tensor dln2 = act(Shape{B, T, C});
  wg.linear(dln2, 8, 9, dfch, ln2_full, w[8]);
  dfch = Tensor();
  // f's backward: this rank's columns gave part of ln_2's output gradient.
  Tensor dres2 = act(Shape{B, Ts, C});
  f_back_layernorm(dres2, std::move(dln2), s->res2, 6, s->mean2, s->rstd2);
  ops_.accumulate(dres2, dout);  // the residual path

  // res2 = x + attn(x): the attention branch, the same way.
  const Tensor dres2_full = g_back(dres2);
  const Tensor ln1_full = whole(s->ln1, s->ln1_full);
  Tensor datty = act(Shape{B, T, Ca});
  wg.linear(datty, 4, 5, dres2_full, s->atty, w[4]);
  Tensor dqkv = act(Shape{B, T, 3 * Ca});
  if (s->lse)
    ops_.attention_backward_lse(dqkv, datty, s->qkv, s->atty, s->lse, heads);
  else
    ops_.attention_backward(dqkv, datty, s->qkv, s->probs, heads);
  datty = Tensor();
  Tensor dln1 = act(Shape{B, T, C});
  wg.linear(dln1, 2, 3, dqkv, ln1_full, w[2]);
  dqkv = Tensor();
  Tensor dx = act(Shape{B, Ts, C});
  f_back_layernorm(dx, std::move(dln1), x, 0, s->mean1, s->rstd1);
  ops_.accumulate(dx, dres2);  // the residual path
  ctx.grad_input = dx;
}

}  // namespace zero::models
