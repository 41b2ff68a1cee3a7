// What the GPT's Units share (models/gpt.hpp; internal to models/): their name and parameter ids,
// the Ops they enqueue on, the model's options, the tensor group they are split over (degree 1
// for make_gpt), and helpers for activations and argument checks. The Units themselves are in
// gpt_block.hpp (the transformer block) and gpt_ends.hpp (embedding and head).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/unit.hpp"
#include "models/gpt.hpp"
#include "models/ops.hpp"
#include "models/tensor_group.hpp"

namespace zero::models {

// make_gpt's checks of the options (positive sizes, heads dividing the hidden size, types the
// ops' backend computes in); throws zero::Error naming the value. Defined in gpt.cpp.
void check_gpt_options(const GptOptions& o, const Ops& ops);

class GptUnit : public Unit {
 public:
  GptUnit(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o, TensorGroup group)
      : name_(std::move(name)), ids_(std::move(ids)), ops_(ops), opt_(o), group_(std::move(group)) {}
  const std::string& name() const noexcept override { return name_; }
  std::span<const int> param_ids() const noexcept override { return ids_; }

  // The tensor group's accounting for this Unit (payload bytes and calls of its all-reduces so
  // far; 0 at degree 1).
  const TensorGroup& tensor_group() const noexcept { return group_; }
  int64_t all_reduce_bytes() const noexcept { return group_.all_reduce_bytes(); }
  int64_t all_reduce_calls() const noexcept { return group_.all_reduce_calls(); }
  int64_t gather_scatter_bytes() const noexcept { return group_.gather_scatter_bytes(); }
  int64_t gather_scatter_calls() const noexcept { return group_.gather_scatter_calls(); }

 protected:
  static ScalarType stat_type(ScalarType a) { return a == ScalarType::f64 ? ScalarType::f64 : ScalarType::f32; }
  // An activation of this micro-batch, counted in the ledger.
  Tensor act(Shape s) const { return Tensor::empty(ops_.device(), s, opt_.activation_type, MemCategory::activations); }
  Tensor stats(Shape s) const {
    return Tensor::empty(ops_.device(), s, stat_type(opt_.activation_type), MemCategory::activations);
  }
  static std::pair<int64_t, int64_t> batch_dims(const UnitContext& ctx) {
    ZERO_REQUIRE(ctx.batch && ctx.batch->inputs, "gpt: the Unit was called without a batch");
    const Tensor& tokens = ctx.batch->inputs;
    ZERO_REQUIRE(tokens.type() == ScalarType::i32 && tokens.shape().rank() == 2,
                 "gpt: the batch inputs must be int32 token ids [B, T], got " + tokens.describe());
    return {tokens.shape()[0], tokens.shape()[1]};
  }
  void require_params(const UnitContext& ctx, bool backward) const {
    ZERO_REQUIRE(ctx.params.size() == ids_.size(),
                 "gpt unit " + name_ + ": expected " + std::to_string(ids_.size()) +
                     " parameter tensors, got " + std::to_string(ctx.params.size()));
    if (backward)
      ZERO_REQUIRE(ctx.grads.size() == ids_.size(),
                   "gpt unit " + name_ + ": expected " + std::to_string(ids_.size()) +
                       " gradient tensors, got " + std::to_string(ctx.grads.size()));
  }
  // Megatron's f (backward) and g (forward): sums t over the tensor group in place.
  void all_reduce(const Tensor& t, coll::ReduceOp op = coll::ReduceOp::sum) { group_.all_reduce(ops_, t, op); }

  // Sequence parallelism is on: the option, and a group of more than one rank (at degree 1 the
  // shard is the whole sequence and the Units run make_gpt's ops).
  bool seq_par() const noexcept { return opt_.sequence_parallel && group_.size() > 1; }
  // Sequence parallelism's exchanges (TensorGroup): shard rows <-> the whole micro-batch's rows.
  void all_gather(const Tensor& shard, const Tensor& full) { group_.all_gather(ops_, shard, full); }
  void reduce_scatter(const Tensor& full, const Tensor& shard) { group_.reduce_scatter(ops_, full, shard); }

  // A replicated LayerNorm's weight and bias gradients when each rank saw only its sequence
  // shard: `backward(dw, db)` adds the shard's part into zeroed temporaries (one [2, C] buffer),
  // one all-reduce sums them over the group, and they are added into gw and gb. Every rank then
  // holds the whole gradient, alike, as without sequence parallelism: the engine needs no
  // change. (Added, not summed in place: gw may already hold earlier micro-batches' gradient,
  // which is alike on every rank and must not be counted T times.) The temporaries have the
  // gradients' type when that is fp32 or the activation type; 16-bit gradients under fp32
  // activations (the cpu backend's bf16/fp16) are summed in fp32 and rounded once when added.
  template <class F>
  void replicated_grads(const Tensor& gw, const Tensor& gb, F&& backward) {
    const ScalarType gt = gw.type();
    const int64_t C = gw.numel();
    ZERO_REQUIRE(gb.type() == gt && gb.numel() == C, "gpt unit " + name_ + ": LayerNorm gradients " +
                                                         gw.describe() + " and " + gb.describe() + " differ");
    const ScalarType st = gt == ScalarType::f32 || gt == opt_.activation_type ? gt : opt_.activation_type;
    Tensor tmp = Tensor::empty(ops_.device(), Shape{2, C}, st, MemCategory::gradients);
    ops_.zero(tmp);
    auto* base = static_cast<unsigned char*>(tmp.data());
    const Tensor tw = Tensor::view(base, Shape{C}, st);
    const Tensor tb = Tensor::view(base + static_cast<size_t>(C) * size_of(st), Shape{C}, st);
    backward(tw, tb);
    all_reduce(tmp);
    ops_.accumulate(gw, tw);
    ops_.accumulate(gb, tb);
    TensorGroup::hold(ops_, tmp, tmp);  // the views own nothing: tmp lives until they are read
  }

  std::string name_;
  std::vector<int> ids_;
  Ops& ops_;
  GptOptions opt_;
  TensorGroup group_;
};

}  // namespace zero::models
