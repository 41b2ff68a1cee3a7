// zero-train: the training program.
//
//   zero-train --config ds_config.json --validate
//     Prints the effective config (every default filled in, "auto" resolved against this MPI
//     world) as JSON on stdout and exits 0; or prints every error and exits 2.
//   mpirun -np N zero-train --config ds_config.json [--steps N]
//     Trains the config's GPT (zero_train.model) on the embedded addition task with the ZeRO
//     engine: a start-up block on rank 0 (the run, the model state per rank and the ledger), one
//     line every steps_per_print steps. Checkpoints, token-shard data, evaluation, metrics files
//     and the rest of issue 8's flags are not there yet.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.hpp"
#include "models/data/addition_task.hpp"
#include "models/gpt.hpp"
#include "offload/thread_budget.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/from_config.hpp"
#include "runtime/core/log.hpp"
#include "runtime/core/mpi_check.hpp"
#include "runtime/core/world.hpp"

namespace {

constexpr int kExitUsage = 2;  // bad flags or a config that does not validate

const char* const kHelp = R"(usage: zero-train --config FILE [--steps N] [--validate]
       mpirun -np N zero-train --config FILE [--steps N] [--validate]

Trains a model with ZeRO stages 0-3 and CPU offload, configured by a DeepSpeed ds_config.json.

options:
  --config FILE   the DeepSpeed config (ds_config.json). Our own settings (device, memory
                  limits, model, steps) live in its "zero_train" section, which DeepSpeed
                  ignores; see docs/config.md.
  --steps N       optimizer steps to run (overrides zero_train.steps).
  --validate      check the config against this MPI world and print the effective config
                  (every default filled in, "auto" resolved) as JSON; exit 0 if valid, else
                  print every error and exit 2. Nothing is trained.
  -h, --help      print this help and exit.

Without --validate it trains zero_train.model (a GPT) on the embedded 2-digit addition task,
printing the loss every steps_per_print steps. This version trains on the cpu backend only and
has no checkpoints, token-shard data or evaluation yet.
)";

struct Flags {
  std::string config;
  std::optional<long long> steps;
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
    } else if (a == "--steps" || a.rfind("--steps=", 0) == 0) {
      const std::string v = value("--steps");
      char* end = nullptr;
      const long long n = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1)
        f.errors.push_back("--steps needs a positive whole number, got '" + v + "'");
      else
        f.steps = n;
    } else if (a == "--validate") {
      f.validate = true;
    } else {
      f.errors.push_back("unknown flag '" + a + "'");
    }
  }
  if (!f.help && f.errors.empty() && f.config.empty())
    f.errors.push_back("--config FILE is required");
  return f;
}

// Reads and checks the config on every rank; rank 0 reports. Empty when it is not valid (the
// errors are printed).
std::optional<zero::config::Config> load(zero::World& world, const Flags& flags) {
  namespace cfg = zero::config;
  const std::string& path = flags.config;
  cfg::Environment env;
  env.world_size = world.size();
  // Every GPU we build for (sm_80, sm_90) has bf16, and the cpu backend stores bf16 itself.
  env.bf16_supported = true;
  env.steps_flag = flags.steps;
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
    return std::nullopt;
  }
  return result.config;
}

int validate(zero::World& world, const Flags& flags) {
  const std::optional<zero::config::Config> c = load(world, flags);
  if (!c) return kExitUsage;
  zero::log::info(zero::config::effective_config_json(*c));
  return 0;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int train(zero::World& world, const Flags& flags) {
  using namespace zero;
  const std::optional<config::Config> loaded = load(world, flags);
  if (!loaded) return kExitUsage;
  const config::Config& c = *loaded;
  const std::string& path = flags.config;

  // The engine runs on the cpu backend in this version (issue 9 brings its cuda step).
  if (c.ours.device == DeviceKind::cuda) {
    if (world.is_root())
      std::fprintf(stderr,
                   "%s: error: zero_train.device: \"cuda\": the ZeRO engine trains on the cpu "
                   "backend in this version\nHINT: set zero_train.device to \"cpu\" (or \"auto\")\n",
                   path.c_str());
    return kExitUsage;
  }
  const models::GptShape shape = c.ours.model;
  const models::data::AdditionTask task({.digits = 2, .seed = static_cast<uint64_t>(c.seed), .held_out_fraction = 0.1});
  const int T = task.min_seq_len();
  if (shape.vocab_size < models::data::AdditionTask::kVocabSize || shape.seq_len < T) {
    if (world.is_root())
      std::fprintf(stderr,
                   "%s: error: zero_train.model: the addition task needs vocab_size >= %d and "
                   "seq_len >= %d, the model has %d and %d\nHINT: use a larger vocabulary or "
                   "context, or the preset \"tiny\"\n",
                   path.c_str(), models::data::AdditionTask::kVocabSize, T, shape.vocab_size, shape.seq_len);
    return kExitUsage;
  }

  DeviceOptions dopt;
  dopt.memory_limit = static_cast<size_t>(c.ours.device_memory_limit);
  dopt.host_memory_limit = static_cast<size_t>(c.ours.host_memory_limit);
  auto device = make_device(DeviceKind::cpu, 0, dopt);
  auto comm = coll::make_mpi_communicator(world.comm(), *device);
  auto stream = device->create_stream("compute");
  auto ops = models::make_ops(*device, *stream);
  EngineOptions o = engine_options(c);
  // The host AdamW's threads: the node's cores shared among its ranks (collective).
  const offload::ThreadBudget budget = offload::host_thread_budget(world.comm());
  o.host_threads = budget.threads;
  Model model = models::make_gpt({shape, o.param_type, ScalarType::f32}, *ops);
  Engine engine(model, *device, *stream, *comm, o);

  const int W = world.size(), B = static_cast<int>(c.batch.train_micro_batch_size_per_gpu);
  const int GA = o.gradient_accumulation_steps;
  const long long steps = c.ours.steps;
  char line[512];
  std::snprintf(line, sizeof line,
                "zero-train: %s, GPT %s (%d layers, hidden %d, %d heads, vocabulary %d), %lld "
                "parameters\nzero-train: %d rank(s) on %s, ZeRO stage %d%s%s, %s, batch %lld = "
                "%d per rank x %d accumulation x %d ranks, %lld steps\ndata: %s, %d tokens per "
                "sequence",
                path.c_str(), c.ours.model_preset.empty() ? "(explicit shape)" : c.ours.model_preset.c_str(),
                shape.n_layer, shape.n_embd, shape.n_head, shape.vocab_size,
                static_cast<long long>(model.parameter_count()), W, device->name().c_str(), o.stage,
                o.offload_optimizer ? ", optimizer offloaded to host memory" : "",
                o.offload_param ? ", parameters offloaded" : "",
                std::string(to_string(o.param_type)).c_str(), c.batch.train_batch_size, B, GA, W, steps,
                task.describe().c_str(), T);
  log::info(line);
  log::info(budget.explanation);
  log::info(engine.memory_report());

  double t_last = now_seconds();
  long long since = 0;
  for (long long step = 1; step <= steps; ++step) {
    const StepStats st = engine.step([&](int m) {
      const int64_t first = ((static_cast<int64_t>(step - 1) * W + world.rank()) * GA + m) * B;
      const models::data::TokenBatch tb = task.batch(first, B, T);
      Batch b;
      b.inputs = Tensor::empty(*device, Shape{tb.rows, tb.cols}, ScalarType::i32, MemCategory::activations);
      b.targets = Tensor::empty(*device, Shape{tb.rows, tb.cols}, ScalarType::i32, MemCategory::activations);
      copy_from_host(*device, *stream, b.inputs, tb.inputs.data());
      copy_from_host(*device, *stream, b.targets, tb.targets.data());
      stream->synchronize();  // the copies read `tb`, which goes out of scope here
      return b;
    });
    ++since;
    // The mean loss over every rank's micro-batches (collective: every rank, every step).
    double loss = st.loss / W;
    ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, world.comm()));
    if (step % c.steps_per_print == 0 || step == steps || step == 1) {
      const double t = now_seconds(), dt = (t - t_last) / static_cast<double>(since);
      const LedgerSnapshot snap = device->ledger().snapshot();
      std::snprintf(line, sizeof line,
                    "step %lld/%lld | loss %.4f | lr %.3g | grad norm %.3g | loss scale %g%s | "
                    "%.0f tokens/s | %.3f s/step | device %s | host %s",
                    step, steps, loss, static_cast<double>(st.lr), static_cast<double>(st.grad_norm),
                    st.loss_scale, st.applied ? "" : " (skipped: overflow)",
                    static_cast<double>(W) * GA * B * T / dt, dt,
                    format_bytes(snap.total[0].current).c_str(), format_bytes(snap.total[1].current).c_str());
      log::info(line);
      if (o.timers) {
        std::snprintf(line, sizeof line,
                      "  time: forward %.3f s, backward %.3f s, optimizer %.3f s; communication "
                      "busy %.3f s, exposed %.3f s",
                      st.time.forward, st.time.backward, st.time.optimizer, st.time.comm_busy,
                      st.time.comm_exposed);
        log::info(line);
        if (o.offload_optimizer) {
          std::snprintf(line, sizeof line,
                        "  offload: host AdamW %.3f s (%.0f%% hidden%s), waits for copies down "
                        "%.3f s, up %.3f s",
                        st.time.host_adam, 100.0 * st.time.host_adam_hidden(),
                        st.speculation == StepStats::Speculation::kept      ? ", ran during backward"
                        : st.speculation == StepStats::Speculation::dropped ? ", guess dropped"
                                                                            : "",
                        st.time.d2h, st.time.h2d);
          log::info(line);
        }
      }
      t_last = t;
      since = 0;
    }
  }
  log::info("zero-train: done; the ledger at the end:\n" + device->ledger().snapshot().table());
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
    return flags.validate ? validate(world, flags) : train(world, flags);
  });
}
