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
//   OPENBLAS_NUM_THREADS=1 mpirun -np 1 --bind-to none build/bench/cpu_attention [--quick]
// (--bind-to none: Open MPI binds a lone rank to one core, which would leave oneTBB one thread.)
#include <mpi.h>
#include <tbb/task_arena.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/common/report.hpp"
#include "collectives/communicator.hpp"
#include "core/world.hpp"
#include "models/cpu/kernels.hpp"
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
StepFigures gpt_step(coll::Communicator& comm, int T, bool probabilities) {
  auto dev = make_device(DeviceKind::cpu);  // its own ledger: only this model's bytes
  auto stream = dev->create_stream("compute");
  auto ops = models::make_ops(*dev, *stream);
  models::GptOptions g{models::GptShape{8, 512, 8, 8192, T}, ScalarType::f32, ScalarType::f32};
  g.attention_probabilities = probabilities;
  Model model = models::make_gpt(g, *ops);
  EngineOptions o;
  o.stage = 0;
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
    if (world.rank() == 0) report.print();
    return 0;
  });
}
