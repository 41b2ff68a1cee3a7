// Stream-ordered dtype conversion on the GPU: the device side of convert() in dtype.hpp.
//
// The kernel calls the same conversion functions as the host (dtype.hpp's to_half, to_bfloat16,
// to_float, compiled for the device), so host and device results agree bit for bit, NaNs
// included; see dtype.hpp for the rounding and NaN rules.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.hpp"

namespace zero::cuda {

// Enqueues the conversion of n elements from src (of src_type) to dst (of dst_type) on `stream`
// and returns at once; same type is a cudaMemcpyAsync. Both buffers must be accessible from the
// stream's device (device memory, or managed/mapped host memory), must stay alive and untouched
// by other streams until the work completes (record an event after the call to know when), and
// must not overlap. The calling thread's current device must be the stream's device.
// n = 0 enqueues nothing (the pointers may then be null). Any n is fine (size_t indexing).
// Throws zero::Error (library "CUDA") if the launch or copy is rejected; faults during the
// kernel surface later, at the next synchronising call.
void convert_async(const void* src, DType src_type, void* dst, DType dst_type, size_t n,
                   cudaStream_t stream);

}  // namespace zero::cuda
