// The NCCL Communicator (collectives/nccl_communicator.cpp) and its reduction kernel
// (collectives/cuda/reduce_kernel.cu) on 1, 2 or 4 ranks, one GPU per rank: every operation,
// dtype and a range of sizes, compared element by element with a straightforward host reference;
// in-place variants; after-events and chaining; split; the world of one; the kernel alone,
// including its multi-pass path, against the reference and against host_reduce.
//
// Without one GPU per rank every test case reports Skipped, never passed. All ranks take the
// same decision (World::any), so no rank waits in a collective another rank skipped.
//
// Reference arithmetic (communicator.hpp "Arithmetic", cuda/reduce_kernel.hpp): the fp32 sum of
// ranks 0..N-1 in rank order, divided by N for avg, max keeping the earlier of equal values, a
// NaN result written as the canonical 0x7fc00000, rounded once to the dtype. Equality is bitwise:
// there is no tolerance because host and device perform the same IEEE operations in the same
// order. A world of one copies (or leaves) the input bits as they are.
//
// Inputs are deterministic functions of (rank, index): values over 2^-12 .. 2^12 with random
// mantissas (so the order of additions and the 16-bit rounding matter) and a sprinkling of
// specials (+-inf, a signalling NaN, +-0, fp16-overflowing and fp16-subnormal values).
// A failing comparison reports the first mismatch and the count; ranks never stop early, so a
// failure on one rank cannot leave the others waiting in a collective.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <catch2/reporters/catch_reporter_event_listener.hpp>
#include <catch2/reporters/catch_reporter_registrars.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.hpp"
#include "collectives/cuda/reduce_kernel.hpp"
#include "collectives/reduce_kernel.hpp"
#include "core/cuda/checks.hpp"
#include "core/cuda/outside_ledger.hpp"
#include "core/cuda/stream.hpp"
#include "core/device.hpp"
#include "core/world.hpp"

using namespace zero;
using coll::ReduceOp;
using namespace std::chrono_literals;

namespace {

// ---- one GPU per rank, and the communicator the test cases share ---------------------------

bool every_rank_has_a_gpu() {
  World& w = World::get();
  return !w.any(cuda_device_count() < w.local_size());
}

#define REQUIRE_GPU_PER_RANK() \
  if (!every_rank_has_a_gpu()) SKIP("needs one GPU per rank")

struct Rig {
  std::unique_ptr<Device> device;            // cuda:<local rank>
  std::unique_ptr<coll::Communicator> comm;  // over the world; destroyed before the device
};
std::unique_ptr<Rig>& rig_slot() {
  static std::unique_ptr<Rig> rig;
  return rig;
}
// Created on first use (NCCL set-up costs a second; once per process is enough).
Rig& rig() {
  auto& r = rig_slot();
  if (!r) {
    auto fresh = std::make_unique<Rig>();
    fresh->device = make_device(DeviceKind::cuda, World::get().local_rank());
    fresh->comm = coll::make_nccl_communicator(World::get().comm(), *fresh->device);
    r = std::move(fresh);
  }
  return *r;
}
// Destroys the shared communicator at the end of the run, on every rank at the same point and
// before MPI is finalised (ncclCommDestroy waits for its peers).
class DropRig : public Catch::EventListenerBase {
 public:
  using Catch::EventListenerBase::EventListenerBase;
  void testRunEnded(const Catch::TestRunStats&) override { rig_slot().reset(); }
};

}  // namespace

CATCH_REGISTER_LISTENER(DropRig)

namespace {

// ---- element bits, inputs and the reference ------------------------------------------------

constexpr uint32_t kCanonicalNaN = 0x7fc00000u;
const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

// An element's bits, 16-bit types in the low half.
uint32_t encode(DType t, float f) {
  switch (t) {
    case DType::f32: return std::bit_cast<uint32_t>(f);
    case DType::f16: return to_half(f).bits;
    case DType::bf16: return to_bfloat16(f).bits;
  }
  return 0;
}
float decode(DType t, uint32_t b) {
  switch (t) {
    case DType::f32: return std::bit_cast<float>(b);
    case DType::f16: return to_float(zero::half::from_bits(uint16_t(b)));
    case DType::bf16: return to_float(zero::bfloat16::from_bits(uint16_t(b)));
  }
  return 0;
}
// A signalling NaN of the dtype: any arithmetic would turn it quiet, a copy keeps it.
uint32_t signalling_nan(DType t) {
  return t == DType::f32 ? 0x7f800001u : t == DType::f16 ? 0x7c01u : 0x7f81u;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's input at global index i, as bits of dtype t. `salt` separates the test cases;
// `specials` of every 1024 values are special.
uint32_t input(DType t, int r, size_t i, uint64_t salt, unsigned specials = 8) {
  static const float kSpecials[] = {INFINITY,  -INFINITY, std::bit_cast<float>(0xffa00001u),
                                    -0.0f,     0.0f,      60000.0f,
                                    -60000.0f, 3.0e-7f};
  const uint64_t h = mix(salt * 0x100000001b3ull ^ (uint64_t(r) << 40) ^ uint64_t(i));
  const unsigned pick = unsigned(h & 1023);
  if (pick < specials) return encode(t, kSpecials[pick % 8]);
  const uint32_t sign = uint32_t(h >> 63) << 31;
  const uint32_t exponent = uint32_t(127 - 12 + int((h >> 10) % 25)) << 23;  // 2^-12 .. 2^12
  const uint32_t mantissa = uint32_t(h >> 20) & 0x7fffffu;
  return encode(t, std::bit_cast<float>(sign | exponent | mantissa));
}

// The contract's reduction of xs[0..n) (rank order), as bits of dtype t.
uint32_t reduce_ref(DType t, ReduceOp op, int divisor, const uint32_t* xs, int n) {
  float acc = decode(t, xs[0]);
  for (int q = 1; q < n; ++q) {
    const float x = decode(t, xs[q]);
    if (op == ReduceOp::max)
      acc = (acc >= x || std::isnan(acc)) ? acc : x;
    else
      acc = acc + x;
  }
  if (op == ReduceOp::avg) acc = acc / static_cast<float>(divisor);
  if (std::isnan(acc)) acc = std::bit_cast<float>(kCanonicalNaN);
  return encode(t, acc);
}

// What a communicator of n ranks gives: a world of one leaves the bits alone.
uint32_t collective_ref(DType t, ReduceOp op, const uint32_t* xs, int n) {
  return n == 1 ? xs[0] : reduce_ref(t, op, n, xs, n);
}

std::string hex(uint32_t v) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

// Empty when got[i] == expected(i) for every i, else the first mismatch and how many there are.
std::string mismatches(const std::vector<uint32_t>& got,
                       const std::function<uint32_t(size_t)>& expected) {
  size_t bad = 0, first = 0;
  uint32_t first_got = 0, first_want = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const uint32_t want = expected(i);
    if (got[i] == want) continue;
    if (bad++ == 0) {
      first = i;
      first_got = got[i];
      first_want = want;
    }
  }
  if (bad == 0) return {};
  return std::to_string(bad) + " of " + std::to_string(got.size()) + " elements differ; first at " +
         std::to_string(first) + ": got " + hex(first_got) + ", expected " + hex(first_want);
}

// ---- device buffers ------------------------------------------------------------------------

std::vector<std::byte> to_bytes(DType t, const std::vector<uint32_t>& elems) {
  std::vector<std::byte> out(elems.size() * size_of(t));
  for (size_t i = 0; i < elems.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(out.data() + 4 * i, &elems[i], 4);
    } else {
      const uint16_t v = uint16_t(elems[i]);
      std::memcpy(out.data() + 2 * i, &v, 2);
    }
  }
  return out;
}

std::vector<uint32_t> from_bytes(DType t, const std::byte* p, size_t n) {
  std::vector<uint32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[i], p + 4 * i, 4);
    } else {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    }
  }
  return out;
}

std::byte* at(const Buffer& b, DType t, size_t element) {
  return b.as<std::byte>() + element * size_of(t);
}

// Synchronous upload. cudaMemcpy from pageable memory may return before the data has landed,
// so the device is synchronised: a later collective on a non-blocking stream must see it.
void upload(void* dst, DType t, const std::vector<uint32_t>& elems) {
  if (elems.empty()) return;
  const auto bytes = to_bytes(t, elems);
  ZERO_CHECK_CUDA(cudaMemcpy(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  ZERO_CHECK_CUDA(cudaDeviceSynchronize());
}

// Synchronous download (of data a waited-for collective produced).
std::vector<uint32_t> download(const void* src, DType t, size_t n) {
  if (n == 0) return {};
  std::vector<std::byte> bytes(n * size_of(t));
  ZERO_CHECK_CUDA(cudaMemcpy(bytes.data(), src, bytes.size(), cudaMemcpyDeviceToHost));
  return from_bytes(t, bytes.data(), n);
}

// A recognisable pattern for memory a collective must overwrite (or leave alone).
std::vector<uint32_t> sentinel(DType t, size_t n) {
  return std::vector<uint32_t>(n, t == DType::f32 ? 0xabababa0u : 0xaba0u);
}

std::vector<uint32_t> inputs_of(DType t, int r, size_t n, uint64_t salt) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = input(t, r, i, salt);
  return v;
}

// 0, 1, fewer than any world size above 3, a prime, and a multi-MiB prime-ish count; none of
// 3, 1009 and 3,000,017 is divisible by 2 or 4.
const size_t kCounts[] = {0, 1, 3, 1009, 3000017};

}  // namespace

TEST_CASE("nccl: a communicator over the world, its stream and its scratch") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  CHECK(c.rank() == World::get().rank());
  CHECK(c.size() == World::get().size());
  CHECK(c.kind() == DeviceKind::cuda);
  CHECK(c.stream().kind() == DeviceKind::cuda);
  CHECK(c.stream().name() == "nccl");
  const size_t comm_bytes = g.device->ledger().current(MemSpace::device, MemCategory::comm_buffers);
  if (c.size() == 1)
    CHECK(comm_bytes == 0);  // a world of one communicates nothing and needs no scratch
  else
    CHECK(comm_bytes > 0);
}

TEST_CASE("nccl: a new communicator is connected at creation: its first collectives take no memory") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size();
  // Multi-MiB messages, so NCCL would set up its large-message paths (several channels per peer,
  // the Simple protocol's buffers) at their first use if it connected lazily.
  const size_t count = 3000017;
  Buffer send = g.device->allocate(size_t(n) * count * 4, MemCategory::other);
  Buffer recv = g.device->allocate(size_t(n) * count * 4, MemCategory::other);
  ZERO_CHECK_CUDA(cudaMemset(send.data(), 0, send.bytes()));
  ZERO_CHECK_CUDA(cudaMemset(recv.data(), 0, recv.bytes()));
  ZERO_CHECK_CUDA(cudaDeviceSynchronize());
  auto every_collective = [&](coll::Communicator& k) {
    k.reduce_scatter(send.data(), recv.data(), count, DType::f32, ReduceOp::sum).wait();
    k.all_gather(send.data(), recv.data(), count, DType::f32).wait();
    k.all_reduce(send.data(), recv.data(), count, DType::f32, ReduceOp::sum).wait();
    k.broadcast(recv.data(), count, DType::f32, n - 1).wait();
    k.barrier().wait();
  };
  // Once on the shared communicator first: what loads lazily on its own (our kernels' modules)
  // is not NCCL's and must not be counted below.
  every_collective(c);
  auto fresh = c.split(0, c.rank());  // the same ranks, a new NCCL communicator
  REQUIRE(fresh);
  const size_t before = cuda::free_device_memory(g.device->index());
  every_collective(*fresh);
  const size_t after = cuda::free_device_memory(g.device->index());
  // Below one channel's Simple-protocol buffer (NCCL_BUFFSIZE, 4 MiB by default): the least a
  // peer connected at its first send/recv would take.
  INFO("free device memory before the first collectives " << before << ", after " << after);
  CHECK(after + (size_t(4) << 20) > before);
  if (n > 1) {
    // ... because creation took it, measured and charged to the device's capacity.
    CHECK_THAT(g.device->outside_ledger_report(), Catch::Matchers::ContainsSubstring("NCCL communicator"));
  }
  fresh.reset();  // every rank, same point
}

TEST_CASE("nccl all_gather: every dtype and size, out of place and in place") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  for (DType dt : kDtypes)
    for (size_t count : kCounts)
      for (bool in_place : {false, true}) {
        INFO(to_string(dt) << " count " << count << (in_place ? " in place" : " out of place")
                           << " on " << n << " ranks");
        const uint64_t salt = 100 + count;
        const auto mine = inputs_of(dt, r, count, salt);
        Buffer send = g.device->allocate(count * size_of(dt), MemCategory::other);
        Buffer recv = g.device->allocate(size_t(n) * count * size_of(dt), MemCategory::other);
        upload(recv.data(), dt, sentinel(dt, size_t(n) * count));
        const void* src = send.data();
        if (in_place) {
          src = at(recv, dt, size_t(r) * count);
          upload(at(recv, dt, size_t(r) * count), dt, mine);
        } else {
          upload(send.data(), dt, mine);
        }
        coll::Work w = c.all_gather(src, recv.data(), count, dt);
        CHECK(w.event() != nullptr);
        w.wait();
        const auto got = download(recv.data(), dt, size_t(n) * count);
        const std::string bad = mismatches(got, [&](size_t j) {
          return input(dt, int(j / count), j % count, salt);  // j < n * count: count > 0
        });
        CHECK(bad == "");
      }
}

TEST_CASE("nccl reduce_scatter: sum, avg and max, every dtype and size, in place and not") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  for (DType dt : kDtypes)
    for (ReduceOp op : kOps)
      for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
          INFO(to_string(dt) << " " << to_string(op) << " count " << count
                             << (in_place ? " in place" : " out of place") << " on " << n
                             << " ranks");
          const uint64_t salt = 200 + count;
          // Rank r's send buffer: element j is its input at global index j.
          Buffer send = g.device->allocate(size_t(n) * count * size_of(dt), MemCategory::other);
          Buffer out = g.device->allocate(count * size_of(dt), MemCategory::other);
          upload(send.data(), dt, inputs_of(dt, r, size_t(n) * count, salt));
          upload(out.data(), dt, sentinel(dt, count));
          void* recv = in_place ? at(send, dt, size_t(r) * count) : out.data();
          c.reduce_scatter(send.data(), recv, count, dt, op).wait();
          const auto got = download(recv, dt, count);
          std::vector<uint32_t> xs(static_cast<size_t>(n));
          const std::string bad = mismatches(got, [&](size_t i) {
            for (int q = 0; q < n; ++q) xs[size_t(q)] = input(dt, q, size_t(r) * count + i, salt);
            return collective_ref(dt, op, xs.data(), n);
          });
          CHECK(bad == "");
        }
}

TEST_CASE("nccl all_reduce: sum, avg and max, every dtype and size, in place and not") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  std::vector<size_t> counts(std::begin(kCounts), std::end(kCounts));
  counts.push_back(12288);  // divisible by 1, 2, 3 and 4: the all-gather-only path
  for (DType dt : kDtypes)
    for (ReduceOp op : kOps)
      for (size_t count : counts)
        for (bool in_place : {false, true}) {
          INFO(to_string(dt) << " " << to_string(op) << " count " << count
                             << (in_place ? " in place" : " out of place") << " on " << n
                             << " ranks");
          const uint64_t salt = 300 + count;
          Buffer send = g.device->allocate(count * size_of(dt), MemCategory::other);
          Buffer out = g.device->allocate(count * size_of(dt), MemCategory::other);
          upload(send.data(), dt, inputs_of(dt, r, count, salt));
          upload(out.data(), dt, sentinel(dt, count));
          void* recv = in_place ? send.data() : out.data();
          c.all_reduce(send.data(), recv, count, dt, op).wait();
          const auto got = download(recv, dt, count);
          std::vector<uint32_t> xs(static_cast<size_t>(n));
          const std::string bad = mismatches(got, [&](size_t i) {
            for (int q = 0; q < n; ++q) xs[size_t(q)] = input(dt, q, i, salt);
            return collective_ref(dt, op, xs.data(), n);
          });
          CHECK(bad == "");
        }
}

TEST_CASE("nccl: all_reduce(sum) equals reduce_scatter(sum) then all_gather, queued unwaited") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  const size_t per_rank = 1000003;  // not a multiple of the segment size
  const size_t count = per_rank * size_t(n);
  for (DType dt : kDtypes) {
    INFO(to_string(dt) << " on " << n << " ranks");
    const uint64_t salt = 400;
    Buffer send = g.device->allocate(count * size_of(dt), MemCategory::other);
    Buffer reduced = g.device->allocate(count * size_of(dt), MemCategory::other);
    Buffer gathered = g.device->allocate(count * size_of(dt), MemCategory::other);
    upload(send.data(), dt, inputs_of(dt, r, count, salt));
    // ZeRO's pattern, queued without waiting in between: reduce-scatter into this rank's slice
    // of `gathered`, then all-gather in place; the stream keeps them in order.
    void* slice = at(gathered, dt, size_t(r) * per_rank);
    c.reduce_scatter(send.data(), slice, per_rank, dt, ReduceOp::sum);
    coll::Work gather = c.all_gather(slice, gathered.data(), per_rank, dt);
    coll::Work all = c.all_reduce(send.data(), reduced.data(), count, dt, ReduceOp::sum);
    all.wait();
    CHECK(gather.test());  // completes in call order
    const auto a = download(reduced.data(), dt, count);
    const auto b = download(gathered.data(), dt, count);
    CHECK(mismatches(a, [&](size_t i) { return b[i]; }) == "");
  }
}

TEST_CASE("nccl broadcast: from every root, every dtype; bad roots are refused") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  for (int root = 0; root < n; ++root)
    for (DType dt : kDtypes)
      for (size_t count : {size_t(0), size_t(1), size_t(1009), size_t(3000017)}) {
        INFO(to_string(dt) << " count " << count << " root " << root << " of " << n);
        const uint64_t salt = 500 + count;
        Buffer buf = g.device->allocate(count * size_of(dt), MemCategory::other);
        upload(buf.data(), dt, inputs_of(dt, r == root ? 1000 : r, count, salt));
        c.broadcast(buf.data(), count, dt, root).wait();
        const auto got = download(buf.data(), dt, count);
        CHECK(mismatches(got, [&](size_t i) { return input(dt, 1000, i, salt); }) == "");
      }
  // Refused before anything is enqueued, identically on every rank.
  CHECK_THROWS_WITH(c.broadcast(nullptr, 1, DType::f32, n),
                    Catch::Matchers::ContainsSubstring("is not a rank of this communicator"));
  CHECK_THROWS_AS(c.broadcast(nullptr, 1, DType::f32, -1), Error);
  c.barrier().wait();  // still usable
}

TEST_CASE("nccl: overlapping buffers outside the in-place layouts are refused") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size();
  Buffer buf = g.device->allocate(size_t(n) * 64 * 4 + 4, MemCategory::other);
  std::byte* p = buf.as<std::byte>();
  using Catch::Matchers::ContainsSubstring;
  CHECK_THROWS_WITH(c.all_reduce(p, p + 4, 16, DType::f32, ReduceOp::sum),
                    ContainsSubstring("overlap"));
  CHECK_THROWS_WITH(c.all_gather(p + 4, p, 16, DType::f32), ContainsSubstring("overlap"));
  if (n > 1) {
    // recv inside send but not at this rank's chunk
    const int other = (c.rank() + 1) % n;
    CHECK_THROWS_WITH(
        c.reduce_scatter(p, p + size_t(other) * 16 * 4, 16, DType::f32, ReduceOp::sum),
        ContainsSubstring("overlap"));
  }
  c.barrier().wait();  // nothing was enqueued; the communicator is still usable
}

TEST_CASE("nccl barrier: completes on every rank only once every rank has reached it") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  for (int i = 0; i < 3; ++i) c.barrier().wait();
  if (c.size() == 1) {
    CHECK(c.barrier().event() != nullptr);
    return;
  }
  // Rank 0's barrier is held back 300 ms by an after-event; every other rank's must wait for it.
  auto producer = cuda::make_stream(g.device->index(), "late");
  auto late = cuda::make_event(g.device->index());
  World::get().barrier();  // start together
  const auto start = std::chrono::steady_clock::now();
  if (c.rank() == 0) {
    producer->launch_host([] { std::this_thread::sleep_for(300ms); });
    producer->record(*late);
  }
  c.barrier(c.rank() == 0 ? late.get() : nullptr).wait();
  const auto waited = std::chrono::steady_clock::now() - start;
  if (c.rank() != 0) CHECK(waited >= 150ms);  // half the hold-back: generous for start-up skew
  producer->synchronize();
}

TEST_CASE("nccl: after-events hold a collective back, chain() holds its consumer back") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  Device& d = *g.device;
  const int n = c.size(), r = c.rank();
  const DType dt = DType::bf16;
  const size_t count = 100003;
  auto producer = cuda::make_stream(d.index(), "producer");
  auto consumer = cuda::make_stream(d.index(), "consumer");
  for (const std::string op : {"all_gather", "reduce_scatter", "all_reduce", "broadcast"}) {
    INFO(op << " on " << n << " ranks");
    const uint64_t salt = 600;
    const size_t in_n = op == "reduce_scatter" ? size_t(n) * count : count;
    const size_t out_n = op == "all_gather" ? size_t(n) * count : count;
    Buffer in = d.allocate(in_n * 2, MemCategory::other);
    Buffer out = d.allocate(out_n * 2, MemCategory::other);
    Buffer fresh = d.allocate_host(in_n * 2, MemCategory::other, /*pinned=*/true);
    Buffer result = d.allocate_host(out_n * 2, MemCategory::other, /*pinned=*/true);
    // Stale contents the collective would see if it ran early.
    upload(in.data(), dt, sentinel(dt, in_n));
    upload(out.data(), dt, sentinel(dt, out_n));
    const auto bytes = to_bytes(dt, inputs_of(dt, r, in_n, salt));
    std::memcpy(fresh.data(), bytes.data(), bytes.size());

    // Producer: hold the stream 200 ms, then write the real input; `filled` marks it.
    producer->launch_host([] { std::this_thread::sleep_for(200ms); });
    ZERO_CHECK_CUDA(cudaMemcpyAsync(in.data(), fresh.data(), in_n * 2, cudaMemcpyHostToDevice,
                                    cuda::native(*producer)));
    auto filled = cuda::make_event(d.index());
    producer->record(*filled);

    coll::Work w;
    const void* result_src = out.data();
    if (op == "all_gather") {
      w = c.all_gather(in.data(), out.data(), count, dt, filled.get());
    } else if (op == "reduce_scatter") {
      w = c.reduce_scatter(in.data(), out.data(), count, dt, ReduceOp::sum, filled.get());
    } else if (op == "all_reduce") {
      w = c.all_reduce(in.data(), out.data(), count, dt, ReduceOp::sum, filled.get());
    } else {
      w = c.broadcast(in.data(), count, dt, 0, filled.get());
      result_src = in.data();
    }
    CHECK_FALSE(w.test());  // its input is 200 ms away

    // Consumer: chained on the Work, it copies the result down; only it is synchronised.
    w.chain(*consumer);
    ZERO_CHECK_CUDA(cudaMemcpyAsync(result.data(), result_src, out_n * 2, cudaMemcpyDeviceToHost,
                                    cuda::native(*consumer)));
    consumer->synchronize();
    const auto got = from_bytes(dt, result.as<std::byte>(), out_n);
    std::vector<uint32_t> xs(static_cast<size_t>(n));
    const std::string bad = mismatches(got, [&](size_t i) -> uint32_t {
      if (op == "all_gather") return input(dt, int(i / count), i % count, salt);
      if (op == "broadcast") return input(dt, 0, i, salt);
      const size_t base = op == "reduce_scatter" ? size_t(r) * count : 0;
      for (int q = 0; q < n; ++q) xs[size_t(q)] = input(dt, q, base + i, salt);
      return collective_ref(dt, ReduceOp::sum, xs.data(), n);
    });
    CHECK(bad == "");
    CHECK(w.test());
    producer->synchronize();
  }
}

TEST_CASE("nccl split: sub-groups by rank parity ordered by key; a negative color joins none") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  // Descending keys: the sub-group's ranks run opposite to the world's.
  auto sub = c.split(r % 2, n - r);
  REQUIRE(sub);
  std::vector<int> members;  // world ranks of my sub-group, in sub-rank order
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) members.push_back(q);
  const int me = int(std::find(members.begin(), members.end(), r) - members.begin());
  const int m = int(members.size());
  CHECK(sub->size() == m);
  CHECK(sub->rank() == me);
  CHECK(sub->kind() == DeviceKind::cuda);

  for (DType dt : kDtypes) {
    INFO(to_string(dt) << " sub-rank " << me << " of " << m);
    const size_t count = 1009;
    const uint64_t salt = 700;
    // all_gather: blocks in sub-rank order.
    Buffer send = g.device->allocate(count * size_of(dt), MemCategory::other);
    Buffer gathered = g.device->allocate(size_t(m) * count * size_of(dt), MemCategory::other);
    upload(send.data(), dt, inputs_of(dt, r, count, salt));
    sub->all_gather(send.data(), gathered.data(), count, dt).wait();
    const auto got = download(gathered.data(), dt, size_t(m) * count);
    CHECK(mismatches(
              got, [&](size_t j) { return input(dt, members[j / count], j % count, salt); }) == "");
    // all_reduce: summed in sub-rank order.
    Buffer out = g.device->allocate(count * size_of(dt), MemCategory::other);
    sub->all_reduce(send.data(), out.data(), count, dt, ReduceOp::sum).wait();
    const auto sum = download(out.data(), dt, count);
    std::vector<uint32_t> xs(static_cast<size_t>(m));
    CHECK(mismatches(sum, [&](size_t i) {
            for (int q = 0; q < m; ++q) xs[size_t(q)] = input(dt, members[size_t(q)], i, salt);
            return collective_ref(dt, ReduceOp::sum, xs.data(), m);
          }) == "");
  }
  sub.reset();  // every rank, same point: ncclCommDestroy waits for the peers

  auto rest = c.split(r == 0 ? -1 : 0, r);
  CHECK((r == 0) == (rest == nullptr));
  if (rest) {
    CHECK(rest->size() == n - 1);
    CHECK(rest->rank() == r - 1);
    rest->barrier().wait();
  }
}

TEST_CASE("nccl: a world of one communicates nothing and copies only out of place") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  auto self = coll::make_nccl_communicator(MPI_COMM_SELF, *g.device);
  REQUIRE(self->size() == 1);
  REQUIRE(self->rank() == 0);
  for (DType dt : kDtypes) {
    INFO(to_string(dt));
    const size_t count = 1009;
    // Element 0 is a signalling NaN: a copy keeps it, any arithmetic would make it quiet.
    auto data = inputs_of(dt, 0, count, 800);
    data[0] = signalling_nan(dt);
    Buffer a = g.device->allocate(count * size_of(dt), MemCategory::other);
    Buffer b = g.device->allocate(count * size_of(dt), MemCategory::other);
    auto same = [&](const Buffer& buf) {
      return mismatches(download(buf.data(), dt, count), [&](size_t i) { return data[i]; });
    };
    upload(a.data(), dt, data);
    for (ReduceOp op : kOps) {
      INFO(to_string(op));
      upload(b.data(), dt, sentinel(dt, count));
      self->all_reduce(a.data(), b.data(), count, dt, op).wait();
      CHECK(same(b) == "");
      upload(b.data(), dt, sentinel(dt, count));
      self->reduce_scatter(a.data(), b.data(), count, dt, op).wait();
      CHECK(same(b) == "");
      self->all_reduce(a.data(), a.data(), count, dt, op).wait();
      self->reduce_scatter(a.data(), a.data(), count, dt, op).wait();
      CHECK(same(a) == "");
    }
    upload(b.data(), dt, sentinel(dt, count));
    self->all_gather(a.data(), b.data(), count, dt).wait();
    CHECK(same(b) == "");
    self->all_gather(a.data(), a.data(), count, dt).wait();
    self->broadcast(a.data(), count, dt, 0).wait();
    CHECK(same(a) == "");
  }
  coll::Work w = self->barrier();
  CHECK(w.event() != nullptr);
  w.wait();
  CHECK(w.test());
}

TEST_CASE("nccl: unaligned buffers give the same results") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  for (DType dt : kDtypes)
    for (size_t count : {size_t(1009), size_t(100003)}) {
      INFO(to_string(dt) << " count " << count << ", buffers one element off alignment");
      const uint64_t salt = 900 + count;
      Buffer send = g.device->allocate((size_t(n) * count + 1) * size_of(dt), MemCategory::other);
      Buffer out = g.device->allocate((count + 1) * size_of(dt), MemCategory::other);
      std::byte* s = at(send, dt, 1);
      std::byte* o = at(out, dt, 1);
      upload(s, dt, inputs_of(dt, r, size_t(n) * count, salt));
      std::vector<uint32_t> xs(static_cast<size_t>(n));
      c.reduce_scatter(s, o, count, dt, ReduceOp::sum).wait();
      CHECK(mismatches(download(o, dt, count), [&](size_t i) {
              for (int q = 0; q < n; ++q) xs[size_t(q)] = input(dt, q, size_t(r) * count + i, salt);
              return collective_ref(dt, ReduceOp::sum, xs.data(), n);
            }) == "");
      c.all_reduce(s, o, count, dt, ReduceOp::avg).wait();
      CHECK(mismatches(download(o, dt, count), [&](size_t i) {
              for (int q = 0; q < n; ++q) xs[size_t(q)] = input(dt, q, i, salt);
              return collective_ref(dt, ReduceOp::avg, xs.data(), n);
            }) == "");
    }
}

// ---- point-to-point (communicator.hpp, "Send and receive") ----------------------------------

TEST_CASE("nccl send/recv: a ring, every rank sends to rank+1 and receives from rank-1 at once") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int n = c.size(), r = c.rank();
  if (n == 1) {  // a world of one has no peer
    CHECK_THROWS_WITH(c.send(nullptr, 0, DType::f32, 0),
                      Catch::Matchers::ContainsSubstring("itself"));
    return;
  }
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (DType dt : {DType::f32, DType::bf16})
    for (size_t count : {size_t(1), size_t(1009), size_t(1) << 20}) {
      INFO(to_string(dt) << " count " << count << " on " << n << " ranks");
      const uint64_t salt = 7000 + count;
      Buffer out = g.device->allocate(count * size_of(dt), MemCategory::other);
      Buffer in = g.device->allocate(count * size_of(dt), MemCategory::other);
      upload(out.data(), dt, inputs_of(dt, r, count, salt));
      upload(in.data(), dt, sentinel(dt, count));
      // The send listed first on every rank: one batch, so NCCL progresses both together.
      const coll::P2POp ops[] = {coll::P2POp::send(out.data(), count, dt, next),
                                 coll::P2POp::recv(in.data(), count, dt, prev)};
      auto works = c.batch_send_recv(ops);
      REQUIRE(works.size() == 2);
      for (auto& w : works) w.wait();
      const auto got = download(in.data(), dt, count);
      CHECK(mismatches(got, [&](size_t i) { return input(dt, prev, i, salt); }) == "");
    }
}

TEST_CASE("nccl send/recv: both directions between neighbours at once, several in flight") {
  REQUIRE_GPU_PER_RANK();
  Rig& g = rig();
  coll::Communicator& c = *g.comm;
  const int r = c.rank();
  const int peer = r % 2 == 0 ? r + 1 : r - 1;
  if (peer >= c.size()) return;  // no neighbour (a world of one; the last of an odd world)
  // Pairs (0,1), (2,3): the lower rank sends activations up while receiving gradients down,
  // every batch listing its send first; three micro-batches queued before any is waited for,
  // then lone calls in a compatible order (the lower rank sends first), which NCCL runs one
  // after another on the stream.
  constexpr int kMicro = 3;
  const size_t count = size_t(1) << 20;
  const DType dt = DType::bf16;
  std::vector<Buffer> out, in;
  std::vector<coll::Work> works;
  for (int m = 0; m < kMicro; ++m) {
    out.push_back(g.device->allocate(count * size_of(dt), MemCategory::other));
    in.push_back(g.device->allocate(count * size_of(dt), MemCategory::other));
    upload(out.back().data(), dt, inputs_of(dt, r, count, 8000 + uint64_t(m)));
    upload(in.back().data(), dt, sentinel(dt, count));
  }
  for (int m = 0; m < kMicro; ++m) {
    const coll::P2POp ops[] = {coll::P2POp::send(out[size_t(m)].data(), count, dt, peer),
                               coll::P2POp::recv(in[size_t(m)].data(), count, dt, peer)};
    for (auto& w : c.batch_send_recv(ops)) works.push_back(w);
  }
  for (auto& w : works) w.wait();
  for (int m = 0; m < kMicro; ++m) {
    INFO("micro-batch " << m);
    const auto got = download(in[size_t(m)].data(), dt, count);
    CHECK(mismatches(got, [&](size_t i) { return input(dt, peer, i, 8000 + uint64_t(m)); }) == "");
  }
  // Lone calls, and count 0 (no message on either side; a Work all the same).
  upload(in[0].data(), dt, sentinel(dt, count));
  coll::Work a, b;
  if (r < peer) {
    a = c.send(out[1].data(), count, dt, peer);
    b = c.recv(in[0].data(), count, dt, peer);
  } else {
    a = c.recv(in[0].data(), count, dt, peer);
    b = c.send(out[1].data(), count, dt, peer);
  }
  coll::Work none = c.send(out[2].data(), 0, dt, peer);
  a.wait();
  b.wait();
  none.wait();
  const auto got = download(in[0].data(), dt, count);
  CHECK(mismatches(got, [&](size_t i) { return input(dt, peer, i, 8001); }) == "");
  CHECK_THROWS_WITH(c.recv(in[0].data(), count, dt, c.size()),
                    Catch::Matchers::ContainsSubstring("not a rank of this communicator"));
  CHECK_THROWS_WITH(c.send(out[0].data(), count, dt, r),
                    Catch::Matchers::ContainsSubstring("itself"));
}

TEST_CASE(
    "cuda_reduce_async: rank order, passes past 32 inputs, unaligned, in place, host_reduce") {
  REQUIRE_GPU_PER_RANK();
  Device& d = *rig().device;
  auto stream = cuda::make_stream(d.index(), "reduce-kernel-test");
  const cudaStream_t s = cuda::native(*stream);
  enum class Layout { aligned, unaligned, in_place };
  for (int n_inputs : {1, 2, 7, 32, 33, 70})
    for (DType dt : kDtypes)
      for (ReduceOp op : kOps)
        for (size_t count : {size_t(1), size_t(13), size_t(4099), size_t(65543)})
          for (Layout layout : {Layout::aligned, Layout::unaligned, Layout::in_place}) {
            INFO(n_inputs << " inputs, " << to_string(dt) << " " << to_string(op) << " count "
                          << count << " layout " << int(layout));
            const size_t es = size_of(dt);
            const size_t skew = layout == Layout::unaligned ? es : 0;
            // Input q at row q of one allocation; rows 256-byte aligned (+ skew).
            const size_t row = (count * es + 256 + 255) / 256 * 256;
            Buffer rows = d.allocate(row * size_t(n_inputs + 1), MemCategory::other);
            Buffer scratch = d.allocate(count * sizeof(float), MemCategory::other);
            const uint64_t salt = 1000 + count * 131 + size_t(n_inputs);
            // Dense specials (1 in 4 for two inputs, fewer as inputs grow) so that +-0 ties, NaNs
            // and infinities meet often without making every result of many inputs special.
            const unsigned specials = std::max(2u, 256u / unsigned(n_inputs));
            std::vector<std::vector<uint32_t>> host(static_cast<size_t>(n_inputs),
                                                    std::vector<uint32_t>(count));
            std::vector<const void*> in(static_cast<size_t>(n_inputs));
            std::vector<std::byte> image(row * size_t(n_inputs + 1));  // uploaded in one copy
            for (int q = 0; q < n_inputs; ++q) {
              for (size_t i = 0; i < count; ++i)
                host[size_t(q)][i] = input(dt, q, i, salt, specials);
              const auto bytes = to_bytes(dt, host[size_t(q)]);
              std::memcpy(image.data() + row * size_t(q) + skew, bytes.data(), bytes.size());
              in[size_t(q)] = rows.as<std::byte>() + row * size_t(q) + skew;
            }
            ZERO_CHECK_CUDA(
                cudaMemcpy(rows.data(), image.data(), image.size(), cudaMemcpyHostToDevice));
            ZERO_CHECK_CUDA(cudaDeviceSynchronize());
            void* out = layout == Layout::in_place
                            ? const_cast<void*>(in[size_t(n_inputs / 2)])
                            : rows.as<std::byte>() + row * size_t(n_inputs) + skew;
            coll::cuda_reduce_async(dt, op, n_inputs, in.data(), n_inputs, out, count, s,
                                    scratch.as<float>());
            stream->synchronize();
            const auto got = download(out, dt, count);
            std::vector<uint32_t> xs(static_cast<size_t>(n_inputs));
            auto gather = [&](size_t i) {
              for (int q = 0; q < n_inputs; ++q) xs[size_t(q)] = host[size_t(q)][i];
            };
            CHECK(mismatches(got, [&](size_t i) {
                    gather(i);
                    return reduce_ref(dt, op, n_inputs, xs.data(), n_inputs);
                  }) == "");
            // host_reduce implements the same contract on the host: bitwise the same, NaNs
            // included (a NaN result is 0x7fc00000 on both sides; cuda/reduce_kernel.hpp says why).
            std::vector<std::vector<std::byte>> host_bytes;
            std::vector<const void*> host_in;
            for (const auto& h : host) host_bytes.push_back(to_bytes(dt, h));
            for (const auto& h : host_bytes) host_in.push_back(h.data());
            std::vector<std::byte> host_out(count * es);
            coll::host_reduce(dt, op, n_inputs, host_in.data(), n_inputs, host_out.data(), count);
            const auto want = from_bytes(dt, host_out.data(), count);
            INFO("against host_reduce");
            CHECK(mismatches(got, [&](size_t i) { return want[i]; }) == "");
          }
  // Past one pass the fp32 scratch is required.
  Buffer tiny = d.allocate(64 * 4, MemCategory::other);
  std::vector<const void*> many(33, tiny.data());
  CHECK_THROWS_AS(
      coll::cuda_reduce_async(DType::f32, ReduceOp::sum, 33, many.data(), 33, tiny.data(), 1, s),
      Error);
  // count 0 enqueues nothing, whatever the pointers.
  coll::cuda_reduce_async(DType::f16, ReduceOp::avg, 2, nullptr, 0, nullptr, 0, s);
  stream->synchronize();
}
