#include "offload/thread_budget.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/mpi_check.hpp"

namespace zero::offload {

namespace {

// This process's affinity mask as bytes (bit i of the whole = cpu i). The kernel's mask may be
// larger than cpu_set_t's 1024 bits: grow the buffer while sched_getaffinity says EINVAL.
std::vector<unsigned char> affinity_mask() {
  for (int ncpus = 1024; ncpus <= (1 << 22); ncpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpus);
    ZERO_CHECK_SYS(set);
    const size_t size = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      std::vector<unsigned char> mask(size, 0);
      for (int cpu = 0; cpu < ncpus; ++cpu)
        if (CPU_ISSET_S(cpu, size, set))
          mask[static_cast<size_t>(cpu / 8)] |= static_cast<unsigned char>(1u << (cpu % 8));
      CPU_FREE(set);
      return mask;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL)
      detail::throw_errno(err, "sched_getaffinity(0, size, set)", __FILE__, __LINE__);
  }
  ZERO_FAIL("sched_getaffinity: the affinity mask is larger than 4M cpus");
}

int count_bits(const std::vector<unsigned char>& mask) {
  int n = 0;
  for (unsigned char b : mask) n += __builtin_popcount(b);
  return n;
}

// ZERO_HOST_THREADS as a count; 0 when unset or empty. Throws for anything but a whole number
// in [1, 65536].
int environment_threads() {
  const char* text = std::getenv("ZERO_HOST_THREADS");
  if (!text || !*text) return 0;
  const std::string_view s(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 1 || value > 65536)
    ZERO_FAIL("ZERO_HOST_THREADS='" + std::string(s) +
              "' is not a thread count (a whole number from 1 to 65536)\nHINT: set it to the "
              "number of host threads each rank may use, e.g. ZERO_HOST_THREADS=4, or unset it "
              "for the automatic budget (the node's cores divided among its ranks)");
  return value;
}

std::string plural(int n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

}  // namespace

int divide_cores(int node_cores, int own_cores, int node_ranks) noexcept {
  node_cores = std::max(node_cores, 1);
  own_cores = std::max(own_cores, 1);
  node_ranks = std::max(node_ranks, 1);
  return std::max(1, std::min(own_cores, node_cores / node_ranks));
}

int affinity_core_count() { return std::max(1, count_bits(affinity_mask())); }

int count_cpu_list(std::string_view list) {
  while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.remove_suffix(1);
  if (list.empty()) return -1;
  int total = 0;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    const std::string_view a = item.substr(0, dash);
    if (std::from_chars(a.data(), a.data() + a.size(), lo).ptr != a.data() + a.size() || a.empty())
      return -1;
    hi = lo;
    if (dash != std::string_view::npos) {
      const std::string_view b = item.substr(dash + 1);
      if (b.empty() || std::from_chars(b.data(), b.data() + b.size(), hi).ptr != b.data() + b.size())
        return -1;
    }
    if (lo < 0 || hi < lo || hi >= (1 << 22)) return -1;  // the kernel allows at most 4M cpus
    total += hi - lo + 1;
  }
  return total;
}

int machine_core_count() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = online > 0 ? static_cast<int>(std::min(online, 1L << 22)) : 1;
  // A container's cpuset (cgroup v2, then v1): cpus outside it are not this job's to use.
  for (const char* path : {"/sys/fs/cgroup/cpuset.cpus.effective",
                           "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"}) {
    std::ifstream in(path);
    std::string text;
    if (!in || !std::getline(in, text)) continue;
    const int n = count_cpu_list(text);
    if (n > 0) {
      cores = std::min(cores, n);
      break;
    }
  }
  return std::max(1, cores);
}

std::string idle_core_advice(int node_cores, int machine_cores, int node_ranks) {
  if (node_cores >= machine_cores) return "";
  const int idle = machine_cores - node_cores;
  return "the " + plural(node_ranks, "rank") + " on this node may run on " +
         std::to_string(node_cores) + " of its " + plural(machine_cores, "core") +
         " (their CPU affinity), so " + plural(idle, "core") + (idle == 1 ? " stays" : " stay") +
         " idle\nHINT: Open MPI binds each rank to one core when it starts 2 ranks or fewer: "
         "launch with `mpirun --bind-to none` (or `--map-by slot:PE=<cores per rank>`), or start "
         "one rank per core; if another job uses those cores, ignore this";
}

ThreadBudget host_thread_budget(MPI_Comm comm, int configured) {
  ZERO_REQUIRE(configured >= 0, "host thread count " + std::to_string(configured) +
                                    " in the config is negative\nHINT: give a count >= 1, or 0 "
                                    "for the automatic budget (the node's cores divided among "
                                    "its ranks)");
  // Read before the collective calls: mpirun gives every rank the same environment, so a
  // malformed value fails on every rank before any of them enters a collective.
  const int env = environment_threads();

  ThreadBudget b;
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  try {
    ZERO_CHECK_MPI(MPI_Comm_size(node, &b.node_ranks));
    std::vector<unsigned char> mask = affinity_mask();
    b.own_cores = std::max(1, count_bits(mask));
    // The union of the node's affinity masks: a bitwise OR over equal-length byte masks.
    int len = static_cast<int>(mask.size()), max_len = 0;
    ZERO_CHECK_MPI(MPI_Allreduce(&len, &max_len, 1, MPI_INT, MPI_MAX, node));
    mask.resize(static_cast<size_t>(max_len), 0);
    std::vector<unsigned char> all(mask.size(), 0);
    ZERO_CHECK_MPI(MPI_Allreduce(mask.data(), all.data(), max_len, MPI_UNSIGNED_CHAR, MPI_BOR,
                                 node));
    b.node_cores = std::max(1, count_bits(all));
  } catch (...) {
    MPI_Comm_free(&node);
    throw;
  }
  ZERO_CHECK_MPI(MPI_Comm_free(&node));

  const std::string node_facts = plural(b.node_cores, "core") + " on this node / " +
                                 plural(b.node_ranks, "rank");
  std::string why;
  if (env > 0) {
    b.threads = env;
    b.source = ThreadBudget::Source::environment;
    why = "ZERO_HOST_THREADS=" + std::to_string(env);
  } else if (configured > 0) {
    b.threads = configured;
    b.source = ThreadBudget::Source::config;
    why = "set in the config";
  } else {
    b.threads = divide_cores(b.node_cores, b.own_cores, b.node_ranks);
    b.source = ThreadBudget::Source::automatic;
    why = node_facts;
    if (b.own_cores < b.node_cores / b.node_ranks)
      why += ", limited by this rank's affinity of " + plural(b.own_cores, "core");
    else if (b.node_cores < b.node_ranks)
      why += ", at least 1";
  }
  if (b.source != ThreadBudget::Source::automatic &&
      static_cast<long long>(b.threads) * b.node_ranks > b.node_cores)
    why += "; " + plural(b.node_ranks, "rank") + " x " + std::to_string(b.threads) + " > " +
           plural(b.node_cores, "core") + " on this node: oversubscribed";
  b.explanation = "host threads per rank: " + std::to_string(b.threads) + " (" + why + ")";
  b.machine_cores = machine_core_count();
  b.advice = idle_core_advice(b.node_cores, b.machine_cores, b.node_ranks);
  return b;
}

}  // namespace zero::offload
