// The cut of a model's Units into pipeline stages, and the parameters that then live on more
// than one stage. Pure functions of numbers (and of a Model's parameter table and param_ids):
// no devices, no communication; thread-safe.
//
// A cut keeps Unit order: stage s holds the consecutive Units [bounds[s], bounds[s+1]), every
// stage at least one. So the first Unit (a GPT's embedding) is always on stage 0 and the last
// (its head) on stage p-1, whatever the method. p = U (one Unit per stage) is allowed; p > U is
// refused (a stage with nothing to run has no place in the schedule).
//
// Methods (docs/pipeline.md, "Stages"):
//   uniform     balanced Unit counts: stage s gets floor(U/p) Units, plus one when s < U mod p
//               (the first U mod p stages take the remainder: DeepSpeed's partition_uniform)
//   parameters  the contiguous cut minimising the largest stage's parameter count (DeepSpeed's
//               "parameters"); a Unit's count includes every parameter it uses, so a tied
//               parameter counts on each Unit, hence each stage, that uses it (a stage keeps its
//               own copy of it)
//   flops       the same minimax over per-Unit forward + backward FLOPs (ours; for a GPT,
//               models/gpt_flops.hpp)
// The balanced methods are exact (a binary search on the bound with a greedy feasibility test,
// integer costs) and deterministic: among the cuts with the smallest largest stage, the most
// even one (smallest sum of squared stage costs), and among those the one that fills earlier
// stages first (the direction uniform gives its remainder). Equal costs give uniform's cut.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/unit.hpp"

namespace zero::pipeline {

enum class PartitionMethod : uint8_t { uniform, parameters, flops };

inline constexpr std::array<std::string_view, 3> kPartitionMethodNames{"uniform", "parameters",
                                                                        "flops"};

std::string_view method_name(PartitionMethod method) noexcept;

// "uniform", "parameters" or "flops", in any case (DeepSpeed lower-cases its partition_method).
// Anything else throws zero::Error naming `where` (e.g. "ds_config.json: zero_train.parallel.
// partition"), the text and the known methods.
PartitionMethod parse_partition_method(std::string_view text, std::string_view where);

// Stage s holds Units [bounds[s], bounds[s+1]); bounds.front() == 0, bounds.back() == U, strictly
// increasing.
struct StageCut {
  std::vector<int> bounds;

  int stages() const noexcept { return static_cast<int>(bounds.size()) - 1; }
  int units() const noexcept { return bounds.empty() ? 0 : bounds.back(); }
  int begin(int stage) const { return bounds.at(static_cast<size_t>(stage)); }
  int end(int stage) const { return bounds.at(static_cast<size_t>(stage) + 1); }
  int size(int stage) const { return end(stage) - begin(stage); }
  // The stage holding `unit` (0 <= unit < units(); throws zero::Error otherwise).
  int stage_of(int unit) const;

  friend bool operator==(const StageCut&, const StageCut&) = default;
};

// Throws zero::Error unless 1 <= stages <= units; the message names both numbers.
void check_stage_count(int units, int stages);

// Balanced Unit counts (see the top of this file for where the remainder goes).
StageCut cut_uniform(int units, int stages);

// The contiguous cut of costs.size() Units into `stages` stages whose largest stage cost (the sum
// of its Units' costs) is the smallest possible (ties broken as above). Costs must be >= 0 and
// their sum must fit int64. O(stages x units^2) time.
StageCut cut_balanced(std::span<const int64_t> costs, int stages);

// Each stage's cost (the sum of its Units' costs); costs.size() must equal cut.units().
std::vector<int64_t> stage_costs(const StageCut& cut, std::span<const int64_t> costs);

// The per-Unit costs the balanced methods read. `flops` may be empty for a model without a FLOPs
// count (the MLP): asking for the flops method then is an error saying so.
struct UnitCosts {
  std::vector<int64_t> parameters;  // unit_parameter_counts(model)
  std::vector<int64_t> flops;       // e.g. models::gpt_unit_flops(shape, T)[u].total()
};

// One cut by `method` (uniform reads only the Unit count, parameters.size()).
StageCut cut_stages(PartitionMethod method, const UnitCosts& costs, int stages);

// Elements of the parameters each Unit uses (its param_ids), in Unit order: a parameter used by
// two Units (the tied wte) counts in both.
std::vector<int64_t> unit_parameter_counts(const Model& model);

// A parameter used by Units on more than one stage (a GPT's wte: the embedding on stage 0, the
// head on stage p-1). Each of `stages` keeps a copy; after backward their gradients are summed
// across those stages, so every copy steps with the same gradient (DeepSpeed's tied layers).
struct TiedParameter {
  int param = -1;           // index into Model::params
  std::vector<int> stages;  // ascending, distinct, at least two
  friend bool operator==(const TiedParameter&, const TiedParameter&) = default;
};

// Every parameter used on more than one stage, by ascending parameter index. unit_param_ids[u]
// is Unit u's param_ids(); its size must equal cut.units(), and every index must be in
// [0, num_params).
std::vector<TiedParameter> tied_parameters(std::span<const std::vector<int>> unit_param_ids,
                                           int num_params, const StageCut& cut);
std::vector<TiedParameter> tied_parameters(const Model& model, const StageCut& cut);

}  // namespace zero::pipeline
