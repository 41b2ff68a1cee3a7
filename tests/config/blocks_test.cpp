// The blocks of runtime/config/blocks.cpp: defaults, "auto" rules, aliases, optimizer, scheduler,
// precision and our zero_train section.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <variant>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("a minimal config gets every default", "[defaults]") {
  const LoadResult r = parse(R"({"train_micro_batch_size_per_gpu": 4})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.diagnostics.empty());
  const Config& c = r.config;
  CHECK(c.batch.train_batch_size == 4);
  CHECK(c.batch.train_micro_batch_size_per_gpu == 4);
  CHECK(c.batch.gradient_accumulation_steps == 1);
  CHECK(c.steps_per_print == 10);
  CHECK_FALSE(c.wall_clock_breakdown);
  CHECK(c.gradient_clipping == 1.0);
  CHECK_FALSE(c.prescale_gradients);
  CHECK(c.gradient_predivide_factor == 1.0);
  CHECK_FALSE(c.communication_data_type.has_value());
  CHECK(c.seed == 1234);
  // Absent optimizer: AdamW with DeepSpeed's Adam defaults.
  CHECK(c.optimizer.type == OptimizerType::AdamW);
  CHECK(c.optimizer.params.lr == 1e-3);
  CHECK(c.optimizer.params.betas == std::array<double, 2>{0.9, 0.999});
  CHECK(c.optimizer.params.eps == 1e-8);
  CHECK(c.optimizer.params.weight_decay == 0.0);
  CHECK(c.optimizer.params.adam_w_mode);
  CHECK(c.optimizer.params.bias_correction);
  CHECK_FALSE(c.scheduler.enabled());
  CHECK(c.scheduler.type_name().empty());
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.fp16.loss_scale == 0.0);
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.fp16.hysteresis == 2);
  CHECK_FALSE(c.fp16.consecutive_hysteresis);
  CHECK(c.fp16.min_loss_scale == 1.0);
  CHECK_FALSE(c.bf16.enabled);
  CHECK(c.precision() == Precision::fp32);
  CHECK(c.communication_precision() == Precision::fp32);
  CHECK(c.aio.block_size == 1'048'576);
  CHECK(c.aio.queue_depth == 8);
  CHECK(c.aio.intra_op_parallelism == 1);
  CHECK_FALSE(c.aio.single_submit);
  CHECK(c.aio.overlap_events);
  CHECK_FALSE(c.activation_checkpointing.partition_activations);
  CHECK_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  CHECK_FALSE(c.ours.device.has_value());
  CHECK(c.ours.device_memory_limit == 0);
  CHECK(c.ours.host_memory_limit == 0);
  CHECK(c.ours.steps == 100);
  CHECK(c.ours.model_preset == "tiny");
  CHECK(c.ours.model == zero::models::GptShape{2, 128, 4, 64, 64});
}

TEST_CASE("precision: fp16, bf16, both is an error", "[precision]") {
  CHECK(parse_with(R"("fp16": {"enabled": true})").config.precision() == Precision::fp16);
  CHECK(parse_with(R"("bf16": {"enabled": true})").config.precision() == Precision::bf16);
  const LoadResult both = parse_with(R"("fp16": {"enabled": true}, "bf16": {"enabled": true})");
  CHECK(message_at(both, "fp16.enabled") ==
        "fp16 and bf16 are both enabled; enable at most one (bf16 needs no loss scaling)");
  const LoadResult comm = parse_with(R"("bf16": {"enabled": true}, "communication_data_type": "fp32")");
  CHECK(comm.config.communication_precision() == Precision::fp32);
  CHECK(parse_with(R"("bf16": {"enabled": true})").config.communication_precision() ==
        Precision::bf16);
}

TEST_CASE("communication_data_type accepts the usual spellings and null", "[types]") {
  const std::pair<const char*, Precision> cases[] = {
      {"fp32", Precision::fp32}, {"float32", Precision::fp32}, {"float", Precision::fp32},
      {"fp16", Precision::fp16}, {"float16", Precision::fp16}, {"half", Precision::fp16},
      {"bf16", Precision::bf16}, {"bfloat16", Precision::bf16}};
  for (const auto& [name, p] : cases) {
    const LoadResult r =
        parse_with(std::string(R"("communication_data_type": ")") + name + "\"");
    INFO(name << "\n" << all(r));
    REQUIRE(r.ok());
    CHECK(r.config.communication_data_type == p);
    // Printed under the canonical name.
    CHECK_THAT(effective_config_json(r.config),
               ContainsSubstring(std::string("\"communication_data_type\": \"") +
                                 std::string(to_string(p)) + "\""));
  }
  CHECK_FALSE(parse_with(R"("communication_data_type": null)").config.communication_data_type);
}

TEST_CASE("fp16/bf16 \"auto\": bf16 where supported, else fp32; an explicit value wins",
          "[auto][precision]") {
  Environment no_bf16;
  no_bf16.bf16_supported = false;
  const char* both_auto = R"("fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"})";
  CHECK(parse_with(both_auto).config.precision() == Precision::bf16);
  CHECK(parse_with(both_auto, no_bf16).config.precision() == Precision::fp32);
  // Only the fp16 block (older Hugging Face examples): still the automatic choice.
  CHECK(parse_with(R"("fp16": {"enabled": "auto"})").config.precision() == Precision::bf16);
  CHECK(parse_with(R"("bf16": {"enabled": "auto"})", no_bf16).config.precision() ==
        Precision::fp32);
  // Explicit values win.
  CHECK(parse_with(R"("fp16": {"enabled": true}, "bf16": {"enabled": "auto"})").config.precision() ==
        Precision::fp16);
  CHECK(parse_with(R"("fp16": {"enabled": "auto"}, "bf16": {"enabled": false})").config.precision() ==
        Precision::fp32);
  CHECK(parse_with(R"("fp16": {"enabled": false}, "bf16": {"enabled": "auto"})").config.precision() ==
        Precision::bf16);
}

TEST_CASE("optimizer: Adam and AdamW in any case; others are a clear error", "[optimizer]") {
  CHECK(parse_with(R"("optimizer": {"type": "adam"})").config.optimizer.type == OptimizerType::Adam);
  CHECK(parse_with(R"("optimizer": {"type": "ADAMW"})").config.optimizer.type ==
        OptimizerType::AdamW);
  for (const char* other : {"Lamb", "OneBitAdam", "SGD"}) {
    const LoadResult r = parse_with(std::string(R"("optimizer": {"type": ")") + other + "\"}");
    CHECK(message_at(r, "optimizer.type") ==
          std::string("expected one of \"AdamW\", \"Adam\" (any case), got \"") + other +
              "\" (a string); other DeepSpeed optimizers (Lamb, OneBitAdam, SGD, Adagrad, ...) are "
              "not supported by zero-train");
  }
  CHECK(message_at(parse_with(R"("optimizer": {"params": {"lr": 0.1}})"), "optimizer.type") ==
        "missing: expected one of \"AdamW\", \"Adam\" (any case); other DeepSpeed optimizers "
        "(Lamb, OneBitAdam, SGD, Adagrad, ...) are not supported by zero-train");
}

TEST_CASE("optimizer params: values, adam_w_mode, amsgrad", "[optimizer]") {
  const LoadResult r = parse_with(R"("optimizer": {"type": "Adam", "params": {
      "lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.01,
      "bias_correction": false, "adam_w_mode": false}})");
  INFO(all(r));
  REQUIRE(r.ok());
  const AdamParams& p = r.config.optimizer.params;
  CHECK(p.lr == 3e-4);
  CHECK(p.betas == std::array<double, 2>{0.8, 0.95});
  CHECK(p.eps == 1e-6);
  CHECK(p.weight_decay == 0.01);
  CHECK_FALSE(p.bias_correction);
  CHECK_FALSE(p.adam_w_mode);  // Adam may use L2 regularisation

  const LoadResult w = parse_with(R"("optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}})");
  CHECK(w.ok());
  CHECK(w.config.optimizer.params.adam_w_mode);  // AdamW forces decoupled decay
  CHECK(message_at(w, "optimizer.params.adam_w_mode", Severity::warning) ==
        "false is overridden: optimizer type AdamW always uses decoupled weight decay (use type "
        "Adam for L2 regularisation)");

  CHECK(message_at(parse_with(R"("optimizer": {"type": "Adam", "params": {"amsgrad": true}})"),
                   "optimizer.params.amsgrad") ==
        "true is not supported (zero-train implements Adam/AdamW without AMSGrad); set it to false "
        "or remove it");
}

TEST_CASE("optimizer \"auto\" params take the defaults, lr the --lr flag", "[auto][optimizer]") {
  const char* body = R"("optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                       "eps": "auto", "weight_decay": "auto"}})";
  const LoadResult r = parse_with(body);
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.optimizer.params.lr == 1e-3);
  CHECK(r.config.optimizer.params.betas == std::array<double, 2>{0.9, 0.999});
  CHECK(r.config.optimizer.params.eps == 1e-8);
  CHECK(r.config.optimizer.params.weight_decay == 0.0);

  Environment env;
  env.lr_flag = 2.5e-4;
  CHECK(parse_with(body, env).config.optimizer.params.lr == 2.5e-4);
  CHECK(parse_with("", env).config.optimizer.params.lr == 2.5e-4);  // no optimizer block at all
  const LoadResult clash =
      parse_with(R"("optimizer": {"type": "AdamW", "params": {"lr": 0.001}})", env);
  CHECK(message_at(clash, "optimizer.params.lr") ==
        "the file says 0.001 but --lr says 0.00025; remove one of them (or set the key to \"auto\" "
        "to take the flag)");
}

TEST_CASE("gradient_clipping \"auto\" is 1.0", "[auto]") {
  const LoadResult r = parse_with(R"("gradient_clipping": "auto")");
  REQUIRE(r.ok());
  CHECK(r.config.gradient_clipping == 1.0);
  CHECK(parse_with(R"("gradient_clipping": 0)").config.gradient_clipping == 0.0);
}

TEST_CASE("scheduler types and their DeepSpeed defaults", "[scheduler]") {
  SECTION("WarmupLR") {
    const LoadResult r = parse_with(R"("scheduler": {"type": "WarmupLR"})");
    INFO(all(r));
    REQUIRE(r.ok());
    const auto& p = std::get<WarmupLR>(r.config.scheduler.params);
    CHECK(r.config.scheduler.type_name() == "WarmupLR");
    CHECK(p.warmup_min_lr == 0.0);
    CHECK(p.warmup_max_lr == 1e-3);
    CHECK(p.warmup_num_steps == 1000);
    CHECK(p.warmup_type == WarmupType::log);
    CHECK(p.last_batch_iteration == -1);
  }
  SECTION("WarmupDecayLR needs total_num_steps") {
    const LoadResult ok = parse_with(
        R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5000, "warmup_type": "linear"}})");
    REQUIRE(ok.ok());
    const auto& p = std::get<WarmupDecayLR>(ok.config.scheduler.params);
    CHECK(p.total_num_steps == 5000);
    CHECK(p.warmup_type == WarmupType::linear);
    CHECK(p.warmup_num_steps == 1000);
    CHECK(message_at(parse_with(R"("scheduler": {"type": "WarmupDecayLR"})"),
                     "scheduler.params.total_num_steps") == "missing: expected an integer >= 1");
    const LoadResult short_total = parse_with(
        R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10}})");
    CHECK(short_total.ok());
    CHECK(message_at(short_total, "scheduler.params.total_num_steps", Severity::warning) ==
          "10 is less than warmup_num_steps 1000: the schedule never leaves warmup");
  }
  SECTION("WarmupCosineLR") {
    const LoadResult r = parse_with(
        R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2000}})");
    INFO(all(r));
    REQUIRE(r.ok());
    const auto& p = std::get<WarmupCosineLR>(r.config.scheduler.params);
    CHECK(p.warmup_min_ratio == 0.0);
    CHECK(p.cos_min_ratio == 1e-4);
    CHECK(p.warmup_num_steps == 1000);
    CHECK(p.warmup_type == WarmupType::log);
  }
  SECTION("OneCycle: min and max lr required; the second half mirrors the first") {
    const LoadResult r = parse_with(R"("scheduler": {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 500,
        "cycle_first_stair_count": 3}})");
    INFO(all(r));
    REQUIRE(r.ok());
    const auto& p = std::get<OneCycle>(r.config.scheduler.params);
    CHECK(p.cycle_second_step_size == 500);
    CHECK(p.cycle_second_stair_count == 3);
    CHECK(p.decay_lr_rate == 0.0);
    CHECK(p.decay_step_size == 0);
    CHECK(p.cycle_momentum);
    CHECK(p.cycle_min_mom == 0.8);
    CHECK(p.cycle_max_mom == 0.9);
    CHECK(p.decay_mom_rate == 0.0);
    const LoadResult second = parse_with(R"("scheduler": {"type": "OneCycle", "params": {
        "cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_second_step_size": 7}})");
    const auto& q = std::get<OneCycle>(second.config.scheduler.params);
    CHECK(q.cycle_first_step_size == 2000);
    CHECK(q.cycle_second_step_size == 7);
    const LoadResult missing = parse_with(R"("scheduler": {"type": "OneCycle"})");
    CHECK(message_at(missing, "scheduler.params.cycle_min_lr") == "missing: expected a number in [0, 1]");
    CHECK(message_at(missing, "scheduler.params.cycle_max_lr") == "missing: expected a number in [0, 1]");
  }
  SECTION("LRRangeTest") {
    const LoadResult r = parse_with(R"("scheduler": {"type": "LRRangeTest", "params": {}})");
    REQUIRE(r.ok());
    const auto& p = std::get<LRRangeTest>(r.config.scheduler.params);
    CHECK(p.lr_range_test_min_lr == 1e-3);
    CHECK(p.lr_range_test_step_size == 2000);
    CHECK(p.lr_range_test_step_rate == 1.0);
    CHECK_FALSE(p.lr_range_test_staircase);
  }
  SECTION("unknown or missing type, bad warmup_type") {
    CHECK(message_at(parse_with(R"("scheduler": {"type": "CosineAnnealing"})"), "scheduler.type") ==
          "expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", \"OneCycle\", "
          "\"LRRangeTest\", got \"CosineAnnealing\" (a string)");
    const LoadResult untyped = parse_with(R"("scheduler": {"params": {"warmup_num_steps": 5}})");
    CHECK(count(untyped, Severity::error) == 1);  // no second error about the params
    CHECK_THAT(message_at(untyped, "scheduler.type"), ContainsSubstring("missing: expected one of"));
    CHECK(message_at(parse_with(
                         R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}})"),
                     "scheduler.params.warmup_type") ==
          "expected one of \"log\", \"linear\", got \"cosine\" (a string)");
  }
}

TEST_CASE("scheduler \"auto\" params: 0, the optimizer lr, the flag or 0, the job's steps",
          "[auto][scheduler]") {
  const char* body = R"("optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
        "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "zero_train": {"steps": 250})";
  const LoadResult r = parse_with(body);
  INFO(all(r));
  REQUIRE(r.ok());
  const auto& p = std::get<WarmupDecayLR>(r.config.scheduler.params);
  CHECK(p.warmup_min_lr == 0.0);
  CHECK(p.warmup_max_lr == 3e-4);
  CHECK(p.warmup_num_steps == 0);
  CHECK(p.total_num_steps == 250);

  Environment env;
  env.warmup_steps_flag = 40;
  env.steps_flag = 900;
  env.lr_flag = 1e-2;
  const LoadResult f = parse_with(R"("optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
        "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}})",
                                  env);
  INFO(all(f));
  REQUIRE(f.ok());
  const auto& q = std::get<WarmupDecayLR>(f.config.scheduler.params);
  CHECK(q.warmup_max_lr == 1e-2);
  CHECK(q.warmup_num_steps == 40);
  CHECK(q.total_num_steps == 900);
  CHECK(f.config.ours.steps == 900);

  // WarmupCosineLR has the same total_num_steps rule.
  const LoadResult c = parse_with(
      R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 10}})");
  REQUIRE(c.ok());
  CHECK(std::get<WarmupCosineLR>(c.config.scheduler.params).total_num_steps == 100);

  // OneCycle has no auto rule for its lrs.
  CHECK_THAT(message_at(parse_with(R"("scheduler": {"type": "OneCycle", "params": {
                 "cycle_min_lr": 0, "cycle_max_lr": "auto"}})"),
                        "scheduler.params.cycle_max_lr"),
             ContainsSubstring("\"auto\" is not supported for this key"));

  Environment warm;
  warm.warmup_steps_flag = 5;
  CHECK(message_at(parse_with("", warm), "", Severity::warning) ==
        "--warmup-steps has no effect: the config has no scheduler");
}

TEST_CASE("bfloat16 is the old name of bf16", "[aliases]") {
  const LoadResult r = parse_with(R"("bfloat16": {"enabled": true})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.bf16.enabled);
  CHECK(message_at(r, "bfloat16", Severity::warning) == "deprecated name; use 'bf16' instead");
  CHECK(parse_with(R"("bfloat16": {"enabled": true}, "bf16": {"enabled": true})").ok());
  CHECK(message_at(parse_with(R"("bfloat16": {"enabled": true}, "bf16": {"enabled": false})"),
                   "bfloat16") ==
        "is {\"enabled\":true} but 'bf16' (the same block) is {\"enabled\":false}; keep only "
        "'bf16'");
  CHECK_THAT(message_at(parse_with(R"("bfloat16": {"enabld": true})"), "bfloat16.enabld"),
             ContainsSubstring("did you mean 'enabled'?"));
}

TEST_CASE("aio.thread_count is the old name of intra_op_parallelism", "[aliases]") {
  const LoadResult r = parse_with(R"("aio": {"thread_count": 4})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.aio.intra_op_parallelism == 4);
  // One note: the old name (the aio settings drive the NVMe swaps).
  CHECK(message_at(r, "aio.thread_count", Severity::warning) ==
        "deprecated name; use 'aio.intra_op_parallelism' instead");
  CHECK(message_at(parse_with(R"("aio": {"thread_count": 4, "intra_op_parallelism": 2})"),
                   "aio.thread_count") ==
        "is 4 but 'aio.intra_op_parallelism' (the same setting) is 2; keep only "
        "'intra_op_parallelism'");
}

TEST_CASE("zero_train: device, memory limits, steps", "[ours]") {
  const LoadResult r = parse_with(
      R"("zero_train": {"device": "cpu", "device_memory_limit": "24GiB",
                        "host_memory_limit": 1073741824, "steps": 7})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.ours.device == zero::DeviceKind::cpu);
  CHECK(r.config.ours.device_memory_limit == 24LL << 30);
  CHECK(r.config.ours.host_memory_limit == 1LL << 30);
  CHECK(r.config.ours.steps == 7);
  CHECK_FALSE(r.config.ours.speculative_host_step.has_value());  // absent: the device decides
  CHECK(parse_with(R"("zero_train": {"speculative_host_step": false})")
            .config.ours.speculative_host_step == false);
  CHECK(parse_with(R"("zero_train": {"speculative_host_step": true})")
            .config.ours.speculative_host_step == true);
  CHECK_FALSE(parse_with(R"("zero_train": {"speculative_host_step": null})")
                  .config.ours.speculative_host_step.has_value());
  CHECK(parse_with(R"("zero_train": {"device": "cuda"})").config.ours.device ==
        zero::DeviceKind::cuda);
  CHECK_FALSE(parse_with(R"("zero_train": {"device": "auto"})").config.ours.device.has_value());
  CHECK(parse_with(R"("zero_train": {"device_memory_limit": "1.5GB"})")
            .config.ours.device_memory_limit == 1'500'000'000);
  CHECK(parse_with(R"("zero_train": {"host_memory_limit": "512MiB"})")
            .config.ours.host_memory_limit == 512LL << 20);
  CHECK(message_at(parse_with(R"("zero_train": {"device_memory_limit": "24 parsecs"})"),
                   "zero_train.device_memory_limit") ==
        "expected a byte count: an integer >= 0 or a string such as \"24GiB\", \"512MiB\", "
        "\"1.5GB\" (0 = no limit), got \"24 parsecs\" (a string)");
  CHECK(message_at(parse_with(R"("zero_train": {"device": "gpu0"})"), "zero_train.device") ==
        "expected one of \"auto\", \"cpu\", \"cuda\", got \"gpu0\" (a string)");
  // Which parameters weight decay applies to: the model's matrices (default) or all.
  CHECK_FALSE(r.config.ours.weight_decay_all);
  CHECK(parse_with(R"("zero_train": {"weight_decay_applies_to": "all"})").config.ours.weight_decay_all);
  CHECK_FALSE(parse_with(R"("zero_train": {"weight_decay_applies_to": "matrices"})")
                  .config.ours.weight_decay_all);
  CHECK(message_at(parse_with(R"("zero_train": {"weight_decay_applies_to": "biases"})"),
                   "zero_train.weight_decay_applies_to") ==
        "expected one of \"matrices\", \"all\", got \"biases\" (a string)");

  Environment env;
  env.steps_flag = 3;
  CHECK(parse_with("", env).config.ours.steps == 3);
  CHECK(message_at(parse_with(R"("zero_train": {"steps": 5})", env), "zero_train.steps") ==
        "the file says 5 but --steps says 3; remove one of them (or set the key to \"auto\" to "
        "take the flag)");
}

TEST_CASE("zero_train.model: a preset, a preset with overrides, or a full shape", "[ours]") {
  const LoadResult p = parse_with(R"("zero_train": {"model": {"preset": "gpt2-350m"}})");
  REQUIRE(p.ok());
  CHECK(p.config.ours.model_preset == "gpt2-350m");
  CHECK(p.config.ours.model == zero::models::GptShape{24, 1024, 16, 50257, 1024});

  const LoadResult o =
      parse_with(R"("zero_train": {"model": {"preset": "gpt2-124m", "seq_len": 256}})");
  REQUIRE(o.ok());
  CHECK(o.config.ours.model == zero::models::GptShape{12, 768, 12, 50257, 256});

  const LoadResult e = parse_with(R"("zero_train": {"model": {"n_layer": 4, "n_embd": 256,
      "n_head": 8, "vocab_size": 1000, "seq_len": 128}})");
  INFO(all(e));
  REQUIRE(e.ok());
  CHECK(e.config.ours.model_preset.empty());
  CHECK(e.config.ours.model == zero::models::GptShape{4, 256, 8, 1000, 128});
  CHECK_THAT(effective_config_json(e.config), ContainsSubstring("\"preset\": null"));

  CHECK(parse_with(R"("zero_train": {"model": {}})").config.ours.model_preset == "tiny");

  const LoadResult partial = parse_with(R"("zero_train": {"model": {"n_layer": 4, "n_embd": 256}})");
  CHECK(message_at(partial, "zero_train.model.n_head") == "missing: expected an integer >= 1");
  CHECK(message_at(partial, "zero_train.model.vocab_size") == "missing: expected an integer >= 1");
  CHECK(message_at(partial, "zero_train.model.seq_len") == "missing: expected an integer >= 1");
  CHECK(count(partial, Severity::error) == 3);

  CHECK(message_at(parse_with(R"("zero_train": {"model": {"preset": "tiny", "n_embd": 100, "n_head": 3}})"),
                   "zero_train.model.n_head") ==
        "3 does not divide n_embd 100; pick n_head so that n_embd / n_head is a whole head size");
  CHECK(message_at(parse_with(R"("zero_train": {"model": {"preset": "gpt3"}})"),
                   "zero_train.model.preset") ==
        "expected one of \"tiny\", \"gpt2-124m\", \"gpt2-350m\", \"gpt2-774m\", \"gpt2-1.5b\", "
        "\"zero-offload-10b\", got \"gpt3\"");
}

TEST_CASE("the model presets", "[ours][models]") {
  using zero::models::GptShape;
  using zero::models::gpt_preset;
  CHECK(gpt_preset("tiny") == GptShape{2, 128, 4, 64, 64});
  CHECK(gpt_preset("gpt2-124m") == GptShape{12, 768, 12, 50257, 1024});
  CHECK(gpt_preset("gpt2-774m") == GptShape{36, 1280, 20, 50257, 1024});
  CHECK(gpt_preset("gpt2-1.5b") == GptShape{48, 1600, 25, 50257, 1024});
  CHECK(gpt_preset("zero-offload-10b") == GptShape{50, 4096, 32, 50257, 1024});
  CHECK_FALSE(gpt_preset("Tiny").has_value());
  for (std::string_view name : zero::models::gpt_preset_names()) {
    const auto s = gpt_preset(name);
    REQUIRE(s.has_value());
    CHECK(s->n_embd % s->n_head == 0);
  }
}
