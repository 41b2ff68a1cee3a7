// Streams and events: ordered queues of work and markers in them, with the same semantics on
// both backends, so overlap logic written once runs (and is tested) on the cpu backend too.
//
//   cuda: a Stream wraps a cudaStream_t, an Event a cudaEvent_t (timing disabled).
//   cpu:  a Stream is an in-order executor: one worker thread runs its tasks one after another
//         in submission order. An Event is a marker the worker passes.
//
// Semantics (CUDA's, on both backends):
//   - stream.record(e): e completes when all work submitted to the stream before the call has
//     completed. Re-recording moves the marker; waiters bound to an earlier record keep waiting
//     for that earlier point only.
//   - stream.wait(e): work submitted to the stream after the call starts only once e (as last
//     recorded at the time of the call) has completed. Never blocks the caller. Waiting on an
//     event that was never recorded is a no-op.
//   - e.synchronize() / stream.synchronize(): block the calling thread.
//
// Errors (cpu backend): a task that throws puts its stream into an error state, like a sticky
// CUDA error: later tasks on that stream are skipped, but markers still complete, so nothing
// waiting on the stream ever hangs. The first error is rethrown (the original exception object)
// by every later stream.synchronize() and by synchronize() of any event recorded after it; a
// stream that waits on such an event takes the error over. The state lasts for the stream's
// life: to recover, make a new stream. query() reports completion only, never an error. An error
// nobody observed is logged when the stream is destroyed. On cuda, an exception thrown by a
// launch_host() task is caught and rethrown the same way (kernels and copies cannot be skipped).
//
// Thread-safety: launch_host/record/wait may be called from any thread, but the order of calls
// from different threads is whatever order they reach the stream. An Event or Stream must outlive
// every call on it; destroying a Stream waits for the work already submitted to it. A task must
// not synchronize() its own stream (cpu: throws zero::Error instead of deadlocking).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/device_kind.hpp"

namespace zero {

class Event {
 public:
  virtual ~Event() = default;
  virtual DeviceKind kind() const noexcept = 0;
  // Blocks until the last recorded point has completed; returns at once if never recorded.
  virtual void synchronize() = 0;
  // True when the last recorded point has completed (or the event was never recorded).
  virtual bool query() = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual DeviceKind kind() const noexcept = 0;
  virtual const std::string& name() const noexcept = 0;

  // Records `event` at the current end of this stream. The event must be of the same kind.
  virtual void record(Event& event) = 0;
  // Makes later work on this stream wait for `event`. Does not block the caller.
  virtual void wait(Event& event) = 0;
  // Blocks until everything submitted so far has run; rethrows the stream's first error.
  virtual void synchronize() = 0;
  // Runs `fn` in stream order. cpu: on the stream's worker thread. cuda: through
  // cudaLaunchHostFunc, so `fn` must not call the CUDA API and should be short.
  virtual void launch_host(std::function<void()> fn) = 0;
};

// cpu backend. `name` appears in error messages and the worker thread's name.
std::unique_ptr<Stream> make_cpu_stream(std::string name);
std::unique_ptr<Event> make_cpu_event();

}  // namespace zero
