// ds_config.json -> EngineOptions (runtime/engine/from_config.hpp): every mapped key lands in its
// field, DeepSpeed's defaults come through, and the schedule is read at DeepSpeed's iteration.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "runtime/config/to_optim.hpp"
#include "runtime/engine/from_config.hpp"

using namespace zero;

namespace {

config::Config parse(const std::string& text, int world = 1) {
  config::Environment env;
  env.world_size = world;
  config::LoadResult r = config::parse_config(text, "test.json", env);
  std::string all;
  for (const config::Diagnostic& d : r.diagnostics) all += config::format_diagnostic(d, "test.json") + "\n";
  INFO(all);
  REQUIRE(r.ok());
  return r.config;
}

}  // namespace

TEST_CASE("engine options: a stage-3 bf16 config with every communication knob") {
  const config::Config c = parse(R"({
    "train_batch_size": 24, "train_micro_batch_size_per_gpu": 2,
    "bf16": {"enabled": true},
    "gradient_clipping": 0.5,
    "wall_clock_breakdown": true,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                                              "weight_decay": 0.1}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000, "stage3_prefetch_bucket_size": 2000,
                          "stage3_max_live_parameters": 3000, "stage3_param_persistence_threshold": 40},
    "activation_checkpointing": {"number_checkpoints": 2},
    "seed": 99
  })", 4);
  const EngineOptions o = engine_options(c, DeviceKind::cpu);
  CHECK(o.stage == 3);
  CHECK(o.gradient_accumulation_steps == 3);  // 24 = 2 x 3 x 4 ranks
  CHECK(o.param_type == ScalarType::bf16);
  CHECK_FALSE(o.loss_scaler.has_value());
  CHECK(o.gradient_clipping == 0.5f);
  CHECK(o.timers);
  CHECK(o.adam.beta1 == 0.8f);
  CHECK(o.adam.beta2 == 0.95f);
  CHECK(o.adam.eps == 1e-6f);
  CHECK(o.adam.weight_decay == 0.1f);
  CHECK(o.adam.adam_w_mode);
  CHECK(o.lr(1) == Catch::Approx(3e-4));  // no scheduler: the optimizer's lr
  CHECK(o.lr(1000) == Catch::Approx(3e-4));
  CHECK_FALSE(o.betas);
  CHECK(o.overlap_comm);  // DeepSpeed: absent means true at stage 3
  CHECK(o.reduce_bucket_size == 1000);
  CHECK(o.prefetch_bucket_size == 2000);
  CHECK(o.max_live_parameters == 3000);
  CHECK(o.param_persistence_threshold == 40);
  CHECK(o.number_checkpoints == 2);
  CHECK(o.seed == 99);
  CHECK_FALSE(o.offload_optimizer);
  CHECK_FALSE(o.offload_param);
}

TEST_CASE("engine options: offload blocks") {
  const config::Config c = parse(R"({"train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "offload_param": {"device": "cpu", "pin_memory": false}}})");
  const EngineOptions o = engine_options(c, DeviceKind::cpu);
  CHECK(o.offload_optimizer);
  CHECK(o.offload_param);
  CHECK(o.pin == offload::PinPolicy::off);  // one block asks for pageable memory
  // The speculative host step: absent means on for cuda, off on the cpu backend (its AdamW
  // would run on the cores backward uses); an explicit value wins on both.
  CHECK_FALSE(o.speculative_host_step);
  CHECK(engine_options(c, DeviceKind::cuda).speculative_host_step);
  for (const char* v : {"true", "false"}) {
    const config::Config e = parse(std::string(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
      "zero_train": {"speculative_host_step": )") + v + "}}");
    const bool want = std::string(v) == "true";
    CHECK(engine_options(e, DeviceKind::cpu).speculative_host_step == want);
    CHECK(engine_options(e, DeviceKind::cuda).speculative_host_step == want);
  }
}

TEST_CASE("engine options: DeepSpeed's defaults, fp16 loss scaling, overlap off below stage 3") {
  const config::Config c = parse(R"({"train_micro_batch_size_per_gpu": 1,
    "fp16": {"enabled": true, "initial_scale_power": 12},
    "zero_optimization": {"stage": 2}})");
  const EngineOptions o = engine_options(c, DeviceKind::cpu);
  CHECK(o.stage == 2);
  CHECK(o.param_type == ScalarType::f16);
  REQUIRE(o.loss_scaler.has_value());
  CHECK(o.loss_scaler->enabled);
  CHECK(o.loss_scaler->initial_scale_power == 12);
  CHECK_FALSE(o.overlap_comm);  // DeepSpeed: absent means false below stage 3
  CHECK(o.reduce_bucket_size == 500'000'000);
  CHECK(o.prefetch_bucket_size == 50'000'000);
  CHECK(o.max_live_parameters == 1'000'000'000);
  CHECK(o.param_persistence_threshold == 100'000);
  CHECK(o.gradient_clipping == 1.0f);
  CHECK_FALSE(o.timers);
}

TEST_CASE("engine options: WarmupLR runs at DeepSpeed's iteration, OneCycle moves beta1") {
  const config::Config warm = parse(R"({"train_micro_batch_size_per_gpu": 1,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                 "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  const EngineOptions w = engine_options(warm, DeviceKind::cpu);
  // DeepSpeed: the first applied step runs with what the scheduler's constructor set
  // (iteration -1: warmup_min_lr), step t at iteration t - 2, the max from step 12 on.
  CHECK(w.lr(1) == Catch::Approx(0.0).margin(1e-9));
  CHECK(w.lr(6) == Catch::Approx(0.004));
  CHECK(w.lr(11) == Catch::Approx(0.009));
  CHECK(w.lr(12) == Catch::Approx(0.01));
  CHECK(w.lr(500) == Catch::Approx(0.01));

  const config::Config cyc = parse(R"({"train_micro_batch_size_per_gpu": 1,
    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01,
                  "cycle_first_step_size": 10, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}})");
  const EngineOptions c = engine_options(cyc, DeviceKind::cpu);
  REQUIRE(c.betas);
  // Applied step t reads the schedule at DeepSpeed's iteration t - 2 (optim/lr_schedule.hpp
  // pins the formulas to DeepSpeed's; here: that the mapping reads them at the right place).
  const auto sched = optim::make_lr_schedule(config::to_schedule_spec(cyc.scheduler), 1e-3);
  for (int64_t t = 1; t <= 40; ++t) {
    CHECK(c.lr(t) == static_cast<float>(sched->lr(t - 2)));
    CHECK(c.betas(t).first == static_cast<float>(*sched->beta1(t - 2)));
    CHECK(c.betas(t).second == Catch::Approx(0.99));
  }
  // Momentum cycles inversely to the LR: lowest at the LR peak.
  CHECK(c.lr(11) == Catch::Approx(0.01));
  CHECK(c.betas(11).first == Catch::Approx(0.85));
  CHECK(c.betas(2).first > 0.9f);
}

TEST_CASE("engine options: weight decay applies to the model's matrices, or to all parameters") {
  CHECK_FALSE(engine_options(parse(R"({"train_batch_size": 1})"), DeviceKind::cpu).weight_decay_all);
  CHECK(engine_options(parse(R"({"train_batch_size": 1, "zero_train": {"weight_decay_applies_to": "all"}})"), DeviceKind::cpu)
            .weight_decay_all);
}

// Item 1 of issue 16: Hugging Face's "auto" templates resolve warmup_num_steps to 0, which the
// schedule used to refuse at start-up (after --validate had passed). DeepSpeed counts 0 as 2.
TEST_CASE("engine options: Hugging Face's auto templates build their schedules") {
  for (const char* name : {"hf_zero2_auto.json", "hf_zero3_auto.json", "hf_trainer_auto.json"}) {
    INFO(name);
    config::Environment env;
    const config::LoadResult r =
        config::load_config_file(std::string(ZERO_TEST_DATA_DIR) + "/configs/" + name, env);
    REQUIRE(r.ok());
    const EngineOptions o = engine_options(r.config, DeviceKind::cpu);
    // log warmup over max(2, 0) = 2 iterations from warmup_min_lr 0 to the optimizer's lr 1e-3.
    // Applied step t runs at DeepSpeed's iteration t - 2: step 1 at the constructor's lr
    // (warmup_min_lr), step 2 at ln(1)/ln(2) = 0, step 3 at ln(2)/ln(2) = 1.
    CHECK(o.lr(1) == 0.0f);
    CHECK(o.lr(2) == 0.0f);
    CHECK(o.lr(3) == 1e-3f);
  }
}

TEST_CASE("engine options: what the Engine would refuse is refused here, naming the key") {
  EngineOptions o;
  o.stage = 3;
  o.offload_param = true;
  CHECK_THROWS_WITH(check_engine_options(o),
                    Catch::Matchers::ContainsSubstring("zero_optimization.offload_param needs offload_optimizer"));
  o.offload_optimizer = true;
  CHECK_NOTHROW(check_engine_options(o));
  o.gradient_accumulation_steps = 0;
  CHECK_THROWS_WITH(check_engine_options(o), Catch::Matchers::ContainsSubstring("gradient_accumulation_steps"));
}
