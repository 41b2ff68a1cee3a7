// The ZeRO engine on the cuda backend (one GPU per rank, NCCL), checked three ways:
//   - against itself: stages 0-3 train bitwise alike, and offloading the optimizer (and the
//     parameters) changes nothing, because the device and host AdamW kernels are the same IEEE
//     operations (optim/adam.hpp) and the reductions are the same collectives;
//   - against the cpu engine: the same model, seed and batches on the cpu backend (MPI) give the
//     same losses and parameters up to summation-order rounding (cuBLAS and our reductions sum in
//     another order than OpenBLAS and the cpu kernels);
//   - across backends through a checkpoint: saved by the cuda engine, loaded by the cpu engine,
//     every parameter reads back with the same bits.
// Without one GPU per rank every test case reports Skipped, and all ranks decide alike.
//
// Why these bounds: with fp32 everywhere the two backends differ by GEMM summation order, about
// 1e-6 relative per op; AdamW's normalised update carries that into the parameters at about lr
// times that per step, so 1e-4 relative on losses and parameters after 12 steps holds with a wide
// margin while a wrong stream order (a missing wait: stale or half-written gradients) gives
// differences of order one. bf16 activations on cuda against fp32 activations on cpu differ by
// bf16 rounding (2^-8): 5e-2 on the loss.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt.hpp"
#include "core/mpi_check.hpp"
#include "core/world.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/checkpoint/helpers.hpp"
#include "tests/mpi/cuda_fixture.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using test::AllocationStream;
using test::cuda_env;
using test::CudaEnv;
using test::every_rank_has_a_gpu;

namespace {

const models::GptShape kGpt{2, 64, 4, 32, 16};
constexpr int kRows = 4;  // sequences per micro-batch
constexpr int kSteps = 12;

struct Setup {
  int stage = 0;
  int ga = 1;
  ScalarType type = ScalarType::f32;
  float clip = 1e6f;  // inactive unless set low
  bool offload_optimizer = false, offload_param = false, speculative = true;
  std::optional<optim::LossScalerOptions> scaler = std::nullopt;
  bool remat = false;              // every block checkpointed
  bool cpu_checkpointing = false;  // their inputs in pinned host memory
  std::string nvme;                 // the optimizer state's swap directory (empty: host RAM)
  int64_t sub_group = 1'000'000'000;
  std::string param_nvme;           // the parameter shards' swap directory (empty: host RAM)
};

struct Run {
  std::vector<double> losses;  // per step, mean over ranks
  std::vector<std::vector<float>> params;
  int skipped = 0;
  std::vector<double> scales;  // per step: the loss scale its gradients carried
  std::vector<bool> applied;   // per step: false when skipped for overflow
};

Batch make_batch(Device& dev, Stream& stream, int64_t index) {
  std::vector<int32_t> tok(kRows * kGpt.seq_len), tgt(tok.size());
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((index * 7 + static_cast<int64_t>(i) * 3) % kGpt.vocab_size);
    tgt[i] = (tok[i] * 2 + 1) % kGpt.vocab_size;  // a learnable next token
  }
  Batch b;
  b.inputs = Tensor::empty(dev, Shape{kRows, kGpt.seq_len}, ScalarType::i32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{kRows, kGpt.seq_len}, ScalarType::i32, MemCategory::activations);
  copy_from_host(dev, stream, b.inputs, tok.data());
  copy_from_host(dev, stream, b.targets, tgt.data());
  stream.synchronize();
  return b;
}

EngineOptions options(const Setup& s) {
  EngineOptions o;
  o.stage = s.stage;
  o.gradient_accumulation_steps = s.ga;
  o.param_type = s.type;
  o.adam.weight_decay = 0.01f;
  o.gradient_clipping = s.clip;
  o.lr = [](int64_t t) { return 3e-3f * std::min(1.0f, static_cast<float>(t) / 4.0f); };
  o.seed = 7;
  o.loss_scaler = s.scaler;
  o.offload_optimizer = s.offload_optimizer;
  o.offload_param = s.offload_param;
  o.speculative_host_step = s.speculative;
  if (s.remat) o.number_checkpoints = 1000;
  o.cpu_checkpointing = s.cpu_checkpointing;
  if (!s.nvme.empty()) {
    o.nvme.path = s.nvme;
    o.nvme.buffer_count = 2;
    o.nvme.pipeline_read = o.nvme.pipeline_write = true;
    o.nvme.sub_group_size = s.sub_group;
  }
  if (!s.param_nvme.empty()) {
    o.param_nvme_path = s.param_nvme;
    o.param_max_in_cpu = 0;  // every partitioned shard on the drive
  }
  return o;
}

// Activations: the parameters' type on cuda (what zero-train does); fp32 for the cpu reference,
// the more exact of the cpu backend's two paths, so the bf16 bound measures cuda's rounding.
Model make_model(Device& dev, models::Ops& ops, ScalarType type) {
  const ScalarType act = dev.kind() == DeviceKind::cuda ? type : ScalarType::f32;
  return models::make_gpt({kGpt, type, act}, ops);
}

// Trains on `dev` with `comm` (cuda: NCCL; cpu: MPI). Rank r's m-th micro-batch of step t is
// batch t * 1000 + r * GA + m on every backend.
Run train(Device& dev, coll::Communicator& comm, const Setup& s) {
  auto stream = dev.create_stream("compute");
  const AllocationStream ordered(dev, *stream);
  auto ops = models::make_ops(dev, *stream);
  Model model = make_model(dev, *ops, s.type);
  Engine engine(model, dev, *stream, comm, options(s));
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const StepStats st = engine.step([&](int m) {
      return make_batch(dev, *stream, int64_t{step} * 1000 + int64_t{comm.rank()} * s.ga + m);
    });
    double loss = st.loss / comm.size();
    ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, World::get().comm()));
    run.losses.push_back(loss);
    run.skipped += st.applied ? 0 : 1;
    run.scales.push_back(st.loss_scale);
    run.applied.push_back(st.applied);
  }
  for (int p = 0; p < static_cast<int>(model.params.size()); ++p) run.params.push_back(engine.parameter(p));
  return run;
}

bool bitwise_equal(const Run& a, const Run& b) {
  if (a.losses.size() != b.losses.size() || a.params.size() != b.params.size()) return false;
  if (a.scales != b.scales || a.applied != b.applied) return false;
  if (std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(double)) != 0) return false;
  for (size_t p = 0; p < a.params.size(); ++p)
    if (a.params[p].size() != b.params[p].size() ||
        std::memcmp(a.params[p].data(), b.params[p].data(), a.params[p].size() * 4) != 0)
      return false;
  return true;
}

// ||a - b|| / ||b|| over all parameters except the key biases (c_attn.bias [C, 2C)), whose exact
// gradient is zero: rounding noise amplified by Adam, different for any two summation orders.
double rel_l2_diff(const Run& a, const Run& b, const Model& model) {
  double num = 0, den = 0;
  for (size_t p = 0; p < b.params.size(); ++p) {
    const bool key_bias = model.params[p].name.ends_with("attn.c_attn.bias");
    for (size_t i = 0; i < b.params[p].size(); ++i) {
      if (key_bias && i >= size_t(kGpt.n_embd) && i < size_t(2 * kGpt.n_embd)) continue;
      const double d = double(a.params[p][i]) - double(b.params[p][i]);
      num += d * d;
      den += double(b.params[p][i]) * double(b.params[p][i]);
    }
  }
  return std::sqrt(num / den);
}

double max_rel_loss_diff(const Run& a, const Run& b) {
  double worst = 0;
  for (size_t i = 0; i < b.losses.size(); ++i)
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) / std::abs(b.losses[i]));
  return worst;
}

#define REQUIRE_GPU_PER_RANK() \
  if (!every_rank_has_a_gpu()) SKIP("needs one GPU per rank")

}  // namespace

TEST_CASE("cuda engine: stages 0-3 train bitwise alike (fp32 and bf16)") {
  REQUIRE_GPU_PER_RANK();
  CudaEnv& e = cuda_env();
  for (ScalarType t : {ScalarType::f32, ScalarType::bf16}) {
    Setup s;
    s.type = t;
    const Run base = train(*e.device, *e.comm, s);
    CHECK(base.losses.back() < base.losses.front());
    for (int stage = 1; stage <= 3; ++stage) {
      INFO("stage " << stage << ", " << to_string(t));
      s.stage = stage;
      CHECK(bitwise_equal(train(*e.device, *e.comm, s), base));
    }
  }
}

TEST_CASE("cuda engine: optimizer and parameter offload change nothing") {
  REQUIRE_GPU_PER_RANK();
  CudaEnv& e = cuda_env();
  Setup s;
  s.type = ScalarType::bf16;
  s.stage = 2;
  const Run stage2 = train(*e.device, *e.comm, s);
  for (bool spec : {true, false}) {
    INFO("speculative host step " << spec);
    s.offload_optimizer = true;
    s.speculative = spec;
    CHECK(bitwise_equal(train(*e.device, *e.comm, s), stage2));
  }
  s = Setup{};
  s.type = ScalarType::bf16;
  s.stage = 3;
  const Run stage3 = train(*e.device, *e.comm, s);
  s.offload_optimizer = s.offload_param = true;
  CHECK(bitwise_equal(train(*e.device, *e.comm, s), stage3));
  // With clipping binding the host takes the norm in fp64 chunks, the device in an fp32 tree:
  // the clip coefficients differ by roundings.
  s = Setup{};
  s.type = ScalarType::bf16;
  s.stage = 2;
  s.clip = 0.05f;
  s.ga = 2;
  const Run clipped = train(*e.device, *e.comm, s);
  s.offload_optimizer = true;
  auto ops_stream = e.device->create_stream("names");
  auto ops = models::make_ops(*e.device, *ops_stream);
  const Model names = make_model(*e.device, *ops, s.type);
  CHECK(rel_l2_diff(train(*e.device, *e.comm, s), clipped, names) < 1e-5);
}

// activation_checkpointing.cpu_checkpointing: the checkpointed inputs go down to pinned host
// memory on the copy engine's D2H stream and come back on its H2D stream before the recompute
// (runtime/engine/activation_offload.hpp): bytes copied, so bitwise the checkpointed run, at
// stage 0 and stage 3 with both offloads, fp32 and bf16, with accumulation.
TEST_CASE("cuda engine: cpu_checkpointing changes nothing") {
  REQUIRE_GPU_PER_RANK();
  CudaEnv& e = cuda_env();
  for (ScalarType t : {ScalarType::f32, ScalarType::bf16}) {
    for (int stage : {0, 3}) {
      INFO("stage " << stage << ", " << to_string(t));
      Setup s;
      s.type = t;
      s.stage = stage;
      s.ga = 2;
      s.remat = true;
      s.offload_optimizer = s.offload_param = stage == 3;
      const Run kept = train(*e.device, *e.comm, s);
      s.cpu_checkpointing = true;
      CHECK(bitwise_equal(train(*e.device, *e.comm, s), kept));
    }
  }
}

// The NVMe tier (docs/nvme-offload.md) under the cuda engine: the state and the shards wait in
// swap files instead of host RAM and the new 16-bit shard goes up from the landing buffer it was
// written over; the floats AdamW reads and writes are the same, so bitwise the RAM runs.
TEST_CASE("cuda engine: optimizer state and parameters on NVMe change nothing") {
  REQUIRE_GPU_PER_RANK();
  CudaEnv& e = cuda_env();
  checkpoint::test::TempDir swap;  // one per rank (the store adds rank<r> anyway)
  Setup s;
  s.stage = 2;
  s.type = ScalarType::bf16;
  s.offload_optimizer = true;
  const Run ram = train(*e.device, *e.comm, s);
  s.nvme = swap.path;
  s.sub_group = 1000;  // cuts the blocks' groups into several swap files
  CHECK(bitwise_equal(train(*e.device, *e.comm, s), ram));
  s = Setup{};
  s.stage = 3;
  s.type = ScalarType::bf16;
  s.offload_optimizer = s.offload_param = true;
  const Run ram3 = train(*e.device, *e.comm, s);
  s.nvme = s.param_nvme = swap.path;
  CHECK(bitwise_equal(train(*e.device, *e.comm, s), ram3));
}

TEST_CASE("cuda engine matches the cpu engine") {
  REQUIRE_GPU_PER_RANK();
  CudaEnv& e = cuda_env();
  Device& cpu = *test::env().device;
  coll::Communicator& mpi = *test::env().comm;
  auto stream = cpu.create_stream("names");
  auto ops = models::make_ops(cpu, *stream);
  for (int stage : {0, 2, 3}) {
    Setup s;
    s.stage = stage;
    s.ga = 2;
    s.clip = 0.5f;  // binding at the start
    INFO("fp32, stage " << stage);
    const Run gpu = train(*e.device, *e.comm, s);
    const Run ref = train(cpu, mpi, s);
    const Model names = make_model(cpu, *ops, s.type);
    CHECK(max_rel_loss_diff(gpu, ref) < 1e-4);
    CHECK(rel_l2_diff(gpu, ref, names) < 1e-4);
  }
  Setup s;
  s.stage = 2;
  s.type = ScalarType::bf16;
  s.offload_optimizer = true;
  const Run gpu = train(*e.device, *e.comm, s);
  const Run ref = train(cpu, mpi, s);
  INFO("bf16 stage 2 with offload");
  CHECK(max_rel_loss_diff(gpu, ref) < 5e-2);
  CHECK(gpu.losses.back() < 0.8 * gpu.losses.front());
}

TEST_CASE("cuda engine: fp16 with dynamic loss scaling trains and skips overflowing steps") {
  REQUIRE_GPU_PER_RANK();
  CudaEnv& e = cuda_env();
  Setup s;
  s.stage = 2;
  s.type = ScalarType::f16;
  optim::LossScalerOptions ls;
  ls.enabled = true;
  // Why 2^20: at the start this model's largest gradients (of parameters or, in backward, of
  // activations, all fp16 on cuda) are a few tenths, so scaled they pass fp16's 65504 at every
  // scale from 2^18 up (measured under the emulator: 2^20, 2^19, 2^18 skipped, 2^17 trains). Starting at 2^20 the scaler backs off for about three
  // steps and trains for the rest; the 2^32 this case used to start from needs 15 halvings, more
  // than its 12 steps, so every step was skipped and nothing trained (a real GPU does the same:
  // it is the model's gradients, not the backend). The cpu engine's test starts at 2^20 too.
  ls.initial_scale_power = 20;
  ls.hysteresis = 1;  // every overflow halves
  s.scaler = ls;
  const Run run = train(*e.device, *e.comm, s);
  REQUIRE(run.scales.size() == size_t(kSteps));
  CHECK(run.scales[0] == std::ldexp(1.0, 20));
  CHECK(!run.applied[0]);  // 2^20 overflows: the scaler must back off
  // DeepSpeed's rule with hysteresis 1 and the default window (1000 clean steps, more than run
  // here): an overflow halves the scale for the next step, a clean step keeps it.
  for (int t = 1; t < kSteps; ++t) {
    INFO("step " << t);
    CHECK(run.scales[size_t(t)] == run.scales[size_t(t - 1)] / (run.applied[size_t(t - 1)] ? 1 : 2));
  }
  CHECK(run.skipped >= 1);
  CHECK(run.skipped <= kSteps / 2);  // it backs off within a few steps, then trains
  for (double l : run.losses) CHECK(std::isfinite(l));
  CHECK(run.losses.back() < run.losses.front());
  // Every stage skips the same steps and trains the same bits.
  s.stage = 3;
  CHECK(bitwise_equal(train(*e.device, *e.comm, s), run));
}

TEST_CASE("cuda engine: a checkpoint saved on the GPU loads on the cpu backend bit for bit") {
  REQUIRE_GPU_PER_RANK();
  CudaEnv& e = cuda_env();
  coll::Communicator& mpi = *test::env().comm;
  // One directory every rank sees.
  std::unique_ptr<checkpoint::test::TempDir> owned;
  std::vector<char> name(512, 0);
  if (mpi.rank() == 0) {
    owned = std::make_unique<checkpoint::test::TempDir>();
    std::snprintf(name.data(), name.size(), "%s", owned->path.c_str());
  }
  ZERO_CHECK_MPI(MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, World::get().comm()));
  const std::string dir = name.data();

  Setup s;
  s.stage = 3;
  s.type = ScalarType::bf16;
  s.offload_optimizer = true;  // master and moments in host memory, parameters on the GPU
  auto gstream = e.device->create_stream("compute");
  const AllocationStream ordered(*e.device, *gstream);
  auto gops = models::make_ops(*e.device, *gstream);
  Model gm = make_model(*e.device, *gops, s.type);
  Engine gpu(gm, *e.device, *gstream, *e.comm, options(s));
  for (int step = 0; step < 3; ++step)
    gpu.step([&](int m) { return make_batch(*e.device, *gstream, int64_t{step} * 1000 + mpi.rank() + m); });
  gpu.save_checkpoint(dir, "step3", mpi);

  Device& cpu = *test::env().device;
  auto cstream = cpu.create_stream("compute");
  auto cops = models::make_ops(cpu, *cstream);
  Model cm = make_model(cpu, *cops, s.type);
  Setup c = s;
  c.stage = 1;
  c.offload_optimizer = false;
  Engine ref(cm, cpu, *cstream, mpi, options(c));
  ref.load_checkpoint(dir, "step3", mpi);
  CHECK(ref.steps_taken() == 3);
  for (int p = 0; p < static_cast<int>(gm.params.size()); ++p) {
    INFO(gm.params[static_cast<size_t>(p)].name);
    const std::vector<float> a = gpu.parameter(p), b = ref.parameter(p);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  }
  // And the other way: the GPU engine takes the state back (a different stage) and evaluates.
  Setup g2 = s;
  g2.stage = 2;
  g2.offload_optimizer = false;
  Model gm2 = make_model(*e.device, *gops, s.type);
  Engine gpu2(gm2, *e.device, *gstream, *e.comm, options(g2));
  gpu2.load_checkpoint(dir, "step3", mpi);
  const Batch held = make_batch(*e.device, *gstream, 999'999);
  std::vector<int32_t> argmax;
  const double l1 = gpu.evaluate(held, &argmax), l2 = gpu2.evaluate(held);
  CHECK(l1 == l2);
  CHECK(argmax.size() == size_t(kRows) * size_t(kGpt.seq_len));
  mpi.barrier().wait();
}
