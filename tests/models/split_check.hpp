// Test support for the split backward (core/unit.hpp, "Split backward"): runs a model's
// micro-batches with the joint backward or with the split one in the orders a pipeline schedule
// may use, and collects what must agree bit for bit: every parameter gradient (accumulated over
// the micro-batches) and every Unit's grad_input of every micro-batch. Test-only.
#pragma once

#include <vector>

#include "tests/models/model_runner.hpp"

namespace zero::test {

enum class BackwardOrder {
  joint,        // per micro-batch: forward, backward
  split_each,   // per micro-batch: forward, backward_input, backward_weight
  split_later,  // forward and backward_input of every micro-batch, then the weight parts in the
                // same micro-batch order (as a zero-bubble schedule's W passes fill the bubble)
};

inline const char* to_string(BackwardOrder o) {
  switch (o) {
    case BackwardOrder::joint: return "joint";
    case BackwardOrder::split_each: return "split, W right after B";
    case BackwardOrder::split_later: return "split, every W after every B";
  }
  return "?";
}

struct BackwardResult {
  std::vector<double> losses;                           // per micro-batch
  std::vector<std::vector<double>> grads;               // per parameter
  std::vector<std::vector<std::vector<double>>> dx;     // [micro-batch][unit] grad_input
};

// Zeroes the runner's gradients, then runs `batches` in `order` with checkpoint plan `plan`.
inline BackwardResult run_backward(ModelRunner& r, const Model& m, const std::vector<Batch>& batches,
                                   const std::vector<bool>& plan, BackwardOrder order,
                                   float grad_scale) {
  r.zero_grads();
  r.keep_grad_inputs(true);
  BackwardResult out;
  auto read_dx = [&] {
    std::vector<std::vector<double>> per_unit;
    for (size_t u = 0; u < m.units.size(); ++u) {
      const Tensor& t = r.grad_input(u);
      per_unit.push_back(t ? r.read(t) : std::vector<double>());
    }
    out.dx.push_back(std::move(per_unit));
  };
  std::vector<std::vector<UnitContext>> waiting;
  for (const Batch& b : batches) {
    out.losses.push_back(r.forward(b, plan));
    if (order == BackwardOrder::joint) {
      r.backward(grad_scale);
      read_dx();
      continue;
    }
    std::vector<UnitContext> ctx = r.backward_input(grad_scale);
    read_dx();
    if (order == BackwardOrder::split_each) {
      r.backward_weight(ctx);
    } else {
      waiting.push_back(std::move(ctx));
    }
  }
  for (std::vector<UnitContext>& ctx : waiting) r.backward_weight(ctx);
  for (size_t i = 0; i < m.params.size(); ++i) out.grads.push_back(r.grad(i));
  r.keep_grad_inputs(false);
  return out;
}

}  // namespace zero::test
