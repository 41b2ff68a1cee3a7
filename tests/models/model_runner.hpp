// Test support: drives a Model's Units through forward and backward on one device, holding the
// full parameters and gradients itself: the smallest driver the Unit contract allows (what the
// engine does at stage 0 on one rank, without communication or optimizer). Test-only.
#pragma once

#include <cstring>
#include <vector>

#include "models/ops.hpp"
#include "core/unit.hpp"

namespace zero::test {

class ModelRunner {
 public:
  // Parameters initialised from `seed` (init_param_values) in their spec's type; gradients of
  // `grad_type` (nullopt: the parameter's own type), zeroed.
  ModelRunner(Model& model, models::Ops& ops, uint64_t seed,
              std::optional<ScalarType> grad_type = std::nullopt)
      : model_(model), ops_(ops) {
    for (const ParamSpec& p : model.params) {
      std::vector<float> init(static_cast<size_t>(p.numel()));
      init_param_values(p, seed, 0, p.numel(), init.data());
      params_.push_back(Tensor::empty(ops.device(), p.shape, p.type, MemCategory::parameters));
      set_param(params_.size() - 1, std::vector<double>(init.begin(), init.end()));
      grads_.push_back(Tensor::zeros(ops.device(), ops.stream(), p.shape, grad_type.value_or(p.type),
                                     MemCategory::gradients));
    }
    ops.stream().synchronize();
  }

  // A Batch on the device from host vectors. `inputs_f`: features (for the MLP) instead of tokens.
  Batch make_batch(Shape in_shape, const std::vector<int32_t>& tokens, Shape target_shape,
                   const std::vector<int32_t>& targets) {
    Batch b;
    b.inputs = Tensor::empty(ops_.device(), in_shape, ScalarType::i32, MemCategory::activations);
    b.targets = Tensor::empty(ops_.device(), target_shape, ScalarType::i32, MemCategory::activations);
    copy_from_host(ops_.device(), ops_.stream(), b.inputs, tokens.data());
    copy_from_host(ops_.device(), ops_.stream(), b.targets, targets.data());
    ops_.stream().synchronize();
    return b;
  }
  Batch make_feature_batch(Shape in_shape, ScalarType type, const std::vector<double>& features,
                           const std::vector<int32_t>& labels) {
    Batch b;
    b.inputs = Tensor::empty(ops_.device(), in_shape, type, MemCategory::activations);
    write(b.inputs, features);
    b.targets = Tensor::empty(ops_.device(), Shape{static_cast<int64_t>(labels.size())},
                              ScalarType::i32, MemCategory::activations);
    copy_from_host(ops_.device(), ops_.stream(), b.targets, labels.data());
    ops_.stream().synchronize();
    return b;
  }

  // Forward of every Unit; returns the loss. Keeps the contexts for backward().
  double forward(const Batch& batch, const std::vector<bool>& checkpoint = {}) {
    ctx_.clear();
    ctx_.resize(model_.units.size());
    Tensor prev;
    for (size_t u = 0; u < model_.units.size(); ++u) {
      bound_run_ahead(u);
      UnitContext& c = ctx_[u];
      c.batch = &batch;
      c.input = prev;
      c.checkpoint = u < checkpoint.size() && checkpoint[u];
      c.params = gather(params_, u);
      model_.units[u]->forward(c);
      c.params.clear();  // as stage 3 would: backward gets them again
      prev = c.output;
    }
    const double loss = read(ctx_.back().loss).at(0);
    ops_.check_errors();
    return loss;
  }
  // Backward of every Unit, last to first, accumulating into the gradients.
  void backward(float grad_scale = 1.0f) {
    Tensor dprev;
    for (size_t u = model_.units.size(); u-- > 0;) {
      bound_run_ahead(model_.units.size() - 1 - u);
      UnitContext& c = ctx_[u];
      c.params = gather(params_, u);
      c.grads = gather(grads_, u);
      c.grad_output = dprev;
      c.grad_scale = grad_scale;
      model_.units[u]->backward(c);
      dprev = c.grad_input;
      if (keep_grad_inputs_) grad_inputs_[u] = c.grad_input;
      c = UnitContext();  // drop everything this micro-batch kept
    }
    ops_.check_errors();
  }
  // The split backward (core/unit.hpp, "Split backward"): the input part of every Unit, last to
  // first, on the contexts of the last forward. The contexts are handed back, holding what each
  // Unit kept for its weight part, so several micro-batches may wait for their weight parts at
  // once. Everything the contract says the weight part does not read (parameters, batch, input,
  // grad_output) is dropped from them, so a Unit that reads it anyway fails.
  std::vector<UnitContext> backward_input(float grad_scale = 1.0f) {
    Tensor dprev;
    for (size_t u = model_.units.size(); u-- > 0;) {
      bound_run_ahead(model_.units.size() - 1 - u);
      UnitContext& c = ctx_[u];
      c.params = gather(params_, u);
      c.grads = gather(grads_, u);
      c.grad_output = dprev;
      c.grad_scale = grad_scale;
      model_.units[u]->backward_input(c);
      dprev = c.grad_input;
      if (keep_grad_inputs_) grad_inputs_[u] = c.grad_input;
      UnitContext kept;
      kept.state = std::move(c.state);
      c = std::move(kept);
    }
    ops_.check_errors();
    return std::move(ctx_);
  }
  // The weight part of every Unit, last to first, on contexts backward_input returned.
  void backward_weight(std::vector<UnitContext>& ctx) {
    for (size_t u = model_.units.size(); u-- > 0;) {
      bound_run_ahead(model_.units.size() - 1 - u);
      UnitContext& c = ctx[u];
      c.grads = gather(grads_, u);
      model_.units[u]->backward_weight(c);
      c = UnitContext();
    }
    ops_.check_errors();
  }
  // Keep each Unit's grad_input of the last backward (or backward_input) for grad_input(u).
  void keep_grad_inputs(bool on) {
    keep_grad_inputs_ = on;
    grad_inputs_.assign(model_.units.size(), Tensor());
  }
  const Tensor& grad_input(size_t unit) const { return grad_inputs_.at(unit); }
  double forward_backward(const Batch& batch, const std::vector<bool>& checkpoint = {},
                          float grad_scale = 1.0f) {
    const double loss = forward(batch, checkpoint);
    backward(grad_scale);
    return loss;
  }
  // The head's ctx.output of the last forward (logits), as doubles.
  std::vector<double> last_output() { return read(ctx_.back().output); }

  void zero_grads() {
    for (Tensor& g : grads_) ops_.zero(g);
    ops_.stream().synchronize();
  }
  std::vector<double> param(size_t i) { return read(params_[i]); }
  std::vector<double> grad(size_t i) { return read(grads_[i]); }
  void set_param(size_t i, const std::vector<double>& v) { write(params_[i], v); }
  // Central difference (L(p + h) - L(p - h)) / 2h of the loss on `batch` with respect to
  // element e of parameter i; the parameter is restored afterwards.
  double finite_difference(size_t i, size_t e, double h, const Batch& batch) {
    std::vector<double> p = param(i);
    const double keep = p[e];
    p[e] = keep + h;
    set_param(i, p);
    const double up = forward(batch);
    p[e] = keep - h;
    set_param(i, p);
    const double down = forward(batch);
    p[e] = keep;
    set_param(i, p);
    return (up - down) / (2 * h);
  }
  const Tensor& param_tensor(size_t i) const { return params_[i]; }
  const Tensor& grad_tensor(size_t i) const { return grads_[i]; }

  // Host copies as doubles (fp64 and int32 exactly; fp32/fp16/bf16 through dtype.hpp's exact
  // widening, and back with its round-to-nearest-even narrowing).
  std::vector<double> read(const Tensor& t) {
    std::vector<unsigned char> raw(t.bytes());
    copy_to_host(ops_.device(), ops_.stream(), raw.data(), t);
    ops_.stream().synchronize();
    const size_t n = static_cast<size_t>(t.numel());
    if (t.type() == ScalarType::f64) {
      std::vector<double> out(n);
      std::memcpy(out.data(), raw.data(), raw.size());
      return out;
    }
    if (t.type() == ScalarType::i32) {
      std::vector<int32_t> k(n);
      std::memcpy(k.data(), raw.data(), raw.size());
      return std::vector<double>(k.begin(), k.end());
    }
    std::vector<float> f(n);
    convert(raw.data(), *to_dtype(t.type()), f.data(), DType::f32, n);
    return std::vector<double>(f.begin(), f.end());
  }
  void write(const Tensor& t, const std::vector<double>& v) {
    std::vector<unsigned char> raw(t.bytes());
    if (t.type() == ScalarType::f64) {
      std::memcpy(raw.data(), v.data(), raw.size());
    } else if (t.type() == ScalarType::i32) {
      std::vector<int32_t> k(v.begin(), v.end());
      std::memcpy(raw.data(), k.data(), raw.size());
    } else {
      const std::vector<float> f(v.begin(), v.end());
      convert(f.data(), DType::f32, raw.data(), *to_dtype(t.type()), f.size());
    }
    copy_from_host(ops_.device(), ops_.stream(), t, raw.data());
    ops_.stream().synchronize();
  }

 private:
  // The host enqueues a Unit only once the stream has finished the previous one. Memory a Unit
  // dropped is really free once the stream has passed its last use, so without a bound an
  // asynchronous stream would hold every intermediate of the whole pass at once and the ledger
  // could not show what checkpointing saves. (The engine bounds its run-ahead the same way.)
  void bound_run_ahead(size_t k) {
    if (k == 0) return;
    ops_.stream().record(*unit_done_);
    unit_done_->synchronize();
  }

  std::vector<Tensor> gather(const std::vector<Tensor>& all, size_t unit) const {
    std::vector<Tensor> out;
    for (int id : model_.units[unit]->param_ids()) out.push_back(all[static_cast<size_t>(id)]);
    return out;
  }

  Model& model_;
  models::Ops& ops_;
  std::vector<Tensor> params_, grads_;
  std::vector<UnitContext> ctx_;
  bool keep_grad_inputs_ = false;
  std::vector<Tensor> grad_inputs_;
  std::unique_ptr<Event> unit_done_ = ops_.device().create_event();
};

}  // namespace zero::test
