// The CUDA side of the optimizer: the fused AdamW step of optim/adam.hpp as one stream-ordered
// kernel, and the two gradient reductions the step's callers need on the GPU (the squared norm
// for clipping, the inf/NaN test for the fp16 loss scaler). Namespace zero::optim, every name
// prefixed cuda_ (this header is compiled only with the cuda backend, ZERO_CUDA).
//
// Arithmetic of cuda_adam_step: exactly the formula and operation order of optim/adam.hpp, with
// the per-step scalars of adam_scalars(), every operation one IEEE fp32 operation rounded to
// nearest even (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn: never contracted into a
// fused multiply-add, no fast-math approximations), evaluated left to right as written there:
//
//   g     = grad * grad_scale                           (grad widened exactly, dtype.hpp)
//   g     = g + l2 * p                                  only when !adam_w_mode
//   m     = (beta1 * m) + (one_minus_beta1 * g)
//   v     = (beta2 * v) + ((one_minus_beta2 * g) * g)
//   denom = (sqrt(v) * inv_sqrt_bc2) + eps
//   p     = p - (decay * p)                             only when adam_w_mode
//   p     = p - ((step_size * m) / denom)
//   copy  = to_half(p) / to_bfloat16(p) / p             (dtype.hpp's rounding), when asked for
//
// The mode decides which decay line runs, not the value of weight_decay: with weight_decay = 0
// the line still runs (and changes only signed zeros and infinities: p - 0 * p turns -0 into +0
// and inf into NaN). HostAdam (optim/host_adam.hpp) does the same. A host kernel
// written in this order in plain fp32 (no FMA, correctly rounded sqrt and division, no
// flush-to-zero) gives bit-identical p, m, v and copy; tests/optim/cuda_adam_test.cpp checks that
// and the distance to a double-precision reference. NaN payloads are the one exception: a NaN
// the GPU produces is 0x7fffffff, x86 produces others. Subnormals are kept, which needs nvcc's
// default -ftz=false for this file (never --use_fast_math: under flush-to-zero the _rn
// intrinsics flush too).
//
// Buffers (all of them): device memory, or memory the stream's device can reach (managed or
// mapped host memory), alive and untouched by other streams until the work completes; record
// an event after the call to know when. param, m, v are fp32, n elements each, updated in place;
// grad is n elements of grad_dtype, read only; param_copy (nullable) receives n elements of
// copy_dtype. No two of them overlap. Any sub-range of larger buffers works (pass offset
// pointers): 16-byte (fp32) / 8-byte (16-bit) vector accesses are used when every pointer is
// aligned to 4 elements, element-wise accesses otherwise; the results do not depend on which.
//
// Every call: the calling thread's current device must be the stream's device; n = 0 enqueues
// nothing (the pointers may then be null; cuda_squared_norm_async still writes its 0); any n
// works (size_t indexing). The call returns once the kernels are enqueued and never waits for
// the GPU. Throws zero::Error (library "zero") for bad arguments and (library "CUDA") if a
// launch is rejected; faults inside a kernel surface at the next synchronising call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "optim/adam.hpp"
#include "core/dtype.hpp"

namespace zero::optim {

// One AdamW/Adam step over n elements: the formula above with adam_scalars(params, step)
// (computed here on the host, in double, and passed to the kernel by value). One launch.
// param_copy may be null (no copy, copy_dtype ignored); copy_dtype may be fp16, bf16 or fp32.
void cuda_adam_step(const AdamParams& params, const AdamStep& step, float* param, float* m,
                    float* v, const void* grad, DType grad_dtype, size_t n, void* param_copy,
                    DType copy_dtype, cudaStream_t stream);

// Partial sums cuda_squared_norm_async keeps between its two launches (fp32 each).
inline constexpr size_t kCudaNormPartials = 1024;

// *out_device = sum over i of float(grad[i])^2, accumulated in fp32, written by the stream
// (a device pointer to one float). Deterministic: the reduction tree depends on n only, never on
// timing, the GPU model or the buffers' alignment, so equal inputs give bit-identical results.
// Tree: element 4k+j goes to lane j of the thread owning pack k in a grid-stride loop over a
// grid of min(ceil(n / 1024), 1024) blocks of 256 threads; each thread adds its lanes in order
// ((l0 + l1) + (l2 + l3)); blocks reduce with a fixed butterfly into one partial each; a second
// launch of one block sums the partials the same way. Each square is one rounded fp32 product
// and each sum one rounded fp32 addition, so for these non-negative terms the relative error is
// at most (c + 24) * 2^-24, c = ceil(n / 2^20) the longest chain of sequential additions
// (plus 2^-150 absolute per square that underflows into the subnormals).
// An inf or NaN anywhere gives inf or NaN.
// Scratch: kCudaNormPartials floats of device memory. Pass them (partials_device, used by this
// stream only until the work completes) or leave it null and the call takes them from the
// stream-ordered allocator (cudaMallocAsync) and returns them (cudaFreeAsync) on `stream`.
// n = 0 writes 0 to *out_device.
void cuda_squared_norm_async(const void* grad, DType dtype, size_t n, float* out_device,
                             cudaStream_t stream, float* partials_device = nullptr);

// Sets *flag_device (a device int) to 1 when any of the n elements is +-inf or NaN, and leaves
// it untouched otherwise: it is never cleared, so zero it first (cudaMemsetAsync) and one flag
// can collect several buffers. Exact (a bit test of the exponent, nothing is rounded).
// n = 0 enqueues nothing.
void cuda_has_inf_or_nan_async(const void* grad, DType dtype, size_t n, int* flag_device,
                               cudaStream_t stream);

}  // namespace zero::optim
