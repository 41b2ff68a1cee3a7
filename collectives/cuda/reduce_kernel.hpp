// The device side of host_reduce (collectives/reduce_kernel.hpp): the reduction arithmetic every
// backend shares, as a stream-ordered CUDA kernel, bit for bit the host's result.
//
//   out[i] = op over q = 0 .. n_inputs-1 of inputs[q][i]
//
// Arithmetic (communicator.hpp, "Arithmetic"; every step below is one IEEE operation with round
// to nearest even, so host and device cannot differ):
//   - Elements are widened to fp32 exactly (dtype.hpp's to_float) and accumulated in input
//     order: ((x0 + x1) + x2) + ... . No fused multiply-add, no reassociation.
//   - avg: the fp32 sum divided (one IEEE division) by float(divisor).
//   - max: acc = (acc >= x || acc is NaN) ? acc : x. So a NaN anywhere gives NaN, and among equal
//     values (+0 and -0) the earliest input wins.
//   - A NaN result is written as the canonical quiet NaN 0x7fc00000 (fp16 0x7e00, bf16 0x7fc0):
//     the GPU makes every NaN from an addition 0x7fffffff, x86 keeps an input's payload (and
//     makes inf - inf 0xffc00000), so only a fixed NaN can be equal on both sides.
//   - The result is rounded once to `dtype` (dtype.hpp's to_half / to_bfloat16).
// n_inputs == 1 goes through the same steps (so a NaN comes out canonical, a value unchanged).
//
// More than kCudaReduceInputsPerPass inputs: the kernel runs in passes over groups of inputs,
// carrying the fp32 accumulator between passes in `fp32_scratch` (count floats, device memory,
// overlapping nothing else). An fp32 value stored and reloaded is exact, so the result is the one
// a single pass would give. Fewer inputs need no scratch (it may be null).
//
// Buffers: `inputs` is a host array of n_inputs device pointers (read during the call only; the
// pointers themselves are passed to the kernel by value). `out` may be one of the inputs (the
// same pointer: element-wise in place); otherwise it overlaps none. Every buffer must stay alive
// and untouched by other streams until the work completes. Vector loads (16 bytes) are used when
// every pointer is 16-byte aligned (the scratch 32-byte), element-wise access otherwise; results
// do not depend on which.
//
// The calling thread's current device must be the stream's device. count = 0 enqueues nothing
// (the pointers may then be null). Any count is fine (size_t indexing). Throws zero::Error
// (library "zero") for bad arguments and (library "CUDA") if a launch is rejected; faults inside
// the kernel surface at the next synchronising call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "collectives/communicator.hpp"

namespace zero::coll {

// Input pointers one kernel launch carries in its parameters (8 bytes each).
inline constexpr int kCudaReduceInputsPerPass = 32;

void cuda_reduce_async(DType dtype, ReduceOp op, int divisor, const void* const* inputs,
                       int n_inputs, void* out, size_t count, cudaStream_t stream,
                       float* fp32_scratch = nullptr);

}  // namespace zero::coll
