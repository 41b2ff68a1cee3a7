// Small bf16 products on AMX tiles (contract in amx.hpp). The file is built for the baseline
// ISA; the functions that use AMX or AVX-512 carry their target, and run only when available().
#include "models/cpu/amx.hpp"

#include <atomic>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ZERO_AMX_X86 1
#endif

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace zero::models::cpu::amx {
namespace {

#ifdef ZERO_AMX_X86
// Linux's x86 arch_prctl codes for dynamically enabled XSTATE features (asm/prctl.h) and the
// tile data feature's number (Documentation/arch/x86/xstate.rst).
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool machine_has_tiles() {
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16") ||
      !__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw"))
    return false;
  // Asking again is harmless (oneDNN asks too); the grant is per process.
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long bits = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bits) != 0) return false;
  return (bits >> kXfeatureXtiledata) & 1u;
}

// Palette 1, tiles 0-7 all 16 rows of 64 bytes: 0-3 hold C (2 x 2 blocks of 16 x 16 fp32),
// 4-5 two 16 x 32 blocks of A, 6-7 two 32 x 16 blocks of B (16 rows of pairs). Static and
// constant: ldtilecfg's asm tells the compiler it reads only the first 8 bytes, so the whole
// 64 must be in memory before the first call, not stored just before it.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
constexpr TileConfig kConfig = {1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64},
                                {16, 16, 16, 16, 16, 16, 16, 16}};
static_assert(sizeof(TileConfig) == 64, "the tile configuration is 64 bytes");

// The MI x NI block of 16 x 16 C tiles at C (MI, NI in {1, 2}), over all of K.
template <int MI, int NI>
__attribute__((target("amx-tile,amx-bf16"), always_inline)) inline void tile_block(
    int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb, float* C,
    int64_t ldc, bool acc) {
  const int64_t sa = lda * 2, sb = ldb * 4, sc = ldc * 4;  // strides in bytes
  float* c1 = C + 16 * ldc;
  if (acc) {
    _tile_loadd(0, C, sc);
    if constexpr (NI == 2) _tile_loadd(1, C + 16, sc);
    if constexpr (MI == 2) _tile_loadd(2, c1, sc);
    if constexpr (MI == 2 && NI == 2) _tile_loadd(3, c1 + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NI == 2) _tile_zero(1);
    if constexpr (MI == 2) _tile_zero(2);
    if constexpr (MI == 2 && NI == 2) _tile_zero(3);
  }
  for (int64_t k = 0; k < K; k += 32) {
    const uint32_t* b = B + (k / 2) * ldb;
    _tile_loadd(4, A + k, sa);
    _tile_loadd(6, b, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NI == 2) {
      _tile_loadd(7, b + 16, sb);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MI == 2) {
      _tile_loadd(5, A + 16 * lda + k, sa);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NI == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, C, sc);
  if constexpr (NI == 2) _tile_stored(1, C + 16, sc);
  if constexpr (MI == 2) _tile_stored(2, c1, sc);
  if constexpr (MI == 2 && NI == 2) _tile_stored(3, c1 + 16, sc);
}

__attribute__((target("amx-tile,amx-bf16"))) void tile_product(int64_t M, int64_t N, int64_t K,
                                                                const uint16_t* A, int64_t lda,
                                                                const uint32_t* B, int64_t ldb,
                                                                float* C, int64_t ldc, bool acc) {
  // The tile loads' asm names only the address: make every store before this call (A, B and
  // C written by the caller) visible to them.
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&kConfig);
  for (int64_t m = 0; m < M; m += 32) {
    const bool two_m = m + 32 <= M;
    const uint16_t* a = A + m * lda;
    for (int64_t n = 0; n < N; n += 32) {
      const bool two_n = n + 32 <= N;
      float* c = C + m * ldc + n;
      const uint32_t* b = B + n;
      if (two_m && two_n) {
        tile_block<2, 2>(K, a, lda, b, ldb, c, ldc, acc);
      } else if (two_m) {
        tile_block<2, 1>(K, a, lda, b, ldb, c, ldc, acc);
      } else if (two_n) {
        tile_block<1, 2>(K, a, lda, b, ldb, c, ldc, acc);
      } else {
        tile_block<1, 1>(K, a, lda, b, ldb, c, ldc, acc);
      }
    }
  }
  _tile_release();
}

// 16 fp32 -> 16 bf16 in the low halves of 32-bit lanes, as detail::f32_bits_to_bf16 does.
__attribute__((target("avx512f"), always_inline)) inline __m512i round16(const float* x) {
  const __mmask16 all = 0xffff;  // maskz forms: see pack16.cpp's zip16_avx512
  const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x));
  const __m512i abs = _mm512_maskz_and_epi32(all, u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_maskz_and_epi32(all, _mm512_maskz_srli_epi32(all, u, 16),
                                             _mm512_set1_epi32(1));
  const __m512i round = _mm512_maskz_add_epi32(static_cast<__mmask16>(~nan),
                                               _mm512_set1_epi32(0x7fff), lsb);
  const __m512i quiet = _mm512_mask_or_epi32(u, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_maskz_srli_epi32(all, _mm512_maskz_add_epi32(all, quiet, round), 16);
}

__attribute__((target("avx512f,avx512bw"))) void round_rows_avx512(const float* x, int64_t ld,
                                                                    int64_t rows, int64_t cols,
                                                                    uint16_t* out, int64_t ldo) {
  const __mmask16 all = 0xffff;
  const int64_t bulk = cols / 16 * 16;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld;
    uint16_t* o = out + r * ldo;
    for (int64_t c = 0; c < bulk; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c),
                          _mm512_maskz_cvtepi32_epi16(all, round16(xr + c)));
    for (int64_t c = bulk; c < cols; ++c) o[c] = to_bfloat16(xr[c]).bits;
  }
}

__attribute__((target("avx512f"))) void round_pairs_avx512(const float* x, int64_t ld,
                                                            int64_t rows, int64_t cols,
                                                            uint32_t* out, int64_t ldo) {
  const __mmask16 all = 0xffff;
  const int64_t bulk = cols / 16 * 16;
  for (int64_t p = 0; p < rows / 2; ++p) {
    const float* x0 = x + 2 * p * ld;
    const float* x1 = x0 + ld;
    uint32_t* o = out + p * ldo;
    for (int64_t c = 0; c < bulk; c += 16) {
      const __m512i hi = _mm512_maskz_slli_epi32(all, round16(x1 + c), 16);
      _mm512_storeu_si512(o + c, _mm512_or_si512(round16(x0 + c), hi));
    }
    for (int64_t c = bulk; c < cols; ++c)
      o[c] = uint32_t{to_bfloat16(x0[c]).bits} | uint32_t{to_bfloat16(x1[c]).bits} << 16;
  }
}
#else
bool machine_has_tiles() { return false; }
#endif

std::atomic<bool>& tiles_on() {
  static std::atomic<bool> on{machine_has_tiles()};
  return on;
}

}  // namespace

bool available() noexcept { return tiles_on().load(std::memory_order_relaxed); }

void use_tiles(bool on) noexcept {
  static const bool machine = machine_has_tiles();
  tiles_on().store(on && machine, std::memory_order_relaxed);
}

#ifdef ZERO_AMX_X86
void product(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
             int64_t ldb, float* C, int64_t ldc, bool acc) {
  tile_product(M, N, K, A, lda, B, ldb, C, ldc, acc);
}
void round_rows(const float* x, int64_t ld, int64_t rows, int64_t cols, uint16_t* out,
                int64_t ldo) {
  round_rows_avx512(x, ld, rows, cols, out, ldo);
}
void round_pairs(const float* x, int64_t ld, int64_t rows, int64_t cols, uint32_t* out,
                 int64_t ldo) {
  round_pairs_avx512(x, ld, rows, cols, out, ldo);
}
#else
// Not built for this machine: available() is false, so no caller gets here.
void product(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t,
             float*, int64_t, bool) {
  ZERO_REQUIRE(false, "amx::product called on a build without AMX support (available() is false)");
}
void round_rows(const float*, int64_t, int64_t, int64_t, uint16_t*, int64_t) {
  ZERO_REQUIRE(false, "amx::round_rows called on a build without AMX support");
}
void round_pairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {
  ZERO_REQUIRE(false, "amx::round_pairs called on a build without AMX support");
}
#endif

}  // namespace zero::models::cpu::amx
