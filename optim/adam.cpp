#include "optim/adam.hpp"

#include <cmath>

#include "core/error.hpp"

namespace zero::optim {

AdamScalars adam_scalars(const AdamParams& p, const AdamStep& s) {
  ZERO_REQUIRE(s.step >= 1, "Adam step numbers start at 1, got " + std::to_string(s.step));
  const double t = static_cast<double>(s.step);
  const double bc1 = p.bias_correction ? 1.0 - std::pow(static_cast<double>(p.beta1), t) : 1.0;
  const double bc2 = p.bias_correction ? 1.0 - std::pow(static_cast<double>(p.beta2), t) : 1.0;
  AdamScalars a{};
  a.beta1 = p.beta1;
  a.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(p.beta1));
  a.beta2 = p.beta2;
  a.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(p.beta2));
  a.eps = p.eps;
  a.step_size = static_cast<float>(static_cast<double>(s.lr) / bc1);
  a.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  a.decay = p.adam_w_mode ? static_cast<float>(static_cast<double>(s.lr) * p.weight_decay) : 0.0f;
  a.l2 = p.adam_w_mode ? 0.0f : p.weight_decay;
  a.grad_scale = s.grad_scale;
  return a;
}

}  // namespace zero::optim
