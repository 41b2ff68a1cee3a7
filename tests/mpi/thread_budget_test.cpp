// The host thread budget (offload/thread_budget.hpp) on 1 and 2 ranks of one node: the
// arithmetic, agreement between the ranks of the node, the affinity of each rank, and the
// overrides (config count, ZERO_HOST_THREADS) with their errors.
//
// Every rank runs every case in the same order (mpi_main.cpp), and host_thread_budget() is
// collective: a case that calls it must call it on every rank, so no case returns early on one
// rank only. Each case leaves ZERO_HOST_THREADS unset and the affinity as it found it.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "offload/thread_budget.hpp"
#include "core/error.hpp"
#include "core/mpi_check.hpp"
#include "core/world.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::offload::affinity_core_count;
using zero::offload::count_cpu_list;
using zero::offload::divide_cores;
using zero::offload::host_thread_budget;
using zero::offload::idle_core_advice;
using zero::offload::machine_core_count;
using zero::offload::ThreadBudget;

namespace {

// Sets or unsets ZERO_HOST_THREADS for the length of a scope.
class EnvThreads {
 public:
  explicit EnvThreads(const char* value) {
    if (value) setenv("ZERO_HOST_THREADS", value, 1);
    else unsetenv("ZERO_HOST_THREADS");
  }
  ~EnvThreads() { unsetenv("ZERO_HOST_THREADS"); }
  EnvThreads(const EnvThreads&) = delete;
  EnvThreads& operator=(const EnvThreads&) = delete;
};

// Restores this process's affinity when the scope ends.
class KeepAffinity {
 public:
  KeepAffinity() { ZERO_CHECK_SYS(sched_getaffinity(0, sizeof saved_, &saved_)); }
  ~KeepAffinity() { sched_setaffinity(0, sizeof saved_, &saved_); }
  KeepAffinity(const KeepAffinity&) = delete;
  KeepAffinity& operator=(const KeepAffinity&) = delete;
  const cpu_set_t& saved() const { return saved_; }

 private:
  cpu_set_t saved_{};
};

// `value` of every rank of the world, in rank order.
std::vector<int> gather(int value) {
  zero::World& w = zero::World::get();
  std::vector<int> all(static_cast<size_t>(w.size()));
  ZERO_CHECK_MPI(MPI_Allgather(&value, 1, MPI_INT, all.data(), 1, MPI_INT, w.comm()));
  return all;
}

}  // namespace

TEST_CASE("thread budget: the node's cores divided evenly among its ranks, at least 1") {
  CHECK(divide_cores(16, 16, 4) == 4);
  CHECK(divide_cores(16, 16, 3) == 5);  // rounded down: 3 x 5 <= 16
  CHECK(divide_cores(7, 7, 2) == 3);
  CHECK(divide_cores(16, 16, 1) == 16);
  CHECK(divide_cores(2, 2, 4) == 1);    // more ranks than cores: still 1 each
  CHECK(divide_cores(64, 8, 8) == 8);   // each rank bound to its own 8 cores
  CHECK(divide_cores(64, 2, 4) == 2);   // never more than this rank's affinity
  CHECK(divide_cores(8, 8, 8) == 1);    // bound one core each (union 8 / 8 ranks)
  CHECK(divide_cores(0, 0, 0) == 1);    // nonsense in, at least 1 out
  CHECK(divide_cores(-3, 4, -1) == 1);
}

TEST_CASE("thread budget: Linux cpu lists are counted and anything else is refused") {
  CHECK(count_cpu_list("0") == 1);
  CHECK(count_cpu_list("0-3") == 4);
  CHECK(count_cpu_list("0-3,8,10-11\n") == 7);
  CHECK(count_cpu_list("") == -1);
  CHECK(count_cpu_list("3-1") == -1);
  CHECK(count_cpu_list("0-") == -1);
  CHECK(count_cpu_list("a") == -1);
  CHECK(count_cpu_list("0,,1") == -1);
  CHECK(count_cpu_list("0-2147483647") == -1);  // no overflow: past the kernel's 4M cpus
  CHECK(machine_core_count() >= affinity_core_count());
}

TEST_CASE("thread budget: cores outside every rank's affinity are named with what to do") {
  CHECK(idle_core_advice(2, 2, 1).empty());
  CHECK(idle_core_advice(16, 8, 4).empty());  // more than the cgroup says: nothing to add
  CHECK(idle_core_advice(1, 2, 1) ==
        "the 1 rank on this node may run on 1 of its 2 cores (their CPU affinity), so 1 core "
        "stays idle\nHINT: Open MPI binds each rank to one core when it starts 2 ranks or fewer: "
        "launch with `mpirun --bind-to none` (or `--map-by slot:PE=<cores per rank>`), or start "
        "one rank per core; if another job uses those cores, ignore this");
  CHECK_THAT(idle_core_advice(2, 8, 2), ContainsSubstring("the 2 ranks on this node may run on 2 of its 8 cores") &&
                                            ContainsSubstring("so 6 cores stay idle"));
}

TEST_CASE("thread budget: automatic, consistent across the ranks of this node") {
  EnvThreads env(nullptr);
  zero::World& w = zero::World::get();
  const ThreadBudget b = host_thread_budget(w.comm());
  CHECK(b.source == ThreadBudget::Source::automatic);
  // Tests run on one host: the node is the whole world, as the World numbers it too.
  CHECK(b.node_ranks == w.size());
  CHECK(b.node_ranks == w.local_size());
  CHECK(b.own_cores == zero::offload::affinity_core_count());
  CHECK(b.own_cores <= b.node_cores);
  CHECK(b.machine_cores == machine_core_count());
  CHECK(b.advice == idle_core_advice(b.node_cores, b.machine_cores, b.node_ranks));
  CHECK(b.threads == divide_cores(b.node_cores, b.own_cores, b.node_ranks));
  CHECK(b.threads >= 1);
  CHECK(b.threads <= b.own_cores);
  // No oversubscription unless there are more ranks than cores.
  if (b.node_cores >= b.node_ranks) CHECK(b.threads * b.node_ranks <= b.node_cores);
  // Every rank of the node counts the same ranks and the same cores.
  for (int v : gather(b.node_ranks)) CHECK(v == b.node_ranks);
  for (int v : gather(b.node_cores)) CHECK(v == b.node_cores);
  CHECK_THAT(b.explanation,
             ContainsSubstring("host threads per rank: " + std::to_string(b.threads) + " (") &&
                 ContainsSubstring(std::to_string(b.node_cores) + " core"));
  // A communicator of this rank alone is a node of one rank.
  const ThreadBudget alone = host_thread_budget(MPI_COMM_SELF);
  CHECK(alone.node_ranks == 1);
  CHECK(alone.node_cores == b.own_cores);
  CHECK(alone.threads == b.own_cores);
}

// Each rank pins itself to one core of the node's cores (rank r to the r-th, wrapping), so the
// union the ranks compute together is known in advance: min(ranks, cores) distinct cores.
TEST_CASE("thread budget: ranks bound to single cores get one thread each") {
  EnvThreads env(nullptr);
  KeepAffinity keep;
  zero::World& w = zero::World::get();
  // The cores any rank of the node may use now: the OR of the ranks' masks.
  cpu_set_t all{};
  ZERO_CHECK_MPI(MPI_Allreduce(&keep.saved(), &all, sizeof(cpu_set_t), MPI_UNSIGNED_CHAR, MPI_BOR,
                               w.comm()));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) cpus.push_back(c);
  REQUIRE(!cpus.empty());
  cpu_set_t one{};
  CPU_SET(cpus[static_cast<size_t>(w.local_rank()) % cpus.size()], &one);
  const bool pinned = sched_setaffinity(0, sizeof one, &one) == 0;
  // Must hold on every rank before the collective, or the expected union is wrong.
  REQUIRE_FALSE(w.any(!pinned));
  const ThreadBudget b = host_thread_budget(w.comm());
  CHECK(b.own_cores == 1);
  CHECK(b.node_cores == std::min(w.size(), static_cast<int>(cpus.size())));
  CHECK(b.threads == 1);
}

TEST_CASE("thread budget: a config count and ZERO_HOST_THREADS override, the variable first") {
  zero::World& w = zero::World::get();
  {
    EnvThreads env(nullptr);
    const ThreadBudget b = host_thread_budget(w.comm(), 5);
    CHECK(b.threads == 5);
    CHECK(b.source == ThreadBudget::Source::config);
    CHECK_THAT(b.explanation, ContainsSubstring("host threads per rank: 5 (set in the config"));
  }
  {
    EnvThreads env("3");
    const ThreadBudget b = host_thread_budget(w.comm(), 5);
    CHECK(b.threads == 3);
    CHECK(b.source == ThreadBudget::Source::environment);
    CHECK_THAT(b.explanation, ContainsSubstring("host threads per rank: 3 (ZERO_HOST_THREADS=3"));
    CHECK(host_thread_budget(w.comm()).threads == 3);
  }
  {
    // More than the node has: allowed, and said so.
    EnvThreads env(nullptr);
    const ThreadBudget probe = host_thread_budget(w.comm());
    const int too_many = probe.node_cores + 1;
    const ThreadBudget b = host_thread_budget(w.comm(), too_many);
    CHECK(b.threads == too_many);
    const std::string ranks = std::to_string(w.size()) + (w.size() == 1 ? " rank" : " ranks");
    CHECK_THAT(b.explanation, ContainsSubstring(ranks + " x " + std::to_string(too_many)) &&
                                  ContainsSubstring("oversubscribed"));
  }
}

TEST_CASE("thread budget: malformed overrides are errors saying what to do") {
  zero::World& w = zero::World::get();
  for (const char* bad : {"0", "-2", "four", "4x", " 4", "99999999999"}) {
    CAPTURE(bad);
    EnvThreads env(bad);
    // Thrown on every rank before any collective call, so no rank is left waiting.
    CHECK_THROWS_WITH(host_thread_budget(w.comm()),
                      ContainsSubstring(std::string("ZERO_HOST_THREADS='") + bad + "'") &&
                          ContainsSubstring("HINT"));
  }
  EnvThreads env(nullptr);
  CHECK_THROWS_WITH(host_thread_budget(w.comm(), -1),
                    ContainsSubstring("host thread count -1 in the config is negative"));
  EnvThreads empty("");  // empty counts as unset
  CHECK(host_thread_budget(w.comm()).source == ThreadBudget::Source::automatic);
}
