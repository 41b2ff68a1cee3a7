// host_adamw: HostAdam (optim/host_adam.hpp) against the memory-bandwidth limit of its own access
// pattern, measured in the same run, interleaved repetition by repetition.
//
// The step is memory-bound, so its limit is what the memory system gives a loop that moves the
// same bytes the same way. The reference kernel is HostAdam's loop with Adam's arithmetic taken
// out: it reads the same streams (p, m, v and the gradient in its dtype) and writes the same
// streams (p, m, v with ordinary stores, the 16-bit copy with streaming stores where HostAdam
// streams it), with the same vector width, alignment peel and software prefetches, on the same
// buffers, with the same threads, task_arena, chunks and partitioner, doing an add or a
// multiply-add per stream. It is timed with and without the prefetches; the faster of the two is
// the limit, ours / limit the ratio. GB/s count bytes_per_param() bytes per parameter for both
// (the copy's streaming stores need no read for ownership, so that count is the real traffic).
//
// For scale, also a plain scalar loop of the formula as usually compiled (-O2 with math errno
// on, so sqrt is not vectorised), one thread, against the one-thread limit.
//
// Sizes: 64M parameters and up are the ones that count (the goal applies there): 16M fp32
// parameters are 448 MiB of traffic, a few times the 105 MiB L3, and are kept for the trend.
//
//   build/bench/host_adamw [--quick]
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/common/report.hpp"
#include "optim/host_adam.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace {

using zero::DType;
using zero::optim::HostAdam;

// The vector path HostAdam runs on this CPU; the limit kernel uses the same.
HostAdam::Simd adam_simd = HostAdam::Simd::portable;

const char* const kUsage =
    "usage: host_adamw [--quick]\n"
    "  HostAdam AdamW step vs the bandwidth limit of its access pattern; JSON on stdout.\n"
    "  --quick: 64M parameters only (under a minute on 2 cores); default: 16M, 64M, 256M.\n";

// ---- buffers ------------------------------------------------------------------------------------
// Each buffer is its own anonymous mapping, every page touched before any timing. Where it starts
// matters on the development machine: when the streams' addresses are equal modulo 2 MiB (what
// separate large page-aligned allocations get when the memory behind them is contiguous, e.g.
// with transparent huge pages), the step loses 35-45% and the trivial kernel ~5% (a conflict in
// the memory system beyond L2: a one-cache-line offset between the streams avoids it, 2 MiB
// apart does not). So, like STREAM's arrays with their OFFSET, buffer k starts k x kStagger
// bytes past a 2 MiB boundary; the full run also measures the aliased layout, for the record.

constexpr size_t kTwoMiB = size_t{2} << 20;
constexpr size_t kStagger = 4096 + 64;  // a page and a cache line

class Mapped {
 public:
  // `bytes` usable bytes starting `offset` bytes past a 2 MiB boundary; huge: ask for
  // transparent huge pages (madvise), which makes physical addresses follow virtual ones mod 2 MiB.
  Mapped(size_t bytes, size_t offset, bool huge) : bytes_(bytes + offset + kTwoMiB) {
    map_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map_ == MAP_FAILED) {
      std::fprintf(stderr, "error: mmap of %zu bytes failed: %s\n", bytes_, std::strerror(errno));
      std::exit(1);
    }
    const uintptr_t base = (reinterpret_cast<uintptr_t>(map_) + kTwoMiB - 1) & ~(kTwoMiB - 1);
    if (huge) madvise(reinterpret_cast<void*>(base), bytes + offset, MADV_HUGEPAGE);
    data_ = reinterpret_cast<char*>(base) + offset;
    std::memset(data_, 0, bytes);
  }
  ~Mapped() { munmap(map_, bytes_); }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  template <class T>
  T* get() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  size_t bytes_;
  void* map_;
  char* data_;
};

// The buffers of one layout: p, m, v, fp32 and 16-bit gradients, the 16-bit copy.
struct Buffers {
  Mapped p, m, v, g32, g16, copy;
  // staggered: buffer k at k x kStagger past 2 MiB; otherwise all at a 2 MiB boundary.
  Buffers(size_t n, bool staggered, bool huge)
      : p(n * 4, 0, huge),
        m(n * 4, staggered ? 1 * kStagger : 0, huge),
        v(n * 4, staggered ? 2 * kStagger : 0, huge),
        g32(n * 4, staggered ? 3 * kStagger : 0, huge),
        g16(n * 2, staggered ? 4 * kStagger : 0, huge),
        copy(n * 2, staggered ? 5 * kStagger : 0, huge) {
    // Gradients in +-[1e-3, 1): no zeros or subnormals anywhere in the state, which would slow
    // the arithmetic (not the memory) down.
    float* g = g32.get<float>();
    float* pp = p.get<float>();
    for (size_t i = 0; i < n; ++i) {
      const float x = 1e-3f + float((i * 2654435761u) % 1000003u) * (1.0f / 1000003.0f);
      g[i] = (i & 1) ? -x : x;
      pp[i] = 0.5f * x;
    }
  }
};

// ---- the bandwidth-limit kernel -----------------------------------------------------------------
// HostAdam's loops with Adam's arithmetic taken out: the same vector width (the path HostAdam
// picked), the same alignment peel, the same loads, the same software prefetches, the same
// stores (ordinary for p, m, v; streaming for the copy where HostAdam streams it). Per element:
// p += k*g, m += k*g, v += k, copy = the top half of p's bits; a 16-bit gradient is widened by a
// shift (its bf16 reading; for fp16 bits that is some other small number, all this needs). It
// runs with and without the prefetches, and the faster is the limit, so our own choice of
// prefetching cannot lower it.

#if defined(__x86_64__) && defined(__GNUC__)
#define ZERO_BENCH_X86 1
#else
#define ZERO_BENCH_X86 0
#endif

inline float widen(float g) { return g; }
inline float widen(uint16_t g) { return std::bit_cast<float>(uint32_t(g) << 16); }

template <class G, bool kCopy>
void limit_scalar(float* p, float* m, float* v, const G* g, uint16_t* c, size_t n, float k) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = widen(g[i]);
    p[i] = p[i] + k * gi;
    m[i] = m[i] + k * gi;
    v[i] = v[i] + k;
    if constexpr (kCopy) c[i] = uint16_t(std::bit_cast<uint32_t>(p[i]) >> 16);
  }
}

#if ZERO_BENCH_X86
template <class T>
inline void prefetch_ahead(const T* base, size_t i) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(base) + (i + HostAdam::kPrefetch) * sizeof(T);
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
}

__attribute__((target("avx512f"))) inline __m512 load16(const float* g) {
  return _mm512_loadu_ps(g);
}
__attribute__((target("avx512f"))) inline __m512 load16(const uint16_t* g) {
  const __m512i u =
      _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, u, 16));
}

template <class G, bool kCopy, bool kPrefetch>
__attribute__((target("avx512f"))) void limit_avx512(float* p, float* m, float* v, const G* g,
                                                     uint16_t* c, size_t n, float k) {
  const size_t misalign = (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 16;
  const size_t head = std::min(n, misalign ? 16 - misalign : 0);
  limit_scalar<G, kCopy>(p, m, v, g, c, head, k);
  const __m512 kv = _mm512_set1_ps(k);
  const bool stream = kCopy && reinterpret_cast<uintptr_t>(c + head) % 32 == 0;
  size_t i = head;
  for (; i + 16 <= n; i += 16) {
    if constexpr (kPrefetch) {
      prefetch_ahead(p, i);
      prefetch_ahead(m, i);
      prefetch_ahead(v, i);
      prefetch_ahead(g, i);
    }
    const __m512 kg = _mm512_mul_ps(kv, load16(g + i));
    const __m512 pi = _mm512_add_ps(_mm512_load_ps(p + i), kg);
    _mm512_store_ps(p + i, pi);
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), kg));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), kv));
    if constexpr (kCopy) {
      const __m256i top = _mm512_maskz_cvtepi32_epi16(
          0xffff, _mm512_maskz_srli_epi32(0xffff, _mm512_castps_si512(pi), 16));
      if (stream)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(c + i), top);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + i), top);
    }
  }
  limit_scalar<G, kCopy>(p + i, m + i, v + i, g + i, kCopy ? c + i : c, n - i, k);
  if constexpr (kCopy) _mm_sfence();
}

__attribute__((target("avx2"))) inline __m256 load8(const float* g) { return _mm256_loadu_ps(g); }
__attribute__((target("avx2"))) inline __m256 load8(const uint16_t* g) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

template <class G, bool kCopy, bool kPrefetch>
__attribute__((target("avx2"))) void limit_avx2(float* p, float* m, float* v, const G* g,
                                                uint16_t* c, size_t n, float k) {
  const size_t misalign = (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 8;
  const size_t head = std::min(n, misalign ? 8 - misalign : 0);
  limit_scalar<G, kCopy>(p, m, v, g, c, head, k);
  const __m256 kv = _mm256_set1_ps(k);
  const bool stream = kCopy && reinterpret_cast<uintptr_t>(c + head) % 16 == 0;
  size_t i = head;
  for (; i + 8 <= n; i += 8) {
    if constexpr (kPrefetch) {
      prefetch_ahead(p, i);
      prefetch_ahead(m, i);
      prefetch_ahead(v, i);
      prefetch_ahead(g, i);
    }
    const __m256 kg = _mm256_mul_ps(kv, load8(g + i));
    const __m256 pi = _mm256_add_ps(_mm256_load_ps(p + i), kg);
    _mm256_store_ps(p + i, pi);
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), kg));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), kv));
    if constexpr (kCopy) {
      const __m256i r = _mm256_srli_epi32(_mm256_castps_si256(pi), 16);
      const __m128i top =
          _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      if (stream)
        _mm_stream_si128(reinterpret_cast<__m128i*>(c + i), top);
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i), top);
    }
  }
  limit_scalar<G, kCopy>(p + i, m + i, v + i, g + i, kCopy ? c + i : c, n - i, k);
  if constexpr (kCopy) _mm_sfence();
}
#endif  // ZERO_BENCH_X86

using LimitFn = void (*)(float*, float*, float*, const void*, uint16_t*, size_t, float);

template <class G, bool kCopy, bool kPrefetch>
void limit_range(float* p, float* m, float* v, const void* g, uint16_t* c, size_t n, float k) {
  const G* gt = static_cast<const G*>(g);
  switch (adam_simd) {
#if ZERO_BENCH_X86
    case HostAdam::Simd::avx512: return limit_avx512<G, kCopy, kPrefetch>(p, m, v, gt, c, n, k);
    case HostAdam::Simd::avx2: return limit_avx2<G, kCopy, kPrefetch>(p, m, v, gt, c, n, k);
#endif
    default: return limit_scalar<G, kCopy>(p, m, v, gt, c, n, k);
  }
}

template <bool kPrefetch>
LimitFn pick_limit(DType grad, bool copy) {
  if (grad == DType::f32)
    return copy ? limit_range<float, true, kPrefetch> : limit_range<float, false, kPrefetch>;
  return copy ? limit_range<uint16_t, true, kPrefetch> : limit_range<uint16_t, false, kPrefetch>;
}

// Runs fn over [0, n) exactly as HostAdam::step does: same arena size, chunks and (default)
// partitioner.
void limit_step(tbb::task_arena& arena, LimitFn fn, float* p, float* m, float* v, const void* g,
                size_t gsize, uint16_t* c, size_t n) {
  const size_t chunk = HostAdam::kChunk;
  const size_t chunks = (n + chunk - 1) / chunk;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, chunks, 1),
                      [&](const tbb::blocked_range<size_t>& r) {
                        for (size_t i = r.begin(); i != r.end(); ++i) {
                          const size_t b = i * chunk, e = std::min(n, b + chunk);
                          fn(p + b, m + b, v + b, static_cast<const char*>(g) + b * gsize,
                             c ? c + b : nullptr, e - b, 1e-7f);
                        }
                      });
  });
}

// ---- the plain loop, as usually compiled --------------------------------------------------------
// The formula of adam.hpp on fp32 gradients, no restrict, no pragmas: this file is built with the
// project's flags (-O2, math errno on), so sqrt stays scalar.
void plain_adamw(const zero::optim::AdamScalars& s, float* param, float* m, float* v,
                 const float* grad, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
    v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    const float denom = std::sqrt(v[i]) * s.inv_sqrt_bc2 + s.eps;
    param[i] = param[i] - s.decay * param[i];
    param[i] = param[i] - s.step_size * m[i] / denom;
  }
}

// ---- timing -------------------------------------------------------------------------------------

// Times the functions in turn, rep by rep (after `warmup` untimed rounds), so the slow drifts
// of a shared machine hit all of them alike. Seconds per call, one Stats per function.
std::vector<zero::bench::Stats> time_interleaved(int warmup, int reps,
                                                 const std::vector<std::function<void()>>& fns) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& f : fns) f();
  std::vector<std::vector<double>> t(fns.size());
  for (int i = 0; i < reps; ++i)
    for (size_t k = 0; k < fns.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[k]();
      t[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<zero::bench::Stats> out;
  for (std::vector<double>& ts : t) {
    std::sort(ts.begin(), ts.end());
    zero::bench::Stats s;
    s.reps = reps;
    s.min = ts.front();
    s.max = ts.back();
    s.median = reps % 2 ? ts[reps / 2] : 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]);
    out.push_back(s);
  }
  return out;
}

struct Variant {
  const char* name;
  DType grad;
  bool copy;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace zero::bench;
  const Options opt = parse_options(argc, argv, kUsage);
  const std::vector<size_t> sizes = opt.quick
                                        ? std::vector<size_t>{64u << 20}
                                        : std::vector<size_t>{16u << 20, 64u << 20, 256u << 20};
  const int reps = opt.quick ? 5 : 7;
  const std::vector<int> thread_counts = {1, 2};
  const Variant variants[] = {
      {"fp32 grads", DType::f32, false},
      {"fp16 grads", DType::f16, false},
      {"bf16 grads", DType::bf16, false},
      {"fp32 grads + bf16 copy", DType::f32, true},
      {"bf16 grads + bf16 copy", DType::bf16, true},
  };
  Report report("host_adamw", argc, argv, opt.quick, 1,
                *std::max_element(thread_counts.begin(), thread_counts.end()));

  const size_t n_max = sizes.back();
  std::fprintf(stderr, "host_adamw: allocating and touching %.1f GiB\n",
               double(n_max) * (4 * 4 + 2 + 2) / double(1u << 30));
  Buffers buf(n_max, /*staggered=*/true, /*huge=*/false);
  adam_simd = HostAdam(1).simd();

  zero::optim::AdamParams hp;
  hp.weight_decay = 0.01f;
  int64_t t = 0;
  auto next_step = [&t] {
    zero::optim::AdamStep s;
    s.step = ++t;
    s.lr = 1e-4f;
    return s;
  };

  // Ours and the limit (with and without prefetches), interleaved, on the first n elements of b.
  auto measure = [&](Buffers& b, size_t n, const Variant& var, int threads,
                     const std::string& layout, bool goal) {
    float *p = b.p.get<float>(), *m = b.m.get<float>(), *v = b.v.get<float>();
    // The 16-bit gradients: the same values as the fp32 ones, rounded.
    if (var.grad != DType::f32)
      zero::convert(b.g32.get<float>(), DType::f32, b.g16.get<void>(), var.grad, n);
    const void* grad = var.grad == DType::f32 ? b.g32.get<void>() : b.g16.get<void>();
    uint16_t* copy = var.copy ? b.copy.get<uint16_t>() : nullptr;
    const size_t gsize = zero::size_of(var.grad);
    const size_t bpp = zero::optim::bytes_per_param(var.grad, var.copy, DType::bf16);
    const LimitFn limit_pf = pick_limit<true>(var.grad, var.copy);
    const LimitFn limit_plain = pick_limit<false>(var.grad, var.copy);
    HostAdam adam(threads);
    tbb::task_arena arena(threads);
    arena.initialize();
    const std::string name = std::string(var.name) + ", " + std::to_string(n >> 20) + "M params, " +
                             std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
                             layout;
    std::fprintf(stderr, "  %s...\n", name.c_str());
    const std::vector<Stats> s = time_interleaved(
        1, reps,
        {[&] { adam.step(hp, next_step(), p, m, v, grad, var.grad, n, copy, DType::bf16); },
         [&] { limit_step(arena, limit_pf, p, m, v, grad, gsize, copy, n); },
         [&] { limit_step(arena, limit_plain, p, m, v, grad, gsize, copy, n); }});
    const Stats ours = rate(double(n), s[0]);
    const Stats lim_pf = rate(double(n), s[1]);
    const Stats lim_plain = rate(double(n), s[2]);
    const Stats& lim = lim_pf.median >= lim_plain.median ? lim_pf : lim_plain;
    Result r;
    r.name = name;
    r.params = {{"n", n},
                {"threads", threads},
                {"grad_dtype", zero::to_string(var.grad)},
                {"copy_dtype", var.copy ? nlohmann::json("bf16") : nlohmann::json(nullptr)},
                {"simd", zero::optim::to_string(adam.simd())},
                {"buffers", layout.empty() ? "staggered (buffer k at k x 4160 B past 2 MiB)"
                                           : "aliased (all at 2 MiB boundaries, THP)"},
                {"bytes_per_param", bpp},
                {"GBps", ours.median * double(bpp) / 1e9},
                {"limit_GBps", lim.median * double(bpp) / 1e9},
                {"limit_min", lim.min},
                {"limit_max", lim.max},
                {"limit_with_prefetch", lim_pf.median},
                {"limit_without_prefetch", lim_plain.median}};
    r.metric = "throughput";
    r.unit = "params/s";
    r.value = ours;
    r.reference_name = "bandwidth limit: same streams (" + std::to_string(bpp) +
                       " B/param), loads, prefetches, store kinds and threads; trivial "
                       "arithmetic (best of with and without prefetch)";
    r.reference_median = lim.median;
    if (goal) r.goal = Goal{"ratio_at_least", 0.95};  // the goal
    report.add(std::move(r));
  };

  for (size_t n : sizes) {
    for (const Variant& var : variants)
      for (int threads : thread_counts) measure(buf, n, var, threads, "", n >= (64u << 20));
    if (n != (64u << 20)) continue;

    // For scale: the plain loop, one thread, fp32 gradients, against the one-thread limit;
    // at 64M only (it is slow, and one size says what it has to say).
    tbb::task_arena arena(1);
    arena.initialize();
    std::fprintf(stderr, "  plain loop, 64M params, 1 thread...\n");
    float *p = buf.p.get<float>(), *m = buf.m.get<float>(), *v = buf.v.get<float>();
    const float* g = buf.g32.get<float>();
    const std::vector<Stats> s = time_interleaved(
        1, reps,
        {[&] { plain_adamw(zero::optim::adam_scalars(hp, next_step()), p, m, v, g, n); },
         [&] { limit_step(arena, pick_limit<true>(DType::f32, false), p, m, v, g, 4, nullptr, n); },
         [&] {
           limit_step(arena, pick_limit<false>(DType::f32, false), p, m, v, g, 4, nullptr, n);
         }});
    const Stats plain = rate(double(n), s[0]);
    const Stats lim = rate(double(n), s[1].median <= s[2].median ? s[1] : s[2]);
    Result r;
    r.name = "plain C++ loop (-O2, math errno on), fp32 grads, 64M params, 1 thread";
    r.params = {{"n", n},
                {"threads", 1},
                {"grad_dtype", "fp32"},
                {"bytes_per_param", 28},
                {"GBps", plain.median * 28 / 1e9},
                {"limit_GBps", lim.median * 28 / 1e9}};
    r.metric = "throughput";
    r.unit = "params/s";
    r.value = plain;
    r.reference_name = "bandwidth limit: same streams (28 B/param), 1 thread, trivial arithmetic";
    r.reference_median = lim.median;
    report.add(std::move(r));
  }

  if (!opt.quick) {
    // For the record: the layout to avoid (see "buffers" above), 64M fp32, both thread counts.
    Buffers aliased(64u << 20, /*staggered=*/false, /*huge=*/true);
    for (int threads : thread_counts)
      measure(aliased, 64u << 20, variants[0], threads, ", buffers aliased mod 2 MiB", false);
  }
  report.print();
  return 0;
}
