// A step's schedule: which Unit runs its forward or its backward of which micro-batch, in
// order, and the runner that drives the engine's pieces through it.
//
// The schedule is data: a list of passes. local_schedule() is data parallelism's: every
// micro-batch forward through all Units, then backward, one micro-batch after the other. A
// pipeline schedule (a stage's Units, 1F1B) is another list over the same passes; the runner,
// the parameter residency (stage 3 prefetches in the list's order) and the gradient reduction (a
// group reduces after its Unit's last backward in the list) take any list in which each
// micro-batch's passes come in forward-then-backward order.
//
// For each pass the runner asks ParamResidency for the Unit's parameters (gathered, prefetching
// what comes next, released after), runs the Unit, and after a backward hands the Unit's group
// to GradReduction. It reads each micro-batch's loss after its last Unit's forward.
//
// Threading: run() is called by the thread driving the Engine and blocks it for one step; it
// reads each micro-batch's loss with one synchronize of the compute stream.
#pragma once

#include <functional>
#include <vector>

#include "runtime/engine/context.hpp"
#include "runtime/engine/grad_reduction.hpp"
#include "runtime/engine/param_residency.hpp"

namespace zero::engine {

struct UnitPass {
  int micro;      // micro-batch 0 .. gradient_accumulation_steps - 1
  int unit;       // index into Model::units
  bool backward;  // false: forward
};

// Per micro-batch: forward 0 .. units-1, then backward units-1 .. 0.
std::vector<UnitPass> local_schedule(int units, int micro_batches);

// The Units in the order a schedule runs them (ParamResidency::set_order).
std::vector<int> unit_order(const std::vector<UnitPass>& passes);

class ScheduleRunner {
 public:
  // `checkpoint[u]`: Unit u recomputes its activations in backward (checkpoint_plan).
  ScheduleRunner(Context& x, ParamResidency& params, GradReduction& grads, std::vector<bool> checkpoint);

  // Runs `passes` (one step). next(m) gives micro-batch m (on the device), asked for just before
  // its first pass; fetched(m) is called right after. The backward seeds are scaled by
  // `seed_scale` (the loss scale). Returns the sum of the micro-batches' losses.
  double run(const std::vector<UnitPass>& passes, const std::function<Batch(int micro)>& next,
             const std::function<void(int micro)>& fetched, float seed_scale);

 private:
  struct Micro;  // one micro-batch in flight: its batch, Unit contexts, carried tensors, loss
  void forward(Micro& m, int unit, size_t pos);
  void backward(Micro& m, int unit, size_t pos, bool last, bool final_pass, float seed_scale);

  Context& x_;
  ParamResidency& params_;
  GradReduction& grads_;
  std::vector<bool> checkpoint_;
};

}  // namespace zero::engine
