// AdamW / Adam: the update every optimizer kernel of the project implements, host and CUDA
// alike, so they agree to a stated ULP bound with one double-precision reference.
//
// For each element i of a flat range (any sub-range of the flat buffers: pass offset pointers):
//
//   g  = float(grad[i]) * grad_scale          grad upcast from fp32 / fp16 / bf16;
//                                              grad_scale = clip coefficient / loss scale
//   if !adam_w_mode:  g = g + weight_decay * p                    (Adam: L2 into the gradient)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   bc1 = 1 - beta1^t,  bc2 = 1 - beta2^t      (both 1 when !bias_correction)
//   denom = sqrt(v) / sqrt(bc2) + eps
//   if adam_w_mode:   p = p - lr * weight_decay * p                (AdamW: decoupled decay)
//   p  = p - (lr / bc1) * m / denom
//   param_copy[i] = round_to_nearest_even_16(p)      (optional: the 16-bit copy for the H2D
//                                                     copy / the next forward, same pass)
//
// This is PyTorch's and DeepSpeed's AdamW (eps added after the bias correction of sqrt(v); the
// decoupled decay applied to the parameter before the update). t is the 1-based step number.
// p, m, v are fp32 and updated in place. The per-step scalars (bias corrections, step size) are
// computed once per call in double and passed to the kernels as fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"

namespace zero::optim {

// The optimizer's hyper-parameters (config: optimizer.params).
struct AdamParams {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adam_w_mode = true;      // decoupled weight decay (AdamW); false: L2 (Adam)
  bool bias_correction = true;
};

// What changes from step to step.
struct AdamStep {
  int64_t step = 1;         // t, 1-based
  float lr = 1e-3f;         // this step's learning rate (after the schedule)
  float grad_scale = 1.0f;  // multiplies every gradient: clip coefficient / loss scale
};

// The per-step scalars every kernel uses, computed in double once per call.
struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float step_size;       // lr / bc1
  float inv_sqrt_bc2;    // 1 / sqrt(bc2)
  float decay;           // adam_w_mode: lr * weight_decay (applied as p -= decay * p); else 0
  float l2;              // !adam_w_mode: weight_decay (g += l2 * p); else 0
  float grad_scale;
};
AdamScalars adam_scalars(const AdamParams& params, const AdamStep& step);

}  // namespace zero::optim
