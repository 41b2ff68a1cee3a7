// The fp16 loss scaler: DeepSpeed's DynamicLossScaler (dynamic) and LossScaler (static), step for
// step, so a run here shows the same loss-scale sequence and skips the same steps as DeepSpeed
// given the same overflow pattern (deepspeed/runtime/fp16/loss_scaler.py, update_scale).
//
// Use, once per optimizer step (not per micro-batch):
//   backward on   loss * scale()                     (the gradients carry the factor scale())
//   overflow  =   any rank's gradient holds inf/NaN  (clip.hpp: !GlobalNorm::finite)
//   u = update(overflow)                             may throw at the minimum scale, see below
//   if (!u.apply) drop the gradients, skip the step  (the scale has already been adjusted)
//   else divide the gradients by u.step_scale        (clip.hpp: prepare_step folds it in)
//
// Dynamic scaling (fp16, loss_scale 0). The scale starts at 2^initial_scale_power. State: the
// scale, cur_iter (update() calls so far), last_overflow_iter (-1 at start) and cur_hysteresis
// (starts at `hysteresis`, DeepSpeed's delayed_shift). update(overflow) at iteration cur_iter:
//   overflow:  if hysteresis == 1 or cur_hysteresis == 1:
//                  scale == min_loss_scale  ->  throw zero::Error (nothing changes)
//                  else scale = max(scale / 2, min_loss_scale)      (cur_hysteresis stays 1)
//              else cur_hysteresis -= 1                              (scale unchanged)
//              last_overflow_iter = cur_iter
//   clean:     if consecutive_hysteresis: cur_hysteresis = hysteresis
//              stable = cur_iter - last_overflow_iter - 1
//              if stable > 0 and stable % loss_scale_window == 0:
//                  if !consecutive_hysteresis: cur_hysteresis = hysteresis
//                  scale *= 2
//   cur_iter += 1
// So the first doubling comes at the (window+1)-th clean step in a row (cur_iter - last_overflow
// - 1 == window), then every `window` clean steps; without consecutive_hysteresis, hysteresis is
// refilled only when the scale doubles, so after the first halving every further overflow halves
// at once until the scale has grown again.
//
// Static scaling (fp16, loss_scale > 0): the scale never changes; an overflow still skips the step.
// No scaling (bf16/fp32, enabled false): scale 1; an overflow skips the step only when
// skip_nonfinite is set (DeepSpeed's bf16 default applies it, inf/NaN and all).
//
// The minimum. An overflow that would halve a scale already equal to min_loss_scale throws
// zero::Error saying so: the gradients overflow even at the smallest allowed scale, i.e. training
// has diverged. It is thrown before any state changes and before the step is applied, so the
// parameters and the last checkpoint stay sound.
//
// Thread-safety: a plain value; one thread at a time. Every rank must call update() with the same
// overflow flag (the all-reduced one) so that the scales stay identical across ranks.
#pragma once

#include <cstdint>

namespace zero::optim {

// The "fp16" block's fields (runtime/config: config::Fp16), plus what bf16/fp32 need.
struct LossScalerOptions {
  bool enabled = false;                 // fp16: scale the loss; false (bf16/fp32): scale 1
  double loss_scale = 0.0;              // 0 = dynamic scaling, > 0 = this static scale
  int initial_scale_power = 16;         // dynamic: the first scale is 2^this
  int64_t loss_scale_window = 1000;     // dynamic: clean steps before the scale doubles (>= 1)
  int hysteresis = 2;                   // dynamic: overflows tolerated before halving (>= 1)
  bool consecutive_hysteresis = false;  // dynamic: refill hysteresis on every clean step
  double min_loss_scale = 1.0;          // dynamic: the floor; an overflow at it throws
  bool skip_nonfinite = false;          // enabled == false only: skip overflowed steps
};

enum class LossScaleMode { none, static_scale, dynamic };

// Everything update() depends on: what a checkpoint saves (DeepSpeed pickles the same fields).
struct LossScalerState {
  double scale = 1.0;
  int64_t cur_iter = 0;             // update() calls so far (skipped steps included)
  int64_t last_overflow_iter = -1;  // cur_iter of the last overflow; -1: none yet
  int cur_hysteresis = 1;           // overflows left before the next halving
  int64_t skipped_steps = 0;        // steps skipped for overflow (DeepSpeed engine.skipped_steps)
};

// What update() decided for the step whose gradients were just checked.
struct ScaleUpdate {
  bool apply = true;        // false: overflow, skip the optimizer step and drop the gradients
  double step_scale = 1.0;  // the scale this step's gradients carry (the scale before update())
};

class LossScaler {
 public:
  // Throws zero::Error naming the fp16.* key when an option is out of range.
  explicit LossScaler(const LossScalerOptions& options);

  LossScaleMode mode() const noexcept { return mode_; }
  const LossScalerOptions& options() const noexcept { return options_; }
  // The scale for the next backward: multiply the loss by it.
  double scale() const noexcept { return state_.scale; }
  // Ends an optimizer step: `overflow` is whether any gradient of any rank holds inf/NaN.
  // Dynamic mode at the minimum scale: throws zero::Error (see the top of this file).
  ScaleUpdate update(bool overflow);
  // Steps skipped so far for overflow (DeepSpeed's engine.skipped_steps).
  int64_t skipped_steps() const noexcept { return state_.skipped_steps; }

  LossScalerState state() const noexcept { return state_; }
  // Continues from a saved state (a checkpoint); throws zero::Error when it is impossible for
  // these options (scale not positive and finite, cur_hysteresis outside [1, hysteresis], ...).
  // Static and no scaling keep their configured scale and take only the counters.
  void restore(const LossScalerState& s);

 private:
  LossScalerOptions options_;
  LossScaleMode mode_;
  LossScalerState state_;
};

}  // namespace zero::optim
