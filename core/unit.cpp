#include "core/unit.hpp"

#include "core/random.hpp"

#include <algorithm>

namespace zero {

void init_param_values(const ParamSpec& spec, uint64_t seed, int64_t begin, int64_t count,
                       float* out) {
  ZERO_REQUIRE(begin >= 0 && count >= 0 && begin + count <= spec.numel(),
               "init_param_values: elements [" + std::to_string(begin) + ", " +
                   std::to_string(begin + count) + ") are outside parameter " + spec.name +
                   " of " + std::to_string(spec.numel()) + " elements");
  switch (spec.init) {
    case ParamInit::zeros: std::fill(out, out + count, 0.0f); return;
    case ParamInit::ones: std::fill(out, out + count, 1.0f); return;
    case ParamInit::normal: break;
  }
  // The key depends on the name, not on the parameter's position in the table, so adding a
  // parameter elsewhere does not change this one's values.
  const uint64_t key = hash_counters(seed, hash_string(spec.name));
  for (int64_t i = 0; i < count; ++i)
    out[i] = counter_normal(key, static_cast<uint64_t>(begin + i)) * spec.init_std;
}

int64_t Model::parameter_count() const noexcept {
  int64_t n = 0;
  for (const ParamSpec& p : params) n += p.numel();
  return n;
}

std::vector<int> Model::last_gradient_unit() const {
  std::vector<int> last(params.size(), -1);
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u)
    for (int id : units[static_cast<size_t>(u)]->param_ids()) {
      ZERO_REQUIRE(id >= 0 && static_cast<size_t>(id) < params.size(),
                   "model " + name + ": unit " + units[static_cast<size_t>(u)]->name() +
                       " names parameter " + std::to_string(id) + " of " +
                       std::to_string(params.size()));
      last[static_cast<size_t>(id)] = u;
    }
  return last;
}

std::vector<bool> checkpoint_plan(const Model& model, std::optional<long long> number_checkpoints) {
  std::vector<bool> plan(model.units.size(), false);
  std::vector<size_t> candidates;
  for (size_t u = 0; u < model.units.size(); ++u)
    if (model.units[u]->checkpointable()) candidates.push_back(u);
  const long long m = static_cast<long long>(candidates.size());
  const long long k = std::min(number_checkpoints.value_or(0), m);
  if (k <= 0) return plan;
  // Candidate j is chosen when floor((j+1)k/m) steps up: exactly k of them, evenly spaced.
  for (long long j = 0; j < m; ++j)
    if ((j + 1) * k / m > j * k / m) plan[candidates[static_cast<size_t>(j)]] = true;
  return plan;
}

}  // namespace zero
