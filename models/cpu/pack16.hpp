// Copies of 16-bit (bf16 / fp16) matrices for the cpu matrix products (matmul.cpp, and the AMX
// attention in attention16.cpp): a right operand into oneDNN's packed "VNNI" layout, pairs of
// rows interleaved, and transposes (of 16-bit or 32-bit elements). Internal to models/cpu/.
//
// Contract:
//   - Exact copies: every output element is one input element (or a zero of the padding), so a
//     result never depends on the path taken or on how the caller splits the work.
//   - Single-threaded: each call runs on the calling thread; callers cut the work (matmul.cpp
//     packs one column block per oneTBB task).
//   - Two paths, the same bytes: with AVX-512F (chosen at run time; the file is built for the
//     baseline ISA) a pair of rows is interleaved 16 elements per instruction and 16 x 16 blocks
//     of 32-bit pairs are transposed in registers; without it, scalar loops. use_vector_copies()
//     lets a test run the scalar loops on an AVX-512 machine.
#pragma once

#include <cstdint>

namespace zero::models::cpu::pack16 {

// oneDNN's packed layout for a 16-bit B[K, N] on its AMX and AVX512-BF16 kernels: K in blocks
// of 2 * kb rows, N in blocks of nb columns, each block stored as kb pairs of rows, a pair
// interleaved element by element (B[2i][n], B[2i+1][n], B[2i][n+1], ...), blocks at the outer
// strides. matmul.cpp reads these numbers off the primitive's weights descriptor (not assumed).
struct VnniLayout {
  int64_t kb, nb;  // pairs of K rows per block, columns per block
  int64_t sk, sn;  // elements between consecutive K blocks, N blocks
  int64_t Kp, Np;  // padded dimensions (Kp a multiple of 2 kb, Np of nb)
};

// Column block j (columns j*nb .. j*nb + nb - 1, all of K) of layout v in dst (the whole packed
// buffer, 64-byte aligned) from B[K, N]: b(k, n) = src[k * ld + n], or src[n * ld + k] when
// `trans`. Padding rows and columns are zeroed. Blocks j may be packed in any order, at once.
void pack_vnni_block(const VnniLayout& v, const uint16_t* src, int64_t ld, bool trans, int64_t K,
                     int64_t N, int64_t j, uint16_t* dst);

// dst[cols, rows] (dense, row-major) = the transpose of src[rows, cols] (ld elements between its
// rows). dst must not overlap src.
void transpose(int64_t rows, int64_t cols, const uint16_t* src, int64_t ld, uint16_t* dst);

// dst[c * ldd + r] = src[r * ld + c] for 32-bit elements (fp32 values, or pairs of 16-bit ones:
// the transpose of a 16-bit matrix's pairs of columns), r < rows, c < cols; ld and ldd count
// 32-bit elements, the pointers need only 2-byte alignment. dst must not overlap src.
void transpose32(int64_t rows, int64_t cols, const void* src, int64_t ld, void* dst, int64_t ldd);

// Pairs of 16-bit rows interleaved: dst[p * ldd + c] = src[2p * ld + c] | src[(2p + 1) * ld + c]
// << 16 for p < rows / 2 (rows even), c < cols.
void zip_rows(int64_t rows, int64_t cols, const uint16_t* src, int64_t ld, uint32_t* dst,
              int64_t ldd);

// Whether the AVX-512 path is in use: at start, whether the CPU has AVX-512F.
bool vector_copies() noexcept;
// For tests: false forces the scalar loops; true returns to the AVX-512 path where the CPU has
// it. Must not be called while copies run on other threads.
void use_vector_copies(bool on) noexcept;

}  // namespace zero::models::cpu::pack16
