// zero-train's command line: the flags as given, checked for form and for combinations that
// cannot work (before any file is read), and the --help text that documents every one of them.
//
// Nothing here touches MPI or a file: every rank parses the same argv and gets the same Flags.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace zero::train {

struct Flags {
  bool export_mode = false;  // `zero-train export ...`: only the export_* fields and help apply
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
  // One sentence per problem, in argv order; the combinations (--resume without
  // --checkpoint-dir...) are checked only when every flag parsed and --help was not given.
  // Empty when the flags are usable.
  std::vector<std::string> errors;
};

// Parses argv (argv[1] == "export" selects the export subcommand). Never throws for bad input:
// every problem is a line in Flags::errors.
Flags parse_flags(int argc, char** argv);

// The --help text (usage, every flag, the exit status), ending in a newline.
const char* help_text();

}  // namespace zero::train
