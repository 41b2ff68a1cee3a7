// The Unit contract: how the engine drives a model without the model knowing about ZeRO.
//
// A Model is a table of parameters (ParamSpec: name, shape, type, weight decay, initialisation)
// and an ordered list of Units (for a GPT: the embedding, each transformer block, the head).
// A Unit names the parameters it uses (indices into the table; a parameter may be used by
// several Units: the LM head is tied to the token embedding) and implements forward and
// backward on tensors the engine hands it in a UnitContext. It never allocates, moves or keeps
// parameters: the engine owns where they live and may hand different tensors to forward and
// backward (stage 3 releases a Unit's parameters after forward and gathers them again).
//
// Per micro-batch the engine keeps one UnitContext per Unit:
//   forward, Unit i:  ctx.params   the Unit's full parameters, in param_ids() order
//                     ctx.input    Unit i-1's ctx.output (empty for the first Unit)
//                     ctx.batch    token ids / features and targets of the micro-batch
//                     -> the Unit sets ctx.output (all but the last Unit), ctx.state (whatever
//                        its backward needs) and, for the last Unit, ctx.loss.
//   backward, Unit i (last to first):
//                     ctx.params   again (possibly other tensors with the same values)
//                     ctx.grads    gradient tensors, same shapes, in param_ids() order; the Unit
//                                  ADDS its contribution (+=), never overwrites: tied parameters
//                                  and micro-batch accumulation both rely on this
//                     ctx.grad_output  Unit i+1's ctx.grad_input (empty for the last Unit)
//                     ctx.grad_scale   last Unit: the seed d(objective)/d(loss), for example
//                                      loss scale / gradient accumulation steps
//                     -> the Unit sets ctx.grad_input (the first Unit may leave it empty) and
//                        may drop ctx.state.
// Activation checkpointing (GPipe's re-materialisation): with ctx.checkpoint set, a Unit that
// supports it keeps nothing from forward but its input (ctx.input, which the engine keeps) and
// recomputes its forward inside backward. Gradients are bitwise the same either way.
//
// Split backward (for zero-bubble pipeline schedules, Qi et al. 2024): backward may instead be
// called as two parts, at different times, per micro-batch:
//   backward_input, Unit i (last to first), with the same ctx fields as backward:
//                     -> sets ctx.grad_input as backward would, may add to ctx.grads the
//                        gradients that are cheap or inseparable from the input gradient (each
//                        Unit names which; the GPT's: its LayerNorms' weights and biases, while
//                        matmul weights and biases wait for W), and replaces ctx.state with
//                        what backward_weight needs (the input of each deferred matmul and the
//                        gradient of its output, held by reference, so it stays alive).
//   backward_weight, later, any time before the gradients are read (the previous Unit's
//                     backward_input may run in between; other micro-batches' parts too):
//                     ctx.grads    gradient tensors as for backward (possibly other tensors)
//                     ctx.params, ctx.batch, ctx.input, ctx.grad_output: not read (stage 3 need
//                                  not gather the parameters again for it)
//                     -> adds the remaining parameter gradients (+=) and drops ctx.state.
// backward(ctx) stays the whole thing: bitwise the same gradients and grad_input as
// backward_input(ctx) then backward_weight(ctx). Gradients of a parameter are added in the order
// its parts run, so running the W parts of a Unit's micro-batches in the order their B parts ran
// gives bitwise the joint result.
// With ctx.checkpoint set, backward_input recomputes the forward as backward does and keeps for
// backward_weight only what it needs (the recomputed intermediates are dropped).
// A parameter's gradient is complete only after the W of the first Unit that uses it.
// A Unit that cannot split keeps the defaults: splits_backward() is false, backward_input does
// the whole backward and backward_weight nothing.
//
// Work is enqueued on the model's compute stream (the one its kernels were built with); forward
// and backward return without waiting for it. Activations are Tensors allocated on the device
// under MemCategory::activations, so the ledger shows them, and freed when the last handle goes.
//
// Thread-safety: a Unit is driven by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace zero {

enum class ParamInit : uint8_t { zeros, ones, normal };

// Tensor parallelism (docs/tensor-parallel.md): how a parameter of one tensor rank relates to the
// whole model's parameter of the same name, for initialisation and for re-slicing checkpoints.
enum class TensorSplit : uint8_t {
  none,        // not a tensor-parallel layout: the whole parameter
  replicated,  // the whole parameter, held alike by every rank of the tensor group
  sliced,      // one rank's part of it, as ParamSlice describes
};

// A sliced parameter is piece `rank` of `degree` along dimension `dim` of the whole parameter
// (shape `full`; every other dimension is whole). That dimension is `blocks` equal blocks side
// by side (c_attn's columns are q | k | v: 3 blocks; otherwise 1), each block is cut into
// `degree` equal contiguous pieces, and the slice holds piece `rank` of every block, in block
// order. So with blocks 1 it is the contiguous range [rank, rank + 1) * full[dim] / degree.
struct ParamSlice {
  TensorSplit split = TensorSplit::none;
  Shape full;       // the whole parameter's shape (sliced and replicated)
  int dim = 0;      // sliced: the cut dimension of `full`
  int blocks = 1;   // sliced: equal blocks along `dim`, each cut into `degree` pieces
  int rank = 0;     // the tensor rank holding this parameter
  int degree = 1;   // the tensor-parallel degree
};

struct ParamSpec {
  std::string name;   // Hugging Face GPT-2 names for the GPT: "h.0.attn.c_attn.weight"
  Shape shape;        // Hugging Face shapes too (Conv1D weights are [in, out])
  ScalarType type = ScalarType::f32;  // working type of the parameter (and of its 16-bit copy)
  bool weight_decay = true;           // AdamW applies decay to it (matrices: yes; biases, norms: no)
  ParamInit init = ParamInit::normal;
  float init_std = 0.02f;             // for ParamInit::normal: N(0, init_std^2)
  ParamSlice slice{};                 // tensor parallelism: which part of the whole parameter

  int64_t numel() const noexcept { return shape.numel(); }
};

// Initial values of elements [begin, begin + count) of `spec` (row-major) for `seed`: a pure
// function of (seed, spec.name, element index), so every rank and every world size, each
// initialising only its own slice, gets the same model. Counter-based (no sequential RNG state).
// For a sliced parameter the element index is the one in the whole parameter
// (param_slice_element), so a tensor rank's part holds exactly the whole model's values there.
// Throws zero::Error naming the parameter when its slice does not fit its shape.
void init_param_values(const ParamSpec& spec, uint64_t seed, int64_t begin, int64_t count,
                       float* out);

// Checks that spec.slice describes spec.shape (sliced: `full` cut along `dim` by blocks x
// degree gives spec.shape; replicated: full == shape). Throws zero::Error naming the parameter.
void check_param_slice(const ParamSpec& spec);
// The row-major index in the whole parameter of element i of `spec` (i itself unless sliced).
// spec.slice must have passed check_param_slice.
int64_t param_slice_element(const ParamSpec& spec, int64_t i) noexcept;

// A micro-batch as the model reads it, on the model's device.
struct Batch {
  Tensor inputs;   // int32 token ids [B, T] (GPT), or fp32/fp64 features [B, D] (MLP)
  Tensor targets;  // int32 [B, T] or [B]; -1 marks a position that does not count in the loss
};

// What a Unit keeps from forward for backward (Unit-defined).
struct UnitState {
  virtual ~UnitState() = default;
};

struct UnitContext {
  std::vector<Tensor> params;  // set by the engine before forward and before backward
  std::vector<Tensor> grads;   // set by the engine before backward
  const Batch* batch = nullptr;
  Tensor input;
  Tensor output;
  Tensor grad_output;
  Tensor grad_input;
  Tensor loss;                 // last Unit, forward: [1], mean loss of the micro-batch (fp32; fp64 with fp64 activations)
  float grad_scale = 1.0f;     // last Unit, backward
  bool checkpoint = false;     // recompute forward inside backward (if the Unit supports it)
  std::unique_ptr<UnitState> state;
};

// For a checkpointable Unit's backward: the state its forward kept, or, when it kept none
// (checkpointed), a fresh one that `recompute(state)` fills by running the forward again. A
// recomputed state is held by `owned` for as long as the caller needs it.
template <class S, class Recompute>
S& saved_or_recomputed(UnitContext& ctx, std::unique_ptr<S>& owned, Recompute&& recompute) {
  if (auto* s = dynamic_cast<S*>(ctx.state.get())) return *s;
  owned = std::make_unique<S>();
  recompute(*owned);
  return *owned;
}

class Unit {
 public:
  virtual ~Unit() = default;
  // "wte", "h.3", "head": for logs and error messages.
  virtual const std::string& name() const noexcept = 0;
  // Indices into Model::params of the parameters this Unit uses, in ctx.params/ctx.grads order.
  virtual std::span<const int> param_ids() const noexcept = 0;
  // Whether ctx.checkpoint has an effect (transformer blocks: yes; embedding, head: no).
  virtual bool checkpointable() const noexcept { return false; }
  virtual void forward(UnitContext& ctx) = 0;
  virtual void backward(UnitContext& ctx) = 0;
  // Whether backward_input leaves work to backward_weight (see "Split backward" above).
  virtual bool splits_backward() const noexcept { return false; }
  // The input-gradient part (B): grad_input as early as possible. Default: the whole backward.
  virtual void backward_input(UnitContext& ctx) { backward(ctx); }
  // The weight-gradient part (W): the deferred parameter gradients. Default: nothing is left.
  virtual void backward_weight(UnitContext& ctx) { (void)ctx; }
};

struct Model {
  std::string name;               // "gpt(tiny)", "mlp"
  std::vector<ParamSpec> params;  // the parameter table, in the model's canonical order
  std::vector<std::unique_ptr<Unit>> units;
  // The Units' inputs are this rank's own shard of the activations, different on every rank of
  // its tensor group (sequence parallelism): partition_activations has nothing to split then.
  bool sharded_activations = false;

  int64_t parameter_count() const noexcept;
  // For every parameter, the index of the first Unit in backward order (the lowest index) that
  // uses it: its gradient is complete once that Unit's backward has run.
  std::vector<int> last_gradient_unit() const;
};

// Which Units recompute their activations, from activation_checkpointing.number_checkpoints:
// nullopt or 0 = none; k = k of the checkpointable Units, spread evenly over them (all of them
// when k >= their number). One flag per Unit.
std::vector<bool> checkpoint_plan(const Model& model, std::optional<long long> number_checkpoints);

}  // namespace zero
