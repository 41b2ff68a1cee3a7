// whole_pieces: a tensor-parallel shard's range as pieces of the whole parameter, checked
// element by element against core's param_slice_element (the index map the model initialises
// shards with), for row and column splits, 1 and 3 blocks, every rank of degrees 1, 2 and 4.
#include "runtime/checkpoint/slice_pieces.hpp"

#include <random>
#include <string>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "runtime/checkpoint/pieces.hpp"

using namespace zero;
using namespace zero::checkpoint;
using Catch::Matchers::ContainsSubstring;

namespace {

// Shard `rank` of `degree` of a parameter of shape `full` cut along `dim` in `blocks` blocks.
ParamSpec shard(const Shape& full, int dim, int blocks, int rank, int degree) {
  std::vector<int64_t> dims;
  for (int d = 0; d < full.rank(); ++d) dims.push_back(d == dim ? full[d] / degree : full[d]);
  Shape shape;
  switch (dims.size()) {
    case 1: shape = Shape{dims[0]}; break;
    case 2: shape = Shape{dims[0], dims[1]}; break;
    default: shape = Shape{dims[0], dims[1], dims[2]}; break;
  }
  ParamSpec spec{"p", shape};
  spec.slice = {TensorSplit::sliced, full, dim, blocks, rank, degree};
  check_param_slice(spec);  // the test's own shards must be what the model would build
  return spec;
}

// The whole-parameter index of every element the pieces hold, in array order.
std::vector<int64_t> elements(const std::vector<Piece>& pieces) {
  std::vector<int64_t> out;
  for (const Piece& p : pieces)
    for (int64_t r = 0; r < p.repeat; ++r)
      for (int64_t e = 0; e < p.count; ++e) out.push_back(p.offset + r * p.stride + e);
  return out;
}

// whole_pieces of [a, a + n) against param_slice_element, plus the shape of the answer: valid
// pieces of the whole table, at most three (partial run, strided whole runs, partial run).
void check_range(const ParamSpec& spec, int64_t a, int64_t n) {
  const std::vector<Piece> pieces = whole_pieces(spec.slice, 0, a, n);
  std::vector<ParamInfo> whole{{"p", {}}};
  for (int d = 0; d < spec.slice.full.rank(); ++d) whole[0].shape.push_back(spec.slice.full[d]);
  INFO("shape " << spec.shape.str() << " of " << spec.slice.full.str() << " dim "
                << spec.slice.dim << " blocks " << spec.slice.blocks << " rank "
                << spec.slice.rank << "/" << spec.slice.degree << " range [" << a << ", +" << n
                << ")");
  REQUIRE(checkpoint::detail::pieces_error(whole, pieces).empty());
  CHECK(pieces.size() <= 3);
  const std::vector<int64_t> got = elements(pieces);
  REQUIRE(static_cast<int64_t>(got.size()) == n);
  bool same = true;
  for (int64_t i = 0; i < n && same; ++i) {
    same = got[static_cast<size_t>(i)] == param_slice_element(spec, a + i);
    if (!same) FAIL_CHECK("element " << a + i << " maps to " << got[static_cast<size_t>(i)]
                                     << ", param_slice_element says "
                                     << param_slice_element(spec, a + i));
  }
}

struct Layout {
  Shape full;
  int dim, blocks;
};

// Row split (c_proj, wte), column splits of 1 and 3 blocks (c_fc, c_attn), their biases (1-D,
// blocks 1 and 3) and a 3-D column split (inner dimension > 1).
const std::vector<Layout>& layouts() {
  static const std::vector<Layout> l{
      {Shape{8, 6}, 0, 1},  {Shape{4, 12}, 1, 1}, {Shape{4, 12}, 1, 3},
      {Shape{12}, 0, 1},    {Shape{12}, 0, 3},    {Shape{2, 12, 3}, 1, 3},
  };
  return l;
}

}  // namespace

TEST_CASE("slice_pieces: every range of every shard matches param_slice_element") {
  for (const Layout& l : layouts())
    for (int degree : {1, 2, 4})
      for (int rank = 0; rank < degree; ++rank) {
        const ParamSpec spec = shard(l.full, l.dim, l.blocks, rank, degree);
        const int64_t n = spec.numel();
        for (int64_t a = 0; a < n; ++a)
          for (int64_t c = 1; a + c <= n; ++c) check_range(spec, a, c);
      }
}

TEST_CASE("slice_pieces: random ranges of large shards use one strided piece for whole runs") {
  std::mt19937_64 rng(2019);
  const std::vector<Layout> big{{Shape{96, 384}, 1, 3}, {Shape{96, 384}, 1, 1},
                                {Shape{384, 96}, 0, 1}, {Shape{5, 48, 7}, 1, 3}};
  for (const Layout& l : big)
    for (int degree : {1, 2, 4})
      for (int rank = 0; rank < degree; ++rank) {
        const ParamSpec spec = shard(l.full, l.dim, l.blocks, rank, degree);
        const int64_t n = spec.numel();
        check_range(spec, 0, n);
        for (int k = 0; k < 40; ++k) {
          const int64_t a = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
          check_range(spec, a, 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - a)));
        }
      }
  // The whole shard of c_attn [96, 384] at degree 4: 96 rows x 3 blocks of 32 columns.
  const std::vector<Piece> p = whole_pieces(shard(Shape{96, 384}, 1, 3, 2, 4).slice, 7, 0, 96 * 96);
  REQUIRE(p.size() == 1);
  CHECK(p[0] == Piece{7, 2 * 32, 32, 96 * 3, 128});
  // A row split is one contiguous piece, whatever the range.
  CHECK(whole_pieces(shard(Shape{384, 96}, 0, 1, 3, 4).slice, 1, 5, 2000) ==
        std::vector<Piece>{{1, 3 * 96 * 96 + 5, 2000}});
}

TEST_CASE("slice_pieces: the shards of every rank tile the whole parameter") {
  for (const Layout& l : layouts())
    for (int degree : {1, 2, 4}) {
      std::vector<ParamInfo> whole{{"p", {}}};
      for (int d = 0; d < l.full.rank(); ++d) whole[0].shape.push_back(l.full[d]);
      std::vector<std::vector<Piece>> files;
      for (int rank = 0; rank < degree; ++rank) {
        const ParamSpec spec = shard(l.full, l.dim, l.blocks, rank, degree);
        // Two ZeRO partitions of the shard, cut at an awkward point.
        const int64_t cut = spec.numel() / 3 + 1;
        files.push_back(whole_pieces(spec.slice, 0, 0, cut));
        files.push_back(whole_pieces(spec.slice, 0, cut, spec.numel() - cut));
      }
      checkpoint::detail::Coverage c;
      CHECK(c.build(whole, files).empty());
    }
}

TEST_CASE("slice_pieces: unsliced and replicated parameters are one contiguous piece") {
  CHECK(whole_pieces(ParamSlice{}, 3, 10, 20) == std::vector<Piece>{{3, 10, 20}});
  ParamSlice rep{TensorSplit::replicated, Shape{4, 5}, 0, 1, 1, 2};
  CHECK(whole_pieces(rep, 0, 2, 18) == std::vector<Piece>{{0, 2, 18}});
  CHECK(whole_pieces(rep, 0, 20, 0).empty());
  CHECK_THROWS_WITH(whole_pieces(rep, 0, 2, 19),
                    ContainsSubstring("lies outside the replicated parameter [4, 5]"));
}

TEST_CASE("slice_pieces: bad ranges and slices are refused") {
  const ParamSlice s = shard(Shape{4, 12}, 1, 3, 1, 2).slice;
  CHECK_THROWS_WITH(whole_pieces(s, 5, 20, 5),
                    ContainsSubstring("parameter 5's shard range [20, + 5)") &&
                        ContainsSubstring("lies outside the shard of 24 elements"));
  CHECK_THROWS_WITH(whole_pieces(s, 5, -1, 5), ContainsSubstring("is negative"));
  ParamSlice bad = s;
  bad.rank = 2;
  CHECK_THROWS_WITH(whole_pieces(bad, 0, 0, 1),
                    ContainsSubstring("the slice (rank 2 of 2, dimension 1, 3 block(s)) does not "
                                      "fit the shape [4, 12]"));
  bad = s;
  bad.degree = 8;  // 12 columns are not 3 blocks x 8
  bad.rank = 0;
  CHECK_THROWS_WITH(whole_pieces(bad, 0, 0, 1), ContainsSubstring("does not fit"));
}
