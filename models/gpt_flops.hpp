// FLOPs of each Unit of a GPT (models/gpt.hpp), per token, forward and backward: the cost the
// pipeline's `flops` stage partition balances (runtime/pipeline/stage_partition.hpp). Pure
// arithmetic on a GptShape; no state, thread-safe. Depends on core only (nothing at all, today).
//
// Conventions (one multiply-add = 2 FLOPs; everything per token of a sequence of seq_len):
//   - a matmul with a [k, n] weight: 2 k n forward; backward computes the input gradient and the
//     weight gradient, each the same size as forward: 4 k n (backward = 2x forward's matmuls);
//   - attention, per block: scores q.k^T over seq_len keys (2 seq_len C) and the weighted sum of
//     values (2 seq_len C) forward, twice that backward; counted over the full seq_len x seq_len
//     square as the standard formula does, although the causal mask leaves half of it unused;
//   - a block's elementwise work (LayerNorm, bias, GELU, softmax, residual: O(C) per token
//     against O(C^2) for its matmuls) is left out, as in the standard formula; elementwise work
//     is counted only where a Unit has no matmul (the embedding: the token + position add, C
//     forward; the scatter-add of the gradient into both tables, 2C backward) and for the
//     cross-entropy, which scales with the vocabulary: 3 FLOPs per logit forward (subtract the
//     maximum, exponentiate, sum) and 2 backward (normalise, subtract the target's one-hot);
//   - activation checkpointing's recomputation is not included: a checkpointed block's backward
//     costs its forward once more (add UnitFlops::forward to it if the balance should see that).
// A block's forward + backward, 72 C^2 + 12 seq_len C per token, is therefore 6 x its matmul
// parameters (12 C^2) plus the attention term: the per-layer count of Narayanan et al., "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21; 24 s h^2 +
// 4 s^2 h per sequence forward, three times that with backward), and of the PaLM paper's
// appendix B (6N + 12 L H Q T). models::gpt_flops_per_token (the MFU numerator) uses the same
// terms for the whole model; the sum over these Units adds only the embedding and cross-entropy.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt_shape.hpp"

namespace zero::models {

struct UnitFlops {
  int64_t forward = 0;
  int64_t backward = 0;
  int64_t total() const noexcept { return forward + backward; }
  friend bool operator==(const UnitFlops&, const UnitFlops&) = default;
};

// The embedding Unit (token + position lookup).
UnitFlops gpt_embedding_flops(const GptShape& shape) noexcept;
// One transformer block: QKV (C x 3C), attention scores and values over seq_len positions, the
// attention projection (C x C), the MLP (C x 4C, 4C x C): 24 C^2 + 4 seq_len C forward.
UnitFlops gpt_block_flops(const GptShape& shape, int seq_len) noexcept;
// The head Unit: final LayerNorm (not counted), the LM head matmul (C x V), the cross-entropy.
UnitFlops gpt_head_flops(const GptShape& shape) noexcept;

// Every Unit of make_gpt(shape) in Unit order: the embedding, n_layer blocks, the head. seq_len
// is the length of the sequences trained on (usually shape.seq_len; shorter ones cost less
// attention). Throws zero::Error when seq_len is not in [1, shape.seq_len] or the shape has a
// non-positive size.
std::vector<UnitFlops> gpt_unit_flops(const GptShape& shape, int seq_len);

}  // namespace zero::models
