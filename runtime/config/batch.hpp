// The batch-size rule (private to runtime/config): train_batch_size = micro-batch x accumulation
// x data-parallel size (the world over pipeline x tensor), any two giving the third. No JSON
// here: blocks.cpp reads the three keys and hands over what it found.
#pragma once

#include <string>
#include <vector>

#include "runtime/config/config.hpp"

namespace zero::config::detail {

// How one batch key appeared in the file.
struct BatchKey {
  enum class State { absent, auto_value, value, invalid };  // invalid: already reported
  State state = State::absent;
  long long value = 0;  // when State::value: a positive integer
};

struct BatchInput {
  BatchKey train_batch_size;
  BatchKey train_micro_batch_size_per_gpu;
  BatchKey gradient_accumulation_steps;
};

// The size the rule multiplies by: the data-parallel size, env.world_size / (pipeline x tensor).
// DeepSpeed's rule under pipeline parallelism too: its pipeline engine hands DeepSpeedConfig the
// grid, whose data-parallel world size replaces the world size. `note` follows the number in
// messages ("" when it is the whole world; " (4 ranks / 2 pipeline stages)" otherwise).
struct DataParallel {
  long long size = 1;
  std::string note;
};

// Resolves the three numbers for `dp` data-parallel ranks, applying env.micro_batch_flag and
// env.grad_accum_flag. Errors go to `diagnostics` (path "train_batch_size" for the rule itself);
// `out` is written only when the rule holds.
void resolve_batch(const BatchInput& in, const Environment& env, const DataParallel& dp,
                   Batch& out, std::vector<Diagnostic>& diagnostics);

}  // namespace zero::config::detail
