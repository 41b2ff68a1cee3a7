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
//   zero-train export --checkpoint DIR [--tag TAG] --out FILE.safetensors
//     Writes a checkpoint's fp32 master weights, consolidated, as safetensors with Hugging Face
//     GPT-2 names.
//
// Exit codes: 0 done; 1 a failure while running (a corrupt checkpoint, a model that does not
// fit, an I/O error), reported as one paragraph on rank 0 (or on the rank it concerns); 2 bad
// flags, config or input files, before anything is trained.
#include <mpi.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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
#include "offload/thread_budget.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/config/config.hpp"
#include "runtime/core/log.hpp"
#include "runtime/core/mpi_check.hpp"
#include "runtime/core/peak_flops.hpp"
#include "runtime/core/world.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/from_config.hpp"

namespace {

constexpr int kExitFailure = 1;  // something failed while running
constexpr int kExitUsage = 2;    // bad flags, config or input, before training

const char* const kHelp = R"(usage: [mpirun -np N] zero-train --config FILE [options]
       zero-train --config FILE --validate
       zero-train export --checkpoint DIR [--tag TAG] --out FILE.safetensors

Trains a GPT with ZeRO stages 0-3 and CPU offload, configured by a DeepSpeed ds_config.json.

options:
  --config FILE         the DeepSpeed config (ds_config.json). Our own settings (device, memory
                        limits, model, steps) live in its "zero_train" section, which DeepSpeed
                        ignores; see docs/config.md.
  --steps N             the optimizer step to train up to (overrides zero_train.steps; a file
                        that sets it must agree). A resumed run continues up to the same N.
  --model NAME|FILE     a model preset (tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b,
                        zero-offload-10b) or a JSON file like zero_train.model
                        ({"preset": ...} and/or n_layer, n_embd, n_head, vocab_size, seq_len);
                        replaces zero_train.model.
  --data PATTERN        train on llm.c token shards (files or a glob, e.g. 'fineweb_train_*.bin';
                        quote it), sequences of the model's seq_len. Default: the embedded
                        2-digit addition task.
  --eval-interval N     every N steps (and at the end), the mean loss on held-out data: the
                        addition task's held-out problems, or --eval-data. 0: never (default).
  --eval-data PATTERN   token shards for the evaluation with --data.
  --eval-batches N      micro-batches per rank per evaluation (default 4).
  --checkpoint-dir DIR  where checkpoints go (DIR/step_00000100/...; DIR/latest names the newest).
                        Must be one filesystem every rank sees. Saved every --save-interval steps
                        and at the end.
  --save-interval N     steps between checkpoints (default 0: only at the end).
  --resume              continue from the newest complete checkpoint in --checkpoint-dir: the
                        same losses as a run never interrupted. Any world size, any ZeRO stage.
  --init-from FILE      start from the weights of a safetensors file (Hugging Face GPT-2 names,
                        e.g. one written by 'zero-train export'); Adam starts fresh.
  --device KIND         auto, cpu or cuda (overrides zero_train.device).
  --seed N              the run's seed: initial weights and data order (overrides "seed").
  --metrics FILE        JSON lines of per-step metrics, appended (default:
                        DIR/metrics.jsonl with --checkpoint-dir, else zero-train-metrics.jsonl).
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

Exit status: 0 done, 1 failed while running (reported as one paragraph), 2 bad flags, config or
input files.
)";

struct Flags {
  bool export_mode = false;
  std::string config;
  std::optional<long long> steps;
  std::string model, data, eval_data, checkpoint_dir, init_from, device, metrics;
  std::string progress = "auto";
  std::optional<long long> seed;
  long long eval_interval = 0, eval_batches = 4, save_interval = 0;
  bool resume = false, validate = false, help = false;
  std::string export_dir, export_tag, export_out;
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
    } else if (name == "--eval-batches") {
      if (auto n = count(true)) f.eval_batches = *n;
    } else if (name == "--checkpoint-dir") {
      text(f.checkpoint_dir);
    } else if (name == "--save-interval") {
      if (auto n = count(false)) f.save_interval = *n;
    } else if (name == "--resume") {
      f.resume = true;
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
    return f;
  }
  if (f.config.empty()) f.errors.push_back("--config FILE is required");
  if (f.resume && f.checkpoint_dir.empty())
    f.errors.push_back("--resume needs --checkpoint-dir DIR (where to find the checkpoint)");
  if (f.save_interval > 0 && f.checkpoint_dir.empty())
    f.errors.push_back("--save-interval needs --checkpoint-dir DIR (where to save)");
  if (f.resume && !f.init_from.empty())
    f.errors.push_back("--resume and --init-from exclude each other: a resumed run takes its "
                       "weights from the checkpoint");
  if (!f.eval_data.empty() && f.data.empty())
    f.errors.push_back("--eval-data needs --data (the addition task has its own held-out set)");
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
      const std::optional<std::string> l = checkpoint::latest(flags.export_dir);
      if (!l)
        ZERO_FAIL("no complete checkpoint in " + flags.export_dir +
                  "\nHINT: pass the --checkpoint-dir of a run that saved one, or --tag");
      tag = *l;
    }
    checkpoint::export_safetensors(flags.export_dir, tag, "master", flags.export_out);
    const checkpoint::Info info = checkpoint::read_info(flags.export_dir, tag);
    int64_t n = 0;
    for (const auto& p : info.params) n += p.numel();
    std::printf("zero-train export: %s/%s -> %s: %zu tensors, %lld parameters, fp32\n",
                flags.export_dir.c_str(), tag.c_str(), flags.export_out.c_str(), info.params.size(),
                static_cast<long long>(n));
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

// The batches of a run: the addition task or token shards, and their held-out counterparts.
struct Data {
  std::unique_ptr<zero::models::data::AdditionTask> addition;
  std::unique_ptr<zero::models::data::TokenShards> shards, eval_shards;
  int seq_len = 0;
  const zero::models::data::Dataset& train() const {
    return shards ? static_cast<const zero::models::data::Dataset&>(*shards) : *addition;
  }
  bool has_eval() const { return addition || eval_shards; }
  zero::models::data::TokenBatch held_out(int64_t first, int count) const {
    if (addition) return addition->held_out_batch(first, count, seq_len);
    return eval_shards->batch(first, count, seq_len);
  }
};

int train(zero::World& world, const Flags& flags) {
  using namespace zero;
  const std::optional<config::Config> loaded = load(world, flags);
  if (!loaded) return kExitUsage;
  const config::Config& c = *loaded;
  const std::string& path = flags.config;

  const models::GptShape shape = c.ours.model;

  // Data, checked on every rank before anything is allocated.
  Data data;
  if (!on_all_ranks(world, flags.data.empty() ? "data" : "--data " + flags.data, [&] {
        if (flags.data.empty()) {
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
  if (flags.eval_interval > 0 && !data.has_eval()) {
    if (world.is_root())
      std::fprintf(stderr, "zero-train: error: --eval-interval with --data needs --eval-data "
                           "PATTERN (held-out token shards)\n");
    return kExitUsage;
  }

  DeviceOptions dopt;
  dopt.memory_limit = static_cast<size_t>(c.ours.device_memory_limit);
  dopt.host_memory_limit = static_cast<size_t>(c.ours.host_memory_limit);
  if (dopt.host_memory_limit == 0) {
    // 0: this rank's share of 90% of the host's physical memory, so that an offloaded model too
    // large for the host is our clear out-of-memory error at start-up, not the kernel's OOM
    // killer in the middle of a run (pageable fallbacks would overcommit silently).
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
      dopt.host_memory_limit = static_cast<size_t>(0.9 * static_cast<double>(pages) * static_cast<double>(page) /
                                                   std::max(1, world.local_size()));
  }
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
  std::unique_ptr<Engine> engine;
  if (!on_all_ranks(world, "the model does not fit", [&] {
        engine = std::make_unique<Engine>(model, *device, *stream, *comm, o);
      }))
    return kExitFailure;

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
                c.seed, data.train().describe().c_str(), T);
  log::info(line);
  log::info(budget.explanation);
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

  // Where the run starts: a checkpoint (exact resume), a safetensors file, or the seed.
  long long first_step = 1;
  if (flags.resume) {
    std::optional<std::string> tag;
    if (world.is_root()) tag = checkpoint::latest(flags.checkpoint_dir);
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
      differs("data", data.train().describe());
    }
  } else if (!flags.init_from.empty()) {
    // The file's weights become the initial master and working copy: saved as a checkpoint of
    // step 0 in a temporary place and loaded, so the engine's one load path does the slicing.
    if (!on_all_ranks(world, "--init-from " + flags.init_from, [&] {
          const std::vector<checkpoint::ParamInfo> table = checkpoint::param_table(model);
          const std::vector<std::vector<float>> values = checkpoint::import_safetensors(flags.init_from, table);
          engine->set_parameters(values);
        }))
      return kExitFailure;
    log::info("zero-train: initial weights from " + flags.init_from);
  }

  std::string metrics_path = flags.metrics;
  if (metrics_path.empty())
    metrics_path = flags.checkpoint_dir.empty() ? "zero-train-metrics.jsonl" : flags.checkpoint_dir + "/metrics.jsonl";
  std::FILE* metrics = nullptr;
  if (world.is_root()) {
    if (!flags.checkpoint_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(flags.checkpoint_dir, ec);
    }
    metrics = std::fopen(metrics_path.c_str(), "a");
  }
  int metrics_ok = world.is_root() ? (metrics != nullptr) : 1;
  ZERO_CHECK_MPI(MPI_Bcast(&metrics_ok, 1, MPI_INT, 0, world.comm()));
  if (!metrics_ok) {
    if (world.is_root())
      std::fprintf(stderr, "zero-train: error: cannot open the metrics file %s for appending: %s\n",
                   metrics_path.c_str(), std::strerror(errno));
    return kExitUsage;
  }
  struct Closer {
    std::FILE* f;
    ~Closer() { if (f) std::fclose(f); }
  } closer{metrics};
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  const bool bar = world.is_root() && (flags.progress == "on" ||
                                       (flags.progress == "auto" && ::isatty(STDOUT_FILENO) && !launched));
  // Model FLOPs per token (models::gpt_flops_per_token: 6 x the matmul parameters + attention,
  // i.e. forward 2 and backward 4 FLOPs per parameter per token; recomputation by activation
  // checkpointing is not counted, as MFU is defined). MFU = model FLOP/s / the device's dense
  // 16-bit peak (runtime/core/peak_flops.hpp), on a GPU whose peak we know.
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
    const std::string tag = step_tag(step);
    const double t0 = now_seconds();
    nlohmann::json user = {{"step", step},
                           {"seed", c.seed},
                           {"train_batch_size", c.batch.train_batch_size},
                           {"data", data.train().describe()},
                           {"world_size", W},
                           {"stage", o.stage}};
    if (!on_all_ranks(world, "checkpoint " + flags.checkpoint_dir + "/" + tag,
                      [&] { engine->save_checkpoint(flags.checkpoint_dir, tag, host_comm, user.dump()); }))
      return false;
    std::snprintf(line, sizeof line, "checkpoint: saved %s/%s in %.2f s", flags.checkpoint_dir.c_str(),
                  tag.c_str(), now_seconds() - t0);
    log::info(line);
    return true;
  };
  auto evaluate = [&](long long step) {
    // Held-out loss, and for the addition task exact match: a problem counts when every digit of
    // its sum is the model's most likely next token (teacher-forced; equal to greedy decoding
    // for a causal model, see AdditionTask::score).
    double sum = 0, problems = 0, correct = 0;
    std::vector<int32_t> predictions;
    for (long long k = 0; k < flags.eval_batches; ++k) {
      const int64_t first = (static_cast<int64_t>(k) * W + world.rank()) * B;
      const models::data::TokenBatch tb = data.held_out(first, B);
      sum += engine->evaluate(to_device(tb), data.addition ? &predictions : nullptr);
      if (data.addition) {
        const models::data::AdditionScore sc = models::data::AdditionTask::score(tb, predictions);
        problems += static_cast<double>(sc.problems);
        correct += static_cast<double>(sc.correct);
      }
    }
    double v[3] = {sum / static_cast<double>(flags.eval_batches) / W, problems, correct};
    ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_SUM, world.comm()));
    const double loss = v[0];
    std::string match;
    if (data.addition && v[1] > 0) {
      char b[96];
      std::snprintf(b, sizeof b, " | exact match %.1f%% of %.0f held-out sums", 100.0 * v[2] / v[1], v[1]);
      match = b;
    }
    std::snprintf(line, sizeof line, "eval step %lld | held-out loss %.4f (%lld sequences)%s", step, loss,
                  static_cast<long long>(flags.eval_batches) * B * W, match.c_str());
    log::info(line);
    if (metrics) {
      if (data.addition && v[1] > 0)
        std::fprintf(metrics, "{\"step\": %lld, \"eval_loss\": %.17g, \"eval_exact_match\": %.17g}\n", step, loss, v[2] / v[1]);
      else
        std::fprintf(metrics, "{\"step\": %lld, \"eval_loss\": %.17g}\n", step, loss);
      std::fflush(metrics);
    }
  };

  if (first_step > steps)
    log::info("zero-train: the checkpoint is at step " + std::to_string(first_step - 1) +
              ", the run ends at " + std::to_string(steps) + ": nothing to train");
  double t_last = now_seconds();
  long long since = 0;
  for (long long step = first_step; step <= steps; ++step) {
    const double t_step = now_seconds();
    const StepStats st = engine->step([&](int m) {
      const int64_t first = ((static_cast<int64_t>(step - 1) * W + world.rank()) * GA + m) * B;
      return to_device(data.train().batch(first, B, T));
    });
    const double dt_step = now_seconds() - t_step;
    ++since;
    // The mean loss over every rank's micro-batches (collective: every rank, every step).
    double loss = st.loss / W;
    ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, world.comm()));
    const LedgerSnapshot snap = device->ledger().snapshot();
    const double tokens = static_cast<double>(W) * GA * B * T;
    if (metrics) {
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
      // %.17g: the loss exactly, so that runs can be compared bit for bit.
      std::string text = j.dump();
      char exact[64];
      std::snprintf(exact, sizeof exact, "%.17g", loss);
      const std::string key = "\"loss\":";
      if (const size_t at = text.find(key); at != std::string::npos) {
        const size_t end = text.find_first_of(",}", at + key.size());
        text.replace(at + key.size(), end - at - key.size(), exact);
      }
      std::fprintf(metrics, "%s\n", text.c_str());
      std::fflush(metrics);
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
    if (flags.eval_interval > 0 && (step % flags.eval_interval == 0 || step == steps)) evaluate(step);
    if (!flags.checkpoint_dir.empty() &&
        ((flags.save_interval > 0 && step % flags.save_interval == 0) || step == steps))
      if (!save(step)) return kExitFailure;
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
    if (flags.export_mode) return export_checkpoint(world, flags);
    return flags.validate ? validate(world, flags) : train(world, flags);
  });
}
