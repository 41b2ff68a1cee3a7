// The memory budget (offload/memory_budget.hpp) on 1 and 2 ranks of one node: the node's ranks
// split the physical RAM, and a cgroup limit is split among the ranks under that same limit file
// (one job-wide file: divided; a cgroup of each rank's own: not divided). The cgroup files are
// fake trees the test writes (rank 0 writes the shared one; a barrier orders it before use).
//
// memory_budget() is collective: every case calls it on every rank.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "offload/memory_budget.hpp"
#include "core/mpi_check.hpp"
#include "core/world.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::offload::memory_budget;
using zero::offload::MemoryBudget;
using zero::offload::physical_memory_bytes;

namespace {

namespace fs = std::filesystem;
constexpr size_t kMiB = size_t{1} << 20;

// A fake root holding a cgroup v2 limit of `bytes` for cgroup /job; `owner` writes it.
fs::path write_tree(const std::string& name, size_t bytes, bool owner) {
  const fs::path dir = fs::temp_directory_path() / name;
  if (owner) {
    fs::remove_all(dir);
    fs::create_directories(dir / "proc/self");
    fs::create_directories(dir / "sys/fs/cgroup/job");
    std::ofstream(dir / "proc/self/cgroup") << "0::/job\n";
    std::ofstream(dir / "proc/self/mountinfo") << "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    std::ofstream(dir / "sys/fs/cgroup/job/memory.max") << bytes << "\n";
  }
  return dir;
}

}  // namespace

TEST_CASE("memory budget: the node's ranks split the physical memory") {
  zero::World& world = zero::World::get();
  const MemoryBudget b = memory_budget(world.comm(), "/nonexistent-root");  // no cgroup
  CHECK(b.node_ranks == world.size());  // one node
  CHECK_FALSE(b.cgroup);
  CHECK(b.bytes == static_cast<size_t>(0.9 * static_cast<double>(physical_memory_bytes()) / world.size()));
  CHECK_THAT(b.explanation, ContainsSubstring("/ " + std::to_string(world.size()) + " rank"));
}

TEST_CASE("memory budget: a shared cgroup limit is divided, a rank's own is not") {
  zero::World& world = zero::World::get();
  const std::string tag = std::to_string(::getppid());  // the same for the ranks of one mpirun
  // One limit file for the job: every rank under it.
  const fs::path shared = write_tree("zero_mpi_budget_shared_" + tag, 512 * kMiB, world.is_root());
  ZERO_CHECK_MPI(MPI_Barrier(world.comm()));
  MemoryBudget b = memory_budget(world.comm(), shared.string());
  REQUIRE(b.cgroup);
  CHECK(b.cgroup_ranks == world.size());
  CHECK(b.from_cgroup);
  CHECK(b.bytes == static_cast<size_t>(0.9 * 512.0 * kMiB / world.size()));
  // A cgroup of each rank's own (another file per rank): not divided.
  const fs::path own =
      write_tree("zero_mpi_budget_own_" + tag + "_" + std::to_string(world.rank()), 512 * kMiB, true);
  b = memory_budget(world.comm(), own.string());
  REQUIRE(b.cgroup);
  CHECK(b.cgroup_ranks == 1);
  CHECK(b.bytes == static_cast<size_t>(0.9 * 512.0 * kMiB));
  ZERO_CHECK_MPI(MPI_Barrier(world.comm()));
  fs::remove_all(own);
  if (world.is_root()) fs::remove_all(shared);
}
