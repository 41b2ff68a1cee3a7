// zero_optimization (runtime/config/zero_block.cpp): defaults, legacy forms and aliases, "auto"
// sizes, offload combinations.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <climits>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("zero_optimization defaults", "[zero][defaults]") {
  const LoadResult r = parse_with("");
  REQUIRE(r.ok());
  const Zero& z = r.config.zero;
  CHECK(z.stage == 0);
  CHECK(z.contiguous_gradients);
  CHECK(z.reduce_scatter);
  CHECK(z.reduce_bucket_size == 500'000'000);
  CHECK(z.allgather_partitions);
  CHECK(z.allgather_bucket_size == 500'000'000);
  CHECK_FALSE(z.overlap_comm);
  CHECK_FALSE(z.round_robin_gradients);
  CHECK(z.sub_group_size == 1'000'000'000);
  CHECK(z.stage3_prefetch_bucket_size == 50'000'000);
  CHECK(z.stage3_param_persistence_threshold == 100'000);
  CHECK(z.stage3_model_persistence_threshold == LLONG_MAX);
  CHECK(z.stage3_max_live_parameters == 1'000'000'000);
  CHECK(z.stage3_max_reuse_distance == 1'000'000'000);
  CHECK_FALSE(z.stage3_gather_16bit_weights_on_model_save);
  CHECK(z.offload_optimizer.device == OffloadDevice::none);
  CHECK_FALSE(z.offload_optimizer.enabled());
  CHECK(z.offload_optimizer.pin_memory);
  CHECK(z.offload_optimizer.buffer_count == 4);
  CHECK(z.offload_optimizer.ratio == 1.0);
  CHECK_FALSE(z.offload_optimizer.nvme_path.has_value());
  CHECK(z.offload_param.device == OffloadDevice::none);
  CHECK(z.offload_param.pin_memory);
  CHECK(z.offload_param.buffer_count == 5);
  CHECK(z.offload_param.buffer_size == 100'000'000);
  CHECK(z.offload_param.max_in_cpu == 1'000'000'000);
}

TEST_CASE("overlap_comm defaults to true for stage 3 only", "[zero][defaults]") {
  CHECK(parse_with(R"("zero_optimization": {"stage": 3})").config.zero.overlap_comm);
  CHECK_FALSE(parse_with(R"("zero_optimization": {"stage": 2})").config.zero.overlap_comm);
  CHECK_FALSE(parse_with(R"("zero_optimization": {"stage": 3, "overlap_comm": false})")
                  .config.zero.overlap_comm);
  CHECK(parse_with(R"("zero_optimization": {"stage": 1, "overlap_comm": true})")
            .config.zero.overlap_comm);
}

TEST_CASE("zero_optimization: true | false | N is the legacy form of the stage", "[zero][aliases]") {
  const LoadResult t = parse_with(R"("zero_optimization": true)");
  INFO(all(t));
  REQUIRE(t.ok());
  CHECK(t.config.zero.stage == 1);
  CHECK(message_at(t, "zero_optimization", Severity::warning) ==
        "deprecated form; use \"zero_optimization\": {\"stage\": 1} instead");
  CHECK(parse_with(R"("zero_optimization": false)").config.zero.stage == 0);
  const LoadResult three = parse_with(R"("zero_optimization": 3)");
  REQUIRE(three.ok());
  CHECK(three.config.zero.stage == 3);
  CHECK(three.config.zero.overlap_comm);  // the stage-3 default still applies
  CHECK(message_at(parse_with(R"("zero_optimization": 7)"), "zero_optimization") ==
        "expected an object, true, false or a stage 0..3, got 7");
}

TEST_CASE("cpu_offload is the old offload_optimizer.device \"cpu\"", "[zero][aliases]") {
  const LoadResult r = parse_with(R"("zero_optimization": {"stage": 2, "cpu_offload": true})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.zero.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(message_at(r, "zero_optimization.cpu_offload", Severity::warning) ==
        "deprecated; use 'zero_optimization.offload_optimizer.device': \"cpu\" instead");
  CHECK(count(r, Severity::warning) == 1);
  // Agreeing with the new key: only the warning.
  CHECK(parse_with(R"("zero_optimization": {"stage": 2, "cpu_offload": true,
                       "offload_optimizer": {"device": "cpu"}})")
            .ok());
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage": 2, "cpu_offload": true,
                                   "offload_optimizer": {"device": "none"}})"),
                   "zero_optimization.cpu_offload") ==
        "true contradicts 'zero_optimization.offload_optimizer.device' (\"none\"); keep only "
        "'zero_optimization.offload_optimizer.device'");
  // Stage 0 cannot offload: the error points at the key that asked for it.
  CHECK(message_at(parse_with(R"("zero_optimization": {"cpu_offload": true})"),
                   "zero_optimization.cpu_offload") ==
        "optimizer offload to \"cpu\" needs stage 1, 2 or 3 (zero_optimization.stage is 0); set a "
        "stage or remove offload_optimizer");
}

TEST_CASE("cpu_offload_param(s) is the old offload_param.device \"cpu\"", "[zero][aliases]") {
  for (const char* name : {"cpu_offload_param", "cpu_offload_params"}) {
    const LoadResult r = parse_with(std::string(R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, ")") +
                                    name + "\": true}");
    INFO(all(r));
    REQUIRE(r.ok());
    CHECK(r.config.zero.offload_param.device == OffloadDevice::cpu);
    CHECK(message_at(r, std::string("zero_optimization.") + name, Severity::warning) ==
          "deprecated; use 'zero_optimization.offload_param.device': \"cpu\" instead");
  }
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage": 3, "cpu_offload_param": true,
                                   "cpu_offload_params": false})"),
                   "zero_optimization.cpu_offload_params") ==
        "false contradicts 'zero_optimization.cpu_offload_param' (\"cpu\"); keep only "
        "'zero_optimization.offload_param.device'");
}

TEST_CASE("parameter offload needs optimizer offload (the host optimizer writes the shards)",
          "[zero][offload]") {
  const char* msg = "parameter offload without optimizer offload is not supported by zero-train "
                    "(its host optimizer writes the offloaded parameter shards); add "
                    "\"offload_optimizer\": {\"device\": \"cpu\"} or remove offload_param";
  const LoadResult r = parse_with(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}})");
  INFO(all(r));
  CHECK(count(r, Severity::error) == 1);
  CHECK(message_at(r, "zero_optimization.offload_param.device") == msg);
  // Through the deprecated key, the error names it.
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage": 3, "cpu_offload_param": true})"),
                   "zero_optimization.cpu_offload_param") == msg);
  CHECK(parse_with(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                      "offload_optimizer": {"device": "cpu"}})")
            .ok());
}

TEST_CASE("cpu_offload_use_pin_memory sets pin_memory of both offload blocks", "[zero][aliases]") {
  const LoadResult r = parse_with(
      R"("zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_use_pin_memory": false})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK_FALSE(r.config.zero.offload_optimizer.pin_memory);
  CHECK_FALSE(r.config.zero.offload_param.pin_memory);
  CHECK(message_at(r, "zero_optimization.cpu_offload_use_pin_memory", Severity::warning) ==
        "deprecated; use 'pin_memory' inside zero_optimization.offload_optimizer and "
        "zero_optimization.offload_param instead");
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage": 2, "cpu_offload_use_pin_memory": false,
                                   "offload_optimizer": {"device": "cpu", "pin_memory": true}})"),
                   "zero_optimization.cpu_offload_use_pin_memory") ==
        "false contradicts 'zero_optimization.offload_optimizer.pin_memory' (true); keep only "
        "'zero_optimization.offload_optimizer.pin_memory'");
}

TEST_CASE("stage3_gather_fp16_weights_on_model_save is the old 16bit key", "[zero][aliases]") {
  const LoadResult r = parse_with(
      R"("zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.zero.stage3_gather_16bit_weights_on_model_save);
  CHECK(message_at(r, "zero_optimization.stage3_gather_fp16_weights_on_model_save",
                   Severity::warning) ==
        "deprecated name; use 'zero_optimization.stage3_gather_16bit_weights_on_model_save' "
        "instead");
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage3_gather_fp16_weights_on_model_save": true,
                                   "stage3_gather_16bit_weights_on_model_save": false})"),
                   "zero_optimization.stage3_gather_fp16_weights_on_model_save") ==
        "is true but 'zero_optimization.stage3_gather_16bit_weights_on_model_save' (the same "
        "setting) is false; keep only 'stage3_gather_16bit_weights_on_model_save'");
}

TEST_CASE("the un-prefixed stage3 spellings are accepted silently", "[zero][aliases]") {
  const LoadResult r = parse_with(R"("zero_optimization": {"stage": 3, "prefetch_bucket_size": 1e6,
      "param_persistence_threshold": 5000, "model_persistence_threshold": 1e10,
      "max_live_parameters": 2e8, "max_reuse_distance": 3e8,
      "gather_16bit_weights_on_model_save": true})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.diagnostics.empty());
  const Zero& z = r.config.zero;
  CHECK(z.stage3_prefetch_bucket_size == 1'000'000);
  CHECK(z.stage3_param_persistence_threshold == 5000);
  CHECK(z.stage3_model_persistence_threshold == 10'000'000'000LL);
  CHECK(z.stage3_max_live_parameters == 200'000'000);
  CHECK(z.stage3_max_reuse_distance == 300'000'000);
  CHECK(z.stage3_gather_16bit_weights_on_model_save);
  CHECK(parse_with(R"("zero_optimization": {"prefetch_bucket_size": 1e6, "stage3_prefetch_bucket_size": 1000000})")
            .ok());  // equal values in both spellings
  CHECK(message_at(parse_with(R"("zero_optimization": {"prefetch_bucket_size": 1e6,
                                   "stage3_prefetch_bucket_size": 5})"),
                   "zero_optimization.prefetch_bucket_size") ==
        "is 1000000.0 but 'zero_optimization.stage3_prefetch_bucket_size' (the same setting) is "
        "5; keep only 'stage3_prefetch_bucket_size'");
}

TEST_CASE("bucket sizes set to \"auto\" follow the model's hidden size", "[zero][auto]") {
  const char* body = R"("zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"},
      "zero_train": {"model": {"preset": "gpt2-124m"}})";
  const LoadResult r = parse_with(body);
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.zero.reduce_bucket_size == 768 * 768);
  CHECK(r.config.zero.stage3_prefetch_bucket_size == 530'841);  // 0.9 * 589824, truncated
  CHECK(r.config.zero.stage3_param_persistence_threshold == 7680);
  // The default model (tiny, h = 128).
  const LoadResult t = parse_with(R"("zero_optimization": {"reduce_bucket_size": "auto"})");
  CHECK(t.config.zero.reduce_bucket_size == 128 * 128);
}

TEST_CASE("offload combinations: optimizer with stages 1-3 (nvme too), parameters with 3",
          "[zero][offload]") {
  for (int stage : {1, 2, 3}) {
    const LoadResult r = parse_with(R"("zero_optimization": {"stage": )" + std::to_string(stage) +
                                    R"(, "offload_optimizer": {"device": "cpu"}})");
    INFO(all(r));
    CHECK(r.ok());
    CHECK(r.config.zero.offload_optimizer.enabled());
  }
  CHECK(message_at(parse_with(R"("zero_optimization": {"offload_optimizer": {"device": "cpu"}})"),
                   "zero_optimization.offload_optimizer.device") ==
        "optimizer offload to \"cpu\" needs stage 1, 2 or 3 (zero_optimization.stage is 0); set a "
        "stage or remove offload_optimizer");
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}})"),
                   "zero_optimization.offload_param.device") ==
        "parameter offload to \"cpu\" needs stage 3 (zero_optimization.stage is 2); set \"stage\": "
        "3 or remove offload_param");
  // Optimizer state on NVMe is the host optimizer swapped: stages 1-3 (DeepSpeed: 3 only).
  for (int stage : {1, 2}) {
    const LoadResult r = parse_with(R"("zero_optimization": {"stage": )" + std::to_string(stage) +
                                    R"(, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}})");
    INFO(all(r));
    CHECK(r.ok());
    CHECK(count(r, Severity::warning) == 0);
  }
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage": 2,
                                   "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
                                   "offload_param": {"device": "nvme", "nvme_path": "/nvme"}})"),
                   "zero_optimization.offload_param.device") ==
        "parameter offload to \"nvme\" needs stage 3 (zero_optimization.stage is 2); set \"stage\": "
        "3 or remove offload_param");
}

TEST_CASE("nvme offload is accepted and needs a path; both tiers are built", "[zero][offload]") {
  const LoadResult r = parse_with(R"("zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}})");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.zero.offload_optimizer.device == OffloadDevice::nvme);
  CHECK(r.config.zero.offload_optimizer.nvme_path == "/local_nvme");
  // Optimizer state and parameters on NVMe are both swapped: no note for either.
  CHECK(message_at(r, "zero_optimization.offload_optimizer.device", Severity::warning).empty());
  CHECK(message_at(r, "zero_optimization.offload_param.device", Severity::warning).empty());
  CHECK(count(r, Severity::warning) == 0);
  CHECK(message_at(parse_with(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}})"),
                   "zero_optimization.offload_param.nvme_path") ==
        "missing: device \"nvme\" needs nvme_path, a directory on a fast local drive");
}
