// LR schedules against DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py). `it` is
// DeepSpeed's last_batch_iteration: -1 before the first step; the k-th applied optimizer step of
// a fresh run uses lr(k - 1). Every expected value is worked out by hand in the comment beside it.
//
// Tolerance: |got - want| <= 1e-12 * |want| + 1e-18. The hand values are exact decimals; the code
// reaches them through a few double operations and one log/cos (each within a few ulps, ~1e-16
// relative), while any formula or step-index mistake moves a value by far more (>= 1e-4 relative
// at every point chosen here).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <numbers>
#include <vector>

#include "optim/lr_schedule.hpp"
#include "core/error.hpp"

using namespace zero;
using namespace zero::optim;
using Catch::Matchers::ContainsSubstring;

namespace {

bool near(double got, double want) {
  return std::fabs(got - want) <= 1e-12 * std::fabs(want) + 1e-18;
}
#define CHECK_NEAR(got, want)          \
  do {                                 \
    const double g_ = (got);           \
    const double w_ = (want);          \
    CAPTURE(g_, w_);                   \
    CHECK(near(g_, w_));               \
  } while (0)

std::unique_ptr<LrSchedule> make(ScheduleSpec spec, double optimizer_lr = 0.1) {
  return make_lr_schedule(spec, optimizer_lr);
}

template <class P>
std::unique_ptr<LrSchedule> make(const P& p, double optimizer_lr = 0.1) {
  ScheduleSpec spec;
  spec.params = p;
  return make_lr_schedule(spec, optimizer_lr);
}

WarmupLRParams warmup(double min, double max, int64_t n, WarmupType type) {
  WarmupLRParams p;
  p.warmup_min_lr = min;
  p.warmup_max_lr = max;
  p.warmup_num_steps = n;
  p.warmup_type = type;
  return p;
}

OneCycleParams one_cycle(int64_t first, int64_t second) {
  OneCycleParams p;
  p.cycle_min_lr = 0.01;
  p.cycle_max_lr = 0.1;
  p.cycle_first_step_size = first;
  p.cycle_second_step_size = second;
  p.cycle_min_mom = 0.8;
  p.cycle_max_mom = 0.9;
  return p;
}

}  // namespace

TEST_CASE("lr schedule: no scheduler keeps the optimizer's lr") {
  auto s = make(ScheduleSpec{}, 3e-4);
  CHECK(s->name() == "constant");
  for (int64_t it : {-1, 0, 1, 1000000000}) CHECK(s->lr(it) == 3e-4);
  CHECK(!s->beta1(0).has_value());
  CHECK(!s->beta2(0).has_value());
}

TEST_CASE("lr schedule: WarmupLR log") {
  // min 0, max 0.01, N = 100: lr = 0.01 * ln(it+1) / ln(100) for 0 <= it < 100, then 0.01.
  auto s = make(warmup(0.0, 0.01, 100, WarmupType::log));
  CHECK(s->name() == "WarmupLR");
  CHECK_NEAR(s->lr(-1), 0.0);     // before the first scheduler step: warmup_min_lr
  CHECK_NEAR(s->lr(0), 0.0);      // ln 1 = 0: the first two optimizer steps both run at min
  CHECK_NEAR(s->lr(1), 0.0015051499783199059);  // 0.01 * ln 2 / ln 100 = 0.01 * log10(2) / 2
  CHECK_NEAR(s->lr(9), 0.005);    // 0.01 * ln 10 / ln 100 = 0.01 / 2
  CHECK_NEAR(s->lr(99), 0.01);    // N - 1: ln 100 / ln 100 = 1
  CHECK_NEAR(s->lr(100), 0.01);   // N: gamma 1
  CHECK_NEAR(s->lr(1000000), 0.01);
  CHECK(!s->beta1(5).has_value());

  // min 1e-4, max 1e-3, N = 10: lr(4) = 1e-4 + 9e-4 * ln 5 / ln 10 = 1e-4 + 9e-4 * 0.69897000433601880
  auto t = make(warmup(1e-4, 1e-3, 10, WarmupType::log));
  CHECK_NEAR(t->lr(-1), 1e-4);
  CHECK_NEAR(t->lr(0), 1e-4);
  CHECK_NEAR(t->lr(4), 1e-4 + 9e-4 * 0.69897000433601880);
  CHECK_NEAR(t->lr(9), 1e-3);
}

TEST_CASE("lr schedule: WarmupLR linear") {
  // min 0.001, max 0.011, N = 10: lr = 0.001 + 0.01 * it / 10 for it < 10, then 0.011.
  auto s = make(warmup(0.001, 0.011, 10, WarmupType::linear));
  CHECK_NEAR(s->lr(-1), 0.001);
  CHECK_NEAR(s->lr(0), 0.001);
  CHECK_NEAR(s->lr(5), 0.006);   // 0.001 + 0.01 * 5/10
  CHECK_NEAR(s->lr(9), 0.010);   // 0.001 + 0.01 * 9/10: linear never reaches max inside warmup
  CHECK_NEAR(s->lr(10), 0.011);  // it = N: max
  CHECK_NEAR(s->lr(12345), 0.011);
}

TEST_CASE("lr schedule: warmup_num_steps below 2 counts as 2") {
  // DeepSpeed: self.warmup_num_steps = max(2, warmup_num_steps) (ln 1 = 0 would divide by 0).
  // 0 is what Hugging Face's Trainer writes for "auto" by default (--warmup_steps 0).
  for (int64_t n : {0, 1}) {
    CAPTURE(n);
    auto log1 = make(warmup(0.0, 1.0, n, WarmupType::log));
    CHECK_NEAR(log1->lr(0), 0.0);  // ln 1 / ln 2
    CHECK_NEAR(log1->lr(1), 1.0);  // it = 1 < 2: ln 2 / ln 2
    CHECK_NEAR(log1->lr(2), 1.0);
    auto lin1 = make(warmup(0.0, 1.0, n, WarmupType::linear));
    CHECK_NEAR(lin1->lr(0), 0.0);
    CHECK_NEAR(lin1->lr(1), 0.5);  // 1/2, not max: the warmup is 2 steps long
    CHECK_NEAR(lin1->lr(2), 1.0);
  }
  WarmupDecayLRParams d;
  static_cast<WarmupLRParams&>(d) = warmup(0.0, 1.0, 0, WarmupType::linear);
  d.total_num_steps = 10;
  auto decay = make(d);
  CHECK_NEAR(decay->lr(2), 1.0);         // warmup over at it = 2
  CHECK_NEAR(decay->lr(6), 0.5);         // (10 - 6) / (10 - 2)
  WarmupCosineLRParams c;
  c.warmup_num_steps = 0;
  c.total_num_steps = 10;
  c.warmup_type = WarmupType::linear;
  auto cosine = make(c, 2.0);
  CHECK_NEAR(cosine->lr(1), 1.0);        // 2 x (0 + 1/2 x 1)
  CHECK_NEAR(cosine->lr(2), 2.0 * (1e-4 + (1 - 1e-4) * (1 + std::cos(std::numbers::pi / 8)) / 2));
}

TEST_CASE("lr schedule: WarmupLR never decreases") {
  for (WarmupType type : {WarmupType::log, WarmupType::linear}) {
    auto s = make(warmup(1e-5, 1e-3, 50, type));
    for (int64_t it = -1; it < 200; ++it) {
      CAPTURE(it);
      CHECK(s->lr(it + 1) >= s->lr(it));
    }
  }
}

TEST_CASE("lr schedule: WarmupDecayLR") {
  // min 0, max 0.1, N = 10 linear, T = 110: after the warmup lr = 0.1 * (110 - it) / (110 - 10).
  WarmupDecayLRParams p;
  static_cast<WarmupLRParams&>(p) = warmup(0.0, 0.1, 10, WarmupType::linear);
  p.total_num_steps = 110;
  auto s = make(p);
  CHECK(s->name() == "WarmupDecayLR");
  CHECK_NEAR(s->lr(-1), 0.0);
  CHECK_NEAR(s->lr(9), 0.09);   // warmup: 0.1 * 9/10
  CHECK_NEAR(s->lr(10), 0.1);   // (110 - 10) / 100 = 1
  CHECK_NEAR(s->lr(60), 0.05);  // 50 / 100
  CHECK_NEAR(s->lr(109), 0.001);  // 1 / 100
  CHECK_NEAR(s->lr(110), 0.0);  // T: 0
  CHECK_NEAR(s->lr(500), 0.0);  // max(0, negative)
  for (int64_t it = 10; it < 200; ++it) {
    CAPTURE(it);
    CHECK(s->lr(it + 1) <= s->lr(it));
  }

  // With warmup_min_lr 0.01 the decay ends at 0.01, not 0: lr = 0.01 + 0.09 * gamma.
  static_cast<WarmupLRParams&>(p) = warmup(0.01, 0.1, 10, WarmupType::linear);
  auto with_min = make(p);
  CHECK_NEAR(with_min->lr(60), 0.055);   // gamma 1/2
  CHECK_NEAR(with_min->lr(110), 0.01);   // gamma 0
  CHECK_NEAR(with_min->lr(1000), 0.01);
  static_cast<WarmupLRParams&>(p) = warmup(0.0, 0.1, 10, WarmupType::linear);

  // T < N: the decay starts at 0. T = 5, N = 10: lr(10) = 0.1 * max(0, (5 - 10) / max(1, -5)) = 0.
  p.total_num_steps = 5;
  auto short_run = make(p);
  CHECK_NEAR(short_run->lr(9), 0.09);
  CHECK_NEAR(short_run->lr(10), 0.0);
}

TEST_CASE("lr schedule: WarmupCosineLR") {
  // optimizer lr 0.1, T = 110, N = 10 linear, warmup_min_ratio 0.1, cos_min_ratio 0.01.
  //   warmup:  ratio = 0.1 + (it / 10) * 0.9
  //   after:   progress = min(1, (it - 10 + 1) / (110 - 10)),
  //            ratio = 0.01 + 0.99 * (1 + cos(pi * progress)) / 2
  WarmupCosineLRParams p;
  p.total_num_steps = 110;
  p.warmup_num_steps = 10;
  p.warmup_min_ratio = 0.1;
  p.cos_min_ratio = 0.01;
  p.warmup_type = WarmupType::linear;
  auto s = make(p, 0.1);
  CHECK(s->name() == "WarmupCosineLR");
  CHECK_NEAR(s->lr(-1), 0.0);     // DeepSpeed: 0 before the first scheduler step (not min ratio)
  CHECK_NEAR(s->lr(0), 0.01);     // 0.1 * 0.1
  CHECK_NEAR(s->lr(5), 0.055);    // 0.1 * (0.1 + 0.5 * 0.9)
  CHECK_NEAR(s->lr(9), 0.091);    // 0.1 * (0.1 + 0.9 * 0.9)
  // it = 10: progress 1/100, just below the top:
  //   0.1 * (0.01 + 0.99 * (1 + cos(pi / 100)) / 2)
  CHECK_NEAR(s->lr(10), 0.1 * (0.01 + 0.99 * (1.0 + std::cos(std::numbers::pi / 100.0)) / 2.0));
  // it = 34: progress 1/4, (1 + cos(pi/4)) / 2 = 0.85355339059327376:
  //   0.1 * (0.01 + 0.99 * 0.85355339059327376) = 0.085501785668734102
  CHECK_NEAR(s->lr(34), 0.085501785668734102);
  CHECK_NEAR(s->lr(59), 0.0505);  // progress 1/2: 0.1 * (0.01 + 0.99 / 2)
  CHECK_NEAR(s->lr(109), 0.001);  // progress 1 at T - 1: cos_min_ratio * lr
  CHECK_NEAR(s->lr(110), 0.001);  // clamped, does not rise again
  CHECK_NEAR(s->lr(100000), 0.001);
  for (int64_t it = 10; it < 300; ++it) {
    CAPTURE(it);
    CHECK(s->lr(it + 1) <= s->lr(it));
    CHECK(s->lr(it) >= 0.001 * (1.0 - 1e-12));
  }

  // log warmup from ratio 0: T 1000, N 100: lr(9) = 0.1 * ln 10 / ln 100 = 0.05.
  WarmupCosineLRParams q;
  q.total_num_steps = 1000;
  q.warmup_num_steps = 100;
  auto l = make(q, 0.1);
  CHECK_NEAR(l->lr(0), 0.0);
  CHECK_NEAR(l->lr(9), 0.05);
  CHECK_NEAR(l->lr(99), 0.1);  // ln 100 / ln 100

  // T <= N: no decay window, the ratio sits at cos_min_ratio right after the warmup.
  p.total_num_steps = 5;
  auto short_run = make(p, 0.1);
  CHECK_NEAR(short_run->lr(10), 0.001);  // real_total = max(1, -5) = 1, progress min(1, 1) = 1
}

TEST_CASE("lr schedule: OneCycle lr and momentum") {
  // min 0.01, max 0.1, 10 + 10 steps, momentum 0.8..0.9, no decay (decay_step_size 0).
  // b = it + 1; x = b/20 - floor(b/20) (+1 -1); rising (x <= 0.5): f = x / 0.5; falling:
  // f = (x - 1) / (0.5 - 1). lr = 0.01 + 0.09 f, beta1 = 0.9 - 0.1 f.
  auto s = make(one_cycle(10, 10));
  CHECK(s->name() == "OneCycle");
  CHECK_NEAR(s->lr(-1), 0.01);
  CHECK_NEAR(*s->beta1(-1), 0.8);  // DeepSpeed's constructor sets cycle_min_mom, not the formula
  CHECK_NEAR(*s->beta2(-1), 0.99); // and betas[1] = 0.99
  CHECK_NEAR(s->lr(0), 0.019);     // b 1: x 0.05, f 0.1
  CHECK_NEAR(*s->beta1(0), 0.89);
  CHECK_NEAR(s->lr(4), 0.055);     // b 5: x 0.25, f 0.5
  CHECK_NEAR(*s->beta1(4), 0.85);
  CHECK_NEAR(s->lr(9), 0.1);       // b 10: x 0.5, f 1: the peak
  CHECK_NEAR(*s->beta1(9), 0.8);
  CHECK_NEAR(s->lr(14), 0.055);    // b 15: x 0.75, f (0.75-1)/(0.5-1) = 0.5
  CHECK_NEAR(*s->beta1(14), 0.85);
  CHECK_NEAR(s->lr(18), 0.019);    // b 19: x 0.95, f 0.1
  CHECK_NEAR(s->lr(19), 0.01);     // b 20: cycle 2, x 0, f 0
  CHECK_NEAR(*s->beta1(19), 0.9);
  CHECK_NEAR(s->lr(20), 0.01);     // it >= 20: decay phase, skipped: min lr, max momentum
  CHECK_NEAR(*s->beta1(20), 0.9);
  CHECK_NEAR(s->lr(5000), 0.01);
  CHECK_NEAR(*s->beta2(5000), 0.99);
  for (int64_t it = -1; it < 9; ++it) CHECK(s->lr(it + 1) > s->lr(it));
  for (int64_t it = 9; it < 19; ++it) CHECK(s->lr(it + 1) < s->lr(it));
  for (int64_t it = 0; it < 9; ++it) CHECK(*s->beta1(it + 1) < *s->beta1(it));
}

TEST_CASE("lr schedule: OneCycle decay after the cycle") {
  // decay_step_size 5, decay_lr_rate 0.5, decay_mom_rate 0.1; i = it - 20 + 1:
  //   lr = 0.01 / (1 + 0.5 * i / 5), beta1 = 0.9 * (1 + 0.1 * i / 5) (continuous, no floor).
  OneCycleParams p = one_cycle(10, 10);
  p.decay_step_size = 5;
  p.decay_lr_rate = 0.5;
  p.decay_mom_rate = 0.1;
  auto s = make(p);
  CHECK_NEAR(s->lr(19), 0.01);             // still in the cycle
  CHECK_NEAR(s->lr(20), 0.01 / 1.1);       // i 1
  CHECK_NEAR(*s->beta1(20), 0.9 * 1.02);
  CHECK_NEAR(s->lr(24), 0.01 / 1.5);       // i 5
  CHECK_NEAR(*s->beta1(24), 0.99);
  CHECK_NEAR(s->lr(29), 0.005);            // i 10
  CHECK_NEAR(*s->beta1(29), 1.08);         // DeepSpeed lets the momentum grow past 1
  // decay_mom_rate 0: the momentum stays at max while the lr decays.
  p.decay_mom_rate = 0.0;
  auto m = make(p);
  CHECK_NEAR(m->lr(29), 0.005);
  CHECK_NEAR(*m->beta1(29), 0.9);
  // cycle_momentum off: betas untouched.
  p.cycle_momentum = false;
  auto n = make(p);
  CHECK(!n->beta1(3).has_value());
  CHECK(!n->beta2(3).has_value());
}

TEST_CASE("lr schedule: OneCycle stairs and an asymmetric cycle") {
  // 2 stairs per half over 10 + 10: ci = b % 20; rising: pos = ci * 2 / 10, falling:
  // pos = (20 - ci) * 2 / 10; f = floor(pos) / 2.
  OneCycleParams p = one_cycle(10, 10);
  p.cycle_first_stair_count = 2;
  p.cycle_second_stair_count = 2;
  auto s = make(p);
  CHECK_NEAR(s->lr(3), 0.01);    // b 4: pos 0.8 -> 0
  CHECK_NEAR(s->lr(4), 0.055);   // b 5: pos 1 -> f 0.5
  CHECK_NEAR(s->lr(8), 0.055);   // b 9: pos 1.8 -> 0.5
  CHECK_NEAR(s->lr(9), 0.1);     // b 10: pos 2 -> 1
  CHECK_NEAR(s->lr(10), 0.055);  // b 11: falling, (20 - 11) * 2 / 10 = 1.8 -> 0.5
  CHECK_NEAR(s->lr(14), 0.055);  // b 15: 1.0 -> 0.5
  CHECK_NEAR(s->lr(15), 0.01);   // b 16: 0.8 -> 0
  CHECK_NEAR(*s->beta1(9), 0.8);

  // 4 up, 12 down: step_ratio 0.25. b 4: x 0.25 <= 0.25, f 1 (peak);
  // b 8: x 0.5, f = (0.5 - 1) / (0.25 - 1) = 2/3, lr = 0.01 + 0.09 * 2/3 = 0.07.
  auto a = make(one_cycle(4, 12));
  CHECK_NEAR(a->lr(3), 0.1);
  CHECK_NEAR(a->lr(7), 0.07);
  CHECK_NEAR(a->lr(15), 0.01);  // b 16: end of the cycle
}

TEST_CASE("lr schedule: LRRangeTest") {
  // min 0.001, step_size 10, rate 2: lr = 0.001 * (1 + 2 * (it + 1) / 10), floored in staircase.
  LRRangeTestParams p;
  p.lr_range_test_min_lr = 0.001;
  p.lr_range_test_step_size = 10;
  p.lr_range_test_step_rate = 2.0;
  auto s = make(p);
  CHECK(s->name() == "LRRangeTest");
  CHECK_NEAR(s->lr(-1), 0.001);
  CHECK_NEAR(s->lr(4), 0.002);   // (5/10) * 2 = 1
  CHECK_NEAR(s->lr(9), 0.003);   // 1 * 2 = 2
  CHECK_NEAR(s->lr(19), 0.005);  // 2 * 2 = 4
  for (int64_t it = -1; it < 100; ++it) CHECK(s->lr(it + 1) > s->lr(it));
  p.lr_range_test_staircase = true;
  auto st = make(p);
  CHECK_NEAR(st->lr(8), 0.001);  // floor(9/10) = 0
  CHECK_NEAR(st->lr(9), 0.003);  // floor(10/10) = 1
  CHECK_NEAR(st->lr(18), 0.003);
  CHECK_NEAR(st->lr(19), 0.005);
  for (int64_t it = -1; it < 100; ++it) CHECK(st->lr(it + 1) >= st->lr(it));
}

TEST_CASE("lr schedule: resuming from last_batch_iteration continues the same sequence") {
  std::vector<ScheduleSpec> specs(6);
  specs[1].params = warmup(1e-5, 1e-3, 20, WarmupType::log);
  WarmupDecayLRParams d;
  static_cast<WarmupLRParams&>(d) = warmup(0.0, 1e-3, 20, WarmupType::linear);
  d.total_num_steps = 60;
  specs[2].params = d;
  WarmupCosineLRParams c;
  c.total_num_steps = 60;
  c.warmup_num_steps = 20;
  specs[3].params = c;
  OneCycleParams o = one_cycle(15, 25);
  o.decay_step_size = 4;
  o.decay_lr_rate = 0.3;
  o.decay_mom_rate = 0.05;
  specs[4].params = o;
  LRRangeTestParams r;
  r.lr_range_test_step_size = 7;
  specs[5].params = r;

  constexpr int kSteps = 90;
  for (const ScheduleSpec& spec : specs) {
    auto schedule = make(spec, 2e-3);
    CAPTURE(schedule->name());
    // A fresh run: what each applied step k = 0 .. kSteps-1 uses.
    std::vector<double> lr, beta1;
    LrCursor fresh(*schedule);
    REQUIRE(fresh.last_batch_iteration() == -1);
    for (int k = 0; k < kSteps; ++k) {
      lr.push_back(fresh.lr());
      beta1.push_back(fresh.beta1().value_or(-1.0));
      fresh.step();
    }
    for (int k = 0; k < kSteps; ++k) CHECK(lr[static_cast<size_t>(k)] == schedule->lr(k - 1));
    // A run saved after `done` applied steps stores last_batch_iteration = done - 1; a new run
    // configured with it (or resumed from the checkpoint) continues bit for bit.
    for (int done : {1, 7, 20, 41, 60}) {
      CAPTURE(done);
      ScheduleSpec resumed_spec = spec;
      resumed_spec.last_batch_iteration = done - 1;
      auto resumed_schedule = make(resumed_spec, 2e-3);
      LrCursor resumed(*resumed_schedule, resumed_spec.last_batch_iteration);
      for (int k = done; k < kSteps; ++k) {
        CHECK(resumed.lr() == lr[static_cast<size_t>(k)]);
        CHECK(resumed.beta1().value_or(-1.0) == beta1[static_cast<size_t>(k)]);
        resumed.step();
      }
    }
  }
}

TEST_CASE("lr schedule: meaningless parameters name the scheduler.params key") {
  REQUIRE_THROWS_WITH(make(warmup(0.0, 1e-3, -1, WarmupType::log)),
                      ContainsSubstring("scheduler.params.warmup_num_steps"));
  WarmupCosineLRParams c;
  c.warmup_num_steps = -3;
  REQUIRE_THROWS_WITH(make(c), ContainsSubstring("scheduler.params.warmup_num_steps"));
  REQUIRE_THROWS_WITH(make(one_cycle(0, 10)),
                      ContainsSubstring("scheduler.params.cycle_first_step_size"));
  LRRangeTestParams r;
  r.lr_range_test_step_size = 0;
  REQUIRE_THROWS_WITH(make(r), ContainsSubstring("scheduler.params.lr_range_test_step_size"));
  ScheduleSpec bad;
  bad.last_batch_iteration = -2;
  REQUIRE_THROWS_WITH(make(bad), ContainsSubstring("last_batch_iteration"));
}
