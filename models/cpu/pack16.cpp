// The 16-bit copies of the cpu matrix products (contract in pack16.hpp).
#include "models/cpu/pack16.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ZERO_PACK16_X86 1
#endif

#include <algorithm>
#include <atomic>
#include <cstring>

namespace zero::models::cpu::pack16 {
namespace {

#ifdef ZERO_PACK16_X86
bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f"); }

// dst (16 rows of 16 uint32, ds bytes apart) = the transpose of src (16 rows, ss bytes apart).
__attribute__((target("avx512f"))) void transpose16x16_u32(const char* src, int64_t ss, char* dst,
                                                             int64_t ds) {
  // maskz forms with every lane set (see zip16_avx512).
  const __mmask16 m16 = 0xffff;
  const __mmask8 m8 = 0xff;
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ss);
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: elements 0,1 (lo) and 2,3 (hi) of a row pair
    t[2 * i] = _mm512_maskz_unpacklo_epi32(m16, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(m16, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + c]: lane L holds column 4L + c of rows 4i .. 4i + 3
    r[4 * i + 0] = _mm512_maskz_unpacklo_epi64(m8, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_maskz_unpackhi_epi64(m8, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_maskz_unpacklo_epi64(m8, t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_maskz_unpackhi_epi64(m8, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // gather lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512i a = _mm512_maskz_shuffle_i32x4(m16, r[c], r[4 + c], 0x88);
    const __m512i b = _mm512_maskz_shuffle_i32x4(m16, r[8 + c], r[12 + c], 0x88);
    const __m512i e = _mm512_maskz_shuffle_i32x4(m16, r[c], r[4 + c], 0xdd);
    const __m512i f = _mm512_maskz_shuffle_i32x4(m16, r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_maskz_shuffle_i32x4(m16, a, b, 0x88);
    t[8 + c] = _mm512_maskz_shuffle_i32x4(m16, a, b, 0xdd);
    t[4 + c] = _mm512_maskz_shuffle_i32x4(m16, e, f, 0x88);
    t[12 + c] = _mm512_maskz_shuffle_i32x4(m16, e, f, 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * ds, t[i]);
}

// o[n] = a[n] | b[n] << 16 for n < count (a multiple of 16).
__attribute__((target("avx512f"))) void zip16_avx512(const uint16_t* a, const uint16_t* b,
                                                       uint32_t* o, int64_t count) {
  // The maskz forms with every lane set: the same instructions, and no "undefined" source operand
  // for GCC 12 to warn about (-Wmaybe-uninitialized inside its intrinsics headers).
  const __mmask16 all = 0xffff;
  for (int64_t n = 0; n < count; n += 16) {
    const __m512i x = _mm512_maskz_cvtepu16_epi32(
        all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + n)));
    const __m512i y = _mm512_maskz_cvtepu16_epi32(
        all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + n)));
    _mm512_storeu_si512(o + n, _mm512_or_si512(x, _mm512_maskz_slli_epi32(all, y, 16)));
  }
}
#else
bool cpu_has_avx512() { return false; }
void transpose16x16_u32(const char*, int64_t, char*, int64_t) {}
void zip16_avx512(const uint16_t*, const uint16_t*, uint32_t*, int64_t) {}
#endif

// The path in use: AVX-512 where the CPU has it, unless a test switched it off.
std::atomic<bool>& vector_path() {
  static std::atomic<bool> on{cpu_has_avx512()};
  return on;
}
bool have_avx512() { return vector_path().load(std::memory_order_relaxed); }

// o[n] = a[n] | b[n] << 16: two rows of 16-bit elements interleaved.
void zip16(const uint16_t* a, const uint16_t* b, uint32_t* o, int64_t count) {
  int64_t n = 0;
  if (have_avx512()) {
    n = count / 16 * 16;
    zip16_avx512(a, b, o, n);
  }
  for (; n < count; ++n) o[n] = uint32_t{a[n]} | (uint32_t{b[n]} << 16);
}

uint32_t load32(const uint16_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

}  // namespace

// Column block j (nb columns) of the packed layout v from B[K, N] (b(k, n) = src[k * ld + n], or
// src[n * ld + k] when trans), padding zeroed. Full pairs of rows inside the matrix take the fast
// loops (an interleave of two rows, or a transpose of 32-bit pairs of a transposed B); the edges
// go element by element.
void pack_vnni_block(const VnniLayout& v, const uint16_t* src, int64_t ld, bool trans, int64_t K,
                     int64_t N, int64_t j, uint16_t* dst) {
  const int64_t n0 = j * v.nb, kstep = 2 * v.kb;
  const bool full_n = n0 + v.nb <= N;
  for (int64_t k0 = 0; k0 < v.Kp; k0 += kstep) {
    uint16_t* out = dst + (k0 / kstep) * v.sk + j * v.sn;
    auto* out32 = reinterpret_cast<uint32_t*>(out);  // 64-byte aligned buffer, even offsets
    if (full_n && k0 + kstep <= K) {
      if (!trans) {
        for (int64_t p = 0; p < v.kb; ++p) {
          const uint16_t* r0 = src + (k0 + 2 * p) * ld + n0;
          zip16(r0, r0 + ld, out32 + p * v.nb, v.nb);
        }
      } else if (have_avx512() && v.kb == 16 && v.nb % 16 == 0) {
        // Rows n of the stored [N, K] matrix hold 16 pairs each here: 16 x 16 transposes.
        for (int64_t q = 0; q < v.nb; q += 16)
          transpose16x16_u32(reinterpret_cast<const char*>(src + (n0 + q) * ld + k0), ld * 2,
                             reinterpret_cast<char*>(out32 + q), v.nb * 4);
      } else {
        for (int64_t n = 0; n < v.nb; ++n) {
          const uint16_t* row = src + (n0 + n) * ld + k0;
          for (int64_t p = 0; p < v.kb; ++p) out32[p * v.nb + n] = load32(row + 2 * p);
        }
      }
      continue;
    }
    for (int64_t p = 0; p < v.kb; ++p)
      for (int64_t n = 0; n < v.nb; ++n)
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t k = k0 + 2 * p + h, c = n0 + n;
          out[(p * v.nb + n) * 2 + h] =
              k < K && c < N ? (trans ? src[c * ld + k] : src[k * ld + c]) : uint16_t{0};
        }
  }
}

// dst[cols, rows] = the transpose of the 16-bit rows x cols matrix src (ld): blocks of 32 rows x
// 64 columns go through a 4 KiB tile of 32-bit pairs (two source rows interleaved, a vectorised
// zip), whose 32-bit transpose gives each destination row's 32 elements in order; the edges go
// element by element. oneDNN 2.6's reorder did these copies at about 2 GB/s (ONEDNN_VERBOSE, AMX
// VM); together with the packing that was a sixth of a GPT-2 step (per-op timing).
void transpose(int64_t rows, int64_t cols, const uint16_t* src, int64_t ld, uint16_t* dst) {
  constexpr int64_t kR = 32, kC = 64;
  alignas(64) uint32_t tile[kR / 2][kC];
  for (int64_t r0 = 0; r0 < rows; r0 += kR) {
    for (int64_t c0 = 0; c0 < cols; c0 += kC) {
      if (r0 + kR > rows || c0 + kC > cols) {
        const int64_t r1 = std::min(rows, r0 + kR), c1 = std::min(cols, c0 + kC);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * ld + c];
        continue;
      }
      for (int64_t p = 0; p < kR / 2; ++p) {
        const uint16_t* a = src + (r0 + 2 * p) * ld + c0;
        zip16(a, a + ld, tile[p], kC);
      }
      if (have_avx512()) {
        for (int64_t q = 0; q < kC; q += 16)
          transpose16x16_u32(reinterpret_cast<const char*>(&tile[0][q]), kC * 4,
                             reinterpret_cast<char*>(dst + (c0 + q) * rows + r0), rows * 2);
        continue;
      }
      for (int64_t c = 0; c < kC; ++c) {
        uint32_t row[kR / 2];
        for (int64_t p = 0; p < kR / 2; ++p) row[p] = tile[p][c];
        std::memcpy(dst + (c0 + c) * rows + r0, row, sizeof row);
      }
    }
  }
}

void transpose32(int64_t rows, int64_t cols, const void* src, int64_t ld, void* dst, int64_t ldd) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const bool vec = have_avx512();
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      if (vec && r0 + 16 <= rows && c0 + 16 <= cols) {
        transpose16x16_u32(s + (r0 * ld + c0) * 4, ld * 4, d + (c0 * ldd + r0) * 4, ldd * 4);
        continue;
      }
      const int64_t r1 = std::min(rows, r0 + 16), c1 = std::min(cols, c0 + 16);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) std::memcpy(d + (c * ldd + r) * 4, s + (r * ld + c) * 4, 4);
    }
  }
}

void zip_rows(int64_t rows, int64_t cols, const uint16_t* src, int64_t ld, uint32_t* dst,
              int64_t ldd) {
  for (int64_t p = 0; p < rows / 2; ++p) {
    const uint16_t* a = src + 2 * p * ld;
    zip16(a, a + ld, dst + p * ldd, cols);
  }
}

bool vector_copies() noexcept { return have_avx512(); }

void use_vector_copies(bool on) noexcept {
  vector_path().store(on && cpu_has_avx512(), std::memory_order_relaxed);
}

}  // namespace zero::models::cpu::pack16
