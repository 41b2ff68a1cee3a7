// cpu_gemm: the cpu backend's matrix products (issue 21, item 1), all measured in one run.
//
//   1. Raw library calls, one whole product each, on the GPT shapes of the issue (N = B*T rows,
//      C = 512, OC 512 / 1536 / 2048, the tied head's V = 8192): oneDNN bf16, oneDNN fp32 and
//      OpenBLAS fp32, on 1 thread and on all threads. Reference: OpenBLAS fp32, same shape and
//      threads. The 1-thread rows decide which library the fp32 kernels use (they call it one
//      thread per block: models/cpu/kernels.cpp, kF32OnDnnl).
//   2. Our kernels (models/cpu/kernels.hpp) on all threads: linear_forward / linear_backward and
//      the head's linear_t_forward / linear_t_backward, with bf16 parameters and gradients and
//      with fp32 ones. Reference: the raw forward product of the same type on all threads
//      (bf16: oneDNN; fp32: OpenBLAS), so the ratio is what the kernels' blocking, conversions
//      and bias cost against one library call. The goal (0.8) is ours: the issue sets none for
//      kernels alone.
//
//   3. --reference-only: part 1's oneDNN bf16 rows on all threads and nothing else (a few
//      seconds): the rate bench/cpu_speed.py samples right before each training run, so that a
//      run's model FLOP/s is set against the machine's speed of that minute. Those rows carry
//      params.mfu_reference = true.
//
//   On a CPU without bf16 products (models::cpu::matmul_supports(bf16) false: Debian's oneDNN
//   2.6 has none below AVX-512, e.g. on AVX2-only x86) bf16 training widens its weights to fp32
//   and multiplies with OpenBLAS (kernels.cpp), so the bf16 rows are left out (said on stderr
//   and in each row's params.bf16_products) and the bf16 reference becomes that product,
//   OpenBLAS fp32 on all threads: the rate bf16 training can reach on this CPU.
//
//   build/bench/cpu_gemm [--quick] [--reference-only]
#include <cblas.h>
#include <omp.h>
#include <tbb/info.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bench/common/report.hpp"
#include "core/dtype.hpp"
#include "core/tensor.hpp"
#include "models/cpu/kernels.hpp"
#include "models/cpu/matmul.hpp"

namespace {

using namespace zero;
using namespace zero::bench;
namespace kern = zero::models::cpu;

const char* const kUsage =
    "usage: cpu_gemm [--quick] [--reference-only]\n"
    "  bf16/fp32 matrix products of the cpu backend (oneDNN, OpenBLAS, our kernels); JSON out.\n"
    "  --reference-only: only the bf16 reference products on all threads (the MFU reference:\n"
    "  oneDNN bf16, or OpenBLAS fp32 on a CPU without bf16 products).\n";

struct GemmShape {
  const char* what;
  int64_t K, N;  // y[rows, N] = x[rows, K] W
  bool head;     // W stored [N, K] (the tied embedding), else [K, N]
};

// Raw oneDNN: one whole product y = x W (f32 out) on `threads` OpenMP threads of this thread.
struct DnnlProduct {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  DnnlProduct(int64_t M, const GemmShape& s, dnnl::memory::data_type t, void* x, void* w, float* y,
              int threads) {
    using dnnl::memory;
    omp_set_num_threads(threads);
    const memory::desc ad({M, s.K}, t, memory::dims{s.K, 1});
    const memory::desc bd({s.K, s.N}, t,
                          s.head ? memory::dims{1, s.K} : memory::dims{s.N, 1});
    const memory::desc cd({M, s.N}, memory::data_type::f32, memory::dims{s.N, 1});
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng));
    a = memory(ad, eng, x), b = memory(bd, eng, w), c = memory(cd, eng, y);
  }
  void run(int threads) {
    omp_set_num_threads(threads);
    prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(int(s >> 9) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

std::vector<zero::bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<zero::bfloat16> o(v.size());
  convert(v.data(), DType::f32, o.data(), DType::bf16, v.size());
  return o;
}

int run(const Options& opt, bool reference_only, int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  // --reference-only is this benchmark's own flag; the rest go to the common parser.
  bool reference_only = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && !std::strcmp(argv[i], "--reference-only"))
      reference_only = true;
    else
      args.push_back(argv[i]);
  }
  const Options opt = parse_options(static_cast<int>(args.size()), args.data(), kUsage);
  try {
    return run(opt, reference_only, argc, argv);
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "cpu_gemm: oneDNN failed: %s (dnnl_status_t %d)\n", e.what(),
                 int(e.status));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_gemm: %s\n", e.what());
  }
  return 1;
}

namespace {

int run(const Options& opt, bool reference_only, int argc, char** argv) {
  const int threads = tbb::info::default_concurrency();
  const int64_t rows = opt.quick ? 1024 : 2048;  // B*T: 4 (quick) or 8 sequences of 256 tokens
  const int reps = opt.quick ? 5 : 9;
  Report report("cpu_gemm", argc, argv, opt.quick, 1, threads);
  const bool have_bf16 = kern::matmul_supports(ScalarType::bf16);
  const std::string bf16_products =
      have_bf16 ? kern::matmul_description(ScalarType::bf16)
                : "none on this CPU (oneDNN has no bf16 matmul for its ISA): bf16 training widens "
                  "weights to fp32 and multiplies with OpenBLAS";
  if (!have_bf16)
    std::fprintf(stderr, "cpu_gemm: no bf16 products on this CPU: oneDNN bf16 rows left out; the "
                         "bf16 reference is OpenBLAS fp32, the product bf16 training uses here\n");
  const GemmShape shapes[] = {{"attention c_proj", 512, 512, false},
                          {"attention c_attn", 512, 1536, false},
                          {"mlp c_fc", 512, 2048, false},
                          {"tied head", 512, 8192, true}};

  for (const GemmShape& s : shapes) {
    const double flops = 2.0 * double(rows) * double(s.K) * double(s.N);
    const auto x32 = random_floats(size_t(rows * s.K), 1);
    const auto w32 = random_floats(size_t(s.K * s.N), 2);
    const auto x16 = to_bf16(x32), w16 = to_bf16(w32);
    std::vector<float> y(size_t(rows * s.N), 0.0f);
    const std::string shape = std::string(s.what) + " N=" + std::to_string(rows) +
                              " K=" + std::to_string(s.K) + " OC=" + std::to_string(s.N);
    const nlohmann::json params = {{"rows", rows}, {"k", s.K}, {"oc", s.N}, {"head", s.head}};
    std::fprintf(stderr, "cpu_gemm: %s\n", shape.c_str());

    // The whole product bf16 training runs here: oneDNN bf16 where the CPU has bf16 products,
    // else OpenBLAS fp32 on the widened weights (see the file comment).
    const auto blas_product = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, s.head ? CblasTrans : CblasNoTrans, int(rows),
                  int(s.N), int(s.K), 1.0f, x32.data(), int(s.K), w32.data(),
                  s.head ? int(s.K) : int(s.N), 0.0f, y.data(), int(s.N));
    };
    if (reference_only) {
      // More repetitions than part 1: one product is a few milliseconds, and this sample sets a
      // whole training run's MFU.
      Stats st{};
      if (have_bf16) {
        DnnlProduct d16(rows, s, dnnl::memory::data_type::bf16,
                        const_cast<zero::bfloat16*>(x16.data()),
                        const_cast<zero::bfloat16*>(w16.data()), y.data(), threads);
        st = rate(flops, time_it(3, 40, [&] { d16.run(threads); }));
      } else {
        openblas_set_num_threads(threads);
        st = rate(flops, time_it(3, 40, blas_product));
      }
      const char* lib = have_bf16 ? "oneDNN bf16" : "OpenBLAS fp32";
      Result r;
      r.name = std::string(lib) + (have_bf16 ? "" : " (bf16 training's product on this CPU)") +
               ", " + shape + ", " + std::to_string(threads) + " thread(s)";
      r.params = params;
      r.params["library"] = lib;
      r.params["threads"] = threads;
      r.params["mfu_reference"] = true;
      r.params["bf16_products"] = bf16_products;
      r.metric = "throughput";
      r.unit = "FLOP/s";
      r.value = st;
      report.add(std::move(r));
      continue;
    }

    // 1. The libraries, whole product, 1 thread and all threads, interleaved per thread count.
    Stats raw_bf16_all{}, raw_f32_all{};
    for (int th : {1, threads}) {
      openblas_set_num_threads(th);
      const Stats blas = time_it(1, reps, blas_product);
      DnnlProduct d32(rows, s, dnnl::memory::data_type::f32, const_cast<float*>(x32.data()),
                      const_cast<float*>(w32.data()), y.data(), th);
      const Stats dnnl32 = time_it(1, reps, [&] { d32.run(th); });
      const Stats blas_rate = rate(flops, blas);
      std::vector<std::pair<const char*, Stats>> rows_ = {{"OpenBLAS fp32", blas_rate},
                                                          {"oneDNN fp32", rate(flops, dnnl32)}};
      Stats bf16_rate = blas_rate;  // what bf16 training multiplies with without bf16 products
      if (have_bf16) {
        DnnlProduct d16(rows, s, dnnl::memory::data_type::bf16,
                        const_cast<zero::bfloat16*>(x16.data()),
                        const_cast<zero::bfloat16*>(w16.data()), y.data(), th);
        bf16_rate = rate(flops, time_it(1, reps, [&] { d16.run(th); }));
        rows_.emplace_back("oneDNN bf16", bf16_rate);
      }
      for (const auto& [lib, st] : rows_) {
        Result r;
        r.name = std::string(lib) + ", " + shape + ", " + std::to_string(th) + " thread(s)";
        r.params = params;
        r.params["library"] = lib;
        r.params["threads"] = th;
        r.params["bf16_products"] = bf16_products;
        r.metric = "throughput";
        r.unit = "FLOP/s";
        r.value = st;
        r.reference_name = "OpenBLAS fp32, same shape and threads";
        r.reference_median = blas_rate.median;
        report.add(std::move(r));
      }
      if (th == threads) raw_bf16_all = bf16_rate, raw_f32_all = blas_rate;
    }
    openblas_set_num_threads(1);  // the kernels' contract: one BLAS thread per call

    // 2. Our kernels on all of oneTBB's threads.
    for (ScalarType t : {ScalarType::bf16, ScalarType::f32}) {
      const bool b16 = t == ScalarType::bf16;
      const void* w = b16 ? static_cast<const void*>(w16.data()) : w32.data();
      std::vector<float> bias(size_t(s.N), 0.01f);
      std::vector<float> dy = random_floats(size_t(rows * s.N), 3), dx(size_t(rows * s.K));
      std::vector<float> g32(size_t(s.K * s.N), 0.0f);
      std::vector<zero::bfloat16> g16(size_t(s.K * s.N), to_bfloat16(0.0f));
      const kern::Param<float> wp(w, t);
      const kern::Grad<float> gp(b16 ? static_cast<void*>(g16.data()) : g32.data(), t);
      std::vector<float> db(size_t(s.N), 0.0f);
      const Stats fwd = time_it(1, reps, [&] {
        if (s.head)
          kern::linear_t_forward<float>(y.data(), x32.data(), wp, rows, s.K, s.N);
        else
          kern::linear_forward<float>(y.data(), x32.data(), wp, bias.data(), true, rows, s.K, s.N);
      });
      const Stats bwd = time_it(1, reps, [&] {
        if (s.head)
          kern::linear_t_backward<float>(dx.data(), gp, dy.data(), x32.data(), wp, rows, s.K, s.N);
        else
          kern::linear_backward<float>(dx.data(), gp, db.data(), true, dy.data(), x32.data(), wp,
                                       rows, s.K, s.N);
      });
      const Stats& ref = b16 ? raw_bf16_all : raw_f32_all;
      const std::pair<const char*, Stats> kernels[] = {{"forward", rate(flops, fwd)},
                                                       {"backward", rate(2 * flops, bwd)}};
      for (const auto& [pass, st] : kernels) {
        Result r;
        r.name = std::string("our ") + (s.head ? "linear_t_" : "linear_") + pass + ", " +
                 std::string(zero::to_string(t)) + " parameters, " + shape + ", " +
                 std::to_string(threads) +
                 " threads";
        r.params = params;
        r.params["kernel"] = std::string(s.head ? "linear_t_" : "linear_") + pass;
        r.params["param_dtype"] = std::string(zero::to_string(t));
        r.params["threads"] = threads;
        r.params["product"] = b16 ? kern::matmul_description(t) : "fp32 path";
        r.metric = "throughput";
        r.unit = "FLOP/s";
        r.value = st;
        r.reference_name = std::string(b16 && have_bf16 ? "oneDNN bf16" : "OpenBLAS fp32") +
                           (b16 && !have_bf16 ? " (bf16 training's product on this CPU)" : "") +
                           " forward product, one call, same run, " + std::to_string(threads) +
                           " threads";
        r.reference_median = ref.median;
        r.goal = Goal{"ratio_at_least", 0.8};
        report.add(std::move(r));
      }
    }
  }
  report.print();
  return 0;
}

}  // namespace
