// `zero-train export`: a checkpoint's fp32 master weights, consolidated into one safetensors
// file with Hugging Face GPT-2 names, and with --hf-config the config.json that transformers'
// GPT2LMHeadModel.from_pretrained needs beside it.
#pragma once

#include "core/world.hpp"
#include "runtime/train/flags.hpp"

namespace zero::train {

// Rank 0 reads the checkpoint (Flags::export_dir, export_tag or the newest complete one) and
// writes the file(s); other ranks return 0 at once. Returns 0, or kExitFailure with one
// paragraph on stderr. Not collective.
int export_checkpoint(World& world, const Flags& flags);

}  // namespace zero::train
