// Request checks and the coverage index behind re-slicing: exact tiling is required, gaps and
// double coverage are named, and a wanted piece resolves into the saved runs that hold it.
#include "runtime/checkpoint/pieces.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::detail;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("pieces: table and piece checks name the culprit") {
  std::vector<ParamInfo> t{{"a", {2, 3}}, {"b", {4}}};
  CHECK(param_table_error(t).empty());
  CHECK(t[0].numel() == 6);
  CHECK(ParamInfo{"s", {}}.numel() == 1);
  CHECK_THAT(param_table_error(std::vector<ParamInfo>{{"a", {2}}, {"a", {3}}}),
             ContainsSubstring("repeats the name"));
  CHECK_THAT(param_table_error(std::vector<ParamInfo>{{"", {2}}}), ContainsSubstring("empty name"));
  CHECK_THAT(param_table_error(std::vector<ParamInfo>{{"x", {2, -1}}}),
             ContainsSubstring("negative dimension in its shape [2, -1]"));
  CHECK_THAT(param_table_error(std::vector<ParamInfo>{{"x", {1 << 30, 1 << 30, 1 << 30}}}),
             ContainsSubstring("more than 2^56"));

  CHECK(pieces_error(t, std::vector<Piece>{{0, 0, 6}, {1, 1, 3}}).empty());
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{2, 0, 1}}),
             ContainsSubstring("names no parameter"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{0, 0, 0}}), ContainsSubstring("is empty"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{1, 2, 3}}),
             ContainsSubstring("lies outside parameter 'b' of 4 elements"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{1, -1, 2}}), ContainsSubstring("lies outside"));
  CHECK(total_count(std::vector<Piece>{{0, 0, 6}, {1, 1, 3}}) == 9);
}

TEST_CASE("pieces: coverage must tile every parameter exactly once") {
  const std::vector<ParamInfo> t{{"a", {10}}, {"b", {4}}, {"none", {0}}};
  Coverage c;
  const std::vector<std::vector<Piece>> ok{{{0, 5, 5}, {1, 0, 2}}, {{0, 0, 5}}, {{1, 2, 2}}};
  CHECK(c.build(t, ok).empty());
  const std::vector<std::vector<Piece>> gap{{{0, 0, 4}}, {{0, 5, 5}, {1, 0, 4}}};
  CHECK_THAT(
      c.build(t, gap),
      ContainsSubstring("parameter 'a' (10 elements): elements [4, 5) are saved by no rank"));
  const std::vector<std::vector<Piece>> tail{{{0, 0, 10}, {1, 0, 3}}};
  CHECK_THAT(c.build(t, tail),
             ContainsSubstring("parameter 'b' (4 elements): elements [3, 4) are saved by no rank"));
  const std::vector<std::vector<Piece>> twice{{{0, 0, 6}, {1, 0, 4}}, {{0, 4, 6}}};
  CHECK_THAT(c.build(t, twice),
             ContainsSubstring("elements [4, 6) are saved by rank 0 and by rank 1"));
}

TEST_CASE("pieces: locate splits a wanted piece at saved boundaries, with file positions") {
  const std::vector<ParamInfo> t{{"a", {10}}, {"b", {4}}};
  // file 0: b[0,2) then a[5,10); file 1: a[0,5), b[2,4)
  const std::vector<std::vector<Piece>> files{{{1, 0, 2}, {0, 5, 5}}, {{0, 0, 5}, {1, 2, 2}}};
  Coverage c;
  REQUIRE(c.build(t, files).empty());
  const auto runs = c.locate({0, 3, 5});  // a[3, 8)
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].file == 1);
  CHECK(runs[0].src == 3);
  CHECK(runs[0].count == 2);
  CHECK(runs[0].dst == 0);
  CHECK(runs[1].file == 0);
  CHECK(runs[1].src == 2);  // after b's 2 elements
  CHECK(runs[1].count == 3);
  CHECK(runs[1].dst == 2);
  const auto whole = c.locate({1, 0, 4});
  REQUIRE(whole.size() == 2);
  CHECK((whole[0].file == 0 && whole[0].src == 0 && whole[0].count == 2));
  CHECK((whole[1].file == 1 && whole[1].src == 5 && whole[1].count == 2 && whole[1].dst == 2));
}

TEST_CASE("pieces: the test slicings tile the table (so the other tests' oracles are sound)") {
  using namespace zero::checkpoint::test;
  const auto params = model_params();
  for (int world : {1, 2, 3, 4, 7}) {
    std::vector<std::vector<Piece>> a, b;
    for (int r = 0; r < world; ++r) {
      a.push_back(slicing(params, world, r));
      b.push_back(dealt(params, world, r, 5));
    }
    Coverage c;
    CHECK(c.build(params, a).empty());
    CHECK(c.build(params, b).empty());
  }
}
