// The MPI world under mpirun (2 and 4 ranks) and as a plain process (1 rank).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdlib>
#include <vector>

#include "core/error.hpp"
#include "core/mpi_check.hpp"
#include "core/world.hpp"

using Catch::Matchers::ContainsSubstring;

TEST_CASE("world: rank and size agree with MPI_COMM_WORLD and the launcher") {
  zero::World& w = zero::World::get();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(w.rank() == rank);
  CHECK(w.size() == size);
  CHECK(w.is_root() == (rank == 0));
  // The size the test was registered with (ctest passes it in the environment).
  if (const char* expected = std::getenv("ZERO_EXPECT_RANKS")) CHECK(w.size() == std::atoi(expected));
  CHECK(w.thread_level() == MPI_THREAD_MULTIPLE);
}

TEST_CASE("world: local rank and size describe this host") {
  zero::World& w = zero::World::get();
  // Tests run on one host: the local numbering is the global one.
  CHECK(w.local_size() == w.size());
  CHECK(w.local_rank() == w.rank());
  CHECK_FALSE(w.hostname().empty());
}

TEST_CASE("world: every rank sees every other rank's value") {
  zero::World& w = zero::World::get();
  std::vector<int> all(static_cast<size_t>(w.size()), -1);
  int mine = 100 + w.rank();
  ZERO_CHECK_MPI(MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, w.comm()));
  for (int r = 0; r < w.size(); ++r) CHECK(all[static_cast<size_t>(r)] == 100 + r);
  w.barrier();
}

TEST_CASE("world: any() is true on every rank when one rank says so") {
  zero::World& w = zero::World::get();
  CHECK_FALSE(w.any(false));
  CHECK(w.any(true));
  const int last = w.size() - 1;
  CHECK(w.any(w.rank() == last));
}

TEST_CASE("world: a failing MPI call throws zero::Error with MPI's message") {
  zero::World& w = zero::World::get();
  int x = 0;
  // Rank size+5 does not exist: MPI_ERR_RANK, returned (not fatal) thanks to MPI_ERRORS_RETURN.
  try {
    ZERO_CHECK_MPI(MPI_Send(&x, 1, MPI_INT, w.size() + 5, 0, w.comm()));
    FAIL("MPI_Send to a non-existent rank did not fail");
  } catch (const zero::Error& e) {
    CHECK(e.library() == "MPI");
    CHECK_THAT(e.what(), ContainsSubstring("MPI error: "));
    CHECK_THAT(e.what(), ContainsSubstring("invalid rank"));
    CHECK_THAT(e.what(), ContainsSubstring("MPI_Send(&x, 1, MPI_INT, w.size() + 5, 0, w.comm())"));
    CHECK_THAT(e.what(), ContainsSubstring("tests/mpi/world_test.cpp:"));
  }
}
