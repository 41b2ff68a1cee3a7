// zero-train's training: the run set up (run.hpp), started (checkpoints.hpp: resume, --init-from
// or the seed), then either evaluated once (--eval-only) or trained step by step up to the last
// step, with the held-out evaluation every --eval-interval steps and a checkpoint every
// --save-interval steps and at the end.
#pragma once

#include "core/world.hpp"
#include "runtime/train/flags.hpp"

namespace zero::train {

// The whole run, on every rank (collective): returns the program's exit code (exit_codes.hpp)
// with its reason printed, rank 0 for what concerns every rank. A rank whose data cannot be read
// in the middle of a step ends the job (World::abort, exit 1); a rank that stops answering is
// ended by the watchdog (exit 3).
int run_training(World& world, const Flags& flags);

}  // namespace zero::train
