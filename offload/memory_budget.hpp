// The memory budget: how many bytes of RAM each rank may use, so that a model too large for the
// machine, or for the container or batch job it runs in, is the memory ledger's clear error at
// start-up instead of the kernel's OOM killer ending the run without a word.
//
// Rule (memory_budget()):
//   budget per rank = min( 90% of physical RAM / the ranks on this node,
//                          90% of the cgroup memory limit / the ranks on this node under it )
// The cgroup limit is the tightest of cgroup v2 `memory.max` and cgroup v1
// `memory.limit_in_bytes` over this process's cgroup and every ancestor up to the hierarchy's
// mount (a container's or a Slurm job's limit sits on an ancestor, and every one applies). Ranks
// "under it" are the ranks of this node whose tightest limit is that same file: a job-wide limit
// is shared by all of them; ranks each in a cgroup of their own are not divided. The 10% left
// over is for what the ledger does not count: the program, MPI's and the allocator's overhead,
// activations' temporaries.
//
// How zero-train applies it (device_options()): on the cpu backend device memory and host memory
// are the same RAM, so the two ledger spaces share ONE budget (DeviceOptions::shared_memory_limit);
// on cuda the budget is the host memory limit (the GPU has its own). A limit written in the config
// (zero_train.device_memory_limit / host_memory_limit) wins; one larger than the budget gets a
// warning, since the kernel, not the ledger, would then stop the run.
//
// Thread-safety: all functions are reentrant. memory_budget() is collective over its communicator.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/device.hpp"

namespace zero::offload {

// One cgroup memory limit that applies to this process.
struct CgroupLimit {
  size_t bytes = 0;
  int version = 2;   // 2: memory.max; 1: memory.limit_in_bytes
  std::string file;  // the file it was read from, as opened (under `root`)
};

// The tightest cgroup memory limit of this process, read from the files under `root` ("/" on a
// real system; tests pass a directory with their own proc/ and sys/ trees):
//   root/proc/self/cgroup      the process's cgroup in each hierarchy ("0::/path" is v2,
//                              "N:memory:/path" or "N:cpu,memory:/path" is v1's memory)
//   root/proc/self/mountinfo   where each hierarchy is mounted and which of its directories the
//                              mount shows (containers); without it: sys/fs/cgroup (v2, or
//                              sys/fs/cgroup/unified on a hybrid system) and sys/fs/cgroup/memory
// then memory.max (v2; "max" = none) or memory.limit_in_bytes (v1; a value of 2^62 or more =
// none) in the cgroup's directory and each parent up to the mount point. nullopt when no limit
// applies or nothing can be read. Never throws.
std::optional<CgroupLimit> cgroup_memory_limit(const std::string& root = "/");

// The host's physical memory in bytes (sysconf); 0 when unknown.
size_t physical_memory_bytes() noexcept;

struct MemoryBudget {
  size_t bytes = 0;                   // per rank; 0: unknown (no physical size, no cgroup limit)
  double fraction = 0.9;
  size_t physical = 0;                // the host's RAM
  int node_ranks = 1;                 // ranks on this node (they split the physical RAM)
  std::optional<CgroupLimit> cgroup;  // the tightest cgroup limit, if any
  int cgroup_ranks = 1;               // ranks of this node under that same limit
  bool from_cgroup = false;           // whether the cgroup limit is the binding one
  // Where the figure comes from, e.g. "90% of physical memory 23.33 GiB / 2 ranks on this node".
  std::string reason;
  // One line for the start-up report, e.g.
  //   "memory budget: 10.50 GiB per rank = 90% of physical memory 23.33 GiB / 2 ranks on this node"
  //   "memory budget: 10.80 GiB per rank = 90% of cgroup v2 memory.max 24.00 GiB
  //    (/sys/fs/cgroup/job/memory.max) / 2 ranks on this node"
  std::string explanation;
};

// The rule above from given facts (pure). Ranks below 1 count as 1.
MemoryBudget divide_memory(size_t physical, const std::optional<CgroupLimit>& cgroup, int node_ranks,
                           int cgroup_ranks, double fraction = 0.9);

// Reads the facts (cgroup_memory_limit(root), physical_memory_bytes()) and counts this node's
// ranks (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)) and those under the same limit file.
// Collective over `comm`; throws zero::Error for a failed MPI call.
MemoryBudget memory_budget(MPI_Comm comm, const std::string& root = "/");

// The device's memory limits for a run on `kind`, from the config's explicit limits (bytes, 0 =
// not set) and the budget (see the top of this file):
//   cpu   memory_limit = device_limit; host_memory_limit = host_limit (0 = bounded only by the
//         shared limit); shared_memory_limit = the budget, or the explicit limits' sum when
//         that is larger (an explicit limit wins).
//   cuda  memory_limit = device_limit (0: the GPU's memory); host_memory_limit = host_limit, else
//         the budget.
// Each explicit limit above the budget (on cpu also their sum) adds a sentence to `warnings`.
// A budget of 0 (unknown) bounds nothing.
DeviceOptions device_options(DeviceKind kind, size_t device_limit, size_t host_limit,
                             const MemoryBudget& budget, std::vector<std::string>* warnings);

}  // namespace zero::offload
