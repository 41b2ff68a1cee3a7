// Tests of the cpu backend of stream.hpp (core/cpu_stream.cpp).
//
// Determinism: orderings are forced with Gates (latches the test opens) and checked through
// event completion, never by sleeping. Where a test sleeps, the sleep only gives a wrong
// implementation time to misbehave; a correct one passes whatever the scheduling. A check that
// something "happens at all" waits on a future with a generous deadline (kDeadline), so a bug
// fails the test instead of hanging it.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/stream.hpp"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;
using namespace std::chrono_literals;

namespace {

// Long enough for a loaded single core under ThreadSanitizer; only reached when a test fails.
constexpr auto kDeadline = 30s;

// A latch a task blocks on until the test opens it. Opens at the latest when it goes out of scope:
// declare it after the streams, so that a failed REQUIRE opens it before they drain.
class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() { open(); }

  void open() {
    if (!s_->opened.exchange(true)) s_->latch.count_down();
  }
  // A function for a task to call; it holds the gate's state, so it may outlive the Gate.
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

// Runs fn on another thread; true if it returned within kDeadline. The caller must make sure fn
// returns eventually (open its gates) before the future goes out of scope.
bool returns_in_time(std::future<void>& f) {
  return f.wait_for(kDeadline) == std::future_status::ready;
}

struct Boom : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An Event of neither cpu implementation, to check that streams refuse it.
class ForeignEvent final : public zero::Event {
 public:
  explicit ForeignEvent(zero::DeviceKind k) : k_(k) {}
  zero::DeviceKind kind() const noexcept override { return k_; }
  void synchronize() override {}
  bool query() override { return true; }

 private:
  zero::DeviceKind k_;
};

}  // namespace

// Proves: tasks run in submission order, every one of them, on one thread other than the caller.
TEST_CASE("cpu stream runs 10,000 tasks in order on its worker thread") {
  auto s = zero::make_cpu_stream("order");
  CHECK(s->kind() == zero::DeviceKind::cpu);
  CHECK(s->name() == "order");
  constexpr int n = 10'000;
  std::vector<int> seen;  // touched by the worker only, read after synchronize()
  std::vector<std::thread::id> threads;
  seen.reserve(n);
  for (int i = 0; i < n; ++i)
    s->launch_host([&seen, &threads, i] {
      seen.push_back(i);
      if (threads.empty() || threads.back() != std::this_thread::get_id())
        threads.push_back(std::this_thread::get_id());
    });
  s->synchronize();
  REQUIRE(seen.size() == n);
  for (int i = 0; i < n; ++i) REQUIRE(seen[i] == i);
  REQUIRE(threads.size() == 1);
  CHECK(threads[0] != std::this_thread::get_id());
}

// Proves: tasks from several submitting threads all run, and each thread's own order is kept.
TEST_CASE("cpu stream keeps each submitting thread's order") {
  auto s = zero::make_cpu_stream("multi");
  constexpr int threads = 4, per_thread = 1'000;
  std::vector<std::vector<int>> seen(threads);  // worker only
  {
    std::vector<std::jthread> submitters;
    for (int t = 0; t < threads; ++t)
      submitters.emplace_back([&, t] {
        for (int i = 0; i < per_thread; ++i) s->launch_host([&seen, t, i] { seen[t].push_back(i); });
      });
  }
  s->synchronize();
  for (int t = 0; t < threads; ++t) {
    REQUIRE(seen[t].size() == per_thread);
    for (int i = 0; i < per_thread; ++i) REQUIRE(seen[t][i] == i);
  }
}

// Proves: an event is pending while work before it is blocked, completes when that work is done,
// and event.synchronize() returns only after that work has run.
TEST_CASE("cpu event record, query and synchronize") {
  auto s = zero::make_cpu_stream("rec");
  auto e = zero::make_cpu_event();
  CHECK(e->kind() == zero::DeviceKind::cpu);
  int done = 0;  // written by the worker; read after e->synchronize() (which orders it)
  Gate gate;
  s->launch_host(gate.pass());
  s->launch_host([&] { done = 1; });
  s->record(*e);
  CHECK_FALSE(e->query());  // the worker is held at the gate, before the record
  gate.open();
  e->synchronize();
  CHECK(done == 1);
  CHECK(e->query());
  e->synchronize();  // again: still complete, returns at once
  s->synchronize();
}

// Proves: an event that was never recorded is complete: synchronize returns, query is true, and
// a stream waiting on it is not held up.
TEST_CASE("cpu event never recorded is complete") {
  auto e = zero::make_cpu_event();
  CHECK(e->query());
  e->synchronize();
  auto s = zero::make_cpu_stream("unrec");
  bool ran = false;
  s->wait(*e);
  s->launch_host([&] { ran = true; });
  s->synchronize();
  CHECK(ran);
}

// Proves: a stream waiting on an event recorded on itself does not deadlock.
TEST_CASE("cpu stream waiting on its own event") {
  auto s = zero::make_cpu_stream("self");
  auto e = zero::make_cpu_event();
  int step = 0;
  s->launch_host([&] { step = 1; });
  s->record(*e);
  s->wait(*e);
  s->launch_host([&] { step = 2; });
  s->synchronize();
  CHECK(step == 2);
}

// Proves: stream B's task submitted after B.wait(e) runs only after A's work before the record,
// even when A's work is held up. B's task reads A's flag without atomics, so ThreadSanitizer
// also checks that the hand-off orders memory.
TEST_CASE("cpu cross-stream wait orders B after A") {
  auto a = zero::make_cpu_stream("a");
  auto b = zero::make_cpu_stream("b");
  auto e = zero::make_cpu_event();
  bool a_done = false;
  bool b_saw_a_done = false;
  Gate gate;
  a->launch_host(gate.pass());
  a->launch_host([&] { a_done = true; });
  a->record(*e);
  b->wait(*e);
  b->launch_host([&] { b_saw_a_done = a_done; });
  std::this_thread::sleep_for(20ms);  // gives a B that ignored the wait time to run early
  gate.open();
  b->synchronize();
  CHECK(b_saw_a_done);
  a->synchronize();
}

// Proves: wait() and launch_host() return to the caller while the awaited event is still pending
// (if wait() blocked, it could never return here: the gate opens only afterwards).
TEST_CASE("cpu stream wait does not block the caller") {
  auto a = zero::make_cpu_stream("a");
  auto b = zero::make_cpu_stream("b");
  auto e = zero::make_cpu_event();
  std::atomic<bool> b_ran{false};
  Gate gate;
  a->launch_host(gate.pass());
  a->record(*e);
  auto f = std::async(std::launch::async, [&] {
    b->wait(*e);
    b->launch_host([&] { b_ran = true; });
  });
  const bool in_time = returns_in_time(f);
  const bool early = b_ran.load();  // the gate is still closed: B's task must not have run
  CHECK_FALSE(e->query());
  gate.open();
  f.get();
  REQUIRE(in_time);
  CHECK_FALSE(early);
  b->synchronize();
  CHECK(b_ran);
}

// Proves: a wait is bound to the record current at the time of the call. Re-recording the event
// later does not make the earlier waiter wait for the new point, and query()/synchronize() of
// the event follow the latest record.
TEST_CASE("cpu event re-record: a wait is bound to the earlier record") {
  auto a = zero::make_cpu_stream("a");
  auto b = zero::make_cpu_stream("b");
  auto e = zero::make_cpu_event();
  Gate first, second;
  a->launch_host(first.pass());
  a->record(*e);  // record 1
  b->wait(*e);    // bound to record 1
  std::atomic<bool> b_ran{false};
  b->launch_host([&] { b_ran = true; });
  a->launch_host(second.pass());
  a->record(*e);  // record 2, held by the second gate
  first.open();
  // B must finish although record 2 cannot complete until the second gate opens.
  auto f = std::async(std::launch::async, [&] { b->synchronize(); });
  const bool in_time = returns_in_time(f);
  CHECK_FALSE(e->query());  // the event now stands for record 2, still pending
  second.open();
  f.get();
  REQUIRE(in_time);
  CHECK(b_ran);
  e->synchronize();
  CHECK(e->query());
}

// Proves: re-recording on another stream whose work finishes first does not release a waiter
// bound to the first record (the event's state is per record, not "latest completed").
TEST_CASE("cpu event re-recorded on another stream keeps earlier waiters waiting") {
  auto a = zero::make_cpu_stream("a");
  auto b = zero::make_cpu_stream("b");
  auto c = zero::make_cpu_stream("c");
  auto e = zero::make_cpu_event();
  bool a_done = false;
  bool b_saw_a_done = false;
  Gate gate;
  a->launch_host(gate.pass());
  a->launch_host([&] { a_done = true; });
  a->record(*e);  // record 1, held by the gate
  b->wait(*e);
  b->launch_host([&] { b_saw_a_done = a_done; });
  c->record(*e);  // record 2, on an idle stream: completes at once
  e->synchronize();
  CHECK(e->query());                  // record 2 is complete...
  std::this_thread::sleep_for(20ms);  // ...which gives a B released by it time to run early
  gate.open();
  b->synchronize();
  CHECK(b_saw_a_done);
  a->synchronize();
}

// Proves: event.synchronize() may be called by many threads at once; all are released.
TEST_CASE("cpu event synchronize from several threads") {
  auto s = zero::make_cpu_stream("s");
  auto e = zero::make_cpu_event();
  Gate gate;
  s->launch_host(gate.pass());
  s->record(*e);
  std::vector<std::future<void>> waiters;
  for (int i = 0; i < 4; ++i)
    waiters.push_back(std::async(std::launch::async, [&] { e->synchronize(); }));
  gate.open();
  for (auto& w : waiters) {
    REQUIRE(returns_in_time(w));
    w.get();
  }
}

// Proves: 1,000 alternating hand-offs between two streams, each through an event, keep strict
// alternation. The counter is a plain int, so ThreadSanitizer checks every hand-off orders memory;
// re-recording the same two events also exercises the re-record path under load.
TEST_CASE("cpu streams ping-pong 1,000 hand-offs") {
  auto a = zero::make_cpu_stream("ping");
  auto b = zero::make_cpu_stream("pong");
  auto a_done = zero::make_cpu_event();  // protects `counter` from A's write to B's next read
  auto b_done = zero::make_cpu_event();  // and back
  int counter = 0;
  bool in_order = true;  // written only in hand-off order, read after both synchronize
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

// Proves: a throwing task makes the stream sticky-failed: later tasks are skipped, events recorded
// before the error are fine, events recorded after it rethrow the original exception (type and
// message) yet still complete, synchronize() rethrows every time, and only the first error is kept.
TEST_CASE("cpu stream error: skip, rethrow, events after the error carry it") {
  auto s = zero::make_cpu_stream("failing");
  auto before = zero::make_cpu_event();
  auto after = zero::make_cpu_event();
  bool ran_before = false, ran_after = false;
  s->launch_host([&] { ran_before = true; });
  s->record(*before);
  s->launch_host([] { throw Boom("first failure"); });
  s->launch_host([&] { ran_after = true; });
  s->launch_host([] { throw Boom("second failure"); });  // skipped: never thrown
  s->record(*after);

  CHECK_THROWS_AS(s->synchronize(), Boom);
  CHECK_THROWS_WITH(s->synchronize(), Equals("first failure"));  // sticky, and the first one
  CHECK(ran_before);
  CHECK_FALSE(ran_after);
  before->synchronize();  // recorded before the error: no throw
  CHECK(after->query());  // the marker completed despite the error
  CHECK_THROWS_WITH(after->synchronize(), Equals("first failure"));

  s->launch_host([&] { ran_after = true; });  // still skipped after synchronize() reported it
  CHECK_THROWS_AS(s->synchronize(), Boom);
  CHECK_FALSE(ran_after);
}

// Proves: a stream that waits on an event carrying an error takes the error over: its tasks after
// the wait are skipped and its synchronize() rethrows the original; tasks before the wait still ran.
TEST_CASE("cpu stream error crosses a wait") {
  auto a = zero::make_cpu_stream("a");
  auto b = zero::make_cpu_stream("b");
  auto e = zero::make_cpu_event();
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

// Proves: an error raised after a record does not leak into that record's event or into a
// stream that waited on it.
TEST_CASE("cpu stream error after the record stays on its stream") {
  auto a = zero::make_cpu_stream("a");
  auto b = zero::make_cpu_stream("b");
  auto e = zero::make_cpu_event();
  a->record(*e);
  a->launch_host([] { throw Boom("late"); });
  b->wait(*e);
  bool b_ran = false;
  b->launch_host([&] { b_ran = true; });
  b->synchronize();
  CHECK(b_ran);
  e->synchronize();
  CHECK_THROWS_WITH(a->synchronize(), Equals("late"));
}

// Proves: a task exception that is not a std::exception is kept and rethrown as it was.
TEST_CASE("cpu stream error of a non-standard type") {
  auto s = zero::make_cpu_stream("odd");
  s->launch_host([] { throw 42; });
  CHECK_THROWS_AS(s->synchronize(), int);
}

// Proves: destroying a stream with queued work runs all of it first. The first task holds the
// worker until another thread opens the gate; the sleep there only makes it likely that the
// destructor starts while 1,000 tasks are still queued.
TEST_CASE("cpu stream destruction drains pending work") {
  int count = 0;  // read after the destructor joined the worker
  auto s = zero::make_cpu_stream("drain");
  Gate gate;
  s->launch_host(gate.pass());
  for (int i = 0; i < 1'000; ++i) s->launch_host([&count] { ++count; });
  std::jthread opener([&gate] {
    std::this_thread::sleep_for(20ms);
    gate.open();
  });
  s.reset();
  CHECK(count == 1'000);
}

// Proves: a failed stream whose error nobody looked at is destroyed without hanging or throwing
// (it logs the error), and events recorded on it still complete.
TEST_CASE("cpu stream destroyed with an unobserved error") {
  auto e = zero::make_cpu_event();
  {
    auto s = zero::make_cpu_stream("unobserved");
    s->launch_host([] { throw Boom("nobody looked (expected in this test's log)"); });
    s->record(*e);
  }
  CHECK(e->query());
  CHECK_THROWS_AS(e->synchronize(), Boom);
}

// Proves: record() and wait() refuse an event of another implementation, whatever its kind()
// says, with a zero::Error naming the stream.
TEST_CASE("cpu stream refuses a foreign event") {
  auto s = zero::make_cpu_stream("picky");
  ForeignEvent cuda_kind(zero::DeviceKind::cuda);
  ForeignEvent cpu_kind(zero::DeviceKind::cpu);
  CHECK_THROWS_AS(s->record(cuda_kind), zero::Error);
  CHECK_THROWS_AS(s->wait(cuda_kind), zero::Error);
  CHECK_THROWS_AS(s->record(cpu_kind), zero::Error);
  CHECK_THROWS_WITH(s->wait(cpu_kind), ContainsSubstring("picky"));
  s->synchronize();  // the stream itself is unaffected
}

// Proves: misuse is reported instead of hanging: synchronize() from the stream's own task throws
// zero::Error in that task, and an empty function is refused at once.
TEST_CASE("cpu stream misuse") {
  auto s = zero::make_cpu_stream("misuse");
  bool caught = false;
  s->launch_host([&] {
    try {
      s->synchronize();
    } catch (const zero::Error&) {
      caught = true;
    }
  });
  s->synchronize();
  CHECK(caught);
  CHECK_THROWS_AS(s->launch_host(std::function<void()>{}), zero::Error);
}

// Proves: a task's captures are released by the time synchronize() returns, so a buffer kept
// alive by a task is free once its stream is synchronised.
TEST_CASE("cpu stream synchronize releases task captures") {
  auto s = zero::make_cpu_stream("captures");
  auto token = std::make_shared<int>(7);
  std::weak_ptr<int> watch = token;
  s->launch_host([t = std::move(token)] { (void)*t; });
  s->synchronize();
  CHECK(watch.expired());
}
