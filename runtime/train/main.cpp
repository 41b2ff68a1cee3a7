// zero-train: the training program.
//
//   zero-train --config ds_config.json --validate
//     Prints the effective config (every default filled in, "auto" resolved against this MPI
//     world) as JSON on stdout and exits 0; or prints every error and exits 2.
//   mpirun -np N zero-train --config ds_config.json [flags]
//     Trains the config's GPT (zero_train.model, or --model) on the embedded addition task or on
//     llm.c token shards (--data) with the ZeRO engine: a start-up block on rank 0 (the run, the
//     host thread budget, the model state per rank and the ledger), one line every
//     steps_per_print steps, a progress bar on a terminal, JSON lines of metrics to a file,
//     checkpoints (--checkpoint-dir, --save-interval) and exact resume (--resume).
//   mpirun -np N zero-train --config ds_config.json --eval-only [--resume | --init-from F]
//     Evaluates the weights on the held-out set and exits: the same loss on any number of ranks.
//   zero-train export --checkpoint DIR [--tag TAG] --out FILE.safetensors [--hf-config]
//     Writes a checkpoint's fp32 master weights, consolidated, as safetensors with Hugging Face
//     GPT-2 names; with --hf-config also the config.json beside it that transformers'
//     GPT2LMHeadModel.from_pretrained needs.
//
// Exit codes: 0 done; 1 a failure while running (a corrupt checkpoint, a model that does not
// fit, an I/O error), reported as one paragraph on rank 0 (or on the rank it concerns); 2 bad
// flags, config or input files, before anything is trained.
#include <mpi.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "collectives/communicator.hpp"
#include "models/data/addition_task.hpp"
#include "models/data/token_shards.hpp"
#include "models/gpt.hpp"
#include "offload/memory_budget.hpp"
#include "offload/thread_budget.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/hf_gpt2.hpp"
#include "runtime/config/config.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"
#include "core/peak_flops.hpp"
#include "core/phase.hpp"
#include "core/watchdog.hpp"
#include "core/world.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/from_config.hpp"
#include "runtime/train/held_out_eval.hpp"
#include "runtime/train/metrics_file.hpp"
#include "runtime/engine/step_guard.hpp"

namespace {

constexpr int kExitFailure = 1;  // something failed while running
constexpr int kExitUsage = 2;    // bad flags, config or input, before training
constexpr int kExitLost = 3;     // a rank or host stopped answering (the watchdog)

const char* const kHelp = R"(usage: [mpirun -np N] zero-train --config FILE [options]
       zero-train --config FILE --validate
       [mpirun -np N] zero-train --config FILE --eval-only [--resume | --init-from FILE]
       zero-train export --checkpoint DIR [--tag TAG] --out FILE.safetensors [--hf-config]

Trains a GPT with ZeRO stages 0-3 and CPU offload, configured by a DeepSpeed ds_config.json.

options:
  --config FILE         the DeepSpeed config (ds_config.json). Our own settings (device, memory
                        limits, model, steps) live in its "zero_train" section, which DeepSpeed
                        ignores; see docs/config.md.
  --steps N             the optimizer step to train up to, where the config does not set
                        zero_train.steps (default 100); a config that sets it must agree (an
                        error otherwise, not an override). A resumed run continues up to N.
  --model NAME|FILE     a model preset (tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b,
                        zero-offload-10b) or a JSON file like zero_train.model
                        ({"preset": ...} and/or n_layer, n_embd, n_head, vocab_size, seq_len);
                        replaces zero_train.model.
  --data PATTERN        train on llm.c token shards (files or a glob, e.g. 'fineweb_train_*.bin';
                        quote it), sequences of the model's seq_len. Default: the embedded
                        2-digit addition task.
  --eval-interval N     every N steps (and at the end), the held-out loss (mean per target
                        token) over the held-out set: the addition task's held-out problems, or
                        every window of --eval-data in file order. The same weights give the
                        same loss on any number of ranks. 0: never (default).
  --eval-data PATTERN   token shards for the evaluation (with --data, or with --eval-only).
  --eval-sequences N    evaluate only the first N sequences of the held-out set (in its fixed
                        order: problems in the split's order, windows in file order); default 0:
                        the whole set.
  --eval-only           evaluate the weights (--resume: the newest checkpoint of
                        --checkpoint-dir; --init-from FILE; else the seed's) once on the held-out
                        set, write the result to the metrics file and exit; nothing is trained
                        or saved.
  --checkpoint-dir DIR  where checkpoints go (DIR/step_00000100/...; DIR/latest names the newest).
                        Must be one filesystem every rank sees. Saved every --save-interval steps
                        and at the end.
                        Checked at start: created if needed, writable from every rank, and
                        with room for one checkpoint (else exit 2); what failed or interrupted
                        saves left there is removed (or, when sealed, completed).
  --save-interval N     steps between checkpoints (default 0: only at the end).
  --no-space-check      skip the start-up comparison of the free space with one checkpoint's
                        size (for filesystems whose free space statvfs does not report).
  --resume              continue from the newest complete checkpoint in --checkpoint-dir (by
                        commit time; says so when DIR/latest names another): the same losses
                        as a run never interrupted. Any world size, any ZeRO stage.
  --init-from FILE      start from the weights of a safetensors file: one written by 'zero-train
                        export', or a Hugging Face GPT-2's (save_pretrained's model.safetensors,
                        "transformer." prefix and a tied lm_head.weight accepted); Adam starts
                        fresh.
  --device KIND         auto, cpu or cuda (overrides zero_train.device).
  --seed N              the run's seed: initial weights and data order (overrides "seed").
  --watchdog-timeout S  seconds without a heartbeat from a neighbouring rank before the job is
                        ended with a report (exit 3); sets zero_train.watchdog_timeout (a file
                        that sets it must agree; default 20; 0 = off). Slow steps and long
                        saves do not trigger it: only a rank whose process stopped answering.
  --metrics FILE        JSON lines of per-step metrics, appended (default:
                        DIR/metrics.jsonl with --checkpoint-dir, else zero-train-metrics.jsonl).
                        Opened before training (exit 2 if it cannot be); a write that fails
                        later stops the run (exit 1).
  --progress WHEN       a progress bar between log lines: auto (default: when stdout is a
                        terminal and not under mpirun, whose output forwarding looks like a
                        terminal even into a pipe), on, off.
  --validate            check the config against this MPI world and print the effective config
                        as JSON; exit 0 if valid, else print every error and exit 2.
  -h, --help            print this help and exit.

export:
  --checkpoint DIR      a checkpoint directory (the --checkpoint-dir of a run)
  --tag TAG             which checkpoint (default: the newest complete one)
  --out FILE            the safetensors file to write (fp32, Hugging Face GPT-2 names)
  --hf-config           also write config.json beside FILE, so that transformers'
                        GPT2LMHeadModel.from_pretrained(DIR) loads the model (name the file
                        DIR/model.safetensors); the number of heads is the one the checkpoint
                        recorded, or --n-head
  --n-head N            attention heads, for --hf-config with a checkpoint that does not record
                        them (saved by an older zero-train)

Exit status: 0 done, 1 failed while running (reported as one paragraph), 2 bad flags, config or
input files, 3 a rank or host stopped answering (the watchdog; resume from the last checkpoint).
)";

struct Flags {
  bool export_mode = false;
  std::string config;
  std::optional<long long> steps;
  std::string model, data, eval_data, checkpoint_dir, init_from, device, metrics;
  std::string progress = "auto";
  std::optional<long long> seed;
  std::optional<double> watchdog_timeout;
  long long eval_interval = 0, eval_sequences = 0, save_interval = 0;
  bool resume = false, validate = false, help = false, eval_only = false, no_space_check = false;
  std::string export_dir, export_tag, export_out;
  bool export_hf_config = false;
  std::optional<long long> export_n_head;
  std::vector<std::string> errors;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  int i = 1;
  if (argc > 1 && std::string(argv[1]) == "export") {
    f.export_mode = true;
    i = 2;
  }
  for (; i < argc; ++i) {
    std::string a = argv[i];
    std::string name = a, inline_value;
    bool has_inline = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = a.substr(0, eq);
      inline_value = a.substr(eq + 1);
      has_inline = true;
    }
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 < argc) return argv[++i];
      f.errors.push_back(name + " needs a value");
      return {};
    };
    auto count = [&](bool positive) -> std::optional<long long> {
      const std::string v = value();
      char* end = nullptr;
      const long long n = v.empty() ? -1 : std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < (positive ? 1 : 0)) {
        f.errors.push_back(name + " needs a " + (positive ? "positive" : "non-negative") +
                           " whole number, got '" + v + "'");
        return std::nullopt;
      }
      return n;
    };
    auto text = [&](std::string& out) {
      out = value();
      if (out.empty() && f.errors.empty()) f.errors.push_back(name + " needs a non-empty value");
    };
    if (name == "-h" || name == "--help") {
      f.help = true;
    } else if (f.export_mode) {
      if (name == "--checkpoint") text(f.export_dir);
      else if (name == "--tag") text(f.export_tag);
      else if (name == "--out") text(f.export_out);
      else if (name == "--hf-config") f.export_hf_config = true;
      else if (name == "--n-head") {
        if (auto n = count(true)) f.export_n_head = *n;
      }
      else f.errors.push_back("unknown flag '" + a + "' for 'zero-train export'");
    } else if (name == "--config") {
      text(f.config);
    } else if (name == "--steps") {
      if (auto n = count(true)) f.steps = *n;
    } else if (name == "--model") {
      text(f.model);
    } else if (name == "--data") {
      text(f.data);
    } else if (name == "--eval-data") {
      text(f.eval_data);
    } else if (name == "--eval-interval") {
      if (auto n = count(false)) f.eval_interval = *n;
    } else if (name == "--eval-sequences") {
      if (auto n = count(false)) f.eval_sequences = *n;
    } else if (name == "--eval-batches") {
      // Counted per rank, so the evaluated set changed with the world size (issue 16).
      (void)value();  // its number goes with it, not reported as an unknown flag
      f.errors.push_back("--eval-batches was replaced by --eval-sequences N: an evaluation covers the "
                         "whole held-out set, or its first N sequences, the same on any number of ranks");
    } else if (name == "--eval-only") {
      f.eval_only = true;
    } else if (name == "--checkpoint-dir") {
      text(f.checkpoint_dir);
    } else if (name == "--save-interval") {
      if (auto n = count(false)) f.save_interval = *n;
    } else if (name == "--resume") {
      f.resume = true;
    } else if (name == "--no-space-check") {
      f.no_space_check = true;
    } else if (name == "--init-from") {
      text(f.init_from);
    } else if (name == "--device") {
      text(f.device);
      if (!f.device.empty() && f.device != "auto" && f.device != "cpu" && f.device != "cuda")
        f.errors.push_back("--device must be auto, cpu or cuda, got '" + f.device + "'");
    } else if (name == "--seed") {
      if (auto n = count(false)) f.seed = *n;
    } else if (name == "--progress") {
      text(f.progress);
      if (f.progress != "auto" && f.progress != "on" && f.progress != "off")
        f.errors.push_back("--progress must be auto, on or off, got '" + f.progress + "'");
    } else if (name == "--watchdog-timeout") {
      const std::string v = value();
      char* end = nullptr;
      const double s = v.empty() ? -1 : std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(s >= 0) || s > 1e6)
        f.errors.push_back(name + " needs a number of seconds >= 0 (0 = no watchdog), got '" + v + "'");
      else
        f.watchdog_timeout = s;
    } else if (name == "--metrics") {
      text(f.metrics);
    } else if (name == "--validate") {
      f.validate = true;
    } else {
      f.errors.push_back("unknown flag '" + a + "'");
    }
  }
  if (f.help || !f.errors.empty()) return f;
  if (f.export_mode) {
    if (f.export_dir.empty()) f.errors.push_back("export: --checkpoint DIR is required");
    if (f.export_out.empty()) f.errors.push_back("export: --out FILE.safetensors is required");
    if (f.export_n_head && !f.export_hf_config)
      f.errors.push_back("export: --n-head is for --hf-config (the config.json); add --hf-config");
    return f;
  }
  if (f.config.empty()) f.errors.push_back("--config FILE is required");
  if (f.resume && f.checkpoint_dir.empty())
    f.errors.push_back("--resume needs --checkpoint-dir DIR (where to find the checkpoint)");
  if (f.save_interval > 0 && f.checkpoint_dir.empty())
    f.errors.push_back("--save-interval needs --checkpoint-dir DIR (where to save)");
  if (f.no_space_check && f.checkpoint_dir.empty())
    f.errors.push_back("--no-space-check needs --checkpoint-dir DIR (the directory it concerns)");
  if (f.resume && !f.init_from.empty())
    f.errors.push_back("--resume and --init-from exclude each other: a resumed run takes its "
                       "weights from the checkpoint");
  if (!f.eval_data.empty() && f.data.empty() && !f.eval_only)
    f.errors.push_back("--eval-data needs --data (the addition task has its own held-out set) or "
                       "--eval-only");
  if (f.eval_only && f.save_interval > 0)
    f.errors.push_back("--eval-only trains nothing, so there is nothing to save: drop --save-interval");
  return f;
}

std::string error_text(const std::exception& e) {
  if (const auto* z = dynamic_cast<const zero::Error*>(&e); z && z->library() == "zero")
    return z->message();
  return e.what();
}

// Runs `body` on every rank; when it throws on any rank, every rank gets false, and the errors
// are printed once each: rank 0's, and that of any other rank whose message differs (a rank
// that failed on its own, e.g. a corrupt file only it reads, while the others only learned
// that it failed).
template <class F>
bool on_all_ranks(zero::World& world, const std::string& what, F&& body) {
  std::string error;
  try {
    body();
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  const int failed = error.empty() ? 0 : 1;
  if (!world.any(failed != 0)) return true;
  std::vector<char> root(4096, 0);
  if (world.is_root()) std::snprintf(root.data(), root.size(), "%s", error.c_str());
  ZERO_CHECK_MPI(MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_CHAR, 0, world.comm()));
  if (failed && (world.is_root() || error.substr(0, root.size() - 1) != root.data())) {
    const std::string prefix = world.is_root() ? std::string() : "[rank " + std::to_string(world.rank()) + "] ";
    std::fprintf(stderr, "%szero-train: error: %s: %s\n", prefix.c_str(), what.c_str(), error.c_str());
    std::fflush(stderr);
  }
  return false;
}

// The default data (the embedded addition task) as the run configures it.
zero::models::data::AdditionOptions addition_options(const zero::config::Config& c) {
  return {.digits = 2, .seed = static_cast<uint64_t>(c.seed), .held_out_fraction = 0.1};
}

// The addition task's needs of the model: a clear error naming the model's sizes.
void check_model_fits_addition(const zero::models::data::AdditionTask& task,
                               const zero::models::GptShape& shape) {
  using zero::models::data::AdditionTask;
  if (shape.vocab_size < AdditionTask::kVocabSize || shape.seq_len < task.min_seq_len())
    ZERO_FAIL("the addition task needs zero_train.model.vocab_size >= " +
              std::to_string(AdditionTask::kVocabSize) + " and seq_len >= " +
              std::to_string(task.min_seq_len()) + ", the model has " +
              std::to_string(shape.vocab_size) + " and " + std::to_string(shape.seq_len) +
              "\nHINT: use a larger vocabulary or context, or the preset \"tiny\"");
}

// Everything start-up derives from the config alone, before it opens a device or reads data:
// the engine's options (the LR schedule built, and what the Engine's constructor checks about
// them) and the model against the default data. --validate and training both run it, so a
// config that validates does not fail at start for a reason in the config. Throws zero::Error.
void check_startup(const zero::config::Config& c, const Flags& flags) {
  (void)zero::engine_options(c);
  if (flags.data.empty())
    check_model_fits_addition(zero::models::data::AdditionTask(addition_options(c)), c.ours.model);
}

// The config, with the flags that replace parts of it (--model, --seed, --device) written into
// it before it is read, so that everything derived from them ("auto" bucket sizes from n_embd)
// agrees; then check_startup. Every error is printed (rank 0; another rank only for its own
// errors) and the result is nullopt on every rank when any rank failed.
std::optional<zero::config::Config> load(zero::World& world, const Flags& flags) {
  namespace cfg = zero::config;
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
    if (zero::models::gpt_preset(flags.model)) {
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

int validate(zero::World& world, const Flags& flags) {
  const std::optional<zero::config::Config> c = load(world, flags);
  if (!c) return kExitUsage;
  zero::log::info(zero::config::effective_config_json(*c));
  return 0;
}

int export_checkpoint(zero::World& world, const Flags& flags) {
  using namespace zero;
  if (!world.is_root()) return 0;  // one process writes the file
  try {
    std::string tag = flags.export_tag;
    if (tag.empty()) {
      const std::optional<checkpoint::Newest> n = checkpoint::find_newest(flags.export_dir);
      if (!n)
        ZERO_FAIL("no complete checkpoint in " + flags.export_dir +
                  "\nHINT: pass the --checkpoint-dir of a run that saved one, or --tag");
      if (!n->note.empty()) std::fprintf(stderr, "zero-train export: %s\n", n->note.c_str());
      tag = n->tag;
    }
    const checkpoint::Info info = checkpoint::read_info(flags.export_dir, tag);
    // The config.json is derived (and any problem with it reported) before a file is written.
    std::optional<models::GptShape> hf_shape;
    std::string hf_config_path;
    if (flags.export_hf_config) {
      long long n_head = checkpoint::recorded_n_head(info.metadata).value_or(0);
      if (flags.export_n_head) {
        if (n_head != 0 && n_head != *flags.export_n_head)
          ZERO_FAIL("--n-head " + std::to_string(*flags.export_n_head) + ", but the checkpoint was trained with " +
                    std::to_string(n_head) + " heads\nHINT: drop --n-head (the checkpoint's own number is used)");
        n_head = *flags.export_n_head;
      }
      if (n_head == 0)
        ZERO_FAIL("--hf-config: the checkpoint " + flags.export_dir + "/" + tag +
                  " does not record its number of attention heads (saved by an older zero-train)\n"
                  "HINT: pass --n-head N, the n_head of the model it was trained with");
      if (n_head > (1LL << 30)) ZERO_FAIL("--n-head " + std::to_string(n_head) + " is not a number of heads");
      hf_shape = checkpoint::gpt_shape_from_params(info.params, static_cast<int>(n_head));
      hf_config_path = (std::filesystem::path(flags.export_out).parent_path() / "config.json").string();
    }
    checkpoint::export_safetensors(flags.export_dir, tag, "master", flags.export_out);
    int64_t n = 0;
    for (const auto& p : info.params) n += p.numel();
    std::printf("zero-train export: %s/%s -> %s: %zu tensors, %lld parameters, fp32\n",
                flags.export_dir.c_str(), tag.c_str(), flags.export_out.c_str(), info.params.size(),
                static_cast<long long>(n));
    if (hf_shape) {
      checkpoint::write_hf_gpt2_config(hf_config_path, *hf_shape);
      std::printf("zero-train export: %s: Hugging Face GPT2LMHeadModel config (transformers' "
                  "from_pretrained loads the directory)\n", hf_config_path.c_str());
      if (std::filesystem::path(flags.export_out).filename() != "model.safetensors")
        std::printf("zero-train export: note: from_pretrained looks for model.safetensors in the "
                    "directory; rename %s to it\n", flags.export_out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-train export: error: %s\n", error_text(e).c_str());
    return kExitFailure;
  }
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string step_tag(long long step) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%08lld", step);
  return b;
}

// --checkpoint-dir before anything is trained, so that a directory a save cannot use fails now
// and not hours later: created, writable from every rank (a real probe file: one host's mount
// may be read-only), tidied of what failed or interrupted saves left (rank 0: a sealed leftover
// is installed, garbage removed; before --resume looks for the newest checkpoint), and with room
// for one checkpoint of this run (rank 0: statvfs, one filesystem shared by every rank). Returns
// 0, or kExitUsage with the reason printed.
int check_checkpoint_dir(zero::World& world, const Flags& flags, const zero::Engine& engine) {
  using namespace zero;
  const std::string& dir = flags.checkpoint_dir;
  const std::string what = "--checkpoint-dir " + dir;
  // Rank 0 first, so that the others do not race it creating the directory.
  if (!on_all_ranks(world, what, [&] { if (world.is_root()) checkpoint::probe_writable(dir); }))
    return kExitUsage;
  if (!on_all_ranks(world, what, [&] { if (!world.is_root()) checkpoint::probe_writable(dir); }))
    return kExitUsage;
  if (!on_all_ranks(world, what, [&] {
        if (!world.is_root()) return;
        for (const std::string& done : checkpoint::clean_leftovers(dir)) log::info("checkpoint: " + done);
      }))
    return kExitUsage;

  // One checkpoint: every rank's file (fp32 master, exp_avg and exp_avg_sq of the elements it
  // owns, with its table) plus the manifest, marker and latest; each file rounded up to a block.
  unsigned long long mine = engine.checkpoint_bytes(), bytes = 0;
  ZERO_CHECK_MPI(MPI_Allreduce(&mine, &bytes, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, world.comm()));
  int verdict = 0;
  if (world.is_root()) {
    try {
      const checkpoint::Space space = checkpoint::free_space(dir);
      const unsigned long long need = bytes + (static_cast<unsigned long long>(world.size()) + 3) * space.block;
      char line[1024];
      if (space.available < need) {
        std::snprintf(line, sizeof line,
                      "%s has %llu bytes (%s) free, but one checkpoint of this run needs %llu (%s: "
                      "the fp32 master weights and Adam's two moments of every parameter, in %d rank "
                      "file(s), and the manifest)",
                      dir.c_str(), static_cast<unsigned long long>(space.available),
                      format_bytes(space.available).c_str(), need, format_bytes(need).c_str(), world.size());
        if (flags.no_space_check) {
          log::warn(std::string(line) + "; going on as --no-space-check asks: a save that finds the "
                    "disk full fails the run (exit 1) and keeps the earlier checkpoints");
        } else {
          std::fprintf(stderr,
                       "zero-train: error: %s: %s\nHINT: free at least %llu bytes there or pass a "
                       "--checkpoint-dir on a larger filesystem; --no-space-check skips this check "
                       "where statvfs does not report the real free space\n",
                       what.c_str(), line, need - static_cast<unsigned long long>(space.available));
          verdict = kExitUsage;
        }
      } else {
        std::snprintf(line, sizeof line, "checkpoint: %s: one checkpoint takes %s, %s free (room for %llu)",
                      dir.c_str(), format_bytes(need).c_str(), format_bytes(space.available).c_str(),
                      static_cast<unsigned long long>(space.available / need));
        log::info(line);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero-train: error: %s: %s\n", what.c_str(), error_text(e).c_str());
      verdict = kExitUsage;
    }
  }
  ZERO_CHECK_MPI(MPI_Bcast(&verdict, 1, MPI_INT, 0, world.comm()));
  return verdict;
}

// One line of the metrics file. JSON has no NaN or infinity, and a strict parser refuses them:
// a number that is not finite is written as null, and the line gets "non_finite", naming each
// such key with what it was ("nan", "inf", "-inf"). Finite numbers are written exactly (%.17g
// for doubles, nlohmann's shortest round trip otherwise), so runs compare bit for bit.
std::string metrics_line(nlohmann::json j) {
  nlohmann::json bad = nlohmann::json::object();
  const std::function<void(nlohmann::json&, const std::string&)> scan = [&](nlohmann::json& v, const std::string& key) {
    if (v.is_object()) {
      for (auto it = v.begin(); it != v.end(); ++it)
        scan(it.value(), key.empty() ? it.key() : key + "." + it.key());
    } else if (v.is_number_float() && !std::isfinite(v.get<double>())) {
      const double x = v.get<double>();
      bad[key] = std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
      v = nullptr;
    }
  };
  scan(j, "");
  if (!bad.empty()) j["non_finite"] = std::move(bad);
  // The losses with every digit of their double (nlohmann prints the shortest text that reads
  // back as the same double, which is exact too, but %.17g is what earlier files hold).
  std::string text = j.dump();
  for (const char* name : {"loss", "eval_loss"}) {
    if (!j.contains(name) || !j[name].is_number_float()) continue;
    char exact[64];
    std::snprintf(exact, sizeof exact, "%.17g", j[name].get<double>());
    const std::string key = std::string("\"") + name + "\":";
    if (const size_t at = text.find(key); at != std::string::npos) {
      const size_t end = text.find_first_of(",}", at + key.size());
      text.replace(at + key.size(), end - at - key.size(), exact);
    }
  }
  return text;
}

// The batches of a run: the addition task or token shards, and their held-out counterparts.
// With --eval-only and --eval-data alone there is no training data.
struct Data {
  std::unique_ptr<zero::models::data::AdditionTask> addition;
  std::unique_ptr<zero::models::data::TokenShards> shards, eval_shards;
  int seq_len = 0;
  bool has_train() const { return addition || shards; }
  const zero::models::data::Dataset& train() const {
    return shards ? static_cast<const zero::models::data::Dataset&>(*shards) : *addition;
  }
  std::string describe() const {
    return has_train() ? train().describe() : "held-out only: " + eval_shards->describe();
  }
  bool has_eval() const { return addition || eval_shards; }
  // The fixed, ordered held-out set (docs/training.md): the addition task's held-out problems
  // in the split's order, or the --eval-data windows in file order.
  zero::HeldOutSet held_out() const {
    zero::HeldOutSet set;
    if (addition) {
      set.size = addition->held_out_set_size(seq_len);
      set.read = [this](int64_t first, int count) { return addition->held_out_set_batch(first, count, seq_len); };
      set.exact_match = true;
    } else {
      set.size = eval_shards->windows_per_epoch(seq_len);
      set.read = [this](int64_t first, int count) { return eval_shards->ordered_batch(first, count, seq_len); };
    }
    return set;
  }
};

// Reads data inside a step or an evaluation, where the other ranks may already wait in a
// collective for this one: a failure (a token shard changed under the run, a read error) ends
// the whole job at once with this rank's message and exit code 1, rather than unwinding through
// an engine whose peers would wait forever.
template <class F>
auto read_or_end_job(zero::World& world, const char* what, F&& read) {
  try {
    return read();
  } catch (const std::exception& e) {
    world.abort(kExitFailure, std::string("zero-train: ") + what + " on rank " + std::to_string(world.rank()) +
                                  ": " + error_text(e));
  }
}

int train(zero::World& world, const Flags& flags) {
  using namespace zero;
  const std::optional<config::Config> loaded = load(world, flags);
  if (!loaded) return kExitUsage;
  const config::Config& c = *loaded;
  const std::string& path = flags.config;
  // From here on a rank that stops answering (stopped, hung, its host lost) ends the job with a
  // report within the timeout instead of leaving the others waiting forever (collective).
  Watchdog watchdog(world, WatchdogOptions{.timeout_s = c.ours.watchdog_timeout, .exit_code = kExitLost});

  const models::GptShape shape = c.ours.model;

  // Data, checked on every rank before anything is allocated.
  Data data;
  const std::string data_what = !flags.data.empty()        ? "--data " + flags.data
                                : !flags.eval_data.empty() ? "--eval-data " + flags.eval_data
                                                           : std::string("data");
  if (!on_all_ranks(world, data_what, [&] {
        if (flags.data.empty() && !flags.eval_data.empty()) {  // --eval-only on token shards
          data.seq_len = shape.seq_len;
          data.eval_shards = std::make_unique<models::data::TokenShards>(flags.eval_data, shape.vocab_size,
                                                                          static_cast<uint64_t>(c.seed) + 1);
          (void)data.eval_shards->windows_per_epoch(data.seq_len);
        } else if (flags.data.empty()) {
          data.addition = std::make_unique<models::data::AdditionTask>(addition_options(c));
          data.seq_len = data.addition->min_seq_len();
          check_model_fits_addition(*data.addition, shape);  // also in check_startup
        } else {
          data.seq_len = shape.seq_len;
          data.shards = std::make_unique<models::data::TokenShards>(flags.data, shape.vocab_size, static_cast<uint64_t>(c.seed));
          (void)data.shards->windows_per_epoch(data.seq_len);  // every shard long enough
          if (!flags.eval_data.empty()) {
            data.eval_shards = std::make_unique<models::data::TokenShards>(flags.eval_data, shape.vocab_size, static_cast<uint64_t>(c.seed) + 1);
            (void)data.eval_shards->windows_per_epoch(data.seq_len);
          }
        }
      }))
    return kExitUsage;
  if ((flags.eval_interval > 0 || flags.eval_only) && !data.has_eval()) {
    if (world.is_root())
      std::fprintf(stderr, "zero-train: error: %s with --data needs --eval-data PATTERN (held-out "
                           "token shards)\n", flags.eval_only ? "--eval-only" : "--eval-interval");
    return kExitUsage;
  }

  // The metrics file, opened now so that an unwritable path is a usage error before anything is
  // built or trained (rank 0 writes it; every rank learns the outcome).
  std::string metrics_path = flags.metrics;
  if (metrics_path.empty())
    metrics_path = flags.checkpoint_dir.empty() ? "zero-train-metrics.jsonl" : flags.checkpoint_dir + "/metrics.jsonl";
  std::optional<MetricsFile> metrics;
  if (!on_all_ranks(world, "--metrics", [&] {
        if (!world.is_root()) return;
        if (!flags.checkpoint_dir.empty()) {
          std::error_code ec;
          std::filesystem::create_directories(flags.checkpoint_dir, ec);
        }
        metrics = MetricsFile::open(metrics_path);
      }))
    return kExitUsage;
  // Appends a line on rank 0; a failed write stops the run on every rank (exit 1).
  auto write_metrics = [&](const std::string& text) {
    return on_all_ranks(world, "--metrics", [&] {
      if (metrics) metrics->append(text);
    });
  };

  // This rank's share of the memory it really has (physical RAM, the container's or the batch
  // job's cgroup limit): the default limits, so that a model too large for it is the ledger's
  // clear error at start-up, not the kernel's OOM killer in the middle of a run (collective).
  const offload::MemoryBudget memory = offload::memory_budget(world.comm());
  // One GPU per rank: a rank takes the GPU of its index among its host's ranks (NCCL refuses two
  // ranks on one GPU). "auto": cuda when every rank has a GPU of its own, else cpu (agreed by
  // all ranks: the backends' collectives do not mix).
  const int gpus = cuda_device_count();
  const bool gpu_each = gpus > 0 && world.local_size() <= gpus;
  const bool all_gpu = !world.any(!gpu_each);
  const DeviceKind kind = c.ours.device.value_or(all_gpu ? DeviceKind::cuda : DeviceKind::cpu);
  if (!c.ours.device && !all_gpu && gpus > 0 && world.is_root())
    log::info("zero-train: zero_train.device \"auto\": " + std::to_string(world.local_size()) +
              " ranks on this host and " + std::to_string(gpus) + " GPU(s), so the run is on the cpu "
              "backend (one GPU per rank is needed for cuda)");
  // The config's limits win; the budget fills in the rest (on cpu device and host memory are the
  // same RAM and share it: offload/memory_budget.hpp).
  std::vector<std::string> memory_warnings;
  const DeviceOptions dopt = offload::device_options(kind, static_cast<size_t>(c.ours.device_memory_limit),
                                                     static_cast<size_t>(c.ours.host_memory_limit), memory,
                                                     &memory_warnings);
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> comm, mpi_comm;
  if (!on_all_ranks(world, std::string("zero_train.device \"") + std::string(to_string(kind)) + "\"", [&] {
        int index = 0;
        if (kind == DeviceKind::cuda) {
          if (gpus == 0)
            ZERO_FAIL("no GPU is visible on this host (or the cuda backend is not built)\nHINT: check "
                      "nvidia-smi and CUDA_VISIBLE_DEVICES, or set zero_train.device (--device) to \"cpu\"");
          if (world.local_size() > gpus)
            ZERO_FAIL(std::to_string(world.local_size()) + " ranks on this host but " + std::to_string(gpus) +
                      " GPU(s): one GPU per rank\nHINT: launch at most " + std::to_string(gpus) +
                      " ranks per host (mpirun --map-by ppr:" + std::to_string(gpus) + ":node)");
          index = world.local_rank();
        }
        device = make_device(kind, index, dopt);
        // The engine's collectives on the device's buffers (NCCL on cuda); checkpoints and the
        // like on host buffers (MPI): on cpu one communicator is both.
        comm = coll::make_communicator(world.comm(), *device);
        if (kind != DeviceKind::cpu) mpi_comm = coll::make_mpi_communicator(world.comm(), *device);
      }))
    return kExitFailure;
  coll::Communicator& host_comm = mpi_comm ? *mpi_comm : *comm;
  auto stream = device->create_stream("compute");
  // Device memory from here on is ordered on the compute stream (cuda: cudaMallocAsync): freeing
  // an activation neither waits nor synchronises the GPU. Undone before the stream goes (the
  // guard is destroyed after everything declared below it, before the stream).
  device->set_allocation_stream(stream.get());
  struct AllocationStreamGuard {
    Device& d;
    ~AllocationStreamGuard() { d.set_allocation_stream(nullptr); }
  } allocation_stream_guard{*device};
  auto ops = models::make_ops(*device, *stream);
  EngineOptions o = engine_options(c);
  // The host AdamW's threads: the node's cores shared among its ranks (collective).
  const offload::ThreadBudget budget = offload::host_thread_budget(world.comm());
  o.host_threads = budget.threads;
  // Activations: fp32 on cpu (its kernels read 16-bit parameters as fp32); on cuda the
  // parameters' type (its kernels compute in fp32 on 16-bit storage of one type).
  const ScalarType act = kind == DeviceKind::cpu ? ScalarType::f32 : o.param_type;
  Model model = models::make_gpt({shape, o.param_type, act}, *ops);
  const int W = world.size(), B = static_cast<int>(c.batch.train_micro_batch_size_per_gpu);
  const int GA = o.gradient_accumulation_steps, T = data.seq_len;
  const long long steps = c.ours.steps;
  char line[1024];
  std::snprintf(line, sizeof line,
                "zero-train: %s, GPT%s (%d layers, hidden %d, %d heads, vocabulary %d), %lld "
                "parameters\nzero-train: %d rank(s) on %s, ZeRO stage %d%s%s, %s, batch %lld = "
                "%d per rank x %d accumulation x %d ranks, %lld steps, seed %lld\ndata: %s, %d "
                "tokens per sequence",
                path.c_str(), c.ours.model_preset.empty() ? "" : (" " + c.ours.model_preset).c_str(),
                shape.n_layer, shape.n_embd, shape.n_head, shape.vocab_size,
                static_cast<long long>(model.parameter_count()), W, device->name().c_str(), o.stage,
                o.offload_optimizer ? ", optimizer offloaded to host memory" : "",
                o.offload_param ? ", parameters offloaded" : "",
                std::string(to_string(o.param_type)).c_str(), c.batch.train_batch_size, B, GA, W, steps,
                c.seed, data.describe().c_str(), T);
  log::info(line);
  log::info(budget.explanation);
  // What decides whether another machine reproduces this run's losses bit for bit.
  if (kind == DeviceKind::cpu)
    log::info("cpu kernels: " + models::cpu_blas_description() +
              " (runs match bit for bit only on the same kernels; OPENBLAS_CORETYPE "
              "picks them: docs/training.md)");
  // The budget before the engine allocates the model state, so that a model that does not fit
  // is reported after it.
  log::info(memory.explanation + (kind == DeviceKind::cpu && dopt.shared_memory_limit > 0
                                      ? " (device and host memory share it on the cpu backend)"
                                      : ""));
  for (const std::string& w : memory_warnings) log::warn(w);
  std::unique_ptr<Engine> engine;
  if (!on_all_ranks(world, "the model does not fit", [&] {
        engine = std::make_unique<Engine>(model, *device, *stream, *comm, o);
      }))
    return kExitFailure;

  log::info(engine->memory_report());
  {
    // Every rank's model state and memory in use (shards differ by rank when the model does
    // not divide evenly, and stage 0 saves from rank 0 alone): one row per rank.
    const LedgerSnapshot snap = device->ledger().snapshot();
    const double mine[4] = {static_cast<double>(snap.total[0].current), static_cast<double>(snap.total[0].peak),
                            static_cast<double>(snap.total[1].current), static_cast<double>(snap.total[1].peak)};
    std::vector<double> all(static_cast<size_t>(4 * W));
    ZERO_CHECK_MPI(MPI_Gather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, world.comm()));
    if (world.is_root() && W > 1) {
      std::string t = "memory per rank (ledger totals)\n  rank   device now  device peak     host now    host peak\n";
      for (int r = 0; r < W; ++r) {
        std::snprintf(line, sizeof line, "  %4d %12s %12s %12s %12s\n", r,
                      format_bytes(static_cast<size_t>(all[4 * r])).c_str(), format_bytes(static_cast<size_t>(all[4 * r + 1])).c_str(),
                      format_bytes(static_cast<size_t>(all[4 * r + 2])).c_str(), format_bytes(static_cast<size_t>(all[4 * r + 3])).c_str());
        t += line;
      }
      t.pop_back();
      log::info(t);
    }
  }

  if (!flags.checkpoint_dir.empty())
    if (const int rc = check_checkpoint_dir(world, flags, *engine); rc != 0) return rc;

  // Where the run starts: a checkpoint (exact resume), a safetensors file, or the seed.
  long long first_step = 1;
  if (flags.resume) {
    phase::set("resuming from a checkpoint");
    // The newest complete checkpoint by commit time, whatever DIR/latest says (a save whose last
    // step, writing latest, failed leaves a newer complete checkpoint than latest names).
    std::optional<std::string> tag;
    if (world.is_root()) {
      if (const std::optional<checkpoint::Newest> n = checkpoint::find_newest(flags.checkpoint_dir)) {
        if (!n->note.empty()) log::info("zero-train: --resume: " + n->note);
        tag = n->tag;
      }
    }
    int found = tag ? 1 : 0;
    ZERO_CHECK_MPI(MPI_Bcast(&found, 1, MPI_INT, 0, world.comm()));
    if (!found) {
      if (world.is_root())
        std::fprintf(stderr,
                     "zero-train: error: --resume: no complete checkpoint in %s\nHINT: check "
                     "--checkpoint-dir; start without --resume to train from the beginning\n",
                     flags.checkpoint_dir.c_str());
      return kExitUsage;
    }
    std::vector<char> name(256, 0);
    if (world.is_root()) std::snprintf(name.data(), name.size(), "%s", tag->c_str());
    ZERO_CHECK_MPI(MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, world.comm()));
    const std::string t = name.data();
    std::string user;
    if (!on_all_ranks(world, "--resume from " + flags.checkpoint_dir + "/" + t,
                      [&] { user = engine->load_checkpoint(flags.checkpoint_dir, t, host_comm); }))
      return kExitFailure;
    const nlohmann::json meta = nlohmann::json::parse(user, nullptr, false);
    first_step = engine->steps_taken() + 1;
    log::info("zero-train: resumed from " + flags.checkpoint_dir + "/" + t + " at step " +
              std::to_string(engine->steps_taken()));
    if (meta.is_object()) {
      auto differs = [&](const char* key, const nlohmann::json& now) {
        if (meta.contains(key) && meta[key] != now)
          log::info(std::string("zero-train: warning: the checkpoint was saved with ") + key + " " +
                    meta[key].dump() + ", this run has " + now.dump() +
                    ": the run goes on, but not as the saved run would have");
      };
      differs("seed", c.seed);
      differs("train_batch_size", c.batch.train_batch_size);
      if (data.has_train()) differs("data", data.train().describe());
    }
  } else if (!flags.init_from.empty()) {
    phase::set("loading --init-from");
    // The file's weights become the initial master and working copy: saved as a checkpoint of
    // step 0 in a temporary place and loaded, so the engine's one load path does the slicing.
    // A file that cannot be the model's weights (missing tensors, other shapes, NaN or infinite
    // values) is bad input: exit 2. Installing good weights can fail only while running: 1.
    std::vector<std::vector<float>> values;
    if (!on_all_ranks(world, "--init-from " + flags.init_from, [&] {
          values = checkpoint::import_safetensors(flags.init_from, checkpoint::param_table(model));
        }))
      return kExitUsage;
    if (!on_all_ranks(world, "--init-from " + flags.init_from, [&] { engine->set_parameters(values); }))
      return kExitFailure;
    values = {};
    log::info("zero-train: initial weights from " + flags.init_from);
  }

  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  const bool bar = world.is_root() && (flags.progress == "on" ||
                                       (flags.progress == "auto" && ::isatty(STDOUT_FILENO) && !launched));
  // Model FLOPs per token (models::gpt_flops_per_token: 6 x the matmul parameters + attention,
  // i.e. forward 2 and backward 4 FLOPs per parameter per token; recomputation by activation
  // checkpointing is not counted, as MFU is defined). MFU = model FLOP/s / the device's dense
  // 16-bit peak (core/peak_flops.hpp), on a GPU whose peak we know.
  const double flops_per_token = models::gpt_flops_per_token(shape);
  const std::optional<double> peak = peak_dense_16bit_flops(device->name());

  auto mfu_text = [&](double flops_per_s) {
    if (!peak) return std::string();
    char b[32];
    std::snprintf(b, sizeof b, " (MFU %.1f%%)", 100.0 * flops_per_s / *peak);
    return std::string(b);
  };
  auto to_device = [&](const models::data::TokenBatch& tb) {
    Batch b;
    b.inputs = Tensor::empty(*device, Shape{tb.rows, tb.cols}, ScalarType::i32, MemCategory::activations);
    b.targets = Tensor::empty(*device, Shape{tb.rows, tb.cols}, ScalarType::i32, MemCategory::activations);
    copy_from_host(*device, *stream, b.inputs, tb.inputs.data());
    copy_from_host(*device, *stream, b.targets, tb.targets.data());
    stream->synchronize();  // the copies read `tb`
    return b;
  };
  auto save = [&](long long step) {
    phase::Scope in_phase("saving a checkpoint");
    const std::string tag = step_tag(step);
    const double t0 = now_seconds();
    nlohmann::json user = {{"step", step},
                           {"seed", c.seed},
                           {"train_batch_size", c.batch.train_batch_size},
                           {"data", data.train().describe()},
                           {"world_size", W},
                           {"stage", o.stage},
                           // What the parameter table cannot tell (n_head), for export --hf-config.
                           {"model", {{"n_layer", shape.n_layer}, {"n_embd", shape.n_embd}, {"n_head", shape.n_head},
                                      {"vocab_size", shape.vocab_size}, {"seq_len", shape.seq_len}}}};
    if (!on_all_ranks(world, "checkpoint " + flags.checkpoint_dir + "/" + tag,
                      [&] { engine->save_checkpoint(flags.checkpoint_dir, tag, host_comm, user.dump()); }))
      return false;
    std::snprintf(line, sizeof line, "checkpoint: saved %s/%s in %.2f s", flags.checkpoint_dir.c_str(),
                  tag.c_str(), now_seconds() - t0);
    log::info(line);
    return true;
  };
  // The held-out evaluation (runtime/held_out_eval.hpp): the fixed set, or its first
  // --eval-sequences sequences, in chunks of the micro-batch spread over the ranks; the same
  // loss on any world size. Returns false when the metrics line could not be written.
  HeldOutSet held_out = data.has_eval() ? data.held_out() : HeldOutSet{};
  held_out.read = [&world, read = held_out.read](int64_t first, int count) {
    return read_or_end_job(world, "reading the held-out data", [&] { return read(first, count); });
  };
  auto evaluate = [&](long long step) {
    phase::Scope in_phase("evaluation");
    const HeldOutResult r = evaluate_held_out(
        held_out, flags.eval_sequences, B, /*collective_forward=*/o.stage == 3, world.comm(),
        [&](const models::data::TokenBatch& tb, std::vector<int32_t>* argmax) {
          return engine->evaluate(to_device(tb), argmax);
        });
    // Exact match (addition task): a problem counts when every digit of its sum is the model's
    // most likely next token (teacher-forced; equal to greedy decoding for a causal model, see
    // AdditionTask::score).
    std::string match;
    if (r.problems > 0) {
      char b[96];
      std::snprintf(b, sizeof b, " | exact match %.1f%% of %lld held-out sums",
                    100.0 * static_cast<double>(r.correct) / static_cast<double>(r.problems),
                    static_cast<long long>(r.problems));
      match = b;
    }
    std::snprintf(line, sizeof line, "eval step %lld | held-out loss %.4f (%lld of %lld sequences)%s", step,
                  r.loss, static_cast<long long>(r.sequences), static_cast<long long>(held_out.size),
                  match.c_str());
    log::info(line);
    nlohmann::json j = {{"step", step}, {"eval_loss", r.loss}, {"eval_sequences", static_cast<long long>(r.sequences)}};
    if (r.problems > 0) j["eval_exact_match"] = static_cast<double>(r.correct) / static_cast<double>(r.problems);
    return write_metrics(metrics_line(j));
  };
  if (data.has_eval() && (flags.eval_interval > 0 || flags.eval_only)) {
    const int64_t n =
        flags.eval_sequences > 0 ? std::min<int64_t>(flags.eval_sequences, held_out.size) : held_out.size;
    std::snprintf(line, sizeof line,
                  "eval: %lld of the %lld held-out sequences (%s), %d per forward pass, spread over %d rank(s)",
                  static_cast<long long>(n), static_cast<long long>(held_out.size),
                  data.addition ? "the addition task's held-out problems, in the split's order"
                                : "the --eval-data windows, in file order",
                  B, W);
    log::info(line);
  }
  if (flags.eval_only) {
    if (!evaluate(engine->steps_taken())) return kExitFailure;
    if (!on_all_ranks(world, "--metrics", [&] {
          if (metrics) metrics->close();
        }))
      return kExitFailure;
    log::info("zero-train: evaluation only: nothing trained, nothing saved");
    return 0;
  }

  if (first_step > steps)
    log::info("zero-train: the checkpoint is at step " + std::to_string(first_step - 1) +
              ", the run ends at " + std::to_string(steps) + ": nothing to train");
  double t_last = now_seconds();
  long long since = 0;
  StepGuard guard(c.ours.max_consecutive_skipped_steps, first_step - 1);
  for (long long step = first_step; step <= steps; ++step) {
    phase::set_step(step);
    phase::set("training step");
    const double t_step = now_seconds();
    const StepStats st = engine->step([&](int m) {
      const int64_t first = ((static_cast<int64_t>(step - 1) * W + world.rank()) * GA + m) * B;
      return to_device(read_or_end_job(world, "reading the training data",
                                       [&] { return data.train().batch(first, B, T); }));
    });
    const double dt_step = now_seconds() - t_step;
    ++since;
    // The mean loss over every rank's micro-batches (collective: every rank, every step).
    phase::set("the loss all-reduce");
    double loss = st.loss / W;
    ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, world.comm()));
    const LedgerSnapshot snap = device->ledger().snapshot();
    const double tokens = static_cast<double>(W) * GA * B * T;
    std::string metrics_text;
    if (world.is_root()) {
      nlohmann::json j = {{"step", step},
                          {"loss", loss},
                          {"lr", st.lr},
                          {"grad_norm", st.grad_norm},
                          {"loss_scale", st.loss_scale},
                          {"applied", st.applied},
                          {"tokens_per_s", tokens / dt_step},
                          {"model_flops_per_s", tokens * flops_per_token / dt_step},
                          {"mfu", peak ? nlohmann::json(tokens * flops_per_token / dt_step / *peak) : nlohmann::json()},
                          {"step_time_s", dt_step},
                          {"device_bytes", snap.total[0].current},
                          {"host_bytes", snap.total[1].current},
                          {"device_peak_bytes", snap.total[0].peak},
                          {"host_peak_bytes", snap.total[1].peak}};
      if (o.timers)
        j["time"] = {{"forward", st.time.forward},     {"backward", st.time.backward},
                     {"optimizer", st.time.optimizer}, {"comm_busy", st.time.comm_busy},
                     {"comm_exposed", st.time.comm_exposed}, {"d2h", st.time.d2h},
                     {"h2d", st.time.h2d},             {"host_adam", st.time.host_adam},
                     {"host_adam_waited", st.time.host_adam_waited}};
      metrics_text = metrics_line(j);
    }
    const bool print = step % c.steps_per_print == 0 || step == steps || step == first_step;
    if (bar && !print) {
      const int width = 30, done = static_cast<int>(width * step / steps);
      std::printf("\r[%s%s] step %lld/%lld | loss %.4f ", std::string(static_cast<size_t>(done), '#').c_str(),
                  std::string(static_cast<size_t>(width - done), '.').c_str(), step, steps, loss);
      std::fflush(stdout);
    }
    if (print) {
      if (bar) std::printf("\r%*s\r", 80, "");
      const double t = now_seconds(), dt = (t - t_last) / static_cast<double>(since);
      std::snprintf(line, sizeof line,
                    "step %lld/%lld | loss %.4f | lr %.3g | grad norm %.3g | loss scale %g%s | "
                    "%.0f tokens/s | %.3g GFLOP/s%s | %.3f s/step | device %s | host %s",
                    step, steps, loss, static_cast<double>(st.lr), static_cast<double>(st.grad_norm),
                    st.loss_scale, st.applied ? "" : " (skipped: overflow)", tokens / dt,
                    tokens * flops_per_token / dt * 1e-9, mfu_text(tokens * flops_per_token / dt).c_str(), dt,
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
    // After the log line, so that a failing metrics file still leaves this step on the screen.
    if (!write_metrics(metrics_text)) return kExitFailure;
    // A run that no longer trains stops here, before this step is evaluated or saved (every rank
    // sees the same loss and statistics, so all stop alike).
    std::optional<std::string> stop = guard.after_step(step, st, loss);
    if (!stop && step == steps) stop = guard.at_end(step);
    if (stop) {
      if (bar) std::printf("\n");
      if (world.is_root()) {
        std::string kept;
        if (!flags.checkpoint_dir.empty()) {
          const std::optional<std::string> newest = checkpoint::latest(flags.checkpoint_dir);
          kept = newest ? "\nThe newest checkpoint, " + flags.checkpoint_dir + "/" + *newest + ", is kept."
                        : "\nNo checkpoint was saved in " + flags.checkpoint_dir + ".";
        }
        std::fprintf(stderr, "zero-train: error: %s%s\n", stop->c_str(), kept.c_str());
        std::fflush(stderr);
      }
      return kExitFailure;
    }
    if (flags.eval_interval > 0 && (step % flags.eval_interval == 0 || step == steps))
      if (!evaluate(step)) return kExitFailure;
    if (!flags.checkpoint_dir.empty() &&
        ((flags.save_interval > 0 && step % flags.save_interval == 0) || step == steps))
      if (!save(step)) return kExitFailure;
  }
  if (guard.counted_in_a_row() > 0)
    log::warn("zero-train: the last " + std::to_string(guard.not_trained_in_a_row()) +
              " step(s) did not train (non-finite gradients or loss); the last step that trained was " +
              std::to_string(guard.last_good_step()));
  phase::set("finishing");
  if (!on_all_ranks(world, "--metrics", [&] {
        if (metrics) metrics->close();
      }))
    return kExitFailure;
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
    int code = flags.export_mode ? export_checkpoint(world, flags)
               : flags.validate    ? validate(world, flags)
                                   : train(world, flags);
    // The standard output is a file too (`--validate > effective.json`, a log on a full disk):
    // a failed write there must not end in exit 0 with the output silently cut short.
    errno = 0;
    const bool flushed = std::fflush(stdout) == 0;
    if (!flushed || std::ferror(stdout) || zero::log::stdout_write_error() != 0) {
      const int err = zero::log::stdout_write_error() != 0 ? zero::log::stdout_write_error() : errno;
      std::fprintf(stderr,
                   "%szero-train: error: writing the standard output failed%s%s: what it printed is "
                   "incomplete\nHINT: free space where the output goes (or redirect it elsewhere)%s\n",
                   world.size() > 1 ? ("[rank " + std::to_string(world.rank()) + "] ").c_str() : "",
                   err != 0 ? ": " : "", err != 0 ? std::strerror(err) : "",
                   code == 0 && !flags.export_mode && !flags.validate ? "; the run itself finished" : "");
      if (code == 0) code = kExitFailure;
    }
    return code;
  });
}
