// The process grid in the config: zero_train.parallel (ours) and DeepSpeed's top-level
// "pipeline" block, merged and checked against the world size once both are read.
//
// What DeepSpeed's block means here (docs/config.md, "zero_train.parallel"):
//   stages     the number of pipeline stages = zero_train.parallel.pipeline ("auto": not given)
//   partition  "uniform" and "parameters" = zero_train.parallel.partition ("best", DeepSpeed's
//              config default: not given)
//   seed_layers, activation_checkpoint_interval, pipe_partitioned, grad_partitioned: accepted,
//              no effect here (warned when not DeepSpeed's default)
// A key given in both places with different values is an error naming both paths.
#include <string>

#include "runtime/config/batch.hpp"
#include "runtime/config/config.hpp"
#include "runtime/config/json_io.hpp"

namespace zero::config::detail {
namespace {

constexpr const char* kPipelinePath = "zero_train.parallel.pipeline";
constexpr const char* kTensorPath = "zero_train.parallel.tensor";
constexpr const char* kDataPath = "zero_train.parallel.data";
constexpr const char* kPartitionPath = "zero_train.parallel.partition";
constexpr const char* kDsStagesPath = "pipeline.stages";
constexpr const char* kDsPartitionPath = "pipeline.partition";

constexpr Choice<PipelineSchedule> kSchedules[] = {
    {"gpipe", PipelineSchedule::gpipe},
    {"1f1b", PipelineSchedule::one_f_one_b},
    {"zb-h1", PipelineSchedule::zb_h1},
};

constexpr Choice<StagePartition> kPartitions[] = {
    {"uniform", StagePartition::uniform},
    {"parameters", StagePartition::parameters},
    {"flops", StagePartition::flops},
};

// DeepSpeed's values: its two balanced methods, and "best" (the default its config reader fills
// in) for no preference. Its "type:<regex>" method counts layers of a class; our Units have no
// classes to match, so it is refused with the list.
constexpr Choice<std::optional<StagePartition>> kDsPartitions[] = {
    {"best", std::nullopt},
    {"uniform", StagePartition::uniform},
    {"parameters", StagePartition::parameters},
};

// A pipeline deeper than this is a typo: every stage is at least one rank, and no machine has
// that many. (The real bound, the model's Units, is checked at start-up: check_startup.)
constexpr double kMaxStages = 1 << 20;

std::string str(long long v) { return std::to_string(v); }
std::string ranks(long long n) { return str(n) + (n == 1 ? " rank" : " ranks"); }

}  // namespace

void visit_parallel(Reader& io, Parallel& p) {
  io.key("pipeline", p.pipeline,
         {.min = 1, .max = kMaxStages, .hint = "each stage needs ranks of its own"});
  // Megatron's tensor-model-parallel size; whether the model divides by it (heads, vocabulary)
  // is checked at start-up with the model (zero-train's check_startup, --validate too).
  io.key("tensor", p.tensor, {.min = 1, .max = kMaxStages, .hint = "each slice needs a rank of its own"});
  io.key("sequence_parallel", p.sequence_parallel);
  // "auto" or absent: derived by resolve_grid; a number is checked against it there.
  io.key("data", p.data, {.min = 1, .auto_value = 1});
  io.choice("schedule", p.schedule, kSchedules, {.suggest = true});
  io.choice("partition", p.partition, kPartitions, {.suggest = true});
  // DeepSpeed's name for the stage count, written in our block: the nearest key by spelling
  // ("data") would mislead.
  if (io.find("stages") != nullptr) {
    io.known("stages");
    io.error("stages", "unknown key; the number of stages is 'pipeline' here (DeepSpeed's "
                       "top-level block calls it pipeline.stages)");
  }
}

void visit_parallel(Writer& io, Parallel& p) {
  io.key("pipeline", p.pipeline);
  io.key("tensor", p.tensor);
  io.key("sequence_parallel", p.sequence_parallel);
  io.key("data", p.data);
  io.choice("schedule", p.schedule, kSchedules);
  io.choice("partition", p.partition, kPartitions);
}

void visit_ds_pipeline(Reader& top, DsPipeline& ds, DsPipelineInput& in) {
  top.block("pipeline", ds, [&in](Reader& r, DsPipeline& d) {
    r.key("stages", in.stages,
          {.min = 1, .max = kMaxStages, .auto_value = std::optional<int>{},
           .hint = "each stage needs ranks of its own"});
    r.choice("partition", in.partition, kDsPartitions,
             {.suggest = true,
              .hint = "DeepSpeed's \"type:<regex>\" balances layers of a class, which our Units "
                      "do not have; zero_train.parallel.partition also offers \"flops\""});
    r.key("seed_layers", d.seed_layers, {.not_implemented = true});
    r.key("activation_checkpoint_interval", d.activation_checkpoint_interval,
          {.min = 0, .not_implemented = true});
    r.key("pipe_partitioned", d.pipe_partitioned, {.not_implemented = true});
    r.key("grad_partitioned", d.grad_partitioned, {.not_implemented = true});
  });
}

// Only the keys without a home in zero_train.parallel: stages and partition are written there.
void visit_ds_pipeline(Writer& top, DsPipeline& ds) {
  top.block("pipeline", ds, [](Writer& w, DsPipeline& d) {
    w.key("seed_layers", d.seed_layers);
    w.key("activation_checkpoint_interval", d.activation_checkpoint_interval);
    w.key("pipe_partitioned", d.pipe_partitioned);
    w.key("grad_partitioned", d.grad_partitioned);
  });
}

DataParallel resolve_grid(Session& s, Parallel& p, const DsPipelineInput& ds) {
  const std::size_t errors_before = s.error_count();
  // DeepSpeed's keys fill ours when ours are not given; both given must agree.
  const char* pipeline_from = kPipelinePath;
  if (ds.stages) {
    if (s.source(kPipelinePath) == Source::value && p.pipeline != *ds.stages) {
      s.error(kDsStagesPath,
              "is " + str(*ds.stages) + " but " + kPipelinePath + " is " + str(p.pipeline) +
                  "; both set the number of pipeline stages: give one of them, or the same "
                  "number in both");
    } else {
      p.pipeline = *ds.stages;
      if (s.source(kPipelinePath) != Source::value) pipeline_from = kDsStagesPath;
    }
  }
  if (ds.partition) {
    if (s.source(kPartitionPath) == Source::value && p.partition != *ds.partition) {
      s.error(kDsPartitionPath,
              "is \"" + std::string(to_string(*ds.partition)) + "\" but " + kPartitionPath +
                  " is \"" + std::string(to_string(p.partition)) +
                  "\"; both set how the model is cut into stages: give one of them, or the "
                  "same method in both");
    } else {
      p.partition = *ds.partition;
    }
  }
  if (s.error_count() != errors_before) return {0, ""};

  // data x pipeline x tensor = the world (collectives/grid.hpp places the ranks).
  const long long world = s.env.world_size;
  const long long model = static_cast<long long>(p.pipeline) * p.tensor;
  if (world % model != 0) {
    s.error(pipeline_from,
            ranks(world) + " cannot be arranged as data x " + str(p.pipeline) +
                " pipeline x " + str(p.tensor) + " tensor: pipeline x tensor = " + str(model) +
                " does not divide the world size " + str(world) + "; choose " + pipeline_from +
                " (and " + kTensorPath + ") so that their product divides the number of ranks, "
                "or launch a multiple of " + str(model) + " ranks (mpirun -np)");
    return {0, ""};
  }
  const long long data = world / model;
  if (s.source(kDataPath) == Source::value && p.data != data) {
    s.error(kDataPath, "is " + str(p.data) + " but " + ranks(world) + " / (" +
                           str(p.pipeline) + " pipeline x " + str(p.tensor) + " tensor) = " +
                           str(data) + "; remove the key (\"auto\") to have it derived, or "
                           "launch " + str(static_cast<long long>(p.data) * model) + " ranks");
    return {0, ""};
  }
  p.data = static_cast<int>(data);
  std::string note;
  if (model > 1) {
    note = " (" + ranks(world) + " / " + str(p.pipeline) + " pipeline stages";
    if (p.tensor > 1) note += " x " + str(p.tensor) + " tensor slices";
    note += ")";
  }
  return {data, note};
}

}  // namespace zero::config::detail
