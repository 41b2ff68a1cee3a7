// Checked calls into the CUDA runtime, cuBLAS and NCCL (cuda backend only). A failure throws
// zero::Error with the library's own message, the statement, file and line:
//   CUDA error: invalid device ordinal (cudaErrorInvalidDevice)
//     in cudaSetDevice(7) at core/cuda/device.cpp:31
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/error.hpp"

namespace zero::detail {
[[noreturn]] void throw_cuda(cudaError_t rc, const char* statement, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t rc, const char* statement, const char* file, int line);
// comm may be null; when given, ncclGetLastError(comm) adds NCCL's detailed reason.
[[noreturn]] void throw_nccl(ncclResult_t rc, ncclComm_t comm, const char* statement,
                             const char* file, int line);
}  // namespace zero::detail

#define ZERO_CHECK_CUDA(expr)                                                       \
  do {                                                                              \
    cudaError_t zero_cuda_rc_ = (expr);                                             \
    if (zero_cuda_rc_ != cudaSuccess)                                               \
      ::zero::detail::throw_cuda(zero_cuda_rc_, #expr, __FILE__, __LINE__);         \
  } while (0)

#define ZERO_CHECK_CUBLAS(expr)                                                     \
  do {                                                                              \
    cublasStatus_t zero_cublas_rc_ = (expr);                                        \
    if (zero_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::zero::detail::throw_cublas(zero_cublas_rc_, #expr, __FILE__, __LINE__);     \
  } while (0)

// ZERO_CHECK_NCCL(expr) or ZERO_CHECK_NCCL_COMM(expr, comm) for NCCL's per-communicator detail.
#define ZERO_CHECK_NCCL_COMM(expr, comm)                                            \
  do {                                                                              \
    ncclResult_t zero_nccl_rc_ = (expr);                                            \
    if (zero_nccl_rc_ != ncclSuccess && zero_nccl_rc_ != ncclInProgress)            \
      ::zero::detail::throw_nccl(zero_nccl_rc_, (comm), #expr, __FILE__, __LINE__); \
  } while (0)
#define ZERO_CHECK_NCCL(expr) ZERO_CHECK_NCCL_COMM(expr, nullptr)
