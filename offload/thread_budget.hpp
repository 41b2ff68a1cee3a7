// The host thread budget: how many threads each rank's host work (the host AdamW of
// optim/host_adam.hpp, staging copies) may use, so that the ranks sharing a host do not
// oversubscribe its cores. The engine passes `threads` to HostAdam(threads).
//
// Rule, in order of precedence:
//   1. the environment variable ZERO_HOST_THREADS, a whole number >= 1 (for one run, without
//      editing the config);
//   2. an explicit thread count from the config (`configured` > 0);
//   3. automatic: the cores the ranks of this node may run on (the union of their
//      sched_getaffinity sets), divided evenly among those ranks (rounded down), and never more
//      than this rank's own affinity allows; at least 1.
// Ranks of one node are found with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). With ranks unbound
// (every rank may use every core) the automatic budget is cores / ranks; with each rank bound to
// its own cores (mpirun --bind-to core, --map-by ...:PE=n) it is the cores each rank is bound to.
//
// host_thread_budget() is collective over `comm`: every rank of it must call it, from one thread
// at a time. It throws zero::Error for a malformed ZERO_HOST_THREADS or a negative `configured`,
// and for a failed MPI or sched_getaffinity call.
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

namespace zero::offload {

struct ThreadBudget {
  int threads = 1;        // threads this rank may use, >= 1
  int node_ranks = 1;     // ranks of `comm` on this node
  int node_cores = 1;     // cores the node's ranks may run on, together
  int own_cores = 1;      // cores this rank may run on (its affinity)
  int machine_cores = 1;  // cores of this machine the job could use (machine_core_count())
  enum class Source { environment, config, automatic } source = Source::automatic;
  // One line for the start-up log, e.g.
  //   "host threads per rank: 4 (16 cores on this node / 4 ranks)"
  //   "host threads per rank: 8 (ZERO_HOST_THREADS=8; 2 ranks x 8 > 8 cores: oversubscribed)"
  std::string explanation;
  // Empty, or a warning for the start-up log when some of the machine's cores are in no rank's
  // affinity (idle_core_advice()).
  std::string advice;
};

// The automatic rule alone: node_cores / node_ranks, at most own_cores, at least 1.
// Arguments below 1 count as 1.
int divide_cores(int node_cores, int own_cores, int node_ranks) noexcept;

// The cores this process may run on (sched_getaffinity), >= 1.
int affinity_core_count();

// The cores of this machine a job may use whatever its binding: the online cpus, within the
// container's cpuset when the cgroup (v2 or v1) says; >= 1.
int machine_core_count();

// "" when the node's ranks may run on every usable core of the machine (node_cores >=
// machine_cores); else what to do about the idle ones. mpirun binds ranks: Open MPI binds each
// rank to one core when it starts 2 ranks or fewer, so `mpirun -np 1` on a 2-core machine
// leaves a core idle however many threads the rank would use.
std::string idle_core_advice(int node_cores, int machine_cores, int node_ranks);

// Cpus named by a Linux cpu list ("0-3,8,10-11"); -1 when the text is not one.
int count_cpu_list(std::string_view list);

ThreadBudget host_thread_budget(MPI_Comm comm, int configured = 0);

}  // namespace zero::offload
