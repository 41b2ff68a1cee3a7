// Tensor parallelism for the GPT (Megatron-LM's intra-layer model parallelism, Shoeybi et al.
// 2019; docs/tensor-parallel.md): a transformer block whose matrices are split across the T
// ranks of a tensor communicator, so no rank holds the whole block. Rank t of T holds:
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
// every rank of the group and need no sum (that changes with sequence parallelism).
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
// Supports split backward (B/W, as the unsplit BlockUnit: LayerNorm gradients in B, the four
// matmuls' weight and bias gradients in W; the backward all-reduces are in B) and activation
// checkpointing, both bitwise equal to the joint, stored backward.
//
// Types: activations fp32, bf16 or fp16 (the communicator sums those; fp64 is refused).
// Thread-safety: as any Unit (one thread at a time); the tensor communicator must not be used
// by another thread while the Unit runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.hpp"
#include "core/unit.hpp"
#include "models/gpt.hpp"
#include "models/split_backward.hpp"

namespace zero::models {

// Throws zero::Error unless `degree` >= 1 divides the heads (and so the MLP's 4 n_embd columns),
// naming n_head, n_embd, the degree and the config keys (zero_train.model.n_head,
// zero_train.parallel.tensor). For --validate as well as for make_*.
void check_tensor_parallel(const GptShape& shape, int degree);

// Appends the 12 parameters of block `layer` for tensor rank `rank` of `degree` to `params`
// (names, shard shapes, slice metadata, initialisation as make_gpt's) and returns their ids in
// the block's order (ln_1.w, ln_1.b, c_attn.w, c_attn.b, attn c_proj.w, c_proj.b, ln_2.w,
// ln_2.b, c_fc.w, c_fc.b, mlp c_proj.w, c_proj.b). Degree 1 gives the unsplit block's table
// (slices of degree 1 and replicated markers). Needs no communicator: a re-slicer can list any
// rank's table.
std::vector<int> add_tensor_parallel_block_params(std::vector<ParamSpec>& params,
                                                  const GptOptions& options, int layer, int rank,
                                                  int degree);

class TensorParallelBlockBase : public Unit {
 public:
  const std::string& name() const noexcept override { return name_; }
  std::span<const int> param_ids() const noexcept override { return ids_; }

 protected:
  TensorParallelBlockBase(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o,
                          coll::Communicator& tensor);

  std::string name_;
  std::vector<int> ids_;
  Ops& ops_;
  GptOptions opt_;
  coll::Communicator& tensor_;
};

// Block `name` (e.g. "h.3") of tensor rank tensor.rank() of tensor.size(), over the parameters
// `ids` (from add_tensor_parallel_block_params with the same rank and degree). `ops` and `tensor`
// must outlive it; `tensor` is the grid's tensor communicator (collectives/grid.hpp) of the
// same device kind as `ops`.
class TensorParallelBlock final : public SplitBackward<TensorParallelBlockBase> {
 public:
  TensorParallelBlock(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o,
                      coll::Communicator& tensor);
  bool checkpointable() const noexcept override { return true; }
  void forward(UnitContext& ctx) override;

  // Bytes this Unit has handed to all-reduces so far (payload per call: B T C activation
  // elements; the wire traffic of a ring is 2 (T-1)/T of it per rank). For the accounting.
  int64_t all_reduce_bytes() const noexcept { return all_reduce_bytes_; }
  int64_t all_reduce_calls() const noexcept { return all_reduce_calls_; }

 protected:
  void backward_with(UnitContext& ctx, WeightGrads& wg) override;

 private:
  struct State;
  Tensor run_forward(const UnitContext& ctx, State& s);
  // Sums `t` over the tensor group in place: after the compute stream's current point, and the
  // compute stream waits for it. Returns at once.
  void all_reduce(const Tensor& t);

  std::unique_ptr<Event> ready_;  // the compute stream's point each all-reduce starts after
  int64_t all_reduce_bytes_ = 0, all_reduce_calls_ = 0;
};

}  // namespace zero::models
