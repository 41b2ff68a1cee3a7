// The process grid (collectives/grid.hpp) on 1, 2, 4 and 8 ranks, for every factorisation of
// the world into data x pipeline x tensor: each rank's coordinate, each axis communicator's
// size, its rank there and the world ranks in it, a sum all-reduce over each axis, and the
// pipeline neighbours.
//
// The expected layout is built here independently of grid.cpp, by numbering the ranks in nested
// loops (pipeline outermost, then data, tensor innermost), the placement docs/pipeline.md states.
// Values are small integers carried in fp32: every sum is exact (below 2^24), so the checks are
// equalities.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <array>
#include <map>
#include <vector>

#include "collectives/grid.hpp"
#include "core/error.hpp"
#include "core/world.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using coll::Axis;
using coll::GridCoord;
using coll::GridShape;
using Catch::Matchers::ContainsSubstring;

namespace {

using test::env;

// Every (data, pipeline, tensor) with data x pipeline x tensor == w.
std::vector<GridShape> factorisations(int w) {
  std::vector<GridShape> out;
  for (int p = 1; p <= w; ++p)
    for (int t = 1; t <= w; ++t)
      if (w % (p * t) == 0) out.push_back({w / (p * t), p, t});
  return out;
}

// The layout by enumeration: coordinate of every world rank.
std::vector<GridCoord> enumerate(const GridShape& s) {
  std::vector<GridCoord> coords;
  for (int p = 0; p < s.pipeline; ++p)
    for (int d = 0; d < s.data; ++d)
      for (int t = 0; t < s.tensor; ++t) coords.push_back({d, p, t});
  return coords;
}

// World ranks sharing `me`'s other two coordinates, ordered by the coordinate on `axis`.
std::vector<int> expected_group(const std::vector<GridCoord>& coords, int me, Axis axis) {
  std::map<int, int> by_coord;
  const GridCoord& m = coords[static_cast<size_t>(me)];
  for (size_t r = 0; r < coords.size(); ++r) {
    const GridCoord& c = coords[r];
    const bool same = (axis == Axis::data || c.data == m.data) &&
                      (axis == Axis::pipeline || c.pipeline == m.pipeline) &&
                      (axis == Axis::tensor || c.tensor == m.tensor);
    if (same) by_coord[c.on(axis)] = static_cast<int>(r);
  }
  std::vector<int> out;
  for (const auto& [coord, rank] : by_coord) out.push_back(rank);
  return out;
}

}  // namespace

TEST_CASE("grid: every factorisation of the world, coordinates and axis communicators") {
  coll::Communicator& world = *env().comm;
  const int W = world.size(), me = world.rank();
  for (const GridShape& shape : factorisations(W)) {
    INFO("grid " << shape.data << " data x " << shape.pipeline << " pipeline x " << shape.tensor
                 << " tensor, rank " << me);
    const std::vector<GridCoord> coords = enumerate(shape);
    coll::ProcessGrid grid(world, shape);
    CHECK(grid.coord() == coords[static_cast<size_t>(me)]);
    CHECK(coll::grid_coord(shape, me) == coords[static_cast<size_t>(me)]);
    CHECK(grid.world_rank() == me);

    for (Axis axis : {Axis::data, Axis::pipeline, Axis::tensor}) {
      INFO("axis " << to_string(axis));
      coll::Communicator& comm = grid.axis(axis);
      const std::vector<int> members = expected_group(coords, me, axis);
      REQUIRE(comm.size() == static_cast<int>(members.size()));
      CHECK(comm.size() == shape.size(axis));
      CHECK(comm.rank() == grid.coord().on(axis));
      CHECK(coll::axis_group(shape, me, axis) == members);

      // Who is in the communicator, in its rank order: exactly the expected world ranks.
      const float mine = static_cast<float>(me);
      std::vector<float> got(members.size(), -1.0f);
      comm.all_gather(&mine, got.data(), 1, DType::f32).wait();
      for (size_t i = 0; i < members.size(); ++i) CHECK(got[i] == static_cast<float>(members[i]));

      // A sum over the axis: each rank gives 1 + its world rank.
      const float x = 1.0f + static_cast<float>(me);
      float sum = 0;
      comm.all_reduce(&x, &sum, 1, DType::f32, coll::ReduceOp::sum).wait();
      float expected = 0;
      for (int r : members) expected += 1.0f + static_cast<float>(r);
      CHECK(sum == expected);
    }

    // Pipeline neighbours: the stages before and after in this rank's pipeline, none at the ends.
    const std::vector<int> pipe = expected_group(coords, me, Axis::pipeline);
    const int p = coords[static_cast<size_t>(me)].pipeline;
    CHECK(grid.first_stage() == (p == 0));
    CHECK(grid.last_stage() == (p == shape.pipeline - 1));
    if (p == 0) CHECK_FALSE(grid.prev_stage().has_value());
    else {
      REQUIRE(grid.prev_stage().has_value());
      CHECK(pipe[static_cast<size_t>(*grid.prev_stage())] == pipe[static_cast<size_t>(p - 1)]);
      CHECK(*grid.prev_stage() == p - 1);
    }
    if (p == shape.pipeline - 1) CHECK_FALSE(grid.next_stage().has_value());
    else {
      REQUIRE(grid.next_stage().has_value());
      CHECK(*grid.next_stage() == p + 1);
    }
  }
}

TEST_CASE("grid: the documented placement on 8 ranks as 2 x 2 x 2") {
  coll::Communicator& world = *env().comm;
  if (world.size() != 8) SKIP("8 ranks only");
  const GridShape shape{2, 2, 2};
  coll::ProcessGrid grid(world, shape);
  // Written out by hand from rank = t + 2 (d + 2 p): tensor pairs are adjacent ranks.
  constexpr std::array<std::array<int, 3>, 8> kDpt = {{
      {0, 0, 0}, {0, 0, 1}, {1, 0, 0}, {1, 0, 1}, {0, 1, 0}, {0, 1, 1}, {1, 1, 0}, {1, 1, 1}}};
  const auto& e = kDpt[static_cast<size_t>(world.rank())];
  CHECK(grid.coord() == GridCoord{e[0], e[1], e[2]});
  const int r = world.rank();
  CHECK(coll::axis_group(shape, r, Axis::tensor) == std::vector<int>{r & ~1, (r & ~1) + 1});
  CHECK(coll::axis_group(shape, r, Axis::pipeline) == std::vector<int>{r % 4, r % 4 + 4});
}

TEST_CASE("grid: a shape that does not match the world is an error on every rank, no split") {
  coll::Communicator& world = *env().comm;
  const int W = world.size();
  const GridShape wrong{W, 2, 1};  // 2W ranks
  try {
    coll::ProcessGrid grid(world, wrong);
    FAIL("a grid of " << 2 * W << " ranks was built on " << W);
  } catch (const Error& e) {
    CHECK_THAT(e.what(), ContainsSubstring(std::to_string(W) + " data x 2 pipeline x 1 tensor"));
    CHECK_THAT(e.what(), ContainsSubstring("world size " + std::to_string(W)));
    CHECK_THAT(e.what(), ContainsSubstring("zero_train.parallel.pipeline"));
  }
  // The world still works (no rank is left inside a split).
  const float one = 1;
  float n = 0;
  world.all_reduce(&one, &n, 1, DType::f32, coll::ReduceOp::sum).wait();
  CHECK(n == static_cast<float>(W));
}
