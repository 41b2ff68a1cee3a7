// The cpu device: allocation through the ledger, the capacity and its out-of-memory error,
// host buffers, stream-ordered copies.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <sys/resource.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/device.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::MemCategory;
using zero::MemSpace;

TEST_CASE("device: cpu allocations are counted by category and given back") {
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  CHECK(dev->name() == "cpu:0");
  CHECK(dev->capacity() == zero::kUnlimited);
  {
    zero::Buffer p = dev->allocate(1000, MemCategory::parameters);
    zero::Buffer m = dev->allocate_host(64, MemCategory::master_weights);
    REQUIRE(p.data() != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p.data()) % 64 == 0);
    CHECK(reinterpret_cast<uintptr_t>(m.data()) % 4096 == 0);  // host buffers are page-aligned
    CHECK(p.space() == MemSpace::device);
    CHECK(m.space() == MemSpace::host);
    CHECK(dev->ledger().current(MemSpace::device, MemCategory::parameters) == 1000);
    CHECK(dev->ledger().current(MemSpace::host, MemCategory::master_weights) == 64);
    std::memset(p.data(), 0xab, p.bytes());  // the memory is really there
    zero::Buffer moved = std::move(p);
    CHECK(p.data() == nullptr);
    CHECK(moved.bytes() == 1000);
    CHECK(dev->ledger().current(MemSpace::device) == 1000);  // a move is not a second allocation
  }
  CHECK(dev->ledger().current(MemSpace::device) == 0);
  CHECK(dev->ledger().current(MemSpace::host) == 0);
  CHECK(dev->ledger().snapshot().total[0].peak == 1000);
}

TEST_CASE("device: zero-byte allocations are valid and empty") {
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  zero::Buffer b = dev->allocate(0, MemCategory::other);
  CHECK(b);
  CHECK(b.data() == nullptr);
  CHECK(b.bytes() == 0);
}

TEST_CASE("device: an allocation past the cpu limit fails with the ledger table") {
  zero::DeviceOptions opt;
  opt.memory_limit = 1 << 20;  // 1 MiB device
  auto dev = zero::make_device(zero::DeviceKind::cpu, 0, opt);
  CHECK(dev->capacity() == (1u << 20));
  zero::Buffer params = dev->allocate(600 << 10, MemCategory::parameters);
  try {
    zero::Buffer states = dev->allocate(512 << 10, MemCategory::optimizer_states);
    FAIL("allocation past the limit succeeded");
  } catch (const zero::OutOfMemory& e) {
    const std::string w = e.what();
    CHECK_THAT(w, ContainsSubstring("out of device memory on cpu:0"));
    CHECK_THAT(w, ContainsSubstring("cannot allocate 512.00 KiB of optimizer states"));
    CHECK_THAT(w, ContainsSubstring("in use 600.00 KiB of 1.00 MiB"));
    CHECK_THAT(w, ContainsSubstring("memory ledger of cpu:0"));
    CHECK_THAT(w, ContainsSubstring("HINT:"));
    // The table row of parameters shows what holds the memory.
    CHECK_THAT(w, ContainsSubstring("parameters"));
    CHECK(e.snapshot().at(MemSpace::device, MemCategory::parameters).current == 600u << 10);
  }
  // The refused allocation left no trace; what still fits can be allocated.
  CHECK(dev->ledger().current(MemSpace::device) == 600u << 10);
  zero::Buffer rest = dev->allocate((1 << 20) - (600 << 10), MemCategory::gradients);
  CHECK(dev->ledger().current(MemSpace::device) == 1u << 20);
  // Host memory has its own (here unlimited) capacity.
  zero::Buffer host = dev->allocate_host(4 << 20, MemCategory::optimizer_states, false);
  CHECK(host.bytes() == 4u << 20);
}

TEST_CASE("device: host memory limit") {
  zero::DeviceOptions opt;
  opt.host_memory_limit = 4096;
  auto dev = zero::make_device(zero::DeviceKind::cpu, 0, opt);
  zero::Buffer a = dev->allocate_host(4096, MemCategory::pinned_host);
  CHECK_THROWS_AS(dev->allocate_host(1, MemCategory::pinned_host), zero::OutOfMemory);
  CHECK_THROWS_WITH(dev->allocate_host(1, MemCategory::pinned_host),
                    ContainsSubstring("out of host memory on cpu:0"));
}

TEST_CASE("device: the cpu device's shared limit bounds device and host memory together") {
  zero::DeviceOptions opt;
  opt.shared_memory_limit = 1 << 20;  // device and host are the same RAM: one budget of 1 MiB
  auto dev = zero::make_device(zero::DeviceKind::cpu, 0, opt);
  CHECK(dev->capacity() == zero::kUnlimited);
  CHECK(dev->ledger().shared_capacity() == (1u << 20));
  zero::Buffer params = dev->allocate(768 << 10, MemCategory::parameters);
  try {
    zero::Buffer states = dev->allocate_host(512 << 10, MemCategory::optimizer_states, false);
    FAIL("host memory past the shared limit was allocated");
  } catch (const zero::OutOfMemory& e) {
    const std::string w = e.what();
    CHECK_THAT(w, ContainsSubstring("out of host memory on cpu:0"));
    CHECK_THAT(w, ContainsSubstring("in use 768.00 KiB of the 1.00 MiB that device and host memory share"));
    CHECK_THAT(w, ContainsSubstring("offloading makes no room"));
    CHECK_THAT(w, ContainsSubstring("shared capacity"));
  }
  zero::Buffer rest = dev->allocate_host(256 << 10, MemCategory::optimizer_states, false);
  CHECK_THROWS_AS(dev->allocate(1, MemCategory::other), zero::OutOfMemory);
}

TEST_CASE("device: stream-ordered copy and fill on the cpu device") {
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  auto stream = dev->create_stream("copy");
  const size_t n = 1 << 16;
  zero::Buffer src = dev->allocate_host(n * 4, MemCategory::other, false);
  zero::Buffer dst = dev->allocate(n * 4, MemCategory::other);
  for (size_t i = 0; i < n; ++i) src.as<uint32_t>()[i] = static_cast<uint32_t>(i * 2654435761u);
  dev->fill_async(dst.data(), 0, dst.bytes(), *stream);
  dev->copy_async(dst.data(), src.data(), n * 4 / 2, *stream);  // first half only
  stream->synchronize();
  for (size_t i = 0; i < n / 2; ++i) REQUIRE(dst.as<uint32_t>()[i] == src.as<uint32_t>()[i]);
  for (size_t i = n / 2; i < n; ++i) REQUIRE(dst.as<uint32_t>()[i] == 0);
}

TEST_CASE("device: asking for cuda without a GPU is a clear error") {
  if (zero::cuda_device_count() > 0) SUCCEED("a GPU is present; covered by cuda_device_test");
  else
    CHECK_THROWS_WITH(zero::make_device(zero::DeviceKind::cuda),
                      ContainsSubstring("cuda") && ContainsSubstring("HINT"));
}

namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Allocates `bytes` of activations on dev, writes every page, frees it; returns the minor page
// faults that took (the pages the kernel had to hand out afresh).
long faults_of_one_use(zero::Device& dev, size_t bytes) {
  const long before = minor_faults();
  {
    zero::Buffer b = dev.allocate(bytes, MemCategory::activations);
    std::memset(b.data(), 1, bytes);
    CHECK(dev.ledger().current(MemSpace::device, MemCategory::activations) == bytes);
  }
  CHECK(dev.ledger().current(MemSpace::device, MemCategory::activations) == 0);
  return minor_faults() - before;
}

}  // namespace

TEST_CASE("device: the cpu device reuses freed memory instead of faulting in fresh pages") {
  // Sizes a training step allocates every time: 1, 12 and 40 MiB (the device's block cache;
  // glibc alone maps 40 MiB afresh each time, and does not reuse a freed 12 MiB aligned block
  // that is not at the top of its heap). The second use of each must touch pages already there:
  // under 1% of its pages may fault (the allowance is for the test's own bookkeeping), where the
  // first use faults nearly all of them.
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  for (size_t mib : {1, 12, 40}) {
    INFO(mib << " MiB");
    const size_t bytes = mib << 20;
    const long pages = long(bytes / 4096);
    faults_of_one_use(*dev, bytes);
    CHECK(faults_of_one_use(*dev, bytes) < pages / 100 + 8);
  }
  // The ledger counts live buffers only: the cached block is not in it.
  CHECK(dev->ledger().current(MemSpace::device) == 0);
}

TEST_CASE("device: a memory-limited cpu device caches at most an eighth of its limit") {
  // With a 64 MiB limit the cache holds at most 8 MiB, so a freed 40 MiB block is given back to
  // the system and its next use faults its pages in again (at least 90% of them).
  zero::DeviceOptions opt;
  opt.memory_limit = size_t{64} << 20;
  auto dev = zero::make_device(zero::DeviceKind::cpu, 0, opt);
  const size_t bytes = size_t{40} << 20;
  faults_of_one_use(*dev, bytes);
  CHECK(faults_of_one_use(*dev, bytes) > long(bytes / 4096) * 9 / 10);
}
