// zero-train: the training program. This version validates configs; training, checkpoints and
// the rest of the flags arrive with the engine (see README, "Status").
//
//   zero-train --config ds_config.json --validate
//     Prints the effective config (every default filled in, "auto" resolved against this MPI
//     world) as JSON on stdout and exits 0; or prints every error and exits 2.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/config/config.hpp"
#include "runtime/core/log.hpp"
#include "runtime/core/mpi_check.hpp"
#include "runtime/core/world.hpp"

namespace {

constexpr int kExitUsage = 2;  // bad flags or a config that does not validate

const char* const kHelp = R"(usage: zero-train --config FILE [--validate]
       mpirun -np N zero-train --config FILE [--validate]

Trains a model with ZeRO stages 0-3 and CPU offload, configured by a DeepSpeed ds_config.json.

options:
  --config FILE   the DeepSpeed config (ds_config.json). Our own settings (device, memory
                  limits, model, steps) live in its "zero_train" section, which DeepSpeed
                  ignores; see docs/config.md.
  --validate      check the config against this MPI world and print the effective config
                  (every default filled in, "auto" resolved) as JSON; exit 0 if valid, else
                  print every error and exit 2. Nothing is trained.
  -h, --help      print this help and exit.

Training itself is not implemented yet in this version: only --validate runs.
)";

struct Flags {
  std::string config;
  bool validate = false;
  bool help = false;
  std::vector<std::string> errors;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> std::string {
      const std::string prefix = std::string(name) + "=";
      if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
      if (i + 1 < argc) return argv[++i];
      f.errors.push_back(std::string(name) + " needs a value");
      return {};
    };
    if (a == "-h" || a == "--help") {
      f.help = true;
    } else if (a == "--config" || a.rfind("--config=", 0) == 0) {
      f.config = value("--config");
    } else if (a == "--validate") {
      f.validate = true;
    } else {
      f.errors.push_back("unknown flag '" + a + "'");
    }
  }
  if (!f.help && f.errors.empty() && f.config.empty())
    f.errors.push_back("--config FILE is required");
  if (!f.help && f.errors.empty() && !f.validate)
    f.errors.push_back("training is not implemented yet in this version; use --validate");
  return f;
}

int validate(zero::World& world, const std::string& path) {
  namespace cfg = zero::config;
  cfg::Environment env;
  env.world_size = world.size();
  // Every GPU we build for (sm_80, sm_90) has bf16, and the cpu backend stores bf16 itself.
  env.bf16_supported = true;
  const cfg::LoadResult result = cfg::load_config_file(path, env);

  // All ranks read the file; rank 0 reports. A rank that fails where rank 0 did not (a file
  // missing on one host) reports its own errors, so nothing is hidden.
  int root_ok = result.ok() ? 1 : 0;
  ZERO_CHECK_MPI(MPI_Bcast(&root_ok, 1, MPI_INT, 0, world.comm()));
  const bool report_here = world.is_root() || (root_ok && !result.ok());
  if (report_here) {
    const std::string prefix =
        world.is_root() ? std::string() : "[rank " + std::to_string(world.rank()) + "] ";
    for (const auto& d : result.diagnostics)
      if (world.is_root() || d.severity == cfg::Diagnostic::Severity::error)
        std::fprintf(stderr, "%s%s\n", prefix.c_str(), cfg::format_diagnostic(d, path).c_str());
  }
  if (world.any(!result.ok())) {
    if (world.is_root())
      std::fprintf(stderr, "%s: the config is not valid (see the errors above)\n", path.c_str());
    return kExitUsage;
  }
  zero::log::info(cfg::effective_config_json(result.config));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main(argc, argv, [&](zero::World& world) {
    Flags flags = parse_flags(argc, argv);
    if (flags.help) {
      if (world.is_root()) std::fputs(kHelp, stdout);
      return 0;
    }
    if (!flags.errors.empty()) {
      if (world.is_root()) {
        for (const auto& e : flags.errors) std::fprintf(stderr, "zero-train: error: %s\n", e.c_str());
        std::fprintf(stderr, "run 'zero-train --help' for the flags\n");
      }
      return kExitUsage;
    }
    return validate(world, flags.config);
  });
}
