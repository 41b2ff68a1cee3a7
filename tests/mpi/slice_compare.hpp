// The comparison the tensor-slicing tests share (tensor_equivalence_test on cpu, cuda_tensor_test
// on NCCL): a rank's parameters, each a slice of a whole parameter (ParamSpec::slice), against
// the whole model's parameters trained elsewhere, as one relative L2 difference. Test-only.
//
// Contract: got[i] holds specs[i].numel() values, the slice of whole parameter to_original[i]
// (to_original empty: i itself, a model without pipeline stages) described by specs[i]; element k
// of it is element param_slice_element(specs[i], k) of that whole parameter. Returns
// ||got - whole|| / ||whole|| over every element a rank holds, leaving out the key biases
// (the k block [C, 2C) of attn.c_attn.bias, C = n_embd): their exact gradient is zero (softmax
// is invariant to adding a constant to every score of a row), so they hold only rounding noise
// that Adam amplifies, different for any two summation orders.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/unit.hpp"

namespace zero::test {

struct SliceDiff {
  double num = 0;  // sum of squared differences
  double den = 0;  // sum of squared whole values
  double relative() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

// One parameter's slice against its whole parameter (the key-bias block left out).
inline SliceDiff slice_diff(const std::vector<float>& got, const ParamSpec& spec, const std::vector<float>& whole,
                            int64_t n_embd) {
  REQUIRE(static_cast<int64_t>(got.size()) == spec.numel());
  const bool key_bias = spec.name.ends_with("attn.c_attn.bias");
  SliceDiff d;
  int64_t outside = 0;  // slice elements that map past the whole parameter (one REQUIRE below)
  for (int64_t k = 0; k < spec.numel(); ++k) {
    const int64_t w = param_slice_element(spec, k);
    if (w < 0 || w >= static_cast<int64_t>(whole.size())) {
      ++outside;
      continue;
    }
    if (key_bias && w >= n_embd && w < 2 * n_embd) continue;
    const double b = whole[static_cast<size_t>(w)];
    const double e = double(got[static_cast<size_t>(k)]) - b;
    d.num += e * e;
    d.den += b * b;
  }
  INFO(spec.name);
  REQUIRE(outside == 0);
  return d;
}

// Every parameter of a rank against the whole model (see the header comment).
inline double sliced_rel_l2(const std::vector<std::vector<float>>& got, const std::vector<ParamSpec>& specs,
                            const std::vector<int>& to_original, const std::vector<std::vector<float>>& whole,
                            int64_t n_embd) {
  REQUIRE(got.size() == specs.size());
  REQUIRE((to_original.empty() || to_original.size() == got.size()));
  SliceDiff sum;
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t w = to_original.empty() ? i : static_cast<size_t>(to_original[i]);
    REQUIRE(w < whole.size());
    const SliceDiff d = slice_diff(got[i], specs[i], whole[w], n_embd);
    sum.num += d.num;
    sum.den += d.den;
  }
  return sum.relative();
}

}  // namespace zero::test
