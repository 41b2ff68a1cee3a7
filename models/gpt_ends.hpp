// The GPT's two ends (models/gpt.hpp): the embedding Unit (token + position) and the head Unit
// (final LayerNorm, LM head tied to the token embedding, cross-entropy loss).
//
// Embedding: out[b,t] = wte[tokens[b,t]] + wpe[t]. Parameter order: wte, wpe.
//   Split backward: nothing flows to an earlier Unit, so the whole scatter-add into wte and wpe
//   is weight gradient: backward_input only keeps grad_output (and the token ids) for W.
// Head: logits = ln_f(x) wte^T, loss = mean cross-entropy over counted targets. Parameter order:
//   ln_f.w, ln_f.b, wte (tied). Sets ctx.loss ([1], fp32; fp64 with fp64 activations) and
//   ctx.output (the logits [B,T,V], for evaluation).
//   Split backward: the LM head's weight gradient (into the tied wte) goes to W, which keeps the
//   logits' gradient and ln_f's output; backward_input does the cross-entropy, the head's input
//   gradient and ln_f (with its weight and bias gradients).
//
// Vocabulary-parallel (a TensorGroup of T > 1 ranks; Megatron's VocabParallelEmbedding and
// parallel cross-entropy, docs/tensor-parallel.md): rank t holds wte rows [t V/T, (t+1) V/T).
//   Embedding: the rank looks up the tokens in its range (0 for the others), rank 0 adds wpe,
//     one all-reduce (sum) gives the whole embedding on every rank. Backward: the whole output
//     gradient is on every rank; it adds into its own wte rows, and wpe's gradient whole.
//   Head: ln_f replicated; local logits [B,T,V/T] = ln_f(x) wte_shard^T; the loss from the rows'
//     max (all-reduce max) and their sum of exp and target logit (one all-reduce sum of both),
//     never gathering the logits; ctx.output is the local logits [B,T,V/T]. Backward: the
//     shard's softmax minus one-hot, its partial input gradient summed over the group (f's
//     backward) before ln_f's backward; the wte shard's gradient from the local logits' one.
//   Per micro-batch: all-reduces of B T C (embedding), B T (max) and 2 B T (sums) elements in
//   forward, B T C in backward.
// Sequence parallel (GptOptions::sequence_parallel, T > 1): the embedding reduce-scatters
//   instead of all-reducing (its output is this rank's token shard [B, S/T, C]; the batch's
//   length S must be divisible by T, else a clear error) and all-gathers the output gradient in
//   backward; the head runs ln_f on its input shard, all-gathers ln_f's output for the logits,
//   and reduce-scatters ln_f's output gradient in backward, all-reducing ln_f's weight and bias
//   gradients (GptUnit::replicated_grads).
// At T = 1 both run make_gpt's ops exactly (bitwise the unsplit ends).
#pragma once

#include <string>
#include <vector>

#include "models/gpt_unit.hpp"
#include "models/split_backward.hpp"

namespace zero::models {

// The ends' shared part: this rank's first vocabulary entry.
class GptEnd : public SplitBackward<GptUnit> {
 public:
  // The group's size must divide the vocabulary (checked).
  GptEnd(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o, TensorGroup group);

 protected:
  int64_t vocab_begin() const noexcept {
    return static_cast<int64_t>(group_.rank()) * (opt_.shape.vocab_size / group_.size());
  }
};

class GptEmbedding final : public GptEnd {
 public:
  using GptEnd::GptEnd;
  void forward(UnitContext& ctx) override;

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override;
};

class GptHead final : public GptEnd {
 public:
  using GptEnd::GptEnd;
  void forward(UnitContext& ctx) override;

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override;

 private:
  // ln_f's output [B, T, C] as the logits' product reads it: `lnf` itself, or (sequence
  // parallel) the all-gather of the kept shard `lnf`.
  Tensor whole_lnf(const Tensor& lnf, int64_t B, int64_t T);
};

}  // namespace zero::models
