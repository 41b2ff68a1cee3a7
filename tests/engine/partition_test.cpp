// The partitioner's layout: alignment, equal shards, pieces that tile every parameter exactly
// once across ranks, tied parameters in their first user's group.
#include "runtime/engine/partition.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "models/gpt.hpp"
#include "models/mlp.hpp"

using namespace zero;

namespace {
struct Fixture {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_ops(*device, *stream);
};

// Every element of every parameter is covered by exactly one piece of one rank, at the place the
// layout says, and pieces stay inside shards.
void check_tiling(const Model& m, const Partition& p) {
  for (size_t i = 0; i < m.params.size(); ++i) {
    std::vector<int> hits(static_cast<size_t>(m.params[i].numel()), 0);
    const Partition::Location& loc = p.location(static_cast<int>(i));
    CHECK(loc.offset % Partition::kAlignElems == 0);
    for (int r = 0; r < p.world_size(); ++r)
      for (const Partition::Piece& pc : p.pieces(r, loc.group)) {
        if (pc.param != static_cast<int>(i)) continue;
        CHECK(pc.shard_offset + pc.count <= p.group(loc.group).shard_numel);
        // flat position agrees both ways
        CHECK(p.shard_begin(loc.group, r) + pc.shard_offset == loc.offset + pc.param_offset);
        for (int64_t e = 0; e < pc.count; ++e) ++hits[static_cast<size_t>(pc.param_offset + e)];
      }
    for (int h : hits) REQUIRE(h == 1);
  }
}
}  // namespace

TEST_CASE("partition: GPT groups per Unit, aligned equal shards, exact tiling at 1-4 ranks") {
  Fixture f;
  // A shape whose sizes divide by nothing convenient: C = 36, V = 37, T = 13.
  Model m = models::make_gpt({{3, 36, 4, 37, 13}, ScalarType::f32, ScalarType::f32}, *f.ops);
  for (int world : {1, 2, 3, 4}) {
    const Partition p(m, world);
    CHECK(p.group_count() == static_cast<int>(m.units.size()));
    CHECK(p.parameter_numel() == m.parameter_count());
    int64_t shards = 0;
    for (int g = 0; g < p.group_count(); ++g) {
      const Partition::Group& grp = p.group(g);
      CHECK(grp.padded_numel % (world * Partition::kAlignElems) == 0);
      CHECK(grp.shard_numel * world == grp.padded_numel);
      CHECK(grp.padded_numel >= grp.used_numel);
      CHECK(p.shard_concat_offset(g) == shards);
      shards += grp.shard_numel;
    }
    CHECK(shards == p.shard_numel_total());
    check_tiling(m, p);
    // wte (parameter 0) lives with the embedding; the head needs its own group and that one.
    CHECK(p.location(0).group == 0);
    const auto head = p.unit_groups(static_cast<int>(m.units.size()) - 1);
    CHECK(std::vector<int>(head.begin(), head.end()) == std::vector<int>{0, static_cast<int>(m.units.size()) - 1});
  }
  const std::string table = Partition(m, 2).describe(m);
  CHECK_THAT(table, Catch::Matchers::ContainsSubstring("h.1"));
  CHECK_THROWS_WITH(Partition(m, 0), Catch::Matchers::ContainsSubstring("world size must be >= 1"));
}

TEST_CASE("partition: a model smaller than the world still gives every rank an aligned shard") {
  Fixture f;
  Model m = models::make_mlp({{3, 5, 1, 2}, ScalarType::f32, ScalarType::f32}, *f.ops);
  const Partition p(m, 4);
  for (int g = 0; g < p.group_count(); ++g) CHECK(p.group(g).shard_numel == Partition::kAlignElems);
  check_tiling(m, p);
  // Rank 3 owns only padding of the head group: no pieces.
  CHECK(p.pieces(3, 1).empty());
}
