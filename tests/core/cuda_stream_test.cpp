// Tests of the cuda backend of stream.hpp (core/cuda/stream.cpp): the semantics of
// stream_test.cpp where they apply to CUDA, driven through launch_host() so no kernel is needed.
// Without a CUDA device every test case reports Skipped, never passed.
//
// Host functions may not call the CUDA API and must not block CUDA's callback thread forever, so
// a host function that holds a stream back waits on a Gate the test opens (or that opens itself
// when it goes out of scope, before the streams are destroyed). CUDA may serialise the host
// functions of all streams on one thread, so no test expects one stream's host function to run
// while another's is held.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/cuda/stream.hpp"
#include "core/error.hpp"
#include "tests/cuda_support.hpp"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;
using namespace std::chrono_literals;

using zero::test::have_gpu;

namespace {

constexpr auto kDeadline = 30s;  // only reached when a test fails

#define REQUIRE_GPU() \
  if (!have_gpu()) SKIP("no CUDA device")

class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() { open(); }
  void open() {
    if (!s_->opened.exchange(true)) s_->latch.count_down();
  }
  std::function<void()> pass() const {
    return [s = s_] { s->latch.wait(); };
  }

 private:
  struct State {
    std::latch latch{1};
    std::atomic<bool> opened{false};
  };
  std::shared_ptr<State> s_ = std::make_shared<State>();
};

struct Boom : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ForeignEvent final : public zero::Event {
 public:
  zero::DeviceKind kind() const noexcept override { return zero::DeviceKind::cpu; }
  void synchronize() override {}
  bool query() override { return true; }
};

}  // namespace

// Proves: launch_host tasks run in submission order, all of them, and the wrappers expose
// their kind, name and native handles.
TEST_CASE("cuda stream runs host tasks in order") {
  REQUIRE_GPU();
  auto s = zero::cuda::make_stream(0, "order");
  CHECK(s->kind() == zero::DeviceKind::cuda);
  CHECK(s->name() == "order");
  CHECK(zero::cuda::native(*s) != nullptr);
  constexpr int n = 1'000;
  std::vector<int> seen;  // touched by CUDA's callback thread only, read after synchronize()
  seen.reserve(n);
  for (int i = 0; i < n; ++i) s->launch_host([&seen, i] { seen.push_back(i); });
  s->synchronize();
  REQUIRE(seen.size() == n);
  for (int i = 0; i < n; ++i) REQUIRE(seen[i] == i);
}

// Proves: a high-priority stream is created and works like any other.
TEST_CASE("cuda high-priority stream") {
  REQUIRE_GPU();
  auto s = zero::cuda::make_stream(0, "comm", true);
  bool ran = false;
  s->launch_host([&] { ran = true; });
  s->synchronize();
  CHECK(ran);
}

// Proves: an event is pending while work before it is held, completes after it, and
// synchronize() returns only after that work has run.
TEST_CASE("cuda event record, query and synchronize") {
  REQUIRE_GPU();
  auto s = zero::cuda::make_stream(0, "rec");
  auto e = zero::cuda::make_event(0);
  CHECK(e->kind() == zero::DeviceKind::cuda);
  CHECK(zero::cuda::native(*e) != nullptr);
  int done = 0;
  Gate gate;
  s->launch_host(gate.pass());
  s->launch_host([&] { done = 1; });
  s->record(*e);
  CHECK_FALSE(e->query());
  gate.open();
  e->synchronize();
  CHECK(done == 1);
  CHECK(e->query());
  s->synchronize();
}

// Proves: a never-recorded event is complete, and waiting on it is a no-op.
TEST_CASE("cuda event never recorded is complete") {
  REQUIRE_GPU();
  auto e = zero::cuda::make_event(0);
  CHECK(e->query());
  e->synchronize();
  auto s = zero::cuda::make_stream(0, "unrec");
  bool ran = false;
  s->wait(*e);
  s->launch_host([&] { ran = true; });
  s->synchronize();
  CHECK(ran);
}

// Proves: B's task after B.wait(e) runs only after A's work before the record, while A is held by
// a host function blocked on a flag; and wait() returns to the caller while A is still held.
TEST_CASE("cuda cross-stream wait orders B after A without blocking the caller") {
  REQUIRE_GPU();
  auto a = zero::cuda::make_stream(0, "a");
  auto b = zero::cuda::make_stream(0, "b");
  auto e = zero::cuda::make_event(0);
  bool a_done = false;
  bool b_saw_a_done = false;
  Gate gate;
  a->launch_host(gate.pass());
  a->launch_host([&] { a_done = true; });
  a->record(*e);
  auto f = std::async(std::launch::async, [&] {
    b->wait(*e);
    b->launch_host([&] { b_saw_a_done = a_done; });
  });
  const bool in_time = f.wait_for(kDeadline) == std::future_status::ready;
  CHECK_FALSE(e->query());
  std::this_thread::sleep_for(20ms);  // gives a B that ignored the wait time to run early
  gate.open();
  f.get();
  REQUIRE(in_time);
  b->synchronize();
  CHECK(b_saw_a_done);
  a->synchronize();
}

// Proves: a wait is bound to the record current at the call; re-recording later does not make
// the earlier waiter wait for the new point. B shows progress through an event rather than a host
// function: CUDA may run all host functions on one thread, which A's held function occupies.
TEST_CASE("cuda event re-record: a wait is bound to the earlier record") {
  REQUIRE_GPU();
  auto a = zero::cuda::make_stream(0, "a");
  auto b = zero::cuda::make_stream(0, "b");
  auto e = zero::cuda::make_event(0);
  auto b_passed = zero::cuda::make_event(0);
  Gate first, second;
  a->launch_host(first.pass());
  a->record(*e);  // record 1
  b->wait(*e);    // bound to record 1
  b->record(*b_passed);
  a->launch_host(second.pass());
  a->record(*e);  // record 2, held by the second gate
  first.open();
  // B must get past its wait although record 2 cannot complete until the second gate opens.
  auto f = std::async(std::launch::async, [&] { b_passed->synchronize(); });
  const bool in_time = f.wait_for(kDeadline) == std::future_status::ready;
  CHECK_FALSE(e->query());  // the event now stands for record 2, still pending
  second.open();
  f.get();
  REQUIRE(in_time);
  e->synchronize();
  CHECK(e->query());
  b->synchronize();
}

// Proves: 1,000 alternating hand-offs between two streams keep strict alternation.
TEST_CASE("cuda streams ping-pong 1,000 hand-offs") {
  REQUIRE_GPU();
  auto a = zero::cuda::make_stream(0, "ping");
  auto b = zero::cuda::make_stream(0, "pong");
  auto a_done = zero::cuda::make_event(0);
  auto b_done = zero::cuda::make_event(0);
  int counter = 0;
  bool in_order = true;
  constexpr int n = 1'000;
  for (int i = 0; i < n; ++i) {
    zero::Stream& s = (i % 2 == 0) ? *a : *b;
    zero::Event& prev = (i % 2 == 0) ? *b_done : *a_done;
    zero::Event& mine = (i % 2 == 0) ? *a_done : *b_done;
    s.wait(prev);
    s.launch_host([&counter, &in_order, i] {
      if (counter != i) in_order = false;
      ++counter;
    });
    s.record(mine);
  }
  a->synchronize();
  b->synchronize();
  CHECK(in_order);
  CHECK(counter == n);
}

// Proves: an exception in a launch_host task is rethrown by synchronize() (original type and
// message, every time), later host tasks are skipped, an event recorded before it is clean and
// one recorded after it rethrows.
TEST_CASE("cuda launch_host exception is rethrown") {
  REQUIRE_GPU();
  auto s = zero::cuda::make_stream(0, "failing");
  auto before = zero::cuda::make_event(0);
  auto after = zero::cuda::make_event(0);
  bool ran_after = false;
  s->record(*before);
  s->launch_host([] { throw Boom("host failure"); });
  s->launch_host([&] { ran_after = true; });
  s->record(*after);
  CHECK_THROWS_AS(s->synchronize(), Boom);
  CHECK_THROWS_WITH(s->synchronize(), Equals("host failure"));
  CHECK_FALSE(ran_after);
  before->synchronize();
  CHECK_THROWS_WITH(after->synchronize(), Equals("host failure"));
}

// Proves: a stream that waits on an event recorded after a failed host task takes the error over:
// its later host tasks are skipped and its synchronize() rethrows; tasks before the wait ran.
TEST_CASE("cuda launch_host error crosses a wait") {
  REQUIRE_GPU();
  auto a = zero::cuda::make_stream(0, "a");
  auto b = zero::cuda::make_stream(0, "b");
  auto e = zero::cuda::make_event(0);
  bool b_before = false, b_after = false;
  a->launch_host([] { throw Boom("from a"); });
  a->record(*e);
  b->launch_host([&] { b_before = true; });
  b->wait(*e);
  b->launch_host([&] { b_after = true; });
  CHECK_THROWS_WITH(b->synchronize(), Equals("from a"));
  CHECK(b_before);
  CHECK_FALSE(b_after);
  CHECK_THROWS_WITH(a->synchronize(), Equals("from a"));
}

// Proves: record() and wait() refuse an event of another backend, and native() refuses a cpu
// stream or event, each with a zero::Error.
TEST_CASE("cuda stream refuses foreign events and streams") {
  REQUIRE_GPU();
  auto s = zero::cuda::make_stream(0, "picky");
  ForeignEvent foreign;
  CHECK_THROWS_AS(s->record(foreign), zero::Error);
  CHECK_THROWS_WITH(s->wait(foreign), ContainsSubstring("picky"));
  auto cpu_stream = zero::make_cpu_stream("cpu");
  auto cpu_event = zero::make_cpu_event();
  CHECK_THROWS_AS(zero::cuda::native(*cpu_stream), zero::Error);
  CHECK_THROWS_AS(zero::cuda::native(*cpu_event), zero::Error);
  CHECK_THROWS_AS(s->record(*cpu_event), zero::Error);
  s->synchronize();
}

// Proves: destroying a stream waits for its queued host tasks.
TEST_CASE("cuda stream destruction drains pending work") {
  REQUIRE_GPU();
  int count = 0;
  auto s = zero::cuda::make_stream(0, "drain");
  Gate gate;
  s->launch_host(gate.pass());
  for (int i = 0; i < 100; ++i) s->launch_host([&count] { ++count; });
  std::jthread opener([&gate] {
    std::this_thread::sleep_for(20ms);  // makes it likely the destructor starts first
    gate.open();
  });
  s.reset();
  CHECK(count == 100);
}
