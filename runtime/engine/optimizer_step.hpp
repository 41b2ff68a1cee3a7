// The optimizer step at the boundary of a step: the global gradient norm, fp16 overflow and the
// loss scale, clipping, and AdamW on this rank's owned range (on the compute stream with the
// state on the device, on the host optimizer thread with offload), each group's updated working
// parameters then all-gathered (ParamResidency::gather_whole).
//
// AdamW's fp32 state (master, m, v) of the owned range lives on the device, or on the host with
// offload (HostOffload). With fp32 parameters and no offload the working parameters are their
// own master copy (keeps(0) is false).
//
// The speculative host step (offload, EngineOptions::speculative_host_step): before the last
// micro-batch plan_speculation() guesses the step will be applied unclipped; each group's AdamW
// then runs as soon as its final gradient has landed (landed()), into the second bank. apply()
// keeps those results when the step it computes is the guessed one bit for bit, and otherwise
// runs AdamW again from the untouched bank. After a clipped or skipped step it does not guess.
//
// Ownership and threading: owns AdamW's device state, the norms' scratch, the loss scaler and the
// step counters; only the thread driving the Engine calls it (host AdamW runs on HostOffload's
// optimizer thread). apply() blocks the host for the norm (one small copy and, over ranks, one
// all-reduce) and, with offload, for each group's host AdamW and its copy up.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "optim/adam.hpp"
#include "optim/clip.hpp"
#include "optim/loss_scaler.hpp"
#include "runtime/engine/context.hpp"
#include "runtime/engine/grad_reduction.hpp"
#include "runtime/engine/host_offload.hpp"
#include "runtime/engine/param_residency.hpp"

namespace zero::engine {

class OptimizerStep {
 public:
  // `host`: null without offload_optimizer. All must outlive this.
  OptimizerStep(Context& x, ParamResidency& params, GradReduction& grads, HostOffload* host);

  // The device-resident AdamW state (zeros) and the norms' scratch. `speculative`: the host has
  // the second bank.
  void allocate(bool speculative);

  // Whether AdamW keeps fp32 array k (0 master, 1 m, 2 v): no master with fp32 parameters and
  // no offload (the working parameters are their own master).
  bool keeps(int k) const;
  // Between steps (streams synchronized): elements [off, off + n) of group g's owned range of
  // array k, in the current bank, copied out to host memory dst, or in from host memory src
  // (null: zeros). Wherever the state lives: device, host, or swap files (OptimizerSwap).
  void read_state(int g, int k, int64_t off, float* dst, int64_t n);
  void write_state(int g, int k, int64_t off, const float* src, int64_t n);

  // Step start: nothing runs ahead yet (but with NVMe offload the first groups' reads).
  void begin_step() {
    speculating_ = false;
    spec_order_.clear();
    if (host_) host_->prefetch_state();
  }
  // Before the last micro-batch: whether its groups' AdamW runs ahead, and the step it assumes
  // (the next applied step, unclipped, at the loss scale the gradients are computed at).
  void plan_speculation();
  // Offload: group g's shard has landed (HostOffload::land); if final and speculating, its AdamW
  // runs ahead.
  void landed(int g, bool last);
  // The boundary, after GradReduction::finish(): norm, scale, clipping, AdamW, all-gathers.
  StepStats apply(double loss);
  // New state was installed (checkpoint, set_parameters): both banks agree again.
  void state_replaced();

  // The loss scale the next step's gradients are computed at (1 without fp16 scaling).
  double loss_scale() const { return scaler ? scaler->scale() : 1.0; }

  int64_t steps = 0;    // optimizer steps taken, skipped (fp16 overflow) ones included
  int64_t applied = 0;  // steps applied: Adam's t and the LR schedule's position, as in
                        // DeepSpeed, where a skipped step calls neither optimizer nor scheduler
  std::unique_ptr<optim::LossScaler> scaler;

 private:
  const unsigned char* grad(int g) const { return host_ ? host_->grad(g) : grads_.device_grad(g); }
  DType grad_type() const { return host_ ? host_->grad_type() : grads_.grad_type(); }
  // The AdamStep of applied step t with a global gradient scale (StepScale::grad_scale): the one
  // place that knows the arithmetic, so that the guess made before the norm and the step taken
  // after it are equal bits exactly when they are the same step.
  optim::AdamStep adam_step(int64_t t, float grad_scale, optim::AdamParams& hp) const;
  // The sum over ranks of each rank's `local` squared norm, as optim::global_grad_norm gives it;
  // over a device communicator (NCCL) through a device scalar.
  optim::GlobalNorm global_norm(float local);
  // Over a pipeline (stages) or a tensor group: (the sum of every member's squared norm, the
  // last member's loss), the same bits on every member.
  std::pair<double, double> exchange(coll::Communicator& c, double sq_mine, double loss);
  // Array k of group g's owned range from element lo on (`other`: the bank the speculative step
  // writes); null for an array not kept. With NVMe offload only inside the AdamW task of the
  // sub-group starting at lo.
  float* state(int g, int k, bool other, int64_t lo) const;
  // AdamW on elements [lo, lo + n) of group g's owned range (n < 0: to its end).
  void adam_group(int g, const optim::AdamStep& as, const optim::AdamParams& base, bool ahead = false,
                  int64_t lo = 0, int64_t n = -1);
  void timed_adam(int g, const optim::AdamStep& as, const optim::AdamParams& hp, bool ahead, int64_t lo,
                  int64_t n);

  Context& x_;
  ParamResidency& params_;
  GradReduction& grads_;
  HostOffload* host_;
  Tensor master_, m_, v_;  // on the device (without offload)
  // Per norm run (Context::norm_runs, one per group but for tied copies) the squared norm of its
  // final gradient, then one more float: the scalar the norm's all-reduce runs on when the
  // communicator takes device buffers (NCCL), then a pipeline stage's exchange area.
  Tensor norms_;
  int64_t norm_slots_ = 0;      // norm runs over all groups (Context::norm_runs)
  bool spec_ = false;           // the host holds a second bank
  // Per group, which bank holds the current state; AdamW run ahead writes the other one, and
  // keeping its result flips bank_[g] (dropping it costs nothing).
  std::vector<uint8_t> bank_;
  bool guess_next_ = true;      // the last step was applied unclipped: guess so again
  bool speculating_ = false;    // this step's last micro-batch runs AdamW ahead
  optim::AdamStep spec_as_;     // the step it assumes: applied, unclipped
  optim::AdamParams spec_hp_;
  std::vector<int> spec_order_;  // groups whose AdamW ran ahead, in the order they landed
};

}  // namespace zero::engine
