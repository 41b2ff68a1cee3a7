// Element types of tensors and buffers: fp32, fp16 (IEEE binary16) and bf16 (bfloat16), their
// 2-byte storage types, and exact conversions between them.
//
// Conversion rules (identical on host and device: cuda/dtype_convert.cu calls these very
// functions, so the two cannot drift apart):
//   - Widening (fp16/bf16 -> fp32) is exact. Narrowing (fp32 -> fp16/bf16, and fp16 <-> bf16,
//     which goes through the exact fp32 value) rounds to nearest, ties to even.
//   - Branch-free bit code, vectorisable by g++ -O2. Its one inexact floating-point step (fp32 ->
//     fp16 subnormals) assumes the host's default rounding mode, round to nearest; no result
//     depends on flush-to-zero / denormals-are-zero settings.
//   - fp16: subnormals are produced and read exactly; a magnitude >= 65520 (= 65504 + half an
//     ulp) becomes inf, anything below rounds to at most 65504.
//   - bf16: same exponent range as fp32; fp32 subnormals round to bf16 subnormals, a magnitude
//     >= 0x1.ffp127 (largest bf16 + half an ulp) becomes inf.
//   - Signed zeros and +-inf are preserved.
//   - NaN rule: a NaN stays a NaN with the same sign; its payload keeps as many of its leading
//     bits as fit (narrowing drops trailing payload bits, widening appends zeros), and the result
//     is always quiet (the top mantissa bit is set), so a NaN can never turn into inf. fp32 NaN
//     0x7fa00001 -> fp16 0x7f00, bf16 0x7fe0; fp16 0xfd01 -> fp32 0xffe02000. This is what
//     IEEE 754 recommends and what g++'s _Float16 and x86 F16C do. CUDA's __float2half_rn and
//     __float2bfloat16_rn differ (cuda_fp16.hpp / cuda_bf16.hpp map every NaN to the canonical
//     0x7fff, sign dropped), which is why the device code uses the functions here instead.
//   - convert() between equal types is a plain copy: a signalling NaN stays signalling.
//
// Thread-safety: everything here is a pure function.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#if defined(__CUDACC__)
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

namespace zero {

enum class DType : uint8_t { f32, f16, bf16 };

// Bytes per element.
constexpr size_t size_of(DType t) noexcept { return t == DType::f32 ? 4 : 2; }

// "fp32", "fp16", "bf16": the names the config and logs use.
constexpr std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

// Accepts fp32/float32/float, fp16/float16/half, bf16/bfloat16 (lower case); nullopt otherwise.
std::optional<DType> parse_dtype(std::string_view s) noexcept;

// Storage types: 2 bytes, trivially copyable, no arithmetic. The bits are the IEEE binary16 /
// bfloat16 encoding. (Inside namespace zero; CUDA's global ::half is a different type.)
struct half {
  uint16_t bits;
  static constexpr half from_bits(uint16_t b) noexcept { return half{b}; }
};
struct bfloat16 {
  uint16_t bits;
  static constexpr bfloat16 from_bits(uint16_t b) noexcept { return bfloat16{b}; }
};
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

namespace detail {

ZERO_HOST_DEVICE inline uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}

ZERO_HOST_DEVICE inline float bits_float(uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

// c ? a : b, written with masks. A ?: chain whose arms hold a floating-point add becomes a branch
// in g++ (it will not speculate an operation that may raise a floating-point flag), and a
// branch stops the vectoriser; masks keep every arm unconditional.
ZERO_HOST_DEVICE inline uint32_t select_bits(bool c, uint32_t a, uint32_t b) noexcept {
  const uint32_t m = 0u - uint32_t(c);
  return (m & a) | (~m & b);
}

// Encodings, written as integers so both sides of the conversions below read alike.
inline constexpr uint32_t kF32AbsMask = 0x7fffffffu;
inline constexpr uint32_t kF32Inf = 0x7f800000u;
inline constexpr uint32_t kF32Quiet = 0x00400000u;
inline constexpr uint32_t kF16Inf = 0x7c00u;
inline constexpr uint32_t kF16Quiet = 0x0200u;
// fp32 bit patterns of the fp16 boundaries: 2^-14 (smallest normal) and 65520 (rounds to inf).
inline constexpr uint32_t kF32OfF16MinNormal = 0x38800000u;
inline constexpr uint32_t kF32OfF16Overflow = 0x477ff000u;

// The conversions, on bit patterns (fp32 bits in a uint32_t, 16-bit values in the low half), so
// fp16 <-> bf16 can chain them without a trip through a float register.

// fp16 -> fp32: exact (NaN: quiet, same sign, payload shifted into the top mantissa bits).
ZERO_HOST_DEVICE inline uint32_t f16_to_f32_bits(uint32_t h) noexcept {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;  // exponent and mantissa
  const int32_t sem = int32_t(em);  // signed compares vectorise on SSE2
  // Normal: move into place and rebias the exponent by 127 - 15 = 112.
  const uint32_t normal = (em << 13) + (112u << 23);
  // Inf/NaN: exponent all ones; a NaN gets its quiet bit.
  const uint32_t special =
      kF32Inf | (em & 0x3ffu) << 13 | select_bits(sem > int32_t(kF16Inf), kF32Quiet, 0u);
  // Subnormal (and zero): value = m * 2^-24. Putting m into the mantissa of 2^-14 gives
  // 2^-14 + m * 2^-24, and subtracting 2^-14 is exact (every result is a normal fp32 or +0), so
  // neither the rounding mode nor flush-to-zero can change it.
  const float sub = bits_float(kF32OfF16MinNormal | (em << 13)) - bits_float(kF32OfF16MinNormal);
  return sign | select_bits(sem >= int32_t(kF16Inf), special,
                            select_bits(sem >= 0x0400, normal, float_bits(sub)));
}

// bf16 -> fp32: exact (a bf16 is the top half of an fp32; a NaN gets its quiet bit).
ZERO_HOST_DEVICE inline uint32_t bf16_to_f32_bits(uint32_t b) noexcept {
  const uint32_t u = b << 16;
  return u | select_bits(int32_t(u & kF32AbsMask) > int32_t(kF32Inf), kF32Quiet, 0u);
}

// fp32 -> fp16, round to nearest even. Branch-free: every case is computed, one is selected, and
// the result is built 13 bits up and shifted down once at the end, so the vectorised loop narrows
// to 16 bits only once.
ZERO_HOST_DEVICE inline uint32_t f32_bits_to_f16(uint32_t u) noexcept {
  const uint32_t a = u & kF32AbsMask;
  const int32_t sa = int32_t(a);  // signed compares vectorise on SSE2
  const bool big = sa >= int32_t(kF32OfF16Overflow);
  const bool normal = !big && sa >= int32_t(kF32OfF16MinNormal);
  // Normal result: rebias the exponent (127 - 15 = 112); adding 0xfff plus the kept lsb before
  // dropping 13 mantissa bits rounds to nearest even, and a carry out of the mantissa correctly
  // bumps the exponent (at most to 0x7bff here: 65520 and up took the `big` case).
  const uint32_t rebiased = a - (112u << 23);
  const uint32_t round = select_bits(normal, 0x0fffu + ((rebiased >> 13) & 1u), 0u);
  // Subnormal result (|f| < 2^-14, possibly rounding up to the smallest normal 0x0400): the fp32
  // ulp of 0.5 is 2^-24, the fp16 subnormal ulp, so the hardware's round-to-nearest-even addition
  // |f| + 0.5 leaves the rounded fp16 bits in the low mantissa. Needs the default rounding mode
  // (the device forces it with __fadd_rn); fp32 subnormal inputs round to zero anyway, so
  // flush-to-zero / denormals-are-zero do not change the result.
#if defined(__CUDA_ARCH__)
  const float biased = __fadd_rn(bits_float(a), 0.5f);
#else
  const float biased = bits_float(a) + 0.5f;
#endif
  const uint32_t sub = (float_bits(biased) - float_bits(0.5f)) << 13;
  // Overflow to inf; a NaN keeps its leading payload bits and becomes quiet.
  const uint32_t nan = ((kF16Inf | kF16Quiet) << 13) | (a & 0x007fe000u);
  const uint32_t special = select_bits(sa > int32_t(kF32Inf), nan, kF16Inf << 13);
  const uint32_t sign = (u >> 3) & (0x8000u << 13);
  const uint32_t mag = select_bits(big, special, select_bits(normal, rebiased, sub));
  return ((sign | mag) + round) >> 13;
}

// fp32 -> bf16, round to nearest even. Branch-free.
ZERO_HOST_DEVICE inline uint32_t f32_bits_to_bf16(uint32_t u) noexcept {
  const uint32_t nan_mask = 0u - uint32_t(int32_t(u & kF32AbsMask) > int32_t(kF32Inf));
  // Adding 0x7fff plus the kept lsb, then dropping 16 bits, rounds to nearest even; the largest
  // finite values carry into the exponent and become inf, as they should.
  const uint32_t round = (0x7fffu + ((u >> 16) & 1u)) & ~nan_mask;
  // A NaN is not rounded (that could carry its payload into inf), only made quiet.
  const uint32_t quiet = kF32Quiet & nan_mask;
  // One add and one shift for every lane, so the vectorised loop narrows to 16 bits only once.
  return ((u | quiet) + round) >> 16;
}

}  // namespace detail

ZERO_HOST_DEVICE inline float to_float(half h) noexcept {
  return detail::bits_float(detail::f16_to_f32_bits(h.bits));
}
ZERO_HOST_DEVICE inline float to_float(bfloat16 b) noexcept {
  return detail::bits_float(detail::bf16_to_f32_bits(b.bits));
}
ZERO_HOST_DEVICE inline half to_half(float f) noexcept {
  return half{uint16_t(detail::f32_bits_to_f16(detail::float_bits(f)))};
}
ZERO_HOST_DEVICE inline bfloat16 to_bfloat16(float f) noexcept {
  return bfloat16{uint16_t(detail::f32_bits_to_bf16(detail::float_bits(f)))};
}
// fp16 <-> bf16 through the exact fp32 value: rounded once.
ZERO_HOST_DEVICE inline bfloat16 to_bfloat16(half h) noexcept {
  return bfloat16{uint16_t(detail::f32_bits_to_bf16(detail::f16_to_f32_bits(h.bits)))};
}
ZERO_HOST_DEVICE inline half to_half(bfloat16 b) noexcept {
  return half{uint16_t(detail::f32_bits_to_f16(detail::bf16_to_f32_bits(b.bits)))};
}

// Generic forms for kernels templated on the storage type T (float, half or bfloat16):
// to_float(x) widens exactly, from_float<T>(f) rounds once with the rules above.
ZERO_HOST_DEVICE inline float to_float(float f) noexcept { return f; }
template <class T>
ZERO_HOST_DEVICE inline T from_float(float f) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    return to_half(f);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return to_bfloat16(f);
  } else {
    static_assert(std::is_same_v<T, float>, "from_float<T>: T is float, half or bfloat16");
    return f;
  }
}

// Converts n elements from src (of src_type) to dst (of dst_type), with the rules above; the
// same type is a plain copy. The two ranges must not overlap. n = 0 does nothing (the pointers
// may then be null). Runs on the calling thread; no alignment needed beyond the element's.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

// acc[i] = acc[i] + float(x[i]) for i < n: x (of type t) widened exactly, then one fp32
// addition per element, in one vectorised pass. The ranges must not overlap. Runs on the
// calling thread.
void accumulate_widened(float* acc, const void* x, DType t, size_t n);

}  // namespace zero
