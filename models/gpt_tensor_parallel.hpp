// Tensor parallelism for the GPT (Megatron-LM's intra-layer model parallelism, Shoeybi et al.
// 2019; docs/tensor-parallel.md): the whole model at one tensor rank, its transformer blocks'
// matrices split across the T ranks of a tensor communicator, so no rank holds a whole block.
// The block's body is GptBlock (gpt_block.hpp), whose degree-1 case is make_gpt's block.
// Rank t of T holds:
//
//   ln_1, ln_2 (weight, bias)       whole (replicated)
//   attn.c_attn.weight [C, 3C/T]    columns by whole heads: heads [t H/T, (t+1) H/T) of q, of k
//   attn.c_attn.bias   [3C/T]       and of v (each of q | k | v cut alike), so attention runs on
//                                   H/T heads locally
//   attn.c_proj.weight [C/T, C]     the matching input rows (those heads' channels)
//   attn.c_proj.bias   [C]          whole (replicated)
//   mlp.c_fc.weight    [C, 4C/T]    columns [t, t+1) * 4C/T
//   mlp.c_fc.bias      [4C/T]       the same columns
//   mlp.c_proj.weight  [4C/T, C]    the matching input rows
//   mlp.c_proj.bias    [C]          whole (replicated)
//
// Each column-split / row-split pair (attention; MLP) is bracketed by Megatron's operators:
// f before it (identity forward; backward all-reduces the partial input gradient) and g after
// it (forward all-reduces the partial output; identity backward). So one all-reduce of
// [B, T, C] activations per pair in forward and one in backward: two each per block. The
// replicated bias of a row-split matrix enters the all-reduced sum once (tensor rank 0 adds it
// to its partial product; Ops has no broadcast bias-add), and every rank computes its gradient
// whole, as the replicated LayerNorms' gradients: from replicated tensors, so they are equal on
// every rank of the group and need no sum (with sequence parallelism the LayerNorms' need one:
// below).
//
// Parameters keep Hugging Face GPT-2's names; shapes are the shards', and ParamSpec::slice says
// which part of the whole parameter each is (c_attn: dimension 1 as 3 blocks q | k | v; its bias
// dimension 0 as 3 blocks; c_fc: dimension 1 (bias: 0) as 1 block; the c_proj weights:
// dimension 0 as 1 block), so init_param_values gives a shard exactly the unsplit model's values
// for the same seed, and a checkpoint re-slicer can map shards between degrees.
//
// Streams. All-reduces run on the tensor communicator's stream: each starts after the compute
// stream's point where its input is complete (an event recorded there is its `after`), and the
// compute stream waits for its completion (Work::chain) before reading the result; the host
// never waits. Every rank of the tensor group must run the same Units in the same order (their
// collectives pair up by order). Checkpointed blocks repeat their forward all-reduces when they
// recompute.
//
// Sequence parallelism (GptOptions::sequence_parallel; Korthikanti et al. 2022; degree > 1 only,
// degree 1 ignores it). Between the blocks, and inside them in the replicated regions (the
// LayerNorms, the residual adds; the model has no dropout), each rank holds 1/T of the
// micro-batch's tokens: a [B, T_seq/T, C] tensor that is rows [t B T_seq/T, (t+1) B T_seq/T) of
// the micro-batch's [B T_seq, C] token rows (with B = 1 exactly the sequence positions
// [t T_seq/T, (t+1) T_seq/T); docs/tensor-parallel.md, "Sequence parallelism", says why this
// layout). f becomes an all-gather of the LayerNorm's shard output before each column-split
// matmul (backward: a reduce-scatter of the partial input gradient), g a reduce-scatter of the
// row-split matmul's partial output (backward: an all-gather of the shards' output gradient).
// The embedding reduce-scatters its output (backward: all-gathers the gradient); the head runs
// ln_f on the shard and all-gathers its output before the vocabulary-parallel logits (backward:
// reduce-scatter). The replicated LayerNorms' weights and biases (ln_1, ln_2, ln_f) then see
// only their shard's rows: each Unit all-reduces those gradients (one [2, C] buffer per
// LayerNorm) inside its backward, so every tensor rank ends with the whole replicated gradient,
// alike, and the engine is unchanged. The row-split matmuls' biases and wpe need no sum: their
// gradients come from the all-gathered output gradients, whole. seq_len (and each batch's
// length) must be divisible by the degree (check_sequence_parallel; the embedding checks the
// batch). The same ring volume per block as without (a reduce-scatter plus an all-gather move
// what one all-reduce moves), plus the LayerNorm gradients' small all-reduces.
//
// Supports split backward (B/W, as the unsplit block: LayerNorm gradients in B, the four
// matmuls' weight and bias gradients in W; the backward all-reduces are in B) and activation
// checkpointing, both bitwise equal to the joint, stored backward.
//
// Types: at degree > 1 activations fp32, bf16 or fp16 (the communicator sums those; fp64 is
// refused), parameters fp32, bf16 or fp16.
// Thread-safety: as any Unit (one thread at a time); the tensor communicator must not be used
// by another thread while the Unit runs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.hpp"
#include "core/unit.hpp"
#include "models/gpt.hpp"
#include "models/gpt_block.hpp"

namespace zero::models {

// Throws zero::Error unless `degree` >= 1 divides the heads (and so the MLP's 4 n_embd columns)
// and the vocabulary, naming n_head, n_embd or vocab_size, the degree and the config keys
// (zero_train.model.n_head / vocab_size, zero_train.parallel.tensor). For --validate as well as
// for make_*.
void check_tensor_parallel(const GptShape& shape, int degree);

// check_tensor_parallel, and that the degree divides seq_len (sequence parallelism keeps 1/degree
// of each sequence per rank), naming zero_train.model.seq_len and zero_train.parallel.tensor.
void check_sequence_parallel(const GptShape& shape, int degree);

// Appends the 12 parameters of block `layer` for tensor rank `rank` of `degree` to `params`
// (names, shard shapes, slice metadata, initialisation as make_gpt's) and returns their ids in
// the block's order (ln_1.w, ln_1.b, c_attn.w, c_attn.b, attn c_proj.w, c_proj.b, ln_2.w,
// ln_2.b, c_fc.w, c_fc.b, mlp c_proj.w, c_proj.b). Degree 1 gives the unsplit block's table
// (slices of degree 1 and replicated markers). Needs no communicator: a re-slicer can list any
// rank's table.
std::vector<int> add_tensor_parallel_block_params(std::vector<ParamSpec>& params,
                                                  const GptOptions& options, int layer, int rank,
                                                  int degree);

// The whole model's parameter table for tensor rank `rank` of `degree`, without a communicator
// (a re-slicer can list any rank's): make_gpt's names and order (wte, wpe, the n_layer blocks as
// add_tensor_parallel_block_params lists them, ln_f), each with its slice metadata. wte [V, C]
// is sliced by vocabulary rows (dimension 0: rows [rank, rank + 1) V / degree); wpe and ln_f are
// replicated. At degree 1 it is make_gpt's table (names, shapes, types, initialisation, decay)
// with degree-1 slice markers.
std::vector<ParamSpec> gpt_tensor_parallel_params(const GptOptions& options, int rank, int degree);

// The whole GPT at tensor rank tensor.rank() of tensor.size(): make_gpt's Units (embedding, the
// n_layer blocks, head) over gpt_tensor_parallel_params's table, the blocks split over `tensor`
// (GptBlock), the embedding and the tied head split by vocabulary (gpt_ends.hpp: Megatron's
// vocabulary-parallel embedding and cross-entropy; the head's ctx.output is this rank's logits
// [B, T, V/T], ctx.loss the whole loss, alike on every rank). Degree 1 is make_gpt op for op:
// bitwise the same results. Checks the
// options as make_gpt does and the degree as check_tensor_parallel; at degree > 1 activations
// must be fp32, bf16 or fp16 and `tensor` of the ops' device kind. `ops` and `tensor` must
// outlive the Model; every rank of the tensor group must run its Units in the same order.
Model make_gpt_tensor_parallel(const GptOptions& options, Ops& ops, coll::Communicator& tensor);

// What one tensor rank hands to the tensor group's all-reduces (docs/tensor-parallel.md,
// "Communication"): `calls` all-reduces carrying `bytes` of payload (the buffers' bytes). A ring
// all-reduce sends 2 (T-1)/T of its payload per rank and receives as much: wire_bytes().
// Sequence parallel: `gs_calls` all-gathers and reduce-scatters, `gs_bytes` their payload (the
// whole, gathered buffer's bytes per call), of which a ring sends (T-1)/T per rank.
struct TensorParallelTraffic {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t gs_calls = 0;
  int64_t gs_bytes = 0;
  int degree = 1;
  double wire_bytes() const noexcept {
    return degree > 1 ? (degree - 1.0) / degree * (2.0 * double(bytes) + double(gs_bytes)) : 0.0;
  }
  friend bool operator==(const TensorParallelTraffic&, const TensorParallelTraffic&) = default;
};

// The traffic of one micro-batch of `micro_batch` sequences of `seq_len` tokens through
// make_gpt_tensor_parallel's model at `degree`, forward and backward, with `checkpointed_blocks`
// of the blocks recomputing their forward (activation checkpointing). With a = b s elements per
// [b, s] row set, C = n_embd and A the activation type's bytes, per micro-batch:
//   each block   4 all-reduces of a C A bytes (2 forward, 2 backward), +2 when checkpointed
//   embedding    1 of a C A (forward)
//   head         a 4 (the rows' max, fp32) and 2 a 4 (sum of exp and target logit) forward,
//                a C A (ln_f's input gradient) backward
// so 4 L + 4 calls, (4 L + 2) a C A + 12 a bytes; Megatron's 4 (all-reduces per layer) x 2 (T-1)/T
// x b s h bytes per layer is wire_bytes() of the blocks' part. Degree 1: nothing. Per training
// step multiply by the micro-batches (gradient accumulation steps). Pure: no communicator.
// With options.sequence_parallel (G = the gradients' bytes, `grad_type`, default the parameters'):
//   each block   4 all-gathers/reduce-scatters of a C A forward, 4 backward and 2 all-gathers
//                re-gathering ln_1's and ln_2's kept output shards in backward (Megatron-SP);
//                checkpointed, 4 in the recompute instead of the 2; 2 all-reduces of 2 C G
//                (ln_1's and ln_2's gradients)
//   embedding    1 reduce-scatter forward, 1 all-gather backward, of a C A
//   head         1 all-gather (ln_f's output) forward, 1 re-gather and 1 reduce-scatter
//                backward, of a C A; the same max and sums all-reduces; 1 all-reduce of 2 C G
//                (ln_f's gradients)
// so gs_calls = 10 L + 5 + 2 per checkpointed block of a C A each, and 2 L + 3 all-reduces of
// (2 L + 1) 2 C G + 12 a bytes: per block 5/4 of the ring volume without (a reduce-scatter and
// an all-gather move what one all-reduce moves; the re-gathers are the quarter more that buys
// storing only 1/T of every activation) plus the LayerNorms' 4 C G.
TensorParallelTraffic gpt_tensor_parallel_traffic(const GptOptions& options, int degree,
                                                  int64_t micro_batch, int64_t seq_len,
                                                  int checkpointed_blocks = 0,
                                                  std::optional<ScalarType> grad_type = std::nullopt);

// What the Units of `model` (make_gpt or make_gpt_tensor_parallel) have handed to tensor
// all-reduces so far, summed over its Units: the measured counterpart of the formula above.
// Counters only grow (one Model's lifetime); degree from the model's parameter slices.
TensorParallelTraffic measured_tensor_parallel_traffic(const Model& model);

// Block `name` (e.g. "h.3") of tensor rank tensor.rank() of tensor.size(), over the parameters
// `ids` (from add_tensor_parallel_block_params with the same rank and degree): GptBlock
// (gpt_block.hpp) over the group of `tensor`. `ops` and `tensor` must outlive it; `tensor` is
// the grid's tensor communicator (collectives/grid.hpp) of the same device kind as `ops`.
// all_reduce_bytes() / all_reduce_calls() count the payload it has handed to all-reduces (per
// call B T C activation elements; a ring's wire traffic is 2 (T-1)/T of it per rank).
class TensorParallelBlock final : public GptBlock {
 public:
  TensorParallelBlock(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o,
                      coll::Communicator& tensor);
};

}  // namespace zero::models
