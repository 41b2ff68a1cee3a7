// Timing a multi-rank operation: every rank starts together (a barrier) and the result is the
// slowest rank's seconds (an MPI max), which is what a job waits for. Collective over `comm`:
// every rank must call it the same number of times. Blocks the caller for the duration of fn.
#pragma once

#include <mpi.h>

#include <functional>

#include "bench/common/report.hpp"

namespace zero::bench {

inline double slowest_rank_seconds(MPI_Comm comm, const std::function<void()>& fn) {
  MPI_Barrier(comm);
  const double t0 = now_seconds();
  fn();
  double t = now_seconds() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
  return t;
}

}  // namespace zero::bench
