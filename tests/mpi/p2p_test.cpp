// Point-to-point send and recv of the MPI Communicator (communicator.hpp, "Send and receive") on
// 2, 3 and 4 ranks: a ring in every rank at once, several messages in flight between a pair
// matched in order, both directions at once between neighbours with the sends posted first, the
// `after` contract on both sides, a send's Work meaning "buffer reusable", and the error cases.
// Payloads are compared bitwise: point-to-point moves bits, there is no arithmetic to tolerate.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/communicator.hpp"
#include "core/device.hpp"
#include "core/stream.hpp"
#include "core/world.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using Catch::Matchers::ContainsSubstring;
using coll::P2POp;

namespace {

using test::env;

// The payload rank `from` sends as message `tag`: element i of dtype dt, a hash of
// (from, tag, i) made into a finite float, so a message from the wrong rank or the wrong
// position in the sequence differs in almost every element.
std::vector<uint8_t> payload(DType dt, int from, int tag, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = (uint64_t(i) << 16) ^ (uint64_t(tag) << 8) ^ uint64_t(from) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 29;
    f[i] = static_cast<float>(static_cast<int64_t>(h & 0xffffff) - 0x800000) / 4096.0f;
  }
  std::vector<uint8_t> out(n * size_of(dt) + 1);  // +1: never a zero-length vector's null data
  convert(f.data(), DType::f32, out.data(), dt, n);
  return out;
}

std::vector<uint8_t> zeros(DType dt, size_t n) { return std::vector<uint8_t>(n * size_of(dt) + 1); }

bool same(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, DType dt, size_t n) {
  return std::memcmp(got.data(), want.data(), n * size_of(dt)) == 0;
}

// Waits for every Work; the first error is rethrown after all have been waited for, so a
// failing rank does not leave its peers' messages unmatched.
void wait_all(std::vector<coll::Work>& works) {
  std::exception_ptr first;
  for (auto& w : works) {
    try {
      w.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

TEST_CASE("p2p: a ring, every rank sends to rank+1 and receives from rank-1 at once") {
  auto& c = *env().comm;
  if (c.size() < 2) SKIP("a ring needs two ranks");
  const DType dt = GENERATE(DType::f32, DType::bf16);
  const size_t n = GENERATE(size_t{1}, size_t{1009}, size_t{1} << 20);
  const bool batched = GENERATE(false, true);
  CAPTURE(to_string(dt), n, batched);
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  const auto out = payload(dt, c.rank(), 0, n);
  auto in = zeros(dt, n);
  std::vector<coll::Work> works;
  if (batched) {
    const P2POp ops[] = {P2POp::send(out.data(), n, dt, next), P2POp::recv(in.data(), n, dt, prev)};
    works = c.batch_send_recv(ops);
  } else {
    // The send first on every rank: with blocking sends of 1M elements this would deadlock.
    works.push_back(c.send(out.data(), n, dt, next));
    works.push_back(c.recv(in.data(), n, dt, prev));
  }
  wait_all(works);
  CHECK(same(in, payload(dt, prev, 0, n), dt, n));
}

TEST_CASE("p2p: several messages in flight between a pair match in posting order") {
  auto& c = *env().comm;
  if (c.size() < 2) SKIP("needs two ranks");
  constexpr int kMessages = 8;
  // Different sizes, so a message matched out of order is a size error, not just wrong data;
  // message 5 is large enough for MPI's rendezvous protocol.
  auto count = [](int k) { return k == 5 ? size_t{300000} : 1000 + size_t(k) * 37; };
  const DType dt = DType::f32;
  // One call per message, or all of a side's messages in one batch (whose ops count in the
  // order of the batch): 0 calls on both sides, 1 batches on both, 2 calls on the sending side
  // and a batch on the receiving one (a batch posted out of order shows only there).
  const int mode = GENERATE(0, 1, 2);
  const bool batched = mode == 1 || (mode == 2 && c.rank() == 1);
  CAPTURE(mode);
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<P2POp> ops;
  std::vector<coll::Work> works;
  if (c.rank() == 0) {
    for (int k = 0; k < kMessages; ++k) bufs.push_back(payload(dt, 0, k, count(k)));
    for (int k = 0; k < kMessages; ++k) ops.push_back(P2POp::send(bufs[size_t(k)].data(), count(k), dt, 1));
  } else if (c.rank() == 1) {
    // Posted late, so every send is already queued at MPI when the receives arrive.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int k = 0; k < kMessages; ++k) bufs.push_back(zeros(dt, count(k)));
    for (int k = 0; k < kMessages; ++k) ops.push_back(P2POp::recv(bufs[size_t(k)].data(), count(k), dt, 0));
  }
  if (batched) {
    works = c.batch_send_recv(ops);
  } else {
    for (const P2POp& op : ops)
      works.push_back(op.kind == P2POp::Kind::send ? c.send(op.buf, op.count, op.dtype, op.peer)
                                                   : c.recv(op.buf, op.count, op.dtype, op.peer));
  }
  wait_all(works);
  if (c.rank() == 1)
    for (int k = 0; k < kMessages; ++k) CHECK(same(bufs[size_t(k)], payload(dt, 0, k, count(k)), dt, count(k)));
  c.barrier().wait();
}

TEST_CASE("p2p: both directions at once between neighbours, sends posted before receives") {
  auto& c = *env().comm;
  if (c.size() < 2) SKIP("needs two ranks");
  // Pairs (0,1), (2,3): the lower rank is stage A (sends activations, receives gradients), the
  // upper one stage B. A third rank of three sits out. Four micro-batches in flight at once,
  // each message 1M bf16 elements (rendezvous size), every send posted before any receive.
  const bool lower = c.rank() % 2 == 0;
  const int peer = lower ? c.rank() + 1 : c.rank() - 1;
  if (peer >= c.size()) {
    c.barrier().wait();
    return;
  }
  constexpr int kMicro = 4;
  const size_t n = size_t{1} << 20;
  const DType dt = DType::bf16;
  std::vector<std::vector<uint8_t>> out, in;
  for (int m = 0; m < kMicro; ++m) {
    out.push_back(payload(dt, c.rank(), m, n));
    in.push_back(zeros(dt, n));
  }
  std::vector<coll::Work> works;
  for (int m = 0; m < kMicro; ++m) works.push_back(c.send(out[size_t(m)].data(), n, dt, peer));
  for (int m = 0; m < kMicro; ++m) works.push_back(c.recv(in[size_t(m)].data(), n, dt, peer));
  wait_all(works);
  for (int m = 0; m < kMicro; ++m) CHECK(same(in[size_t(m)], payload(dt, peer, m, n), dt, n));
  c.barrier().wait();
}

TEST_CASE("p2p: `after` holds a send back until its producer's event, recorded later on another stream") {
  auto& c = *env().comm;
  if (c.size() < 2) SKIP("needs two ranks");
  const size_t n = 4096;
  const DType dt = DType::f32;
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  // The producer fills the send buffer only once `go` is set, i.e. after send() has returned;
  // `filled` is recorded behind it. A send that ignored `after` would move the zeros.
  auto out = zeros(dt, n);
  const auto want = payload(dt, c.rank(), 7, n);
  auto producer = make_cpu_stream("producer");
  std::atomic<bool> go{false};
  producer->launch_host([&] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::memcpy(out.data(), want.data(), n * size_of(dt));
  });
  auto filled = make_cpu_event();
  producer->record(*filled);

  // On the receiving side, `after` holds the recv back too: a consumer still reads the old
  // contents of the recv buffer (a sentinel) until `read` passes.
  auto in = payload(dt, -1, 0, n);  // sentinel
  const auto sentinel = in;
  std::vector<uint8_t> seen(in.size());
  auto consumer = make_cpu_stream("consumer");
  consumer->launch_host([&] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::memcpy(seen.data(), in.data(), in.size());
  });
  auto read = make_cpu_event();
  consumer->record(*read);

  coll::Work recv = c.recv(in.data(), n, dt, prev, read.get());
  coll::Work send = c.send(out.data(), n, dt, next, filled.get());
  CHECK_FALSE(send.test());  // the producer cannot have run yet
  go = true;
  send.wait();
  recv.wait();
  CHECK(filled->query());
  CHECK(same(in, payload(dt, prev, 7, n), dt, n));
  CHECK(same(seen, sentinel, dt, n));  // the recv did not land before the consumer had read
  producer->synchronize();
  consumer->synchronize();
}

TEST_CASE("p2p: a completed send's buffer may be reused at once") {
  auto& c = *env().comm;
  if (c.size() < 2) SKIP("needs two ranks");
  // 1M f32 elements (rendezvous): if the send's Work completed before the data left, the
  // clobbering below would reach the receiver, which posts its recv late on purpose.
  const size_t n = size_t{1} << 20;
  const DType dt = DType::f32;
  if (c.rank() == 0) {
    auto out = payload(dt, 0, 3, n);
    c.send(out.data(), n, dt, 1).wait();
    std::memset(out.data(), 0xff, out.size());
  } else if (c.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto in = zeros(dt, n);
    c.recv(in.data(), n, dt, 0).wait();
    CHECK(same(in, payload(dt, 0, 3, n), dt, n));
  }
  c.barrier().wait();
}

TEST_CASE("p2p: messages in flight while a collective runs on the same communicator do not mix") {
  auto& c = *env().comm;
  if (c.size() < 2) SKIP("needs two ranks");
  // Each rank sends to its successor before an all_reduce and receives after it, so the
  // point-to-point message is at MPI while the all_reduce's own exchange (the same peers)
  // runs: only its own tag keeps it out of the collective's receives.
  const DType dt = DType::f32;
  const size_t n = 5000;
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  const auto out = payload(dt, c.rank(), 21, n);
  auto in = zeros(dt, n);
  std::vector<float> ones(n, 1.0f), sum(n);
  coll::Work s = c.send(out.data(), n, dt, next);
  c.all_reduce(ones.data(), sum.data(), n, dt, coll::ReduceOp::sum).wait();
  coll::Work r = c.recv(in.data(), n, dt, prev);
  s.wait();
  r.wait();
  CHECK(same(in, payload(dt, prev, 21, n), dt, n));
  bool all = true;
  for (float v : sum) all = all && v == static_cast<float>(c.size());
  CHECK(all);
}

TEST_CASE("p2p: count 0 sends no message; bad peers are errors at the call") {
  auto& c = *env().comm;
  const DType dt = DType::f32;
  float x[4] = {};
  // No peer to talk to: out of range on either side, or this rank itself.
  CHECK_THROWS_WITH(c.send(x, 4, dt, c.size()), ContainsSubstring("not a rank of this communicator"));
  CHECK_THROWS_WITH(c.recv(x, 4, dt, -1), ContainsSubstring("not a rank of this communicator"));
  CHECK_THROWS_WITH(c.send(x, 4, dt, c.rank()), ContainsSubstring("cannot send to or receive from itself"));
  CHECK_THROWS_WITH(c.send(x, 0, dt, c.rank()), ContainsSubstring("itself"));  // count 0 too
  if (c.size() < 2) return;
  const int peer = c.rank() ^ 1;
  if (peer >= c.size()) {
    c.barrier().wait();
    return;
  }
  CHECK_THROWS_WITH(c.recv(nullptr, 4, dt, peer), ContainsSubstring("null buffer"));
  // A batch with one bad op posts nothing: the good send must not reach the peer (its recv of a
  // different count below would then fail).
  const P2POp bad_batch[] = {P2POp::send(x, 4, dt, peer), P2POp::send(x, 4, dt, -3)};
  CHECK_THROWS_WITH(c.batch_send_recv(bad_batch), ContainsSubstring("peer -3"));
  // Count 0 on the lower rank only: if it sent a zero-length message, the upper rank's recv of
  // 3 elements would match it and fail with a size error.
  const auto want = payload(dt, c.rank() & ~1, 11, 3);
  if (c.rank() % 2 == 0) {
    c.send(x, 0, dt, peer).wait();
    c.send(want.data(), 3, dt, peer).wait();
  } else {
    auto in = zeros(dt, 3);
    c.recv(in.data(), 3, dt, peer).wait();
    CHECK(same(in, want, dt, 3));
  }
  c.barrier().wait();
}

TEST_CASE("p2p: a recv of a different count than its send is an error naming both ranks") {
  auto& world = *env().comm;
  if (world.size() < 2) SKIP("needs two ranks");
  // Fresh communicators: the error leaves the receiver's channel stream failed (sticky, as
  // documented), which must not spoil the shared one.
  auto shorter = coll::make_mpi_communicator(World::get().comm(), *env().device);
  auto longer = coll::make_mpi_communicator(World::get().comm(), *env().device);
  const DType dt = DType::f32;
  std::vector<float> buf(16, 1.0f);
  if (world.rank() == 0) {
    shorter->send(buf.data(), 10, dt, 1).wait();
    longer->send(buf.data(), 16, dt, 1).wait();
  } else if (world.rank() == 1) {
    CHECK_THROWS_WITH(shorter->recv(buf.data(), 12, dt, 0).wait(),
                      ContainsSubstring("recv of 12 fp32 elements from rank 0 on rank 1") &&
                          ContainsSubstring("the message has 10 elements"));
    // Longer than the buffer: MPI's truncation error, reported with the same context.
    CHECK_THROWS_WITH(longer->recv(buf.data(), 12, dt, 0).wait(),
                      ContainsSubstring("recv of 12 fp32 elements from rank 0 on rank 1 failed"));
  }
  world.barrier().wait();
}
