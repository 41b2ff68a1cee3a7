// StateKernels: the engine's arithmetic on its own model state (gradient accumulation, dtype
// rounding, squared norms, AdamW on a device-resident shard), one interface for both backends,
// every call enqueued on the compute stream and returning at once.
//
//   cpu:  each call is a task on the compute stream's worker (host code: the loops the engine ran
//         inline before, HostAdam, optim::local_squared_norm), so the cpu backend runs the same
//         stream-ordered program as the GPU and the engine's tests check its ordering.
//   cuda: kernels on the compute stream (an fp32 accumulate kernel, cuda::convert_async,
//         optim::cuda_squared_norm_async, optim::cuda_adam_step).
//
// Pointers are device memory of the stream's device (on cpu: host memory), alive and not written
// by other streams until the stream has passed the call. Results are the same bits on both
// backends for accumulate, convert and adam (one IEEE fp32 operation per step, see
// optim/adam.hpp); squared_norm differs in summation (cpu: chunked fp64, cuda: a fixed fp32 tree),
// each deterministic.
//
// Not thread-safe: one thread (the one driving the Engine) calls it.
#pragma once

#include <cstddef>
#include <memory>

#include "optim/adam.hpp"
#include "optim/host_adam.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/stream.hpp"

namespace zero {

class StateKernels {
 public:
  virtual ~StateKernels() = default;
  // acc[i] = acc[i] + float(x[i]) for i < n (x of type t, widened exactly; one fp32 addition).
  virtual void accumulate(float* acc, const void* x, DType t, size_t n) = 0;
  // dst[i] = src[i] converted (dtype.hpp's rounding); no overlap.
  virtual void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) = 0;
  // *out (one fp32 in device memory) = the sum of float(x[i])^2.
  virtual void squared_norm(const void* x, DType t, size_t n, float* out) = 0;
  // One AdamW step in place over n elements (optim/adam.hpp): param, m, v fp32; grad of
  // grad_type; param_copy (nullable) receives the new parameters in copy_type.
  virtual void adam(const optim::AdamParams& params, const optim::AdamStep& step, float* param,
                    float* m, float* v, const void* grad, DType grad_type, size_t n,
                    void* param_copy, DType copy_type) = 0;
};

// For `device` (cpu or cuda) on `stream`. The cpu kernels run AdamW with `host_adam` (which must
// outlive them); the cuda ones ignore it. Throws zero::Error for a cuda device when the cuda
// backend is not built.
std::unique_ptr<StateKernels> make_state_kernels(Device& device, Stream& stream,
                                                 optim::HostAdam& host_adam);

#ifdef ZERO_HAVE_CUDA
std::unique_ptr<StateKernels> make_cuda_state_kernels(Device& device, Stream& stream);
#endif

}  // namespace zero
