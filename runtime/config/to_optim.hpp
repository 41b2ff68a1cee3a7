// The config's blocks as optim/'s own option structs. optim/ may not depend on runtime/ (arrows
// point down), so it declares structs with the same fields and the engine converts here. Header
// only: field-by-field copies, no link dependency of zero_config on zero_optim.
//
//   fp16 / bf16      -> optim::LossScalerOptions   (loss scaling only when fp16.enabled)
//   scheduler        -> optim::ScheduleSpec        (same names; last_batch_iteration moved up)
//   gradient_clipping   is passed as it is (max_norm, 0 = off)
#pragma once

#include <type_traits>
#include <variant>

#include "optim/loss_scaler.hpp"
#include "optim/lr_schedule.hpp"
#include "runtime/config/config.hpp"

namespace zero::config {

inline optim::LossScalerOptions to_loss_scaler_options(const Fp16& fp16, const Bf16& bf16) {
  optim::LossScalerOptions o;
  o.enabled = fp16.enabled;
  o.loss_scale = fp16.loss_scale;
  o.initial_scale_power = fp16.initial_scale_power;
  o.loss_scale_window = fp16.loss_scale_window;
  o.hysteresis = fp16.hysteresis;
  o.consecutive_hysteresis = fp16.consecutive_hysteresis;
  o.min_loss_scale = fp16.min_loss_scale;
  // bf16/fp32: DeepSpeed applies non-finite steps unless bf16.check_grad_overflow.
  o.skip_nonfinite = !fp16.enabled && bf16.enabled && bf16.check_grad_overflow;
  return o;
}

namespace detail {

inline optim::WarmupType to_optim(WarmupType t) {
  return t == WarmupType::linear ? optim::WarmupType::linear : optim::WarmupType::log;
}

inline optim::WarmupLRParams to_optim(const WarmupLR& p) {
  optim::WarmupLRParams o;
  o.warmup_min_lr = p.warmup_min_lr;
  o.warmup_max_lr = p.warmup_max_lr;
  o.warmup_num_steps = p.warmup_num_steps;
  o.warmup_type = to_optim(p.warmup_type);
  return o;
}

inline optim::WarmupDecayLRParams to_optim(const WarmupDecayLR& p) {
  optim::WarmupDecayLRParams o;
  static_cast<optim::WarmupLRParams&>(o) = to_optim(static_cast<const WarmupLR&>(p));
  o.total_num_steps = p.total_num_steps;
  return o;
}

inline optim::WarmupCosineLRParams to_optim(const WarmupCosineLR& p) {
  optim::WarmupCosineLRParams o;
  o.total_num_steps = p.total_num_steps;
  o.warmup_min_ratio = p.warmup_min_ratio;
  o.warmup_num_steps = p.warmup_num_steps;
  o.cos_min_ratio = p.cos_min_ratio;
  o.warmup_type = to_optim(p.warmup_type);
  return o;
}

inline optim::OneCycleParams to_optim(const OneCycle& p) {
  optim::OneCycleParams o;
  o.cycle_min_lr = p.cycle_min_lr;
  o.cycle_max_lr = p.cycle_max_lr;
  o.decay_lr_rate = p.decay_lr_rate;
  o.cycle_first_step_size = p.cycle_first_step_size;
  o.cycle_second_step_size = p.cycle_second_step_size;  // the parser resolved "absent = first"
  o.cycle_first_stair_count = p.cycle_first_stair_count;
  o.cycle_second_stair_count = p.cycle_second_stair_count;
  o.decay_step_size = p.decay_step_size;
  o.cycle_momentum = p.cycle_momentum;
  o.cycle_min_mom = p.cycle_min_mom;
  o.cycle_max_mom = p.cycle_max_mom;
  o.decay_mom_rate = p.decay_mom_rate;
  return o;
}

inline optim::LRRangeTestParams to_optim(const LRRangeTest& p) {
  optim::LRRangeTestParams o;
  o.lr_range_test_min_lr = p.lr_range_test_min_lr;
  o.lr_range_test_step_size = p.lr_range_test_step_size;
  o.lr_range_test_step_rate = p.lr_range_test_step_rate;
  o.lr_range_test_staircase = p.lr_range_test_staircase;
  return o;
}

}  // namespace detail

inline optim::ScheduleSpec to_schedule_spec(const Scheduler& s) {
  optim::ScheduleSpec spec;
  std::visit(
      [&](const auto& p) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(p)>, std::monostate>) {
          spec.params = detail::to_optim(p);
          spec.last_batch_iteration = p.last_batch_iteration;
        }
      },
      s.params);
  return spec;
}

}  // namespace zero::config
