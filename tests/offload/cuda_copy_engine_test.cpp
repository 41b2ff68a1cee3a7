// The copy engine on a real GPU (offload/copy_engine.hpp): the same contract as
// copy_engine_test.cpp with cudaMemcpyAsync under it. Round trips of odd sizes through device
// memory, pinned (DMA) and pageable (staged) host sides; a copy ordered after an event that
// completes later; byte counters. Without a GPU every case reports Skipped.
#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "offload/copy_engine.hpp"

using zero::MemCategory;
using zero::MemSpace;
using zero::offload::CopyEngine;
using zero::offload::CopyEngineOptions;
using zero::offload::CopyHandle;
using zero::offload::HostBuffer;
using zero::offload::HostMemory;
using zero::offload::HostPinning;

#define REQUIRE_GPU() \
  if (zero::cuda_device_count() == 0) SKIP("no CUDA device")

namespace {

void fill_pattern(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 13);
}

bool equal_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

}  // namespace

TEST_CASE("cuda copy engine: interleaved round trips of odd sizes, pinned and staged") {
  REQUIRE_GPU();
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  HostMemory host(*dev);
  constexpr size_t kChunk = (64 << 10) + 3;
  CopyEngine engine(*dev, host, CopyEngineOptions{kChunk});
  REQUIRE(engine.staging());
  CHECK(dev->ledger().current(MemSpace::host, MemCategory::comm_buffers) == 4 * kChunk);
  std::mt19937 rng(7);
  constexpr size_t kJobs = 64;
  std::vector<size_t> bytes(kJobs);
  std::vector<std::vector<uint8_t>> pageable_src(kJobs), pageable_dst(kJobs);
  std::vector<HostBuffer> pinned_src(kJobs), pinned_dst(kJobs);
  std::vector<zero::Buffer> device(kJobs);
  std::vector<CopyHandle> up(kJobs), down(kJobs);
  size_t total = 0;
  for (size_t j = 0; j < kJobs; ++j) {
    bytes[j] = j % 13 == 0 ? 0 : std::uniform_int_distribution<size_t>(1, 600'000)(rng) | 1;
    total += bytes[j];
    device[j] = dev->allocate(bytes[j], MemCategory::gradients);
    pinned_src[j] = host.allocate(bytes[j], MemCategory::parameters);
    pinned_dst[j] = host.allocate(bytes[j], MemCategory::gradients);
    pageable_src[j].resize(bytes[j]);
    pageable_dst[j].assign(bytes[j], 0);
    uint8_t* src = j % 2 ? pinned_src[j].as<uint8_t>() : pageable_src[j].data();
    if (bytes[j]) fill_pattern(src, bytes[j], static_cast<uint32_t>(j));
    if (bytes[j]) std::memset(pinned_dst[j].data(), 0, bytes[j]);
  }
  for (size_t j = 0; j < kJobs + 2; ++j) {
    if (j < kJobs)
      up[j] = j % 2 ? engine.to_device(device[j].data(), pinned_src[j], 0, bytes[j])
                    : engine.to_device(device[j].data(), pageable_src[j].data(), bytes[j],
                                       HostPinning::pageable);
    if (j >= 2) {
      const size_t k = j - 2;
      zero::Event* after = &up[k].event();
      down[k] = k % 3 ? engine.to_host(pinned_dst[k], 0, device[k].data(), bytes[k], after)
                      : engine.to_host(pageable_dst[k].data(), device[k].data(), bytes[k],
                                       HostPinning::pageable, after);
    }
  }
  for (size_t j = 0; j < kJobs; ++j) {
    down[j].wait();
    up[j].wait();
  }
  for (size_t j = 0; j < kJobs; ++j) {
    CAPTURE(j, bytes[j]);
    const uint8_t* src = j % 2 ? pinned_src[j].as<uint8_t>() : pageable_src[j].data();
    const uint8_t* dst = j % 3 ? pinned_dst[j].as<uint8_t>() : pageable_dst[j].data();
    REQUIRE(equal_bytes(dst, src, bytes[j]));
  }
  CHECK(engine.counters().to_host_bytes == total);
  CHECK(engine.counters().to_device_bytes == total);
  CHECK(engine.counters().staged_chunks > 0);
}

// The source is written by stream work that completes ~20 ms after the copy was issued: a host
// task that sleeps, then writes the host source (H2D) or a device fill (D2H).
TEST_CASE("cuda copy engine: a copy waits for an event that completes later") {
  REQUIRE_GPU();
  auto dev = zero::make_device(zero::DeviceKind::cuda);
  HostMemory host(*dev);
  CopyEngine engine(*dev, host, CopyEngineOptions{1 << 20});
  auto producer = dev->create_stream("producer");
  auto ready = dev->create_event();
  constexpr size_t kBytes = (5 << 20) + 77;
  std::vector<uint8_t> expect(kBytes);
  fill_pattern(expect.data(), kBytes, 3);
  zero::Buffer device = dev->allocate(kBytes, MemCategory::parameters);
  for (HostPinning pin : {HostPinning::pinned, HostPinning::pageable}) {
    CAPTURE(pin == HostPinning::pinned);
    HostBuffer pinned = host.allocate(kBytes, MemCategory::parameters);
    std::vector<uint8_t> pageable(kBytes);
    uint8_t* h = pin == HostPinning::pinned ? pinned.as<uint8_t>() : pageable.data();

    std::memset(h, 0, kBytes);
    dev->fill_async(device.data(), 0xff, kBytes, *producer);
    producer->launch_host([h, &expect] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::memcpy(h, expect.data(), kBytes);
    });
    producer->record(*ready);
    CopyHandle up = engine.to_device(device.data(), h, kBytes, pin, ready.get());
    std::vector<uint8_t> back(kBytes, 0);
    CopyHandle down =
        engine.to_host(back.data(), device.data(), kBytes, HostPinning::pageable, &up.event());
    down.wait();
    producer->synchronize();
    REQUIRE(equal_bytes(back.data(), expect.data(), kBytes));

    std::memset(h, 0, kBytes);
    producer->launch_host([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
    dev->fill_async(device.data(), 0x5a, kBytes, *producer);
    producer->record(*ready);
    CopyHandle d2h = engine.to_host(h, device.data(), kBytes, pin, ready.get());
    d2h.wait();
    producer->synchronize();
    std::vector<uint8_t> fives(kBytes, 0x5a);
    REQUIRE(equal_bytes(h, fives.data(), kBytes));
  }
}
