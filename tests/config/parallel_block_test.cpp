// The process grid in the config (runtime/config/parallel_block.cpp): zero_train.parallel's
// defaults and errors, DeepSpeed's "pipeline" block and its disagreements with ours, and the
// batch rule over the data-parallel size.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// `parallel` is the body of zero_train.parallel, on `w` ranks, after a micro-batch of 1.
LoadResult with_parallel(std::string_view parallel, int w, std::string_view more = "") {
  std::string body = "\"zero_train\": {\"parallel\": {" + std::string(parallel) + "}}";
  if (!more.empty()) body += ", " + std::string(more);
  return parse_with(body, world(w));
}

}  // namespace

TEST_CASE("no parallel block: one stage, no tensor slicing, every rank data-parallel", "[parallel]") {
  const LoadResult r = parse_with("", world(4));
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.diagnostics.empty());
  const Parallel& p = r.config.ours.parallel;
  CHECK(p.pipeline == 1);
  CHECK(p.tensor == 1);
  CHECK(p.data == 4);
  CHECK(p.schedule == PipelineSchedule::one_f_one_b);
  CHECK(p.partition == StagePartition::parameters);
  CHECK_FALSE(r.config.pipeline.seed_layers);
  CHECK(r.config.pipeline.activation_checkpoint_interval == 0);
  CHECK(r.config.pipeline.pipe_partitioned);
  CHECK(r.config.pipeline.grad_partitioned);
  CHECK(r.config.batch.train_batch_size == 4);  // micro 1 x accumulation 1 x 4 data-parallel
}

TEST_CASE("every schedule and partition name is read", "[parallel]") {
  const std::pair<const char*, PipelineSchedule> schedules[] = {
      {"gpipe", PipelineSchedule::gpipe},
      {"1f1b", PipelineSchedule::one_f_one_b},
      {"zb-h1", PipelineSchedule::zb_h1}};
  for (const auto& [name, value] : schedules) {
    const LoadResult r = with_parallel("\"schedule\": \"" + std::string(name) + "\"", 1);
    INFO(name << "\n" << all(r));
    REQUIRE(r.ok());
    CHECK(r.config.ours.parallel.schedule == value);
    CHECK(to_string(value) == name);
  }
  const std::pair<const char*, StagePartition> partitions[] = {
      {"uniform", StagePartition::uniform},
      {"parameters", StagePartition::parameters},
      {"flops", StagePartition::flops}};
  for (const auto& [name, value] : partitions) {
    const LoadResult r = with_parallel("\"partition\": \"" + std::string(name) + "\"", 1);
    INFO(name << "\n" << all(r));
    REQUIRE(r.ok());
    CHECK(r.config.ours.parallel.partition == value);
    CHECK(to_string(value) == name);
  }
}

TEST_CASE("pipeline 2 on 4 ranks: data-parallel 2, and the batch rule counts 2 ranks", "[parallel][batch]") {
  const LoadResult r = with_parallel("\"pipeline\": 2", 4,
                                     R"("gradient_accumulation_steps": 4)");
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.ours.parallel.pipeline == 2);
  CHECK(r.config.ours.parallel.data == 2);
  // micro 1 x accumulation 4 x data-parallel 2 (not x 4 ranks).
  CHECK(r.config.batch.train_batch_size == 8);

  // Given train_batch_size 8 and micro 1: accumulation = 8 / (1 x 2).
  const LoadResult derived = parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
      "zero_train": {"parallel": {"pipeline": 2}}})", world(4));
  INFO(all(derived));
  REQUIRE(derived.ok());
  CHECK(derived.config.batch.gradient_accumulation_steps == 4);

  // The DeepSpeed rule with the whole world (16 = 1 x 4 x 4) is wrong under pipeline 2, and the
  // message says where the 2 comes from.
  const LoadResult wrong = parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1,
      "gradient_accumulation_steps": 4, "zero_train": {"parallel": {"pipeline": 2}}})", world(4));
  CHECK_FALSE(wrong.ok());
  CHECK(message_at(wrong, "train_batch_size") ==
        "train_batch_size 16 != train_micro_batch_size_per_gpu 1 x gradient_accumulation_steps 4 "
        "x data-parallel world size 2 (4 ranks / 2 pipeline stages) (= 8); fix one of them or "
        "remove train_batch_size to let it be derived");
}

TEST_CASE("a grid the world does not divide is an error at the key that set it", "[parallel]") {
  const LoadResult r = with_parallel("\"pipeline\": 3", 4);
  CHECK_FALSE(r.ok());
  CHECK(message_at(r, "zero_train.parallel.pipeline") ==
        "4 ranks cannot be arranged as data x 3 pipeline x 1 tensor: pipeline x tensor = 3 does "
        "not divide the world size 4; choose zero_train.parallel.pipeline (and "
        "zero_train.parallel.tensor) so that their product divides the number of ranks, or "
        "launch a multiple of 3 ranks (mpirun -np)");
  // Only the grid's error: the batch rule is not run on a grid that does not exist.
  CHECK(count(r, Severity::error) == 1);

  const LoadResult ds = parse_with(R"("pipeline": {"stages": 2})", world(3));
  CHECK_THAT(message_at(ds, "pipeline.stages"),
             ContainsSubstring("3 ranks cannot be arranged as data x 2 pipeline x 1 tensor"));
  CHECK_THAT(message_at(ds, "pipeline.stages"), ContainsSubstring("choose pipeline.stages"));
}

TEST_CASE("pipeline or tensor below 1 and a wrong data size are refused", "[parallel]") {
  CHECK(message_at(with_parallel("\"pipeline\": 0", 1), "zero_train.parallel.pipeline") ==
        "expected an integer in 1..1048576, got 0");
  CHECK_THAT(message_at(with_parallel("\"pipeline\": 1.5", 1), "zero_train.parallel.pipeline"),
             ContainsSubstring("expected an integer"));
  CHECK(message_at(with_parallel("\"tensor\": 0", 2), "zero_train.parallel.tensor") ==
        "expected an integer in 1..1048576, got 0");
  CHECK(with_parallel("\"tensor\": 1", 2).ok());
  CHECK(with_parallel("\"tensor\": 2", 2).ok());
  CHECK(with_parallel("\"tensor\": 2, \"sequence_parallel\": true", 2).config.ours.parallel.sequence_parallel);
  CHECK_FALSE(with_parallel("\"tensor\": 2, \"sequence_parallel\": 1", 2).ok());
  CHECK(message_at(with_parallel("\"tensor\": 2, \"pipeline\": 2", 6), "zero_train.parallel.pipeline") ==
        "6 ranks cannot be arranged as data x 2 pipeline x 2 tensor: pipeline x tensor = 4 does not "
        "divide the world size 6; choose zero_train.parallel.pipeline (and zero_train.parallel.tensor) "
        "so that their product divides the number of ranks, or launch a multiple of 4 ranks (mpirun -np)");
  CHECK(message_at(with_parallel("\"pipeline\": 2, \"data\": 4", 4), "zero_train.parallel.data") ==
        "is 4 but 4 ranks / (2 pipeline x 1 tensor) = 2; remove the key (\"auto\") to have it "
        "derived, or launch 8 ranks");
  CHECK(with_parallel("\"pipeline\": 2, \"data\": 2", 4).ok());
  CHECK(with_parallel("\"pipeline\": 2, \"data\": \"auto\"", 4).ok());
}

TEST_CASE("a misspelt schedule or partition names the nearest choice", "[parallel]") {
  CHECK(message_at(with_parallel("\"schedule\": \"1fb1\"", 1), "zero_train.parallel.schedule") ==
        "expected one of \"gpipe\", \"1f1b\", \"zb-h1\", got \"1fb1\" (a string); did you mean "
        "\"1f1b\"?");
  CHECK_THAT(message_at(with_parallel("\"schedule\": \"zbh1\"", 1), "zero_train.parallel.schedule"),
             ContainsSubstring("did you mean \"zb-h1\"?"));
  CHECK_THAT(message_at(with_parallel("\"partition\": \"parameter\"", 1),
                        "zero_train.parallel.partition"),
             ContainsSubstring("did you mean \"parameters\"?"));
  // An unknown key of the block names the nearest key, as in every block we know.
  CHECK(message_at(with_parallel("\"sheduel\": \"gpipe\"", 1), "zero_train.parallel.sheduel") ==
        "unknown key; did you mean 'schedule'?");
  // DeepSpeed's word for the stage count, in our block: pointed to ours.
  CHECK(message_at(with_parallel("\"stages\": 2", 1), "zero_train.parallel.stages") ==
        "unknown key; the number of stages is 'pipeline' here (DeepSpeed's top-level block "
        "calls it pipeline.stages)");
}

TEST_CASE("DeepSpeed's pipeline block: stages and partition read as ours", "[parallel][deepspeed]") {
  const LoadResult r = parse_with(R"("pipeline": {"stages": 2, "partition": "uniform"})", world(4));
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.diagnostics.empty());
  CHECK(r.config.ours.parallel.pipeline == 2);
  CHECK(r.config.ours.parallel.data == 2);
  CHECK(r.config.ours.parallel.partition == StagePartition::uniform);

  // DeepSpeed's defaults ("auto" stages, "best" partition) mean: not given.
  const LoadResult defaults = parse_with(
      R"("pipeline": {"stages": "auto", "partition": "best", "seed_layers": false,
          "activation_checkpoint_interval": 0, "pipe_partitioned": true, "grad_partitioned": true})",
      world(2));
  INFO(all(defaults));
  REQUIRE(defaults.ok());
  CHECK(defaults.diagnostics.empty());
  CHECK(defaults.config.ours.parallel.pipeline == 1);
  CHECK(defaults.config.ours.parallel.partition == StagePartition::parameters);

  // Agreeing with ours is fine.
  CHECK(parse_with(R"("pipeline": {"stages": 2}, "zero_train": {"parallel": {"pipeline": 2}})",
                   world(2)).ok());
}

TEST_CASE("DeepSpeed's pipeline block disagreeing with ours is an error naming both", "[parallel][deepspeed]") {
  const LoadResult r = parse_with(
      R"("pipeline": {"stages": 4, "partition": "uniform"},
         "zero_train": {"parallel": {"pipeline": 2, "partition": "flops"}})", world(4));
  CHECK_FALSE(r.ok());
  CHECK(message_at(r, "pipeline.stages") ==
        "is 4 but zero_train.parallel.pipeline is 2; both set the number of pipeline stages: "
        "give one of them, or the same number in both");
  CHECK(message_at(r, "pipeline.partition") ==
        "is \"uniform\" but zero_train.parallel.partition is \"flops\"; both set how the model is "
        "cut into stages: give one of them, or the same method in both");
}

TEST_CASE("DeepSpeed's other pipeline keys are accepted without effect, warned", "[parallel][deepspeed]") {
  const LoadResult r = parse_with(
      R"("pipeline": {"seed_layers": true, "activation_checkpoint_interval": 1,
          "pipe_partitioned": false, "grad_partitioned": false})", world(1));
  INFO(all(r));
  REQUIRE(r.ok());
  for (const char* key : {"pipeline.seed_layers", "pipeline.activation_checkpoint_interval",
                          "pipeline.pipe_partitioned", "pipeline.grad_partitioned"}) {
    INFO(key);
    CHECK_THAT(message_at(r, key, Severity::warning),
               ContainsSubstring("accepted but not implemented yet"));
  }
  CHECK(r.config.pipeline.seed_layers);  // kept, so the effective config shows what was asked
  // DeepSpeed's "type:<regex>" method and typos are refused with the list; unknown keys too.
  const LoadResult type = parse_with(R"("pipeline": {"partition": "type:transformer"})");
  CHECK_THAT(message_at(type, "pipeline.partition"),
             ContainsSubstring("expected one of \"best\", \"uniform\", \"parameters\""));
  CHECK(message_at(parse_with(R"("pipeline": {"stage": 2})"), "pipeline.stage") ==
        "unknown key; did you mean 'stages'?");
  // No longer an "ignored" feature: no such warning.
  CHECK(message_at(parse_with(R"("pipeline": {})"), "pipeline", Severity::warning).empty());
}

TEST_CASE("the effective config shows the grid and reads back to itself", "[parallel][effective]") {
  const LoadResult first = parse_with(
      R"("pipeline": {"stages": 2, "seed_layers": true},
         "zero_train": {"parallel": {"schedule": "zb-h1", "partition": "flops"}})", world(4));
  INFO(all(first));
  REQUIRE(first.ok());
  const std::string json = effective_config_json(first.config, -1);
  CHECK_THAT(json, ContainsSubstring(
                       "\"parallel\":{\"pipeline\":2,\"tensor\":1,\"sequence_parallel\":false,\"data\":2,\"schedule\":\"zb-h1\","
                       "\"partition\":\"flops\"}"));
  CHECK_THAT(json, ContainsSubstring("\"pipeline\":{\"seed_layers\":true,"));
  const LoadResult second = parse_config(json, "effective.json", world(4));
  INFO(json << "\n" << all(second));
  REQUIRE(second.ok());
  CHECK(effective_config_json(second.config, -1) == json);
}
