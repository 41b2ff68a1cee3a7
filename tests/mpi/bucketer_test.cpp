// The bucketers (collectives/bucketer.hpp) on 1, 2, 3 and 4 ranks over the MPI communicator
// and the cpu device: many odd-sized tensors split across small buckets, every dtype, sum and
// avg; every reduced element is compared bitwise with the reference, every gathered element
// with the shard it came from. Also: the layout the callbacks see (alignment, zero padding, the
// ranges, plan_buckets), the pool bound in the ledger, ready-events, and that add() does not
// wait for a collective (the communicator's stream is held shut while buckets are launched).
//
// Reference arithmetic (communicator.hpp, "Arithmetic"): the fp32 sum of ranks 0..N-1 in rank
// order, divided by N for avg, rounded once to the dtype. Bucketing must not change it, so the
// comparison is bitwise: no tolerance.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "collectives/bucketer.hpp"
#include "core/device.hpp"
#include "core/world.hpp"

using namespace zero;
using coll::AllGatherBucketer;
using coll::ReducedBucket;
using coll::ReduceOp;
using coll::ReduceScatterBucketer;

namespace {

struct Env {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<coll::Communicator> comm =
      coll::make_mpi_communicator(World::get().comm(), *device);
  int n = comm->size();
  int rank = comm->rank();
};
Env& env() {
  static Env e;
  return e;
}

// 37 tensor sizes from 1 to 5000: primes, powers of two and their neighbours, in an order that
// mixes small and large (i * 10 mod 37 is a permutation).
std::vector<size_t> tensor_sizes() {
  const size_t base[] = {1,    2,    3,    5,    7,    11,   13,   31,   32,   33,   63,   64,  65,
                         97,   127,  128,  129,  251,  256,  257,  509,  512,  521,  997,  1000, 1021,
                         1024, 1031, 1999, 2048, 2053, 2999, 3001, 4093, 4096, 4999, 5000};
  std::vector<size_t> out;
  for (size_t i = 0; i < 37; ++i) out.push_back(base[i * 10 % 37]);
  return out;
}
// Tensor ids are opaque to the bucketer: not 0..36.
size_t tensor_id(size_t t) { return 1000 + 7 * t; }

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Input value of rank r for element i of tensor t (with `salt` to make a second, different
// round): signs and magnitudes in [-8, 8) with full fp32 mantissas, so 16-bit rounding matters.
float value(int r, size_t t, size_t i, uint64_t salt = 0) {
  const uint64_t h = mix((static_cast<uint64_t>(r) << 48) ^ (t << 32) ^ i ^ (salt << 40));
  return static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) / (1 << 20);
}

// Tensor t of rank r in dtype dt.
std::vector<uint8_t> make_tensor(DType dt, int r, size_t t, size_t n, uint64_t salt = 0) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = value(r, t, i, salt);
  std::vector<uint8_t> out(n * size_of(dt) + 1);  // +1: never a zero-length vector's null data
  convert(f.data(), DType::f32, out.data(), dt, n);
  return out;
}

float to_f32(DType dt, const void* p) {
  float f;
  convert(p, dt, &f, DType::f32, 1);
  return f;
}

// The reduced element i of tensor t, in dt's bytes: rank-order fp32 sum, avg divides, one
// rounding.
void reference(DType dt, ReduceOp op, int n, size_t t, size_t i, void* out) {
  float acc = 0;
  uint8_t x[4];
  for (int q = 0; q < n; ++q) {
    const float v = value(q, t, i);
    convert(&v, DType::f32, x, dt, 1);  // the rank's input, as stored in dt
    const float xf = to_f32(dt, x);
    acc = q == 0 ? xf : acc + xf;
  }
  if (op == ReduceOp::avg) acc /= static_cast<float>(n);
  convert(&acc, DType::f32, out, dt, 1);
}

size_t comm_bytes(const Device& d) {
  return d.ledger().current(MemSpace::device, MemCategory::comm_buffers);
}

bool aligned128(const void* p) { return reinterpret_cast<uintptr_t>(p) % 128 == 0; }

// What a callback saw: the description and a copy of the slice.
struct Delivered {
  ReducedBucket bucket;
  std::vector<uint8_t> slice;
};

// Holds a stream shut until released: a task on it that waits for the gate.
struct Gate {
  std::promise<void> promise;
  void hold(Stream& s) {
    s.launch_host([f = promise.get_future().share()] { f.wait(); });
  }
  void open() { promise.set_value(); }
};

}  // namespace

TEST_CASE("reduce-scatter bucketer: odd-sized tensors split across buckets, bitwise results") {
  Env& e = env();
  const auto sizes = tensor_sizes();
  REQUIRE(sizes.size() == 37);
  std::vector<coll::TensorExtent> extents;
  std::vector<size_t> first;  // each tensor's first element in a coverage array of all tensors
  size_t total = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    extents.push_back({tensor_id(t), sizes[t]});
    first.push_back(total);
    total += sizes[t];
  }

  struct Case {
    DType dt;
    ReduceOp op;
    size_t bucket_elems;
    int pool;
  };
  // Buckets from one 128-byte unit per rank to larger than most tensors; pools of 1 to 3.
  const std::vector<Case> cases = {
      {DType::f32, ReduceOp::sum, 1000, 3},  {DType::f32, ReduceOp::avg, 777, 2},
      {DType::f16, ReduceOp::sum, 1000, 2},  {DType::f16, ReduceOp::avg, 6000, 3},
      {DType::bf16, ReduceOp::sum, 777, 1},  {DType::bf16, ReduceOp::avg, 1000, 3},
      {DType::f32, ReduceOp::sum, 6000, 1},  {DType::bf16, ReduceOp::sum, 1, 2},
  };
  for (const Case& c : cases) {
    CAPTURE(to_string(c.dt), coll::to_string(c.op), c.bucket_elems, c.pool, e.n);
    const size_t esz = size_of(c.dt);
    std::vector<std::vector<uint8_t>> data;
    for (size_t t = 0; t < sizes.size(); ++t) data.push_back(make_tensor(c.dt, e.rank, t, sizes[t]));

    // The bucketer's buffers come from a device of their own, so its ledger holds them alone.
    auto bdev = make_device(DeviceKind::cpu);
    std::vector<Delivered> got;
    size_t ledger_max = 0;
    auto on_reduced = [&](const ReducedBucket& b, Stream&) {
      ledger_max = std::max(ledger_max, comm_bytes(*bdev));
      const auto* p = static_cast<const uint8_t*>(b.slice);
      got.push_back({b, std::vector<uint8_t>(p, p + b.slice_elems * esz)});
    };
    ReduceScatterBucketer rs(*e.comm, *bdev, c.dt, c.op, c.bucket_elems, on_reduced, c.pool);
    const size_t unit = static_cast<size_t>(e.n) * coll::align_elems(c.dt);
    CHECK(rs.capacity() % unit == 0);
    CHECK(rs.capacity() >= c.bucket_elems);
    CHECK(rs.capacity() < c.bucket_elems + unit);
    // The pool: allocated once, pool x bucket bytes plus at most 128 bytes to align it.
    const size_t pool_bytes = rs.pool_bytes();
    CHECK(comm_bytes(*bdev) == pool_bytes);
    CHECK(pool_bytes >= static_cast<size_t>(c.pool) * rs.capacity() * esz);
    CHECK(pool_bytes <= static_cast<size_t>(c.pool) * rs.capacity() * esz + 128);

    for (size_t t = 0; t < sizes.size(); ++t) {
      rs.add(tensor_id(t), data[t].data(), sizes[t]);
      ledger_max = std::max(ledger_max, comm_bytes(*bdev));
      CHECK(rs.in_flight() <= static_cast<size_t>(c.pool));
    }
    rs.add(99, data[0].data(), 0);  // an empty tensor takes no space
    rs.wait();
    CHECK(ledger_max == pool_bytes);  // never grew
    CHECK(rs.in_flight() == 0);

    // The buckets are the ones plan_buckets predicts, delivered in order.
    const auto plan = coll::plan_buckets(extents, rs.capacity());
    REQUIRE(got.size() == plan.size());
    CHECK(rs.launched() == plan.size());
    std::vector<int> coverage(total, 0);
    std::vector<uint8_t> want(4);
    for (size_t k = 0; k < got.size(); ++k) {
      const ReducedBucket& b = got[k].bucket;
      const std::vector<uint8_t>& slice = got[k].slice;
      CAPTURE(k);
      CHECK(b.index == k);
      CHECK(b.entries == plan[k]);
      size_t data_elems = 0;
      for (const auto& en : b.entries) data_elems += en.length;
      CHECK(b.data_elems == data_elems);
      CHECK(b.padded_elems % unit == 0);
      CHECK(b.padded_elems - b.data_elems < unit);
      CHECK(b.slice_elems * static_cast<size_t>(e.n) == b.padded_elems);
      CHECK(b.slice_begin == static_cast<size_t>(e.rank) * b.slice_elems);
      CHECK(aligned128(b.slice));
      CHECK(b.ranges == coll::slice_ranges(b.entries, b.slice_begin, b.slice_elems));
      std::vector<bool> covered(b.slice_elems, false);
      for (const coll::SliceRange& g : b.ranges) {
        size_t t = 0;
        while (tensor_id(t) != g.tensor_id) ++t;
        REQUIRE(g.tensor_offset + g.length <= sizes[t]);
        size_t bad = 0;
        for (size_t i = 0; i < g.length; ++i) {
          reference(c.dt, c.op, e.n, t, g.tensor_offset + i, want.data());
          if (std::memcmp(&slice[(g.slice_offset + i) * esz], want.data(), esz) != 0) ++bad;
          covered[g.slice_offset + i] = true;
          ++coverage[first[t] + g.tensor_offset + i];
        }
        CHECK(bad == 0);
      }
      // Padding: every byte of the slice outside the ranges is zero.
      size_t nonzero_pad = 0;
      for (size_t i = 0; i < b.slice_elems; ++i)
        if (!covered[i])
          for (size_t k2 = 0; k2 < esz; ++k2) nonzero_pad += slice[i * esz + k2] != 0;
      CHECK(nonzero_pad == 0);
    }
    // Every element of every tensor is in exactly one rank's slice.
    MPI_Allreduce(MPI_IN_PLACE, coverage.data(), static_cast<int>(total), MPI_INT, MPI_SUM,
                  World::get().comm());
    size_t wrong = 0;
    for (int v : coverage) wrong += v != 1;
    CHECK(wrong == 0);
  }
}

TEST_CASE("reduce-scatter bucketer: a second pass after flush starts a fresh bucket") {
  Env& e = env();
  auto bdev = make_device(DeviceKind::cpu);
  std::vector<ReducedBucket> got;
  ReduceScatterBucketer rs(*e.comm, *bdev, DType::f32, ReduceOp::sum, 500,
                           [&](const ReducedBucket& b, Stream&) { got.push_back(b); }, 2);
  const auto a = make_tensor(DType::f32, e.rank, 0, 700);
  for (int pass = 0; pass < 2; ++pass) {
    rs.add(1, a.data(), 300);
    rs.add(2, a.data(), 700);
    rs.flush();
  }
  rs.wait();
  // Each pass: [t1 300 | t2 first part] [rest of t2, partial]; the second pass repeats it.
  const std::vector<coll::TensorExtent> pass = {{1, 300}, {2, 700}};
  const auto plan = coll::plan_buckets(pass, rs.capacity());
  REQUIRE(got.size() == 2 * plan.size());
  for (size_t k = 0; k < got.size(); ++k) {
    CHECK(got[k].index == k);
    CHECK(got[k].entries == plan[k % plan.size()]);
  }
}

TEST_CASE("reduce-scatter bucketer: copies wait for ready, and the returned Work frees the source") {
  Env& e = env();
  auto bdev = make_device(DeviceKind::cpu);
  const DType dt = DType::bf16;
  const auto sizes = tensor_sizes();
  std::vector<Delivered> got;
  ReduceScatterBucketer rs(*e.comm, *bdev, dt, ReduceOp::sum, 2000,
                           [&](const ReducedBucket& b, Stream&) {
                             const auto* p = static_cast<const uint8_t*>(b.slice);
                             got.push_back({b, {p, p + b.slice_elems * size_of(dt)}});
                           });
  // A producer writes each gradient late, on its own stream; the bucketer must wait for it.
  auto producer = e.device->create_stream("producer");
  std::vector<std::vector<uint8_t>> grads;
  for (size_t t = 0; t < sizes.size(); ++t) grads.emplace_back(sizes[t] * 2 + 1, 0xff);  // NaNs
  for (size_t t = 0; t < sizes.size(); ++t) {
    uint8_t* dst = grads[t].data();
    producer->launch_host([dst, t, n = sizes[t], r = e.rank] {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      const auto v = make_tensor(DType::bf16, r, t, n);
      std::memcpy(dst, v.data(), n * 2);
    });
    auto ready = e.device->create_event();
    producer->record(*ready);
    coll::Work copied = rs.add(tensor_id(t), dst, sizes[t], ready.get());
    // Once copied, the gradient buffer is the caller's again: scribbling on it changes nothing.
    copied.wait();
    std::memset(dst, 0xff, sizes[t] * 2);
  }
  rs.wait();
  producer->synchronize();  // (already drained: every copy waited for its producer)
  std::vector<uint8_t> want(2);
  size_t bad = 0, checked = 0;
  for (const Delivered& d : got)
    for (const coll::SliceRange& g : d.bucket.ranges) {
      size_t t = 0;
      while (tensor_id(t) != g.tensor_id) ++t;
      for (size_t i = 0; i < g.length; ++i, ++checked) {
        reference(dt, ReduceOp::sum, e.n, t, g.tensor_offset + i, want.data());
        bad += std::memcmp(&d.slice[(g.slice_offset + i) * 2], want.data(), 2) != 0;
      }
    }
  CHECK(bad == 0);
  CHECK(checked > 0);
}

TEST_CASE("reduce-scatter bucketer: add() launches without waiting; a full pool pushes back") {
  Env& e = env();
  auto bdev = make_device(DeviceKind::cpu);
  size_t delivered = 0;
  ReduceScatterBucketer rs(*e.comm, *bdev, DType::f32, ReduceOp::sum, 256,
                           [&](const ReducedBucket&, Stream&) { ++delivered; }, 2);
  const size_t cap = rs.capacity();
  const auto a = make_tensor(DType::f32, e.rank, 0, 3 * cap);

  // The communicator's stream is shut: no collective can complete until the gate opens.
  Gate gate;
  gate.hold(e.comm->stream());
  rs.add(1, a.data(), cap);  // fills and launches bucket 0
  rs.add(2, a.data(), cap);  // bucket 1: both pool buffers in flight, add() still returned
  CHECK(rs.launched() == 2);
  CHECK(rs.in_flight() == 2);
  CHECK(rs.poll() == 0);
  CHECK(delivered == 0);

  // A third bucket needs a buffer: add() waits for bucket 0, which needs the gate open.
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    opened = true;
    gate.open();
  });
  rs.add(3, a.data(), cap);
  CHECK(opened.load());
  CHECK(delivered >= 1);
  opener.join();
  rs.wait();
  CHECK(delivered == 3);
}

TEST_CASE("all-gather bucketer: every tensor's full_out is all ranks' shards, every dtype") {
  Env& e = env();
  const auto sizes = tensor_sizes();
  const size_t n = static_cast<size_t>(e.n);
  struct Case {
    DType dt;
    size_t bucket_elems;
    int pool;
  };
  const std::vector<Case> cases = {
      {DType::f32, 1, 2},     {DType::f32, 1000, 1},  {DType::f16, 3333, 2},
      {DType::bf16, 777, 3},  {DType::bf16, 100000, 2}, {DType::f16, 4096, 1},
  };
  for (const Case& c : cases) {
    CAPTURE(to_string(c.dt), c.bucket_elems, c.pool, e.n);
    const size_t esz = size_of(c.dt);
    // Tensor t padded to a multiple of N; shard r = piece r.
    std::vector<size_t> shard;
    std::vector<coll::TensorExtent> extents;
    std::vector<std::vector<uint8_t>> mine, full;
    for (size_t t = 0; t < sizes.size(); ++t) {
      shard.push_back((sizes[t] + n - 1) / n);
      extents.push_back({tensor_id(t), shard[t]});
      mine.push_back(make_tensor(c.dt, e.rank, t, shard[t]));
      full.emplace_back(n * shard[t] * esz, 0xee);
    }
    auto bdev = make_device(DeviceKind::cpu);
    AllGatherBucketer ag(*e.comm, *bdev, c.dt, c.bucket_elems, c.pool);
    CHECK(ag.capacity() % coll::align_elems(c.dt) == 0);
    CHECK(ag.capacity() * n >= c.bucket_elems);
    const size_t pool_bytes = ag.pool_bytes();
    CHECK(comm_bytes(*bdev) == pool_bytes);
    const size_t parts = n == 1 ? 1 : n + 1;  // send + receive (in place for one rank)
    CHECK(pool_bytes <= static_cast<size_t>(c.pool) * parts * ag.capacity() * esz + 128);

    for (size_t t = 0; t < sizes.size(); ++t) {
      ag.add(tensor_id(t), mine[t].data(), shard[t], full[t].data());
      CHECK(comm_bytes(*bdev) == pool_bytes);
    }
    // Waiting tensor by tensor; the last ones are in the open bucket until gathered() launches it.
    for (size_t t = 0; t < sizes.size(); ++t) ag.gathered(tensor_id(t)).wait();
    CHECK(ag.launched() == coll::plan_buckets(extents, ag.capacity()).size());
    size_t bad = 0;
    for (size_t t = 0; t < sizes.size(); ++t)
      for (size_t q = 0; q < n; ++q) {
        const auto theirs = make_tensor(c.dt, static_cast<int>(q), t, shard[t]);
        bad += std::memcmp(&full[t][q * shard[t] * esz], theirs.data(), shard[t] * esz) != 0;
      }
    CHECK(bad == 0);
    ag.wait();
    CHECK(comm_bytes(*bdev) == pool_bytes);
  }
}

TEST_CASE("all-gather bucketer: ready events, chaining, re-gathering, and no host waits") {
  Env& e = env();
  const size_t n = static_cast<size_t>(e.n);
  const DType dt = DType::f16;
  const auto sizes = tensor_sizes();
  auto bdev = make_device(DeviceKind::cpu);
  AllGatherBucketer ag(*e.comm, *bdev, dt, 2000, 1);  // one slot: every reuse is stream-ordered
  auto producer = e.device->create_stream("optimizer");
  auto consumer = e.device->create_stream("compute");
  std::vector<size_t> shard;
  std::vector<std::vector<uint8_t>> mine, full;
  for (size_t t = 0; t < sizes.size(); ++t) {
    shard.push_back((sizes[t] + n - 1) / n);
    mine.emplace_back(shard[t] * 2 + 1, 0xff);
    full.emplace_back(n * shard[t] * 2, 0xee);
  }
  for (uint64_t round = 0; round < 2; ++round) {
    CAPTURE(round);
    // The communicator's stream is shut while everything is launched: add() and gathered()
    // must return without waiting for any collective.
    Gate gate;
    gate.hold(e.comm->stream());
    std::vector<coll::Work> works;
    for (size_t t = 0; t < sizes.size(); ++t) {
      // The "optimizer" writes this round's shard late on its own stream.
      uint8_t* dst = mine[t].data();
      producer->launch_host([dst, t, s = shard[t], r = e.rank, round] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        const auto v = make_tensor(DType::f16, r, t, s, round);
        std::memcpy(dst, v.data(), s * 2);
      });
      auto ready = e.device->create_event();
      producer->record(*ready);
      ag.add(tensor_id(t), dst, shard[t], full[t].data(), ready.get());
    }
    for (size_t t = 0; t < sizes.size(); ++t) works.push_back(ag.gathered(tensor_id(t)));
    size_t early = 0;
    for (auto& w : works) early += w.test();
    CHECK(early == 0);
    // The compute stream chains on each tensor and checks it there, in stream order.
    std::atomic<size_t> bad{0};
    for (size_t t = 0; t < sizes.size(); ++t) {
      works[t].chain(*consumer);
      consumer->launch_host([&, t, round] {
        for (size_t q = 0; q < n; ++q) {
          const auto theirs = make_tensor(DType::f16, static_cast<int>(q), t, shard[t], round);
          bad += std::memcmp(&full[t][q * shard[t] * 2], theirs.data(), shard[t] * 2) != 0;
        }
      });
    }
    gate.open();
    consumer->synchronize();
    CHECK(bad.load() == 0);
  }
  producer->synchronize();
  CHECK_THROWS_AS(ag.gathered(424242), Error);
}

TEST_CASE("bucketers: bad settings are refused with a message") {
  Env& e = env();
  auto bdev = make_device(DeviceKind::cpu);
  auto noop = [](const ReducedBucket&, Stream&) {};
  CHECK_THROWS_AS(ReduceScatterBucketer(*e.comm, *bdev, DType::f32, ReduceOp::sum, 0, noop), Error);
  CHECK_THROWS_AS(ReduceScatterBucketer(*e.comm, *bdev, DType::f32, ReduceOp::sum, 8, noop, 0),
                  Error);
  CHECK_THROWS_AS(ReduceScatterBucketer(*e.comm, *bdev, DType::f32, ReduceOp::sum, 8, nullptr),
                  Error);
  CHECK_THROWS_AS(AllGatherBucketer(*e.comm, *bdev, DType::f32, 0), Error);
  CHECK(comm_bytes(*bdev) == 0);
}
