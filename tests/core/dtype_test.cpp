// dtype.hpp / dtype.cpp: names, and the fp32 <-> fp16 <-> bf16 conversions, checked exhaustively
// where the domain is 2^16 and at every rounding boundary where it is 2^32.
//
// No tolerances anywhere: every conversion is specified bit for bit (round to nearest even, and
// the NaN rule in dtype.hpp), so every comparison is of bit patterns. The references are built a
// different way from the code under test: values decoded with std::ldexp in double, rounding done
// with std::nearbyint in double, and (where the compiler has it) g++'s _Float16.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "core/dtype.hpp"

using namespace zero;

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// The two 16-bit formats, described by their fields.
struct Format {
  int mant_bits;      // stored mantissa bits: 10 (fp16), 7 (bf16)
  int exp_bits;       // 5, 8
  int bias;           // 15, 127
  uint16_t max_bits;  // largest finite: 0x7bff, 0x7f7f
};
constexpr Format kF16{10, 5, 15, 0x7bff};
constexpr Format kBF16{7, 8, 127, 0x7f7f};

// Reference decode: sign, exponent and mantissa fields, then value = m * 2^e in double.
double decode(const Format& f, uint16_t b) {
  const bool neg = b & 0x8000;
  const int e = (b >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = b & ((1 << f.mant_bits) - 1);
  const int emax = (1 << f.exp_bits) - 1;
  double v;
  if (e == emax) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - f.bias - f.mant_bits);  // subnormal: no implicit bit
  } else {
    v = std::ldexp(double(m + (1 << f.mant_bits)), e - f.bias - f.mant_bits);
  }
  return neg ? -v : v;
}

bool is_nan16(const Format& f, uint16_t b) { return (b & 0x7fff) > (f.max_bits + 1); }

// Reference rounding of a finite float to the format, round to nearest even, in double:
// scale so one ulp of the result is 1, std::nearbyint (ties to even in the default rounding mode,
// which the test asserts), scale back; magnitudes at or above max + ulp/2 become inf.
uint16_t round_ref(const Format& f, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(double(x));
  if (ax == 0) return sign;
  int e;
  std::frexp(ax, &e);  // ax in [2^(e-1), 2^e)
  const int min_ulp_exp = 1 - f.bias - f.mant_bits;
  const int ulp_exp = std::max(e - 1 - f.mant_bits, min_ulp_exp);
  const double r = std::ldexp(std::nearbyint(std::ldexp(ax, -ulp_exp)), ulp_exp);
  const double max = decode(f, f.max_bits);
  if (r > max) return sign | uint16_t(f.max_bits + 1);  // inf
  // r is now exactly a value of the format: find its encoding from its exponent and mantissa.
  if (r == 0) return sign;
  int re;
  const double frac = std::frexp(r, &re);  // r = frac * 2^re, frac in [0.5, 1)
  const int biased = re - 1 + f.bias;
  if (biased <= 0) return sign | uint16_t(std::ldexp(r, -min_ulp_exp));  // subnormal
  const auto mant = uint16_t(std::ldexp(frac, f.mant_bits + 1)) & ((1 << f.mant_bits) - 1);
  return sign | uint16_t(biased << f.mant_bits) | mant;
}

uint16_t to16(const Format& f, float x) {
  return &f == &kF16 ? to_half(x).bits : to_bfloat16(x).bits;
}
float from16(const Format& f, uint16_t b) {
  return &f == &kF16 ? to_float(half::from_bits(b)) : to_float(bfloat16::from_bits(b));
}

// The NaN rule of dtype.hpp, written out per format: quiet, sign kept, leading payload bits kept.
uint32_t nan_to_f32(const Format& f, uint16_t b) {
  const uint32_t m = b & ((1u << f.mant_bits) - 1);
  return (uint32_t(b & 0x8000) << 16) | 0x7fc00000u | (m << (23 - f.mant_bits));
}
uint16_t nan_from_f32(const Format& f, uint32_t u) {
  const uint32_t quiet = 1u << (f.mant_bits - 1);
  const uint32_t exp = ((1u << f.exp_bits) - 1) << f.mant_bits;
  const uint32_t payload = (u & 0x7fffffu) >> (23 - f.mant_bits);
  return uint16_t(((u >> 16) & 0x8000u) | exp | quiet | payload);
}

}  // namespace

TEST_CASE("dtype: names, sizes and parsing") {
  CHECK(size_of(DType::f32) == 4);
  CHECK(size_of(DType::f16) == 2);
  CHECK(size_of(DType::bf16) == 2);
  CHECK(to_string(DType::f32) == "fp32");
  CHECK(to_string(DType::f16) == "fp16");
  CHECK(to_string(DType::bf16) == "bf16");
  for (const char* s : {"fp32", "float32", "float"}) CHECK(parse_dtype(s) == DType::f32);
  for (const char* s : {"fp16", "float16", "half"}) CHECK(parse_dtype(s) == DType::f16);
  for (const char* s : {"bf16", "bfloat16"}) CHECK(parse_dtype(s) == DType::bf16);
  for (const char* s : {"", "FP32", "fp64", "bfloat", "int8", "fp16 "}) CHECK(!parse_dtype(s));
  for (DType t : {DType::f32, DType::f16, DType::bf16}) CHECK(parse_dtype(to_string(t)) == t);

  static_assert(std::is_trivially_copyable_v<half> && sizeof(half) == 2);
  static_assert(std::is_trivially_copyable_v<bfloat16> && sizeof(bfloat16) == 2);
  static_assert(half::from_bits(0x3c00).bits == 0x3c00);
  static_assert(bfloat16::from_bits(0x3f80).bits == 0x3f80);
}

TEST_CASE("dtype: the references run in the default rounding mode") {
  // round_ref relies on std::nearbyint rounding ties to even.
  REQUIRE(std::fegetround() == FE_TONEAREST);
  CHECK(std::nearbyint(2.5) == 2.0);
  CHECK(std::nearbyint(3.5) == 4.0);
}

TEST_CASE("dtype: fp16 and bf16 -> fp32 are exact for all 65536 patterns of each") {
  for (const Format* f : {&kF16, &kBF16}) {
    for (uint32_t i = 0; i < 65536; ++i) {
      const auto b = uint16_t(i);
      const float got = from16(*f, b);
      const double want = decode(*f, b);
      if (is_nan16(*f, b)) {
        // NaNs have no value to compare: both NaN, same sign, and the payload rule.
        CHECK(std::isnan(got));
        CHECK(std::signbit(got) == bool(b & 0x8000));
        CHECK(bits(got) == nan_to_f32(*f, b));
      } else {
        // Every 16-bit value is exactly a float, so the double -> float cast is exact.
        REQUIRE(double(float(want)) == want);
        CHECK(bits(got) == bits(float(want)));
      }
    }
  }
}

TEST_CASE("dtype: every 16-bit value round-trips through fp32") {
  for (const Format* f : {&kF16, &kBF16}) {
    for (uint32_t i = 0; i < 65536; ++i) {
      const auto b = uint16_t(i);
      const uint16_t back = to16(*f, from16(*f, b));
      // A signalling NaN comes back quiet (the rule), everything else unchanged.
      const uint16_t want = is_nan16(*f, b) ? uint16_t(b | (1u << (f->mant_bits - 1))) : b;
      CHECK(back == want);
    }
  }
}

TEST_CASE("dtype: fp32 -> 16-bit: midpoints round to even, their neighbours to the nearer side") {
  // All pairs of adjacent finite values, both signs. The midpoint of two such values needs one
  // bit more than the format (plus, for subnormals, an exponent fp32 has), so it is a float.
  for (const Format* f : {&kF16, &kBF16}) {
    for (uint16_t lo = 0; lo < f->max_bits; ++lo) {
      const uint16_t hi = lo + 1;
      const double mid = (decode(*f, lo) + decode(*f, hi)) / 2;
      const float m = float(mid);
      REQUIRE(double(m) == mid);
      const uint16_t even = (lo & 1) ? hi : lo;
      const float above = std::nextafter(m, std::numeric_limits<float>::infinity());
      const float below = std::nextafter(m, 0.0f);
      for (uint16_t sign : {uint16_t(0), uint16_t(0x8000)}) {
        const float s = sign ? -1.0f : 1.0f;
        CHECK(to16(*f, s * m) == (sign | even));
        CHECK(to16(*f, s * above) == (sign | hi));
        CHECK(to16(*f, s * below) == (sign | lo));
        CHECK(to16(*f, s * float(decode(*f, lo))) == (sign | lo));
      }
    }
  }
}

TEST_CASE("dtype: fp32 -> fp16 overflows to inf exactly at 65520") {
  CHECK(to_half(65504.0f).bits == 0x7bff);                           // largest finite stays
  CHECK(to_half(65519.99f).bits == 0x7bff);                          // just under max + ulp/2
  CHECK(to_half(std::nextafter(65520.0f, 0.0f)).bits == 0x7bff);
  CHECK(to_half(65520.0f).bits == 0x7c00);                           // the tie goes to inf
  CHECK(to_half(-65520.0f).bits == 0xfc00);
  CHECK(to_half(-65519.99f).bits == 0xfbff);
  CHECK(to_half(65536.0f).bits == 0x7c00);
  CHECK(to_half(std::numeric_limits<float>::max()).bits == 0x7c00);
  CHECK(to_half(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(to_half(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(to_float(half::from_bits(0x7c00)) == std::numeric_limits<float>::infinity());
  CHECK(to_float(half::from_bits(0xfc00)) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("dtype: fp32 -> bf16 overflows to inf exactly at the largest bf16 + half an ulp") {
  const float max = from_bits(0x7f7f0000);  // 0x1.fep127, the largest bf16
  const float tie = from_bits(0x7f7f8000);  // 0x1.ffp127, halfway to 2^128
  CHECK(to_bfloat16(max).bits == 0x7f7f);
  CHECK(to_bfloat16(std::nextafter(tie, 0.0f)).bits == 0x7f7f);
  CHECK(to_bfloat16(tie).bits == 0x7f80);  // the tie goes to inf (0x7f80 is even)
  CHECK(to_bfloat16(-tie).bits == 0xff80);
  CHECK(to_bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(to_bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(to_bfloat16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
}

TEST_CASE("dtype: subnormals are produced and read exactly") {
  SECTION("fp16") {
    const float ulp = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
    CHECK(to_half(ulp).bits == 0x0001);
    CHECK(to_half(-ulp).bits == 0x8001);
    CHECK(to_half(ulp / 2).bits == 0x0000);                             // tie: to even (zero)
    CHECK(to_half(-ulp / 2).bits == 0x8000);                            // ... keeping the sign
    CHECK(to_half(std::nextafter(ulp / 2, 1.0f)).bits == 0x0001);
    CHECK(to_half(std::nextafter(ulp / 2, 0.0f)).bits == 0x0000);
    CHECK(to_half(1.5f * ulp).bits == 0x0002);                          // tie: to even
    CHECK(to_half(2.5f * ulp).bits == 0x0002);                          // tie: to even
    CHECK(to_half(1023 * ulp).bits == 0x03ff);                          // largest subnormal
    CHECK(to_half(1023.5f * ulp).bits == 0x0400);                       // rounds up to normal
    CHECK(to_half(std::nextafter(1023.5f * ulp, 0.0f)).bits == 0x03ff);
    CHECK(to_half(std::ldexp(1.0f, -14)).bits == 0x0400);               // smallest normal
    CHECK(to_float(half::from_bits(0x0001)) == ulp);
    CHECK(to_float(half::from_bits(0x03ff)) == 1023 * ulp);
    // fp32 subnormals are far below fp16's range: they round to zero of the same sign.
    CHECK(to_half(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    CHECK(to_half(-std::numeric_limits<float>::denorm_min()).bits == 0x8000);
    CHECK(to_half(from_bits(0x007fffff)).bits == 0x0000);
  }
  SECTION("bf16") {
    // bf16 shares fp32's exponent range: fp32 subnormals round to bf16 subnormals.
    CHECK(to_bfloat16(from_bits(0x00010000)).bits == 0x0001);  // smallest bf16 subnormal
    CHECK(to_bfloat16(from_bits(0x80010000)).bits == 0x8001);
    CHECK(to_bfloat16(from_bits(0x00008000)).bits == 0x0000);  // tie: to even (zero)
    CHECK(to_bfloat16(from_bits(0x00008001)).bits == 0x0001);
    CHECK(to_bfloat16(from_bits(0x00018000)).bits == 0x0002);  // tie: to even
    CHECK(to_bfloat16(from_bits(0x00000001)).bits == 0x0000);  // fp32 denorm_min
    CHECK(to_bfloat16(from_bits(0x007f8000)).bits == 0x0080);  // rounds up to the smallest normal
    CHECK(to_bfloat16(from_bits(0x007f7fff)).bits == 0x007f);  // largest subnormal
    CHECK(bits(to_float(bfloat16::from_bits(0x0001))) == 0x00010000u);
    CHECK(bits(to_float(bfloat16::from_bits(0x807f))) == 0x807f0000u);
  }
}

TEST_CASE("dtype: signed zeros are preserved") {
  CHECK(to_half(0.0f).bits == 0x0000);
  CHECK(to_half(-0.0f).bits == 0x8000);
  CHECK(to_bfloat16(0.0f).bits == 0x0000);
  CHECK(to_bfloat16(-0.0f).bits == 0x8000);
  CHECK(bits(to_float(half::from_bits(0x8000))) == 0x80000000u);
  CHECK(bits(to_float(bfloat16::from_bits(0x8000))) == 0x80000000u);
  CHECK(bits(to_float(half::from_bits(0x0000))) == 0u);
  CHECK(bits(to_float(bfloat16::from_bits(0x0000))) == 0u);
}

TEST_CASE("dtype: NaN: stays NaN, keeps its sign and leading payload, becomes quiet") {
  SECTION("spot checks") {
    // Signalling NaNs whose payload lies only in bits the 16-bit formats drop: without the
    // quiet bit they would turn into inf.
    CHECK(to_half(from_bits(0x7f800001)).bits == 0x7e00);
    CHECK(to_half(from_bits(0xff800001)).bits == 0xfe00);
    CHECK(to_bfloat16(from_bits(0x7f800001)).bits == 0x7fc0);
    CHECK(to_bfloat16(from_bits(0xff800001)).bits == 0xffc0);
    // Leading payload bits survive; the all-ones payload does not carry into anything.
    CHECK(to_half(from_bits(0x7fa00001)).bits == 0x7f00);
    CHECK(to_bfloat16(from_bits(0x7fa00001)).bits == 0x7fe0);
    CHECK(to_half(from_bits(0x7fffffff)).bits == 0x7fff);
    CHECK(to_bfloat16(from_bits(0x7fffffff)).bits == 0x7fff);
    CHECK(to_bfloat16(from_bits(0xffffffff)).bits == 0xffff);
    // The default quiet NaN maps to the default quiet NaN.
    CHECK(to_half(std::numeric_limits<float>::quiet_NaN()).bits == 0x7e00);
    CHECK(to_bfloat16(std::numeric_limits<float>::quiet_NaN()).bits == 0x7fc0);
    // Widening quiets a signalling NaN too.
    CHECK(bits(to_float(half::from_bits(0x7c01))) == 0x7fc02000u);
    CHECK(bits(to_float(half::from_bits(0xfd01))) == 0xffe02000u);
    CHECK(bits(to_float(bfloat16::from_bits(0x7f81))) == 0x7fc10000u);
    // fp16 <-> bf16 (through fp32) keeps the rule: sign, leading payload, quiet.
    CHECK(to_bfloat16(half::from_bits(0xfc01)).bits == 0xffc0);
    // (bf16's 7 payload bits land in fp16's top 7 mantissa bits, below fp16's quiet bit.)
    CHECK(to_half(bfloat16::from_bits(0x7f81)).bits == 0x7e08);
    CHECK(to_half(bfloat16::from_bits(0xffff)).bits == 0xfff8);
  }
  SECTION("every fp32 NaN") {
    // 2 x (2^23 - 1) patterns; checked against the rule written out in nan_from_f32().
    long bad_f16 = 0, bad_bf16 = 0;
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (uint32_t m = 1; m < (1u << 23); ++m) {
        const uint32_t u = sign | 0x7f800000u | m;
        bad_f16 += to_half(from_bits(u)).bits != nan_from_f32(kF16, u);
        bad_bf16 += to_bfloat16(from_bits(u)).bits != nan_from_f32(kBF16, u);
      }
    }
    CHECK(bad_f16 == 0);
    CHECK(bad_bf16 == 0);
  }
}

TEST_CASE("dtype: fp32 -> 16-bit matches a rounding reference in double on random floats") {
  // Half the samples are uniformly random bit patterns (every exponent, NaN and inf included);
  // the other half have exponents near the 16-bit formats' ranges, where the rounding work is.
  std::mt19937 rng(20240611);  // fixed seed: the same samples every run
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> near_exp(127 - 28, 127 + 17);  // 2^-28 .. 2^17
  long bad_f16 = 0, bad_bf16 = 0;
  for (int i = 0; i < 4'000'000; ++i) {
    uint32_t u = any(rng);
    if (i % 2) u = (u & 0x807fffffu) | (near_exp(rng) << 23);
    const float x = from_bits(u);
    uint16_t want_f16, want_bf16;
    if (std::isnan(x)) {
      want_f16 = nan_from_f32(kF16, u);
      want_bf16 = nan_from_f32(kBF16, u);
    } else if (std::isinf(x)) {
      want_f16 = uint16_t(((u >> 16) & 0x8000) | 0x7c00);
      want_bf16 = uint16_t(u >> 16);
    } else {
      want_f16 = round_ref(kF16, x);
      want_bf16 = round_ref(kBF16, x);
    }
    bad_f16 += to_half(x).bits != want_f16;
    bad_bf16 += to_bfloat16(x).bits != want_bf16;
  }
  CHECK(bad_f16 == 0);
  CHECK(bad_bf16 == 0);
}

#if defined(__FLT16_MANT_DIG__)
// g++ provides _Float16 on x86-64 (through F16C or libgcc's soft-float): an IEEE binary16 whose
// conversions round to nearest even and keep NaN sign and payload, setting the quiet bit, which
// is exactly dtype.hpp's rule, so it is compared bit for bit, NaNs included.
__extension__ typedef _Float16 Float16;

TEST_CASE("dtype: fp16 conversions agree with the compiler's _Float16") {
  SECTION("all 65536 halves to fp32") {
    long bad = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const auto b = uint16_t(i);
      const float want = float(std::bit_cast<Float16>(b));
      bad += bits(to_float(half::from_bits(b))) != bits(want);
    }
    CHECK(bad == 0);
  }
  SECTION("random floats to fp16") {
    std::mt19937 rng(7);  // fixed seed
    std::uniform_int_distribution<uint32_t> any;
    std::uniform_int_distribution<uint32_t> near_exp(127 - 28, 127 + 17);
    long bad = 0;
    for (int i = 0; i < 4'000'000; ++i) {
      uint32_t u = any(rng);
      if (i % 2) u = (u & 0x807fffffu) | (near_exp(rng) << 23);
      const float x = from_bits(u);
      bad += to_half(x).bits != std::bit_cast<uint16_t>(Float16(x));
    }
    CHECK(bad == 0);
  }
}
#else
TEST_CASE("dtype: fp16 conversions agree with the compiler's _Float16") {
  SKIP("this compiler has no _Float16; the ldexp/nearbyint references still run");
}
#endif

TEST_CASE("dtype: convert() handles all 9 type pairs, any length, any element alignment") {
  // Sources: fp32 = specials then random bit patterns; fp16/bf16 = every pattern. Each pair is
  // checked against the scalar functions element by element, for lengths around the 16-element
  // blocks of the bulk loop, from a source offset of 0 or 1 element, with guards after the end.
  std::mt19937 rng(99);  // fixed seed
  std::uniform_int_distribution<uint32_t> any;
  std::vector<uint32_t> f32 = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7f800001,
                               0xffc00000, 0x477ff000, 0x477fefff, 0x33000000, 0x7f7f8000,
                               0x00008000, 0x3f800000};
  while (f32.size() < 70000) f32.push_back(any(rng));
  std::vector<uint16_t> all16(65536 + 16);
  for (size_t i = 0; i < all16.size(); ++i) all16[i] = uint16_t(i);

  const auto src_of = [&](DType t) -> const void* {
    return t == DType::f32 ? static_cast<const void*>(f32.data()) : all16.data();
  };
  // Expected element i of converting src (type s) to type d, through the scalar functions.
  const auto expect = [&](DType s, DType d, const uint8_t* src, size_t i) -> uint32_t {
    uint32_t in = 0;
    std::memcpy(&in, src + i * size_of(s), size_of(s));
    if (s == d) return in;  // a plain copy: even a signalling NaN stays as it is
    const auto h = half::from_bits(uint16_t(in));
    const auto b = bfloat16::from_bits(uint16_t(in));
    if (s == DType::f32) return d == DType::f16 ? to_half(from_bits(in)).bits
                                                : to_bfloat16(from_bits(in)).bits;
    if (d == DType::f32) return bits(s == DType::f16 ? to_float(h) : to_float(b));
    return s == DType::f16 ? to_bfloat16(h).bits : to_half(b).bits;
  };

  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  const size_t lengths[] = {1, 2, 15, 16, 17, 31, 33, 1001, 65536};
  constexpr size_t kGuard = 8;
  for (DType s : types) {
    for (DType d : types) {
      for (size_t n : lengths) {
        for (size_t offset : {size_t(0), size_t(1)}) {
          INFO(to_string(s) << " -> " << to_string(d) << ", n = " << n << ", offset " << offset);
          const auto* src = static_cast<const uint8_t*>(src_of(s)) + offset * size_of(s);
          std::vector<uint8_t> dst((n + 1 + kGuard) * size_of(d), 0xa5);
          uint8_t* out = dst.data() + offset * size_of(d);
          convert(src, s, out, d, n);
          long bad = 0;
          for (size_t i = 0; i < n; ++i) {
            uint32_t got = 0;
            std::memcpy(&got, out + i * size_of(d), size_of(d));
            bad += got != expect(s, d, src, i);
          }
          CHECK(bad == 0);
          for (size_t i = n * size_of(d); i < (n + kGuard) * size_of(d); ++i)
            REQUIRE(out[i] == 0xa5);  // nothing written past the end
        }
      }
      // n = 0 touches nothing, even through null pointers.
      convert(nullptr, s, nullptr, d, 0);
    }
  }
}

TEST_CASE("dtype: convert() output matches the scalar functions on whole buffers") {
  // The bulk path (vectorised blocks) on a long buffer of every fp16 / bf16 pattern, and the
  // fp32 -> 16-bit direction on every float that is a 16-bit value or a midpoint of two.
  std::vector<uint16_t> all16(65536);
  for (size_t i = 0; i < all16.size(); ++i) all16[i] = uint16_t(i);
  std::vector<float> wide(65536);
  std::vector<uint16_t> narrow(65536);
  for (const Format* f : {&kF16, &kBF16}) {
    const DType t = f == &kF16 ? DType::f16 : DType::bf16;
    convert(all16.data(), t, wide.data(), DType::f32, all16.size());
    long bad = 0;
    for (uint32_t i = 0; i < 65536; ++i) bad += bits(wide[i]) != bits(from16(*f, uint16_t(i)));
    CHECK(bad == 0);

    std::vector<float> mids;
    for (uint16_t lo = 0; lo < f->max_bits; ++lo) {
      const double a = decode(*f, lo), b = decode(*f, uint16_t(lo + 1));
      mids.push_back(float((a + b) / 2));
      mids.push_back(-float((a + b) / 2));
    }
    narrow.resize(mids.size());
    convert(mids.data(), DType::f32, narrow.data(), t, mids.size());
    bad = 0;
    for (size_t i = 0; i < mids.size(); ++i) bad += narrow[i] != to16(*f, mids[i]);
    CHECK(bad == 0);
  }
}

TEST_CASE("dtype: accumulate_widened adds each element widened exactly, once, to the fp32 sum") {
  // Lengths around the stack block (1024) and the vector block (16), every source type; the
  // reference widens with from16 and adds in float. Past n nothing is touched.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (const DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (const size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{1023}, size_t{1024},
                           size_t{1025}, size_t{3000}}) {
      std::vector<float> src(n), acc(n + 4), ref(n + 4);
      std::vector<unsigned char> x(n * size_of(t) + 1);
      for (size_t i = 0; i < n; ++i) src[i] = u(rng);
      convert(src.data(), DType::f32, x.data(), t, n);
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = ref[i] = u(rng);
      for (size_t i = 0; i < n; ++i) {
        float w;
        if (t == DType::f32) {
          std::memcpy(&w, x.data() + 4 * i, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, x.data() + 2 * i, 2);
          w = from16(t == DType::f16 ? kF16 : kBF16, h);
        }
        ref[i] += w;
      }
      accumulate_widened(acc.data(), x.data(), t, n);
      long bad = 0;
      for (size_t i = 0; i < acc.size(); ++i) bad += bits(acc[i]) != bits(ref[i]);
      CHECK(bad == 0);
    }
  }
}
