// The cuda device on a real GPU: capacity, allocation through the ledger, an artificial limit,
// memory taken outside the ledger (before the device opened, and by libraries after), pinned host
// memory, copies. Without a GPU every case reports Skipped.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/cuda/outside_ledger.hpp"
#include "core/device.hpp"
#include "tests/cuda_support.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::MemCategory;
using zero::MemSpace;

#define REQUIRE_GPU() \
  if (zero::cuda_device_count() == 0) SKIP("no CUDA device")

TEST_CASE("cuda device: capacity is the GPU's memory and allocations are counted") {
  REQUIRE_GPU();
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  CHECK_THAT(dev->name(), ContainsSubstring("cuda:0 ("));
  CHECK(dev->capacity() > (1ull << 30));
  CHECK(dev->supports_bf16());
  {
    zero::Buffer b = dev->allocate(256 << 20, MemCategory::parameters);
    CHECK(b.data() != nullptr);
    CHECK(dev->ledger().current(MemSpace::device, MemCategory::parameters) == 256u << 20);
  }
  CHECK(dev->ledger().current(MemSpace::device) == 0);
}

TEST_CASE("cuda device: a memory limit below the GPU's (the 32 GiB profile) is enforced") {
  REQUIRE_GPU();
  zero::DeviceOptions opt;
  opt.memory_limit = 64 << 20;
  auto dev = zero::make_device(zero::DeviceKind::cuda, 0, opt);
  CHECK(dev->capacity() == (64u << 20));
  zero::Buffer a = dev->allocate(48 << 20, MemCategory::optimizer_states);
  CHECK_THROWS_WITH(dev->allocate(32 << 20, MemCategory::gradients),
                    ContainsSubstring("out of device memory on cuda:0") &&
                        ContainsSubstring("memory ledger of cuda:0"));
}

TEST_CASE("cuda device: capacity is the memory free once the context exists, not the GPU's total") {
  REQUIRE_GPU();
  // Memory held before the device opens (here 256 MiB of raw cudaMalloc; in a run, the CUDA
  // context, another process, a library) is not the ledger's to hand out.
  const zero::test::DeviceBuffer held(256u << 20);
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  size_t free_bytes = 0, total_bytes = 0;
  ZERO_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  CHECK(dev->capacity() <= total_bytes - held.bytes());
  CHECK(dev->capacity() == free_bytes);  // nothing was allocated since the device opened
  // A limit above the free memory is clamped to it.
  zero::DeviceOptions opt;
  opt.memory_limit = total_bytes;
  CHECK(zero::make_device(zero::DeviceKind::cuda, 0, opt)->capacity() <= free_bytes);
}

TEST_CASE("cuda device: memory a library takes outside the ledger lowers the capacity") {
  REQUIRE_GPU();
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  const size_t before = dev->capacity();
  CHECK(dev->outside_ledger_report().empty());
  void* lib = nullptr;  // stands for a library's own allocation (NCCL's buffers, cuBLAS's handle)
  const size_t taken = zero::cuda::count_outside_ledger(
      *dev, "a test library", [&] { ZERO_CHECK_CUDA(cudaMalloc(&lib, 96u << 20)); });
  CHECK(taken >= (96u << 20));  // a GPU may round up to its allocation granularity
  CHECK(dev->capacity() == before - taken);
  CHECK_THAT(dev->outside_ledger_report(), ContainsSubstring("a test library"));
  // The out-of-memory error says where the rest of the GPU went.
  CHECK_THROWS_WITH(dev->allocate(before - taken + 1, MemCategory::parameters),
                    ContainsSubstring("out of device memory on cuda:0") &&
                        ContainsSubstring("outside the ledger") &&
                        ContainsSubstring("a test library"));
  // With a limit well below the free memory the limit stays the capacity.
  zero::DeviceOptions opt;
  opt.memory_limit = 64u << 20;
  auto small = zero::make_device(zero::DeviceKind::cuda, 0, opt);
  zero::cuda::count_outside_ledger(*small, "nothing", [] {});
  CHECK(small->capacity() == (64u << 20));
  ZERO_CHECK_CUDA(cudaFree(lib));
}

TEST_CASE("cuda device: pinned host <-> device round trip on a stream") {
  REQUIRE_GPU();
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  auto stream = dev->create_stream("copy");
  const size_t n = 1 << 20;
  zero::Buffer host = dev->allocate_host(n * 4, MemCategory::pinned_host);
  zero::Buffer back = dev->allocate_host(n * 4, MemCategory::pinned_host);
  zero::Buffer gpu = dev->allocate(n * 4, MemCategory::other);
  CHECK(host.pinned());
  for (size_t i = 0; i < n; ++i) host.as<uint32_t>()[i] = static_cast<uint32_t>(i * 2654435761u);
  dev->fill_async(back.data(), 0xff, back.bytes(), *stream);
  dev->copy_async(gpu.data(), host.data(), n * 4, *stream);
  dev->copy_async(back.data(), gpu.data(), n * 4, *stream);
  stream->synchronize();
  for (size_t i = 0; i < n; ++i) REQUIRE(back.as<uint32_t>()[i] == host.as<uint32_t>()[i]);
  CHECK(dev->ledger().current(MemSpace::host, MemCategory::pinned_host) == 2 * n * 4);
}
