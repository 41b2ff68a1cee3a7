// cpu backend of stream.hpp: each Stream is one worker thread draining a FIFO queue.
//
// A queue item is one of three things:
//   task    a launch_host() function; skipped once the stream has failed
//   record  completes one Mark (one record() of an event) and hands it the stream's failure
//   wait    blocks the worker until one Mark has completed, then takes over the Mark's failure
// Records and waits are processed even on a failed stream, so whatever waits on the stream
// (another stream, an event.synchronize(), a stream.synchronize()) always returns.
//
// An event is shared state: each record() makes a new Mark the event's current one; wait() and
// synchronize() bind to the Mark current at the time of the call. A Mark is kept alive by whoever
// still needs it (the event, a queued record, a queued wait), so re-recording, even on another
// stream whose work finishes sooner, never releases a waiter bound to an earlier record. (A pair
// of counters, "last recorded" and "completed", would need records to complete in record order,
// which two streams recording the same event do not promise.)
//
// Nothing here polls: the worker sleeps on the stream's condition variable, a wait item on the
// event's, and synchronize() on the stream's "finished" condition variable.
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/stream_failure.hpp"
#include "core/stream.hpp"

namespace zero {
namespace {

using detail::describe;
using detail::rethrow;
using Failure = detail::StreamFailure;

// One record() of an event. `done` and `failure` are guarded by the owning EventState's mutex.
struct Mark {
  bool done = false;
  std::shared_ptr<Failure> failure;  // the recording stream's failure at the time it was passed
};

struct EventState {
  std::mutex mu;
  std::condition_variable cv;     // notified whenever one of this event's Marks completes
  std::shared_ptr<Mark> current;  // the last record(); null while never recorded
};

// A Mark together with the event whose mutex guards it.
struct MarkRef {
  std::shared_ptr<EventState> event;
  std::shared_ptr<Mark> mark;
};

void complete(const MarkRef& r, std::shared_ptr<Failure> failure) {
  {
    std::lock_guard lk(r.event->mu);
    r.mark->done = true;
    r.mark->failure = std::move(failure);
  }
  r.event->cv.notify_all();
}

// Blocks until the Mark has completed; returns the failure it carries (null if none).
std::shared_ptr<Failure> wait_for(const MarkRef& r) {
  std::unique_lock lk(r.event->mu);
  r.event->cv.wait(lk, [&] { return r.mark->done; });
  return r.mark->failure;
}

class CpuEvent final : public Event {
 public:
  DeviceKind kind() const noexcept override { return DeviceKind::cpu; }

  void synchronize() override {
    const MarkRef r = current();
    if (!r.mark) return;  // never recorded
    if (auto f = wait_for(r)) rethrow(f);
  }

  // Reports completion only; a failure is reported by synchronize().
  bool query() override {
    std::lock_guard lk(state_->mu);
    return !state_->current || state_->current->done;
  }

  MarkRef current() const {
    std::lock_guard lk(state_->mu);
    return {state_, state_->current};
  }

  // Called by record() after the record item is queued, so the Mark can never be left pending.
  void make_current(std::shared_ptr<Mark> m) {
    std::lock_guard lk(state_->mu);
    state_->current = std::move(m);
  }

  const std::shared_ptr<EventState>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<EventState> state_ = std::make_shared<EventState>();
};

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name) : name_(std::move(name)), worker_([this] { run(); }) {}

  // Drains the queue (every task still runs, or is skipped if the stream failed), then joins.
  ~CpuStream() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    worker_.join();
    // Only the worker writes failure_, and it has been joined.
    if (failure_ && !failure_->seen.exchange(true)) {
      std::string line = "cpu stream '" + name_ + "' destroyed with an error nobody observed";
      if (failure_->stream != name_) line += " (taken over from stream '" + failure_->stream + "')";
      log::error(line + ": " + describe(failure_->error));
    }
  }

  DeviceKind kind() const noexcept override { return DeviceKind::cpu; }
  const std::string& name() const noexcept override { return name_; }

  void record(Event& event) override {
    CpuEvent& e = as_cpu_event(event, "record");
    MarkRef r{e.state(), std::make_shared<Mark>()};
    push(Item{Item::Kind::record, {}, r});
    e.make_current(std::move(r.mark));
  }

  void wait(Event& event) override {
    MarkRef r = as_cpu_event(event, "wait").current();
    if (!r.mark) return;  // never recorded: nothing to wait for
    {
      // Already passed without an error: nothing to wait for or take over either.
      std::lock_guard lk(r.event->mu);
      if (r.mark->done && !r.mark->failure) return;
    }
    push(Item{Item::Kind::wait, {}, std::move(r)});
  }

  void synchronize() override {
    ZERO_REQUIRE(std::this_thread::get_id() != worker_.get_id(),
                 "a task on cpu stream '" + name_ +
                     "' called synchronize() on its own stream, which would wait forever");
    std::unique_lock lk(mu_);
    const std::uint64_t target = submitted_;
    ++sync_waiters_;
    finished_cv_.wait(lk, [&] { return finished_ >= target; });
    --sync_waiters_;
    if (failure_) {
      auto f = failure_;
      lk.unlock();
      rethrow(f);
    }
  }

  void launch_host(std::function<void()> fn) override {
    ZERO_REQUIRE(fn, "launch_host() on cpu stream '" + name_ + "' was given an empty function");
    push(Item{Item::Kind::task, std::move(fn), {}});
  }

 private:
  struct Item {
    enum class Kind { task, record, wait } kind;
    std::function<void()> fn;  // task
    MarkRef mark;              // record, wait
  };

  CpuEvent& as_cpu_event(Event& e, const char* call) const {
    auto* ce = dynamic_cast<CpuEvent*>(&e);
    ZERO_REQUIRE(ce != nullptr, std::string(call) + "() on cpu stream '" + name_ +
                                    "' was given an event not made by make_cpu_event() (kind " +
                                    std::string(to_string(e.kind())) +
                                    "); use an event of the stream's own backend");
    return *ce;
  }

  void push(Item item) {
    bool was_empty;
    {
      std::lock_guard lk(mu_);
      was_empty = queue_.empty();
      queue_.push_back(std::move(item));
      ++submitted_;
    }
    // The worker only sleeps on an empty queue, so only the push that fills it must wake it.
    if (was_empty) work_cv_.notify_one();
  }

  // Processes one item on the worker; returns a new failure for the stream, if any.
  std::shared_ptr<Failure> process(Item& item) {
    switch (item.kind) {
      case Item::Kind::task:
        if (failure_) return nullptr;  // sticky: skipped after the first error
        try {
          item.fn();
        } catch (...) {
          return std::make_shared<Failure>(std::current_exception(), name_);
        }
        return nullptr;
      case Item::Kind::record:
        complete(item.mark, failure_);
        return nullptr;
      case Item::Kind::wait:
        return wait_for(item.mark);
    }
    return nullptr;
  }

  void run() {
    // Linux limits thread names to 15 characters; naming is cosmetic, so a failure is ignored.
    const std::string thread_name = name_.empty() ? "stream" : name_.substr(0, 15);
    (void)pthread_setname_np(pthread_self(), thread_name.c_str());

    std::unique_lock lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and drained
      std::shared_ptr<Failure> failed;
      {
        Item item = std::move(queue_.front());
        queue_.pop_front();
        lk.unlock();
        // The worker is the only writer of failure_, so it may read it without the lock.
        failed = process(item);
        // `item` (and whatever its function captured) is destroyed here, before the item counts
        // as finished and outside the lock, so a capture's destructor may use this stream.
      }
      lk.lock();
      if (failed && !failure_) failure_ = std::move(failed);
      ++finished_;
      if (sync_waiters_ > 0) finished_cv_.notify_all();
    }
  }

  const std::string name_;
  std::mutex mu_;                        // guards everything below except worker_
  std::condition_variable work_cv_;      // worker: the queue is non-empty, or stopping_
  std::condition_variable finished_cv_;  // synchronize(): finished_ has advanced
  std::deque<Item> queue_;
  std::uint64_t submitted_ = 0;  // items ever pushed
  std::uint64_t finished_ = 0;   // items ever processed; items run in push order
  int sync_waiters_ = 0;         // threads blocked in synchronize()
  bool stopping_ = false;
  std::shared_ptr<Failure> failure_;  // the first error; written by the worker only
  std::thread worker_;                // last: starts after everything it uses is built
};

}  // namespace

std::unique_ptr<Stream> make_cpu_stream(std::string name) {
  return std::make_unique<CpuStream>(std::move(name));
}

std::unique_ptr<Event> make_cpu_event() { return std::make_unique<CpuEvent>(); }

}  // namespace zero
