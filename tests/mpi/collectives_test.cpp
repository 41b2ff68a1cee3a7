// The MPI Communicator on 1, 2, 3 and 4 ranks: every operation, dtype and a range of sizes,
// compared element by element with a straightforward reference; asynchrony (after-events,
// chaining, overlap with compute); sub-communicators; the world of one.
//
// Reference arithmetic (communicator.hpp, "Arithmetic"): the fp32 sum of ranks 0..N-1 in rank
// order, divided by N for avg, rounded once to the dtype. The backend must match it bitwise.
// For 16-bit sums the test also checks the stated accuracy bound against the exact sum in
// double: |result - exact| <= 1 ulp of the result's dtype at |exact| + N * 2^-24 * sum|x_i|
// (one final rounding is half an ulp; fp32 accumulation adds at most N half-ulps of fp32).
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/communicator.hpp"
#include "core/device.hpp"
#include "core/world.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using coll::ReduceOp;

namespace {

using test::env;

// Input value of rank r at index i: varied signs and magnitudes, so 16-bit rounding matters.
// A hash of (r, i) made into a float with a random sign, a full 24-bit mantissa and an exponent
// spread over 2^-10 .. 2^10: sums of a few of them round, so the order of additions shows.
float value(int r, size_t i) {
  uint64_t h = (static_cast<uint64_t>(i) << 8) ^ static_cast<uint64_t>(r) * 0x9e3779b97f4a7c15ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  const float mant = static_cast<float>((h & 0x7fffff) | 0x800000);  // [2^23, 2^24)
  const int exp = static_cast<int>((h >> 24) % 21) - 10;
  const float v = std::ldexp(mant, exp - 23);
  return (h >> 45) & 1 ? -v : v;
}

// Bytes of dtype `dt` holding value(r, base + i) for i < n, rounded to the dtype.
std::vector<uint8_t> make_input(DType dt, int r, size_t base, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = value(r, base + i);
  std::vector<uint8_t> out(n * size_of(dt) + 1);  // +1: never a zero-length vector's null data
  convert(f.data(), DType::f32, out.data(), dt, n);
  return out;
}

float read(DType dt, const uint8_t* p, size_t i) {
  float f;
  convert(p + i * size_of(dt), dt, &f, DType::f32, 1);
  return f;
}

// Every rank's input at global indices [g0, g0 + len), as floats.
std::vector<std::vector<float>> all_inputs(DType dt, int n, size_t g0, size_t len) {
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(len));
  for (int q = 0; q < n; ++q) {
    const auto in = make_input(dt, q, g0, len);
    convert(in.data(), dt, x[static_cast<size_t>(q)].data(), DType::f32, len);
  }
  return x;
}

// The reference results at global indices [g0, g0 + len), written the plain way.
std::vector<float> reference(DType dt, ReduceOp op, int n, size_t g0, size_t len) {
  const auto x = all_inputs(dt, n, g0, len);
  std::vector<float> out(len);
  for (size_t i = 0; i < len; ++i) {
    float acc = x[0][i];
    for (int q = 1; q < n; ++q) {
      const float v = x[static_cast<size_t>(q)][i];
      if (op == ReduceOp::max) acc = (v > acc || v != v) ? v : acc;
      else acc += v;
    }
    if (op == ReduceOp::avg) acc /= static_cast<float>(n);
    uint8_t tmp[4];
    convert(&acc, DType::f32, tmp, dt, 1);  // one rounding to the dtype
    convert(tmp, dt, &out[i], DType::f32, 1);
  }
  return out;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The accuracy bound of a 16-bit sum against the exact (double) sum of the same inputs.
bool within_bound(DType dt, const std::vector<std::vector<float>>& x, size_t i, float got) {
  double exact = 0, mag = 0;
  for (const auto& xq : x) {
    exact += xq[i];
    mag += std::fabs(xq[i]);
  }
  const int mant = dt == DType::f16 ? 10 : dt == DType::bf16 ? 7 : 23;
  const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(exact), 6.1e-5)) - mant);
  return std::fabs(got - exact) <= ulp + static_cast<double>(x.size()) * std::ldexp(mag, -24);
}

// Index of the first element of `got` (dtype dt) that differs bitwise from `expect`, or -1.
long first_mismatch(DType dt, const uint8_t* got, const std::vector<float>& expect) {
  for (size_t i = 0; i < expect.size(); ++i)
    if (bits(read(dt, got, i)) != bits(expect[i])) return static_cast<long>(i);
  return -1;
}

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
// 0, 1, a prime, a prime that no world size 2..4 divides, and a multi-MiB count.
const size_t kCounts[] = {0, 1, 1009, 100003, 777777};

}  // namespace

TEST_CASE("collectives: all_gather, every dtype and size, out of place and in place") {
  auto& c = *env().comm;
  const int n = c.size(), r = c.rank();
  for (DType dt : kDtypes)
    for (size_t count : kCounts)
      for (bool in_place : {false, true}) {
        CAPTURE(to_string(dt), count, in_place, n);
        const size_t esz = size_of(dt);
        auto mine = make_input(dt, r, 0, count);
        std::vector<uint8_t> recv(count * esz * static_cast<size_t>(n) + 1, 0xee);
        const void* send = mine.data();
        if (in_place) {
          std::memcpy(recv.data() + static_cast<size_t>(r) * count * esz, mine.data(), count * esz);
          send = recv.data() + static_cast<size_t>(r) * count * esz;
        }
        c.all_gather(send, recv.data(), count, dt).wait();
        for (int q = 0; q < n; ++q) {
          const auto expect = make_input(dt, q, 0, count);
          REQUIRE(std::memcmp(recv.data() + static_cast<size_t>(q) * count * esz, expect.data(),
                              count * esz) == 0);
        }
        REQUIRE(recv[count * esz * static_cast<size_t>(n)] == 0xee);  // nothing written past the end
      }
}

TEST_CASE("collectives: reduce_scatter sum/avg/max, every dtype and size, element by element") {
  auto& c = *env().comm;
  const int n = c.size(), r = c.rank();
  for (DType dt : kDtypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
      for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
          CAPTURE(to_string(dt), to_string(op), count, in_place, n);
          const size_t esz = size_of(dt);
          // Rank r's send buffer: element j*count + i is its input at global index j*count + i.
          auto send = make_input(dt, r, 0, count * static_cast<size_t>(n));
          std::vector<uint8_t> out(count * esz + 1, 0xee);
          void* recv = in_place ? send.data() + static_cast<size_t>(r) * count * esz : out.data();
          c.reduce_scatter(send.data(), recv, count, dt, op).wait();
          const auto* got = static_cast<const uint8_t*>(recv);
          const size_t g0 = static_cast<size_t>(r) * count;
          const auto expect = reference(dt, op, n, g0, count);
          REQUIRE(first_mismatch(dt, got, expect) == -1);
          if (dt != DType::f32 && op == ReduceOp::sum) {
            const auto x = all_inputs(dt, n, g0, count);
            long outside = -1;
            for (size_t i = 0; i < count && outside < 0; ++i)
              if (!within_bound(dt, x, i, read(dt, got, i))) outside = static_cast<long>(i);
            REQUIRE(outside == -1);
          }
          if (!in_place) REQUIRE(out[count * esz] == 0xee);
        }
}

TEST_CASE("collectives: all_reduce sum/avg/max, every dtype and size, equals reduce_scatter") {
  auto& c = *env().comm;
  const int n = c.size();
  for (DType dt : kDtypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
      for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
          CAPTURE(to_string(dt), to_string(op), count, in_place, n);
          const size_t esz = size_of(dt);
          auto send = make_input(dt, c.rank(), 0, count);
          std::vector<uint8_t> out(count * esz + 1, 0xee);
          void* recv = in_place ? send.data() : out.data();
          c.all_reduce(send.data(), recv, count, dt, op).wait();
          const auto* got = static_cast<const uint8_t*>(recv);
          const auto expect = reference(dt, op, n, 0, count);
          REQUIRE(first_mismatch(dt, got, expect) == -1);
          if (!in_place) REQUIRE(out[count * esz] == 0xee);
        }
}

TEST_CASE("collectives: max propagates NaN and keeps infinities") {
  auto& c = *env().comm;
  const int n = c.size(), r = c.rank();
  std::vector<float> x = {1.0f, -INFINITY, static_cast<float>(r), 0.0f};
  if (r == n - 1) x[3] = NAN;
  std::vector<float> out(4);
  c.all_reduce(x.data(), out.data(), 4, DType::f32, ReduceOp::max).wait();
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -INFINITY);
  CHECK(out[2] == static_cast<float>(n - 1));
  CHECK(std::isnan(out[3]));
}

TEST_CASE("collectives: broadcast from every root, barrier") {
  auto& c = *env().comm;
  for (int root = 0; root < c.size(); ++root)
    for (DType dt : kDtypes) {
      const size_t count = 100003;
      auto buf = make_input(dt, c.rank() == root ? 7 : 1000 + c.rank(), 0, count);
      c.broadcast(buf.data(), count, dt, root).wait();
      REQUIRE(buf == make_input(dt, 7, 0, count));
    }
  c.barrier().wait();
  CHECK_THROWS_WITH(c.broadcast(nullptr, 1, DType::f32, c.size()),
                    Catch::Matchers::ContainsSubstring("is not a rank of this communicator"));
}

TEST_CASE("collectives: an after-event orders the collective behind its producer, chain orders a consumer") {
  auto& e = env();
  auto& c = *e.comm;
  const size_t count = 300001;
  std::vector<float> send(count, -1.0f), recv(count);
  auto producer = e.device->create_stream("producer");
  auto consumer = e.device->create_stream("consumer");
  auto ready = e.device->create_event();
  std::atomic<bool> release{false};
  // The producer writes the input only after the test releases it; the collective, queued
  // before that, must not read the buffer early.
  producer->launch_host([&] {
    while (!release.load()) std::this_thread::yield();
    for (size_t i = 0; i < count; ++i) send[i] = value(c.rank(), i);
  });
  producer->record(*ready);
  coll::Work w = c.all_reduce(send.data(), recv.data(), count, DType::f32, ReduceOp::sum, ready.get());
  std::atomic<int> consumer_saw_bad{-1};
  w.chain(*consumer);
  consumer->launch_host([&] {
    const auto expect = reference(DType::f32, ReduceOp::sum, c.size(), 0, count);
    int bad = 0;
    for (size_t i = 0; i < count; ++i)
      if (bits(recv[i]) != bits(expect[i])) ++bad;
    consumer_saw_bad = bad;
  });
  CHECK_FALSE(w.test());  // it cannot have run: its input is not produced yet
  release = true;
  consumer->synchronize();
  CHECK(w.test());
  CHECK(consumer_saw_bad.load() == 0);
  producer->synchronize();
}

TEST_CASE("collectives: a collective progresses while the caller computes, without polling MPI") {
  auto& c = *env().comm;
  if (c.size() == 1) {
    // Nothing is communicated: the "all-reduce" is a copy that may be done before the first
    // compute step, so the ordering below has nothing to show (it used to fall through and
    // fail when the copy won that race).
    SUCCEED("one rank: nothing is communicated");
    return;
  }
  const size_t count = 8u << 20;  // 32 MiB of fp32 per rank
  std::vector<float> send(count, 1.0f), recv(count);
  // Compute steps that never call MPI; the Work's test() only reads an event.
  std::vector<std::chrono::steady_clock::time_point> steps;
  volatile double sink = 0;
  auto start = std::chrono::steady_clock::now();
  coll::Work w = c.all_reduce(send.data(), recv.data(), count, DType::f32, ReduceOp::sum);
  bool seen_in_flight_after_a_step = false;
  while (!w.test()) {
    for (int i = 0; i < 20000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
    steps.push_back(std::chrono::steady_clock::now());
    if (!w.test()) seen_in_flight_after_a_step = true;
  }
  auto done = std::chrono::steady_clock::now();
  // Ordering, not timing: at least one compute step finished after the collective started and
  // before it completed, and it completed although this thread never entered MPI.
  CHECK(seen_in_flight_after_a_step);
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.front() > start);
  CHECK(steps.front() < done);
  CHECK(recv[0] == static_cast<float>(c.size()));
  CHECK(recv[count - 1] == static_cast<float>(c.size()));
}

TEST_CASE("collectives: split by color forms independent sub-groups") {
  auto& c = *env().comm;
  const int color = c.rank() % 2;
  auto sub = c.split(color, c.rank());
  REQUIRE(sub);
  const int expected_size = (c.size() + (color == 0 ? 1 : 0)) / 2;
  CHECK(sub->size() == expected_size);
  CHECK(sub->rank() == c.rank() / 2);
  // Sum of the world ranks in my sub-group.
  float mine = static_cast<float>(c.rank()), sum = 0;
  sub->all_reduce(&mine, &sum, 1, DType::f32, ReduceOp::sum).wait();
  float expect = 0;
  for (int q = color; q < c.size(); q += 2) expect += static_cast<float>(q);
  CHECK(sum == expect);
  // A rank that passes a negative color joins no group.
  auto none = c.split(c.rank() == 0 ? -1 : 0, 0);
  CHECK((c.rank() == 0) == (none == nullptr));
}

TEST_CASE("collectives: scratch buffers are in the ledger as communication buffers") {
  auto& e = env();
  const size_t comm_bytes =
      e.device->ledger().current(MemSpace::device, MemCategory::comm_buffers);
  if (e.comm->size() == 1)
    CHECK(comm_bytes == 0);  // a world of one communicates nothing and needs no scratch
  else
    CHECK(comm_bytes > 0);
}

TEST_CASE("collectives: a world of one copies only what it must") {
  auto device = make_device(DeviceKind::cpu);
  auto self = coll::make_mpi_communicator(MPI_COMM_SELF, *device);
  REQUIRE(self->size() == 1);
  std::vector<float> a = {1, 2, 3}, b(3, 0);
  self->all_reduce(a.data(), b.data(), 3, DType::f32, ReduceOp::avg).wait();
  CHECK(b == a);
  self->reduce_scatter(a.data(), a.data(), 3, DType::f32, ReduceOp::sum).wait();  // in place
  CHECK(a == std::vector<float>{1, 2, 3});
  std::vector<float> g(3, 0);
  self->all_gather(a.data(), g.data(), 3, DType::f32).wait();
  CHECK(g == a);
  self->barrier().wait();
  CHECK(device->ledger().current(MemSpace::device, MemCategory::comm_buffers) == 0);
}
