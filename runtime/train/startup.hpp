// zero-train's start: the config as the flags amend it, checked as far as it can be without a
// device or data, and --validate, which stops there and prints it.
//
// Both are collective over the world (every rank reads the file; all agree on the outcome).
#pragma once

#include <optional>

#include "core/world.hpp"
#include "runtime/config/config.hpp"
#include "runtime/train/flags.hpp"

namespace zero::train {

// Everything start-up derives from the config alone, before it opens a device or reads data:
// the engine's options (the LR schedule built, and what the Engine's constructor checks about
// them) and the model against the default data. --validate and training both run it, so a
// config that validates does not fail at start for a reason in the config. Throws zero::Error.
void check_startup(const config::Config& c, const Flags& flags);

// The config, with the flags that replace parts of it (--model, --seed, --device) written into
// it before it is read, so that everything derived from them ("auto" bucket sizes from n_embd)
// agrees; then check_startup. Every error is printed (rank 0; another rank only for its own
// errors) and the result is nullopt on every rank when any rank failed.
std::optional<config::Config> load_config(World& world, const Flags& flags);

// --validate: the effective config as JSON on stdout (rank 0) and 0, or kExitUsage with every
// error printed.
int validate(World& world, const Flags& flags);

}  // namespace zero::train
