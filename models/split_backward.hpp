// The split backward of the models' Units (core/unit.hpp, "Split backward"): a Unit writes its
// backward once, routing every parameter product that may wait through a WeightGrads. Run whole
// (backward), the WeightGrads calls the joint ops at once; run as the input part
// (backward_input), it calls only the input halves and records the weight halves, with the
// tensors they read, in a DeferredWeightGrads that becomes ctx.state; backward_weight then runs
// the recorded halves in order. The same ops in the same order on the same tensors, so the split
// gives the joint result bit for bit (ops.hpp: linear_backward is its two halves).
//
// SplitBackward<Base> turns such a Unit (one implementing backward_with) into a Unit with all
// three entry points. Thread-safety: as the Unit (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/unit.hpp"
#include "models/ops.hpp"

namespace zero::models {

// What backward_input keeps for backward_weight: one entry per deferred product, in the order
// backward_input met them. Holding the Tensors keeps their memory alive until W runs.
struct DeferredWeightGrads final : UnitState {
  enum class Kind : uint8_t { linear, linear_t, embedding };
  struct Product {
    Kind kind;
    Tensor dy;      // gradient of the product's output (embedding: of its output rows)
    Tensor x;       // input of the product (embedding: the int32 token ids)
    int dw = -1;    // index into ctx.grads of the weight's gradient (embedding: wte's)
    int db = -1;    // of the bias (linear) or of wpe (embedding); -1: none
    // embedding of a vocabulary shard (embedding_backward_shard): its first entry and the whole
    // vocabulary; vocab_size 0: the whole table (embedding_backward).
    int64_t vocab_begin = 0, vocab_size = 0;
  };
  std::vector<Product> products;

  // Float elements held (token ids are not counted): the memory W keeps alive between B and W.
  // Each distinct tensor is counted once.
  int64_t elements() const;
};

class WeightGrads {
 public:
  // `deferred` null: the joint backward, every product added into `grads` at once. Otherwise the
  // input part: the weight products are recorded in *deferred.
  WeightGrads(Ops& ops, const std::vector<Tensor>& grads, DeferredWeightGrads* deferred)
      : ops_(ops), grads_(grads), deferred_(deferred) {}

  // linear_backward(dx, grads[dw], grads[db], dy, x, w); db -1: no bias; dx may be empty.
  void linear(const Tensor& dx, int dw, int db, const Tensor& dy, const Tensor& x, const Tensor& w);
  // linear_t_backward(dx, grads[dw], dy, x, w).
  void linear_t(const Tensor& dx, int dw, const Tensor& dy, const Tensor& x, const Tensor& w);
  // embedding_backward(grads[dwte], grads[dwpe], dout, tokens): all of it is a weight gradient,
  // so the input part does nothing.
  void embedding(int dwte, int dwpe, const Tensor& dout, const Tensor& tokens);
  // embedding_backward_shard(grads[dwte], grads[dwpe], dout, tokens, vocab_begin, vocab_size),
  // all of it weight gradient as above.
  void embedding_shard(int dwte, int dwpe, const Tensor& dout, const Tensor& tokens,
                       int64_t vocab_begin, int64_t vocab_size);

 private:
  Ops& ops_;
  const std::vector<Tensor>& grads_;
  DeferredWeightGrads* deferred_;
};

// backward_weight's work: runs d's products in order, adding into `grads` (ctx.grads at W time).
// `unit` names the Unit in errors.
void run_deferred(Ops& ops, const DeferredWeightGrads& d, const std::vector<Tensor>& grads,
                  const std::string& unit);

// Base must provide ops_ (Ops&), name_ and param_ids(); the derived Unit implements
// backward_with(ctx, wg): its whole backward, parameter products through wg, leaving
// ctx.grad_input set. It may read ctx.state (what forward kept) but not reset it.
template <class Base>
class SplitBackward : public Base {
 public:
  using Base::Base;
  bool splits_backward() const noexcept final { return true; }

  void backward(UnitContext& ctx) final {
    WeightGrads wg(this->ops_, ctx.grads, nullptr);
    backward_with(ctx, wg);
    ctx.state.reset();
  }
  void backward_input(UnitContext& ctx) final {
    auto deferred = std::make_unique<DeferredWeightGrads>();
    WeightGrads wg(this->ops_, ctx.grads, deferred.get());
    backward_with(ctx, wg);
    // Forward's state (or the recomputed one) goes now; only what W reads stays.
    ctx.state = std::move(deferred);
  }
  void backward_weight(UnitContext& ctx) final {
    const auto* d = dynamic_cast<const DeferredWeightGrads*>(ctx.state.get());
    ZERO_REQUIRE(d != nullptr, "unit " + this->name_ +
                                   ": backward_weight without backward_input (no deferred "
                                   "weight gradients in ctx.state)");
    ZERO_REQUIRE(ctx.grads.size() == this->param_ids().size(),
                 "unit " + this->name_ + ": backward_weight expected " +
                     std::to_string(this->param_ids().size()) + " gradient tensors, got " +
                     std::to_string(ctx.grads.size()));
    run_deferred(this->ops_, *d, ctx.grads, this->name_);
    ctx.state.reset();
  }

 protected:
  virtual void backward_with(UnitContext& ctx, WeightGrads& wg) = 0;
};

}  // namespace zero::models
