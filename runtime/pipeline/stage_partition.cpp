#include "runtime/pipeline/stage_partition.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/error.hpp"

namespace zero::pipeline {

namespace {

// Sums of squared stage costs: up to stages x (2^63)^2 in principle; 128 bits hold any real one.
__extension__ typedef unsigned __int128 Wide;

std::string known_methods() {
  std::string list;
  for (size_t i = 0; i < kPartitionMethodNames.size(); ++i)
    list += (i ? ", \"" : "\"") + std::string(kPartitionMethodNames[i]) + "\"";
  return list;
}

bool same_ignoring_case(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The fewest stages a greedy left-to-right fill needs when no stage may exceed `bound` (every
// single cost <= bound). Greedy is optimal here: closing a stage later never leaves more work.
int stages_needed(std::span<const int64_t> costs, int64_t bound) {
  int stages = 1;
  int64_t load = 0;
  for (int64_t c : costs) {
    if (load + c > bound) {
      ++stages;
      load = 0;
    }
    load += c;
  }
  return stages;
}

}  // namespace

std::string_view method_name(PartitionMethod method) noexcept {
  return kPartitionMethodNames[static_cast<size_t>(method)];
}

PartitionMethod parse_partition_method(std::string_view text, std::string_view where) {
  for (size_t i = 0; i < kPartitionMethodNames.size(); ++i)
    if (same_ignoring_case(text, kPartitionMethodNames[i])) return static_cast<PartitionMethod>(i);
  ZERO_FAIL(std::string(where) + ": unknown pipeline partition method \"" + std::string(text) +
            "\"; expected one of " + known_methods() + " (any case)");
}

int StageCut::stage_of(int unit) const {
  ZERO_REQUIRE(unit >= 0 && unit < units(),
               "StageCut::stage_of: Unit " + std::to_string(unit) + " is not in [0, " +
                   std::to_string(units()) + ")");
  // The last bound <= unit starts its stage.
  const auto it = std::upper_bound(bounds.begin(), bounds.end(), unit);
  return static_cast<int>(it - bounds.begin()) - 1;
}

void check_stage_count(int units, int stages) {
  ZERO_REQUIRE(units >= 1, "pipeline partition: the model has " + std::to_string(units) +
                               " Units; there is nothing to cut into stages");
  ZERO_REQUIRE(stages >= 1, "pipeline partition: " + std::to_string(stages) +
                                " stages asked for; the pipeline depth must be at least 1");
  ZERO_REQUIRE(stages <= units,
               "pipeline partition: " + std::to_string(stages) + " stages for a model of " +
                   std::to_string(units) + " Units; every stage needs at least one Unit, so "
                   "use a pipeline depth of at most " + std::to_string(units));
}

StageCut cut_uniform(int units, int stages) {
  check_stage_count(units, stages);
  const int base = units / stages, extra = units % stages;
  StageCut cut;
  cut.bounds.resize(static_cast<size_t>(stages) + 1);
  cut.bounds[0] = 0;
  for (int s = 0; s < stages; ++s)
    cut.bounds[static_cast<size_t>(s) + 1] = cut.bounds[static_cast<size_t>(s)] + base + (s < extra ? 1 : 0);
  return cut;
}

StageCut cut_balanced(std::span<const int64_t> costs, int stages) {
  const int units = static_cast<int>(costs.size());
  check_stage_count(units, stages);
  int64_t largest = 0, total = 0;
  for (int u = 0; u < units; ++u) {
    const int64_t c = costs[static_cast<size_t>(u)];
    ZERO_REQUIRE(c >= 0, "pipeline partition: Unit " + std::to_string(u) + " has cost " +
                             std::to_string(c) + "; costs must be >= 0");
    ZERO_REQUIRE(!__builtin_add_overflow(total, c, &total),
                 "pipeline partition: the Units' costs overflow a 64-bit sum");
    largest = std::max(largest, c);
  }

  // The smallest bound B with a cut into at most `stages` stages of cost <= B. The answer lies
  // in [largest, total]; feasibility is monotone in B, so bisect.
  int64_t lo = largest, hi = total;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (stages_needed(costs, mid) <= stages)
      hi = mid;
    else
      lo = mid + 1;
  }
  const int64_t bound = lo;

  // Among the cuts within the bound, the most even: the smallest sum of squared stage costs,
  // by dynamic programming over (stages used, Units covered). Ties go to the larger previous
  // boundary, i.e. shorter later stages: earlier stages are filled first, as uniform does.
  // O(stages x units^2): microseconds for the few hundred Units a model has.
  std::vector<int64_t> prefix(static_cast<size_t>(units) + 1, 0);
  for (int u = 0; u < units; ++u)
    prefix[static_cast<size_t>(u) + 1] = prefix[static_cast<size_t>(u)] + costs[static_cast<size_t>(u)];
  const Wide inf = ~Wide{0};
  const size_t width = static_cast<size_t>(units) + 1;
  // best[j * width + i]: the smallest sum of squares of j stages covering Units [0, i).
  std::vector<Wide> best(static_cast<size_t>(stages + 1) * width, inf);
  std::vector<int> from(best.size(), -1);
  best[0] = 0;
  for (int j = 1; j <= stages; ++j)
    for (int i = j; i <= units - (stages - j); ++i)
      for (int k = j - 1; k < i; ++k) {
        const Wide before = best[static_cast<size_t>(j - 1) * width + static_cast<size_t>(k)];
        const int64_t load = prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(k)];
        if (before == inf || load > bound) continue;
        const Wide total_sq = before + static_cast<Wide>(load) * static_cast<Wide>(load);
        const size_t at = static_cast<size_t>(j) * width + static_cast<size_t>(i);
        if (total_sq <= best[at]) {
          best[at] = total_sq;
          from[at] = k;
        }
      }

  StageCut cut;
  cut.bounds.assign(static_cast<size_t>(stages) + 1, 0);
  int i = units;
  for (int j = stages; j >= 1; --j) {
    cut.bounds[static_cast<size_t>(j)] = i;
    i = from[static_cast<size_t>(j) * width + static_cast<size_t>(i)];
    ZERO_REQUIRE(i >= 0, "pipeline partition: no cut within the bound (an internal error)");
  }
  return cut;
}

std::vector<int64_t> stage_costs(const StageCut& cut, std::span<const int64_t> costs) {
  ZERO_REQUIRE(static_cast<int>(costs.size()) == cut.units(),
               "stage_costs: " + std::to_string(costs.size()) + " costs for a cut of " +
                   std::to_string(cut.units()) + " Units");
  std::vector<int64_t> out(static_cast<size_t>(cut.stages()), 0);
  for (int s = 0; s < cut.stages(); ++s)
    for (int u = cut.begin(s); u < cut.end(s); ++u)
      out[static_cast<size_t>(s)] += costs[static_cast<size_t>(u)];
  return out;
}

StageCut cut_stages(PartitionMethod method, const UnitCosts& costs, int stages) {
  const int units = static_cast<int>(costs.parameters.size());
  switch (method) {
    case PartitionMethod::uniform: return cut_uniform(units, stages);
    case PartitionMethod::parameters: return cut_balanced(costs.parameters, stages);
    case PartitionMethod::flops:
      ZERO_REQUIRE(!costs.flops.empty(),
                   "pipeline partition \"flops\": this model has no per-Unit FLOPs count (only "
                   "the GPT has one); use \"parameters\" or \"uniform\"");
      ZERO_REQUIRE(static_cast<int>(costs.flops.size()) == units,
                   "pipeline partition \"flops\": " + std::to_string(costs.flops.size()) +
                       " FLOPs counts for " + std::to_string(units) + " Units");
      return cut_balanced(costs.flops, stages);
  }
  ZERO_FAIL("pipeline partition: unknown method " + std::to_string(static_cast<int>(method)));
}

std::vector<int64_t> unit_parameter_counts(const Model& model) {
  std::vector<int64_t> counts;
  counts.reserve(model.units.size());
  for (const auto& unit : model.units) {
    int64_t n = 0;
    for (int id : unit->param_ids()) {
      ZERO_REQUIRE(id >= 0 && static_cast<size_t>(id) < model.params.size(),
                   "model " + model.name + ": Unit " + unit->name() + " names parameter " +
                       std::to_string(id) + " of " + std::to_string(model.params.size()));
      n += model.params[static_cast<size_t>(id)].numel();
    }
    counts.push_back(n);
  }
  return counts;
}

std::vector<TiedParameter> tied_parameters(std::span<const std::vector<int>> unit_param_ids,
                                           int num_params, const StageCut& cut) {
  ZERO_REQUIRE(static_cast<int>(unit_param_ids.size()) == cut.units(),
               "tied_parameters: param_ids of " + std::to_string(unit_param_ids.size()) +
                   " Units for a cut of " + std::to_string(cut.units()) + " Units");
  // For every parameter, the stages whose Units use it, in ascending order: Units are visited in
  // order and stages are ascending in Unit order, so a stage is new iff it differs from the last.
  std::vector<std::vector<int>> holders(static_cast<size_t>(num_params));
  for (int u = 0; u < cut.units(); ++u) {
    const int stage = cut.stage_of(u);
    for (int id : unit_param_ids[static_cast<size_t>(u)]) {
      ZERO_REQUIRE(id >= 0 && id < num_params,
                   "tied_parameters: Unit " + std::to_string(u) + " names parameter " +
                       std::to_string(id) + " of " + std::to_string(num_params));
      auto& h = holders[static_cast<size_t>(id)];
      if (h.empty() || h.back() != stage) h.push_back(stage);
    }
  }
  std::vector<TiedParameter> tied;
  for (int p = 0; p < num_params; ++p)
    if (holders[static_cast<size_t>(p)].size() > 1)
      tied.push_back({p, std::move(holders[static_cast<size_t>(p)])});
  return tied;
}

std::vector<TiedParameter> tied_parameters(const Model& model, const StageCut& cut) {
  std::vector<std::vector<int>> ids;
  ids.reserve(model.units.size());
  for (const auto& unit : model.units) {
    const auto span = unit->param_ids();
    ids.emplace_back(span.begin(), span.end());
  }
  return tied_parameters(ids, static_cast<int>(model.params.size()), cut);
}

}  // namespace zero::pipeline
