#include "core/unit.hpp"

#include "core/random.hpp"

#include <algorithm>
#include <string>

namespace zero {

void init_param_values(const ParamSpec& spec, uint64_t seed, int64_t begin, int64_t count,
                       float* out) {
  ZERO_REQUIRE(begin >= 0 && count >= 0 && begin + count <= spec.numel(),
               "init_param_values: elements [" + std::to_string(begin) + ", " +
                   std::to_string(begin + count) + ") are outside parameter " + spec.name +
                   " of " + std::to_string(spec.numel()) + " elements");
  check_param_slice(spec);
  switch (spec.init) {
    case ParamInit::zeros: std::fill(out, out + count, 0.0f); return;
    case ParamInit::ones: std::fill(out, out + count, 1.0f); return;
    case ParamInit::normal: break;
  }
  // The key depends on the name, not on the parameter's position in the table, so adding a
  // parameter elsewhere does not change this one's values.
  const uint64_t key = hash_counters(seed, hash_string(spec.name));
  const bool sliced = spec.slice.split == TensorSplit::sliced;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = sliced ? param_slice_element(spec, begin + i) : begin + i;
    out[i] = counter_normal(key, static_cast<uint64_t>(e)) * spec.init_std;
  }
}

void check_param_slice(const ParamSpec& spec) {
  const ParamSlice& s = spec.slice;
  if (s.split == TensorSplit::none) return;
  const std::string where = "parameter " + spec.name + " " + spec.shape.str() + ": ";
  ZERO_REQUIRE(s.degree >= 1 && s.rank >= 0 && s.rank < s.degree,
               where + "tensor rank " + std::to_string(s.rank) + " is outside degree " + std::to_string(s.degree));
  if (s.split == TensorSplit::replicated) {
    ZERO_REQUIRE(s.full == spec.shape, where + "a replicated parameter must have the whole shape " + s.full.str());
    return;
  }
  ZERO_REQUIRE(s.dim >= 0 && s.dim < s.full.rank() && s.full.rank() == spec.shape.rank() && s.blocks >= 1,
               where + "the slice's dimension " + std::to_string(s.dim) + " or blocks " +
                   std::to_string(s.blocks) + " do not fit the whole shape " + s.full.str());
  const int64_t cut = static_cast<int64_t>(s.blocks) * s.degree;
  bool fits = s.full[s.dim] % cut == 0 && spec.shape[s.dim] == s.full[s.dim] / s.degree;
  for (int d = 0; d < s.full.rank(); ++d) fits = fits && (d == s.dim || spec.shape[d] == s.full[d]);
  ZERO_REQUIRE(fits, where + "is not piece " + std::to_string(s.rank) + " of " + std::to_string(s.degree) +
                         " of " + std::to_string(s.blocks) + " block(s) of the whole shape " + s.full.str() +
                         " along dimension " + std::to_string(s.dim));
}

int64_t param_slice_element(const ParamSpec& spec, int64_t i) noexcept {
  const ParamSlice& s = spec.slice;
  if (s.split != TensorSplit::sliced) return i;
  int64_t inner = 1;  // elements per step along dim (the dimensions after it)
  for (int d = s.dim + 1; d < s.full.rank(); ++d) inner *= s.full[d];
  const int64_t part = spec.shape[s.dim];       // this rank's extent along dim
  const int64_t piece = part / s.blocks;        // its extent inside one block
  const int64_t block_len = s.full[s.dim] / s.blocks;
  const int64_t in = i % inner, j = (i / inner) % part, outer = i / (inner * part);
  const int64_t whole_j = (j / piece) * block_len + s.rank * piece + j % piece;
  return (outer * s.full[s.dim] + whole_j) * inner + in;
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
