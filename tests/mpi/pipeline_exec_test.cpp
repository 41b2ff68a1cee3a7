// The first pipeline executor (Engine::pipeline_step): an MLP of 4 Units cut into p stages
// (p = the world size, one data-parallel rank per stage), ZeRO stage 0, fp32, m = 4
// micro-batches, 3 steps, for gpipe, 1f1b and zb-h1. Every rank also trains the whole MLP alone
// with Engine::step on the same micro-batches; after every step the stage's parameters and, on
// the last stage, the loss must equal the reference's bitwise.
//
// Why bitwise: each Unit runs the same kernels on the same inputs (the boundary activation and
// gradient travel as exact bytes), and a parameter's gradient is the fp32 sum of its
// micro-batches' contributions added in the order its Unit's backward (or W) parts run. The
// reference (local_schedule) adds them in micro-batch order; 1f1b and zb-h1 run their backward
// parts in micro-batch order too, gpipe in reverse order. So the reference is fed the
// micro-batches in the order the stage's list runs its backwards (reverse for gpipe): then
// every addition is the same, and so are AdamW's elementwise updates (no clipping, scale 1/M
// either way). Without that reordering gpipe's gradients would differ from the natural order's
// by fp32 roundings of a 4-term sum (relative ~4 * 2^-24 per element), not bitwise. The loss is
// the double sum of 4 fp32 losses, exact in any order (doubles hold the sum of 4 floats of
// similar size exactly).
#include <catch2/catch_test_macros.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/world.hpp"
#include "models/mlp.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/pipeline_stage.hpp"
#include "runtime/pipeline/schedule.hpp"
#include "runtime/pipeline/stage_model.hpp"
#include "runtime/pipeline/stage_partition.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;

namespace {

constexpr int kSteps = 3;
constexpr int kM = 4;       // micro-batches per step
constexpr int kRows = 6;    // samples per micro-batch
const models::MlpShape kMlp{10, 12, 3, 5};  // fc.0, fc.1, fc.2, head: 4 Units

Batch make_batch(Device& dev, int64_t index, int rows = kRows) {
  static const models::MlpTeacherTask task(kMlp, 3);
  std::vector<float> feat;
  std::vector<int32_t> labels;
  task.batch(index * kRows, rows, feat, labels);
  Batch b;
  b.inputs = Tensor::empty(dev, Shape{rows, kMlp.in_features}, ScalarType::f32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{rows}, ScalarType::i32, MemCategory::activations);
  std::memcpy(b.inputs.data(), feat.data(), feat.size() * 4);
  std::memcpy(b.targets.data(), labels.data(), labels.size() * 4);
  return b;
}

EngineOptions options() {
  EngineOptions o;
  o.stage = 0;
  o.gradient_accumulation_steps = kM;
  o.adam.weight_decay = 0.01f;
  o.gradient_clipping = 0.0f;
  o.lr = [](int64_t t) { return 1e-2f * static_cast<float>(t); };
  o.seed = 9;
  return o;
}

void check_schedule(const char* name) {
  coll::Communicator& world = *test::env().comm;
  Device& dev = *test::env().device;
  const int p = world.size(), s = world.rank();
  auto alone = world.split(s, 0);  // the stage's data-parallel communicator: one rank
  auto stream = dev.create_stream("compute");
  auto ops = models::make_ops(dev, *stream);
  Model model = models::make_mlp({kMlp, ScalarType::f32, ScalarType::f32}, *ops);
  const pipeline::StageCut cut = pipeline::cut_uniform(static_cast<int>(model.units.size()), p);
  engine::PipelineStage st = engine::make_pipeline_stage(model, cut, world);
  const pipeline::StageModel& view = st.view;
  const pipeline::Stage list = pipeline::schedule_by_name(name)(p, kM, s);
  // The order this stage's backwards run the micro-batches (every stage's is the same).
  std::vector<int> order;
  for (const pipeline::Instruction& in : list)
    if (in.op == pipeline::Op::backward || in.op == pipeline::Op::backward_input) order.push_back(in.micro);
  REQUIRE(static_cast<int>(order.size()) == kM);

  Engine stage(st.view.model, dev, *stream, *alone, options(), st.place);
  Engine whole(model, dev, *stream, *alone, options());
  const int next = st.place.next();
  for (int step = 0; step < kSteps; ++step) {
    const StepStats ps = stage.pipeline_step(list, [&](int mb) {
      return make_batch(dev, int64_t{step} * 100 + mb);
    });
    const StepStats ref = whole.step([&](int m) {
      return make_batch(dev, int64_t{step} * 100 + order[static_cast<size_t>(m)]);
    });
    INFO("schedule " << name << ", stage " << s << " of " << p << ", step " << step);
    if (next < 0) CHECK(ps.loss == ref.loss);
    for (size_t i = 0; i < view.to_original.size(); ++i) {
      INFO("parameter " << view.model.params[i].name);
      CHECK(stage.parameter(static_cast<int>(i)) == whole.parameter(view.to_original[i]));
    }
  }
}

}  // namespace

TEST_CASE("pipeline executor: gpipe trains bitwise like one rank", "[pipeline]") { check_schedule("gpipe"); }
TEST_CASE("pipeline executor: 1f1b trains bitwise like one rank", "[pipeline]") { check_schedule("1f1b"); }
TEST_CASE("pipeline executor: zb-h1 trains bitwise like one rank", "[pipeline]") { check_schedule("zb-h1"); }

// From the second step the next stage posts each activation's receive with the first step's
// shape before the data arrives (docs/pipeline.md, "Transfers"), so a micro-batch whose
// activation changes shape is refused by the sender, before it sends anything: a clear error
// instead of a mismatched transfer (NCCL cannot even detect one). Only the first stage runs the
// failing step; it throws at send_activation, before any transfer of that step, so the other
// stages need not take part.
TEST_CASE("pipeline executor: an activation that changes shape after the first step is an error naming the stage",
          "[pipeline]") {
  coll::Communicator& world = *test::env().comm;
  Device& dev = *test::env().device;
  const int p = world.size(), s = world.rank();
  auto alone = world.split(s, 0);
  auto stream = dev.create_stream("compute");
  auto ops = models::make_ops(dev, *stream);
  Model model = models::make_mlp({kMlp, ScalarType::f32, ScalarType::f32}, *ops);
  const pipeline::StageCut cut = pipeline::cut_uniform(static_cast<int>(model.units.size()), p);
  engine::PipelineStage st = engine::make_pipeline_stage(model, cut, world);
  const pipeline::Stage list = pipeline::one_f_one_b(p, kM, s);
  Engine stage(st.view.model, dev, *stream, *alone, options(), st.place);
  stage.pipeline_step(list, [&](int mb) { return make_batch(dev, mb); });
  if (s == 0) {
    try {
      stage.pipeline_step(list, [&](int mb) { return make_batch(dev, 100 + mb, mb == 0 ? kRows + 1 : kRows); });
      FAIL("the changed shape was sent");
    } catch (const Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("pipeline stage 0 of " + std::to_string(p)) != std::string::npos);
      CHECK(what.find("micro-batch 0 is fp32 [7, 12] but was fp32 [6, 12] at the first step") != std::string::npos);
    }
  }
  world.barrier().wait();
}
