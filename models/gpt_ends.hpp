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
// Both are built over a TensorGroup of degree 1 here: every rank computes them whole
// (replicated ends).
#pragma once

#include <string>
#include <vector>

#include "models/gpt_unit.hpp"
#include "models/split_backward.hpp"

namespace zero::models {

class GptEmbedding final : public SplitBackward<GptUnit> {
 public:
  using SplitBackward::SplitBackward;
  void forward(UnitContext& ctx) override;

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override;
};

class GptHead final : public SplitBackward<GptUnit> {
 public:
  using SplitBackward::SplitBackward;
  void forward(UnitContext& ctx) override;

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override;
};

}  // namespace zero::models
