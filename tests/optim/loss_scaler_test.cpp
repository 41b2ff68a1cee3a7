// The loss scaler against DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/
// loss_scaler.py): for each setting an overflow pattern is fed step by step and the scale after
// every update is compared EXACTLY (powers of two: no rounding) with a sequence derived by hand
// from DeepSpeed's algorithm, written out in the comments. Notation: it = cur_iter of the update,
// last = last_overflow_iter, h = cur_hysteresis, stable = it - last - 1; the scale doubles on a
// clean step when stable > 0 and stable % window == 0. Pattern: 'x' overflow, '.' clean.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <string_view>
#include <vector>

#include "optim/loss_scaler.hpp"
#include "core/error.hpp"

using namespace zero;
using namespace zero::optim;
using Catch::Matchers::ContainsSubstring;

namespace {

LossScalerOptions dynamic(int power, int64_t window, int hysteresis, bool consecutive,
                          double min_scale = 1.0) {
  LossScalerOptions o;
  o.enabled = true;
  o.loss_scale = 0.0;
  o.initial_scale_power = power;
  o.loss_scale_window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_loss_scale = min_scale;
  return o;
}

struct Trace {
  std::vector<double> scale;  // scale() after each update
  std::vector<bool> apply;    // update().apply
};

// Feeds `pattern` to `s`; also checks that every update reports the scale in force before it.
Trace feed(LossScaler& s, std::string_view pattern) {
  Trace t;
  for (char c : pattern) {
    const double before = s.scale();
    const ScaleUpdate u = s.update(c == 'x');
    REQUIRE(u.step_scale == before);
    t.scale.push_back(s.scale());
    t.apply.push_back(u.apply);
  }
  return t;
}

std::vector<bool> clean_steps(std::string_view pattern) {
  std::vector<bool> v;
  for (char c : pattern) v.push_back(c != 'x');
  return v;
}

}  // namespace

TEST_CASE("loss scaler: window 2, hysteresis 1") {
  // 2^4 = 16, window 2, delayed_shift 1, consecutive off.
  //   it0 .  stable 0                      16
  //   it1 .  stable 1, 1 % 2 != 0          16
  //   it2 .  stable 2 -> double            32
  //   it3 .  stable 3                      32
  //   it4 x  h == 1 -> halve, last = 4     16
  //   it5 .  stable 0                      16
  //   it6 .  stable 1                      16
  //   it7 .  stable 2 -> double            32
  //   it8 x  halve, last = 8               16
  //   it9 x  halve, last = 9                8
  //   it10 . stable 0                       8
  const std::string_view p = "....x...xx.";
  LossScaler s(dynamic(4, 2, 1, false));
  REQUIRE(s.mode() == LossScaleMode::dynamic);
  REQUIRE(s.scale() == 16.0);
  const Trace t = feed(s, p);
  CHECK(t.scale == std::vector<double>{16, 16, 32, 32, 16, 16, 16, 32, 16, 8, 8});
  CHECK(t.apply == clean_steps(p));
  CHECK(s.skipped_steps() == 3);
}

TEST_CASE("loss scaler: window 4, hysteresis 2, restored only when the scale doubles") {
  // 2^10, window 4, delayed_shift 2, consecutive off.
  //   it0 x  h 2 -> 1, last 0                      1024
  //   it1 x  h == 1 -> halve (h stays 1), last 1     512
  //   it2 x  h == 1 -> halve, last 2                 256
  //   it3..it6 .  stable 0, 1, 2, 3                  256
  //   it7 .  stable 4 -> h = 2, double               512
  //   it8 .  stable 5                                512
  //   it9 x  h 2 -> 1 (no halving), last 9           512
  //   it10 x h == 1 -> halve, last 10                256
  //   it11 . stable 0                                256
  const std::string_view p = "xxx......xx.";
  LossScaler s(dynamic(10, 4, 2, false));
  const Trace t = feed(s, p);
  CHECK(t.scale == std::vector<double>{1024, 512, 256, 256, 256, 256, 256, 512, 512, 512, 256, 256});
  CHECK(t.apply == clean_steps(p));
  CHECK(s.state().cur_hysteresis == 1);
  CHECK(s.state().last_overflow_iter == 10);
  CHECK(s.state().cur_iter == 12);
}

TEST_CASE("loss scaler: hysteresis 3, consecutive on and off") {
  // 2^8, window 1000 (never reached), delayed_shift 3. Pattern xx.xxx.
  // consecutive on:                         consecutive off:
  //   it0 x  h 3 -> 2         256             it0 x  h 3 -> 2                  256
  //   it1 x  h 2 -> 1         256             it1 x  h 2 -> 1                  256
  //   it2 .  h = 3 (refill)   256             it2 .  h stays 1                 256
  //   it3 x  h 3 -> 2         256             it3 x  h == 1 -> halve           128
  //   it4 x  h 2 -> 1         256             it4 x  halve                      64
  //   it5 x  h == 1 -> halve  128             it5 x  halve                      32
  //   it6 .  h = 3            128             it6 .                             32
  const std::string_view p = "xx.xxx.";
  SECTION("consecutive_hysteresis on") {
    LossScaler s(dynamic(8, 1000, 3, true));
    CHECK(feed(s, p).scale == std::vector<double>{256, 256, 256, 256, 256, 128, 128});
    CHECK(s.state().cur_hysteresis == 3);
  }
  SECTION("consecutive_hysteresis off") {
    LossScaler s(dynamic(8, 1000, 3, false));
    CHECK(feed(s, p).scale == std::vector<double>{256, 256, 256, 128, 64, 32, 32});
    CHECK(s.state().cur_hysteresis == 1);
  }
}

TEST_CASE("loss scaler: window 4, hysteresis 2, every clean step refills with consecutive on") {
  // 2^5 = 32, window 4, delayed_shift 2. Pattern x.x.x..... (overflows never two in a row).
  // consecutive on: every overflow finds h = 2 -> 1, the clean step after refills it; the scale
  //   never halves. it5..it8 stable 0..3, it9 stable 4 -> double.
  //   32 32 32 32 32 32 32 32 32 64
  // consecutive off: it0 x h 2 -> 1 (32); it2 x h == 1 -> 16; it4 x -> 8; it9 stable 4 -> h = 2,
  //   double -> 16.
  //   32 32 16 16 8 8 8 8 8 16
  const std::string_view p = "x.x.x.....";
  SECTION("on") {
    LossScaler s(dynamic(5, 4, 2, true));
    CHECK(feed(s, p).scale == std::vector<double>{32, 32, 32, 32, 32, 32, 32, 32, 32, 64});
  }
  SECTION("off") {
    LossScaler s(dynamic(5, 4, 2, false));
    CHECK(feed(s, p).scale == std::vector<double>{32, 32, 16, 16, 8, 8, 8, 8, 8, 16});
  }
}

TEST_CASE("loss scaler: window 1 doubles on every clean step but the first after an overflow") {
  // 2^3 = 8, window 1, delayed_shift 1.
  //   it0 .  stable 0        8
  //   it1 .  stable 1 -> x2 16
  //   it2 x  halve           8
  //   it3 .  stable 0        8
  //   it4 .  stable 1 -> x2 16
  //   it5 .  stable 2 -> x2 32
  LossScaler s(dynamic(3, 1, 1, false));
  CHECK(feed(s, "..x...").scale == std::vector<double>{8, 16, 8, 8, 16, 32});
}

TEST_CASE("loss scaler: DeepSpeed's defaults double after 1001 clean steps, then every 1000") {
  // 2^16, window 1000, delayed_shift 2: stable = it (last = -1); it1000 is the first with
  // stable % 1000 == 0 and stable > 0, it2000 the next.
  LossScaler s(dynamic(16, 1000, 2, false));
  for (int it = 0; it < 1000; ++it) s.update(false);
  CHECK(s.scale() == 65536.0);
  s.update(false);  // it1000
  CHECK(s.scale() == 131072.0);
  for (int it = 1001; it < 2000; ++it) s.update(false);
  CHECK(s.scale() == 131072.0);
  s.update(false);  // it2000
  CHECK(s.scale() == 262144.0);
  CHECK(s.skipped_steps() == 0);
}

TEST_CASE("loss scaler: halving stops at min_loss_scale, an overflow there is an error") {
  SECTION("2^2 down to 1, then the error") {
    // 4 -> 2 -> 1; the third overflow finds scale == min and throws.
    LossScaler s(dynamic(2, 1000, 1, false));
    CHECK(feed(s, "xx").scale == std::vector<double>{2, 1});
    const LossScalerState before = s.state();
    REQUIRE_THROWS_AS(s.update(true), Error);
    REQUIRE_THROWS_WITH(s.update(true), ContainsSubstring("loss scale is at its minimum") &&
                                            ContainsSubstring("fp16.min_loss_scale = 1)") &&
                                            ContainsSubstring("diverged") &&
                                            ContainsSubstring("learning rate") &&
                                            ContainsSubstring("HINT"));
    // Thrown before anything changed.
    CHECK(s.state().scale == before.scale);
    CHECK(s.state().cur_iter == before.cur_iter);
    CHECK(s.state().last_overflow_iter == before.last_overflow_iter);
  }
  SECTION("hysteresis is spent before the error") {
    // 2^0 = 1 = min, delayed_shift 2: it0 x h 2 -> 1 (no error: nothing to halve yet);
    // it1 x h == 1, scale == min -> error.
    LossScaler s(dynamic(0, 1000, 2, false));
    CHECK(feed(s, "x").scale == std::vector<double>{1});
    REQUIRE_THROWS_AS(s.update(true), Error);
  }
  SECTION("a min that is not a power of two clamps the halving") {
    // 4, min 3: it0 x max(2, 3) = 3; it1 x 3 == min -> error.
    LossScaler s(dynamic(2, 1000, 1, false, 3.0));
    CHECK(feed(s, "x").scale == std::vector<double>{3});
    REQUIRE_THROWS_WITH(s.update(true), ContainsSubstring("fp16.min_loss_scale = 3)"));
  }
  SECTION("a clean step at the minimum is fine, and the scale grows back") {
    // 2 -> 1 at it0; it1, it2 clean: stable 0, 1 -> x2 with window 1.
    LossScaler s(dynamic(1, 1, 1, false));
    CHECK(feed(s, "x..").scale == std::vector<double>{1, 1, 2});
    CHECK(feed(s, "x").scale == std::vector<double>{1});  // halved back to the floor, no error
  }
}

TEST_CASE("loss scaler: static scaling keeps its scale and skips overflowed steps") {
  LossScalerOptions o;
  o.enabled = true;
  o.loss_scale = 128.0;
  LossScaler s(o);
  REQUIRE(s.mode() == LossScaleMode::static_scale);
  const std::string_view p = "..xx.x";
  const Trace t = feed(s, p);
  CHECK(t.scale == std::vector<double>(6, 128.0));
  CHECK(t.apply == clean_steps(p));
  CHECK(s.skipped_steps() == 3);
}

TEST_CASE("loss scaler: no scaling (bf16/fp32)") {
  LossScalerOptions o;  // enabled false
  SECTION("overflow check off: every step applies, as DeepSpeed's bf16 default") {
    LossScaler s(o);
    REQUIRE(s.mode() == LossScaleMode::none);
    const Trace t = feed(s, ".x.");
    CHECK(t.scale == std::vector<double>{1, 1, 1});
    CHECK(t.apply == std::vector<bool>{true, true, true});
  }
  SECTION("overflow check on: a non-finite step is skipped") {
    o.skip_nonfinite = true;
    LossScaler s(o);
    const Trace t = feed(s, ".x.");
    CHECK(t.scale == std::vector<double>{1, 1, 1});
    CHECK(t.apply == std::vector<bool>{true, false, true});
  }
}

TEST_CASE("loss scaler: restoring a saved state continues the same sequence") {
  const LossScalerOptions o = dynamic(6, 3, 2, false);
  const std::string_view p = "x..x.....xx....x.......";
  LossScaler whole(o);
  const Trace all = feed(whole, p);
  for (size_t cut = 0; cut <= p.size(); ++cut) {
    CAPTURE(cut);
    LossScaler first(o);
    feed(first, p.substr(0, cut));
    LossScaler second(o);
    second.restore(first.state());
    const Trace rest = feed(second, p.substr(cut));
    CHECK(std::vector<double>(all.scale.begin() + static_cast<long>(cut), all.scale.end()) ==
          rest.scale);
    CHECK(second.skipped_steps() == whole.skipped_steps());
  }
}

TEST_CASE("loss scaler: out-of-range options name the fp16 key") {
  REQUIRE_THROWS_WITH(LossScaler(dynamic(16, 0, 2, false)), ContainsSubstring("fp16.loss_scale_window"));
  REQUIRE_THROWS_WITH(LossScaler(dynamic(16, 1000, 0, false)), ContainsSubstring("fp16.hysteresis"));
  REQUIRE_THROWS_WITH(LossScaler(dynamic(16, 1000, 2, false, 0.0)),
                      ContainsSubstring("fp16.min_loss_scale"));
  REQUIRE_THROWS_WITH(LossScaler(dynamic(200, 1000, 2, false)),
                      ContainsSubstring("fp16.initial_scale_power"));
  LossScalerOptions o;
  o.enabled = true;
  o.loss_scale = -1.0;
  REQUIRE_THROWS_WITH(LossScaler(o), ContainsSubstring("fp16.loss_scale"));
  LossScaler s(dynamic(16, 1000, 2, false));
  LossScalerState bad = s.state();
  bad.cur_hysteresis = 3;
  REQUIRE_THROWS_WITH(s.restore(bad), ContainsSubstring("cur_hysteresis"));
}
