#include "runtime/train/held_out_eval.hpp"

#include <algorithm>

#include "models/data/addition_task.hpp"
#include "core/error.hpp"
#include "core/mpi_check.hpp"

namespace zero::train {

HeldOutResult evaluate_held_out(const HeldOutSet& set, int64_t count, int chunk, bool collective_forward,
                                MPI_Comm comm, const EvalForward& forward) {
  ZERO_REQUIRE(chunk >= 1, "evaluate_held_out: chunk must be at least 1, got " + std::to_string(chunk));
  ZERO_REQUIRE(set.size >= 1, "evaluate_held_out: the held-out set is empty");
  int rank = 0, W = 1;
  ZERO_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  ZERO_CHECK_MPI(MPI_Comm_size(comm, &W));
  const int64_t N = std::min(count > 0 ? count : set.size, set.size);
  const int64_t chunks = (N + chunk - 1) / chunk;
  const int64_t rounds = (chunks + W - 1) / W;

  // Per round: this rank's chunk's loss sum, counted tokens, problems, correct (doubles: exact
  // below 2^53, and one MPI type for the gather).
  constexpr int kFields = 4;
  std::vector<double> mine(static_cast<size_t>(rounds * kFields), 0.0);
  std::vector<int32_t> argmax;
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t c = k * W + rank;
    const bool real = c < chunks;
    if (!real && !collective_forward) break;
    const int64_t first = real ? c * chunk : 0;
    const int rows = static_cast<int>(std::min<int64_t>(chunk, N - first));
    const models::data::TokenBatch tb = set.read(first, rows);
    const double mean = forward(tb, set.exact_match ? &argmax : nullptr);
    if (!real) continue;  // a stand-in so that the collective forward matched the other ranks
    const auto tokens = static_cast<double>(
        std::count_if(tb.targets.begin(), tb.targets.end(), [](int32_t t) { return t >= 0; }));
    double* v = mine.data() + k * kFields;
    v[0] = mean * tokens;
    v[1] = tokens;
    if (set.exact_match) {
      const models::data::AdditionScore sc = models::data::AdditionTask::score(tb, argmax);
      v[2] = static_cast<double>(sc.problems);
      v[3] = static_cast<double>(sc.correct);
    }
  }

  // Rank 0 gets every rank's rounds and adds the chunks in chunk order: the same additions in
  // the same order on any world size.
  std::vector<double> all(rank == 0 ? static_cast<size_t>(rounds * kFields * W) : 0);
  ZERO_CHECK_MPI(MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                            static_cast<int>(mine.size()), MPI_DOUBLE, 0, comm));
  double totals[kFields] = {0, 0, 0, 0};
  if (rank == 0)
    for (int64_t c = 0; c < chunks; ++c) {
      const double* v = all.data() + ((c % W) * rounds + c / W) * kFields;
      for (int f = 0; f < kFields; ++f) totals[f] += v[f];
    }
  ZERO_CHECK_MPI(MPI_Bcast(totals, kFields, MPI_DOUBLE, 0, comm));
  HeldOutResult r;
  r.loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
  r.sequences = N;
  r.tokens = static_cast<int64_t>(totals[1]);
  r.problems = static_cast<int64_t>(totals[2]);
  r.correct = static_cast<int64_t>(totals[3]);
  return r;
}

}  // namespace zero::train
