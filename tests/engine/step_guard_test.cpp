// StepGuard (runtime/engine/step_guard.hpp): when a run that no longer trains must stop.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>

#include "runtime/engine/step_guard.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::StepGuard;
using zero::StepStats;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

StepStats stats(bool applied, float grad_norm, double scale = 1, double next_scale = 1) {
  StepStats s;
  s.applied = applied;
  s.grad_norm = grad_norm;
  s.loss_scale = scale;
  s.next_loss_scale = next_scale;
  return s;
}

}  // namespace

TEST_CASE("step guard: skipped steps in a row stop the run at the bound; a good step resets") {
  StepGuard g(3);
  CHECK_FALSE(g.after_step(1, stats(true, 1.0f), 2.5));
  CHECK_FALSE(g.after_step(2, stats(false, NAN), kNaN));
  CHECK_FALSE(g.after_step(3, stats(false, NAN), kNaN));
  CHECK(g.counted_in_a_row() == 2);
  CHECK_FALSE(g.after_step(4, stats(true, 0.5f), 2.4));  // trained again
  CHECK(g.counted_in_a_row() == 0);
  CHECK(g.last_good_step() == 4);
  CHECK_FALSE(g.after_step(5, stats(false, INFINITY), 2.4));
  CHECK_FALSE(g.after_step(6, stats(false, NAN), kNaN));
  const auto stop = g.after_step(7, stats(false, NAN), kNaN);
  REQUIRE(stop);
  CHECK_THAT(*stop, ContainsSubstring("training stopped at step 7"));
  CHECK_THAT(*stop, ContainsSubstring("3 steps in a row did not train"));
  CHECK_THAT(*stop, ContainsSubstring("max_consecutive_skipped_steps allows (3)"));
  CHECK_THAT(*stop, ContainsSubstring("The last step that trained was 4."));
  CHECK_THAT(*stop, ContainsSubstring("HINT"));
  CHECK_THAT(*stop, ContainsSubstring("learning rate"));
  CHECK_THAT(*stop, ContainsSubstring("bf16"));
}

TEST_CASE("step guard: a finite-gradient step with a non-finite loss counts too") {
  StepGuard g(2, 10);  // resumed at step 10
  CHECK_FALSE(g.after_step(11, stats(true, 1.0f), kNaN));
  const auto stop = g.after_step(12, stats(true, 1.0f), std::numeric_limits<double>::infinity());
  REQUIRE(stop);
  CHECK_THAT(*stop, ContainsSubstring("The last step that trained was 10 (before this run resumed)"));
}

TEST_CASE("step guard: an applied non-finite step stops at once (the state is poisoned)") {
  StepGuard g(20);
  CHECK_FALSE(g.after_step(1, stats(true, 3.0f), 4.2));
  const auto stop = g.after_step(2, stats(true, NAN), kNaN);
  REQUIRE(stop);
  CHECK_THAT(*stop, ContainsSubstring("training stopped at step 2"));
  CHECK_THAT(*stop, ContainsSubstring("the step was applied"));
  CHECK_THAT(*stop, ContainsSubstring("The last step that trained was 1."));
}

TEST_CASE("step guard: fp16's dynamic scaler coming down does not count") {
  // The scale falls from 2^32 for 30 overflowing steps (each halving), then fits.
  StepGuard g(5);
  double scale = 4294967296.0;
  for (int s = 1; s <= 30; ++s) {
    CHECK_FALSE(g.after_step(s, stats(false, INFINITY, scale, scale / 2), 3.0));
    scale /= 2;
  }
  CHECK(g.not_trained_in_a_row() == 30);
  CHECK(g.counted_in_a_row() == 0);
  CHECK_FALSE(g.after_step(31, stats(true, 1.0f, scale, scale), 3.0));
  // Overflows that leave the scale where it is (hysteresis, a static scale) count.
  for (int s = 32; s < 36; ++s) CHECK_FALSE(g.after_step(s, stats(false, INFINITY, 1024, 1024), 3.0));
  CHECK(g.after_step(36, stats(false, INFINITY, 1024, 1024), 3.0));
}

TEST_CASE("step guard: a run without one step that trained does not end as done") {
  StepGuard g(20, 2);  // resumed at step 2, 4 steps to go
  for (int s = 3; s <= 6; ++s) CHECK_FALSE(g.after_step(s, stats(false, NAN), kNaN));
  const auto end = g.at_end(6);
  REQUIRE(end);
  CHECK_THAT(*end, ContainsSubstring("the run ended at step 6 without one step that trained: all 4"));
  // One step that trained is enough; so is a run whose only skips were the fp16 scale coming down.
  StepGuard some(20);
  CHECK_FALSE(some.after_step(1, stats(true, 1.0f), 3.0));
  CHECK_FALSE(some.after_step(2, stats(false, NAN), kNaN));
  CHECK_FALSE(some.at_end(2));
  StepGuard searching(20);
  CHECK_FALSE(searching.after_step(1, stats(false, INFINITY, 65536, 32768), 3.0));
  CHECK_FALSE(searching.at_end(1));
}

TEST_CASE("step guard: a new run that never trained says so") {
  StepGuard g(1);
  const auto stop = g.after_step(1, stats(false, NAN), kNaN);
  REQUIRE(stop);
  CHECK_THAT(*stop, ContainsSubstring("No step has trained yet."));
}

TEST_CASE("step guard: 0 turns it off") {
  StepGuard g(0);
  for (int s = 1; s <= 100; ++s) CHECK_FALSE(g.after_step(s, stats(s % 2 == 0, NAN), kNaN));
  CHECK_FALSE(g.at_end(100));
}
