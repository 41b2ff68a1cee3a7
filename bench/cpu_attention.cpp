// cpu_attention: attention without the T x T probabilities (models/cpu/attention.cpp) against
// the materialised kernels (attention_forward / attention_backward, which keep [B, H, T, T]),
// both measured in the same run (docs/cpu-kernels.md, "Attention without the T x T
// probabilities"):
//
//   - the activations the issue-21 GPT stores (8 layers, n_embd 512, 8 heads, vocab 8192; fp32,
//     one micro-batch of one sequence) at seq_len 256, 1024 and (without --quick) 2048: the
//     ledger's peak of the `activations` category over a steady Engine step (ZeRO 0, one rank),
//     with the blocked attention against GptOptions::attention_probabilities (the probabilities
//     path), and that step's time (one sample each: indicative);
//   - the kernel time of one forward plus backward at the shape (B 4, T 256, C 512,
//     8 heads, fp32) and, without --quick, at T 1024 and 2048 (B 1), interleaved repetition by
//     repetition with the materialised pair.
//
//   - 16-bit activations (docs/cpu-kernels.md, "16-bit activations"): the activation peak with
//     bf16 parameters and bf16 against fp32 activations (same steps as above), the blocked
//     kernels' time with bf16 against fp32 activations, and one transformer block's forward plus
//     backward (C 512, 8 heads, B 4, T 256, bf16 parameters) with bf16 against fp32
//     activations, interleaved repetition by repetition.
//
//   - On CPUs with AMX: the bf16 blocked pair on our tile products (models/cpu/amx.hpp) against
//     the same kernels with their products through oneDNN (amx::use_tiles(false)), interleaved,
//     at the shapes above, with the products' flops (the blocks the kernels multiply) per second.
//
//   OPENBLAS_NUM_THREADS=1 mpirun -np 1 --bind-to none build/bench/cpu_attention [--quick]
// (--bind-to none: Open MPI binds a lone rank to one core, which would leave oneTBB one thread.)
#include <mpi.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/report.hpp"
#include "collectives/communicator.hpp"
#include "core/world.hpp"
#include "models/cpu/amx.hpp"
#include "models/cpu/kernels.hpp"
#include "models/cpu/kernels16.hpp"
#include "models/cpu/matmul.hpp"
#include "models/gpt.hpp"
#include "runtime/engine/engine.hpp"

namespace {

const char* const kUsage =
    "usage: mpirun -np 1 --bind-to none cpu_attention [--quick]\n"
    "  Blocked (online-softmax) attention vs the materialised probabilities on the cpu backend:\n"
    "  the GPT's stored activations (ledger peak) at seq 256/1024/2048 and the kernels' time.\n"
    "  JSON on stdout. --quick: seq 256/1024 only, kernel time at T = 256, 3 repetitions\n"
    "  (under a minute).\n";

using namespace zero;
using namespace zero::bench;
namespace kern = zero::models::cpu;

struct StepFigures {
  double activation_peak = 0, seconds = 0;
};

// The ledger's activation peak over the second Engine step of the issue-21 GPT at seq_len T, and
// that step's time (the first one allocates the optimizer state).
StepFigures gpt_step(coll::Communicator& comm, int T, bool probabilities,
                     ScalarType param = ScalarType::f32, ScalarType act = ScalarType::f32) {
  auto dev = make_device(DeviceKind::cpu);  // its own ledger: only this model's bytes
  auto stream = dev->create_stream("compute");
  auto ops = models::make_ops(*dev, *stream);
  models::GptOptions g{models::GptShape{8, 512, 8, 8192, T}, param, act};
  g.attention_probabilities = probabilities;
  Model model = models::make_gpt(g, *ops);
  EngineOptions o;
  o.stage = 0;
  o.param_type = param;
  Engine engine(model, *dev, *stream, comm, o);
  const auto batch = [&](int) {
    Batch b;
    b.inputs = Tensor::empty(*dev, Shape{1, T}, ScalarType::i32, MemCategory::activations);
    b.targets = Tensor::empty(*dev, Shape{1, T}, ScalarType::i32, MemCategory::activations);
    for (int i = 0; i < T; ++i) {
      b.inputs.data_as<int32_t>()[i] = (i * 7) % 8192;
      b.targets.data_as<int32_t>()[i] = (i * 3 + 1) % 8192;
    }
    return b;
  };
  engine.step(batch);
  dev->ledger().reset_peaks();
  const double t0 = now_seconds();
  engine.step(batch);
  StepFigures f;
  f.seconds = now_seconds() - t0;
  f.activation_peak = static_cast<double>(
      dev->ledger().snapshot().at(MemSpace::device, MemCategory::activations).peak);
  return f;
}

// Seconds of one forward + backward of the transformer block h.0 of a 1-layer issue-21 GPT
// (C 512, 8 heads) on a [B, T] micro-batch, with parameters `param` (gradients the same type)
// and activations `act`: input and upstream gradient are small fixed values of type act.
struct BlockRun {
  std::unique_ptr<Device> dev = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = dev->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_ops(*dev, *stream);
  Model model;
  Unit* block = nullptr;
  std::vector<Tensor> params, grads;
  Tensor input, grad_output;

  BlockRun(ScalarType param, ScalarType act, int64_t B, int64_t T) {
    model = models::make_gpt({models::GptShape{1, 512, 8, 8192, int(T)}, param, act}, *ops);
    block = model.units.at(1).get();
    for (const int id : block->param_ids()) {
      const ParamSpec& p = model.params.at(size_t(id));
      std::vector<float> init(size_t(p.numel()));
      init_param_values(p, 5, 0, p.numel(), init.data());
      Tensor t = Tensor::empty(*dev, p.shape, p.type, MemCategory::parameters);
      convert(init.data(), DType::f32, t.data(), *to_dtype(p.type), init.size());
      params.push_back(t);
      grads.push_back(Tensor::zeros(*dev, *stream, p.shape, p.type, MemCategory::gradients));
    }
    const auto filled = [&](uint64_t mul) {
      Tensor t = Tensor::empty(*dev, Shape{B, T, 512}, act, MemCategory::activations);
      std::vector<float> v(size_t(t.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = float(int64_t(i * mul) % 2001) / 1000.0f - 1.0f;
      convert(v.data(), DType::f32, t.data(), *to_dtype(act), v.size());
      return t;
    };
    input = filled(7919);
    grad_output = filled(104729);
    stream->synchronize();
  }
  void run() {
    UnitContext c;
    c.params = params;
    c.input = input;
    block->forward(c);
    c.grads = grads;
    c.grad_output = grad_output;
    block->backward(c);
    ops->check_errors();
  }
};

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main(argc, argv, [&](zero::World& world) {
    const Options opt = parse_options(argc, argv, kUsage);
    auto comm_dev = make_device(DeviceKind::cpu);
    auto comm = coll::make_mpi_communicator(world.comm(), *comm_dev);
    Report report("cpu_attention", argc, argv, opt.quick, world.size(),
                  tbb::this_task_arena::max_concurrency());

    std::vector<int> lengths = {256, 1024};
    if (!opt.quick) lengths.push_back(2048);
    for (int T : lengths) {
      std::fprintf(stderr, "cpu_attention: GPT steps at seq_len %d...\n", T);
      const StepFigures ours = gpt_step(*comm, T, false), theirs = gpt_step(*comm, T, true);
      const double blocked = ours.activation_peak, probs = theirs.activation_peak;
      Result r;
      r.name = "issue-21 GPT activation peak (ledger), a steady step, micro-batch 1, seq_len " +
               std::to_string(T) + ": blocked attention vs kept probabilities";
      r.params = {{"seq_len", T}, {"micro_batch", 1}, {"n_layer", 8}, {"n_embd", 512},
                  {"n_head", 8}, {"vocab_size", 8192}, {"dtype", "fp32"},
                  {"probabilities_bytes_per_layer", 8.0 * T * T * 4},
                  {"step_seconds", ours.seconds}, {"reference_step_seconds", theirs.seconds}};
      r.metric = "bytes";
      r.unit = "bytes";
      r.value = Stats{blocked, blocked, blocked, 1};
      r.reference_name = "the same step keeping attention's [B, H, T, T] probabilities";
      r.reference_median = probs;
      report.add(std::move(r));
    }

    struct Shape3 {
      int64_t B, T;
    };
    std::vector<Shape3> shapes = {{4, 256}};
    if (!opt.quick) shapes.insert(shapes.end(), {{1, 1024}, {1, 2048}});
    const int reps = opt.quick ? 3 : 7;
    constexpr int64_t C = 512, NH = 8;
    for (const Shape3& s : shapes) {
      const int64_t B = s.B, T = s.T;
      std::fprintf(stderr, "cpu_attention: kernels at B %lld T %lld...\n",
                   static_cast<long long>(B), static_cast<long long>(T));
      std::vector<float> qkv(size_t(B * T * 3 * C)), dout(size_t(B * T * C)), out(dout.size()),
          dqkv(qkv.size()), lse(size_t(B * NH * T)), probs(size_t(B * NH * T * T));
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(int64_t(i * 7919) % 2001) / 1000.0f - 1.0f;
      for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(int64_t(i * 104729) % 2001) / 1000.0f - 1.0f;
      const auto ours = [&] {
        kern::attention_forward_lse<float>(out.data(), lse.data(), qkv.data(), B, T, C, NH);
        kern::attention_backward_lse<float>(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                            lse.data(), B, T, C, NH);
      };
      const auto ref = [&] {
        kern::attention_forward<float>(out.data(), probs.data(), qkv.data(), B, T, C, NH);
        kern::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), probs.data(), B, T,
                                        C, NH);
      };
      ours();
      ref();
      std::vector<double> a, b;
      for (int i = 0; i < reps; ++i) {
        double t = now_seconds();
        ours();
        a.push_back(now_seconds() - t);
        t = now_seconds();
        ref();
        b.push_back(now_seconds() - t);
      }
      const Stats mine = stats_of(a), theirs = stats_of(b);
      Result r;
      r.name = "attention forward + backward, fp32, B " + std::to_string(B) + " T " +
               std::to_string(T) + " C 512, 8 heads: blocked vs materialised";
      r.params = {{"B", B}, {"T", T}, {"C", C}, {"n_head", NH},
                  {"probabilities_bytes", double(B * NH * T * T) * 4}};
      r.metric = "time";
      r.unit = "s";
      r.value = mine;
      r.reference_name = "materialised attention_forward + attention_backward, same run";
      r.reference_median = theirs.median;
      report.add(std::move(r));
    }
    // ---- 16-bit activations ----
    for (int T : lengths) {
      std::fprintf(stderr, "cpu_attention: bf16 GPT steps at seq_len %d...\n", T);
      const StepFigures a16 = gpt_step(*comm, T, false, ScalarType::bf16, ScalarType::bf16);
      const StepFigures a32 = gpt_step(*comm, T, false, ScalarType::bf16, ScalarType::f32);
      Result r;
      r.name = "issue-21 GPT activation peak (ledger), a steady step, micro-batch 1, seq_len " +
               std::to_string(T) + ", bf16 parameters: bf16 vs fp32 activations";
      r.params = {{"seq_len", T}, {"micro_batch", 1}, {"param_dtype", "bf16"},
                  {"step_seconds", a16.seconds}, {"reference_step_seconds", a32.seconds}};
      r.metric = "bytes";
      r.unit = "bytes";
      r.value = Stats{a16.activation_peak, a16.activation_peak, a16.activation_peak, 1};
      r.reference_name = "the same step with fp32 activations";
      r.reference_median = a32.activation_peak;
      report.add(std::move(r));
    }
    for (const Shape3& s : shapes) {
      const int64_t B = s.B, T = s.T;
      std::fprintf(stderr, "cpu_attention: bf16 kernels at B %lld T %lld...\n",
                   static_cast<long long>(B), static_cast<long long>(T));
      std::vector<float> qkv(size_t(B * T * 3 * C)), dout(size_t(B * T * C)), out(dout.size()),
          dqkv(qkv.size()), lse(size_t(B * NH * T));
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(int64_t(i * 7919) % 2001) / 1000.0f - 1.0f;
      for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(int64_t(i * 104729) % 2001) / 1000.0f - 1.0f;
      const auto bf = ScalarType::bf16;
      std::vector<uint16_t> qkv16(qkv.size()), dout16(dout.size()), out16(dout.size()), dqkv16(qkv.size());
      convert(qkv.data(), DType::f32, qkv16.data(), DType::bf16, qkv.size());
      convert(dout.data(), DType::f32, dout16.data(), DType::bf16, dout.size());
      const auto fp32 = [&] {
        kern::attention_forward_lse<float>(out.data(), lse.data(), qkv.data(), B, T, C, NH);
        kern::attention_backward_lse<float>(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                            lse.data(), B, T, C, NH);
      };
      const auto bf16 = [&] {
        kern::k16::attention_forward_lse(bf, out16.data(), lse.data(), qkv16.data(), B, T, C, NH);
        kern::k16::attention_backward_lse(bf, dqkv16.data(), dout16.data(), qkv16.data(),
                                          out16.data(), lse.data(), B, T, C, NH);
      };
      fp32();
      bf16();
      std::vector<double> a, b;
      for (int i = 0; i < reps; ++i) {
        double t = now_seconds();
        bf16();
        a.push_back(now_seconds() - t);
        t = now_seconds();
        fp32();
        b.push_back(now_seconds() - t);
      }
      Result r;
      r.name = "blocked attention forward + backward, B " + std::to_string(B) + " T " +
               std::to_string(T) + " C 512, 8 heads: bf16 vs fp32 activations";
      r.params = {{"B", B}, {"T", T}, {"C", C}, {"n_head", NH},
                  {"products", kern::matmul_description(ScalarType::bf16)}};
      r.metric = "time";
      r.unit = "s";
      r.value = stats_of(a);
      r.reference_name = "the fp32 blocked pair, same run";
      r.reference_median = stats_of(b).median;
      report.add(std::move(r));
    }
    for (const Shape3& s : shapes) {
      if (!kern::amx::available()) break;
      const int64_t B = s.B, T = s.T, hs = C / NH;
      std::fprintf(stderr, "cpu_attention: bf16 kernels on AMX tiles vs oneDNN at B %lld T %lld...\n",
                   static_cast<long long>(B), static_cast<long long>(T));
      std::vector<float> qkv(size_t(B * T * 3 * C)), dout(size_t(B * T * C)), lse(size_t(B * NH * T));
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(int64_t(i * 7919) % 2001) / 1000.0f - 1.0f;
      for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(int64_t(i * 104729) % 2001) / 1000.0f - 1.0f;
      const auto bf = ScalarType::bf16;
      std::vector<uint16_t> qkv16(qkv.size()), dout16(dout.size()), out16(dout.size()), dqkv16(qkv.size());
      convert(qkv.data(), DType::f32, qkv16.data(), DType::bf16, qkv.size());
      convert(dout.data(), DType::f32, dout16.data(), DType::bf16, dout.size());
      // The products' flops: the forward multiplies Q K^T and P V on every (query block, key
      // block at or before its end), the backward five products on every (key block, query
      // block at or after its start); blocks of 64 queries by 128 keys (attention16.cpp).
      double flops = 0;
      for (int64_t r0 = 0; r0 < T; r0 += 64) {
        const int64_t r1 = std::min(T, r0 + 64);
        for (int64_t j0 = 0; j0 < r1; j0 += 128) flops += 2 * 2.0 * (r1 - r0) * (std::min(j0 + 128, r1) - j0) * hs;
      }
      for (int64_t j0 = 0; j0 < T; j0 += 128)
        for (int64_t i0 = j0; i0 < T; i0 += 64)
          flops += 5 * 2.0 * (std::min(i0 + 64, T) - i0) * (std::min(j0 + 128, T) - j0) * hs;
      flops *= double(B * NH);
      const auto run = [&](bool tiles) {
        kern::amx::use_tiles(tiles);
        const double t = now_seconds();
        kern::k16::attention_forward_lse(bf, out16.data(), lse.data(), qkv16.data(), B, T, C, NH);
        kern::k16::attention_backward_lse(bf, dqkv16.data(), dout16.data(), qkv16.data(),
                                          out16.data(), lse.data(), B, T, C, NH);
        const double dt = now_seconds() - t;
        kern::amx::use_tiles(true);
        return dt;
      };
      run(true);
      run(false);
      std::vector<double> a, b;
      for (int i = 0; i < std::max(reps, 5); ++i) {
        a.push_back(run(true));
        b.push_back(run(false));
      }
      const Stats mine = stats_of(a), theirs = stats_of(b);
      Result r;
      r.name = "blocked attention forward + backward, bf16, B " + std::to_string(B) + " T " +
               std::to_string(T) + " C 512, 8 heads: AMX tile products vs oneDNN products";
      r.params = {{"B", B}, {"T", T}, {"C", C}, {"n_head", NH}, {"product_gflop", flops / 1e9},
                  {"product_gflops_tiles", flops / 1e9 / mine.median},
                  {"product_gflops_onednn", flops / 1e9 / theirs.median},
                  {"onednn", kern::matmul_description(ScalarType::bf16)}};
      r.metric = "time";
      r.unit = "s";
      r.value = mine;
      r.reference_name = "the same kernels with oneDNN's products (amx::use_tiles(false)), same run";
      r.reference_median = theirs.median;
      report.add(std::move(r));
    }
    {
      std::fprintf(stderr, "cpu_attention: one block, bf16 vs fp32 activations...\n");
      constexpr int64_t B = 4, T = 256;
      BlockRun bf(ScalarType::bf16, ScalarType::bf16, B, T), fp(ScalarType::bf16, ScalarType::f32, B, T);
      bf.run();
      fp.run();
      std::vector<double> a, b;
      for (int i = 0; i < std::max(reps, 5); ++i) {
        double t = now_seconds();
        bf.run();
        a.push_back(now_seconds() - t);
        t = now_seconds();
        fp.run();
        b.push_back(now_seconds() - t);
      }
      Result r;
      r.name = "one transformer block forward + backward, B 4 T 256 C 512, 8 heads, bf16 "
               "parameters: bf16 vs fp32 activations";
      r.params = {{"B", B}, {"T", T}, {"C", 512}, {"n_head", 8}, {"param_dtype", "bf16"}};
      r.metric = "time";
      r.unit = "s";
      r.value = stats_of(a);
      r.reference_name = "fp32 activations, same parameters, same run";
      r.reference_median = stats_of(b).median;
      report.add(std::move(r));
    }
    if (world.rank() == 0) report.print();
    return 0;
  });
}
