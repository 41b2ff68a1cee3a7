// Catch2 main for multi-rank tests: every rank runs every test case, in the same order, inside
// one initialised World. Only rank 0 reports unless a rank fails; the exit code of each rank
// is its own result, and mpirun fails if any rank fails.
#include <catch2/catch_session.hpp>

#include "runtime/core/world.hpp"

int main(int argc, char** argv) {
  zero::World& world = zero::World::init(&argc, &argv);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  // Agree on the outcome before finalising so no rank leaves while another still communicates.
  const bool any_failed = world.any(rc != 0);
  world.finalize();
  return any_failed ? 1 : 0;
}
