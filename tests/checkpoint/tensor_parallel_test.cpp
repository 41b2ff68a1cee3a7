// Checkpoints of tensor-parallel shards at the library level (no engine): a model's table is its
// whole shapes at any degree; shards saved through whole_pieces by a data x tensor grid load back
// at other degrees (4, 1) and other ZeRO partitions, element by element; a checkpoint without
// strided pieces stays format version 1 byte for byte.
//
// The grid is emulated in one process with the building blocks save() is made of (begin_save,
// write_rank_file per rank, commit_save), as helpers.hpp's FakeSave does. Values are a pure
// function of (array, parameter, WHOLE element index), computed from the shard side with core's
// param_slice_element, never from the pieces under test; exact in fp32, so every comparison is
// exact.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/rank_file.hpp"
#include "tests/checkpoint/helpers.hpp"
#include "tests/checkpoint/tensor_parallel_helpers.hpp"

using namespace zero;
using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// Saves the grid (rank = d * degree + t: tensor fastest, as collectives/grid.hpp orders it).
void save_grid(const std::string& dir, const std::string& tag, int degree, int D) {
  const std::vector<ParamInfo> params = table_of(shard_specs(0, degree));
  const int world = degree * D;
  std::vector<GridRank> ranks;
  std::vector<std::vector<ConstArray>> arrays(static_cast<size_t>(world));
  std::vector<SaveRequest> requests;
  for (int r = 0; r < world; ++r)
    ranks.push_back(grid_rank(r % degree, degree, r / degree, D, true));
  for (int r = 0; r < world; ++r) {
    for (size_t a = 0; a < array_names().size(); ++a)
      arrays[static_cast<size_t>(r)].push_back(
          {array_names()[a], ranks[static_cast<size_t>(r)].values[a].data()});
    SaveRequest q;
    q.params = params;
    q.pieces = ranks[static_cast<size_t>(r)].pieces;
    q.arrays = arrays[static_cast<size_t>(r)];
    q.metadata = R"({"tensor": 2})";
    q.block_elems = 7;  // tiny: runs straddle checksum blocks
    requests.push_back(q);
  }
  const std::string tmp = begin_save(dir, tag);
  const uint64_t id = 0x5eed;
  for (int r = 0; r < world; ++r)
    write_rank_file(tmp, r, world, id, requests[static_cast<size_t>(r)]);
  commit_save(dir, tag, world, id, requests[0]);
  // The start-up size check's figure is exact for the rank file, strided pieces included.
  for (int r = 0; r < world; ++r) {
    const uint64_t have = read_bytes(dir + "/" + tag + "/" + rank_file_name(r)).size();
    const SaveRequest& q = requests[static_cast<size_t>(r)];
    CHECK(checkpoint::detail::rank_file_bytes(q.pieces, array_names(), 7) == have);
    CHECK(save_bytes(q, r) > have);
  }
}

// Loads every rank of a degree x D grid and checks every element of every array.
void check_grid(const std::string& dir, const std::string& tag, int degree, int D) {
  const std::vector<ParamInfo> params = table_of(shard_specs(0, degree));
  for (int t = 0; t < degree; ++t)
    for (int d = 0; d < D; ++d) {
      INFO("loading as tensor rank " << t << " of " << degree << ", data rank " << d << " of "
                                     << D);
      const GridRank want = grid_rank(t, degree, d, D, false);
      const Loaded l = load_pieces(dir, tag, params, want.pieces);
      for (size_t a = 0; a < array_names().size(); ++a) REQUIRE(l.values[a] == want.values[a]);
    }
}

}  // namespace

TEST_CASE("tensor_parallel: the parameter table lists whole shapes at every degree and rank") {
  const std::vector<ParamInfo> whole = table_of(shard_specs(0, 1));
  CHECK(whole[0] == ParamInfo{"wte.weight", {20, 16}});
  const auto find = [&](const std::string& name) {
    return *std::find_if(whole.begin(), whole.end(),
                         [&](const ParamInfo& p) { return p.name == name; });
  };
  CHECK(find("h.1.attn.c_attn.weight").shape == std::vector<int64_t>{16, 48});
  CHECK(find("h.0.mlp.c_proj.weight").shape == std::vector<int64_t>{64, 16});
  for (int degree : {2, 4})
    for (int rank = 0; rank < degree; ++rank) {
      const std::vector<ParamSpec> specs = shard_specs(rank, degree);
      CHECK(specs[0].shape == Shape{20 / degree, 16});  // the shard itself is smaller
      CHECK(table_of(specs) == whole);
    }
}

TEST_CASE("tensor_parallel: shards saved at degree 2 x data 2 load at degrees 4 and 1") {
  TempDir dir;
  save_grid(dir.path, "tp2", 2, 2);
  // Strided pieces make the manifest and the files that hold them version 2.
  const std::string manifest = dir / "tp2/manifest.json";
  const std::vector<char> text = read_bytes(manifest);
  CHECK_THAT(std::string(text.begin(), text.end()), ContainsSubstring("\"version\": 2"));
  for (int r = 0; r < 4; ++r) CHECK(read_bytes(dir / ("tp2/" + rank_file_name(r)))[8] == 2);

  check_grid(dir.path, "tp2", 2, 2);  // as saved
  check_grid(dir.path, "tp2", 2, 3);  // another ZeRO partition of the same shards
  check_grid(dir.path, "tp2", 4, 1);  // degree 4, whole shards
  check_grid(dir.path, "tp2", 4, 3);  // degree 4, partial ZeRO ranges
  check_grid(dir.path, "tp2", 1, 1);  // the whole model on one rank
  check_grid(dir.path, "tp2", 1, 4);  // whole model, plain ZeRO slicing

  // A tensor rank other than 0 saving its copy of an unsliced parameter too: refused.
  const std::vector<ParamInfo> params = table_of(shard_specs(0, 2));
  const GridRank r0 = grid_rank(0, 2, 0, 1, false), r1 = grid_rank(1, 2, 0, 1, false);
  std::vector<ConstArray> a0, a1;
  for (size_t a = 0; a < array_names().size(); ++a) {
    a0.push_back({array_names()[a], r0.values[a].data()});
    a1.push_back({array_names()[a], r1.values[a].data()});
  }
  const SaveRequest q0{params, r0.pieces, a0}, q1{params, r1.pieces, a1};
  const std::string tmp = begin_save(dir.path, "twice");
  write_rank_file(tmp, 0, 2, 9, q0);
  write_rank_file(tmp, 1, 2, 9, q1);
  CHECK_THROWS_WITH(commit_save(dir.path, "twice", 2, 9, q0),
                    ContainsSubstring("parameter 'wpe.weight' (128 elements): elements [0, 128) "
                                      "are saved by rank 0 and by rank 1"));
}

TEST_CASE("tensor_parallel: a degree 4 save loads at degree 2 and exports the whole model") {
  TempDir dir;
  save_grid(dir.path, "tp4", 4, 1);
  check_grid(dir.path, "tp4", 2, 1);
  check_grid(dir.path, "tp4", 2, 2);
  check_grid(dir.path, "tp4", 1, 1);
  // export_safetensors reads whole parameters: the strided pieces are invisible to it.
  const std::string out = dir / "master.safetensors";
  export_safetensors(dir.path, "tp4", "master", out);
  const std::vector<ParamInfo> params = table_of(shard_specs(0, 1));
  const std::vector<std::vector<float>> got = import_safetensors(out, params);
  for (size_t p = 0; p < params.size(); ++p)
    for (int64_t e = 0; e < params[p].numel(); ++e)
      REQUIRE(got[p][static_cast<size_t>(e)] == value(0, static_cast<int>(p), e));
}

TEST_CASE("tensor_parallel: without strided pieces a checkpoint is format version 1 bytes") {
  // What builds before strided pieces wrote and read: every file version 1 with 24-byte piece
  // entries, the manifest version 1 with [param, offset, count] pieces; and it loads.
  TempDir dir;
  const std::vector<ParamInfo> params = model_params();
  FakeSave s;
  s.params = params;
  s.world = 2;
  s.pieces = [params](int r) { return slicing(params, 2, r); };
  s.run(dir.path, "v1");
  const std::vector<char> m = read_bytes(dir / "v1/manifest.json");
  const std::string text(m.begin(), m.end());
  CHECK_THAT(text, ContainsSubstring("\"version\": 1"));
  for (int r = 0; r < 2; ++r) {
    const std::vector<char> b = read_bytes(dir / ("v1/" + rank_file_name(r)));
    uint32_t version = 0, pieces = 0, arrays = 0, block = 0;
    uint64_t numel = 0, table = 0;
    std::memcpy(&version, &b[8], 4);
    std::memcpy(&pieces, &b[24], 4);
    std::memcpy(&arrays, &b[28], 4);
    std::memcpy(&block, &b[32], 4);
    std::memcpy(&numel, &b[56], 8);
    std::memcpy(&table, &b[64], 8);
    CHECK(version == 1);
    uint64_t names = 0;
    for (const std::string& n : array_names()) names += 4 + n.size();
    const uint64_t blocks = (numel + block - 1) / block;
    // docs/checkpoint-format.md's version 1 table: 24 bytes per piece, names, CRCs.
    CHECK(table == pieces * 24u + (names + 3) / 4 * 4 + arrays * blocks * 4);
    CHECK(pieces == slicing(params, 2, r).size());
  }
  const std::vector<Piece> all = slicing(params, 1, 0);
  const Loaded l = load_pieces(dir.path, "v1", params, all);
  for (size_t a = 0; a < array_names().size(); ++a)
    CHECK(l.values[a] == values_for(all, static_cast<int>(a)));
}

TEST_CASE("tensor_parallel: a non-finite value in a strided piece is named by its whole element") {
  // w [4, 6] saved by one rank as columns [1, 3) of every row (strided) and the rest; position 5
  // of the arrays is run 2, element 1 of the strided piece: whole element 1 + 2 * 6 + 1 = 14.
  TempDir dir;
  const std::vector<ParamInfo> params{{"w", {4, 6}}};
  const std::vector<Piece> pieces{{0, 1, 2, 4, 6}, {0, 0, 1},  {0, 3, 4},
                                  {0, 9, 4},       {0, 15, 4}, {0, 21, 3}};
  std::vector<float> values(24, 1.0f);
  values[5] = std::nanf("");
  const std::vector<ConstArray> arrays{{"master", values.data()}};
  const SaveRequest q{params, pieces, arrays};
  const std::string tmp = begin_save(dir.path, "nan");
  write_rank_file(tmp, 0, 1, 3, q);
  commit_save(dir.path, "nan", 1, 3, q);
  std::vector<float> out(24);
  const std::vector<Array> into{{"master", out.data()}};
  const std::vector<Piece> want{{0, 0, 24}};
  LoadRequest r{params, want, into};
  r.require_finite = true;
  CHECK_THROWS_WITH(load(dir.path, "nan", r),
                    ContainsSubstring("for parameter 'w' at element 14"));
  // Wanted strided too: the same element, 3 runs of 3 from element 8: run 2, element 0 (at 6).
  const std::vector<Piece> strided{{0, 2, 3, 3, 6}};
  r.pieces = strided;
  CHECK_THROWS_WITH(load(dir.path, "nan", r),
                    ContainsSubstring("for parameter 'w' at element 14"));
}
