// The grid's arithmetic (collectives/grid.hpp) without MPI: the rank <-> coordinate formula both
// ways, the axis groups, and the errors for shapes that do not fit the world. The communicators
// themselves are tested on 1, 2, 4 and 8 ranks in tests/mpi/grid_test.cpp.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <set>
#include <vector>

#include "collectives/grid.hpp"
#include "core/error.hpp"

using namespace zero;
using coll::Axis;
using coll::GridCoord;
using coll::GridShape;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("grid: rank and coordinate are inverse, tensor fastest, pipeline outermost") {
  for (int D = 1; D <= 4; ++D)
    for (int P = 1; P <= 4; ++P)
      for (int T = 1; T <= 4; ++T) {
        const GridShape s{D, P, T};
        INFO(D << " x " << P << " x " << T);
        int next = 0;  // ranks counted in nested loops: pipeline, data, tensor innermost
        for (int p = 0; p < P; ++p)
          for (int d = 0; d < D; ++d)
            for (int t = 0; t < T; ++t) {
              const GridCoord c{d, p, t};
              CHECK(coll::grid_rank(s, c) == next);
              CHECK(coll::grid_coord(s, next) == c);
              ++next;
            }
        CHECK(next == s.world());
      }
}

TEST_CASE("grid: the axis groups partition the world, one group per pair of other coordinates") {
  const GridShape s{3, 2, 2};  // 12 ranks
  for (Axis axis : {Axis::data, Axis::pipeline, Axis::tensor}) {
    std::set<std::vector<int>> groups;
    for (int r = 0; r < 12; ++r) {
      const std::vector<int> g = coll::axis_group(s, r, axis);
      REQUIRE(static_cast<int>(g.size()) == s.size(axis));
      // The i-th member has coordinate i on the axis and shares the other two with r.
      for (int i = 0; i < s.size(axis); ++i) {
        const GridCoord c = coll::grid_coord(s, g[static_cast<size_t>(i)]);
        CHECK(c.on(axis) == i);
        const GridCoord m = coll::grid_coord(s, r);
        for (Axis other : {Axis::data, Axis::pipeline, Axis::tensor})
          if (other != axis) CHECK(c.on(other) == m.on(other));
      }
      groups.insert(g);
    }
    CHECK(static_cast<long long>(groups.size()) == 12 / s.size(axis));
  }
  // Tensor groups are runs of adjacent ranks.
  CHECK(coll::axis_group(s, 5, Axis::tensor) == std::vector<int>{4, 5});
  CHECK(coll::axis_group(s, 5, Axis::data) == std::vector<int>{1, 3, 5});
  CHECK(coll::axis_group(s, 5, Axis::pipeline) == std::vector<int>{5, 11});
}

TEST_CASE("grid: the data-parallel size is what pipeline x tensor leaves of the world") {
  CHECK(coll::grid_shape_for(8, 2, 1) == GridShape{4, 2, 1});
  CHECK(coll::grid_shape_for(8, 2, 2) == GridShape{2, 2, 2});
  CHECK(coll::grid_shape_for(8, 8, 1) == GridShape{1, 8, 1});
  CHECK(coll::grid_shape_for(1, 1, 1) == GridShape{1, 1, 1});
}

TEST_CASE("grid: a world that pipeline x tensor does not divide is a clear error") {
  try {
    (void)coll::grid_shape_for(6, 4, 1);
    FAIL("6 ranks as 4 stages");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), ContainsSubstring("6 ranks cannot be arranged as data x 4 pipeline x 1 tensor"));
    CHECK_THAT(e.what(), ContainsSubstring("world size 6"));
    CHECK_THAT(e.what(), ContainsSubstring("zero_train.parallel.pipeline"));
    CHECK_THAT(e.what(), ContainsSubstring("zero_train.parallel.tensor"));
  }
  CHECK_THROWS_WITH(coll::grid_shape_for(4, 0, 1), ContainsSubstring("must both be >= 1"));
  CHECK_THROWS_WITH(coll::check_grid({2, 2, 1}, 8),
                    ContainsSubstring("2 data x 2 pipeline x 1 tensor = 4 ranks does not match "
                                      "the world size 8"));
  CHECK_THROWS_WITH(coll::check_grid({0, 2, 1}, 0), ContainsSubstring("must be >= 1"));
  CHECK_NOTHROW(coll::check_grid({2, 2, 2}, 8));
}
