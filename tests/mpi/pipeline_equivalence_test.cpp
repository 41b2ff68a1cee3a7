// Issue 18's equivalence matrix: pipeline parallelism composed with ZeRO trains like stage 0 on
// one rank. The world of W ranks is P pipeline stages x D = W / P data-parallel ranks
// (collectives/grid.hpp); each stage runs an Engine over its view of the model with the
// stage's data-parallel communicator (engine::make_pipeline_stage). For every schedule (gpipe,
// 1f1b, zb-h1), ZeRO stage 0-3, with and without optimizer offload, fp32 and bf16, 4
// micro-batches per data rank and clipping that is active, every rank compares its stage's
// parameters, and the step losses, with a reference: the whole model, stage 0, on a world of
// one, D x 4 micro-batches per step (the same global batch, the same data).
//
// Models: an MLP of 5 Units (no divisor of 2 or 4: a cut with unequal stages) and a GPT of 4
// Units (embedding, 2 blocks, head) whose token embedding is tied to the LM head, so its copies
// on the first and the last stage must get the summed gradient. With P = 2 and the GPT of 3
// blocks (5 Units) too.
//
// Bounds. Where the arithmetic is the same, the result is bitwise (tests/mpi/pipeline_exec_test:
// fp32, ZeRO 0, one data rank, the MLP). Here the summation orders differ: the data-parallel
// reduction adds the data ranks' sums, stage 2/3 add each micro-batch's reduced shard to an fp32
// accumulator, the tied gradient is the sum of the two stages' sums, and clipping scales by a
// norm summed per stage. The measure is engine_test's (the relative L2 difference of the
// parameters against the same kind of reference). fp32: at most 2e-6, as engine_test's GPT
// bound (a few fp32 roundings of each gradient, amplified by Adam's normalisation over 6
// steps); measured up to 5.0e-7. bf16: at most 4e-3. Its working parameters round at 2^-9
// relative, so a master that differs in its last fp32 bits rounds to the neighbouring bf16 value
// in some elements and every later gradient differs at the bf16 level: measured up to 2.8e-3
// with 2 data ranks (the data-parallel sum is a second order of bf16 additions), 4.8e-4 with one,
// and 0 (bitwise) for the MLP at ZeRO 0 on one data rank. Since the cpu backend multiplies
// bf16 parameters in bf16 (oneDNN: both operands of every linear product rounded to bf16, 2^-8
// relative), the gradients carry bf16 rounding too and the bound is 1e-2. The GPT runs with
// activations in its parameters' type, as zero-train does (bf16 activations: every stored
// activation rounded at 2^-8, the boundary tensors sent between stages included, so a stage
// receives exactly what the whole model's next layer reads): measured up to 4.4e-3 (4 stages x
// 2 data, ZeRO 2/3), 1.8e-3 (ZeRO 0/1), 3.1e-3 on 4 ranks, 9.9e-4 on 2; losses up to 2.8e-4
// relative. (With fp32 activations it was 5.7e-3 and 2.1e-3.) (The planted bugs below are
// caught by the fp32 cases.) Losses: relative 1e-5 (fp32), 3e-3
// (bf16). Planted bugs, measured: the tied sum left out gives 1.2e-2 (fp32 GPT); the norm of a
// stage's own gradients only (clipping per stage) 6.4e-3 (fp32 GPT) and 4.9e-3 (bf16 MLP).
// ZERO_TEST_PRINT=1 prints every measured difference (how the figures above were taken).
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "collectives/grid.hpp"
#include "core/world.hpp"
#include "models/gpt.hpp"
#include "models/mlp.hpp"
#include "optim/loss_scaler.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/pipeline_stage.hpp"
#include "runtime/pipeline/schedule.hpp"
#include "runtime/pipeline/stage_partition.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;

namespace {

constexpr int kSteps = 6;
constexpr int kGa = 4;     // micro-batches per data rank and step
constexpr int kMicro = 8;  // MLP samples per micro-batch
const models::MlpShape kMlp{12, 24, 4, 5};      // fc.0 .. fc.3, head: 5 Units
const models::GptShape kGpt{2, 16, 2, 13, 8};   // embedding, 2 blocks, head: 4 Units
const models::GptShape kGpt3{3, 16, 2, 13, 8};  // 5 Units

struct Setup {
  bool gpt = false;
  models::GptShape gpt_shape = kGpt;
  int pipeline = 2;
  const char* schedule = "1f1b";
  int zero = 0;
  ScalarType type = ScalarType::f32;
  bool offload = false;
  bool remat = false;  // activation checkpointing inside each stage
  float clip = 0.05f;  // active: the norms here are far above it
  std::optional<optim::LossScalerOptions> scaler = std::nullopt;  // fp16's dynamic loss scale
};

struct Run {
  std::vector<std::vector<float>> params;  // the stage's parameters (pipeline) or all (reference)
  std::vector<double> losses;
  int skipped = 0;  // steps skipped for fp16 overflow
};

Batch make_batch(Device& dev, bool gpt, int64_t index) {
  Batch b;
  if (gpt) {
    std::vector<int32_t> tok(16), tgt(16);
    for (size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<int32_t>((index * 7 + static_cast<int64_t>(i) * 3) % 13);
      tgt[i] = (tok[i] * 2 + 1) % 13;
    }
    b.inputs = Tensor::empty(dev, Shape{2, 8}, ScalarType::i32, MemCategory::activations);
    b.targets = Tensor::empty(dev, Shape{2, 8}, ScalarType::i32, MemCategory::activations);
    std::memcpy(b.inputs.data(), tok.data(), tok.size() * 4);
    std::memcpy(b.targets.data(), tgt.data(), tgt.size() * 4);
    return b;
  }
  static const models::MlpTeacherTask task(kMlp, 11);
  std::vector<float> feat;
  std::vector<int32_t> labels;
  task.batch(index * kMicro, kMicro, feat, labels);
  b.inputs = Tensor::empty(dev, Shape{kMicro, kMlp.in_features}, ScalarType::f32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{kMicro}, ScalarType::i32, MemCategory::activations);
  std::memcpy(b.inputs.data(), feat.data(), feat.size() * 4);
  std::memcpy(b.targets.data(), labels.data(), labels.size() * 4);
  return b;
}

Model build(const Setup& s, models::Ops& ops) {
  // The GPT's activations in the parameters' type, as zero-train trains it
  // (runtime/train/run.cpp); the MLP (its inputs are fp32 features) keeps fp32 ones.
  return s.gpt ? models::make_gpt({s.gpt_shape, s.type, s.type}, ops)
               : models::make_mlp({kMlp, s.type, ScalarType::f32}, ops);
}

EngineOptions options(const Setup& s, int stage, int ga) {
  EngineOptions o;
  o.stage = stage;
  o.gradient_accumulation_steps = ga;
  o.param_type = s.type;
  o.adam.weight_decay = 0.01f;
  o.gradient_clipping = s.clip;
  o.lr = [](int64_t t) { return 1e-2f * std::min(1.0f, static_cast<float>(t) / 3.0f); };
  o.seed = 5;
  o.offload_optimizer = s.offload;
  o.pin = offload::PinPolicy::off;
  o.loss_scaler = s.scaler;
  if (s.remat) o.number_checkpoints = 1000;
  return o;
}

// The reference: the whole model, stage 0, one rank, D x kGa micro-batches per step.
Run reference(const Setup& s, int data) {
  coll::Communicator& world = *test::env().comm;
  Device& dev = *test::env().device;
  auto alone = world.split(world.rank(), 0);
  auto stream = dev.create_stream("compute");
  auto ops = models::make_ops(dev, *stream);
  Model model = build(s, *ops);
  Setup r = s;
  r.offload = false;
  r.remat = false;
  // fp16: the reference runs the pipeline's ZeRO stage (on one rank), since where the 16-bit
  // gradients are summed decides which steps overflow: stage 0/1 add a step's micro-batches in
  // fp16, stage 2/3 reduce each one and add them in fp32 (engine_test's fp16 case), so stage 0
  // skips steps that stage 2 applies whatever the pipeline does.
  Engine engine(model, dev, *stream, *alone, options(r, s.scaler ? s.zero : 0, data * kGa));
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const StepStats st = engine.step([&](int m) { return make_batch(dev, s.gpt, int64_t{step} * 1000 + m); });
    run.losses.push_back(st.loss);
    run.skipped += st.applied ? 0 : 1;
  }
  for (int p = 0; p < static_cast<int>(model.params.size()); ++p) run.params.push_back(engine.parameter(p));
  return run;
}

// The pipeline: this rank's stage; its parameters in the view's order, with `to_original`.
Run pipelined(const Setup& s, std::vector<int>& to_original, std::vector<std::string>& names) {
  coll::Communicator& world = *test::env().comm;
  Device& dev = *test::env().device;
  coll::ProcessGrid grid(world, coll::grid_shape_for(world.size(), s.pipeline, 1));
  const int P = s.pipeline, D = world.size() / P;
  const coll::GridCoord me = grid.coord();
  auto stream = dev.create_stream("compute");
  auto ops = models::make_ops(dev, *stream);
  Model model = build(s, *ops);
  const pipeline::StageCut cut = pipeline::cut_uniform(static_cast<int>(model.units.size()), P);
  engine::PipelineStage st = engine::make_pipeline_stage(model, cut, grid.pipeline());
  Engine engine(st.view.model, dev, *stream, grid.data(), options(s, s.zero, kGa), st.place);
  const pipeline::Stage list = pipeline::schedule_by_name(s.schedule)(P, kGa, me.pipeline);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const StepStats ps = engine.pipeline_step(list, [&](int m) {
      return make_batch(dev, s.gpt, int64_t{step} * 1000 + int64_t{me.data} * kGa + m);
    });
    // The step's loss on every stage is its data rank's mean; the global one is their mean.
    float loss = static_cast<float>(ps.loss / D);
    grid.data().all_reduce(&loss, &loss, 1, DType::f32, coll::ReduceOp::sum).wait();
    run.losses.push_back(loss);
    run.skipped += ps.applied ? 0 : 1;
  }
  to_original = st.place.to_original;
  names.clear();
  for (size_t i = 0; i < st.view.model.params.size(); ++i) {
    run.params.push_back(engine.parameter(static_cast<int>(i)));
    names.push_back(st.view.model.params[i].name);
  }
  return run;
}

// ||a - b|| / ||b|| over the stage's parameters (engine_test's measure: an elementwise bound
// would be meaningless, Adam amplifies rounding noise of near-zero gradients to steps of order
// lr). Skipped as there: the GPT's key biases (exact gradient zero, only noise).
double rel_l2(const Run& got, const Run& ref, const std::vector<int>& to_original,
              const std::vector<std::string>& names, int n_embd) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.params.size(); ++i) {
    const std::vector<float>& a = got.params[i];
    const std::vector<float>& b = ref.params[static_cast<size_t>(to_original[i])];
    REQUIRE(a.size() == b.size());
    const bool key_bias = names[i].ends_with("attn.c_attn.bias");
    for (size_t k = 0; k < a.size(); ++k) {
      if (key_bias && k >= size_t(n_embd) && k < size_t(2 * n_embd)) continue;
      const double d = double(a[k]) - b[k];
      num += d * d;
      den += double(b[k]) * b[k];
    }
  }
  return std::sqrt(num / den);
}

void check(const Setup& s) {
  coll::Communicator& world = *test::env().comm;
  const int D = world.size() / s.pipeline;
  const Run ref = reference(s, D);
  std::vector<int> to_original;
  std::vector<std::string> names;
  const Run got = pipelined(s, to_original, names);
  const bool f32 = s.type == ScalarType::f32;
  CHECK(got.skipped == ref.skipped);  // the overflow decision is the whole model's
  const double tol = f32 ? 2e-6 : 1e-2, loss_tol = f32 ? 1e-5 : 3e-3;
  const double diff = rel_l2(got, ref, to_original, names, s.gpt_shape.n_embd);
  if (s.scaler) {  // the case exercises both the skip and applied steps
    CHECK(ref.skipped >= 1);
    CHECK(ref.skipped < kSteps);
  }
  INFO((s.gpt ? "gpt " + std::to_string(s.gpt_shape.n_layer) + " blocks" : std::string("mlp"))
       << ", " << s.pipeline << " stages x " << D << " data, " << s.schedule << ", ZeRO " << s.zero
       << ", " << to_string(s.type) << (s.offload ? ", offload" : "") << (s.remat ? ", remat" : "")
       << ", world rank " << world.rank() << ": relative L2 parameter difference " << diff
       << ", final loss " << got.losses.back() << " vs " << ref.losses.back());
  if (std::getenv("ZERO_TEST_PRINT")) std::printf("rank %d %s p%d %s zero%d %s%s%s: diff %.3g skipped %d/%d loss %.6f vs %.6f\n", world.rank(), s.gpt ? "gpt" : "mlp", s.pipeline, s.schedule, s.zero, std::string(to_string(s.type)).c_str(), s.offload ? " offload" : "", s.remat ? " remat" : "", diff, got.skipped, ref.skipped, got.losses.back(), ref.losses.back());
  CHECK(diff <= tol);
  for (int t = 0; t < kSteps; ++t)
    CHECK(std::abs(got.losses[t] - ref.losses[t]) <= loss_tol * std::abs(ref.losses[t]));
  // It trains: the loss falls (the bounds above mean nothing on a model that does not move).
  CHECK(ref.losses.back() < ref.losses.front());
}

// The pipeline depths this world size runs: 2 and 4 where they divide it into at most 2 data
// ranks (2 ranks: 2 x 1; 4: 2 x 2 and 4 x 1; 8: 4 x 2). More data ranks add bf16 noise of the
// order of the planted bugs' effect (measured 4.2e-3 at 2 x 4), and the issue asks for 1 and 2.
std::vector<int> depths() {
  const int W = test::env().comm->size();
  std::vector<int> out;
  for (int p : {2, 4})
    if (W % p == 0 && W / p <= 2) out.push_back(p);
  return out;
}

const char* const kSchedules[] = {"gpipe", "1f1b", "zb-h1"};

}  // namespace

TEST_CASE("pipeline x ZeRO: fp32 MLP of unequal stages under every schedule and ZeRO stage", "[pipeline]") {
  for (int p : depths())
    for (const char* sched : kSchedules)
      for (int zero = 0; zero <= 3; ++zero) check({.pipeline = p, .schedule = sched, .zero = zero});
}

TEST_CASE("pipeline x ZeRO: fp32 GPT with the tied embedding under every schedule and ZeRO stage", "[pipeline]") {
  for (int p : depths())
    for (const char* sched : kSchedules)
      for (int zero = 0; zero <= 3; ++zero) check({.gpt = true, .pipeline = p, .schedule = sched, .zero = zero});
}

TEST_CASE("pipeline x ZeRO: bf16", "[pipeline]") {
  for (int p : depths())
    for (const char* sched : kSchedules)
      for (int zero : {0, 2, 3}) {
        check({.pipeline = p, .schedule = sched, .zero = zero, .type = ScalarType::bf16});
        check({.gpt = true, .pipeline = p, .schedule = sched, .zero = zero, .type = ScalarType::bf16});
      }
}

TEST_CASE("pipeline x ZeRO: optimizer offload (speculative host step)", "[pipeline]") {
  for (int p : depths())
    for (int zero = 1; zero <= 3; ++zero) {
      check({.pipeline = p, .schedule = "zb-h1", .zero = zero, .offload = true});
      check({.gpt = true, .pipeline = p, .schedule = "1f1b", .zero = zero, .offload = true});
      check({.gpt = true, .pipeline = p, .schedule = "zb-h1", .zero = zero, .type = ScalarType::bf16,
             .offload = true});
    }
}

TEST_CASE("pipeline x ZeRO: activation checkpointing inside a stage of a GPT of 5 Units", "[pipeline]") {
  for (int p : depths())
    for (const char* sched : kSchedules) {
      check({.gpt = true, .gpt_shape = kGpt3, .pipeline = p, .schedule = sched, .zero = 1, .remat = true});
      check({.gpt = true, .gpt_shape = kGpt3, .pipeline = p, .schedule = sched, .zero = 3});
    }
}

// fp16 with the dynamic loss scale: starting at 2^16 the scaled gradients overflow, so the first
// steps are skipped and the scale halves until they fit (then steps are applied). Every stage
// must skip the same steps (the overflow is decided on the whole model's norm) and the run must
// equal the reference's, which runs the same ZeRO stage here (see reference()). Bound: the bf16
// one (engine_test's fp16 case holds its parameters within the bf16 bound too).
// Not the GPT at ZeRO 2/3: its tied wte's gradient is summed over the step's micro-batches in
// fp32 and enters the reduction once, rounded to fp16 (as every gradient does at ZeRO 0/1),
// while the rest of the model is reduced per micro-batch as ZeRO 2/3 do; neither one-rank run is
// the same arithmetic (measured: the pipeline skips one step more than ZeRO 2 on one rank, as
// many as ZeRO 1). docs/pipeline.md, "The executor", says so.
TEST_CASE("pipeline x ZeRO: fp16 with the dynamic loss scale skips the same steps", "[pipeline]") {
  optim::LossScalerOptions ls;
  ls.enabled = true;
  ls.initial_scale_power = 16;
  ls.loss_scale_window = 5;
  for (int p : depths())
    for (const char* sched : {"1f1b", "zb-h1"})
      for (int zero : {0, 1, 2}) {
        check({.pipeline = p, .schedule = sched, .zero = zero, .type = ScalarType::f16, .scaler = ls});
        if (zero <= 1)
          check({.gpt = true, .pipeline = p, .schedule = sched, .zero = zero, .type = ScalarType::f16,
                 .scaler = ls});
      }
}
