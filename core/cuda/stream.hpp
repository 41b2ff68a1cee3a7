// cuda backend of stream.hpp: a Stream wraps a cudaStream_t, an Event a cudaEvent_t.
//
// Streams are created with cudaStreamNonBlocking: they never synchronise implicitly with the
// legacy default stream, so every ordering between our streams is an explicit record()/wait().
// Events are created with cudaEventDisableTiming (cheaper to record and wait on; we time with
// host clocks in bench/, never with events).
//
// Errors: an exception thrown by a launch_host() task is caught on CUDA's callback thread and
// kept as the stream's first error, with the semantics stream.hpp gives the cpu backend: later
// launch_host() tasks on the stream are skipped (kernels and copies still run: the GPU cannot
// skip them), stream.synchronize() rethrows it, so does synchronize() of an event recorded after
// the failed task, and a stream that wait()s on such an event takes the error over. A CUDA API
// failure (including an asynchronous kernel fault surfacing in a synchronize) throws zero::Error
// from ZERO_CHECK_CUDA at once.
//
// Lifetime: destroying a Stream waits for the work already submitted to it (like the cpu
// backend), then destroys it; destructors never throw and log what went wrong.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "core/stream.hpp"

namespace zero::cuda {

// Creates a stream on `device` (cudaSetDevice(device) is called first, and left set on the
// calling thread). high_priority takes the device's greatest stream priority, for the
// communication streams whose kernels should be scheduled ahead of compute.
std::unique_ptr<Stream> make_stream(int device, std::string name, bool high_priority = false);

// Creates an event on `device`. It may only be recorded on a stream of the same device; any
// stream may wait on it.
std::unique_ptr<Event> make_event(int device);

// The underlying handles, for kernel launches and library calls. Throw zero::Error when given a
// Stream or Event of another backend. The handle is owned by the wrapper and lives as long as it.
cudaStream_t native(Stream& stream);
cudaEvent_t native(Event& event);

}  // namespace zero::cuda
