#include "runtime/core/dtype.hpp"

#include <cstring>

namespace zero {

std::optional<DType> parse_dtype(std::string_view s) noexcept {
  if (s == "fp32" || s == "float32" || s == "float") return DType::f32;
  if (s == "fp16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  return std::nullopt;
}

namespace {

// g++ -O2 (GCC 12's "very cheap" vectoriser cost model) vectorises only loops whose trip count
// is a known multiple of the vector width and that need no runtime alias checks. So the bulk of
// every conversion runs in fixed blocks of kBlock elements through restrict pointers, and only
// the last n % kBlock elements take the scalar tail.
constexpr size_t kBlock = 16;

template <class Src, class Dst, class Fn>
void convert_loop(const void* src, void* dst, size_t n, Fn fn) {
  const Src* __restrict s = static_cast<const Src*>(src);
  Dst* __restrict d = static_cast<Dst*>(dst);
  const size_t bulk = n - n % kBlock;
  for (size_t i = 0; i < bulk; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) d[i + j] = fn(s[i + j]);
  }
  for (size_t i = bulk; i < n; ++i) d[i] = fn(s[i]);
}

// fp16 <-> bf16: widen a block to fp32 (exact), then narrow it (rounded once), giving the same
// bits as to_bfloat16(half) / to_half(bfloat16). Two loops, because g++ will not vectorise one
// loop that goes 16 -> 32 -> 16 bits with a float operation in the middle.
template <class Src, class Dst, class Widen, class Narrow>
void convert_via_f32(const void* src, void* dst, size_t n, Widen widen, Narrow narrow) {
  const Src* __restrict s = static_cast<const Src*>(src);
  Dst* __restrict d = static_cast<Dst*>(dst);
  const size_t bulk = n - n % kBlock;
  for (size_t i = 0; i < bulk; i += kBlock) {
    float tmp[kBlock];
    for (size_t j = 0; j < kBlock; ++j) tmp[j] = widen(s[i + j]);
    for (size_t j = 0; j < kBlock; ++j) d[i + j] = narrow(tmp[j]);
  }
  for (size_t i = bulk; i < n; ++i) d[i] = narrow(widen(s[i]));
}

}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (n == 0) return;
  if (src_type == dst_type) {
    if (src != dst) std::memcpy(dst, src, n * size_of(src_type));
    return;
  }
  switch (src_type) {
    case DType::f32:
      if (dst_type == DType::f16)
        return convert_loop<float, half>(src, dst, n, [](float x) { return to_half(x); });
      return convert_loop<float, bfloat16>(src, dst, n, [](float x) { return to_bfloat16(x); });
    case DType::f16:
      if (dst_type == DType::f32)
        return convert_loop<half, float>(src, dst, n, [](half x) { return to_float(x); });
      return convert_via_f32<half, bfloat16>(
          src, dst, n, [](half x) { return to_float(x); }, [](float x) { return to_bfloat16(x); });
    case DType::bf16:
      if (dst_type == DType::f32)
        return convert_loop<bfloat16, float>(src, dst, n, [](bfloat16 x) { return to_float(x); });
      return convert_via_f32<bfloat16, half>(
          src, dst, n, [](bfloat16 x) { return to_float(x); }, [](float x) { return to_half(x); });
  }
}

}  // namespace zero
