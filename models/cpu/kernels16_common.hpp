// Helpers the 16-bit activation kernels share (kernels16.cpp, attention16.cpp): conversion of
// blocks between the 16-bit storage type S and fp32 scratch, and the matrix products on 16-bit
// operands (oneDNN, fp32 accumulation and output) or fp32 ones (the BLAS). Internal to
// models/cpu/; the contract is kernels16.hpp's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "models/cpu/gemm.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/matmul.hpp"

namespace zero::models::cpu::k16 {

inline bool is16(ScalarType t) noexcept { return t == ScalarType::bf16 || t == ScalarType::f16; }

inline DType dtype16(ScalarType s) {
  ZERO_REQUIRE(is16(s), "cpu 16-bit kernels: activations of type " + std::string(to_string(s)) +
                            " (expected bf16 or fp16)");
  return *to_dtype(s);
}

inline const char* at16(const void* base, int64_t elems) {
  return static_cast<const char*>(base) + elems * 2;
}
inline char* at16(void* base, int64_t elems) { return static_cast<char*>(base) + elems * 2; }

// dst[0, n) = src[i, i + n) widened exactly to fp32.
inline void load(ScalarType s, const void* src, int64_t i, float* dst, int64_t n) {
  convert(at16(src, i), dtype16(s), dst, DType::f32, static_cast<size_t>(n));
}
// dst[i, i + n) = src[0, n) rounded once (to nearest, ties to even) to s.
inline void store(ScalarType s, void* dst, int64_t i, const float* src, int64_t n) {
  convert(src, DType::f32, at16(dst, i), dtype16(s), static_cast<size_t>(n));
}
// rows x cols elements starting at element `offset` of src, `ld` between rows, into dst
// (cols between rows); and the reverse.
inline void load_rows(ScalarType s, const void* src, int64_t offset, int64_t ld, int64_t rows,
                      int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) load(s, src, offset + r * ld, dst + r * cols, cols);
}
inline void store_rows(ScalarType s, void* dst, int64_t offset, int64_t ld, int64_t rows,
                       int64_t cols, const float* src) {
  for (int64_t r = 0; r < rows; ++r) store(s, dst, offset + r * ld, src + r * cols, cols);
}

// A matrix product operand as stored: `p` holds elements of `t` (fp32 or 16-bit), `ld` of them
// between rows.
struct Operand {
  const void* p;
  ScalarType t;
  int64_t ld;
};

// The operand type of products on 16-bit activations of type s: s where oneDNN has a kernel for
// it on this CPU (matmul_supports: bf16 on AVX-512 CPUs; fp16 only with AVX512-FP16), else fp32
// on converted blocks.
inline ScalarType product_type(ScalarType s) { return matmul_supports(s) ? s : ScalarType::f32; }

// Row-major C[M,N] (fp32, ldc) = op(A) op(B), or += when acc: 16-bit operands through oneDNN
// (fp32 accumulation; one thread per call), fp32 ones through the BLAS.
inline void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Operand& A,
                    const Operand& B, bool acc, float* C, int64_t ldc) {
  ZERO_REQUIRE(A.t == B.t, "cpu 16-bit kernels: a product of " + std::string(to_string(A.t)) +
                               " and " + std::string(to_string(B.t)) + " operands");
  if (A.t == ScalarType::f32) {
    detail::gemm<float>(ta, tb, M, N, K, 1.0f, static_cast<const float*>(A.p), A.ld,
                        static_cast<const float*>(B.p), B.ld, acc ? 1.0f : 0.0f, C, ldc);
  } else {
    matmul(M, N, K, {A.p, A.t, A.ld, ta}, {B.p, B.t, B.ld, tb}, C, ldc, acc);
  }
}

// The rows x cols block of 16-bit data at element `offset` of base (ld between rows) as an
// operand of type pt: in place when pt is s (no conversion), else widened into buf (fp32,
// cols between rows).
inline Operand block(ScalarType s, const void* base, int64_t offset, int64_t ld, int64_t rows,
                     int64_t cols, ScalarType pt, std::unique_ptr<float[]>& buf) {
  if (pt == s) return {at16(base, offset), s, ld};
  buf = detail::scratch<float>(rows * cols);
  load_rows(s, base, offset, ld, rows, cols, buf.get());
  return {buf.get(), ScalarType::f32, cols};
}

// The fp32 rows x cols block x (ld between rows) as an operand of type pt: x itself when pt is
// fp32, else rounded once to pt into buf (cols between rows).
inline Operand rounded(const float* x, int64_t rows, int64_t cols, int64_t ld, ScalarType pt,
                       std::unique_ptr<uint16_t[]>& buf) {
  if (pt == ScalarType::f32) return {x, pt, ld};
  buf = detail::scratch<uint16_t>(rows * cols);
  for (int64_t r = 0; r < rows; ++r) store(pt, buf.get(), r * cols, x + r * ld, cols);
  return {buf.get(), pt, cols};
}

}  // namespace zero::models::cpu::k16
