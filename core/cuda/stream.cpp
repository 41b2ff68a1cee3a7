// cuda backend of stream.hpp. Ordering is CUDA's own (cudaEventRecord, cudaStreamWaitEvent);
// what is built here is the host-side error model for launch_host() tasks.
//
// Each stream has a HostState shared with its pending host tasks and with the events it records.
// Host tasks are numbered 1, 2, ... in launch order; a record() remembers how many had been
// launched before it. A failure is stored with the number of the task that raised it, so
// "recorded after the failure" is a comparison of two numbers, decided without asking the GPU.
//
// Taking an error over through wait(): the waiting stream B enqueues, right after its
// cudaStreamWaitEvent, a small host task (a "check") that copies the recording stream A's failure
// if A failed before the record. Stream order guarantees the check runs after A's failed task.
// The check is skipped when A had launched no host task before the record, or when all of those
// have already run cleanly, so streams that never use launch_host() pay nothing.
//
// Locks: CudaStream::submit_mu_ (held across the CUDA calls of one submission, so the numbering
// matches stream order) is taken before CudaEvent::mu_. HostState::mu is taken by host tasks on
// CUDA's callback thread and is never held across a CUDA call, so a cudaLaunchHostFunc that
// blocks on a full launch queue cannot deadlock with a callback.
#include "core/cuda/stream.hpp"

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <utility>

#include "core/cuda/checks.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/stream_failure.hpp"

namespace zero::cuda {
namespace {

using detail::describe;
using detail::rethrow;
using Failure = detail::StreamFailure;

// Logs a failed CUDA call in a destructor, which must not throw. At process exit the runtime may
// already be unloaded; that is not worth a line.
void log_quietly(cudaError_t rc, const char* what, const std::string& name) {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();  // clear it, so an unrelated later call does not report it
  if (rc == cudaErrorCudartUnloading) return;
  log::error(std::string(what) + " failed for '" + name + "': " + cudaGetErrorString(rc) + " (" +
             cudaGetErrorName(rc) + ")");
}

struct HostState {
  explicit HostState(std::string n) : name(std::move(n)) {}

  // The failure if it happened at or before host task number `seq`, else null.
  std::shared_ptr<Failure> failure_up_to(std::uint64_t seq) {
    std::lock_guard lk(mu);
    return failure && failed_at <= seq ? failure : nullptr;
  }
  std::shared_ptr<Failure> first_failure() {
    std::lock_guard lk(mu);
    return failure;
  }
  bool failed() {
    std::lock_guard lk(mu);
    return failure != nullptr;
  }
  void fail(std::shared_ptr<Failure> f, std::uint64_t seq) {
    std::lock_guard lk(mu);
    if (failure) return;  // keep the first
    failure = std::move(f);
    failed_at = seq;
  }

  const std::string name;
  std::mutex mu;
  std::shared_ptr<Failure> failure;  // guarded by mu
  std::uint64_t failed_at = 0;       // guarded by mu; number of the host task that set failure
  // Number of the last host task that has run. Host tasks run in order, so all before it ran too.
  // Stored after the task's failure (if any) is, so "finished >= n and no failure up to n" means
  // tasks 1..n all ran cleanly.
  std::atomic<std::uint64_t> finished{0};
};

// One cudaLaunchHostFunc: either a user task (fn) or a check taking over `source`'s failure.
struct HostTask {
  std::shared_ptr<HostState> state;
  std::uint64_t seq = 0;
  std::function<void()> fn;
  std::shared_ptr<HostState> source;  // check only
  std::uint64_t source_seq = 0;       // check only: the record's position in source's tasks

  void run() {
    if (fn) {
      if (!state->failed()) {  // sticky: skipped after the first error
        try {
          fn();
        } catch (...) {
          state->fail(std::make_shared<Failure>(std::current_exception(), state->name), seq);
        }
      }
      fn = nullptr;  // release the captures before the task counts as finished
    } else if (auto f = source->failure_up_to(source_seq)) {
      state->fail(std::move(f), seq);
    }
    state->finished.store(seq, std::memory_order_release);
  }
};

void CUDART_CB trampoline(void* p) {
  std::unique_ptr<HostTask> task(static_cast<HostTask*>(p));
  try {
    task->run();
  } catch (...) {
    // Only an allocation in fail() can get here; an exception must not cross into CUDA.
    log::error("host task on cuda stream '" + task->state->name +
               "' could not record its failure: " + describe(std::current_exception()));
  }
}

class CudaStream;

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) : device_(device) {
    ZERO_CHECK_CUDA(cudaSetDevice(device));
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~CudaEvent() override {
    log_quietly(cudaEventDestroy(event_), "cudaEventDestroy",
                "event on cuda:" + std::to_string(device_));
  }

  DeviceKind kind() const noexcept override { return DeviceKind::cuda; }

  void synchronize() override {
    Source s = source();
    ZERO_CHECK_CUDA(cudaEventSynchronize(event_));  // returns at once if never recorded
    if (s.state)
      if (auto f = s.state->failure_up_to(s.seq)) rethrow(f);
  }

  // Reports completion only; a launch_host() failure is reported by synchronize().
  bool query() override {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    ZERO_CHECK_CUDA(rc);
    return true;
  }

  // The stream of the last record and how many host tasks it had launched before it.
  struct Source {
    std::shared_ptr<HostState> state;
    std::uint64_t seq = 0;
  };
  Source source() {
    std::lock_guard lk(mu_);
    return source_;
  }

  int device() const noexcept { return device_; }
  cudaEvent_t handle() const noexcept { return event_; }

 private:
  friend class CudaStream;
  // Held by a stream across cudaEventRecord / cudaStreamWaitEvent and the matching source_
  // update or read, so the host-side source always describes the record CUDA is bound to.
  std::mutex mu_;
  Source source_;  // guarded by mu_
  int device_;
  cudaEvent_t event_ = nullptr;
};

class CudaStream final : public Stream {
 public:
  CudaStream(int device, std::string name, bool high_priority)
      : device_(device), state_(std::make_shared<HostState>(std::move(name))) {
    ZERO_CHECK_CUDA(cudaSetDevice(device));
    int least = 0, greatest = 0;
    ZERO_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    ZERO_CHECK_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking,
                                                 high_priority ? greatest : least));
  }

  ~CudaStream() override {
    // Wait for submitted work, so pending host tasks have run and their errors can be reported.
    log_quietly(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", state_->name);
    log_quietly(cudaStreamDestroy(stream_), "cudaStreamDestroy", state_->name);
    if (auto f = state_->first_failure(); f && !f->seen.exchange(true)) {
      std::string line = "cuda stream '" + state_->name + "' destroyed with an error nobody observed";
      if (f->stream != state_->name) line += " (taken over from stream '" + f->stream + "')";
      log::error(line + ": " + describe(f->error));
    }
  }

  DeviceKind kind() const noexcept override { return DeviceKind::cuda; }
  const std::string& name() const noexcept override { return state_->name; }

  void record(Event& event) override {
    CudaEvent& e = as_cuda_event(event, "record");
    ZERO_REQUIRE(e.device() == device_,
                 "record() on cuda stream '" + state_->name + "' (device " +
                     std::to_string(device_) + ") was given an event of device " +
                     std::to_string(e.device()) + "; an event is recorded on its own device");
    std::lock_guard lk(submit_mu_);
    std::lock_guard ek(e.mu_);
    ZERO_CHECK_CUDA(cudaEventRecord(e.handle(), stream_));
    e.source_ = {state_, launched_};
  }

  void wait(Event& event) override {
    CudaEvent& e = as_cuda_event(event, "wait");
    std::lock_guard lk(submit_mu_);
    std::lock_guard ek(e.mu_);
    // A no-op in CUDA if the event was never recorded, as stream.hpp asks.
    ZERO_CHECK_CUDA(cudaStreamWaitEvent(stream_, e.handle(), 0));
    const CudaEvent::Source s = e.source_;
    // Our own record is in our own order: any failure before it is ours already.
    if (!s.state || s.seq == 0 || s.state == state_) return;
    if (s.state->finished.load(std::memory_order_acquire) >= s.seq && !s.state->failure_up_to(s.seq))
      return;  // every host task before the record has run cleanly
    auto check = std::make_unique<HostTask>();
    check->source = s.state;
    check->source_seq = s.seq;
    launch(std::move(check));
  }

  void synchronize() override {
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (auto f = state_->first_failure()) rethrow(f);
  }

  void launch_host(std::function<void()> fn) override {
    ZERO_REQUIRE(fn, "launch_host() on cuda stream '" + state_->name + "' was given an empty function");
    auto task = std::make_unique<HostTask>();
    task->fn = std::move(fn);
    std::lock_guard lk(submit_mu_);
    launch(std::move(task));
  }

  cudaStream_t handle() const noexcept { return stream_; }

 private:
  // Caller holds submit_mu_.
  void launch(std::unique_ptr<HostTask> task) {
    task->state = state_;
    task->seq = launched_ + 1;
    ZERO_CHECK_CUDA(cudaLaunchHostFunc(stream_, &trampoline, task.get()));
    task.release();  // the trampoline owns it now
    ++launched_;
  }

  CudaEvent& as_cuda_event(Event& e, const char* call) const {
    auto* ce = dynamic_cast<CudaEvent*>(&e);
    ZERO_REQUIRE(ce != nullptr, std::string(call) + "() on cuda stream '" + state_->name +
                                    "' was given an event not made by cuda::make_event() (kind " +
                                    std::string(to_string(e.kind())) +
                                    "); use an event of the stream's own backend");
    return *ce;
  }

  const int device_;
  const std::shared_ptr<HostState> state_;
  cudaStream_t stream_ = nullptr;
  std::mutex submit_mu_;        // serialises submissions; see the top of the file
  std::uint64_t launched_ = 0;  // host tasks launched so far; guarded by submit_mu_
};

}  // namespace

std::unique_ptr<Stream> make_stream(int device, std::string name, bool high_priority) {
  return std::make_unique<CudaStream>(device, std::move(name), high_priority);
}

std::unique_ptr<Event> make_event(int device) { return std::make_unique<CudaEvent>(device); }

cudaStream_t native(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  ZERO_REQUIRE(s != nullptr, "cuda::native() was given the " + std::string(to_string(stream.kind())) +
                                 " stream '" + stream.name() + "'; it needs a cuda stream");
  return s->handle();
}

cudaEvent_t native(Event& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  ZERO_REQUIRE(e != nullptr, "cuda::native() was given a " + std::string(to_string(event.kind())) +
                                 " event; it needs an event from cuda::make_event()");
  return e->handle();
}

}  // namespace zero::cuda
