// The copy engine on the cpu device (offload/copy_engine.hpp): round trips of many interleaved
// copies of odd sizes, ordering after an event that completes later, staging through the pinned
// buffers for pageable host memory (sizes around the chunk), byte counters, and errors.
//
// On the cpu backend "device" memory is host memory and each copy is a memcpy on a stream's
// worker thread, so every ordering the engine promises is a real cross-thread hand-off here: a
// missing wait shows up as wrong bytes. Orderings are forced with gates (a task blocks until the
// test opens it), never by sleeping.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "offload/copy_engine.hpp"
#include "core/error.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::MemCategory;
using zero::MemSpace;
using zero::offload::CopyEngine;
using zero::offload::CopyEngineOptions;
using zero::offload::CopyHandle;
using zero::offload::HostBuffer;
using zero::offload::HostMemory;
using zero::offload::HostPinning;

namespace {

// A task that blocks its stream until the test opens the gate; opens at the latest when
// destroyed, so a failed REQUIRE never leaves a stream blocked. Declare it after the engine.
class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() { open(); }
  void open() {
    if (!opened_) {
      opened_ = true;
      latch_->count_down();
    }
  }
  std::function<void()> pass() const {
    return [l = latch_] { l->wait(); };
  }

 private:
  std::shared_ptr<std::latch> latch_ = std::make_shared<std::latch>(1);
  bool opened_ = false;
};

// A cpu device, its HostMemory and a CopyEngine with the given staging chunk (members in that
// order: each is built from the ones before it).
struct Setup {
  explicit Setup(size_t chunk, zero::offload::PinPolicy pin = zero::offload::PinPolicy::preferred)
      : host(*dev, options(pin)), engine(*dev, host, CopyEngineOptions{chunk}) {}
  static zero::offload::HostMemoryOptions options(zero::offload::PinPolicy pin) {
    zero::offload::HostMemoryOptions o;
    o.pin = pin;
    // Under a low RLIMIT_MEMLOCK test buffers fall back to pageable memory: counted, not printed.
    o.on_warning = [](const std::string&) {};
    return o;
  }
  std::unique_ptr<zero::Device> dev = zero::make_device(zero::DeviceKind::cpu);
  HostMemory host;
  CopyEngine engine;
};

void fill_pattern(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 13);
}

bool equal_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

size_t chunks_of(size_t bytes, size_t chunk) { return (bytes + chunk - 1) / chunk; }

// Staging needs its four buffers pinned; where the locked-memory limit refuses even those, the
// cases about staging cannot run (host_memory_test.cpp covers the fallback itself).
constexpr const char* kNoStaging =
    "the staging buffers could not be pinned (RLIMIT_MEMLOCK too low for 4 chunks)";

}  // namespace

// Proves: copies in both directions, interleaved, pinned and pageable, of odd sizes, issued
// without waiting in between, all arrive exactly; each D2H is ordered after the H2D it depends on
// through that copy's event; pageable ones are staged in ceil(bytes / chunk) chunks.
TEST_CASE("copy engine: many interleaved round trips of odd sizes are exact") {
  constexpr size_t kChunk = 3000;  // deliberately not a page or power of two
  Setup s(kChunk);
  if (!s.engine.staging()) SKIP(kNoStaging);
  std::mt19937 rng(42);
  struct Job {
    std::vector<uint8_t> pageable_src, pageable_dst;
    HostBuffer pinned_src, pinned_dst;
    zero::Buffer device;
    size_t bytes = 0;
    bool src_pinned = false, dst_pinned = false;  // the host side is a HostBuffer
    CopyHandle up, down;
  };
  std::vector<Job> jobs(150);
  for (size_t j = 0; j < jobs.size(); ++j) {
    Job& job = jobs[j];
    job.bytes = j % 17 == 0 ? 0 : std::uniform_int_distribution<size_t>(1, 20'000)(rng) | 1;
    job.src_pinned = j % 3 == 0;
    job.dst_pinned = j % 4 == 1;
    job.device = s.dev->allocate(job.bytes, MemCategory::gradients);
    if (job.src_pinned) job.pinned_src = s.host.allocate(job.bytes, MemCategory::parameters);
    else job.pageable_src.resize(job.bytes);
    if (job.dst_pinned) job.pinned_dst = s.host.allocate(job.bytes, MemCategory::gradients);
    else job.pageable_dst.assign(job.bytes, 0xee);
    uint8_t* src = job.src_pinned ? job.pinned_src.as<uint8_t>() : job.pageable_src.data();
    if (job.bytes) fill_pattern(src, job.bytes, static_cast<uint32_t>(j));
    if (job.dst_pinned && job.bytes) std::memset(job.pinned_dst.data(), 0xee, job.bytes);
  }
  // Issue order interleaves directions: the up-copy of job j, then the down-copy of job j - 3.
  auto up = [&](Job& job) {
    job.up = job.src_pinned
                 ? s.engine.to_device(job.device.data(), job.pinned_src, 0, job.bytes)
                 : s.engine.to_device(job.device.data(), job.pageable_src.data(), job.bytes,
                                      HostPinning::pageable);
  };
  auto down = [&](Job& job) {
    zero::Event* after = &job.up.event();  // the device buffer holds the data once this is done
    job.down = job.dst_pinned
                   ? s.engine.to_host(job.pinned_dst, 0, job.device.data(), job.bytes, after)
                   : s.engine.to_host(job.pageable_dst.data(), job.device.data(), job.bytes,
                                      HostPinning::pageable, after);
  };
  for (size_t j = 0; j < jobs.size() + 3; ++j) {
    if (j < jobs.size()) up(jobs[j]);
    if (j >= 3) down(jobs[j - 3]);
  }
  // Everything lands before anything is checked, so a failed REQUIRE frees no buffer that a
  // copy still uses.
  for (Job& job : jobs) {
    job.down.wait();
    job.up.wait();
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    Job& job = jobs[j];
    CAPTURE(j, job.bytes, job.src_pinned, job.dst_pinned);
    const uint8_t* src = job.src_pinned ? job.pinned_src.as<uint8_t>() : job.pageable_src.data();
    const uint8_t* dst = job.dst_pinned ? job.pinned_dst.as<uint8_t>() : job.pageable_dst.data();
    REQUIRE(equal_bytes(dst, src, job.bytes));
    CHECK(job.up.bytes() == job.bytes);
    // A HostBuffer is staged only if it could not be pinned (a low RLIMIT_MEMLOCK).
    const size_t staged_chunks = job.bytes == 0 ? 0 : chunks_of(job.bytes, kChunk);
    CHECK(job.up.chunks() == (job.src_pinned && job.pinned_src.pinned() ? 0 : staged_chunks));
    CHECK(job.down.chunks() == (job.dst_pinned && job.pinned_dst.pinned() ? 0 : staged_chunks));
  }
}

// Proves: a copy does not read its source before `after` completes, in both directions, direct
// and staged: the source is written by a task held at a gate, and the copy cannot finish (nor see
// the old bytes) until the gate opens.
TEST_CASE("copy engine: a copy starts only after its event, which completes later") {
  constexpr size_t kChunk = 4096;
  constexpr size_t kBytes = 5 * kChunk + 123;
  Setup s(kChunk);
  auto producer = s.dev->create_stream("producer");
  for (HostPinning pin : {HostPinning::pinned, HostPinning::pageable}) {
    CAPTURE(pin == HostPinning::pinned);
    HostBuffer pinned = s.host.allocate(kBytes, MemCategory::parameters);
    std::vector<uint8_t> pageable(kBytes);
    uint8_t* host = pin == HostPinning::pinned ? pinned.as<uint8_t>() : pageable.data();
    zero::Buffer device = s.dev->allocate(kBytes, MemCategory::parameters);
    std::vector<uint8_t> expect(kBytes);
    fill_pattern(expect.data(), kBytes, 7);
    auto ready = s.dev->create_event();

    // H2D: the host source is written by the producer after the gate opens.
    std::memset(host, 0, kBytes);
    std::memset(device.data(), 0xff, kBytes);
    {
      Gate gate;
      producer->launch_host(gate.pass());
      producer->launch_host([host, &expect] { std::memcpy(host, expect.data(), kBytes); });
      producer->record(*ready);
      CopyHandle h = s.engine.to_device(device.data(), host, kBytes, pin, ready.get());
      CHECK_FALSE(h.done());
      CHECK(static_cast<const uint8_t*>(device.data())[0] == 0xff);  // nothing copied yet
      gate.open();
      h.wait();
      producer->synchronize();  // nothing may still write `host` when a REQUIRE leaves the scope
      REQUIRE(equal_bytes(device.data(), expect.data(), kBytes));
    }

    // D2H: the device source is written by the producer after the gate opens.
    std::memset(host, 0, kBytes);
    std::memset(device.data(), 0, kBytes);
    fill_pattern(expect.data(), kBytes, 99);
    {
      Gate gate;
      producer->launch_host(gate.pass());
      producer->launch_host(
          [d = device.data(), &expect] { std::memcpy(d, expect.data(), kBytes); });
      producer->record(*ready);
      CopyHandle h = s.engine.to_host(host, device.data(), kBytes, pin, ready.get());
      CHECK_FALSE(h.done());
      gate.open();
      h.wait();
      producer->synchronize();
      REQUIRE(equal_bytes(host, expect.data(), kBytes));
    }
  }
}

// Proves: staging moves exactly the bytes for sizes below, at, around and far above the chunk
// size; its four buffers are counted once as comm_buffers in the host column and given back with
// the engine; back-to-back staged copies reuse the two buffers without corrupting each other.
TEST_CASE("copy engine: staging pageable host memory through pinned chunks") {
  constexpr size_t kChunk = 4096;
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  HostMemory host(*dev);
  {
    CopyEngine engine(*dev, host, CopyEngineOptions{kChunk});
    if (!engine.staging()) SKIP(kNoStaging);
    CHECK(engine.staging_chunk_bytes() == kChunk);
    CHECK(dev->ledger().current(MemSpace::host, MemCategory::comm_buffers) == 4 * kChunk);
    CHECK(host.pinned_bytes() == 4 * kChunk);

    const std::vector<size_t> sizes = {1, kChunk - 1, kChunk, kChunk + 1, 2 * kChunk,
                                       3 * kChunk + 17, 10 * kChunk, 37 * kChunk + 4095};
    std::vector<std::vector<uint8_t>> src, back;
    std::vector<zero::Buffer> device;
    std::vector<CopyHandle> ups, downs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      src.emplace_back(sizes[i]);
      fill_pattern(src.back().data(), sizes[i], static_cast<uint32_t>(1000 + i));
      back.emplace_back(sizes[i], 0);
      device.push_back(dev->allocate(sizes[i], MemCategory::other));
    }
    // Every upload first, then every download: staged copies queue behind each other.
    for (size_t i = 0; i < sizes.size(); ++i)
      ups.push_back(engine.to_device(device[i].data(), src[i].data(), sizes[i],
                                     HostPinning::pageable));
    for (size_t i = 0; i < sizes.size(); ++i)
      downs.push_back(engine.to_host(back[i].data(), device[i].data(), sizes[i],
                                     HostPinning::pageable, &ups[i].event()));
    for (size_t i = 0; i < sizes.size(); ++i) {
      downs[i].wait();
      ups[i].wait();
    }
    size_t chunks = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(sizes[i]);
      REQUIRE(equal_bytes(back[i].data(), src[i].data(), sizes[i]));
      CHECK(ups[i].staged());
      CHECK(ups[i].chunks() == chunks_of(sizes[i], kChunk));
      CHECK(downs[i].chunks() == chunks_of(sizes[i], kChunk));
      chunks += 2 * chunks_of(sizes[i], kChunk);
    }
    CHECK(engine.counters().staged_chunks == chunks);
  }
  CHECK(dev->ledger().current(MemSpace::host, MemCategory::comm_buffers) == 0);
  CHECK(host.pinned_bytes() == 0);
}

// Proves: a staging buffer is refilled only after the device copy out of it has run. The H2D
// copy stream is held at a gate while a staged copy of 8 chunks is issued: the host side may fill
// both buffers, then must stop; were it to go on, chunks 2..7 would overwrite chunks 0 and 1
// before they reach the device. (The sleep only gives a wrong implementation time to run ahead.)
TEST_CASE("copy engine: a staging buffer is not refilled before its chunk has moved on") {
  constexpr size_t kChunk = 4096;
  constexpr size_t kBytes = 8 * kChunk;
  Setup s(kChunk);
  if (!s.engine.staging()) SKIP(kNoStaging);
  std::vector<uint8_t> src(kBytes);
  fill_pattern(src.data(), kBytes, 77);
  zero::Buffer device = s.dev->allocate(kBytes, MemCategory::parameters);
  std::memset(device.data(), 0, kBytes);
  CopyHandle h;
  {
    Gate gate;
    s.engine.h2d_stream().launch_host(gate.pass());
    h = s.engine.to_device(device.data(), src.data(), kBytes, HostPinning::pageable);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(h.done());
    gate.open();
    h.wait();
  }
  CHECK(h.chunks() == 8);
  REQUIRE(equal_bytes(device.data(), src.data(), kBytes));
}

// Proves: the counters add the bytes asked for per direction (a staged copy counts once), count
// zero-byte copies as copies of no bytes, and start again from zero after reset.
TEST_CASE("copy engine: bytes moved per direction, and reset") {
  constexpr size_t kChunk = 1024;
  Setup s(kChunk);
  // The offload step's traffic for n parameters of 16 bits: 2n bytes down (gradients), 2n up.
  constexpr size_t n = 10'000;
  zero::Buffer grads = s.dev->allocate(2 * n, MemCategory::gradients);
  zero::Buffer params = s.dev->allocate(2 * n, MemCategory::parameters);
  std::memset(grads.data(), 3, grads.bytes());
  HostBuffer landing = s.host.allocate(2 * n, MemCategory::gradients);
  std::vector<uint8_t> updated(2 * n, 4);  // pageable: staged in 20 chunks
  CopyHandle d = s.engine.to_host(landing, 0, grads.data(), 2 * n);
  CopyHandle u = s.engine.to_device(params.data(), updated.data(), 2 * n, HostPinning::pageable);
  CopyHandle z = s.engine.to_host(nullptr, nullptr, 0, HostPinning::pinned);
  d.wait();
  u.wait();
  z.wait();
  zero::offload::CopyCounters c = s.engine.counters();
  CHECK(c.to_host_bytes == 2 * n);
  CHECK(c.to_device_bytes == 2 * n);
  CHECK(c.to_host_copies == 2);
  CHECK(c.to_device_copies == 1);
  const size_t staged = chunks_of(2 * n, kChunk) * (landing.pinned() ? 1 : 2);
  CHECK(c.staged_chunks == (s.engine.staging() ? staged : 0));
  CHECK(static_cast<const uint8_t*>(params.data())[2 * n - 1] == 4);
  CHECK(landing.as<uint8_t>()[0] == 3);

  s.engine.reset_counters();
  c = s.engine.counters();
  CHECK(c.to_host_bytes == 0);
  CHECK(c.to_device_bytes == 0);
  CHECK(c.to_host_copies + c.to_device_copies + c.staged_chunks == 0);
  s.engine.to_device(params.data(), landing, 10, 100).wait();
  CHECK(s.engine.counters().to_device_bytes == 100);
  CHECK(s.engine.counters().to_host_bytes == 0);
}

// Proves: a handle's event orders work on another stream (no host wait needed), and an empty
// handle is "nothing to wait for".
TEST_CASE("copy engine: later work waits on a copy from a stream or from the host") {
  Setup s(2048);
  auto consumer = s.dev->create_stream("consumer");
  constexpr size_t kBytes = 50'000;
  zero::Buffer device = s.dev->allocate(kBytes, MemCategory::gradients);
  fill_pattern(device.as<uint8_t>(), kBytes, 5);
  std::vector<uint8_t> expect(device.as<uint8_t>(), device.as<uint8_t>() + kBytes);
  for (HostPinning pin : {HostPinning::pinned, HostPinning::pageable}) {
    HostBuffer pinned = s.host.allocate(kBytes, MemCategory::gradients);
    std::vector<uint8_t> pageable(kBytes, 0);
    uint8_t* dst = pin == HostPinning::pinned ? pinned.as<uint8_t>() : pageable.data();
    if (pin == HostPinning::pinned) std::memset(dst, 0, kBytes);
    bool same = false;  // written by the consumer's task, read after consumer->synchronize()
    {
      Gate gate;  // holds the copy stream, so the consumer really has to wait
      s.engine.d2h_stream().launch_host(gate.pass());
      CopyHandle h = s.engine.to_host(dst, device.data(), kBytes, pin);
      h.order_before(*consumer);
      consumer->launch_host([&] { same = std::memcmp(dst, expect.data(), kBytes) == 0; });
      gate.open();
      consumer->synchronize();
      CHECK(h.done());
    }
    CHECK(same);
  }
  CopyHandle empty;
  CHECK_FALSE(empty);
  CHECK(empty.done());
  empty.wait();                    // nothing to wait for
  empty.order_before(*consumer);   // a no-op
  CHECK_THROWS_WITH(empty.event(), ContainsSubstring("empty handle"));
}

// Proves: null pointers with bytes are refused before anything is queued; zero-byte copies accept
// null pointers and still complete only after `after`; ranges outside a HostBuffer are refused.
TEST_CASE("copy engine: null pointers, zero sizes and out-of-range offsets") {
  Setup s(4096);
  std::vector<uint8_t> a(64), b(64);
  CHECK_THROWS_WITH(s.engine.to_host(nullptr, a.data(), 64, HostPinning::pinned),
                    ContainsSubstring("CopyEngine::to_host: null destination for 64 B"));
  CHECK_THROWS_WITH(s.engine.to_host(a.data(), nullptr, 64, HostPinning::pageable),
                    ContainsSubstring("null source"));
  CHECK_THROWS_WITH(s.engine.to_device(nullptr, a.data(), 1, HostPinning::pageable),
                    ContainsSubstring("CopyEngine::to_device: null destination"));
  CHECK_THROWS_AS(s.engine.to_device(b.data(), nullptr, 1, HostPinning::pinned), zero::Error);
  CHECK(s.engine.counters().to_host_copies + s.engine.counters().to_device_copies == 0);

  auto producer = s.dev->create_stream("producer");
  auto ready = s.dev->create_event();
  {
    Gate gate;
    producer->launch_host(gate.pass());
    producer->record(*ready);
    CopyHandle up = s.engine.to_device(nullptr, nullptr, 0, HostPinning::pageable, ready.get());
    CopyHandle down = s.engine.to_host(nullptr, nullptr, 0, HostPinning::pageable, ready.get());
    CHECK(up);
    CHECK(up.bytes() == 0);
    CHECK_FALSE(up.staged());
    CHECK_FALSE(up.done());  // ordered after `ready`, which waits on the gate
    CHECK_FALSE(down.done());
    gate.open();
    up.wait();
    down.wait();
  }

  HostBuffer hb = s.host.allocate(100, MemCategory::other);
  zero::Buffer dev = s.dev->allocate(100, MemCategory::other);
  CHECK_THROWS_WITH(s.engine.to_device(dev.data(), hb, 50, 51),
                    ContainsSubstring("outside the host buffer of 100 bytes"));
  CHECK_THROWS_WITH(s.engine.to_host(hb, 101, dev.data(), 0),
                    ContainsSubstring("outside the host buffer"));
  CHECK_THROWS_AS(s.engine.to_host(hb, 1, dev.data(), SIZE_MAX), zero::Error);
  s.engine.to_host(hb, 100, dev.data(), 0).wait();  // an empty range at the end is fine
}

// Proves: an error on the stream that `after` was recorded on reaches the copy's waiter
// (stream.hpp's error model), instead of the copy silently going ahead.
TEST_CASE("copy engine: a failed producer's error reaches the copy's waiter") {
  Setup s(4096);
  auto producer = s.dev->create_stream("producer");
  auto ready = s.dev->create_event();
  producer->launch_host([] { throw std::runtime_error("the producer failed"); });
  producer->record(*ready);
  std::vector<uint8_t> src(100, 1);
  zero::Buffer dev = s.dev->allocate(100, MemCategory::other);
  CopyHandle h = s.engine.to_device(dev.data(), src.data(), 100, HostPinning::pinned, ready.get());
  CHECK_THROWS_WITH(h.wait(), ContainsSubstring("the producer failed"));
  CHECK_THROWS_WITH(producer->synchronize(), ContainsSubstring("the producer failed"));
}

// Proves: with the policy off the staging buffers would be pageable, so there are none: pageable
// copies go direct, correctly, and nothing is counted as comm_buffers.
TEST_CASE("copy engine: no staging without pinned staging buffers") {
  Setup s(4096, zero::offload::PinPolicy::off);
  CHECK_FALSE(s.engine.staging());
  CHECK(s.dev->ledger().current(MemSpace::host, MemCategory::comm_buffers) == 0);
  std::vector<uint8_t> src(10'000), back(10'000, 0);
  fill_pattern(src.data(), src.size(), 11);
  zero::Buffer dev = s.dev->allocate(src.size(), MemCategory::other);
  CopyHandle up = s.engine.to_device(dev.data(), src.data(), src.size(), HostPinning::pageable);
  CopyHandle down = s.engine.to_host(back.data(), dev.data(), back.size(), HostPinning::pageable,
                                     &up.event());
  down.wait();
  CHECK_FALSE(up.staged());
  CHECK_FALSE(down.staged());
  CHECK(equal_bytes(back.data(), src.data(), src.size()));
}

TEST_CASE("copy engine: staging off by option, and a HostMemory of another device is refused") {
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  auto other = zero::make_device(zero::DeviceKind::cpu, 1);
  HostMemory host(*dev);
  HostMemory foreign(*other);
  CopyEngine off(*dev, host, CopyEngineOptions{0});
  CHECK_FALSE(off.staging());
  CHECK(host.pinned_bytes() + host.unpinned_bytes() == 0);
  CHECK_THROWS_WITH(CopyEngine(*dev, foreign), ContainsSubstring("given the HostMemory of cpu:1"));
}
