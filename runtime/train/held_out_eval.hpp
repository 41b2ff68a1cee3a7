// zero-train's held-out evaluation: one number for given weights and held-out data, whatever
// the number of ranks.
//
// The set is fixed and ordered (the addition task's held-out problems in the split's order, or
// the windows of --eval-data in file order; see docs/training.md), and the evaluation covers its
// first `count` sequences. They are cut into chunks of `chunk` consecutive sequences — chunk c is
// sequences [c * chunk, (c + 1) * chunk), the last one shorter — and chunk c is evaluated by rank
// c mod W. Every chunk is thus one forward pass over the same rows on any world size, so its
// result is bit for bit the same (no kernel sees a different batch); rank 0 gathers the chunks'
// loss sums and token counts and adds them in chunk order, in double. The loss is therefore
// identical on 1, 2 or 4 ranks as long as `chunk` (zero-train passes the micro-batch size) is.
//
// The loss is the mean over every counted target token of the set (target >= 0): per chunk, the
// forward's mean loss times the chunk's counted tokens, summed, divided by all counted tokens.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "models/data/dataset.hpp"

namespace zero::train {

struct HeldOutSet {
  int64_t size = 0;  // sequences in the whole set
  // Sequences [first, first + count) of the set. Called on the rank that evaluates them.
  std::function<models::data::TokenBatch(int64_t first, int count)> read;
  // The addition task: also score exact match (AdditionTask::score on the argmax tokens).
  bool exact_match = false;
};

struct HeldOutResult {
  double loss = 0;         // mean loss per counted target token
  int64_t sequences = 0;   // sequences evaluated
  int64_t tokens = 0;      // counted target tokens
  int64_t problems = 0;    // exact match: problems scored (0 unless HeldOutSet::exact_match)
  int64_t correct = 0;     //   and of those, answered right
};

// The mean loss of `batch` over its counted targets, forward only, like Engine::evaluate; fills
// `argmax` (the model's most likely token at every position) when it is not null.
using EvalForward = std::function<double(const models::data::TokenBatch& batch, std::vector<int32_t>* argmax)>;

// Evaluates sequences [0, min(count, set.size)) as described above. `collective_forward`: the
// forward is itself a collective (ZeRO stage 3 gathers the parameters), so every rank runs the
// same number of forwards; a rank with no chunk left in the last round re-runs chunk 0 and
// discards the result. Collective over `comm`: every rank calls it with the same arguments and
// gets the same result. Exceptions from `set.read` or `forward` propagate on the rank that threw
// (the caller ends the job: the other ranks may be waiting in a collective).
HeldOutResult evaluate_held_out(const HeldOutSet& set, int64_t count, int chunk, bool collective_forward,
                                MPI_Comm comm, const EvalForward& forward);

}  // namespace zero::train
