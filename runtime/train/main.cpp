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
//
// The pieces, each in its own file here: flags.hpp (the command line and --help), startup.hpp
// (the config and --validate), run.hpp (what a run holds and its start-up report),
// training_loop.hpp (training and evaluation), checkpoints.hpp (the directory, resume, saves),
// export.hpp (`zero-train export`), step_report.hpp (log and metrics lines).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/log.hpp"
#include "core/world.hpp"
#include "runtime/train/exit_codes.hpp"
#include "runtime/train/export.hpp"
#include "runtime/train/flags.hpp"
#include "runtime/train/startup.hpp"
#include "runtime/train/training_loop.hpp"

int main(int argc, char** argv) {
  return zero::run_main(argc, argv, [&](zero::World& world) {
    using namespace zero::train;
    const Flags flags = parse_flags(argc, argv);
    if (flags.help) {
      if (world.is_root()) std::fputs(help_text(), stdout);
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
                                   : run_training(world, flags);
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
