// Checkpoints on 1, 2 and 4 ranks through the collective save(): every rank saves its slice,
// then loads another slicing (that of 3 ranks, and small dealt pieces) and checks every value;
// a stage-0-style save (rank 0 owns everything) reloads sliced; a rank with another model or an
// invalid request makes save() fail on every rank, naming that rank, with the ranks still in
// step afterwards; overwriting a tag collectively; tensor-parallel shards of a data x tensor
// grid saved through whole_pieces, reloaded at other tensor degrees.
//
// Values are exact (helpers.hpp): comparisons are exact, unwritten elements stay NaN and fail.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <array>
#include <filesystem>

#include "runtime/checkpoint/checkpoint.hpp"
#include "tests/checkpoint/helpers.hpp"
#include "tests/checkpoint/tensor_parallel_helpers.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;

namespace {

coll::Communicator& comm() { return *zero::test::env().comm; }

// One directory every rank sees (the ranks share a host here): rank 0 makes it and sends its
// name, one character per float; rank 0 removes it once every rank is done.
struct SharedDir {
  std::string path;
  std::unique_ptr<TempDir> owned;  // rank 0's
  SharedDir() {
    std::vector<float> name(256, 0.0f);
    if (comm().rank() == 0) {
      owned = std::make_unique<TempDir>();
      REQUIRE(owned->path.size() < name.size());
      for (size_t i = 0; i < owned->path.size(); ++i)
        name[i] = static_cast<unsigned char>(owned->path[i]);
    }
    comm().broadcast(name.data(), name.size(), DType::f32, 0).wait();
    for (float c : name) {
      if (c == 0.0f) break;
      path += static_cast<char>(static_cast<int>(c));
    }
  }
  ~SharedDir() { comm().barrier().wait(); }  // then rank 0's TempDir removes it
  std::string operator/(const std::string& n) const { return path + "/" + n; }
};

// This rank's request for `pieces` with values_for(.., a, shift) in every array.
struct Request {
  std::vector<Piece> pieces;
  std::vector<std::vector<float>> values;
  std::vector<ConstArray> arrays;
  Request(std::vector<Piece> p, float shift = 0.0f) : pieces(std::move(p)) {
    for (size_t a = 0; a < array_names().size(); ++a)
      values.push_back(values_for(pieces, static_cast<int>(a), shift));
    for (size_t a = 0; a < array_names().size(); ++a)
      arrays.push_back({array_names()[a], values[a].data()});
  }
  SaveRequest request(const std::vector<ParamInfo>& params,
                      std::string_view metadata = "{}") const {
    return {params, pieces, arrays, metadata, 7};
  }
};

void check_load(const std::string& dir, const std::string& tag,
                const std::vector<ParamInfo>& params, const std::vector<Piece>& pieces,
                float shift = 0.0f) {
  const Loaded l = load_pieces(dir, tag, params, pieces);
  CHECK(l.result.saved_world_size > 0);
  for (size_t a = 0; a < array_names().size(); ++a)
    REQUIRE(l.values[a] == values_for(pieces, static_cast<int>(a), shift));
}

}  // namespace

TEST_CASE("checkpoint: collective save; every rank reloads with other slicings") {
  SharedDir dir;
  const auto params = model_params();
  const int rank = comm().rank(), world = comm().size();
  const Request mine(slicing(params, world, rank));
  const std::string meta = R"({"step": 100, "stage": 2, "world": )" + std::to_string(world) + "}";
  save(dir.path, "step100", comm(), mine.request(params, meta));

  CHECK(latest(dir.path) == "step100");
  const Loaded l = load_pieces(dir.path, "step100", params, slicing(params, 3, rank % 3));
  CHECK(l.result.saved_world_size == world);
  CHECK(l.result.metadata == R"({"step":100,"stage":2,"world":)" + std::to_string(world) + "}");
  for (size_t a = 0; a < 3; ++a)
    CHECK(l.values[a] == values_for(slicing(params, 3, rank % 3), static_cast<int>(a)));
  check_load(dir.path, "step100", params, dealt(params, world + 1, rank, 6));
  check_load(dir.path, "step100", params, slicing(params, 1, 0));
  const Info info = read_info(dir.path, "step100");
  CHECK(info.world_size == world);
  CHECK(info.arrays == array_names());
}

TEST_CASE("checkpoint: a stage-0-style save (rank 0 owns all) reloads sliced; overwrite") {
  SharedDir dir;
  const auto params = model_params();
  const int rank = comm().rank(), world = comm().size();
  const Request mine(rank == 0 ? slicing(params, 1, 0) : std::vector<Piece>{});
  save(dir.path, "s0", comm(), mine.request(params));
  check_load(dir.path, "s0", params, slicing(params, world, rank));
  check_load(dir.path, "s0", params, slicing(params, 3, rank % 3));

  // The same tag saved again, sliced, with other values: the new one replaces it on every rank.
  const Request again(dealt(params, world, rank, 10), 100.0f);
  save(dir.path, "s0", comm(), again.request(params));
  check_load(dir.path, "s0", params, slicing(params, 3, rank % 3), 100.0f);
  CHECK(read_info(dir.path, "s0").world_size == world);
  CHECK(latest(dir.path) == "s0");
}

TEST_CASE("checkpoint: a rank at fault fails save() on every rank, naming it") {
  SharedDir dir;
  const int rank = comm().rank(), world = comm().size(), last = world - 1;
  const auto params = model_params();
  const Request mine(slicing(params, world, rank));

  // The last rank's model is wider (with one rank: its request has a piece outside its
  // parameter instead, the one fault a single rank can have).
  if (world > 1) {
    const auto other = model_params(3, 8);
    const Request wide(slicing(other, world, rank));
    const SaveRequest req = rank == last ? wide.request(other) : mine.request(params);
    CHECK_THROWS_WITH(
        save(dir.path, "bad", comm(), req),
        ContainsSubstring("rank " + std::to_string(last) + " passed another parameter table") &&
            ContainsSubstring("first rank that differs"));
  }
  // An invalid request on the last rank: it says what is wrong, the others name it.
  const Request broken(std::vector<Piece>{{0, 440, 10}});
  const SaveRequest req = rank == last ? broken.request(params) : mine.request(params);
  if (rank == last)
    CHECK_THROWS_WITH(save(dir.path, "bad", comm(), req),
                      ContainsSubstring("this rank's request is invalid") &&
                          ContainsSubstring("lies outside parameter 'wte'"));
  else
    CHECK_THROWS_WITH(save(dir.path, "bad", comm(), req),
                      ContainsSubstring("rank " + std::to_string(last) + "'s request is invalid"));
  CHECK_FALSE(std::filesystem::exists(dir / "bad"));
  CHECK_FALSE(latest(dir.path).has_value());

  // Metadata that is not JSON (only rank 0's is stored, so only rank 0's is checked).
  const SaveRequest no_json = mine.request(params, rank == 0 ? "step=1" : "{}");
  CHECK_THROWS_WITH(
      save(dir.path, "bad", comm(), no_json),
      ContainsSubstring(rank == 0 ? "metadata is not JSON" : "rank 0's request is invalid"));

  // The ranks are still in step: a good save works.
  save(dir.path, "good", comm(), mine.request(params));
  check_load(dir.path, "good", params, slicing(params, 2, rank % 2));
}

TEST_CASE("checkpoint: tensor-parallel shards saved collectively re-slice to other degrees") {
  // The world as a data x tensor grid (tensor fastest): degree 2 when there are 2 or 4 ranks.
  // Every rank passes the same whole-shape table (param_table of its own shard specs), which
  // save() checks by hash; non-sliced parameters are saved by tensor rank 0 only.
  SharedDir dir;
  const int rank = comm().rank(), world = comm().size();
  const int degree = world >= 2 ? 2 : 1, data = world / degree;
  Model shard;
  shard.params = shard_specs(rank % degree, degree);
  const std::vector<ParamInfo> params = param_table(shard);
  const GridRank mine = grid_rank(rank % degree, degree, rank / degree, data, true);
  std::vector<ConstArray> arrays;
  for (size_t a = 0; a < array_names().size(); ++a)
    arrays.push_back({array_names()[a], mine.values[a].data()});
  save(dir.path, "tp", comm(), {params, mine.pieces, arrays, "{}", 7});

  // Each rank loads its own part at degree 4 (data 1) and at degree 1 (data = world): other
  // tensor degrees, other ZeRO partitions.
  using Place = std::array<int, 4>;  // tensor rank, degree, data rank, data size
  for (const auto& [t, deg, d, D] : {Place{rank % 4, 4, 0, 1}, Place{0, 1, rank, world},
                                     Place{rank % degree, degree, rank / degree, data}}) {
    INFO("tensor rank " << t << " of " << deg << ", data rank " << d << " of " << D);
    const GridRank want = grid_rank(t, deg, d, D, false);
    const Loaded l = load_pieces(dir.path, "tp", params, want.pieces);
    CHECK(l.result.saved_world_size == world);
    for (size_t a = 0; a < array_names().size(); ++a) REQUIRE(l.values[a] == want.values[a]);
  }
}
