// HostAdam: the AdamW step on the host (host_adam.hpp), one pass over memory, oneTBB over fixed
// chunks, AVX-512 / AVX2 intrinsics chosen at run time, a portable loop everywhere else.
//
// Every operation below is the fp32 operation of the formula in adam.hpp, in the order written
// there, rounded once. g++ would by default fuse a*b + c into one FMA (one rounding instead of
// two) wherever the target has FMA, intrinsics included (_mm512_mul_ps is a plain vector
// multiply to g++), which would make the AVX-512 path differ from the AVX2 and portable ones in
// the last bit. So this file is compiled with fp-contract=off; the pragma comes before every
// #include so that inline functions from headers get the same options and can be inlined.
#pragma GCC optimize("fp-contract=off")

#include "optim/host_adam.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ZERO_HOST_ADAM_X86 1
#else
#define ZERO_HOST_ADAM_X86 0
#endif

namespace zero::optim {

size_t bytes_per_param(DType grad_dtype, bool copy_out, DType copy_dtype) {
  // read p, m, v, g; write p, m, v (+ the copy)
  return 4 * 3 + size_of(grad_dtype) + 4 * 3 + (copy_out ? size_of(copy_dtype) : 0);
}

const char* to_string(HostAdam::Simd simd) noexcept {
  switch (simd) {
    case HostAdam::Simd::best: return "best";
    case HostAdam::Simd::avx512: return "avx512";
    case HostAdam::Simd::avx2: return "avx2";
    case HostAdam::Simd::portable: return "portable";
  }
  return "?";
}

namespace {

// ---- the portable path: the formula on one element, written as in adam.hpp ----------------------
// Also does the heads and tails of the vector paths, which is why those give identical bits:
// both evaluate the same fp32 operations in the same order.

inline float load_grad(float g) { return g; }
inline float load_grad(half g) { return to_float(g); }
inline float load_grad(bfloat16 g) { return to_float(g); }

struct NoCopy {};  // copy type when there is no 16-bit copy
inline void store_copy(NoCopy*, size_t, float) {}
inline void store_copy(half* c, size_t i, float p) { c[i] = to_half(p); }
inline void store_copy(bfloat16* c, size_t i, float p) { c[i] = to_bfloat16(p); }

// The state one range reads and writes: in place (in == out) or from one buffer into another
// (HostAdam::step_into). Not __restrict: in and out may be the same memory. Nor are grad and copy:
// they may be the same memory too (element i of each at the same address, HostAdam::step_into),
// which is safe because every path reads an element's gradient before it writes its copy.
struct State {
  const float *p_in, *m_in, *v_in;
  float *p, *m, *v;
  State at(size_t i) const { return {p_in + i, m_in + i, v_in + i, p + i, m + i, v + i}; }
};

template <class G, bool kAdamW, class C>
inline void adam_element(const AdamScalars& s, const State& x, const G* grad,
                         C* copy, size_t i) {
  float p = x.p_in[i];
  float g = load_grad(grad[i]) * s.grad_scale;
  if constexpr (!kAdamW) g = g + s.l2 * p;
  const float m = s.beta1 * x.m_in[i] + s.one_minus_beta1 * g;
  const float v = s.beta2 * x.v_in[i] + s.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) * s.inv_sqrt_bc2 + s.eps;
  if constexpr (kAdamW) p = p - s.decay * p;
  p = p - s.step_size * m / denom;
  x.p[i] = p;
  x.m[i] = m;
  x.v[i] = v;
  store_copy(copy, i, p);
}

// One element at a time: this path runs on CPUs without AVX2 and for the heads and tails of the
// vector paths. It stays scalar: g++ will not vectorise std::sqrt unless the whole file is built
// with -fno-math-errno (the "no-math-errno" optimize pragma does not reach the builtin's
// declaration), and an x86-64 CPU without AVX2 and F16C predates 2013.
template <class G, bool kAdamW, class C>
void portable_range(const AdamScalars& s, const State& x, const G* grad,
                    C* copy, size_t n) {
  for (size_t i = 0; i < n; ++i) adam_element<G, kAdamW, C>(s, x, grad, copy, i);
}

#if ZERO_HOST_ADAM_X86

// ---- AVX-512F -----------------------------------------------------------------------------------
// 16 elements per iteration. fp16 goes through vcvtph2ps / vcvtps2ph (round to nearest even),
// which are bit-exact with to_float(half) / to_half (dtype.hpp states both follow IEEE 754 and
// F16C, NaN rule included; the test checks every fp16 pattern). bf16 in is a shift; bf16 out is
// the integer rounding of to_bfloat16. A signalling-NaN bf16 gradient is not made quiet on load
// as to_float does: its first use is an fp32 multiply, which makes it quiet, so the results are
// the same bits.

#define ZERO_AVX512 __attribute__((target("avx512f")))
#define ZERO_AVX2 __attribute__((target("avx2,f16c")))

// Prefetch of element i + kPrefetch of a stream into L1 (no fault past the end of the buffer;
// the address is formed as an integer, so no out-of-range pointer arithmetic either).
template <class T>
inline void prefetch_ahead(const T* base, size_t i) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(base) + (i + HostAdam::kPrefetch) * sizeof(T);
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
}

// g++ 12's unmasked forms of these intrinsics start from _mm512_undefined_*(), which trips
// -Wmaybe-uninitialized (GCC PR105593); the zero-masked forms with every lane selected compile
// to the same instructions.
constexpr __mmask16 kAll = 0xffff;

ZERO_AVX512 inline __m512 load16(const float* g) { return _mm512_loadu_ps(g); }
ZERO_AVX512 inline __m512 load16(const half* g) {
  return _mm512_maskz_cvtph_ps(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
}
ZERO_AVX512 inline __m512 load16(const bfloat16* g) {
  const __m512i u =
      _mm512_maskz_cvtepu16_epi32(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, u, 16));
}

// 16 16-bit values: streamed (c must then be 32-byte aligned) or stored.
ZERO_AVX512 inline void put16(void* c, __m256i x, bool stream) {
  if (stream)
    _mm256_stream_si256(static_cast<__m256i*>(c), x);
  else
    _mm256_storeu_si256(static_cast<__m256i*>(c), x);
}
ZERO_AVX512 inline void store16(NoCopy*, __m512, bool) {}
ZERO_AVX512 inline void store16(half* c, __m512 p, bool stream) {
  put16(c, _mm512_maskz_cvtps_ph(kAll, p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), stream);
}
ZERO_AVX512 inline void store16(bfloat16* c, __m512 p, bool stream) {
  // to_bfloat16: (u + 0x7fff + lsb) >> 16, except a NaN, which becomes (u | quiet) >> 16.
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
  const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  const __m512i r = _mm512_maskz_srli_epi32(kAll, _mm512_mask_blend_epi32(nan, rounded, quiet), 16);
  put16(c, _mm512_maskz_cvtepi32_epi16(kAll, r), stream);
}

template <class G, bool kAdamW, class C>
ZERO_AVX512 void avx512_range(const AdamScalars& s, const State& x, const G* grad,
                              C* copy, size_t n) {
  // Peel to a 64-byte aligned parameter input so its loads never split a cache line (the other
  // streams are usually offset alike: they come from equally aligned buffers).
  const size_t misalign = (reinterpret_cast<uintptr_t>(x.p_in) / sizeof(float)) % 16;
  const size_t head = std::min(n, misalign ? 16 - misalign : 0);
  portable_range<G, kAdamW, C>(s, x, grad, copy, head);

  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale), l2 = _mm512_set1_ps(s.l2);
  const __m512 beta1 = _mm512_set1_ps(s.beta1), omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2), omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 inv_sqrt_bc2 = _mm512_set1_ps(s.inv_sqrt_bc2), eps = _mm512_set1_ps(s.eps);
  const __m512 decay = _mm512_set1_ps(s.decay), step_size = _mm512_set1_ps(s.step_size);
  size_t i = head;
  bool stream = false;  // the copy's stores: streaming where aligned (see host_adam.hpp)
  if constexpr (!std::is_same_v<C, NoCopy>)
    stream = reinterpret_cast<uintptr_t>(copy + head) % 32 == 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(x.p_in, i);
    prefetch_ahead(x.m_in, i);
    prefetch_ahead(x.v_in, i);
    prefetch_ahead(grad, i);
    __m512 p = _mm512_load_ps(x.p_in + i);
    __m512 g = _mm512_mul_ps(load16(grad + i), grad_scale);
    if constexpr (!kAdamW) g = _mm512_add_ps(g, _mm512_mul_ps(l2, p));
    const __m512 m =
        _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(x.m_in + i)), _mm512_mul_ps(omb1, g));
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(x.v_in + i)),
                                   _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom =
        _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_sqrt_ps(kAll, v), inv_sqrt_bc2), eps);
    if constexpr (kAdamW) p = _mm512_sub_ps(p, _mm512_mul_ps(decay, p));
    p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(step_size, m), denom));
    _mm512_storeu_ps(x.p + i, p);
    _mm512_storeu_ps(x.m + i, m);
    _mm512_storeu_ps(x.v + i, v);
    if constexpr (!std::is_same_v<C, NoCopy>) store16(copy + i, p, stream);
  }
  portable_range<G, kAdamW, C>(s, x.at(i), grad + i,
                               std::is_same_v<C, NoCopy> ? copy : copy + i, n - i);
  // Streaming stores are weakly ordered: fence them before the hand-off to whoever reads the
  // copy (step()'s return, through the arena's synchronisation).
  if constexpr (!std::is_same_v<C, NoCopy>) _mm_sfence();
}

// ---- AVX2 + F16C --------------------------------------------------------------------------------
// The same, 8 elements per iteration.

ZERO_AVX2 inline __m256 load8(const float* g) { return _mm256_loadu_ps(g); }
ZERO_AVX2 inline __m256 load8(const half* g) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
}
ZERO_AVX2 inline __m256 load8(const bfloat16* g) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

ZERO_AVX2 inline void put8(void* c, __m128i x, bool stream) {
  if (stream)
    _mm_stream_si128(static_cast<__m128i*>(c), x);
  else
    _mm_storeu_si128(static_cast<__m128i*>(c), x);
}
ZERO_AVX2 inline void store8(NoCopy*, __m256, bool) {}
ZERO_AVX2 inline void store8(half* c, __m256 p, bool stream) {
  put8(c, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), stream);
}
ZERO_AVX2 inline void store8(bfloat16* c, __m256 p, bool stream) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  // Values are 0..0xffff, so the unsigned-saturating pack is a plain narrowing.
  put8(c, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)), stream);
}

template <class G, bool kAdamW, class C>
ZERO_AVX2 void avx2_range(const AdamScalars& s, const State& x, const G* grad,
                          C* copy, size_t n) {
  const size_t misalign = (reinterpret_cast<uintptr_t>(x.p_in) / sizeof(float)) % 8;
  const size_t head = std::min(n, misalign ? 8 - misalign : 0);
  portable_range<G, kAdamW, C>(s, x, grad, copy, head);

  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale), l2 = _mm256_set1_ps(s.l2);
  const __m256 beta1 = _mm256_set1_ps(s.beta1), omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2), omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 inv_sqrt_bc2 = _mm256_set1_ps(s.inv_sqrt_bc2), eps = _mm256_set1_ps(s.eps);
  const __m256 decay = _mm256_set1_ps(s.decay), step_size = _mm256_set1_ps(s.step_size);
  size_t i = head;
  bool stream = false;  // the copy's stores: streaming where aligned (see host_adam.hpp)
  if constexpr (!std::is_same_v<C, NoCopy>)
    stream = reinterpret_cast<uintptr_t>(copy + head) % 16 == 0;
  for (; i + 8 <= n; i += 8) {
    prefetch_ahead(x.p_in, i);
    prefetch_ahead(x.m_in, i);
    prefetch_ahead(x.v_in, i);
    prefetch_ahead(grad, i);
    __m256 p = _mm256_load_ps(x.p_in + i);
    __m256 g = _mm256_mul_ps(load8(grad + i), grad_scale);
    if constexpr (!kAdamW) g = _mm256_add_ps(g, _mm256_mul_ps(l2, p));
    const __m256 m =
        _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(x.m_in + i)), _mm256_mul_ps(omb1, g));
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(x.v_in + i)),
                                   _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), inv_sqrt_bc2), eps);
    if constexpr (kAdamW) p = _mm256_sub_ps(p, _mm256_mul_ps(decay, p));
    p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(step_size, m), denom));
    _mm256_storeu_ps(x.p + i, p);
    _mm256_storeu_ps(x.m + i, m);
    _mm256_storeu_ps(x.v + i, v);
    if constexpr (!std::is_same_v<C, NoCopy>) store8(copy + i, p, stream);
  }
  portable_range<G, kAdamW, C>(s, x.at(i), grad + i,
                               std::is_same_v<C, NoCopy> ? copy : copy + i, n - i);
  if constexpr (!std::is_same_v<C, NoCopy>) _mm_sfence();
}

#endif  // ZERO_HOST_ADAM_X86

// ---- dispatch -----------------------------------------------------------------------------------

using RangeFn = void (*)(const AdamScalars&, const State&, const void*, void*, size_t);

template <HostAdam::Simd kSimd, class G, bool kAdamW, class C>
void range(const AdamScalars& s, const State& x, const void* g, void* c, size_t n) {
  const G* grad = static_cast<const G*>(g);
  C* copy = static_cast<C*>(c);
#if ZERO_HOST_ADAM_X86
  if constexpr (kSimd == HostAdam::Simd::avx512)
    return avx512_range<G, kAdamW, C>(s, x, grad, copy, n);
  if constexpr (kSimd == HostAdam::Simd::avx2)
    return avx2_range<G, kAdamW, C>(s, x, grad, copy, n);
#endif
  portable_range<G, kAdamW, C>(s, x, grad, copy, n);
}

template <HostAdam::Simd kSimd, class G, bool kAdamW>
RangeFn pick_copy(bool copy_out, DType copy_dtype) {
  if (!copy_out) return range<kSimd, G, kAdamW, NoCopy>;
  return copy_dtype == DType::f16 ? range<kSimd, G, kAdamW, half>
                                  : range<kSimd, G, kAdamW, bfloat16>;
}

template <HostAdam::Simd kSimd, bool kAdamW>
RangeFn pick_grad(DType grad_dtype, bool copy_out, DType copy_dtype) {
  switch (grad_dtype) {
    case DType::f32: return pick_copy<kSimd, float, kAdamW>(copy_out, copy_dtype);
    case DType::f16: return pick_copy<kSimd, half, kAdamW>(copy_out, copy_dtype);
    case DType::bf16: return pick_copy<kSimd, bfloat16, kAdamW>(copy_out, copy_dtype);
  }
  return nullptr;
}

template <HostAdam::Simd kSimd>
RangeFn pick_mode(bool adam_w, DType grad_dtype, bool copy_out, DType copy_dtype) {
  return adam_w ? pick_grad<kSimd, true>(grad_dtype, copy_out, copy_dtype)
                : pick_grad<kSimd, false>(grad_dtype, copy_out, copy_dtype);
}

RangeFn pick(HostAdam::Simd simd, bool adam_w, DType grad_dtype, bool copy_out, DType copy_dtype) {
  switch (simd) {
    case HostAdam::Simd::avx512:
      return pick_mode<HostAdam::Simd::avx512>(adam_w, grad_dtype, copy_out, copy_dtype);
    case HostAdam::Simd::avx2:
      return pick_mode<HostAdam::Simd::avx2>(adam_w, grad_dtype, copy_out, copy_dtype);
    default: return pick_mode<HostAdam::Simd::portable>(adam_w, grad_dtype, copy_out, copy_dtype);
  }
}

bool cpu_has(HostAdam::Simd simd) {
#if ZERO_HOST_ADAM_X86
  __builtin_cpu_init();
  switch (simd) {
    case HostAdam::Simd::avx512: return __builtin_cpu_supports("avx512f");
    case HostAdam::Simd::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    default: return true;
  }
#else
  return simd == HostAdam::Simd::portable || simd == HostAdam::Simd::best;
#endif
}

}  // namespace

struct HostAdam::Impl {
  tbb::task_arena arena;
  Simd simd;
  Impl(int threads, Simd s) : arena(threads > 0 ? threads : tbb::task_arena::automatic), simd(s) {}
};

HostAdam::HostAdam(int threads, Simd simd) {
  ZERO_REQUIRE(threads >= 0,
               "HostAdam: threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  if (simd == Simd::best) {
    simd = cpu_has(Simd::avx512) ? Simd::avx512 : cpu_has(Simd::avx2) ? Simd::avx2 : Simd::portable;
  }
  ZERO_REQUIRE(cpu_has(simd), std::string("HostAdam: this CPU cannot run the ") + to_string(simd) +
                                  " path; use Simd::best");
  impl_ = std::make_unique<Impl>(threads, simd);
  impl_->arena.initialize();
}

HostAdam::~HostAdam() = default;

int HostAdam::threads() const { return impl_->arena.max_concurrency(); }

HostAdam::Simd HostAdam::simd() const { return impl_->simd; }

void HostAdam::step(const AdamParams& params, const AdamStep& step, float* param, float* m,
                    float* v, const void* grad, DType grad_dtype, size_t n, void* param_copy,
                    DType copy_dtype) {
  step_into(params, step, param, m, v, param, m, v, grad, grad_dtype, n, param_copy, copy_dtype);
}

void HostAdam::step_into(const AdamParams& params, const AdamStep& step, const float* param_in,
                         const float* m_in, const float* v_in, float* param, float* m, float* v,
                         const void* grad, DType grad_dtype, size_t n, void* param_copy,
                         DType copy_dtype) {
  if (n == 0) return;
  ZERO_REQUIRE(param_in && m_in && v_in && param && m && v && grad,
               "HostAdam::step: param, m, v and grad must not be null");
  ZERO_REQUIRE(!param_copy || copy_dtype != DType::f32,
               "HostAdam::step: the parameter copy must be fp16 or bf16, not fp32");
  const AdamScalars s = adam_scalars(params, step);
  const RangeFn fn =
      pick(impl_->simd, params.adam_w_mode, grad_dtype, param_copy != nullptr, copy_dtype);
  const size_t gsize = size_of(grad_dtype);
  const size_t csize = size_of(copy_dtype);
  const State all{param_in, m_in, v_in, param, m, v};
  auto run = [&](size_t begin, size_t end) {
    fn(s, all.at(begin), static_cast<const char*>(grad) + begin * gsize,
       param_copy ? static_cast<char*>(param_copy) + begin * csize : nullptr, end - begin);
  };
  const size_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks == 1) return run(0, n);  // small: no hand-off to a worker
  impl_->arena.execute([&] {
    // oneTBB's default partitioner: contiguous runs of chunks per thread (long sequential
    // streams for the prefetchers), rebalanced by work stealing when a thread falls behind
    // (another process on its core).
    tbb::parallel_for(tbb::blocked_range<size_t>(0, chunks, 1),
                      [&](const tbb::blocked_range<size_t>& r) {
                        for (size_t c = r.begin(); c != r.end(); ++c)
                          run(c * kChunk, std::min(n, (c + 1) * kChunk));
                      });
  });
}

}  // namespace zero::optim
