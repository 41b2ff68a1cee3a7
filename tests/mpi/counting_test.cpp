// CountingCommunicator (collectives/counting.hpp): it passes every call through (the results are
// the wrapped communicator's) and counts calls, payload bytes and ring bytes as its header says,
// on 1, 2 and 4 ranks.
#include <catch2/catch_test_macros.hpp>

#include <vector>

#include "collectives/counting.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;

TEST_CASE("counting communicator: results pass through and the counts follow the ring formulas", "[counting]") {
  coll::Communicator& world = *test::env().comm;
  coll::CountingCommunicator c(world);
  const int n = world.size(), r = world.rank();
  REQUIRE(c.rank() == r);
  REQUIRE(c.size() == n);

  std::vector<float> x(10, static_cast<float>(r + 1));
  c.all_reduce(x.data(), x.data(), x.size(), DType::f32, coll::ReduceOp::sum).wait();
  CHECK(x[3] == static_cast<float>(n * (n + 1) / 2));
  std::vector<float> mine(3, static_cast<float>(r)), all(3 * static_cast<size_t>(n));
  c.all_gather(mine.data(), all.data(), 3, DType::f32).wait();
  CHECK(all.back() == static_cast<float>(n - 1));
  std::vector<uint16_t> in(4 * static_cast<size_t>(n), 0), out(4);
  c.reduce_scatter(in.data(), out.data(), 4, DType::bf16, coll::ReduceOp::sum).wait();
  c.barrier().wait();

  const coll::Traffic& t = c.traffic();
  const double f = static_cast<double>(n - 1) / n;
  CHECK(t[coll::CallKind::all_reduce].calls == 1);
  CHECK(t[coll::CallKind::all_reduce].payload_bytes == 40);
  CHECK(t[coll::CallKind::all_reduce].ring_bytes == 2 * f * 40);
  CHECK(t[coll::CallKind::all_gather].payload_bytes == 12 * n);
  CHECK(t[coll::CallKind::all_gather].ring_bytes == f * 12 * n);
  CHECK(t[coll::CallKind::reduce_scatter].payload_bytes == 8 * n);
  CHECK(t[coll::CallKind::reduce_scatter].ring_bytes == f * 8 * n);
  CHECK(t[coll::CallKind::barrier].calls == 1);
  CHECK(t.calls() == 4);
  CHECK(t.ring_bytes() == 2 * f * 40 + f * 12 * n + f * 8 * n);
  c.reset();
  CHECK(c.traffic().calls() == 0);

  if (n > 1) {  // point-to-point: a ring of sends
    float out_v = static_cast<float>(r), in_v = -1;
    const coll::P2POp ops[2] = {coll::P2POp::send(&out_v, 1, DType::f32, (r + 1) % n),
                                coll::P2POp::recv(&in_v, 1, DType::f32, (r + n - 1) % n)};
    for (coll::Work& w : c.batch_send_recv(ops)) w.wait();
    CHECK(in_v == static_cast<float>((r + n - 1) % n));
    CHECK(c.traffic()[coll::CallKind::send].ring_bytes == 4);
    CHECK(c.traffic()[coll::CallKind::recv].ring_bytes == 0);
    CHECK(c.traffic()[coll::CallKind::recv].payload_bytes == 4);
  }
}
