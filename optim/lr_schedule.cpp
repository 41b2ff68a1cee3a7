// Each formula below is DeepSpeed's (deepspeed/runtime/lr_schedules.py), written with the same
// floating-point operations in the same order, so the values agree to the last bit wherever the
// C library's log/cos agree with Python's (they are the same libm calls).
#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.hpp"

namespace zero::optim {
namespace {

double as_double(int64_t v) { return static_cast<double>(v); }

void require_at_least(int64_t v, int64_t min, std::string_view key, std::string_view schedule) {
  ZERO_REQUIRE(v >= min, "scheduler.params." + std::string(key) + " must be >= " +
                             std::to_string(min) + " for " + std::string(schedule) + ", got " +
                             std::to_string(v));
}

// The warmup fraction shared by WarmupLR, WarmupDecayLR and WarmupCosineLR, valid for
// 0 <= it < n (n = max(2, warmup_num_steps)): ln(it+1)/ln(n) or it/n.
struct Warmup {
  Warmup(WarmupType type, int64_t warmup_num_steps)
      : type(type),
        n(std::max<int64_t>(2, warmup_num_steps)),
        inverse_log(1.0 / std::log(as_double(n))) {}

  double fraction(int64_t it) const {
    return type == WarmupType::log ? inverse_log * std::log(as_double(it + 1))
                                   : as_double(it) / as_double(n);
  }

  WarmupType type;
  int64_t n;           // DeepSpeed's self.warmup_num_steps = max(2, warmup_num_steps)
  double inverse_log;  // 1 / ln(n)
};

class Constant final : public LrSchedule {
 public:
  explicit Constant(double lr) : lr_(lr) {}
  double lr(int64_t) const override { return lr_; }
  std::string_view name() const noexcept override { return "constant"; }

 private:
  double lr_;
};

// lr = min + (max - min) * gamma(it); before the first step (it < 0) DeepSpeed returns min.
class WarmupLR : public LrSchedule {
 public:
  WarmupLR(const WarmupLRParams& p, std::string_view name)
      : warmup_(p.warmup_type, p.warmup_num_steps),
        min_(p.warmup_min_lr),
        delta_(p.warmup_max_lr - p.warmup_min_lr),
        name_(name) {
    // 0 and 1 are allowed and count as 2 (DeepSpeed since 2021, PR #772): Hugging Face's Trainer
    // fills "auto" with its --warmup_steps, 0 by default.
    require_at_least(p.warmup_num_steps, 0, "warmup_num_steps", name);
  }

  double lr(int64_t it) const override {
    if (it < 0) return min_;
    return min_ + delta_ * gamma(it);
  }
  std::string_view name() const noexcept override { return name_; }

 protected:
  virtual double gamma(int64_t it) const {
    return it < warmup_.n ? warmup_.fraction(it) : 1.0;
  }

  Warmup warmup_;

 private:
  double min_, delta_;
  std::string_view name_;
};

// After the warmup, gamma falls linearly from 1 at it = n to 0 at it = total_num_steps: the lr
// returns to warmup_min_lr (DeepSpeed; "decays to 0" only when warmup_min_lr is 0).
class WarmupDecayLR final : public WarmupLR {
 public:
  explicit WarmupDecayLR(const WarmupDecayLRParams& p)
      : WarmupLR(p, "WarmupDecayLR"), total_(p.total_num_steps) {}

 private:
  double gamma(int64_t it) const override {
    if (it < warmup_.n) return warmup_.fraction(it);
    return std::max(0.0, as_double(total_ - it) / std::max(1.0, as_double(total_ - warmup_.n)));
  }

  int64_t total_;
};

// lr = optimizer lr * ratio(it). Warmup from warmup_min_ratio to 1, then a half cosine from 1 to
// cos_min_ratio reached at it = total - 1 and held there (DeepSpeed clamps the progress to 1).
class WarmupCosineLR final : public LrSchedule {
 public:
  WarmupCosineLR(const WarmupCosineLRParams& p, double optimizer_lr)
      : warmup_(p.warmup_type, p.warmup_num_steps),
        total_(p.total_num_steps),
        warmup_min_ratio_(p.warmup_min_ratio),
        cos_min_ratio_(p.cos_min_ratio),
        base_lr_(optimizer_lr) {
    require_at_least(p.warmup_num_steps, 0, "warmup_num_steps", "WarmupCosineLR");  // as WarmupLR
  }

  double lr(int64_t it) const override {
    if (it < 0) return 0.0;  // DeepSpeed: lr 0 before the first scheduler step
    return base_lr_ * ratio(it);
  }
  std::string_view name() const noexcept override { return "WarmupCosineLR"; }

 private:
  double ratio(int64_t it) const {
    if (it < warmup_.n)
      return warmup_min_ratio_ + warmup_.fraction(it) * (1.0 - warmup_min_ratio_);
    const double real_last_step = as_double(it - warmup_.n + 1);
    const double real_total_steps = as_double(std::max<int64_t>(1, total_ - warmup_.n));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }

  Warmup warmup_;
  int64_t total_;
  double warmup_min_ratio_, cos_min_ratio_, base_lr_;
};

// One cycle of total = first + second steps, indexed by b = it + 1: the lr rises from min to max
// over the first half and falls back over the second (momentum the other way round), then decays.
class OneCycle final : public LrSchedule {
 public:
  explicit OneCycle(const OneCycleParams& p)
      : p_(p),
        first_(as_double(p.cycle_first_step_size)),
        second_(as_double(p.cycle_second_step_size)),
        total_(first_ + second_),
        step_ratio_(first_ / total_),
        skip_lr_decay_(p.decay_step_size == 0 || p.decay_lr_rate == 0.0),
        skip_mom_decay_(p.decay_step_size == 0 || p.decay_mom_rate == 0.0) {
    require_at_least(p.cycle_first_step_size, 1, "cycle_first_step_size", "OneCycle");
    require_at_least(p.cycle_second_step_size, 0, "cycle_second_step_size", "OneCycle");
    require_at_least(p.decay_step_size, 0, "decay_step_size", "OneCycle");
  }

  double lr(int64_t it) const override {
    if (as_double(it) < total_)
      return p_.cycle_min_lr + (p_.cycle_max_lr - p_.cycle_min_lr) * scale_factor(it);
    if (skip_lr_decay_) return p_.cycle_min_lr;
    return p_.cycle_min_lr / (1.0 + p_.decay_lr_rate * decay_interval(it));
  }

  std::optional<double> beta1(int64_t it) const override {
    if (!p_.cycle_momentum) return std::nullopt;
    // DeepSpeed's constructor puts cycle_min_mom in the optimizer (its formula would give
    // cycle_max_mom at it = -1): the first step of a fresh run uses cycle_min_mom.
    if (it < 0) return p_.cycle_min_mom;
    if (as_double(it) < total_)
      return p_.cycle_max_mom - (p_.cycle_max_mom - p_.cycle_min_mom) * scale_factor(it);
    if (skip_mom_decay_) return p_.cycle_max_mom;
    return p_.cycle_max_mom * (1.0 + p_.decay_mom_rate * decay_interval(it));
  }

  std::optional<double> beta2(int64_t) const override {
    if (!p_.cycle_momentum) return std::nullopt;
    return 0.99;
  }

  std::string_view name() const noexcept override { return "OneCycle"; }

 private:
  // Position in the cycle as a fraction of the way from the ends (0) to the peak (1).
  double scale_factor(int64_t it) const {
    const double b = as_double(it + 1);
    const double cycle = std::floor(1.0 + b / total_);
    const double x = 1.0 + b / total_ - cycle;
    double factor;
    int64_t stairs;
    if (x <= step_ratio_) {
      factor = x / step_ratio_;
      stairs = p_.cycle_first_stair_count;
    } else {
      factor = (x - 1.0) / (step_ratio_ - 1.0);
      stairs = p_.cycle_second_stair_count;
    }
    if (stairs > 0) {
      // DeepSpeed quantises from the integer offset in the cycle, not from `factor`.
      const double ci = std::fmod(b, total_);
      const double s = as_double(stairs);
      const double position = ci <= first_ ? ci * s / first_ : (total_ - ci) * s / second_;
      factor = std::floor(position) / s;
    }
    return factor;
  }

  // (it - total + 1) / decay_step_size: the decay's progress, continuous (no floor).
  double decay_interval(int64_t it) const {
    const double decay_batch_iteration = as_double(it) - total_ + 1.0;
    return decay_batch_iteration / as_double(p_.decay_step_size);
  }

  OneCycleParams p_;
  double first_, second_, total_, step_ratio_;
  bool skip_lr_decay_, skip_mom_decay_;
};

// lr = min_lr * (1 + step_rate * (it + 1) / step_size), the quotient floored in staircase mode.
class LRRangeTest final : public LrSchedule {
 public:
  explicit LRRangeTest(const LRRangeTestParams& p) : p_(p) {
    require_at_least(p.lr_range_test_step_size, 1, "lr_range_test_step_size", "LRRangeTest");
  }

  double lr(int64_t it) const override {
    double interval = as_double(it + 1) / as_double(p_.lr_range_test_step_size);
    if (p_.lr_range_test_staircase) interval = std::floor(interval);
    return p_.lr_range_test_min_lr * (1.0 + p_.lr_range_test_step_rate * interval);
  }
  std::string_view name() const noexcept override { return "LRRangeTest"; }

 private:
  LRRangeTestParams p_;
};

}  // namespace

std::unique_ptr<LrSchedule> make_lr_schedule(const ScheduleSpec& spec, double optimizer_lr) {
  ZERO_REQUIRE(spec.last_batch_iteration >= -1,
               "scheduler.params.last_batch_iteration must be >= -1 (-1 = a fresh start), got " +
                   std::to_string(spec.last_batch_iteration));
  struct Make {
    double optimizer_lr;
    std::unique_ptr<LrSchedule> operator()(std::monostate) const {
      return std::make_unique<Constant>(optimizer_lr);
    }
    std::unique_ptr<LrSchedule> operator()(const WarmupLRParams& p) const {
      return std::make_unique<WarmupLR>(p, "WarmupLR");
    }
    std::unique_ptr<LrSchedule> operator()(const WarmupDecayLRParams& p) const {
      return std::make_unique<WarmupDecayLR>(p);
    }
    std::unique_ptr<LrSchedule> operator()(const WarmupCosineLRParams& p) const {
      return std::make_unique<WarmupCosineLR>(p, optimizer_lr);
    }
    std::unique_ptr<LrSchedule> operator()(const OneCycleParams& p) const {
      return std::make_unique<OneCycle>(p);
    }
    std::unique_ptr<LrSchedule> operator()(const LRRangeTestParams& p) const {
      return std::make_unique<LRRangeTest>(p);
    }
  };
  return std::visit(Make{optimizer_lr}, spec.params);
}

LrCursor::LrCursor(const LrSchedule& schedule, int64_t last_batch_iteration)
    : schedule_(&schedule), it_(last_batch_iteration) {
  ZERO_REQUIRE(last_batch_iteration >= -1,
               "last_batch_iteration must be >= -1 (-1 = a fresh start), got " +
                   std::to_string(last_batch_iteration));
}

}  // namespace zero::optim
