// The CPU BLAS's matrix product as the cpu kernels call it (kernels.cpp, attention.cpp): one
// row-major call on the calling thread, for F = float or double. Internal to models/cpu/.
//
// Determinism: a call's result depends on its operands and sizes only (the BLAS runs one thread
// per call: OPENBLAS_NUM_THREADS=1, as kernels.hpp states), never on which thread makes it.
#pragma once

#include <cblas.h>

#include <climits>
#include <concepts>
#include <cstdint>
#include <string>

#include "core/error.hpp"

namespace zero::models::cpu::detail {

inline blasint blas_dim(int64_t v) {
  ZERO_REQUIRE(v >= 0 && v <= INT_MAX, "cpu kernels: a matrix dimension of " + std::to_string(v) +
                                           " exceeds the BLAS's 32-bit indices");
  return static_cast<blasint>(v);
}

// Row-major C[M,N] = alpha op(A) op(B) + beta C, with the BLAS's quirks handled: nothing to do
// for an empty C, and K = 0 means op(A) op(B) = 0 (the BLAS rejects its leading dimensions).
template <class F>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, F alpha, const F* A, int64_t lda,
          const F* B, int64_t ldb, F beta, F* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == F(0) ? F(0) : beta * C[i * ldc + j];
    return;
  }
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::same_as<F, float>) {
    cblas_sgemm(CblasRowMajor, opa, opb, blas_dim(M), blas_dim(N), blas_dim(K), alpha, A,
                blas_dim(lda), B, blas_dim(ldb), beta, C, blas_dim(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, opa, opb, blas_dim(M), blas_dim(N), blas_dim(K), alpha, A,
                blas_dim(lda), B, blas_dim(ldb), beta, C, blas_dim(ldc));
  }
}

}  // namespace zero::models::cpu::detail
