// Gradient clipping by the global L2 norm of a gradient partitioned over ranks, and the fold of
// clipping and loss scaling into the one factor Adam multiplies every gradient by.
//
// Per optimizer step, on every rank:
//   local_sq = local_squared_norm(my_shard, dtype, n)         host, oneTBB, deterministic
//   norm     = global_grad_norm(comm, local_sq)               ONE all_reduce(sum) of a float
//   s        = prepare_step(scaler, norm, gradient_clipping)  loss-scaler update (may throw)
//   if (s.apply) { adam_step.grad_scale = s.grad_scale; run Adam on my shard; }
// The shards must partition the gradient (every element on exactly one rank; padding zero):
// then the global norm is the norm of the full gradient. With fp16 the shards hold the scaled
// gradients and `norm` is the scaled norm; prepare_step divides it by the loss scale.
//
// DeepSpeed's arithmetic (ZeRO stage 1/2/3 unscale_and_clip_grads): clip = (norm / loss_scale +
// 1e-6) / max_norm, gradients divided by loss_scale * max(clip, 1), i.e. multiplied by
//   grad_scale = clip_coefficient(norm / loss_scale, max_norm) / loss_scale,
//   clip_coefficient(n, m) = min(1, m / (n + 1e-6)),  1 when m <= 0 (gradient_clipping 0 = off).
//
// Overflow. A non-finite global squared norm (an inf or NaN anywhere in any rank's shard, which
// the sum carries to every rank) is the fp16 overflow flag: the step is skipped and the loss
// scale reduced. The squared norm is an fp32 sum, so a finite gradient whose norm exceeds
// ~1.8e19 also reads as non-finite: fp16 gradients would need ~8e28 elements at 65504 to get
// there, and for bf16/fp32 such a norm means the run has diverged anyway. Without loss scaling
// and without skip_nonfinite (DeepSpeed's bf16/fp32 default) a non-finite step is applied, as in
// DeepSpeed, and poisons the parameters; the caller should log it.
//
// Thread-safety: local_squared_norm may run on any thread (it uses the current oneTBB arena);
// global_grad_norm uses the communicator, so it follows the Communicator's rule (one thread at a
// time, same order on every rank). It blocks the calling thread until the all-reduce completed.
#pragma once

#include <cstddef>

#include "collectives/communicator.hpp"
#include "optim/loss_scaler.hpp"
#include "core/dtype.hpp"

namespace zero::optim {

// Elements per chunk of local_squared_norm: the unit of parallel work and of its fixed summation
// order.
inline constexpr size_t kNormChunkElements = size_t{1} << 16;

// The sum of squares of the n elements at `grad` (host memory, read only, of type `dtype`), each
// widened exactly to fp32 and squared in double. Each chunk of kNormChunkElements elements is
// summed in double in a fixed pattern, the chunk sums are added in chunk order, and the total is
// rounded once to float: the same bits whatever the number of threads. inf/NaN in the input give
// an inf/NaN result. n = 0 gives 0.
float local_squared_norm(const void* grad, DType dtype, size_t n);

struct GlobalNorm {
  float squared = 0.0f;  // sum over ranks of the local squared norms (fp32, rank order)
  float norm = 0.0f;     // sqrt(squared): the L2 norm of the whole gradient as stored
  bool finite = true;    // false: some rank's shard holds inf/NaN (the fp16 overflow flag)
};

// Every rank passes the squared norm of its own shard; all get the same GlobalNorm. `comm` must
// be a host (MPI, kind cpu) communicator: the scalar lives in host memory. Collective: every rank
// of `comm` must call it, in the same order as its other collectives.
GlobalNorm global_grad_norm(coll::Communicator& comm, float local_sq);

// DeepSpeed's clip coefficient min(1, max_norm / (norm + 1e-6)) for an unscaled global norm;
// max_norm <= 0 means no clipping (1). A NaN norm gives NaN, +inf gives 0: check
// GlobalNorm::finite first.
float clip_coefficient(float norm, float max_norm);

// What one optimizer step does with its gradients.
struct StepScale {
  bool apply = true;        // false: overflow, skip the step (the scaler has already adjusted)
  double loss_scale = 1.0;  // the scale this step's gradients carry
  float grad_norm = 0.0f;   // the global norm of the unscaled gradient (what DeepSpeed logs)
  float clip_coef = 1.0f;   // clip_coefficient(grad_norm, max_norm)
  float grad_scale = 1.0f;  // clip_coef / loss_scale: AdamStep::grad_scale
};

// Without a loss scaler: folds a global norm of gradients scaled by `loss_scale` into a StepScale
// (apply = norm.finite).
StepScale fold_grad_scale(const GlobalNorm& norm, double loss_scale, float max_norm);

// Ends the step's gradient phase: scaler.update(!norm.finite) (throws zero::Error at the minimum
// fp16 scale), then fold_grad_scale with the scale the gradients were computed at. A skipped
// step has apply false and grad_scale 0.
StepScale prepare_step(LossScaler& scaler, const GlobalNorm& norm, float max_norm);

}  // namespace zero::optim
