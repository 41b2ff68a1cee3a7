// The GPT-style decoder (GPT-2 layout) as Units: an embedding Unit (token + position), one Unit
// per pre-LayerNorm transformer block (causal multi-head self-attention and a GELU MLP, each
// with a residual), and a head Unit (final LayerNorm, LM head tied to the token embedding,
// cross-entropy loss). Parameters carry Hugging Face GPT-2's names and shapes (Conv1D weights are
// [in, out]), so checkpoints map one to one:
//   wte.weight [V,C], wpe.weight [T,C],
//   h.{l}.ln_1.{weight,bias} [C], h.{l}.attn.c_attn.{weight [C,3C], bias [3C]},
//   h.{l}.attn.c_proj.{weight [C,C], bias [C]}, h.{l}.ln_2.{weight,bias} [C],
//   h.{l}.mlp.c_fc.{weight [C,4C], bias [4C]}, h.{l}.mlp.c_proj.{weight [4C,C], bias [C]},
//   ln_f.{weight,bias} [C].
// Initialisation as GPT-2: weights N(0, 0.02), the two residual projections (c_proj) scaled by
// 1/sqrt(2 n_layer), biases 0, LayerNorm weights 1. Weight decay on matrices (embeddings
// included), not on biases and LayerNorm parameters.
//
// The Units enqueue on the Ops they were built with; the Model must not outlive it. The head
// Unit sets ctx.loss ([1], fp32 or fp64 with fp64 activations: the mean cross-entropy over counted targets) and ctx.output (the
// logits [B,T,V], for evaluation). Blocks support activation checkpointing.
#pragma once

#include <string>

#include "models/gpt_shape.hpp"
#include "models/ops.hpp"
#include "core/unit.hpp"

namespace zero::models {

struct GptOptions {
  GptShape shape;
  ScalarType param_type = ScalarType::f32;       // storage of parameters (cpu: f32/bf16/f16/f64)
  ScalarType activation_type = ScalarType::f32;  // cpu: f32, bf16, f16 or f64; cuda: f32, bf16 or f16
  // Megatron's sequence parallelism over the tensor group (gpt_tensor_parallel.hpp,
  // docs/tensor-parallel.md "Sequence parallelism"): only make_gpt_tensor_parallel at degree > 1
  // reads it; make_gpt and degree 1 ignore it (there is nothing to split).
  bool sequence_parallel = false;
  // Keep attention's [B, H, T, T] probabilities for backward even where the backend has blocked
  // attention (Ops::blocked_attention; docs/cpu-kernels.md): the path the cuda backend always
  // takes, here for comparisons (bench/cpu_attention, the memory tests; fp32 / fp64 activations on
  // cpu). Off: the blocks keep each row's logsumexp [B, H, T] instead and recompute the
  // probabilities in backward.
  bool attention_probabilities = false;
};

// Checks the shape (positive sizes, heads dividing the hidden size) and the types against the
// ops' backend, then builds the parameter table and the Units.
Model make_gpt(const GptOptions& options, Ops& ops);

// Parameters of a shape, without building it: 12 C^2 + 13 C per block, V C + T C + 2 C else.
int64_t gpt_parameter_count(const GptShape& shape) noexcept;

// Training FLOPs per token, forward and backward (the MFU numerator): 6 N for the matmuls of the
// N non-embedding parameters plus the tied head, and 12 L T C for attention scores and values.
double gpt_flops_per_token(const GptShape& shape) noexcept;

}  // namespace zero::models
