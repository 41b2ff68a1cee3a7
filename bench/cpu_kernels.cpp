// cpu_kernels: the cpu backend's fp32 element-wise kernels (models/cpu/elementwise.hpp) against
// the memory bandwidth of plain streaming loops measured in the same run, interleaved repetition
// by repetition; and the page faults a repeated device allocation costs (core/cpu_device.cpp).
//
// Each kernel is memory-bound when it runs at the bandwidth of a loop that moves the same
// streams: GB/s counts the bytes a kernel must read and write once (its inputs and outputs; a
// row's second read from L1/L2 is not counted), the reference is the same count over the time of
// a copy (1 read + 1 write stream), a triad (2 reads + 1 write) or a sum (1 read), whichever has
// the kernel's streams, on the same threads and 16384-element blocks. ratio = ours / reference:
// 1 means the kernel costs no more than moving its bytes. Every kernel also runs on the generic
// path (the compiler's vectorisation for the baseline ISA, which is how kernels.cpp's loops ran
// before) for scale.
//
// Sizes: 48M elements per stream (192 MiB), so every kernel's working set is 384-576 MiB, above
// the 256 MiB this machine's caches could hold (BENCH.md); rows of 512 (layernorm), 8192
// (cross-entropy) and 256 (attention's causal softmax: T x T blocks of 256 x 256).
//
//   build/bench/cpu_kernels [--quick]
#include <sys/resource.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/report.hpp"
#include "core/device.hpp"
#include "models/cpu/elementwise.hpp"

namespace {

namespace ew = zero::models::cpu::elementwise;
using zero::bench::Report;
using zero::bench::Result;
using zero::bench::Stats;

const char* const kUsage =
    "usage: cpu_kernels [--quick]\n"
    "  fp32 element-wise kernels vs streaming-loop bandwidth, and page faults of reused device\n"
    "  memory; JSON on stdout. --quick: 5 repetitions (under a minute on 2 cores); default 9.\n";

constexpr int64_t kBlock = 16384;  // elementwise.cpp's kElemBlock

template <class Fn>
void blocks(int64_t n, const Fn& fn) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
  tbb::parallel_for(int64_t{0}, nb, [&](int64_t b) {
    fn(b * kBlock, std::min(n, (b + 1) * kBlock));
  });
}

// The references: plain loops, vectorised by the compiler, on the same blocks.
void copy_loop(float* y, const float* x, int64_t n) {
  blocks(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = x[i];
  });
}
void triad_loop(float* y, const float* a, const float* b, int64_t n) {
  blocks(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = a[i] + 0.5f * b[i];
  });
}
volatile float g_sink;
void sum_loop(const float* x, int64_t n) {
  std::vector<float> part(static_cast<size_t>((n + kBlock - 1) / kBlock));
  blocks(n, [&](int64_t i0, int64_t i1) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
      s0 += x[i], s1 += x[i + 1], s2 += x[i + 2], s3 += x[i + 3];
      s4 += x[i + 4], s5 += x[i + 5], s6 += x[i + 6], s7 += x[i + 7];
    }
    for (; i < i1; ++i) s0 += x[i];
    part[static_cast<size_t>(i0 / kBlock)] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
  });
  g_sink = part[0];
}

enum class Ref { copy, triad, sum };
const char* ref_name(Ref r) {
  switch (r) {
    case Ref::copy: return "copy loop (1 read + 1 write stream), same threads and blocks";
    case Ref::triad: return "triad loop (2 read + 1 write streams), same threads and blocks";
    case Ref::sum: return "sum loop (1 read stream), same threads and blocks";
  }
  return "";
}

// Ours and the reference interleaved: one warm-up of each, then reps pairs.
std::pair<Stats, Stats> interleaved(int reps, const std::function<void()>& ours,
                                    const std::function<void()>& ref) {
  ours();
  ref();
  std::vector<double> a, b;
  for (int i = 0; i < reps; ++i) {
    double t = zero::bench::now_seconds();
    ours();
    a.push_back(zero::bench::now_seconds() - t);
    t = zero::bench::now_seconds();
    ref();
    b.push_back(zero::bench::now_seconds() - t);
  }
  return {zero::bench::stats_of(a), zero::bench::stats_of(b)};
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace

int main(int argc, char** argv) {
  const zero::bench::Options opt = zero::bench::parse_options(argc, argv, kUsage);
  const int reps = opt.quick ? 5 : 9;
  const int64_t n = int64_t{48} << 20;
  Report report("cpu_kernels", argc, argv, opt.quick, 1,
                tbb::this_task_arena::max_concurrency());
  const ew::Simd best = ew::active();

  std::fprintf(stderr, "cpu_kernels: allocating and touching %.1f GiB\n",
               4.0 * double(n) * 4 / double(1u << 30));
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n)),
      dy(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[i] = float((i * 7919) % 2001) / 250.0f - 4.0f;  // [-4, 4]: logits, GELU inputs
    dy[i] = float((i * 104729) % 2001) / 1000.0f - 1.0f;
  }
  const int64_t C = 512, NC = n / C, V = 8192, NV = n / V, T = 256;
  std::vector<float> w(C, 1.0f), b(C, 0.1f), mean(static_cast<size_t>(NC)),
      rstd(static_cast<size_t>(NC)), dw(C), db(C), losses(static_cast<size_t>(NV));
  std::vector<int32_t> targets(static_cast<size_t>(NV));
  for (int64_t r = 0; r < NV; ++r) targets[r] = int32_t((r * 31) % V);
  ew::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), NC, C);

  struct Kernel {
    const char* name;
    double bytes_per_elem;  // streams read and written once, 4 bytes each
    Ref ref;
    std::function<void()> run;
  };
  float* X = x.data();
  float* Y = y.data();
  float* DY = dy.data();
  float* DX = dx.data();
  // Causal softmax rows: each T x T block's row t has t + 1 entries read and written, T - t - 1
  // zeros written: on average T/2 + 1/2 reads and T writes per row.
  const int64_t rows = n / T;
  const std::vector<Kernel> kernels = {
      {"gelu_forward", 8, Ref::copy, [&] { ew::gelu_forward(Y, X, n); }},
      {"gelu_backward", 12, Ref::triad, [&] { ew::gelu_backward(DX, DY, X, n); }},
      {"add (residual)", 12, Ref::triad, [&] { ew::add(Y, X, DY, n); }},
      {"accumulate (in place)", 12, Ref::triad, [&] { ew::add(DX, DX, DY, n); }},
      {"add_bias (rows of 512)", 8, Ref::copy, [&] { ew::add_bias(Y, b.data(), NC, C); }},
      {"layernorm_forward (rows of 512)", 8, Ref::copy,
       [&] { ew::layernorm_forward(Y, mean.data(), rstd.data(), X, w.data(), b.data(), NC, C); }},
      {"layernorm_backward (rows of 512)", 12, Ref::triad,
       [&] {
         ew::layernorm_backward(DX, dw.data(), db.data(), DY, X, w.data(), mean.data(),
                                rstd.data(), NC, C);
       }},
      {"cross_entropy_forward (rows of 8192)", 4, Ref::sum,
       [&] { ew::cross_entropy_forward(losses.data(), X, targets.data(), NV, V); }},
      {"cross_entropy_backward (rows of 8192)", 8, Ref::copy,
       [&] { ew::cross_entropy_backward(DX, X, targets.data(), NV, V, 1e-3f); }},
      {"softmax_causal_row (T = 256)", 6, Ref::copy,
       [&] {
         tbb::parallel_for(int64_t{0}, rows / 64, [&](int64_t blk) {
           for (int64_t r = blk * 64; r < (blk + 1) * 64; ++r)
             ew::softmax_causal_row(Y + r * T, r % T + 1, T);
         });
       }},
      {"softmax_causal_backward_row (T = 256)", 8, Ref::triad,
       [&] {
         tbb::parallel_for(int64_t{0}, rows / 64, [&](int64_t blk) {
           for (int64_t r = blk * 64; r < (blk + 1) * 64; ++r)
             ew::softmax_causal_backward_row(DX + r * T, Y + r * T, r % T + 1, T);
         });
       }},
  };
  const auto reference = [&](Ref r) -> std::function<void()> {
    switch (r) {
      case Ref::copy: return [&] { copy_loop(DX, X, n); };
      case Ref::triad: return [&] { triad_loop(DX, X, DY, n); };
      case Ref::sum: return [&] { sum_loop(X, n); };
    }
    return {};
  };

  for (ew::Simd simd : {best, ew::Simd::generic}) {
    if (simd == ew::Simd::generic && best == ew::Simd::generic) break;
    ew::use(simd);
    for (const Kernel& k : kernels) {
      const std::string name = std::string(k.name) + ", " + ew::to_string(simd) + ", 48M elements";
      std::fprintf(stderr, "  %s...\n", name.c_str());
      const auto [ours, ref] = interleaved(reps, k.run, reference(k.ref));
      const double bytes = k.bytes_per_elem * double(n);
      const int ref_streams = k.ref == Ref::triad ? 12 : k.ref == Ref::copy ? 8 : 4;
      Result r;
      r.name = name;
      r.params = {{"n", n}, {"simd", ew::to_string(simd)}, {"bytes_per_element", k.bytes_per_elem},
                  {"reference_GBps", double(ref_streams) * double(n) / ref.median / 1e9},
                  {"time_s", ours.median}, {"reference_time_s", ref.median}};
      r.metric = "bandwidth";
      r.unit = "GB/s";
      r.value = zero::bench::rate(bytes / 1e9, ours);
      r.reference_name = ref_name(k.ref);
      r.reference_median = double(ref_streams) * double(n) / ref.median / 1e9;
      report.add(std::move(r));
    }
  }
  ew::use(ew::Simd::best);

  // Page faults of a step's allocation pattern on the cpu device: the sizes of one step of the
  // issue-21 GPT at batch 4 (logits 32 MiB, attention probabilities 8 MiB, an activation 2 MiB,
  // an MLP activation 8 MiB), allocated, written and freed; the first round against the next.
  {
    auto dev = zero::make_device(zero::DeviceKind::cpu);
    const std::vector<size_t> sizes = {size_t{32} << 20, size_t{8} << 20, size_t{2} << 20,
                                       size_t{8} << 20};
    const auto round = [&] {
      const long before = minor_faults();
      std::vector<zero::Buffer> live;
      for (size_t s : sizes) {
        live.push_back(dev->allocate(s, zero::MemCategory::activations));
        std::memset(live.back().data(), 1, s);
      }
      live.clear();
      return double(minor_faults() - before);
    };
    const double first = round();
    std::vector<double> later;
    for (int i = 0; i < reps; ++i) later.push_back(round() / first);
    Result r;
    r.name = "page faults of a repeated step-like allocation round (50 MiB), as a fraction of "
             "the first round's";
    r.params = {{"bytes", 50 << 20}, {"first_round_faults", first}};
    r.metric = "fraction";
    r.unit = "of the first round's minor faults";
    r.value = zero::bench::stats_of(later);
    report.add(std::move(r));
  }
  report.print();
  return 0;
}
