#include "runtime/engine/schedule.hpp"

#include <map>

#include "core/phase.hpp"

namespace zero::engine {

std::vector<UnitPass> local_schedule(int units, int micro_batches) {
  std::vector<UnitPass> out;
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (int u = 0; u < units; ++u) out.push_back({mb, u, false});
    for (int u = units; u-- > 0;) out.push_back({mb, u, true});
  }
  return out;
}

std::vector<int> unit_order(const std::vector<UnitPass>& passes) {
  std::vector<int> out;
  out.reserve(passes.size());
  for (const UnitPass& p : passes) out.push_back(p.unit);
  return out;
}

struct ScheduleRunner::Micro {
  Batch batch;
  std::vector<UnitContext> ctx;  // per Unit: what its forward keeps for its backward
  Tensor carry;                  // forward: the output going up; backward: the gradient going down
  double loss = 0;
  int passes_left = 0;
};

ScheduleRunner::ScheduleRunner(Context& x, ParamResidency& params, GradReduction& grads,
                               std::vector<bool> checkpoint)
    : x_(x), params_(params), grads_(grads), checkpoint_(std::move(checkpoint)) {}

double ScheduleRunner::run(const std::vector<UnitPass>& passes, const std::function<Batch(int)>& next,
                           const std::function<void(int)>& fetched, float seed_scale) {
  const size_t U = x_.model.units.size();
  // How many passes each micro-batch has, and each Unit's last backward (after it, the Unit's
  // group holds the step's final gradient).
  std::map<int, int> count;
  std::vector<size_t> last_backward(U, 0);
  for (size_t pos = 0; pos < passes.size(); ++pos) {
    ++count[passes[pos].micro];
    if (passes[pos].backward) last_backward[static_cast<size_t>(passes[pos].unit)] = pos;
  }
  std::map<int, Micro> live;  // micro-batches in flight (node-based: Batch addresses stay put)
  double total = 0;
  for (size_t pos = 0; pos < passes.size(); ++pos) {
    const UnitPass& p = passes[pos];
    auto it = live.find(p.micro);
    if (it == live.end()) {
      phase::set("loading a micro-batch");
      it = live.emplace(p.micro, Micro{next(p.micro), std::vector<UnitContext>(U), Tensor(), 0.0,
                                       count[p.micro]}).first;
      if (fetched) fetched(p.micro);
    }
    Micro& m = it->second;
    const double t0 = now_seconds();
    if (!p.backward) {
      phase::set("forward");
      forward(m, p.unit, pos);
      --m.passes_left;
      x_.timers.forward += now_seconds() - t0;
      continue;
    }
    phase::set("backward and gradient reduction");
    backward(m, p.unit, pos, pos == last_backward[static_cast<size_t>(p.unit)],
             pos + 1 == passes.size(), seed_scale);
    if (--m.passes_left == 0) {  // the micro-batch is done: its reductions too
      grads_.drain();
      total += m.loss;
      live.erase(it);
    }
    x_.timers.backward += now_seconds() - t0;
  }
  return total;
}

void ScheduleRunner::forward(Micro& m, int unit, size_t pos) {
  const size_t u = static_cast<size_t>(unit);
  UnitContext& c = m.ctx[u];
  params_.use(unit);
  if (x_.o.stage == 3) params_.prefetch(pos + 1);
  c.batch = &m.batch;
  c.input = m.carry;
  c.checkpoint = checkpoint_[u];
  c.params = params_.views(unit);
  x_.model.units[u]->forward(c);
  c.params.clear();
  m.carry = c.output;
  // Stage 3 frees the gathered parameters here (after the stream has passed the Unit); else the
  // host waits only for the Unit before this one (unit_fence).
  if (x_.o.stage == 3) params_.release_after(pos); else x_.unit_fence();
  if (u + 1 != x_.model.units.size()) return;
  // The loss (fp32, or fp64 with fp64 activations) to the host; the synchronize also reports a
  // bad token or target found by this micro-batch's ops.
  double loss64 = 0;
  float loss32 = 0;
  const bool f64 = c.loss.type() == ScalarType::f64;
  copy_to_host(x_.dev, x_.compute, f64 ? static_cast<void*>(&loss64) : static_cast<void*>(&loss32), c.loss);
  x_.compute.synchronize();
  m.loss = f64 ? loss64 : loss32;
  m.carry = Tensor();  // the last Unit's backward starts from the loss, not from a gradient
}

void ScheduleRunner::backward(Micro& m, int unit, size_t pos, bool last, bool final_pass,
                              float seed_scale) {
  const size_t u = static_cast<size_t>(unit);
  UnitContext& c = m.ctx[u];
  if (x_.o.stage == 3) {
    params_.use(unit);
    params_.prefetch(pos + 1);
  }
  c.params = params_.views(unit);
  c.grads = grads_.views(unit);
  c.grad_output = m.carry;
  c.grad_scale = seed_scale;
  x_.model.units[u]->backward(c);
  m.carry = c.grad_input;
  c = UnitContext();
  grads_.after_backward(unit, last);  // group `unit` is complete now
  if (x_.o.stage == 3) {
    // After the step's final pass the optimizer step changes the shards: nothing stays gathered.
    if (final_pass) params_.release_all(); else params_.release_after(pos);
  } else {
    x_.unit_fence();
  }
}

}  // namespace zero::engine
