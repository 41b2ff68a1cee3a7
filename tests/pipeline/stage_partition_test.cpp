// The cut of a model's Units into pipeline stages: every method on every small (U, p) gives
// consecutive non-empty stages covering the Units in order; the balanced methods match a brute
// force over all cuts; uniform gives its remainder to the first stages (DeepSpeed's rule); bad
// depths and method names are clear errors; a GPT's tied wte is found on the first and last stage.
#include "runtime/pipeline/stage_partition.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "core/device.hpp"
#include "core/error.hpp"
#include "models/gpt.hpp"
#include "models/gpt_flops.hpp"
#include "models/ops.hpp"

using namespace zero;
using namespace zero::pipeline;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr int kUnitCounts[] = {1, 2, 3, 5, 8, 14};

// Stages consecutive, non-empty, covering [0, U) in order; stage_of agrees with the bounds.
void check_valid(const StageCut& cut, int units, int stages) {
  REQUIRE(cut.stages() == stages);
  REQUIRE(cut.units() == units);
  REQUIRE(cut.bounds.front() == 0);
  for (int s = 0; s < stages; ++s) {
    REQUIRE(cut.size(s) >= 1);
    for (int u = cut.begin(s); u < cut.end(s); ++u) REQUIRE(cut.stage_of(u) == s);
  }
  REQUIRE(cut.stage_of(0) == 0);
  REQUIRE(cut.stage_of(units - 1) == stages - 1);
}

// Over every cut of costs into `stages` non-empty consecutive stages (C(U-1, p-1) cuts: at most
// 1716 for U = 14): the smallest largest-stage cost, and the smallest sum of squared stage costs
// among the cuts that reach it.
struct Optimum {
  int64_t largest = std::numeric_limits<int64_t>::max();
  int64_t sum_squares = std::numeric_limits<int64_t>::max();
};

Optimum brute_force(const std::vector<int64_t>& costs, int stages) {
  const int units = static_cast<int>(costs.size());
  Optimum best;
  std::vector<int64_t> loads;
  std::function<void(int)> go = [&](int start) {
    const int left = stages - static_cast<int>(loads.size());
    const int last_end = left == 1 ? units : units - (left - 1);
    int64_t load = 0;
    for (int end = start + 1; end <= last_end; ++end) {
      load += costs[static_cast<size_t>(end - 1)];
      if (left > 1) {
        loads.push_back(load);
        go(end);
        loads.pop_back();
      } else if (end == units) {
        int64_t worst = load, squares = load * load;
        for (int64_t l : loads) worst = std::max(worst, l), squares += l * l;
        if (worst < best.largest || (worst == best.largest && squares < best.sum_squares))
          best = {worst, squares};
      }
    }
  };
  go(0);
  return best;
}

int64_t brute_force_minimax(const std::vector<int64_t>& costs, int stages) {
  return brute_force(costs, stages).largest;
}

int64_t sum_squares(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x * x;
  return s;
}

int64_t largest(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

// Cost vectors that stress the balance: random, random with a few heavy Units (a GPT's embedding
// and head next to its blocks), all equal, all zero, and one Unit holding everything.
std::vector<std::vector<int64_t>> cost_cases(int units, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < 3; ++r) {
    std::vector<int64_t> c(static_cast<size_t>(units));
    for (auto& x : c) x = static_cast<int64_t>(rng() % 100);
    out.push_back(c);
    for (auto& x : c)
      if (rng() % 4 == 0) x *= 50;
    out.push_back(c);
  }
  out.emplace_back(static_cast<size_t>(units), 7);
  out.emplace_back(static_cast<size_t>(units), 0);
  std::vector<int64_t> one(static_cast<size_t>(units), 0);
  one[static_cast<size_t>(units / 2)] = 1000;
  out.push_back(one);
  return out;
}

struct GptFixture {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_ops(*device, *stream);

  Model gpt(models::GptShape shape) {
    return models::make_gpt({shape, ScalarType::f32, ScalarType::f32}, *ops);
  }
};

UnitCosts gpt_costs(const Model& m, const models::GptShape& shape) {
  UnitCosts costs{.parameters = unit_parameter_counts(m), .flops = {}};
  for (const auto& f : models::gpt_unit_flops(shape, shape.seq_len)) costs.flops.push_back(f.total());
  return costs;
}

}  // namespace

TEST_CASE("stage partition: every method gives consecutive non-empty stages covering the Units") {
  for (int units : kUnitCounts)
    for (int stages = 1; stages <= units; ++stages)
      for (const auto& c : cost_cases(units, static_cast<uint32_t>(units * 31 + stages))) {
        INFO("U = " << units << ", p = " << stages);
        const UnitCosts costs{.parameters = c, .flops = c};
        for (PartitionMethod m :
             {PartitionMethod::uniform, PartitionMethod::parameters, PartitionMethod::flops}) {
          INFO("method " << method_name(m));
          check_valid(cut_stages(m, costs, stages), units, stages);
        }
      }
}

TEST_CASE("stage partition: parameters and flops minimise the largest stage, then spread (brute force)") {
  for (int units : kUnitCounts)
    for (int stages = 1; stages <= units; ++stages)
      for (const auto& c : cost_cases(units, static_cast<uint32_t>(units * 131 + stages))) {
        INFO("U = " << units << ", p = " << stages);
        const Optimum optimum = brute_force(c, stages);
        // The two methods read different vectors: give each the case, the other a decoy, so a
        // method reading the wrong one shows.
        std::vector<int64_t> decoy(c.rbegin(), c.rend());
        decoy[0] += 1000;
        const StageCut by_params = cut_stages(PartitionMethod::parameters, {c, decoy}, stages);
        const StageCut by_flops = cut_stages(PartitionMethod::flops, {decoy, c}, stages);
        CHECK(largest(stage_costs(by_params, c)) == optimum.largest);
        CHECK(largest(stage_costs(by_flops, c)) == optimum.largest);
        // Among the optimal cuts, the most even (the documented tie-break).
        CHECK(sum_squares(stage_costs(by_params, c)) == optimum.sum_squares);
        CHECK(sum_squares(stage_costs(by_flops, c)) == optimum.sum_squares);
      }
}

TEST_CASE("stage partition: balanced cuts fill earlier stages first among the most even") {
  // Equal costs: the same cut as uniform (remainder on the first stages), not merely one with
  // the same largest stage (4 + 4 + 4 + 2 would have that too).
  const std::vector<int64_t> equal(14, 3);
  for (int stages = 1; stages <= 14; ++stages)
    CHECK(cut_balanced(equal, stages) == cut_uniform(14, stages));
  // A heavy first Unit gets a stage of its own; the rest are spread evenly behind it (1 + 5 would
  // have the same largest stage).
  const std::vector<int64_t> heavy_first{10, 1, 1, 1, 1, 1, 1};
  CHECK(cut_balanced(heavy_first, 3).bounds == std::vector<int>{0, 1, 4, 7});
  CHECK(cut_balanced(heavy_first, 2).bounds == std::vector<int>{0, 1, 7});
  // Where DeepSpeed's current balancer (least max - min spread) cuts 29 + 29 + 38, the minimax
  // is 37 (docs/pipeline.md, "Stages").
  const std::vector<int64_t> spread_trap{9, 20, 8, 1, 20, 13, 11, 14};
  CHECK(largest(stage_costs(cut_balanced(spread_trap, 3), spread_trap)) == 37);
}

TEST_CASE("stage partition: uniform gives floor(U/p) Units, one more to the first U mod p stages") {
  for (int units : kUnitCounts)
    for (int stages = 1; stages <= units; ++stages) {
      const StageCut cut = cut_uniform(units, stages);
      for (int s = 0; s < stages; ++s)
        CHECK(cut.size(s) == units / stages + (s < units % stages ? 1 : 0));
    }
  // DeepSpeed's partition_uniform(14, 4) = [0, 4, 8, 11, 14] and (8, 3) = [0, 3, 6, 8].
  CHECK(cut_uniform(14, 4).bounds == std::vector<int>{0, 4, 8, 11, 14});
  CHECK(cut_uniform(8, 3).bounds == std::vector<int>{0, 3, 6, 8});
  CHECK(cut_uniform(5, 5).bounds == std::vector<int>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("stage partition: more stages than Units, or none, is refused naming both numbers") {
  CHECK_THROWS_WITH(cut_uniform(4, 5), ContainsSubstring("5 stages for a model of 4 Units") &&
                                           ContainsSubstring("at most 4"));
  const std::vector<int64_t> c{1, 2, 3};
  CHECK_THROWS_WITH(cut_balanced(c, 4), ContainsSubstring("4 stages for a model of 3 Units"));
  CHECK_THROWS_WITH(cut_stages(PartitionMethod::flops, {c, c}, 9),
                    ContainsSubstring("9 stages for a model of 3 Units"));
  CHECK_THROWS_WITH(cut_uniform(4, 0), ContainsSubstring("at least 1"));
  CHECK_THROWS_WITH(cut_balanced(std::vector<int64_t>{1, -2}, 1), ContainsSubstring(">= 0"));
  CHECK_THROWS_WITH(cut_stages(PartitionMethod::flops, {c, {}}, 2),
                    ContainsSubstring("no per-Unit FLOPs"));
  CHECK_NOTHROW(cut_stages(PartitionMethod::parameters, {c, {}}, 2));
}

TEST_CASE("stage partition: method names parse in any case; unknown ones list the known") {
  CHECK(parse_partition_method("uniform", "x") == PartitionMethod::uniform);
  CHECK(parse_partition_method("Parameters", "x") == PartitionMethod::parameters);
  CHECK(parse_partition_method("FLOPS", "x") == PartitionMethod::flops);
  for (PartitionMethod m :
       {PartitionMethod::uniform, PartitionMethod::parameters, PartitionMethod::flops})
    CHECK(parse_partition_method(method_name(m), "x") == m);
  CHECK_THROWS_WITH(parse_partition_method("type:transformer", "ds_config.json: pipeline.partition"),
                    ContainsSubstring("ds_config.json: pipeline.partition") &&
                        ContainsSubstring("\"type:transformer\"") &&
                        ContainsSubstring("\"uniform\", \"parameters\", \"flops\""));
  CHECK_THROWS_AS(parse_partition_method("", "x"), Error);
}

TEST_CASE("stage partition: a GPT's tied wte is held by the first and the last stage") {
  GptFixture f;
  const models::GptShape tiny = *models::gpt_preset("tiny");  // 2 blocks: 4 Units
  const Model m = f.gpt(tiny);
  REQUIRE(m.units.size() == 4);
  REQUIRE(m.params[0].name == "wte.weight");
  const UnitCosts costs = gpt_costs(m, tiny);

  for (PartitionMethod method :
       {PartitionMethod::uniform, PartitionMethod::parameters, PartitionMethod::flops}) {
    INFO("method " << method_name(method));
    CHECK(tied_parameters(m, cut_stages(method, costs, 1)).empty());
    for (int stages : {2, 3, 4}) {  // 3 does not divide the 4 Units
      INFO("p = " << stages);
      const StageCut cut = cut_stages(method, costs, stages);
      check_valid(cut, 4, stages);
      const auto tied = tied_parameters(m, cut);
      REQUIRE(tied.size() == 1);
      CHECK(tied[0].param == 0);
      CHECK(tied[0].stages == std::vector<int>{0, stages - 1});
    }
  }
}

TEST_CASE("stage partition: a GPT of 7 Units on 2 and 4 stages, tied wte counted on both ends") {
  GptFixture f;
  models::GptShape shape = *models::gpt_preset("tiny");
  shape.n_layer = 5;  // 7 Units: divides by neither 2 nor 4
  const Model m = f.gpt(shape);
  REQUIRE(m.units.size() == 7);
  const UnitCosts costs = gpt_costs(m, shape);

  // The head's count includes wte (V C) besides ln_f (2 C): each stage holding wte keeps a copy.
  const int64_t C = shape.n_embd, V = shape.vocab_size, T = shape.seq_len;
  CHECK(costs.parameters.front() == V * C + T * C);
  CHECK(costs.parameters.back() == V * C + 2 * C);
  CHECK(costs.parameters[1] == 12 * C * C + 13 * C);

  for (int stages : {2, 4})
    for (PartitionMethod method :
         {PartitionMethod::uniform, PartitionMethod::parameters, PartitionMethod::flops}) {
      INFO("p = " << stages << ", method " << method_name(method));
      const StageCut cut = cut_stages(method, costs, stages);
      check_valid(cut, 7, stages);
      const auto tied = tied_parameters(m, cut);
      REQUIRE(tied.size() == 1);
      CHECK(tied[0].param == 0);
      CHECK(tied[0].stages == std::vector<int>{0, stages - 1});
      if (method != PartitionMethod::uniform) {
        const auto& c = method == PartitionMethod::parameters ? costs.parameters : costs.flops;
        CHECK(largest(stage_costs(cut, c)) == brute_force_minimax(c, stages));
      }
    }
  // Uniform on 7 Units: 4 + 3 and 2 + 2 + 2 + 1.
  CHECK(cut_stages(PartitionMethod::uniform, costs, 2).bounds == std::vector<int>{0, 4, 7});
  CHECK(cut_stages(PartitionMethod::uniform, costs, 4).bounds == std::vector<int>{0, 2, 4, 6, 7});
}

TEST_CASE("stage partition: tied parameters across several stages, in stage order") {
  // Parameter 1 is used by Units 0, 2 and 4, parameter 2 by Units 1 and 2 only, parameter 3 by
  // Unit 3 twice (a Unit naming a parameter twice does not make it tied).
  const std::vector<std::vector<int>> ids{{0, 1}, {2}, {1, 2}, {3, 3}, {1}};
  const StageCut three{{0, 2, 4, 5}};  // stages {0,1} {2,3} {4}
  const auto tied = tied_parameters(ids, 4, three);
  REQUIRE(tied.size() == 2);
  CHECK(tied[0] == TiedParameter{1, {0, 1, 2}});
  CHECK(tied[1] == TiedParameter{2, {0, 1}});
  CHECK(tied_parameters(ids, 4, StageCut{{0, 5}}).empty());
  CHECK_THROWS_WITH(tied_parameters(ids, 3, three), ContainsSubstring("names parameter 3 of 3"));
  CHECK_THROWS_WITH(tied_parameters(ids, 4, StageCut{{0, 2, 4}}),
                    ContainsSubstring("5 Units for a cut of 4 Units"));
}
