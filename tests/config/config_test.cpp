// The public API of runtime/config (config.hpp): files, JSON syntax errors, formatting, the
// effective config and its round trip, and the real-world configs in tests/data/configs.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <variant>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("format_diagnostic: source, severity, path, message", "[format]") {
  CHECK(format_diagnostic({Severity::error, "zero_optimization.stage3_param_persitance_threshold",
                           "unknown key; did you mean 'stage3_param_persistence_threshold'?"},
                          "ds_config.json") ==
        "ds_config.json: error: zero_optimization.stage3_param_persitance_threshold: unknown key; "
        "did you mean 'stage3_param_persistence_threshold'?");
  CHECK(format_diagnostic({Severity::warning, "wandb", "ignored: not used by zero-train"}, "a.json") ==
        "a.json: warning: wandb: ignored: not used by zero-train");
  CHECK(format_diagnostic({Severity::error, "", "bad"}, "a.json") == "a.json: error: bad");
}

TEST_CASE("JSON syntax errors name line:column and what to check", "[json]") {
  const LoadResult comma = parse("{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled\": true,}\n}");
  REQUIRE(comma.diagnostics.size() == 1);
  CHECK_FALSE(comma.ok());
  CHECK(comma.diagnostics[0].path.empty());
  CHECK(comma.diagnostics[0].message ==
        "invalid JSON at line 3, column 28: syntax error while parsing object key - unexpected "
        "'}'; expected string literal. JSON allows no comments and no trailing comma after the "
        "last item of an object or list; check there and at the end of the line before");

  const LoadResult comment = parse("{\"train_batch_size\": 8, // the batch\n}");
  REQUIRE(comment.diagnostics.size() == 1);
  CHECK_THAT(comment.diagnostics[0].message, ContainsSubstring("invalid JSON at line 1, column 25"));

  const LoadResult empty = parse("  \n");
  REQUIRE(empty.diagnostics.size() == 1);
  CHECK_THAT(empty.diagnostics[0].message,
             ContainsSubstring("The file is empty; a config is a JSON object, at least {}"));

  CHECK(message_at(parse("[1, 2]"), "") ==
        "expected a JSON object ({...}) at the top level, got [1,2] (a list)");
}

TEST_CASE("duplicate keys are errors at their path", "[json]") {
  const LoadResult r = parse(R"({"train_batch_size": 8, "fp16": {"enabled": true, "enabled": false},
                                 "train_batch_size": 8})");
  INFO(all(r));
  CHECK_FALSE(r.ok());
  const char* msg = "duplicate key: it appears twice in the same object (DeepSpeed rejects this "
                    "too); keep one";
  CHECK(message_at(r, "fp16.enabled") == msg);
  CHECK(message_at(r, "train_batch_size") == msg);
}

TEST_CASE("load_config_file: a missing file or a directory is an error naming it", "[file]") {
  const std::string missing = data_file("no_such_config.json");
  const LoadResult r = load_config_file(missing, {});
  REQUIRE(r.diagnostics.size() == 1);
  CHECK(r.diagnostics[0].message == "cannot read config file '" + missing +
                                        "': No such file or directory; check the --config path");
  const LoadResult d = load_config_file(ZERO_TEST_DATA_DIR, {});
  CHECK_THAT(all(d), ContainsSubstring("it is a directory"));
}

TEST_CASE("the world size must be positive", "[env]") {
  CHECK(message_at(parse(R"({"train_batch_size": 8})", world(0)), "") ==
        "world size 0 (MPI ranks): expected >= 1");
}

// ---- the real-world configs ---------------------------------------------------------------------

TEST_CASE("hf_trainer_auto.json: every \"auto\" resolved", "[files]") {
  const int w = GENERATE(1, 2, 4);
  const LoadResult r = load_config_file(data_file("hf_trainer_auto.json"), world(w));
  INFO(all(r));
  REQUIRE(r.ok());
  const Config& c = r.config;
  CHECK(c.batch.train_batch_size == w);
  CHECK(c.batch.train_micro_batch_size_per_gpu == 1);
  CHECK(c.batch.gradient_accumulation_steps == 1);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.steps_per_print == 2000);
  CHECK(c.precision() == Precision::bf16);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.optimizer.type == OptimizerType::AdamW);
  CHECK(c.optimizer.params.lr == 1e-3);
  const auto& s = std::get<WarmupDecayLR>(c.scheduler.params);
  CHECK(s.warmup_min_lr == 0.0);
  CHECK(s.warmup_max_lr == 1e-3);
  CHECK(s.warmup_num_steps == 0);
  CHECK(s.total_num_steps == 100);
  CHECK(c.zero.stage == 3);
  CHECK(c.zero.reduce_bucket_size == 128 * 128);
  CHECK(c.zero.stage3_prefetch_bucket_size == 14'745);  // 0.9 * 16384, truncated
  CHECK(c.zero.stage3_param_persistence_threshold == 1280);
  CHECK(c.zero.stage3_gather_16bit_weights_on_model_save);
  CHECK(c.zero.sub_group_size == 1'000'000'000);
  CHECK(message_at(r, "tensorboard", Severity::warning) == "ignored: not used by zero-train");
  CHECK(message_at(r, "flops_profiler", Severity::warning) == "ignored: not used by zero-train");
  CHECK(message_at(r, "zero_allow_untested_optimizer", Severity::warning) ==
        "ignored: not used by zero-train");
  CHECK(count(r, Severity::warning) == 3);

  Environment no_bf16 = world(w);
  no_bf16.bf16_supported = false;
  CHECK(load_config_file(data_file("hf_trainer_auto.json"), no_bf16).config.precision() ==
        Precision::fp32);
}

// Hugging Face's templates as its DeepSpeed guide prints them (tests/data/configs/hf_zero2_auto.json,
// hf_zero3_auto.json): what its Trainer fills in by default, we resolve the same way.
TEST_CASE("hf_zero2_auto.json, hf_zero3_auto.json: Hugging Face's templates resolve", "[files][hf]") {
  const int w = GENERATE(1, 2);
  for (const char* name : {"hf_zero2_auto.json", "hf_zero3_auto.json"}) {
    const LoadResult r = load_config_file(data_file(name), world(w));
    INFO(name << " on " << w << " ranks\n" << all(r));
    REQUIRE(r.ok());
    const Config& c = r.config;
    CHECK(c.batch.train_micro_batch_size_per_gpu == 1);
    CHECK(c.batch.gradient_accumulation_steps == 1);
    CHECK(c.batch.train_batch_size == w);
    CHECK(c.gradient_clipping == 1.0);
    CHECK(c.precision() == Precision::bf16);
    CHECK(c.optimizer.type == OptimizerType::AdamW);
    CHECK(c.optimizer.params.lr == 1e-3);
    CHECK(c.optimizer.params.weight_decay == 0.0);
    const auto& s = std::get<WarmupLR>(c.scheduler.params);
    CHECK(s.warmup_min_lr == 0.0);
    CHECK(s.warmup_max_lr == 1e-3);
    CHECK(s.warmup_num_steps == 0);  // the Trainer's --warmup_steps default; counts as 2
    CHECK(c.zero.offload_optimizer.device == OffloadDevice::cpu);
    CHECK_FALSE(c.ours.weight_decay_all);
  }
  const Config z3 = load_config_file(data_file("hf_zero3_auto.json"), world(w)).config;
  CHECK(z3.zero.stage == 3);
  CHECK(z3.zero.offload_param.device == OffloadDevice::cpu);
  CHECK(z3.zero.reduce_bucket_size == 128 * 128);  // the tiny preset: n_embd 128
  CHECK(z3.zero.stage3_prefetch_bucket_size == 14745);  // 0.9 x 128^2, truncated
  CHECK(z3.zero.stage3_param_persistence_threshold == 1280);
}

TEST_CASE("legacy_cpu_offload.json: cpu_offload and fp16 loss scaling", "[files]") {
  const LoadResult r = load_config_file(data_file("legacy_cpu_offload.json"), world(2));
  INFO(all(r));
  REQUIRE(r.ok());
  const Config& c = r.config;
  CHECK(c.batch.train_batch_size == 64);
  CHECK(c.zero.stage == 2);
  CHECK(c.zero.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(c.zero.offload_optimizer.pin_memory);
  CHECK(c.zero.reduce_bucket_size == 200'000'000);
  CHECK(c.zero.allgather_bucket_size == 200'000'000);
  CHECK(c.zero.overlap_comm);
  CHECK(c.precision() == Precision::fp16);
  CHECK(c.fp16.initial_scale_power == 32);
  CHECK(c.fp16.hysteresis == 2);
  CHECK(c.optimizer.type == OptimizerType::Adam);
  CHECK(c.optimizer.params.lr == 3e-5);
  CHECK(c.optimizer.params.betas == std::array<double, 2>{0.8, 0.999});
  CHECK(std::get<WarmupLR>(c.scheduler.params).warmup_num_steps == 500);
  CHECK(count(r, Severity::warning) == 2);
  CHECK_FALSE(message_at(r, "zero_optimization.cpu_offload", Severity::warning).empty());
  CHECK_FALSE(message_at(r, "zero_optimization.cpu_offload_use_pin_memory", Severity::warning).empty());
}

TEST_CASE("legacy_bool_zero.json: zero_optimization true and bfloat16", "[files]") {
  const LoadResult r = load_config_file(data_file("legacy_bool_zero.json"), world(2));
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.zero.stage == 1);
  CHECK(r.config.precision() == Precision::bf16);
  CHECK(r.config.batch.train_micro_batch_size_per_gpu == 16);
  CHECK(r.config.optimizer.params.weight_decay == 0.01);
  CHECK(count(r, Severity::warning) == 2);
}

TEST_CASE("stage3_nvme_aio.json: ZeRO-Infinity style, optimizer state and parameters on nvme", "[files]") {
  const LoadResult r = load_config_file(data_file("stage3_nvme_aio.json"), world(2));
  INFO(all(r));
  REQUIRE(r.ok());
  const Config& c = r.config;
  CHECK(c.zero.stage == 3);
  CHECK(c.zero.offload_optimizer.device == OffloadDevice::nvme);
  CHECK(c.zero.offload_param.device == OffloadDevice::nvme);
  CHECK(c.zero.offload_param.nvme_path == "/local_nvme");
  CHECK(c.zero.offload_param.buffer_size == 100'000'000);
  CHECK(c.zero.sub_group_size == 100'000'000);
  CHECK(c.aio.intra_op_parallelism == 1);
  CHECK(c.aio.queue_depth == 8);
  const auto& s = std::get<WarmupCosineLR>(c.scheduler.params);
  CHECK(s.total_num_steps == 10'000);
  CHECK(s.warmup_type == WarmupType::linear);
  CHECK(s.cos_min_ratio == 0.1);
  CHECK(c.batch.train_batch_size == 16);
  CHECK(count(r, Severity::warning) == 1);  // thread_count (the old name); both nvme tiers are built
}

TEST_CASE("stage3_cpu_offload.json: stage 3 offload, OneCycle and our section", "[files]") {
  const LoadResult r = load_config_file(data_file("stage3_cpu_offload.json"), world(2));
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.diagnostics.empty());
  const Config& c = r.config;
  CHECK(c.batch.gradient_accumulation_steps == 4);
  CHECK(c.seed == 42);
  CHECK(c.optimizer.type == OptimizerType::AdamW);
  CHECK(c.zero.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(c.zero.offload_param.device == OffloadDevice::cpu);
  CHECK(c.zero.stage3_param_persistence_threshold == 10'000);
  const auto& s = std::get<OneCycle>(c.scheduler.params);
  CHECK(s.cycle_max_lr == 6e-4);
  CHECK(s.cycle_second_step_size == 100);
  CHECK_FALSE(s.cycle_momentum);
  CHECK(c.ours.device == zero::DeviceKind::cpu);
  CHECK(c.ours.device_memory_limit == 512LL << 20);
  CHECK(c.ours.host_memory_limit == 8LL << 30);
  CHECK(c.ours.steps == 20);
  CHECK(c.ours.model_preset == "gpt2-124m");
  CHECK(c.ours.model.seq_len == 256);
}

TEST_CASE("typo_zero_block.json: the path and the nearest key", "[files]") {
  const LoadResult r = load_config_file(data_file("typo_zero_block.json"), world(1));
  REQUIRE(r.diagnostics.size() == 1);
  CHECK(format_diagnostic(r.diagnostics[0], "ds_config.json") ==
        "ds_config.json: error: zero_optimization.stage3_param_persitance_threshold: unknown key; "
        "did you mean 'stage3_param_persistence_threshold'?");
}

TEST_CASE("minimal.json", "[files]") {
  const LoadResult r = load_config_file(data_file("minimal.json"), world(2));
  REQUIRE(r.ok());
  CHECK(r.diagnostics.empty());
  CHECK(r.config.batch.train_batch_size == 8);
}

// ---- the effective config ---------------------------------------------------------------------

TEST_CASE("the effective config has every key, under DeepSpeed's names", "[effective]") {
  const LoadResult r = parse(R"({"train_micro_batch_size_per_gpu": 2,
      "scheduler": {"type": "WarmupLR"}, "zero_optimization": {"stage": 2, "cpu_offload": true}})");
  REQUIRE(r.ok());
  const std::string json = effective_config_json(r.config);
  const char* keys[] = {
      "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
      "steps_per_print", "wall_clock_breakdown", "gradient_clipping", "prescale_gradients",
      "gradient_predivide_factor", "communication_data_type", "seed", "optimizer", "type", "params",
      "lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "amsgrad",
      "torch_adam", "legacy_fusion", "scheduler", "warmup_min_lr", "warmup_max_lr",
      "warmup_num_steps", "warmup_type", "last_batch_iteration", "fp16", "enabled", "auto_cast",
      "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
      "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads", "bf16",
      "immediate_grad_update", "check_grad_overflow", "zero_optimization", "stage",
      "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter",
      "reduce_bucket_size", "contiguous_gradients", "round_robin_gradients", "offload_optimizer",
      "device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write",
      "fast_init", "ratio", "offload_param", "buffer_size", "max_in_cpu", "sub_group_size",
      "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
      "stage3_model_persistence_threshold", "stage3_max_live_parameters",
      "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
      "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1",
      "use_multi_rank_bucket_allreduce", "zero_hpz_partition_size", "zero_quantized_weights",
      "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "mics_shard_size",
      "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
      "override_module_apply", "stage3_module_granularity_threshold",
      "stage3_use_all_reduce_for_fetch_params", "log_trace_cache_warnings", "aio", "block_size",
      "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds",
      "activation_checkpointing", "partition_activations", "contiguous_memory_optimization",
      "cpu_checkpointing", "number_checkpoints", "synchronize_checkpoint_boundary", "profile",
      "zero_train", "device_memory_limit", "host_memory_limit", "steps", "speculative_host_step",
      "weight_decay_applies_to", "model", "preset", "n_layer", "n_embd", "n_head", "vocab_size",
      "seq_len"};
  for (const char* k : keys) {
    INFO(k);
    CHECK_THAT(json, ContainsSubstring(std::string("\"") + k + "\": "));
  }
  // Resolved values, not the aliases that set them.
  CHECK_THAT(json, ContainsSubstring("\"train_batch_size\": 2,"));
  CHECK_THAT(json, ContainsSubstring("\"device\": \"cpu\""));
  CHECK_THAT(json, ContainsSubstring("\"type\": \"WarmupLR\""));
  CHECK_THAT(json, !ContainsSubstring("cpu_offload"));
  CHECK_THAT(json, ContainsSubstring("\"overlap_comm\": false"));
  CHECK_THAT(json, ContainsSubstring("\"preset\": \"tiny\""));
  CHECK_THAT(json, ContainsSubstring("\"weight_decay_applies_to\": \"matrices\""));
  // No scheduler: no block (DeepSpeed would read a null one as an error).
  CHECK_THAT(effective_config_json(parse_with("").config), !ContainsSubstring("\"scheduler\""));
  // Compact form.
  CHECK_THAT(effective_config_json(r.config, -1), ContainsSubstring("{\"train_batch_size\":2,"));
}

TEST_CASE("the effective config reads back to itself", "[effective]") {
  const char* name = GENERATE("hf_trainer_auto.json", "hf_zero2_auto.json", "hf_zero3_auto.json",
                              "legacy_cpu_offload.json",
                              "legacy_bool_zero.json", "stage3_nvme_aio.json",
                              "stage3_cpu_offload.json", "minimal.json");
  const int w = GENERATE(1, 2);
  const LoadResult first = load_config_file(data_file(name), world(w));
  INFO(name << " on " << w << " ranks\n" << all(first));
  REQUIRE(first.ok());
  const std::string json = effective_config_json(first.config);
  const LoadResult second = parse_config(json, "effective.json", world(w));
  INFO(json << "\n" << all(second));
  REQUIRE(second.ok());
  CHECK(effective_config_json(second.config) == json);
  // "auto" and aliases are gone: only not-implemented notes (nvme) may remain as warnings.
  for (const Diagnostic& d : second.diagnostics)
    CHECK_THAT(d.message, ContainsSubstring("accepted but not implemented yet"));
}

TEST_CASE("every scheduler type and the explicit model shape round-trip", "[effective]") {
  const char* body = GENERATE(
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear"}})",
      R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10, "warmup_num_steps": 5}})",
      R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 5}})",
      R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1}})",
      R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_staircase": true}})",
      R"("zero_train": {"model": {"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 5, "seq_len": 3}})",
      R"("communication_data_type": "half", "zero_train": {"device": "cuda", "device_memory_limit": "1GiB"})",
      R"("zero_train": {"weight_decay_applies_to": "all"})");
  const LoadResult first = parse_with(body);
  INFO(body << "\n" << all(first));
  REQUIRE(first.ok());
  const std::string json = effective_config_json(first.config);
  const LoadResult second = parse_config(json, "effective.json", {});
  INFO(json << "\n" << all(second));
  REQUIRE(second.ok());
  CHECK(second.diagnostics.empty());
  CHECK(effective_config_json(second.config) == json);
}
