#include "runtime/engine/step_guard.hpp"

#include <cmath>
#include <cstdio>

namespace zero {

namespace {

std::string number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

const char* const kHint =
    "\nHINT: the run has diverged or its input is broken. Lower the learning rate "
    "(optimizer.params.lr) or lengthen the warmup (scheduler.params.warmup_num_steps), keep "
    "gradient_clipping on, check the data and the weights given to --init-from; with fp16, train "
    "in bf16 (\"bf16\": {\"enabled\": true}). Then resume from the last checkpoint (--resume), or "
    "start again.";

}  // namespace

std::string StepGuard::last_good_text() const {
  if (last_good_ == 0) return "No step has trained yet.";
  return "The last step that trained was " + std::to_string(last_good_) +
         (last_good_ == start_ ? " (before this run resumed)." : ".");
}

std::optional<std::string> StepGuard::after_step(int64_t step, const StepStats& st, double loss) {
  const bool finite = std::isfinite(loss) && std::isfinite(st.grad_norm);
  if (st.applied && finite) {
    streak_ = counted_ = 0;
    last_good_ = step;
    return std::nullopt;
  }
  ++streak_;
  // fp16's dynamic scaler lowered its scale at this step: it is still searching (see the header).
  const bool searching = !st.applied && st.next_loss_scale < st.loss_scale;
  if (!searching) ++counted_;
  if (max_ <= 0) return std::nullopt;
  const std::string values =
      "loss " + number(loss) + ", gradient norm " + number(static_cast<double>(st.grad_norm));
  if (st.applied && !std::isfinite(st.grad_norm))
    return "training stopped at step " + std::to_string(step) + ": its gradients were not finite (" +
           values + ") and the step was applied, so the parameters and Adam's moments are no "
           "longer finite; that state is not saved, and no later step could train. " +
           last_good_text() + kHint;
  if (counted_ < max_) return std::nullopt;
  const std::string lowering =
      streak_ > counted_ ? "; " + std::to_string(streak_ - counted_) +
                               " more while the fp16 loss scale came down, which do not count"
                         : "";
  return "training stopped at step " + std::to_string(step) + ": " + std::to_string(counted_) +
         " steps in a row did not train (skipped for non-finite gradients, or a non-finite loss; "
         "at this step " + values + ", loss scale " + number(st.loss_scale) + lowering +
         "), the most zero_train.max_consecutive_skipped_steps allows (" + std::to_string(max_) +
         "). " + last_good_text() + kHint;
}

std::optional<std::string> StepGuard::at_end(int64_t step) const {
  if (max_ <= 0 || counted_ == 0 || last_good_ != start_) return std::nullopt;
  return "the run ended at step " + std::to_string(step) + " without one step that trained: all " +
         std::to_string(streak_) + " were skipped for non-finite gradients or had a non-finite "
         "loss (fewer than zero_train.max_consecutive_skipped_steps = " + std::to_string(max_) +
         ", which would have stopped a longer run)." + kHint;
}

}  // namespace zero
