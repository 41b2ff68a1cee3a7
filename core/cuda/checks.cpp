#include "core/cuda/checks.hpp"

#include <string>

namespace zero::detail {

void throw_cuda(cudaError_t rc, const char* statement, const char* file, int line) {
  // Clear the per-thread "last error" so a non-sticky failure does not resurface at a later,
  // unrelated call (sticky errors stay: the context is unusable anyway).
  (void)cudaGetLastError();
  std::string msg = std::string(cudaGetErrorString(rc)) + " (" + cudaGetErrorName(rc) + ")";
  throw_error("CUDA", std::move(msg), statement, file, line);
}

void throw_cublas(cublasStatus_t rc, const char* statement, const char* file, int line) {
  std::string msg = std::string(cublasGetStatusString(rc)) + " (" + cublasGetStatusName(rc) + ")";
  throw_error("cuBLAS", std::move(msg), statement, file, line);
}

void throw_nccl(ncclResult_t rc, ncclComm_t comm, const char* statement, const char* file,
                int line) {
  std::string msg = ncclGetErrorString(rc);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) msg += ": " + std::string(last);
  }
  throw_error("NCCL", std::move(msg), statement, file, line);
}

}  // namespace zero::detail
