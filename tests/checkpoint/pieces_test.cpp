// Request checks and the coverage index behind re-slicing: exact tiling is required, gaps and
// double coverage are named, and a wanted piece resolves into the saved runs that hold it.
#include "runtime/checkpoint/pieces.hpp"

#include <cstdint>
#include <map>
#include <random>
#include <utility>

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

TEST_CASE("pieces: strided pieces are checked run by run") {
  const std::vector<ParamInfo> t{{"w", {4, 6}}};
  // Columns [1, 3) of every row.
  CHECK(pieces_error(t, std::vector<Piece>{{0, 1, 2, 4, 6}}).empty());
  // stride == count: adjacent runs, one contiguous range in effect.
  CHECK(pieces_error(t, std::vector<Piece>{{0, 0, 6, 4, 6}}).empty());
  // repeat 1 ignores the stride.
  CHECK(pieces_error(t, std::vector<Piece>{{0, 0, 6, 1, 99}}).empty());
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{0, 1, 3, 4, 2}}),
             ContainsSubstring("piece 0 {param 0, offset 1, count 3, repeat 4, stride 2} has "
                               "overlapping runs"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{0, 4, 3, 4, 6}}),
             ContainsSubstring("its last run starts at 22, outside parameter 'w' of 24 elements"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{0, 0, 1, 0, 6}}),
             ContainsSubstring("repeat < 1"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{0, 0, 1, int64_t{1} << 62, int64_t{1} << 40}}),
             ContainsSubstring("overflows 64 bits"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{0, 10, 1, 2, INT64_MAX - 5}}),
             ContainsSubstring("its last run starts beyond 2^63"));
  CHECK_THAT(pieces_error(t, std::vector<Piece>{{0, 0, 2, 1 << 20, 8}}),
             ContainsSubstring("outside parameter 'w'"));
  const std::vector<Piece> mixed{{0, 1, 2, 4, 6}, {0, 0, 1}};
  CHECK(total_count(mixed) == 9);
  CHECK(pieces_version(mixed) == 2);
  CHECK(pieces_version(std::vector<Piece>{{0, 0, 1}, {0, 1, 5, 1, 7}}) == 1);
}

TEST_CASE("pieces: coverage tiles strided pieces and names their gaps and overlaps") {
  const std::vector<ParamInfo> t{{"w", {4, 6}}};
  Coverage c;
  // Column halves of a [4, 6] matrix: two strided pieces.
  CHECK(c.build(t, std::vector<std::vector<Piece>>{{{0, 0, 3, 4, 6}}, {{0, 3, 3, 4, 6}}}).empty());
  // The second file misses the last row's right half.
  CHECK_THAT(c.build(t, std::vector<std::vector<Piece>>{{{0, 0, 3, 4, 6}}, {{0, 3, 3, 3, 6}}}),
             ContainsSubstring("parameter 'w' (24 elements): elements [21, 24) are saved by no "
                               "rank"));
  // Columns [2, 4) of every row twice.
  CHECK_THAT(c.build(t, std::vector<std::vector<Piece>>{{{0, 0, 4, 4, 6}}, {{0, 2, 4, 4, 6}}}),
             ContainsSubstring("elements [2, 4) are saved by rank 0 and by rank 1"));
  // A strided piece plus the plain pieces in its gaps.
  CHECK(c.build(t, std::vector<std::vector<Piece>>{
                       {{0, 0, 2, 4, 6}}, {{0, 2, 4}, {0, 8, 4}, {0, 14, 4}, {0, 20, 4}}})
            .empty());
}

TEST_CASE("pieces: locate of strided and plain wants matches an element-by-element oracle") {
  const std::vector<ParamInfo> t{{"a", {6, 12}}, {"b", {30}}};
  // Saved: a's columns cut in three strided pieces dealt to two files, b in plain chunks.
  const std::vector<std::vector<Piece>> files{
      {{1, 10, 20}, {0, 0, 5, 6, 12}, {0, 9, 3, 6, 12}},
      {{0, 5, 4, 6, 12}, {1, 0, 10}}};
  Coverage c;
  REQUIRE(c.build(t, files).empty());
  // The oracle: (file, position) of every saved element.
  std::map<std::pair<int, int64_t>, std::pair<int, uint64_t>> where;
  for (size_t f = 0; f < files.size(); ++f) {
    uint64_t pos = 0;
    for (const Piece& p : files[f])
      for (int64_t r = 0; r < p.repeat; ++r)
        for (int64_t e = 0; e < p.count; ++e)
          where[{p.param, p.offset + r * p.stride + e}] = {static_cast<int>(f), pos++};
  }
  const auto check = [&](const Piece& want) {
    REQUIRE(pieces_error(t, std::vector<Piece>{want}).empty());
    std::vector<std::pair<int, uint64_t>> got(static_cast<size_t>(want.length()), {-1, 0});
    for (const Coverage::Run& run : c.locate(want))
      for (uint64_t k = 0; k < run.count; ++k) got.at(run.dst + k) = {run.file, run.src + k};
    for (int64_t r = 0, i = 0; r < want.repeat; ++r)
      for (int64_t e = 0; e < want.count; ++e, ++i)
        CHECK(got[static_cast<size_t>(i)] ==
              where.at({want.param, want.offset + r * want.stride + e}));
  };
  check({0, 0, 72});
  check({0, 3, 6, 6, 12});   // columns [3, 9): across all three saved column pieces
  check({0, 14, 7, 3, 12});  // a partial band of rows
  check({1, 5, 3, 5, 5});
  std::mt19937 rng(19);
  for (int k = 0; k < 200; ++k) {
    const int param = static_cast<int>(rng() % 2);
    const int64_t numel = t[static_cast<size_t>(param)].numel();
    const int64_t count = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t stride = count + static_cast<int64_t>(rng() % 10);
    const int64_t offset = static_cast<int64_t>(rng() % static_cast<uint64_t>(numel - count + 1));
    const int64_t repeat = 1 + (numel - count - offset) / stride;  // as many runs as fit
    check({param, offset, count, 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(repeat)),
           stride});
  }
}

TEST_CASE("pieces: coverage merges runs that continue each other in one file") {
  const std::vector<ParamInfo> t{{"w", {1000, 8}}};
  Coverage c;
  // One file saving the whole matrix as 1000 adjacent rows (stride == count): one saved run.
  REQUIRE(c.build(t, std::vector<std::vector<Piece>>{{{0, 0, 8, 1000, 8}}}).empty());
  const auto runs = c.locate({0, 0, 8000});
  REQUIRE(runs.size() == 1);
  CHECK((runs[0].src == 0 && runs[0].count == 8000 && runs[0].dst == 0));
}
