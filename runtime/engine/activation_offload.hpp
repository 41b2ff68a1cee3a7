// activation_checkpointing.cpu_checkpointing (EngineOptions::cpu_checkpointing): the input a
// checkpointed Unit keeps for its recomputation (or, with partition_activations, this tensor
// rank's part of it) waits in pinned host memory between the Unit's forward and its backward,
// instead of in device memory. The bytes are copied, not converted: training is bitwise the same.
//
// Streams. stash() records an event on the compute stream after the Unit's forward was
// enqueued and copies the tensor down on the copy engine's D2H stream after it: compute goes on
// at once. The device tensor must outlive that copy; it is kept in a pending list and dropped by
// the host thread once the copy is done (sweep(), called by every stash and fetch, and by
// quiesce): never from a stream task, since a cuda host callback may not free device memory.
// fetch() allocates the device tensor again (cuda: from the compute stream's pool, so the copy
// waits for an event recorded after the allocation), copies it up on the H2D stream, and makes
// the compute stream wait for that copy only: the host does not wait. Fetching a Unit's input a
// pass before its backward (the schedule does so for the Unit below) hides the copy behind that
// pass's compute.
//
// Host memory: one pinned buffer per stashed tensor, from a pool of free buffers by size (the
// same shapes recur every step, so after the first step nothing is allocated or pinned). The
// ledger counts them as host activations; the pool's idle buffers stay counted (they are held).
//
// Threading: the thread driving the Engine calls every method. The HostMemory and CopyEngine are
// this object's own.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/device.hpp"
#include "core/stream.hpp"
#include "core/tensor.hpp"
#include "offload/copy_engine.hpp"
#include "offload/host_memory.hpp"

namespace zero::engine {

// One tensor waiting on the host (or on its way back). Empty when default-made.
struct StashedActivation {
  std::shared_ptr<offload::HostBuffer> host;
  Shape shape;
  ScalarType type = ScalarType::f32;
  std::shared_ptr<offload::CopyHandle> down;  // D2H: done once the bytes are on the host
  Tensor up;                                  // after prefetch(): the tensor the H2D copy fills
  std::shared_ptr<offload::CopyHandle> up_copy;
  explicit operator bool() const noexcept { return static_cast<bool>(host); }
};

struct ActivationOffloadCounters {
  size_t to_host_bytes = 0, to_device_bytes = 0;  // since construction
  size_t host_buffers = 0;                        // pinned buffers allocated (pooled)
};

class ActivationOffload {
 public:
  ActivationOffload(Device& device, Stream& compute, offload::PinPolicy pin);
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // Copies `t` (a device tensor, complete once the compute stream's work so far has run) to a
  // pinned host buffer and gives up the reference: the device memory returns once the copy is
  // done. A tensor of zero bytes or of a type without a byte copy is returned as-is (not stashed:
  // the result is empty and `t` stays with the caller).
  StashedActivation stash(Tensor&& t);
  // Starts the copy back to a new device tensor (idempotent: a second call does nothing).
  void prefetch(StashedActivation& s);
  // The device tensor, the compute stream ordered after its copy (prefetching first if needed).
  // `s` becomes empty; its host buffer returns to the pool once the copy is done.
  Tensor fetch(StashedActivation& s);

  // Drops the device tensors and returns the host buffers whose copies are done.
  void sweep();
  // Waits for every copy in flight, then sweep(). Never throws (logs a stream error).
  void quiesce() noexcept;

  ActivationOffloadCounters counters() const noexcept { return counters_; }
  const offload::HostMemory& memory() const noexcept { return *host_; }

 private:
  std::shared_ptr<offload::HostBuffer> take_buffer(size_t bytes);

  Device& dev_;
  Stream& compute_;
  std::unique_ptr<offload::HostMemory> host_;   // outlives the buffers below
  std::unique_ptr<offload::CopyEngine> copies_;
  std::unique_ptr<Event> point_;                // recorded on compute before each copy
  std::vector<std::shared_ptr<offload::HostBuffer>> free_;  // idle pinned buffers
  // A copy in flight and what must outlive it: the device tensor it reads (D2H) or the host
  // buffer it reads (H2D), which returns to the pool.
  struct Pending {
    std::shared_ptr<offload::CopyHandle> handle;
    Tensor device;
    std::shared_ptr<offload::HostBuffer> host;
  };
  std::vector<Pending> pending_;
  ActivationOffloadCounters counters_;
};

}  // namespace zero::engine
