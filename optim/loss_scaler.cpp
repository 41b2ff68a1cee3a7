#include "optim/loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.hpp"

namespace zero::optim {
namespace {

// A scale as a user reads it: 65536, 0.25, 1e-05 (never "65536.000000").
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

bool positive_finite(double v) { return std::isfinite(v) && v > 0.0; }

}  // namespace

LossScaler::LossScaler(const LossScalerOptions& o) : options_(o) {
  if (!o.enabled) {
    mode_ = LossScaleMode::none;
    state_.scale = 1.0;
    return;
  }
  if (o.loss_scale != 0.0) {
    ZERO_REQUIRE(positive_finite(o.loss_scale),
                 "fp16.loss_scale must be 0 (dynamic scaling) or a positive finite static scale, "
                 "got " + num(o.loss_scale));
    mode_ = LossScaleMode::static_scale;
    state_.scale = o.loss_scale;
    return;
  }
  mode_ = LossScaleMode::dynamic;
  // The scale multiplies an fp32 loss: 2^power must be a normal, finite float.
  ZERO_REQUIRE(o.initial_scale_power >= -126 && o.initial_scale_power <= 127,
               "fp16.initial_scale_power must be in [-126, 127] (the first scale is 2^power, an "
               "fp32 value), got " + std::to_string(o.initial_scale_power));
  ZERO_REQUIRE(o.loss_scale_window >= 1,
               "fp16.loss_scale_window must be >= 1, got " + std::to_string(o.loss_scale_window));
  ZERO_REQUIRE(o.hysteresis >= 1, "fp16.hysteresis must be >= 1, got " +
                                      std::to_string(o.hysteresis));
  ZERO_REQUIRE(positive_finite(o.min_loss_scale),
               "fp16.min_loss_scale must be positive and finite, got " + num(o.min_loss_scale));
  state_.scale = std::ldexp(1.0, o.initial_scale_power);
  state_.cur_hysteresis = o.hysteresis;
}

ScaleUpdate LossScaler::update(bool overflow) {
  ScaleUpdate u;
  u.step_scale = state_.scale;
  switch (mode_) {
    case LossScaleMode::none:
      u.apply = !(overflow && options_.skip_nonfinite);
      break;
    case LossScaleMode::static_scale:
      u.apply = !overflow;
      break;
    case LossScaleMode::dynamic: {
      LossScalerState& s = state_;
      const LossScalerOptions& o = options_;
      if (overflow) {
        if (o.hysteresis == 1 || s.cur_hysteresis == 1) {
          if (s.scale == o.min_loss_scale)
            ZERO_FAIL(
                "fp16 loss scale is at its minimum (fp16.min_loss_scale = " + num(s.scale) +
                ") and the gradients still overflow (inf/NaN) at optimizer step " +
                std::to_string(s.cur_iter) +
                ". The gradients overflow even at the smallest allowed scale: training has "
                "diverged, most often because the learning rate is too high. The step was not "
                "applied. HINT: resume from an earlier checkpoint with a lower learning rate "
                "(optimizer.params.lr), a longer warmup (scheduler.params.warmup_num_steps) or "
                "gradient_clipping, or train in bf16 (\"bf16\": {\"enabled\": true}), which needs "
                "no loss scaling; lowering fp16.min_loss_scale only postpones this.");
          s.scale = std::max(s.scale / 2.0, o.min_loss_scale);
        } else {
          s.cur_hysteresis -= 1;
        }
        s.last_overflow_iter = s.cur_iter;
      } else {
        if (o.consecutive_hysteresis) s.cur_hysteresis = o.hysteresis;
        const int64_t stable = s.cur_iter - s.last_overflow_iter - 1;
        if (stable > 0 && stable % o.loss_scale_window == 0) {
          if (!o.consecutive_hysteresis) s.cur_hysteresis = o.hysteresis;
          s.scale *= 2.0;
        }
      }
      s.cur_iter += 1;
      u.apply = !overflow;
      break;
    }
  }
  if (!u.apply) state_.skipped_steps += 1;
  return u;
}

void LossScaler::restore(const LossScalerState& s) {
  ZERO_REQUIRE(positive_finite(s.scale),
               "loss scaler state: the scale must be positive and finite, got " + num(s.scale));
  ZERO_REQUIRE(s.cur_iter >= 0 && s.skipped_steps >= 0 && s.last_overflow_iter >= -1 &&
                   s.last_overflow_iter < s.cur_iter,
               "loss scaler state: inconsistent counters (cur_iter " + std::to_string(s.cur_iter) +
                   ", last_overflow_iter " + std::to_string(s.last_overflow_iter) + ")");
  if (mode_ == LossScaleMode::dynamic) {
    ZERO_REQUIRE(s.cur_hysteresis >= 1 && s.cur_hysteresis <= options_.hysteresis,
                 "loss scaler state: cur_hysteresis " + std::to_string(s.cur_hysteresis) +
                     " is outside [1, fp16.hysteresis = " + std::to_string(options_.hysteresis) +
                     "]");
    state_ = s;
  } else {
    // Static and no scaling: the scale is the configured one, whatever was saved.
    const double scale = state_.scale;
    state_ = s;
    state_.scale = scale;
  }
}

}  // namespace zero::optim
