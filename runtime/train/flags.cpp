#include "runtime/train/flags.hpp"

#include <cstdlib>

namespace zero::train {
namespace {

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

}  // namespace

const char* help_text() { return kHelp; }

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

}  // namespace zero::train
