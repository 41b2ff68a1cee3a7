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

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/engine/activation_offload.hpp"
#include "runtime/engine/context.hpp"
#include "runtime/engine/grad_reduction.hpp"
#include "runtime/engine/param_residency.hpp"

namespace zero::engine {

struct UnitPass {
  // forward; backward (joint); or the two halves of a split backward (core/unit.hpp): the input
  // gradient (reads the parameters) and, later, the weight gradient (does not).
  enum class Part : uint8_t { forward, backward, input, weight };
  int micro;  // micro-batch 0 .. gradient_accumulation_steps - 1
  int unit;   // index into Model::units
  Part part = Part::forward;
  bool is_backward() const { return part != Part::forward; }
  bool reads_params() const { return part != Part::weight; }
  // The pass after which the Unit adds nothing more to its gradients for this micro-batch.
  bool ends_grad() const { return part == Part::backward || part == Part::weight; }
};

// Per micro-batch: forward 0 .. units-1, then backward units-1 .. 0.
std::vector<UnitPass> local_schedule(int units, int micro_batches);

// The Units of the passes that read parameters (not the weight halves), in order: stage 3's
// prefetch order (ParamResidency::set_order).
std::vector<int> unit_order(const std::vector<UnitPass>& passes);

// One micro-batch in flight: its batch, what each Unit's forward kept, and the tensor between
// passes (forward: the output going up, the first Unit's input when a previous pipeline stage
// sent it; backward: the gradient going down, the last Unit's grad_output when a next stage
// sent it), and its loss (the model's last Unit).
struct MicroState {
  Batch batch;
  std::vector<UnitContext> ctx;
  // partition_activations: per Unit, this tensor rank's part of a checkpointed Unit's input
  // (empty: the input is kept whole in ctx, or not at all) and the whole input's shape.
  std::vector<Tensor> parts;
  std::vector<Shape> part_shapes;
  // cpu_checkpointing: per Unit, its kept input (or its part, `stashed_part`) in host memory
  // between its forward and its backward (activation_offload.hpp).
  std::vector<StashedActivation> stashed;
  std::vector<char> stashed_part;
  Tensor carry;
  double loss = 0;
  int passes_left = 0;
};

class ScheduleRunner {
 public:
  // `checkpoint[u]`: Unit u recomputes its activations in backward (checkpoint_plan).
  // `has_loss`: the model's last Unit computes the loss (false on a pipeline stage before the
  // last: its last Unit's output goes to the next stage).
  // `act`: cpu_checkpointing's host side (null: checkpointed inputs stay on the device); it must
  // outlive the runner.
  ScheduleRunner(Context& x, ParamResidency& params, GradReduction& grads, std::vector<bool> checkpoint,
                 bool has_loss = true, ActivationOffload* act = nullptr);

  // Runs `passes` (one step). next(m) gives micro-batch m (on the device), asked for just before
  // its first pass; fetched(m) is called right after. The backward seeds are scaled by
  // `seed_scale` (the loss scale). Returns the sum of the micro-batches' losses.
  double run(const std::vector<UnitPass>& passes, const std::function<Batch(int micro)>& next,
             const std::function<void(int micro)>& fetched, float seed_scale);

  // The same one pass at a time (the pipeline executor interleaves transfers): plan() a step's
  // passes (each Unit's final gradient pass, stage 3's gather order when it changed), then
  // pass(m, pos, ..) for pos = 0, 1, .. in order, each on its micro-batch's state. passes(micro)
  // is how many passes micro-batch `micro` has in the plan.
  void plan(const std::vector<UnitPass>& passes);
  void pass(MicroState& m, size_t pos, float seed_scale);
  int passes(int micro) const;

 private:
  // partition_activations (schedule.cpp): after a checkpointed Unit's forward, keep this tensor
  // rank's part of its input; before its backward, all-gather it whole again.
  void partition_input(MicroState& m, int unit);
  void gather_input(MicroState& m, int unit);
  // Keeps `t` alive until the compute stream has passed the work enqueued so far (schedule.cpp).
  void hold_input(Tensor t);
  // cpu_checkpointing (schedule.cpp): after a checkpointed Unit's forward (and its partition),
  // its kept input goes to host memory; before its backward it comes back (prefetched a pass
  // ahead for the Unit below).
  void stash_input(MicroState& m, int unit);
  void fetch_input(MicroState& m, int unit);
  void prefetch_input(MicroState& m, int unit);
  void forward(MicroState& m, int unit, size_t pos);
  void backward(MicroState& m, const UnitPass& p, size_t pos, float seed_scale);

  Context& x_;
  ParamResidency& params_;
  GradReduction& grads_;
  std::vector<bool> checkpoint_;
  bool has_loss_;
  ActivationOffload* act_;
  // The plan: the passes, each Unit's last gradient-ending pass (after it the Unit's group holds
  // the step's final gradient), the last pass that reads parameters (stage 3 then releases all),
  // each pass's index in the gather order (-1: reads none), passes per micro-batch.
  std::vector<UnitPass> passes_;
  std::vector<size_t> last_grad_;
  size_t last_reader_ = 0;
  std::vector<long> order_pos_;
  std::vector<int> order_;
  std::vector<int> count_;
};

}  // namespace zero::engine
