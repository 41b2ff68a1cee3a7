// HostMemory on a real GPU (offload/host_memory.hpp): pinned means cudaHostAlloc'd (the driver
// knows the pages), pageable means plain memory, both in the ledger's host column, and a pin the
// driver refuses is reported as the policy says. Without a GPU every case reports Skipped.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "offload/host_memory.hpp"
#include "core/cuda/checks.hpp"
#include "core/error.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::MemCategory;
using zero::MemSpace;
using zero::offload::HostBuffer;
using zero::offload::HostMemory;
using zero::offload::HostMemoryOptions;
using zero::offload::PinPolicy;

#define REQUIRE_GPU() \
  if (zero::cuda_device_count() == 0) SKIP("no CUDA device")

namespace {

cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes attr{};
  ZERO_CHECK_CUDA(cudaPointerGetAttributes(&attr, p));
  return attr.type;
}

}  // namespace

TEST_CASE("cuda host memory: pinned buffers are the driver's, pageable ones are not") {
  REQUIRE_GPU();
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  HostMemory pinned(*dev);
  HostMemoryOptions off;
  off.pin = PinPolicy::off;
  HostMemory pageable(*dev, off);
  HostBuffer a = pinned.allocate(8 << 20, MemCategory::optimizer_states);
  HostBuffer b = pageable.allocate(1 << 20, MemCategory::master_weights);
  CHECK(a.pinned());
  CHECK_FALSE(b.pinned());
  CHECK(memory_type(a.data()) == cudaMemoryTypeHost);
  CHECK(memory_type(b.data()) == cudaMemoryTypeUnregistered);
  CHECK(dev->ledger().current(MemSpace::host, MemCategory::optimizer_states) == 8u << 20);
  CHECK(dev->ledger().current(MemSpace::host, MemCategory::master_weights) == 1u << 20);
  CHECK(dev->ledger().current(MemSpace::device) == 0);
  CHECK(pinned.pinned_bytes() == 8u << 20);
  CHECK(pageable.unpinned_bytes() == 1u << 20);
}

// 1 PiB is past any x86-64 address space: cudaHostAlloc refuses it, and so does malloc.
TEST_CASE("cuda host memory: a refused cudaHostAlloc is an error under required, a warning "
          "under preferred") {
  REQUIRE_GPU();
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  constexpr size_t kHuge = size_t{1} << 50;
  HostMemoryOptions strict;
  strict.pin = PinPolicy::required;
  HostMemory required(*dev, strict);
  try {
    (void)required.allocate(kHuge, MemCategory::optimizer_states);
    FAIL("pinning 1 PiB succeeded");
  } catch (const zero::OutOfMemory& e) {
    FAIL(std::string("expected the pinning error, got OutOfMemory: ") + e.what());
  } catch (const zero::Error& e) {
    CHECK_THAT(std::string(e.what()),
               ContainsSubstring("pinning 1.00 PiB of host memory for optimizer states "
                                 "failed on cuda:0") &&
                   ContainsSubstring("cudaHostAlloc refused it") &&
                   ContainsSubstring("RLIMIT_MEMLOCK") && ContainsSubstring("HINT"));
  }
  std::vector<std::string> warnings;
  HostMemoryOptions lenient;
  lenient.on_warning = [&](const std::string& line) { warnings.push_back(line); };
  HostMemory preferred(*dev, lenient);
  // The fallback to pageable memory is refused too: the ledger's error, after one warning.
  CHECK_THROWS_AS(preferred.allocate(kHuge, MemCategory::optimizer_states), zero::OutOfMemory);
  CHECK(warnings.size() == 1);
  CHECK(dev->ledger().current(MemSpace::host) == 0);
  // Ordinary sizes still pin afterwards.
  HostBuffer small = preferred.allocate(1 << 20, MemCategory::gradients);
  CHECK(small.pinned());
}
