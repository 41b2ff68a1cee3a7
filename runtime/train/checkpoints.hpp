// zero-train's checkpoints: the directory checked at start, where a run starts (--resume from the
// newest complete checkpoint, --init-from a safetensors file, or the seed), and the saves.
//
// Every function here is collective over the run's world: all ranks call it at the same point
// and get the same outcome; errors are printed once (rank_errors.hpp). The format and the
// directory's layout are runtime/checkpoint's (docs/checkpoint-format.md).
#pragma once

#include <string>

#include "core/world.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/train/flags.hpp"
#include "runtime/train/run.hpp"

namespace zero::train {

// The checkpoint of optimizer step `step`: "step_00000100".
std::string step_tag(long long step);

// --checkpoint-dir before anything is trained, so that a directory a save cannot use fails now
// and not hours later: created, writable from every rank (a real probe file: one host's mount
// may be read-only), tidied of what failed or interrupted saves left (rank 0: a sealed leftover
// is installed, garbage removed; before --resume looks for the newest checkpoint), and with room
// for one checkpoint of this run (rank 0: statvfs, one filesystem shared by every rank). Returns
// 0, or kExitUsage with the reason printed.
int check_checkpoint_dir(World& world, const Flags& flags, const Engine& engine);

// Where the run starts: with --resume the newest complete checkpoint of --checkpoint-dir (the
// engine's state and step; a warning for each setting the checkpoint was saved with that this
// run changes), with --init-from the file's weights (Adam fresh), else the seed's weights as the
// engine built them. Sets `first_step` (1 unless resumed). Returns 0, kExitUsage (no checkpoint,
// a file that cannot be the model's weights) or kExitFailure (loading failed while running).
int choose_start(Run& run, long long& first_step);

// Saves the state after step `step` as DIR/step_<step>, with what export and --resume need in
// its metadata, and logs the time it took. False (the error printed) when the save failed.
bool save_checkpoint(Run& run, long long step);

}  // namespace zero::train
