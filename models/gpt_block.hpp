// The GPT's transformer block, x + attn(ln_1(x)), then + mlp(ln_2(.)), written once for any
// tensor-parallel degree T (docs/tensor-parallel.md): make_gpt's block is the degree-1 case, the
// tensor-parallel block (gpt_tensor_parallel.hpp) the same body over a tensor group of T ranks.
//
// Rank t of T holds the parameters add_tensor_parallel_block_params lists (at T = 1: the whole
// block, make_gpt's table): ln_1, ln_2 and the row-split matrices' biases whole; c_attn's
// columns of heads [t H/T, (t+1) H/T) of q, k and v (so attention runs on H/T heads as is);
// attn.c_proj's matching input rows; c_fc's columns [t, t+1) 4C/T and mlp.c_proj's matching
// rows. Each column-split / row-split pair is bracketed by Megatron's f (identity forward,
// all-reduce of the input gradient backward) and g (all-reduce of the partial output forward,
// identity backward); the row-split biases are added on tensor rank 0 only, so they enter the
// sum once. At T = 1 the all-reduces are no-ops and rank 0 adds the biases: the same ops in the
// same order as the unsplit block always had, so make_gpt's results are bitwise unchanged.
//
// Sequence parallel (GptOptions::sequence_parallel, degree > 1; gpt_tensor_parallel.hpp): the
// input, the output and the LayerNorm / residual regions are this rank's token shard
// [B, T/P, C]; f is an all-gather of the LayerNorm's output (backward: reduce-scatter), g a
// reduce-scatter (backward: all-gather); ln_1's and ln_2's gradients are all-reduced over the
// group inside backward (GptUnit::replicated_grads), so they come out whole and alike. State
// keeps the gathered LayerNorm outputs (the column-split matmuls' weight gradients read them).
//
// Parameter order (ctx.params / ctx.grads): ln_1.w, ln_1.b, c_attn.w, c_attn.b, attn c_proj.w,
// c_proj.b, ln_2.w, ln_2.b, c_fc.w, c_fc.b, mlp c_proj.w, c_proj.b.
//
// Split backward: the four matmuls' weight and bias gradients go to W; backward_input does their
// input gradients, attention, GELU, both LayerNorms (weights and biases too), the residuals and
// the backward all-reduces. Activation checkpointing recomputes the forward in backward (with its
// all-reduces, T > 1). Both are bitwise the joint, stored backward.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/gpt_unit.hpp"
#include "models/split_backward.hpp"

namespace zero::models {

class GptBlock : public SplitBackward<GptUnit> {
 public:
  // `group` of size T must divide the heads (checked); ids: the 12 parameters above.
  GptBlock(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o, TensorGroup group);
  bool checkpointable() const noexcept override { return true; }
  void forward(UnitContext& ctx) override;

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override;

 private:
  struct State;
  Tensor run_forward(const UnitContext& ctx, State& s);
};

}  // namespace zero::models
