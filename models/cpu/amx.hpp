// Small bf16 matrix products on Intel AMX tiles, for the blocked attention on 16-bit activations
// (attention16.cpp). Internal to models/cpu/.
//
// Why our own: attention multiplies blocks of about 64 x 128 x 64 (a million flops each), far too
// small for oneDNN's matmul to reach its rate (per-op timing on the AMX VM: ~100 GFLOP/s, a
// tenth of its rate on the GPT's large products; docs/cpu-kernels.md). One tile instruction
// multiplies 16 x 32 by 32 x 16 in bf16 with fp32 accumulation, so a block is a few dozen of
// them with no call, dispatch or reorder around them.
//
// Contract:
//   - available(): the CPU has AMX-TILE, AMX-BF16 and AVX512-BF16 and Linux granted this
//     process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once), and no test
//     switched the path off. Everything below requires it; callers keep their other path.
//   - product(): single-threaded, on the calling thread; configures the tiles on entry and
//     releases them on return (oneDNN configures its own before each of its kernels).
//   - Results: fp32 accumulation in the tile unit's order (pairs of products, then down K), so
//     they differ from oneDNN's in the last bits; deterministic, independent of thread count.
//     Inputs and outputs flush subnormals to zero (the instruction's rule).
//   - round_rows / round_pairs round exactly as core/dtype's to_bfloat16 (to nearest, ties to
//     even, NaN made quiet).
#pragma once

#include <cstdint>

namespace zero::models::cpu::amx {

bool available() noexcept;
// For tests and benchmarks: false makes available() false; true restores what the machine has.
// Must not be called while products run on other threads.
void use_tiles(bool on) noexcept;

// C[M, N] = A B, or C += A B when `acc`:
//   - A: bf16, row-major, lda elements between rows;
//   - B: bf16 in pairs of rows: element (k, n) is half k % 2 (low half first) of the 32-bit
//     word B[(k / 2) * ldb + n];
//   - C: fp32, ldc elements between rows.
// M and N multiples of 16, K a multiple of 32 (callers pad with zeros, or take their other
// path). All rows and words named above must be readable.
void product(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
             int64_t ldb, float* C, int64_t ldc, bool acc);

// out[r * ldo + c] = bf16(x[r * ld + c]) for r < rows, c < cols.
void round_rows(const float* x, int64_t ld, int64_t rows, int64_t cols, uint16_t* out,
                int64_t ldo);
// The pairs layout of product()'s B from fp32 rows: out[p * ldo + c] = bf16(x[2p][c]) |
// bf16(x[2p + 1][c]) << 16 for p < rows / 2 (rows even), c < cols.
void round_pairs(const float* x, int64_t ld, int64_t rows, int64_t cols, uint32_t* out,
                 int64_t ldo);

}  // namespace zero::models::cpu::amx
