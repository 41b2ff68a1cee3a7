// StepGuard: stops a run that no longer trains, instead of letting it end "successfully" with a
// loss of NaN. The training loop hands it every optimizer step's StepStats and the step's mean
// loss over all ranks (the same values on every rank, so every rank decides alike).
//
// A step did not train when it was skipped (its gradients were not finite: the engine skips
// such steps in fp32, bf16 and fp16) or its loss or gradient norm is not finite (NaN or
// infinity). Then:
//   - a SKIPPED step changed nothing; the run stops when `max_skipped` of them come in a row
//     (DeepSpeed's fp16 scaler, by default, gives up after 18 overflows in a row: see
//     docs/training.md). Steps where fp16's dynamic loss scaler lowered its scale do not count:
//     the scaler is still looking for a scale that fits, and its floor (fp16.min_loss_scale)
//     ends that search with its own error;
//   - a step with non-finite gradients that was nevertheless APPLIED (an engine configured not
//     to skip them) put NaN into the parameters and Adam's moments, and no later step can
//     recover: the run stops at that step;
//   - a run that ends without one step that trained (all of them shorter than the bound) ends
//     with at_end()'s error rather than "done".
// max_skipped 0 turns all three off (DeepSpeed's behaviour for bf16 and fp32).
//
// Thread-safety: a plain value, one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/engine/engine.hpp"

namespace zero {

class StepGuard {
 public:
  // The default of zero_train.max_consecutive_skipped_steps.
  static constexpr int64_t kDefaultMaxSkipped = 20;

  // `start`: the step the run continues from (a resumed run's checkpoint step), 0 for a new run.
  explicit StepGuard(int64_t max_skipped = kDefaultMaxSkipped, int64_t start = 0)
      : max_(max_skipped), start_(start), last_good_(start) {}

  // After optimizer step `step`: nullopt to go on, or why the run must stop (one paragraph, a
  // HINT line at its end). `loss` is the step's mean loss over every rank.
  std::optional<std::string> after_step(int64_t step, const StepStats& stats, double loss);
  // After the run's last step (`step`): nullopt, or why the run must not end as done: not one of
  // its steps trained.
  std::optional<std::string> at_end(int64_t step) const;

  // Steps in a row that did not train, up to the last one (scale-lowering steps included).
  int64_t not_trained_in_a_row() const noexcept { return streak_; }
  // Of those, the ones counted against max_skipped.
  int64_t counted_in_a_row() const noexcept { return counted_; }
  // The last step that trained (`start` when none has yet).
  int64_t last_good_step() const noexcept { return last_good_; }

 private:
  std::string last_good_text() const;

  int64_t max_;
  int64_t start_;
  int64_t last_good_;
  int64_t streak_ = 0, counted_ = 0;
};

}  // namespace zero
