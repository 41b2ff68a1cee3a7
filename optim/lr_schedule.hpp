// Learning-rate schedules: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle and
// LRRangeTest (deepspeed/runtime/lr_schedules.py), value for value, plus a constant schedule when
// no "scheduler" block is configured. docs/loss-scaling-and-clipping.md lists the formulas.
//
// The step counter. DeepSpeed's schedulers count with last_batch_iteration: -1 before training;
// the engine calls scheduler.step() after every APPLIED optimizer step (a step skipped for fp16
// overflow does not count), which increments it and sets the optimizer's lr (and OneCycle's
// betas) from the formula at the new value. So the k-th applied optimizer step of a run (k = 0,
// 1, ...) runs with
//        lr(L0 + k),    L0 = the last_batch_iteration the run starts from (-1 when fresh),
// and every function below takes that value, `it` = DeepSpeed's last_batch_iteration (>= -1).
// A checkpoint saves it (DeepSpeed: scheduler.state_dict() = {last_batch_iteration}); LrCursor
// below keeps it. At it = -1 each schedule gives what DeepSpeed's constructor puts in the
// optimizer before the first step (WarmupLR: warmup_min_lr; WarmupCosineLR: 0; OneCycle:
// cycle_min_lr and beta1 = cycle_min_mom; LRRangeTest: lr_range_test_min_lr).
// One difference: DeepSpeed leaves the optimizer's own lr in place for the first step of a fresh
// run configured with last_batch_iteration != -1 (its constructor sets the lr only at -1); here
// that step runs with lr(L0), as it does when resuming from a checkpoint.
//
// Thread-safety: schedules are immutable after construction; lr()/beta1() may be called from any
// thread. An LrCursor is a plain value.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <variant>

namespace zero::optim {

// ---- the "scheduler.params" blocks, DeepSpeed's names and defaults (runtime/config mirrors
// them in config::WarmupLR etc.; runtime/config/to_optim.hpp converts) ----------------------------

enum class WarmupType { log, linear };

struct WarmupLRParams {
  double warmup_min_lr = 0.0;                // lr at it <= 0
  double warmup_max_lr = 1e-3;               // lr from it = warmup_num_steps on
  int64_t warmup_num_steps = 1000;           // N (>= 0); the formulas use max(2, N)
  WarmupType warmup_type = WarmupType::log;  // log: ln(it+1)/ln(N); linear: it/N
};

struct WarmupDecayLRParams : WarmupLRParams {
  int64_t total_num_steps = 0;  // T: the lr falls linearly back to warmup_min_lr at it = T
};

struct WarmupCosineLRParams {
  int64_t total_num_steps = 0;               // T: the cosine ends at it = T - 1
  double warmup_min_ratio = 0.0;             // lr at it = 0, as a ratio of the optimizer lr
  int64_t warmup_num_steps = 1000;           // N (>= 0); the formulas use max(2, N)
  double cos_min_ratio = 1e-4;               // lr at the end, as a ratio of the optimizer lr
  WarmupType warmup_type = WarmupType::log;
};

struct OneCycleParams {
  double cycle_min_lr = 0.0;                // lr at the cycle's ends
  double cycle_max_lr = 0.0;                // lr at the cycle's peak
  double decay_lr_rate = 0.0;               // after the cycle: min_lr / (1 + rate * i / size)
  int64_t cycle_first_step_size = 2000;     // rising half, in steps (>= 1)
  int64_t cycle_second_step_size = 2000;    // falling half (DeepSpeed: absent = first)
  int64_t cycle_first_stair_count = 0;      // stairs in the rising half; 0 = continuous
  int64_t cycle_second_stair_count = 0;     // stairs in the falling half (absent = first)
  int64_t decay_step_size = 0;              // after the cycle; 0 = no decay (lr and momentum)
  bool cycle_momentum = true;               // cycle beta1 inversely to the lr
  double cycle_min_mom = 0.8;               // beta1 at the lr peak
  double cycle_max_mom = 0.9;               // beta1 at the cycle's ends
  double decay_mom_rate = 0.0;              // after the cycle: max_mom * (1 + rate * i / size)
};

struct LRRangeTestParams {
  double lr_range_test_min_lr = 1e-3;        // lr at it = -1
  int64_t lr_range_test_step_size = 2000;    // steps per increase (>= 1)
  double lr_range_test_step_rate = 1.0;      // increase per step_size, relative to min_lr
  bool lr_range_test_staircase = false;      // floor the interval count
};

struct ScheduleSpec {
  // monostate: no scheduler, the lr stays at the optimizer's lr.
  std::variant<std::monostate, WarmupLRParams, WarmupDecayLRParams, WarmupCosineLRParams,
               OneCycleParams, LRRangeTestParams>
      params;
  int64_t last_batch_iteration = -1;  // where the run starts (L0 above); -1 = fresh
};

// ---- the schedules -------------------------------------------------------------------------------

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The learning rate DeepSpeed's scheduler sets when last_batch_iteration == it (it >= -1).
  virtual double lr(int64_t it) const = 0;
  // OneCycle with cycle_momentum: Adam's beta1 at `it`; nullopt: leave beta1 as configured.
  virtual std::optional<double> beta1(int64_t /*it*/) const { return std::nullopt; }
  // OneCycle with cycle_momentum sets betas = (momentum, 0.99): DeepSpeed replaces Adam's beta2
  // by 0.99 for the whole run. nullopt: leave beta2 as configured.
  virtual std::optional<double> beta2(int64_t /*it*/) const { return std::nullopt; }
  // "WarmupLR", ..., "constant": for the log.
  virtual std::string_view name() const noexcept = 0;
};

// The schedule `spec` describes. `optimizer_lr` (optimizer.params.lr) is the constant schedule's
// lr and WarmupCosineLR's base. Throws zero::Error naming the scheduler.params key when a value
// makes the formulas meaningless (warmup_num_steps < 0, a step size < 1, ...).
std::unique_ptr<LrSchedule> make_lr_schedule(const ScheduleSpec& spec, double optimizer_lr);

// Where a run is in its schedule: DeepSpeed's scheduler object, reduced to its counter.
//   the optimizer step about to run uses lr() / beta1() / beta2();
//   after an applied step call step(); after a skipped (overflow) step do nothing.
// The schedule must outlive the cursor.
class LrCursor {
 public:
  LrCursor(const LrSchedule& schedule, int64_t last_batch_iteration = -1);

  double lr() const { return schedule_->lr(it_); }
  std::optional<double> beta1() const { return schedule_->beta1(it_); }
  std::optional<double> beta2() const { return schedule_->beta2(it_); }
  void step() noexcept { ++it_; }
  // What a checkpoint saves, and what the next run passes back to the constructor.
  int64_t last_batch_iteration() const noexcept { return it_; }

 private:
  const LrSchedule* schedule_;
  int64_t it_;
};

}  // namespace zero::optim
