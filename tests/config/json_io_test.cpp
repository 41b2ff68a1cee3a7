// The reader's generic rules (runtime/config/json_io.cpp): types, ranges, unknown keys with
// their nearest valid key, top-level warnings, "auto" without a rule, every error collected.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// `body` must give exactly one error, at `path`, with this message.
void expect_error(std::string_view body, std::string_view path, std::string_view message) {
  const LoadResult r = parse_with(body);
  INFO(body << "\n" << all(r));
  CHECK_FALSE(r.ok());
  CHECK(count(r, Severity::error) == 1);
  CHECK(message_at(r, path) == message);
}

}  // namespace

TEST_CASE("a typo in every strict block names the full path and the nearest key", "[strict]") {
  struct Case {
    const char* body;
    const char* path;
    const char* nearest;
  };
  const Case cases[] = {
      {R"("zero_optimization": {"stage": 3, "stage3_param_persitance_threshold": 1e5})",
       "zero_optimization.stage3_param_persitance_threshold", "stage3_param_persistence_threshold"},
      {R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memroy": true}})",
       "zero_optimization.offload_optimizer.pin_memroy", "pin_memory"},
      {R"("zero_optimization": {"stage": 3, "offload_param": {"devcie": "cpu"}})",
       "zero_optimization.offload_param.devcie", "device"},
      {R"("fp16": {"enabled": true, "loss_scale_windw": 500})", "fp16.loss_scale_windw",
       "loss_scale_window"},
      {R"("bf16": {"enable": true})", "bf16.enable", "enabled"},
      {R"("optimizer": {"type": "AdamW", "parms": {"lr": 0.1}})", "optimizer.parms", "params"},
      {R"("optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}})",
       "optimizer.params.weight_decy", "weight_decay"},
      {R"("scheduler": {"type": "WarmupLR", "parmas": {}})", "scheduler.parmas", "params"},
      {R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}})",
       "scheduler.params.warmup_num_step", "warmup_num_steps"},
      {R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_momentm": false}})",
       "scheduler.params.cycle_momentm", "cycle_momentum"},
      {R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step": 10}})",
       "scheduler.params.lr_range_test_step", "lr_range_test_step_size"},
      {R"("aio": {"queue_dept": 8})", "aio.queue_dept", "queue_depth"},
      {R"("activation_checkpointing": {"cpu_checkpoint": true})",
       "activation_checkpointing.cpu_checkpoint", "cpu_checkpointing"},
      {R"("zero_train": {"stpes": 10})", "zero_train.stpes", "steps"},
      {R"("zero_train": {"model": {"preset": "tiny", "n_embed": 256}})", "zero_train.model.n_embed",
       "n_embd"},
  };
  for (const Case& c : cases)
    expect_error(c.body, c.path, std::string("unknown key; did you mean '") + c.nearest + "'?");
}

TEST_CASE("did-you-mean finds keys with their words swapped", "[strict][swap]") {
  // The typo in DeepSpeedExamples' 10B config: "comm_overlap" (we used to say 'cpu_offload').
  expect_error(R"("zero_optimization": {"stage": 3, "comm_overlap": true})",
               "zero_optimization.comm_overlap", "unknown key; did you mean 'overlap_comm'?");
  expect_error(R"("zero_optimization": {"stage": 2, "bucket_size_reduce": 5e8})",
               "zero_optimization.bucket_size_reduce",
               "unknown key; did you mean 'reduce_bucket_size'?");
  expect_error(R"("zero_optimization": {"stage": 3, "stage3_persistence_param_threshold": 1e5})",
               "zero_optimization.stage3_persistence_param_threshold",
               "unknown key; did you mean 'stage3_param_persistence_threshold'?");
  expect_error(R"("fp16": {"window_loss_scale": 100})", "fp16.window_loss_scale",
               "unknown key; did you mean 'loss_scale_window'?");
  const LoadResult r = parse_with(R"("clipping_gradient": 1.0, "print_steps_per": 5)");
  INFO(all(r));
  CHECK(r.ok());
  CHECK(message_at(r, "clipping_gradient", Severity::warning) ==
        "unknown key, ignored; did you mean 'gradient_clipping'?");
  CHECK(message_at(r, "print_steps_per", Severity::warning) ==
        "unknown key, ignored; did you mean 'steps_per_print'?");
}

TEST_CASE("the nearest key is always named, even when far", "[strict]") {
  expect_error(R"("bf16": {"completely_unrelated": 1})", "bf16.completely_unrelated",
               "unknown key; did you mean 'enabled'?");
}

TEST_CASE("top-level unknown keys warn, with did-you-mean when close; the config stays valid",
          "[toplevel]") {
  const LoadResult r = parse_with(R"("gradient_cliping": 0.5, "my_custom_thing": 1,
                                     "trian_batch_size": 8, "wandb": {"enabled": true},
                                     "comms_logger": {"enabled": false}, "tensorboard": {})");
  INFO(all(r));
  CHECK(r.ok());
  CHECK(message_at(r, "gradient_cliping", Severity::warning) ==
        "unknown key, ignored; did you mean 'gradient_clipping'?");
  CHECK(message_at(r, "trian_batch_size", Severity::warning) ==
        "unknown key, ignored; did you mean 'train_batch_size'?");
  CHECK(message_at(r, "my_custom_thing", Severity::warning) ==
        "unknown key, ignored (DeepSpeed ignores it too)");
  for (const char* feature : {"wandb", "comms_logger", "tensorboard"})
    CHECK(message_at(r, feature, Severity::warning) == "ignored: not used by zero-train");
  CHECK(count(r, Severity::warning) == 6);
  CHECK(r.config.gradient_clipping == 1.0);  // the misspelt key did not count
}

TEST_CASE("wrong types are errors naming the value and the expected type", "[types]") {
  expect_error(R"("fp16": {"enabled": "true"})", "fp16.enabled",
               "expected true or false, got \"true\" (a string)");
  expect_error(R"("zero_optimization": {"stage": "3"})", "zero_optimization.stage",
               "expected an integer in 0..3, got \"3\" (a string)");
  expect_error(R"("zero_optimization": {"stage": 2.5})", "zero_optimization.stage",
               "expected an integer in 0..3, got 2.5");
  expect_error(R"("zero_optimization": {"reduce_bucket_size": 5.5})",
               "zero_optimization.reduce_bucket_size", "expected an integer >= 1, got 5.5");
  expect_error(R"("steps_per_print": null)", "steps_per_print",
               "expected an integer >= 1, got null");
  expect_error(R"("optimizer": {"type": "AdamW", "params": {"lr": "fast"}})",
               "optimizer.params.lr", "expected a number in [0, 1], got \"fast\" (a string)");
  expect_error(R"("optimizer": {"type": "AdamW", "params": {"betas": [0.9]}})",
               "optimizer.params.betas",
               "expected a list of 2 numbers, each in [0, 1), got [0.9] (a list)");
  expect_error(R"("zero_optimization": {"offload_optimizer": {"device": "cpuu"}, "stage": 2})",
               "zero_optimization.offload_optimizer.device",
               "expected one of \"none\", \"cpu\", \"nvme\", got \"cpuu\" (a string)");
  expect_error(R"("zero_optimization": {"offload_optimizer": "cpu"})",
               "zero_optimization.offload_optimizer",
               "expected an object, got \"cpu\" (a string)");
  expect_error(R"("communication_data_type": "int8")", "communication_data_type",
               "expected one of \"fp32\", \"float32\", \"float\", \"fp16\", \"float16\", "
               "\"half\", \"bf16\", \"bfloat16\", or null, got \"int8\" (a string)");
  expect_error(R"("fp16": [1, 2])", "fp16", "expected an object, got [1,2] (a list)");
}

TEST_CASE("integer keys accept integral floats such as 5e8", "[types]") {
  const LoadResult r = parse_with(
      R"("zero_optimization": {"reduce_bucket_size": 5e8, "allgather_bucket_size": 2.0e8,
                               "stage3_max_live_parameters": 1E9}, "steps_per_print": 1e1)");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.zero.reduce_bucket_size == 500'000'000);
  CHECK(r.config.zero.allgather_bucket_size == 200'000'000);
  CHECK(r.config.zero.stage3_max_live_parameters == 1'000'000'000);
  CHECK(r.config.steps_per_print == 10);
}

TEST_CASE("values out of range are errors naming the range", "[ranges]") {
  struct Case {
    const char* body;
    const char* path;
    const char* message;
  };
  const Case cases[] = {
      {R"("optimizer": {"type": "Adam", "params": {"lr": -1}})", "optimizer.params.lr",
       "expected a number in [0, 1], got -1"},
      {R"("optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.0]}})",
       "optimizer.params.betas", "expected a list of 2 numbers, each in [0, 1), got [0.9,1.0] (a list)"},
      {R"("optimizer": {"type": "Adam", "params": {"eps": 0}})", "optimizer.params.eps",
       "expected a number > 0, got 0"},
      {R"("optimizer": {"type": "Adam", "params": {"weight_decay": -0.1}})",
       "optimizer.params.weight_decay", "expected a number >= 0, got -0.1"},
      {R"("gradient_clipping": -1.0)", "gradient_clipping", "expected a number >= 0, got -1.0"},
      {R"("steps_per_print": 0)", "steps_per_print", "expected an integer >= 1, got 0"},
      {R"("fp16": {"loss_scale": -2})", "fp16.loss_scale", "expected a number >= 0, got -2"},
      {R"("fp16": {"initial_scale_power": 65})", "fp16.initial_scale_power",
       "expected an integer in 0..64, got 65"},
      {R"("fp16": {"loss_scale_window": 0})", "fp16.loss_scale_window",
       "expected an integer >= 1, got 0"},
      {R"("fp16": {"hysteresis": 0})", "fp16.hysteresis", "expected an integer >= 1, got 0"},
      {R"("fp16": {"min_loss_scale": 0})", "fp16.min_loss_scale", "expected a number > 0, got 0"},
      {R"("zero_optimization": {"stage": 4})", "zero_optimization.stage",
       "expected an integer in 0..3, got 4"},
      {R"("zero_optimization": {"reduce_bucket_size": 0})", "zero_optimization.reduce_bucket_size",
       "expected an integer >= 1, got 0"},
      {R"("zero_optimization": {"allgather_bucket_size": -5})",
       "zero_optimization.allgather_bucket_size", "expected an integer >= 1, got -5"},
      {R"("zero_optimization": {"sub_group_size": 0})", "zero_optimization.sub_group_size",
       "expected an integer >= 1, got 0"},
      {R"("gradient_predivide_factor": 0)", "gradient_predivide_factor",
       "expected a number > 0, got 0"},
      {R"("zero_train": {"steps": 0})", "zero_train.steps", "expected an integer >= 1, got 0"},
  };
  for (const Case& c : cases) expect_error(c.body, c.path, c.message);
}

TEST_CASE("a key without an auto rule rejects \"auto\"", "[auto]") {
  expect_error(R"("zero_optimization": {"stage": "auto"})", "zero_optimization.stage",
               "\"auto\" is not supported for this key (there is no rule to derive it); expected "
               "an integer in 0..3");
  expect_error(R"("fp16": {"loss_scale": "auto"})", "fp16.loss_scale",
               "\"auto\" is not supported for this key (there is no rule to derive it); expected "
               "a number >= 0");
  expect_error(R"("zero_optimization": {"offload_optimizer": {"device": "auto"}, "stage": 1})",
               "zero_optimization.offload_optimizer.device",
               "expected one of \"none\", \"cpu\", \"nvme\", got \"auto\" (a string)");
}

TEST_CASE("every error is collected, not only the first", "[collect]") {
  const LoadResult r = parse(R"({
    "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
    "steps_per_print": 0,
    "optimizer": {"type": "Lamb", "params": {"lr": -1}},
    "fp16": {"enabled": "yes", "hysteresis": 0},
    "zero_optimization": {"stage": 5, "stage3_param_persitance_threshold": 1,
                          "offload_param": {"device": "gpu"}},
    "aio": {"queue_depth": 0},
    "zero_train": {"device": "tpu", "model": {"n_layer": 2}},
    "gradient_cliping": 1.0
  })",
                             world(2));
  INFO(all(r));
  CHECK_FALSE(r.ok());
  CHECK_THAT(message_at(r, "train_batch_size"), ContainsSubstring("(= 8)"));
  CHECK(message_at(r, "steps_per_print") == "expected an integer >= 1, got 0");
  CHECK_THAT(message_at(r, "optimizer.type"), ContainsSubstring("got \"Lamb\""));
  CHECK(message_at(r, "optimizer.params.lr") == "expected a number in [0, 1], got -1");
  CHECK(message_at(r, "fp16.enabled") == "expected true or false, got \"yes\" (a string)");
  CHECK(message_at(r, "fp16.hysteresis") == "expected an integer >= 1, got 0");
  CHECK(message_at(r, "zero_optimization.stage") == "expected an integer in 0..3, got 5");
  CHECK_THAT(message_at(r, "zero_optimization.stage3_param_persitance_threshold"),
             ContainsSubstring("did you mean 'stage3_param_persistence_threshold'?"));
  CHECK_THAT(message_at(r, "zero_optimization.offload_param.device"),
             ContainsSubstring("got \"gpu\""));
  CHECK(message_at(r, "aio.queue_depth") == "expected an integer >= 1, got 0");
  CHECK_THAT(message_at(r, "zero_train.device"), ContainsSubstring("got \"tpu\""));
  CHECK(message_at(r, "zero_train.model.n_embd") == "missing: expected an integer >= 1");
  CHECK(message_at(r, "gradient_cliping", Severity::warning) ==
        "unknown key, ignored; did you mean 'gradient_clipping'?");
  CHECK(count(r, Severity::error) == 15);  // 11 above + n_head, vocab_size, seq_len missing
}

TEST_CASE("keys accepted but not implemented warn only when not the default", "[accepted]") {
  const LoadResult quiet = parse_with(
      R"("fp16": {"auto_cast": false}, "zero_optimization": {"zero_quantized_weights": false,
         "memory_efficient_linear": true}, "aio": {"block_size": 1048576})");
  INFO(all(quiet));
  CHECK(quiet.ok());
  CHECK(quiet.diagnostics.empty());

  const LoadResult r = parse_with(
      R"("fp16": {"enabled": true, "auto_cast": true, "fp16_master_weights_and_grads": true},
         "bf16": {"immediate_grad_update": true},
         "optimizer": {"type": "Adam", "params": {"torch_adam": true}},
         "zero_optimization": {"stage": 3, "zero_quantized_weights": true, "mics_shard_size": 8,
           "offload_optimizer": {"device": "cpu", "fast_init": true, "ratio": 0.5}},
         "aio": {"use_gds": true})");
  INFO(all(r));
  CHECK(r.ok());
  CHECK(message_at(r, "fp16.auto_cast", Severity::warning) ==
        "accepted but not implemented yet: true has no effect (runs as the default, false)");
  CHECK(message_at(r, "zero_optimization.offload_optimizer.ratio", Severity::warning) ==
        "accepted but not implemented yet: 0.5 has no effect (runs as the default, 1)");
  CHECK(message_at(r, "zero_optimization.mics_shard_size", Severity::warning) ==
        "accepted but not implemented yet: 8 has no effect (runs as the default, -1)");
  for (const char* path :
       {"fp16.fp16_master_weights_and_grads", "bf16.immediate_grad_update",
        "optimizer.params.torch_adam", "zero_optimization.zero_quantized_weights",
        "zero_optimization.offload_optimizer.fast_init", "aio.use_gds"})
    CHECK_THAT(message_at(r, path, Severity::warning),
               ContainsSubstring("accepted but not implemented yet"));
  CHECK(count(r, Severity::warning) == 9);
}

TEST_CASE("every zero_optimization key DeepSpeed accepts is accepted", "[accepted]") {
  const LoadResult r = parse_with(R"("zero_optimization": {
    "stage": 3, "contiguous_gradients": true, "reduce_scatter": true, "reduce_bucket_size": 5e8,
    "use_multi_rank_bucket_allreduce": true, "allgather_partitions": true,
    "allgather_bucket_size": 5e8, "overlap_comm": true, "load_from_fp32_weights": true,
    "elastic_checkpoint": false, "sub_group_size": 1e9, "ignore_unused_parameters": true,
    "legacy_stage1": false, "round_robin_gradients": false, "zero_hpz_partition_size": 1,
    "zero_quantized_weights": false, "zero_quantized_nontrainable_weights": false,
    "zero_quantized_gradients": false, "mics_shard_size": -1,
    "mics_hierarchical_params_gather": false, "memory_efficient_linear": true,
    "pipeline_loading_checkpoint": false, "override_module_apply": true,
    "module_granularity_threshold": 0, "use_all_reduce_for_fetch_params": false,
    "log_trace_cache_warnings": false, "prefetch_bucket_size": 5e7,
    "param_persistence_threshold": 1e5, "model_persistence_threshold": 9223372036854775807,
    "max_live_parameters": 1e9, "max_reuse_distance": 1e9,
    "gather_16bit_weights_on_model_save": false,
    "offload_optimizer": {"device": "none", "nvme_path": null, "buffer_count": 4,
      "pin_memory": true, "pipeline_read": false, "pipeline_write": false, "fast_init": false,
      "ratio": 1.0},
    "offload_param": {"device": "none", "nvme_path": null, "buffer_count": 5,
      "buffer_size": 1e8, "max_in_cpu": 1e9, "pin_memory": true}})");
  INFO(all(r));
  CHECK(r.ok());
  CHECK(r.diagnostics.empty());
}
