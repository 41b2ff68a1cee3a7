#include "models/gpt_tensor_parallel.hpp"

#include <cmath>
#include <utility>

#include "core/error.hpp"

namespace zero::models {

void check_tensor_parallel(const GptShape& s, int degree) {
  const std::string keys = " (zero_train.model.n_head, zero_train.parallel.tensor)";
  ZERO_REQUIRE(degree >= 1, "tensor parallel: the degree must be at least 1, got " +
                                std::to_string(degree) + " (zero_train.parallel.tensor)");
  // Attention is split by whole heads: each rank runs H/T of them on its own.
  ZERO_REQUIRE(s.n_head % degree == 0,
               "tensor parallel: n_head " + std::to_string(s.n_head) +
                   " is not divisible by the tensor-parallel degree " + std::to_string(degree) +
                   ": pick a degree that divides the heads" + keys);
  // Implied by the above when n_head divides n_embd; checked for shapes that skip that check.
  ZERO_REQUIRE((4 * static_cast<int64_t>(s.n_embd)) % degree == 0 && s.n_embd % degree == 0,
               "tensor parallel: the MLP's 4 x n_embd = " + std::to_string(4 * static_cast<int64_t>(s.n_embd)) +
                   " columns (and n_embd " + std::to_string(s.n_embd) +
                   ") are not divisible by the tensor-parallel degree " + std::to_string(degree) +
                   " (zero_train.model.n_embd, zero_train.parallel.tensor)");
}

std::vector<int> add_tensor_parallel_block_params(std::vector<ParamSpec>& params, const GptOptions& o,
                                                  int layer, int rank, int degree) {
  check_tensor_parallel(o.shape, degree);
  ZERO_REQUIRE(rank >= 0 && rank < degree, "tensor parallel: rank " + std::to_string(rank) +
                                               " is outside the tensor group of " + std::to_string(degree));
  const int64_t C = o.shape.n_embd, T = degree;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(o.shape.n_layer));
  const std::string h = "h." + std::to_string(layer) + ".";
  std::vector<int> ids;
  // The same names, initialisation and decay as make_gpt's block (models/gpt.cpp); a test
  // compares the degree-1 table with make_gpt's.
  auto add = [&](const std::string& name, Shape full, ParamInit init, float std_dev, TensorSplit split,
                 int dim = 0, int blocks = 1) {
    ParamSpec p;
    p.name = h + name;
    p.type = o.param_type;
    p.weight_decay = full.rank() >= 2;
    p.init = init;
    p.init_std = std_dev;
    p.slice = ParamSlice{split, full, dim, blocks, rank, degree};
    if (split == TensorSplit::sliced) {
      p.shape = full.rank() == 1 ? Shape{full[0] / T}
                : dim == 0       ? Shape{full[0] / T, full[1]}
                                 : Shape{full[0], full[1] / T};
    } else {
      p.shape = full;
    }
    check_param_slice(p);
    params.push_back(std::move(p));
    ids.push_back(static_cast<int>(params.size()) - 1);
  };
  const auto rep = TensorSplit::replicated, cut = TensorSplit::sliced;
  add("ln_1.weight", Shape{C}, ParamInit::ones, 0.02f, rep);
  add("ln_1.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  add("attn.c_attn.weight", Shape{C, 3 * C}, ParamInit::normal, 0.02f, cut, 1, 3);  // q | k | v
  add("attn.c_attn.bias", Shape{3 * C}, ParamInit::zeros, 0.02f, cut, 0, 3);
  add("attn.c_proj.weight", Shape{C, C}, ParamInit::normal, proj_std, cut, 0);      // input rows
  add("attn.c_proj.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  add("ln_2.weight", Shape{C}, ParamInit::ones, 0.02f, rep);
  add("ln_2.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  add("mlp.c_fc.weight", Shape{C, 4 * C}, ParamInit::normal, 0.02f, cut, 1);        // columns
  add("mlp.c_fc.bias", Shape{4 * C}, ParamInit::zeros, 0.02f, cut, 0);
  add("mlp.c_proj.weight", Shape{4 * C, C}, ParamInit::normal, proj_std, cut, 0);   // input rows
  add("mlp.c_proj.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  return ids;
}

TensorParallelBlockBase::TensorParallelBlockBase(std::string name, std::vector<int> ids, Ops& ops,
                                                 const GptOptions& o, coll::Communicator& tensor)
    : name_(std::move(name)), ids_(std::move(ids)), ops_(ops), opt_(o), tensor_(tensor) {}

// What backward reads of forward; the shards' widths are C/T (attention) and 4C/T (MLP).
struct TensorParallelBlock::State final : UnitState {
  Tensor ln1, mean1, rstd1, qkv, probs, atty, res2, ln2, mean2, rstd2, fch, fcg;
};

TensorParallelBlock::TensorParallelBlock(std::string name, std::vector<int> ids, Ops& ops,
                                         const GptOptions& o, coll::Communicator& tensor)
    : SplitBackward(std::move(name), std::move(ids), ops, o, tensor) {
  check_tensor_parallel(o.shape, tensor.size());
  ZERO_REQUIRE(ids_.size() == 12, "tensor parallel block " + name_ + ": expected 12 parameter ids, got " +
                                      std::to_string(ids_.size()));
  ZERO_REQUIRE(tensor.kind() == ops.device().kind(),
               "tensor parallel block " + name_ + ": the tensor communicator (" +
                   std::string(to_string(tensor.kind())) + ") and the model's device (" +
                   ops.device().name() + ") differ in kind");
  const ScalarType a = o.activation_type;
  ZERO_REQUIRE(to_dtype(a).has_value(),
               "tensor parallel block " + name_ + ": activations must be fp32, bf16 or fp16 (the "
               "all-reduce sums those), got " + std::string(to_string(a)));
  ZERO_REQUIRE(o.param_type != ScalarType::i32 && o.param_type != ScalarType::f64,
               "tensor parallel block " + name_ + ": parameters must be fp32, bf16 or fp16, got " +
                   std::string(to_string(o.param_type)));
  ready_ = ops.device().create_event();
}

void TensorParallelBlock::all_reduce(const Tensor& t) {
  // Megatron's g (forward) and f (backward): the partial sums of the T ranks become the whole.
  // In place, on the communicator's stream, after the compute stream has produced `t`; later
  // compute work waits for the result. The caller enqueues a reader of `t` at once, which keeps
  // its storage alive until the all-reduce is done (cpu ops hold their operands; cuda frees in
  // compute-stream order, after the wait).
  ops_.stream().record(*ready_);
  coll::Work w = tensor_.all_reduce(t.data(), t.data(), static_cast<size_t>(t.numel()),
                                    *to_dtype(t.type()), coll::ReduceOp::sum, ready_.get());
  w.chain(ops_.stream());
  all_reduce_bytes_ += static_cast<int64_t>(t.bytes());
  ++all_reduce_calls_;
}

void TensorParallelBlock::forward(UnitContext& ctx) {
  ZERO_REQUIRE(ctx.params.size() == ids_.size(), "tensor parallel block " + name_ + ": expected " +
                                                     std::to_string(ids_.size()) + " parameter tensors, got " +
                                                     std::to_string(ctx.params.size()));
  auto state = std::make_unique<State>();
  ctx.output = run_forward(ctx, *state);
  // Checkpointed: only ctx.input stays; backward recomputes (and all-reduces) again.
  if (!ctx.checkpoint) ctx.state = std::move(state);
}

Tensor TensorParallelBlock::run_forward(const UnitContext& ctx, State& s) {
  ZERO_REQUIRE(ctx.input && ctx.input.shape().rank() == 3 && ctx.input.shape()[2] == opt_.shape.n_embd,
               "tensor parallel block " + name_ + ": the input must be [B, T, " +
                   std::to_string(opt_.shape.n_embd) + "], got " + ctx.input.describe());
  const std::vector<Tensor>& w = ctx.params;
  const Tensor& x = ctx.input;
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  const int64_t P = tensor_.size();
  const int heads = opt_.shape.n_head / static_cast<int>(P);  // this rank's heads
  const int64_t Ca = C / P, F = 4 * C / P;                     // shard widths
  const ScalarType at = opt_.activation_type;
  auto act = [&](Shape sh) { return Tensor::empty(ops_.device(), sh, at, MemCategory::activations); };
  auto stats = [&](Shape sh) { return Tensor::empty(ops_.device(), sh, ScalarType::f32, MemCategory::activations); };
  // The row-split matrices' replicated biases enter the sum once, on tensor rank 0.
  const bool adds_bias = tensor_.rank() == 0;

  // Attention: ln_1 whole, then f (identity), c_attn on this rank's heads, c_proj partial, g.
  s.ln1 = act(Shape{B, T, C});
  s.mean1 = stats(Shape{B * T});
  s.rstd1 = stats(Shape{B * T});
  ops_.layernorm_forward(s.ln1, s.mean1, s.rstd1, x, w[0], w[1]);
  s.qkv = act(Shape{B, T, 3 * Ca});
  ops_.linear_forward(s.qkv, s.ln1, w[2], w[3]);
  s.probs = act(Shape{B, heads, T, T});
  s.atty = act(Shape{B, T, Ca});
  ops_.attention_forward(s.atty, s.probs, s.qkv, heads);
  Tensor attproj = act(Shape{B, T, C});
  ops_.linear_forward(attproj, s.atty, w[4], adds_bias ? w[5] : Tensor());
  all_reduce(attproj);
  s.res2 = act(Shape{B, T, C});
  ops_.add(s.res2, x, attproj);
  attproj = Tensor();

  // MLP: ln_2 whole, f, c_fc on this rank's 4C/T columns, GELU, c_proj partial, g.
  s.ln2 = act(Shape{B, T, C});
  s.mean2 = stats(Shape{B * T});
  s.rstd2 = stats(Shape{B * T});
  ops_.layernorm_forward(s.ln2, s.mean2, s.rstd2, s.res2, w[6], w[7]);
  s.fch = act(Shape{B, T, F});
  ops_.linear_forward(s.fch, s.ln2, w[8], w[9]);
  s.fcg = act(Shape{B, T, F});
  ops_.gelu_forward(s.fcg, s.fch);
  Tensor fcproj = act(Shape{B, T, C});
  ops_.linear_forward(fcproj, s.fcg, w[10], adds_bias ? w[11] : Tensor());
  all_reduce(fcproj);
  Tensor out = act(Shape{B, T, C});
  ops_.add(out, s.res2, fcproj);
  return out;
}

void TensorParallelBlock::backward_with(UnitContext& ctx, WeightGrads& wg) {
  ZERO_REQUIRE(ctx.params.size() == ids_.size() && ctx.grads.size() == ids_.size(),
               "tensor parallel block " + name_ + ": expected " + std::to_string(ids_.size()) +
                   " parameter and gradient tensors, got " + std::to_string(ctx.params.size()) + " and " +
                   std::to_string(ctx.grads.size()));
  ZERO_REQUIRE(ctx.grad_output, "tensor parallel block " + name_ + ": backward without grad_output");
  std::unique_ptr<State> owned;
  State* s = &saved_or_recomputed(ctx, owned, [&](State& st) { (void)run_forward(ctx, st); });
  const std::vector<Tensor>& w = ctx.params;
  const std::vector<Tensor>& g = ctx.grads;
  const Tensor& x = ctx.input;
  const Tensor& dout = ctx.grad_output;
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  const int64_t P = tensor_.size(), Ca = C / P, F = 4 * C / P;
  const int heads = opt_.shape.n_head / static_cast<int>(P);
  auto act = [&](Shape sh) {
    return Tensor::empty(ops_.device(), sh, opt_.activation_type, MemCategory::activations);
  };

  // MLP branch. g's backward is the identity: every rank has the whole dout. c_proj's bias
  // gradient (replicated) is the column sum of dout on every rank alike.
  Tensor dfcg = act(Shape{B, T, F});
  wg.linear(dfcg, 10, 11, dout, s->fcg, w[10]);
  Tensor dfch = act(Shape{B, T, F});
  ops_.gelu_backward(dfch, dfcg, s->fch);
  dfcg = Tensor();
  Tensor dln2 = act(Shape{B, T, C});
  wg.linear(dln2, 8, 9, dfch, s->ln2, w[8]);
  dfch = Tensor();
  all_reduce(dln2);  // f's backward: this rank's columns gave part of ln_2's output gradient
  Tensor dres2 = act(Shape{B, T, C});
  ops_.layernorm_backward(dres2, g[6], g[7], dln2, s->res2, w[6], s->mean2, s->rstd2);
  ops_.accumulate(dres2, dout);  // the residual path
  dln2 = Tensor();

  // Attention branch, the same way.
  Tensor datty = act(Shape{B, T, Ca});
  wg.linear(datty, 4, 5, dres2, s->atty, w[4]);
  Tensor dqkv = act(Shape{B, T, 3 * Ca});
  ops_.attention_backward(dqkv, datty, s->qkv, s->probs, heads);
  datty = Tensor();
  Tensor dln1 = act(Shape{B, T, C});
  wg.linear(dln1, 2, 3, dqkv, s->ln1, w[2]);
  dqkv = Tensor();
  all_reduce(dln1);
  Tensor dx = act(Shape{B, T, C});
  ops_.layernorm_backward(dx, g[0], g[1], dln1, x, w[0], s->mean1, s->rstd1);
  ops_.accumulate(dx, dres2);  // the residual path
  ctx.grad_input = dx;
}

}  // namespace zero::models
