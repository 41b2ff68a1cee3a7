// Numbers that are each in range but whose products would not fit (private to runtime/config):
// checked once every value and "auto" is final, so a config that validates never overflows a
// counter later. No JSON here.
#pragma once

#include <vector>

#include "runtime/config/config.hpp"

namespace zero::config::detail {

// The most samples per optimizer step (and so per micro-batch, and the most micro-batches per
// step) zero-train counts: the engine and the data loader count them in 32-bit integers, and no
// real job comes near (the largest published runs use a few thousand sequences per step).
inline constexpr long long kMaxBatch = 2147483647;  // 2^31 - 1

// Element counts past 2^53 are not exact in the doubles that memory figures are printed from,
// and their byte sizes approach what a 64-bit size holds; no machine has that much memory.
inline constexpr long long kMaxElements = 1LL << 53;

// The model's parameter count and one micro-batch's largest activations (logits, attention
// scores, the MLP's hidden layer) within kMaxElements; the run's last sample index
// (zero_train.steps x train_batch_size) within 2^62. Errors name the key to change.
void check_sizes(const Config& c, std::vector<Diagnostic>& diagnostics);

}  // namespace zero::config::detail
