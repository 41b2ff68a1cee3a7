// Optimizer and parameter offload (EngineOptions::offload_optimizer / offload_param) on the cpu
// backend: the same training as without offload, the model state where the ledger says (device
// and host, by category), the host<->device traffic of a step, and capacity: one rank trains a
// model whose optimizer state alone is larger than the device.
//
// Bitwise: offload moves where AdamW and the gradient accumulation run, not their arithmetic
// (the same kernels on the same values in the same order, the norm's per-group partial sums
// added in group order), so every loss and parameter must be bitwise equal to the run without
// offload on the same ranks.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>

#include "models/gpt.hpp"
#include "models/mlp.hpp"
#include "core/world.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;

namespace {

const models::MlpShape kMlp{12, 24, 2, 5};  // 1,037 parameters: divides by no world size here
constexpr int kSteps = 12;
constexpr int kMicro = 8;

Batch mlp_batch(Device& dev, int64_t index) {
  static const models::MlpTeacherTask task(kMlp, 11);
  std::vector<float> feat;
  std::vector<int32_t> labels;
  task.batch(index * kMicro, kMicro, feat, labels);
  Batch b;
  b.inputs = Tensor::empty(dev, Shape{kMicro, kMlp.in_features}, ScalarType::f32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{kMicro}, ScalarType::i32, MemCategory::activations);
  std::memcpy(b.inputs.data(), feat.data(), feat.size() * 4);
  std::memcpy(b.targets.data(), labels.data(), labels.size() * 4);
  return b;
}

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
  int kept = 0, dropped = 0, skipped = 0;  // speculative host steps; fp16 overflow steps
};

Run train(const EngineOptions& base, bool offload, bool offload_param) {
  coll::Communicator& comm = *test::env().comm;
  auto dev = make_device(DeviceKind::cpu);
  auto stream = dev->create_stream("compute");
  auto ops = models::make_ops(*dev, *stream);
  Model model = models::make_mlp({kMlp, base.param_type, ScalarType::f32}, *ops);
  EngineOptions o = base;
  o.offload_optimizer = offload;
  o.offload_param = offload_param;
  o.pin = offload::PinPolicy::off;  // the test is about the arithmetic; pinning has its own tests
  Engine engine(model, *dev, *stream, comm, o);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const StepStats st = engine.step([&](int m) {
      return mlp_batch(*dev, int64_t{step} * 1000 + int64_t{comm.rank()} * o.gradient_accumulation_steps + m);
    });
    run.losses.push_back(st.loss);
    run.kept += st.speculation == StepStats::Speculation::kept;
    run.dropped += st.speculation == StepStats::Speculation::dropped;
    run.skipped += !st.applied;
  }
  for (int p = 0; p < static_cast<int>(model.params.size()); ++p) run.params.push_back(engine.parameter(p));
  return run;
}

}  // namespace

// The speculative host step (AdamW during backward, kept when the norm says the step is applied
// unclipped) must not change a bit either: with clipping active on every step (the guess is
// dropped on the first step and not made again), with clipping that never binds (kept on every
// step), with fp16 overflow steps (dropped, skipped, guessing again after a clean step), and
// with the speculation off.
TEST_CASE("offload: the same training as without, bitwise, stages 1-3") {
  for (ScalarType type : {ScalarType::f32, ScalarType::bf16, ScalarType::f16})
    for (int ga : {1, 3})
      for (int stage = 1; stage <= 3; ++stage)
        for (bool param : {false, true})
          for (float clip : {0.05f, 100.0f}) {
            if (param && stage != 3) continue;
            EngineOptions o;
            o.stage = stage;
            o.param_type = type;
            o.gradient_accumulation_steps = ga;
            o.gradient_clipping = clip;
            o.adam.weight_decay = 0.01f;
            o.lr = [](int64_t t) { return 1e-2f * std::min(1.0f, static_cast<float>(t) / 5.0f); };
            o.seed = 3;
            o.param_persistence_threshold = 300;  // a mix of whole and partitioned groups at stage 3
            if (type == ScalarType::f16) {  // 2^24 overflows fp16 at once: skipped steps first
              optim::LossScalerOptions ls;
              ls.enabled = true;
              ls.initial_scale_power = 24;
              ls.hysteresis = 1;
              o.loss_scaler = ls;
            }
            const Run off = train(o, false, false);
            const Run on = train(o, true, param);
            INFO("stage " << stage << ", " << to_string(type) << ", accumulation " << ga
                          << (param ? ", offload_param" : "") << ", clipping " << clip);
            CHECK(on.losses == off.losses);
            CHECK(on.params == off.params);
            CHECK(on.skipped == off.skipped);
            CHECK(on.kept + on.dropped <= kSteps);
            if (type != ScalarType::f16) {
              CHECK(on.skipped == 0);
              // Active clipping: one wrong guess, then none; clipping never binding: all kept.
              CHECK(on.kept == (clip < 1 ? 0 : kSteps));
              CHECK(on.dropped == (clip < 1 ? 1 : 0));
            } else {
              // The first step overflows: guessed and dropped. After a skipped or clipped step
              // the next is not guessed; after a clean one it is again.
              CHECK(on.skipped > 0);
              CHECK(on.skipped < kSteps);
              CHECK(on.dropped >= 1);
              CHECK((clip < 1 ? on.kept == 0 : on.kept > 0));
            }
            if (type == ScalarType::bf16 && clip < 1) {  // and with the speculation off
              o.speculative_host_step = false;
              const Run plain = train(o, true, param);
              CHECK(plain.losses == off.losses);
              CHECK(plain.params == off.params);
              CHECK(plain.kept + plain.dropped == 0);
            }
          }
}

TEST_CASE("offload: the ledger shows the state on the host, and 2 bytes per parameter each way") {
  coll::Communicator& comm = *test::env().comm;
  for (int stage = 1; stage <= 3; ++stage)
    for (bool param : {false, true}) {
      if (param && stage != 3) continue;
      auto dev = make_device(DeviceKind::cpu);
      auto stream = dev->create_stream("compute");
      auto ops = models::make_ops(*dev, *stream);
      const models::GptShape shape{2, 64, 4, 64, 32};
      Model model = models::make_gpt({shape, ScalarType::bf16, ScalarType::f32}, *ops);
      EngineOptions o;
      o.stage = stage;
      o.param_type = ScalarType::bf16;
      o.offload_optimizer = true;
      o.offload_param = param;
      o.pin = offload::PinPolicy::off;
      Engine engine(model, *dev, *stream, comm, o);
      INFO("stage " << stage << (param ? " with offload_param" : "") << "\n" << engine.memory_report());
      const LedgerSnapshot snap = dev->ledger().snapshot();
      const Engine::ModelStateBytes d = engine.expected_model_state(), h = engine.expected_host_state();
      CHECK(snap.at(MemSpace::device, MemCategory::parameters).current == d.parameters);
      CHECK(snap.at(MemSpace::device, MemCategory::gradients).current == d.gradients);
      CHECK(snap.at(MemSpace::device, MemCategory::master_weights).current == 0);
      CHECK(snap.at(MemSpace::device, MemCategory::optimizer_states).current == 0);
      CHECK(snap.at(MemSpace::host, MemCategory::parameters).current == h.parameters);
      CHECK(snap.at(MemSpace::host, MemCategory::gradients).current == h.gradients);
      CHECK(snap.at(MemSpace::host, MemCategory::master_weights).current == h.master);
      CHECK(snap.at(MemSpace::host, MemCategory::optimizer_states).current == h.optimizer);
      // The ZeRO-Offload split: 12 bytes of fp32 state per parameter on the host, per rank 1/N.
      const size_t shard = static_cast<size_t>(engine.partition().shard_numel_total());
      CHECK(h.master + h.optimizer == 2 * 12 * shard);  // the speculative step's second bank

      // One step moves each rank's gradient shard down and its updated parameter shard up, in
      // bf16: 2 bytes per parameter of the shard each way. With offload_param the updated shards
      // stay on the host, and what goes up is each shard ahead of its all-gather: once per step
      // here, since DeepSpeed's default prefetch keeps every group gathered from the end of one
      // optimizer step through the next backward.
      const offload::CopyCounters before = engine.offload_traffic();
      engine.step([&](int) {
        Batch b;
        b.inputs = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        b.targets = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        for (int i = 0; i < 64; ++i) {
          b.inputs.data_as<int32_t>()[i] = (i * 7) % 64;
          b.targets.data_as<int32_t>()[i] = (i * 3 + 1) % 64;
        }
        return b;
      });
      const offload::CopyCounters after = engine.offload_traffic();
      CHECK(after.to_host_bytes - before.to_host_bytes == 2 * shard);
      CHECK(after.to_device_bytes - before.to_device_bytes == 2 * shard);
    }
}

TEST_CASE("offload: one rank trains a model whose optimizer state alone exceeds the device") {
  coll::Communicator& world = *test::env().comm;
  if (world.size() != 1) SKIP("one-rank capacity case (run by the np1 test)");
  // 1.88M parameters, bf16: Adam's fp32 state (master, m, v) is 22.5 MB, the device has 16 MiB.
  const models::GptShape shape{4, 192, 4, 512, 32};
  DeviceOptions limit;
  limit.memory_limit = size_t{16} << 20;
  auto run = [&](bool offload, bool param, int steps) {
    auto dev = make_device(DeviceKind::cpu, 0, limit);
    auto stream = dev->create_stream("compute");
    auto ops = models::make_ops(*dev, *stream);
    Model model = models::make_gpt({shape, ScalarType::bf16, ScalarType::f32}, *ops);
    EngineOptions o;
    o.stage = param ? 3 : 2;
    o.param_type = ScalarType::bf16;
    o.offload_optimizer = offload;
    o.offload_param = param;
    o.pin = offload::PinPolicy::off;
    o.reduce_bucket_size = o.prefetch_bucket_size = o.max_live_parameters = 500'000;
    Engine engine(model, *dev, *stream, world, o);
    double first = 0, last = 0;
    for (int s = 0; s < steps; ++s) {
      last = engine.step([&](int) {
        Batch b;
        b.inputs = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        b.targets = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        for (int i = 0; i < 64; ++i) {
          b.inputs.data_as<int32_t>()[i] = (i * 7) % 512;
          b.targets.data_as<int32_t>()[i] = (i * 3 + 1) % 512;
        }
        return b;
      }).loss;
      if (s == 0) first = last;
    }
    const LedgerSnapshot snap = dev->ledger().snapshot();
    INFO(snap.table());
    if (offload) {
      CHECK(snap.at(MemSpace::host, MemCategory::master_weights).current +
                snap.at(MemSpace::host, MemCategory::optimizer_states).current > limit.memory_limit);
      CHECK(snap.at(MemSpace::device, MemCategory::optimizer_states).peak == 0);
    }
    return std::pair{first, last};
  };
  REQUIRE(models::gpt_parameter_count(shape) * 12 > static_cast<int64_t>(limit.memory_limit));
  CHECK_THROWS_AS(run(false, false, 1), OutOfMemory);
  const auto [f2, l2] = run(true, false, 5);
  CHECK(l2 < f2);
  const auto [f3, l3] = run(true, true, 5);
  CHECK(l3 < f3);
}

// The speculative host step's second copy of the optimizer state is a speed-up: when the host
// memory limit leaves no room for it, the engine warns, runs norm-first, and trains the same.
TEST_CASE("offload: no room for the speculative step's second bank: norm-first, same training") {
  coll::Communicator& comm = *test::env().comm;
  // 4.35M parameters: on up to 4 ranks the state plus half a second bank is more than the copy
  // engine's 16 MiB of staging, which is allocated (and, unpinned, released) first.
  const models::GptShape shape{2, 384, 4, 2048, 32};
  EngineOptions o;
  o.stage = 2;
  o.param_type = ScalarType::bf16;
  o.gradient_clipping = 100.0f;  // never binds: with room, every step would be kept ahead
  o.offload_optimizer = true;
  o.pin = offload::PinPolicy::off;
  struct Out {
    std::vector<double> losses;
    int kept = 0;
    size_t host_peak = 0, host_now = 0, owned = 0;
  };
  auto run = [&](bool speculative, size_t host_limit) {
    DeviceOptions d;
    d.host_memory_limit = host_limit;
    auto dev = make_device(DeviceKind::cpu, 0, d);
    auto stream = dev->create_stream("compute");
    auto ops = models::make_ops(*dev, *stream);
    Model model = models::make_gpt({shape, o.param_type, ScalarType::f32}, *ops);
    EngineOptions oo = o;
    oo.speculative_host_step = speculative;
    Engine engine(model, *dev, *stream, comm, oo);
    Out out;
    for (int step = 0; step < 4; ++step) {
      const StepStats st = engine.step([&](int) {
        Batch b;
        b.inputs = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        b.targets = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        for (int i = 0; i < 64; ++i) {
          b.inputs.data_as<int32_t>()[i] = (step * 7 + comm.rank() * 3 + i * 13) % 2048;
          b.targets.data_as<int32_t>()[i] = (step * 5 + comm.rank() + i * 11) % 2048;
        }
        return b;
      });
      out.losses.push_back(st.loss);
      out.kept += st.speculation == StepStats::Speculation::kept;
    }
    out.host_peak = dev->ledger().snapshot().total[1].peak;
    out.host_now = dev->ledger().snapshot().total[1].current;
    out.owned = engine.expected_host_state().master / (engine.expected_host_state().master == 0 ? 1 : 4);
    return out;
  };
  const Out plain = run(false, 0);  // norm-first, no second bank
  const size_t owned = plain.owned;
  REQUIRE(owned > 0);
  const Out roomy = run(true, 0);
  CHECK(roomy.kept == 4);
  CHECK(roomy.losses == plain.losses);
  // Room for the norm-first state and half of the second bank (12 bytes per owned element).
  const size_t tight = plain.host_now + 6 * owned;
  REQUIRE(tight > plain.host_peak);
  const Out squeezed = run(true, tight);
  CHECK(squeezed.kept == 0);
  CHECK(squeezed.host_peak <= tight);
  CHECK(squeezed.losses == plain.losses);
}
