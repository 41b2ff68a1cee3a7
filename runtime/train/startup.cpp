#include "runtime/train/startup.hpp"

#include <mpi.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "models/gpt_tensor_parallel.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"
#include "models/gpt.hpp"
#include "runtime/engine/from_config.hpp"
#include "runtime/train/exit_codes.hpp"
#include "runtime/train/rank_errors.hpp"
#include "runtime/train/training_data.hpp"

namespace zero::train {

namespace {

// The GPT's Units (models/gpt.hpp): the embedding, one per transformer block, the head.
long long gpt_unit_count(const models::GptShape& shape) { return shape.n_layer + 2LL; }

// Every pipeline stage runs at least one Unit: more stages than Units leave a stage empty.
void check_stages(const config::Config& c) {
  const int stages = c.ours.parallel.pipeline;
  const long long units = gpt_unit_count(c.ours.model);
  if (stages > units)
    ZERO_FAIL("zero_train.parallel.pipeline (or pipeline.stages): " + std::to_string(stages) +
              " pipeline stages but the model has " + std::to_string(units) +
              " Units (the embedding, " + std::to_string(c.ours.model.n_layer) +
              (c.ours.model.n_layer == 1 ? " transformer block" : " transformer blocks") +
              ", the head), and every stage needs at least one\nHINT: use at most " +
              std::to_string(units) + " stages, or a deeper model (zero_train.model.n_layer, "
              "--model)");
}

}  // namespace

void check_startup(const config::Config& c, const Flags& flags) {
  check_stages(c);
  // Heads (and with them the MLP's columns) and the vocabulary split by the tensor degree.
  models::check_tensor_parallel(c.ours.model, c.ours.parallel.tensor);
  if (c.ours.parallel.sequence_parallel) models::check_sequence_parallel(c.ours.model, c.ours.parallel.tensor);
  (void)engine_options(c, c.ours.device.value_or(DeviceKind::cpu));  // checks only
  if (flags.data.empty())
    check_model_fits_addition(models::data::AdditionTask(addition_options(c)), c.ours.model);
}

std::optional<config::Config> load_config(World& world, const Flags& flags) {
  namespace cfg = config;
  const std::string& path = flags.config;
  cfg::Environment env;
  env.world_size = world.size();
  // Every GPU we build for (sm_80, sm_90) has bf16, and the cpu backend stores bf16 itself.
  env.bf16_supported = true;
  env.steps_flag = flags.steps;
  env.watchdog_timeout_flag = flags.watchdog_timeout;

  std::string flag_error;
  if (!flags.model.empty()) {
    const std::string origin = "--model " + flags.model;
    if (models::gpt_preset(flags.model)) {
      // A preset's name is a plain word (gpt_preset matched it): safe inside JSON quotes.
      env.overrides.push_back({"zero_train.model", "{\"preset\": \"" + flags.model + "\"}", origin});
    } else if (flags.model.find(".json") != std::string::npos) {
      std::ifstream m(flags.model, std::ios::binary);
      std::ostringstream text;
      if (m) text << m.rdbuf();
      if (!m || m.bad())
        flag_error = origin + ": cannot read the file (" + std::strerror(errno) + ")";
      else
        env.overrides.push_back({"zero_train.model", text.str(), origin});
    } else {
      flag_error = "--model '" + flags.model +
                   "' is neither a preset (tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, "
                   "zero-offload-10b) nor a .json model file";
    }
  }
  if (flags.seed) env.overrides.push_back({"seed", std::to_string(*flags.seed), "--seed"});
  // --device was checked to be auto, cpu or cuda: safe inside JSON quotes.
  if (!flags.device.empty())
    env.overrides.push_back({"zero_train.device", "\"" + flags.device + "\"", "--device"});

  cfg::LoadResult result = cfg::load_config_file(path, env);
  std::string startup_error;
  if (result.ok() && flag_error.empty()) {
    try {
      check_startup(result.config, flags);
    } catch (const std::exception& e) {
      startup_error = error_text(e);
    }
  }

  // All ranks read the file; rank 0 reports. A rank that fails where rank 0 did not (a file
  // missing on one host) reports its own errors, so nothing is hidden.
  const bool ok = result.ok() && flag_error.empty() && startup_error.empty();
  int root_ok = ok ? 1 : 0;
  ZERO_CHECK_MPI(MPI_Bcast(&root_ok, 1, MPI_INT, 0, world.comm()));
  const bool report_here = world.is_root() || (root_ok && !ok);
  if (report_here) {
    const std::string prefix =
        world.is_root() ? std::string() : "[rank " + std::to_string(world.rank()) + "] ";
    for (const auto& d : result.diagnostics)
      if (world.is_root() || d.severity == cfg::Diagnostic::Severity::error)
        std::fprintf(stderr, "%s%s\n", prefix.c_str(), cfg::format_diagnostic(d, path).c_str());
    if (!flag_error.empty()) std::fprintf(stderr, "%szero-train: error: %s\n", prefix.c_str(), flag_error.c_str());
    if (!startup_error.empty())
      std::fprintf(stderr, "%s%s: error: %s\n", prefix.c_str(), path.c_str(), startup_error.c_str());
  }
  if (world.any(!ok)) {
    if (world.is_root())
      std::fprintf(stderr, "%s: the config is not valid (see the errors above)\n", path.c_str());
    return std::nullopt;
  }
  return result.config;
}

int validate(World& world, const Flags& flags) {
  const std::optional<config::Config> c = load_config(world, flags);
  if (!c) return kExitUsage;
  log::info(config::effective_config_json(*c));
  return 0;
}

}  // namespace zero::train
