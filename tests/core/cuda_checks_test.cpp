// The CUDA, cuBLAS and NCCL checked-call macros. Each call below fails with or without a GPU
// (an invalid argument), so these run everywhere the cuda backend is built.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "core/cuda/checks.hpp"

using Catch::Matchers::ContainsSubstring;

TEST_CASE("cuda checks: a failing CUDA call names the call and CUDA's message") {
  try {
    ZERO_CHECK_CUDA(cudaSetDevice(-1));
    FAIL("cudaSetDevice(-1) succeeded");
  } catch (const zero::Error& e) {
    CHECK(e.library() == "CUDA");
    CHECK(e.statement() == "cudaSetDevice(-1)");
    CHECK(e.file() == "tests/core/cuda_checks_test.cpp");
    // Without a driver the reason differs (no driver / no device), but it is CUDA's own text
    // followed by the error's name.
    CHECK_THAT(e.what(), ContainsSubstring("CUDA error: "));
    CHECK_THAT(e.what(), ContainsSubstring("(cudaError"));
  }
  (void)cudaGetLastError();
}

TEST_CASE("cuda checks: a failing cuBLAS call names the call and cuBLAS's status") {
  try {
    ZERO_CHECK_CUBLAS(cublasSetStream(nullptr, nullptr));  // null handle
    FAIL("cublasSetStream on a null handle succeeded");
  } catch (const zero::Error& e) {
    CHECK(e.library() == "cuBLAS");
    CHECK_THAT(e.what(), ContainsSubstring("cuBLAS error: "));
    CHECK_THAT(e.what(), ContainsSubstring("CUBLAS_STATUS_NOT_INITIALIZED"));
    CHECK_THAT(e.what(), ContainsSubstring("in cublasSetStream(nullptr, nullptr) at"));
  }
}

TEST_CASE("cuda checks: a failing NCCL call names the call and NCCL's message") {
  try {
    ZERO_CHECK_NCCL(ncclGetUniqueId(nullptr));  // null output pointer
    FAIL("ncclGetUniqueId(nullptr) succeeded");
  } catch (const zero::Error& e) {
    CHECK(e.library() == "NCCL");
    CHECK_THAT(e.what(), ContainsSubstring("NCCL error: "));
    CHECK_THAT(e.what(), ContainsSubstring("invalid argument"));
    CHECK_THAT(e.what(), ContainsSubstring("in ncclGetUniqueId(nullptr) at"));
  }
  // The unique id itself needs no GPU (it is what rank 0 broadcasts over MPI).
  ncclUniqueId id;
  ZERO_CHECK_NCCL(ncclGetUniqueId(&id));
}
