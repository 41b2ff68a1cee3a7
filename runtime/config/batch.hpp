// The batch-size rule (private to runtime/config): train_batch_size = micro-batch x accumulation
// x data-parallel world size, any two giving the third. No JSON here: blocks.cpp reads the three
// keys and hands over what it found.
#pragma once

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

// Resolves the three numbers for env.world_size ranks, applying env.micro_batch_flag and
// env.grad_accum_flag. Errors go to `diagnostics` (path "train_batch_size" for the rule itself);
// `out` is written only when the rule holds.
void resolve_batch(const BatchInput& in, const Environment& env, Batch& out,
                   std::vector<Diagnostic>& diagnostics);

}  // namespace zero::config::detail
