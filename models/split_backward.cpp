#include "models/split_backward.hpp"

#include <algorithm>

namespace zero::models {

int64_t DeferredWeightGrads::elements() const {
  std::vector<const void*> seen;
  int64_t n = 0;
  auto count = [&](const Tensor& t) {
    if (!t || t.type() == ScalarType::i32) return;
    if (std::find(seen.begin(), seen.end(), t.data()) != seen.end()) return;
    seen.push_back(t.data());
    n += t.numel();
  };
  for (const Product& p : products) {
    count(p.dy);
    count(p.x);
  }
  return n;
}

namespace {
Tensor grad_at(const std::vector<Tensor>& grads, int i) {
  return i < 0 ? Tensor() : grads.at(static_cast<size_t>(i));
}
}  // namespace

void WeightGrads::linear(const Tensor& dx, int dw, int db, const Tensor& dy, const Tensor& x,
                         const Tensor& w) {
  if (!deferred_) {
    ops_.linear_backward(dx, grad_at(grads_, dw), grad_at(grads_, db), dy, x, w);
    return;
  }
  if (dx) ops_.linear_backward_input(dx, dy, w);
  deferred_->products.push_back({DeferredWeightGrads::Kind::linear, dy, x, dw, db});
}

void WeightGrads::linear_t(const Tensor& dx, int dw, const Tensor& dy, const Tensor& x,
                           const Tensor& w) {
  if (!deferred_) {
    ops_.linear_t_backward(dx, grad_at(grads_, dw), dy, x, w);
    return;
  }
  ops_.linear_t_backward_input(dx, dy, w);
  deferred_->products.push_back({DeferredWeightGrads::Kind::linear_t, dy, x, dw, -1});
}

void WeightGrads::embedding(int dwte, int dwpe, const Tensor& dout, const Tensor& tokens) {
  if (!deferred_) {
    ops_.embedding_backward(grad_at(grads_, dwte), grad_at(grads_, dwpe), dout, tokens);
    return;
  }
  deferred_->products.push_back({DeferredWeightGrads::Kind::embedding, dout, tokens, dwte, dwpe});
}

void WeightGrads::embedding_shard(int dwte, int dwpe, const Tensor& dout, const Tensor& tokens,
                                  int64_t vocab_begin, int64_t vocab_size) {
  if (!deferred_) {
    ops_.embedding_backward_shard(grad_at(grads_, dwte), grad_at(grads_, dwpe), dout, tokens, vocab_begin,
                                  vocab_size);
    return;
  }
  deferred_->products.push_back(
      {DeferredWeightGrads::Kind::embedding, dout, tokens, dwte, dwpe, vocab_begin, vocab_size});
}

void run_deferred(Ops& ops, const DeferredWeightGrads& d, const std::vector<Tensor>& grads,
                  const std::string& unit) {
  for (const DeferredWeightGrads::Product& p : d.products) {
    const auto in_range = [&](int i) { return i < 0 || static_cast<size_t>(i) < grads.size(); };
    ZERO_REQUIRE(in_range(p.dw) && in_range(p.db),
                 "unit " + unit + ": a deferred weight gradient names gradient " +
                     std::to_string(std::max(p.dw, p.db)) + " of " + std::to_string(grads.size()));
    switch (p.kind) {
      case DeferredWeightGrads::Kind::linear:
        ops.linear_backward_weight(grad_at(grads, p.dw), grad_at(grads, p.db), p.dy, p.x);
        break;
      case DeferredWeightGrads::Kind::linear_t:
        ops.linear_t_backward_weight(grad_at(grads, p.dw), p.dy, p.x);
        break;
      case DeferredWeightGrads::Kind::embedding:
        if (p.vocab_size > 0)
          ops.embedding_backward_shard(grad_at(grads, p.dw), grad_at(grads, p.db), p.dy, p.x, p.vocab_begin,
                                       p.vocab_size);
        else
          ops.embedding_backward(grad_at(grads, p.dw), grad_at(grads, p.db), p.dy, p.x);
        break;
    }
  }
}

}  // namespace zero::models
