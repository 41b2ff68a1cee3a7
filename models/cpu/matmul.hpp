// Matrix products for the cpu kernels through oneDNN: fp32 or 16-bit operands, fp32
// accumulation, fp32 output. Internal to models/cpu/ (kernels.cpp decides which products come
// here; docs/models.md, "Matrix products on the cpu backend" has the whole story).
//
// Contract of matmul():
//   - Row-major C[M,N] (leading dimension ldc) = op(A)[M,K] op(B)[K,N], or C += that when
//     `accumulate`. op(X) is X or its transpose (MatrixRef::trans); A and B have one type.
//   - Runs on the calling thread only: oneDNN gets one OpenMP thread per call (set on each
//     calling thread, see matmul.cpp), so a call never starts threads of its own and its result
//     does not depend on any thread count. Parallelism comes from the caller running several
//     calls at once (oneTBB blocks in kernels.cpp); concurrent calls are safe, each has its own
//     scratch.
//   - For fixed (shapes, leading dimensions, transposes, type, accumulate) on one machine the
//     result is bitwise the same on every call.
//   - Blocks only on the primitive cache's lock, and only while a new shape's primitive is built.
//
// The primitive cache: one oneDNN matmul primitive per distinct key (M, N, K, lda, ldb, ldc,
// transposes, type, accumulate, packed layout), built on first use and kept for the life of the
// process. A training run has a handful of shapes (a few per layer kind), so the cache stays
// small.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.hpp"

namespace zero::models::cpu {

// One operand: `data` holds a row-major matrix of `type` with `ld` elements between rows;
// `trans` means the product reads its transpose. Borrowed for the call.
struct MatrixRef {
  const void* data;
  ScalarType type;
  int64_t ld;
  bool trans = false;
};

// See the file comment. Throws zero::Error when oneDNN cannot compute with `A.type` here (ask
// matmul_supports first) or refuses the shapes (the message names them and oneDNN's reason).
void matmul(int64_t M, int64_t N, int64_t K, const MatrixRef& A, const MatrixRef& B, float* C,
            int64_t ldc, bool accumulate);

// The right operand B[K,N] of many products with the same shapes, reordered once into the layout
// oneDNN's kernel for `rows`-row products prefers (AMX and AVX512-BF16 kernels otherwise re-pack
// the whole of B on every call: for a weight multiplied in 128-row blocks that is most of a
// call's memory traffic). multiply() then runs one product on the calling thread, as matmul();
// several threads may call it at once. Products of another row count (a last, shorter block) use
// the packed B when oneDNN has a kernel for that layout, else B as given. B must stay alive and
// unchanged while this object is used; the packed copy is owned here (its buffer goes back to a
// small process-wide free list for the next PackedWeight of that size). The constructor packs on
// oneTBB's threads, whole column blocks per task, by our own copy (pack16.hpp) for oneDNN's VNNI
// layouts and oneDNN's reorder for any other (exact either way, so the bits do not depend on how
// many threads run); it returns when the copy is complete. For fixed shapes, layouts and type
// the results are bitwise the same on every call.
class PackedWeight {
 public:
  PackedWeight(int64_t rows, int64_t N, int64_t K, const MatrixRef& B, bool accumulate);
  ~PackedWeight();
  PackedWeight(const PackedWeight&) = delete;
  PackedWeight& operator=(const PackedWeight&) = delete;
  // C[M,N] (ldc) = A[M,K] B, or += when the object was made with `accumulate`; A is row-major
  // (A.trans must be false) of B's type.
  void multiply(int64_t M, const MatrixRef& A, float* C, int64_t ldc) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// dst[cols, rows] (dense, row-major) = the transpose of the rows x cols matrix src of type t (ld
// elements between its rows): an exact copy on the calling thread (16-bit types: pack16.hpp's
// blocked copy, AVX-512 where the CPU has it; others: a cached oneDNN reorder, one thread, no
// scratch shared between calls). Used to hand the brgemm kernels the dense, row-major operands
// they need (kernels16.cpp, add_at_b).
void transpose(int64_t rows, int64_t cols, ScalarType t, const void* src, int64_t ld, void* dst);

// Whether matmul computes with operands of type t on this CPU with an optimised kernel: f32
// always; bf16 where oneDNN has a native or AVX-512 kernel for it; f16 only where the CPU has
// fp16 arithmetic (AVX512-FP16). A type without one is left to the caller's fp32 path (oneDNN's
// reference kernels are far slower than converting to fp32). Decided once per process.
bool matmul_supports(ScalarType t);

// "oneDNN 2.6.x, brg:avx512_core_bf16" for type t: the library and the kernel it picks for a
// representative product (logs and benchmark records); "unsupported" when matmul_supports is
// false.
std::string matmul_description(ScalarType t);

}  // namespace zero::models::cpu
