// Catch2 main for multi-rank tests: every rank runs every test case, in the same order, inside
// one initialised World. Every rank exits with the job's verdict: 1 if any rank failed, 4 if
// every rank skipped everything, else 0.
#include <catch2/catch_session.hpp>

#include "core/world.hpp"

int main(int argc, char** argv) {
  zero::World& world = zero::World::init(&argc, &argv);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  // Every rank must run the same test cases in the same order (they call collectives), and
  // Catch2 v3 shuffles by default with a per-process seed: pin the declared order.
  session.configData().runOrder = Catch::TestRunOrder::Declared;
  if (rc == 0) rc = session.run();
  // Agree on the outcome before finalising so no rank leaves while another still communicates.
  // Catch2 returns 4 when every test case skipped (no GPU): ctest reports that as Skipped.
  const bool any_failed = world.any(rc != 0 && rc != 4);
  const bool all_skipped = !world.any(rc != 4);
  world.finalize();
  return any_failed ? 1 : all_skipped ? 4 : 0;
}
