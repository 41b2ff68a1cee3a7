// The memory budget (offload/memory_budget.hpp): the cgroup files read from fake /proc and /sys
// trees the tests write (cgroup v2, v1, hybrid, a container's view, no mountinfo, nothing), the
// rule dividing RAM among the ranks of a node, and the device limits zero-train derives from it.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "offload/memory_budget.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::offload::CgroupLimit;
using zero::offload::cgroup_memory_limit;
using zero::offload::device_options;
using zero::offload::divide_memory;
using zero::offload::MemoryBudget;

namespace {

namespace fs = std::filesystem;
constexpr size_t kGiB = size_t{1} << 30;

// A fresh directory standing for "/", removed at the end of the test.
struct FakeRoot {
  fs::path dir;
  FakeRoot() {
    static int n = 0;
    dir = fs::temp_directory_path() /
          ("zero_memory_budget_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~FakeRoot() { fs::remove_all(dir); }
  void write(const std::string& rel, const std::string& text) const {
    const fs::path p = dir / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string root() const { return dir.string(); }
};

const char* const kV2Mount = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
const char* const kV1Mounts =
    "24 23 0:21 / /sys/fs/cgroup tmpfs rw - tmpfs tmpfs rw,mode=755\n"
    "31 24 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "35 24 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";

}  // namespace

TEST_CASE("memory budget: cgroup v2, the tightest memory.max of the cgroup and its ancestors") {
  FakeRoot r;
  r.write("proc/self/cgroup", "0::/user.slice/job.scope\n");
  r.write("proc/self/mountinfo", kV2Mount);
  r.write("sys/fs/cgroup/user.slice/job.scope/memory.max", "max\n");
  r.write("sys/fs/cgroup/user.slice/memory.max", "25769803776\n");  // 24 GiB
  // The mount's top directory counts too: in a container it is the container's own cgroup.
  r.write("sys/fs/cgroup/memory.max", "8589934592\n");
  const auto limit = cgroup_memory_limit(r.root());
  REQUIRE(limit);
  CHECK(limit->bytes == 8 * kGiB);
  r.write("sys/fs/cgroup/memory.max", "max\n");
  const auto again = cgroup_memory_limit(r.root());
  REQUIRE(again);
  CHECK(again->bytes == 24 * kGiB);
  CHECK(again->version == 2);
  CHECK(again->file == r.root() + "/sys/fs/cgroup/user.slice/memory.max");
}

TEST_CASE("memory budget: cgroup v1 memory.limit_in_bytes, a Slurm job's limit on an ancestor") {
  FakeRoot r;
  r.write("proc/self/cgroup", "5:cpu,cpuacct:/slurm/uid_0/job_7\n4:memory:/slurm/uid_0/job_7/step_0\n");
  r.write("proc/self/mountinfo", kV1Mounts);
  // "No limit" reads as a huge page-counter value.
  r.write("sys/fs/cgroup/memory/slurm/uid_0/job_7/step_0/memory.limit_in_bytes", "9223372036854771712\n");
  r.write("sys/fs/cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes", "17179869184\n");
  r.write("sys/fs/cgroup/memory/slurm/memory.limit_in_bytes", "9223372036854771712\n");
  const auto limit = cgroup_memory_limit(r.root());
  REQUIRE(limit);
  CHECK(limit->bytes == 16 * kGiB);
  CHECK(limit->version == 1);
  CHECK_THAT(limit->file, ContainsSubstring("job_7/memory.limit_in_bytes"));
}

TEST_CASE("memory budget: a hybrid system takes the tighter of v1 and v2") {
  FakeRoot r;
  r.write("proc/self/cgroup", "4:memory:/a\n0::/b\n");
  r.write("proc/self/mountinfo",
          std::string(kV1Mounts) + "41 24 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  r.write("sys/fs/cgroup/memory/a/memory.limit_in_bytes", "8589934592\n");
  r.write("sys/fs/cgroup/unified/b/memory.max", "4294967296\n");
  const auto limit = cgroup_memory_limit(r.root());
  REQUIRE(limit);
  CHECK(limit->bytes == 4 * kGiB);
  CHECK(limit->version == 2);
}

TEST_CASE("memory budget: a container sees its own cgroup as the mount's root") {
  FakeRoot r;
  // Without a cgroup namespace the path is the host's; the mount shows only /docker/abc.
  r.write("proc/self/cgroup", "0::/docker/abc\n");
  r.write("proc/self/mountinfo", "30 23 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n");
  r.write("sys/fs/cgroup/memory.max", "2147483648\n");
  auto limit = cgroup_memory_limit(r.root());
  REQUIRE(limit);
  CHECK(limit->bytes == 2 * kGiB);
  CHECK(limit->file == r.root() + "/sys/fs/cgroup/memory.max");
  // With a namespace the path is "/" and the mount's root "/": the same file.
  r.write("proc/self/cgroup", "0::/\n");
  r.write("proc/self/mountinfo", kV2Mount);
  limit = cgroup_memory_limit(r.root());
  REQUIRE(limit);
  CHECK(limit->bytes == 2 * kGiB);
}

TEST_CASE("memory budget: escaped mount points, and the usual places without mountinfo") {
  FakeRoot r;
  r.write("proc/self/cgroup", "0::/j\n");
  r.write("proc/self/mountinfo", "30 23 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n");
  r.write("sys/fs/my cgroup/j/memory.max", "1073741824\n");
  auto limit = cgroup_memory_limit(r.root());
  REQUIRE(limit);
  CHECK(limit->bytes == kGiB);

  FakeRoot plain;
  plain.write("proc/self/cgroup", "0::/j\n");
  plain.write("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
  plain.write("sys/fs/cgroup/j/memory.max", "3221225472\n");
  limit = cgroup_memory_limit(plain.root());
  REQUIRE(limit);
  CHECK(limit->bytes == 3 * kGiB);
}

TEST_CASE("memory budget: no cgroup, no limit, or unreadable values give none") {
  FakeRoot empty;
  CHECK_FALSE(cgroup_memory_limit(empty.root()));
  FakeRoot r;
  r.write("proc/self/cgroup", "0::/j\n4:memory:/j\n");
  r.write("proc/self/mountinfo", std::string(kV2Mount));  // v1 memory not mounted: skipped
  r.write("sys/fs/cgroup/j/memory.max", "max\n");
  CHECK_FALSE(cgroup_memory_limit(r.root()));
  r.write("sys/fs/cgroup/j/memory.max", "lots\n");
  CHECK_FALSE(cgroup_memory_limit(r.root()));
  r.write("proc/self/cgroup", "garbage\n");
  CHECK_FALSE(cgroup_memory_limit(r.root()));
}

TEST_CASE("memory budget: 90% of the tighter of RAM and the cgroup, split among the ranks under it") {
  // Physical memory binds: split among the node's ranks.
  MemoryBudget b = divide_memory(64 * kGiB, std::nullopt, 4, 4);
  CHECK(b.bytes == static_cast<size_t>(0.9 * 16 * kGiB));
  CHECK_FALSE(b.from_cgroup);
  CHECK(b.explanation == "memory budget: 14.40 GiB per rank = 90% of physical memory 64.00 GiB / 4 ranks on this node");
  // A job's cgroup limit of 24 GiB shared by 2 ranks binds.
  const CgroupLimit job{24 * kGiB, 2, "/sys/fs/cgroup/job/memory.max"};
  b = divide_memory(64 * kGiB, job, 2, 2);
  CHECK(b.from_cgroup);
  CHECK(b.bytes == static_cast<size_t>(0.9 * 12 * kGiB));
  CHECK(b.explanation ==
        "memory budget: 10.80 GiB per rank = 90% of cgroup v2 memory.max 24.00 GiB "
        "(/sys/fs/cgroup/job/memory.max) / 2 ranks on this node under it");
  // Each rank in a cgroup of its own: the limit is not divided.
  b = divide_memory(64 * kGiB, job, 4, 1);
  CHECK(b.bytes == static_cast<size_t>(0.9 * 16 * kGiB));  // RAM / 4 = 16 < 24
  CHECK_FALSE(b.from_cgroup);
  CHECK_THAT(b.explanation, ContainsSubstring("allows more"));
  // Nothing known: no budget.
  b = divide_memory(0, std::nullopt, 2, 2);
  CHECK(b.bytes == 0);
  CHECK_THAT(b.explanation, ContainsSubstring("unknown"));
}

TEST_CASE("memory budget: the device limits on cpu share one budget; explicit limits win") {
  const MemoryBudget b = divide_memory(20 * kGiB, std::nullopt, 2, 2);  // 9 GiB per rank
  std::vector<std::string> warnings;
  // Defaults: device and host unbounded alone, bounded together by the budget.
  zero::DeviceOptions o = device_options(zero::DeviceKind::cpu, 0, 0, b, &warnings);
  CHECK(o.memory_limit == 0);
  CHECK(o.host_memory_limit == 0);
  CHECK(o.shared_memory_limit == b.bytes);
  CHECK(warnings.empty());
  // A small emulated device: its own limit, and the budget over both.
  o = device_options(zero::DeviceKind::cpu, 64 << 20, 0, b, &warnings);
  CHECK(o.memory_limit == (64u << 20));
  CHECK(o.shared_memory_limit == b.bytes);
  CHECK(warnings.empty());
  // A limit past the budget wins, with a warning.
  o = device_options(zero::DeviceKind::cpu, 32 * kGiB, 0, b, &warnings);
  CHECK(o.memory_limit == 32 * kGiB);
  CHECK(o.shared_memory_limit == 32 * kGiB);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], ContainsSubstring("zero_train.device_memory_limit 32.00 GiB is more than"));
  CHECK_THAT(warnings[0], ContainsSubstring("OOM killer"));
  // Two limits each within the budget but not together.
  warnings.clear();
  o = device_options(zero::DeviceKind::cpu, 6 * kGiB, 6 * kGiB, b, &warnings);
  CHECK(o.shared_memory_limit == 12 * kGiB);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], ContainsSubstring("same RAM"));
  // cuda: the GPU's memory for the device, the budget for the host.
  warnings.clear();
  o = device_options(zero::DeviceKind::cuda, 0, 0, b, &warnings);
  CHECK(o.memory_limit == 0);
  CHECK(o.host_memory_limit == b.bytes);
  CHECK(o.shared_memory_limit == 0);
  o = device_options(zero::DeviceKind::cuda, 0, 16 * kGiB, b, &warnings);
  CHECK(o.host_memory_limit == 16 * kGiB);
  CHECK(warnings.size() == 1);
  // No budget known: nothing is bounded by it.
  o = device_options(zero::DeviceKind::cpu, 0, 0, divide_memory(0, std::nullopt, 1, 1), nullptr);
  CHECK(o.shared_memory_limit == 0);
}
